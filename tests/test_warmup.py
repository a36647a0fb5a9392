"""`gridsampler3d warmup`: a warmed mode's first call in a new process compiles nothing, and the cache can be
seen and cleared.

Runs on a copy of the package with no cache beside it, so that what the later process loads is what the warm-up
wrote (the repository's own cache would serve it otherwise).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gridsampler3d"
TIMEOUT_S = 900
# One combination of the warm-up's options, and the call that uses it.
WARMED = ["--dtypes", "float32", "--modes", "bilinear", "--paddings", "border", "--align-corners", "false"]
WARMED += ["--layouts", "NCDHW", "--fields", "grid"]

# The first forward and backward of the warmed mode, small and large (the large one takes the plans of parts
# and channel groups), each in its own process state: compiles counted, time printed.
FIRST_CALLS = """
import json, sys, time, torch
import gridsampler3d as gs
from gridsampler3d.cpu.compile_report import reporting_compiles
results = []
for size in (8, 48):
    x = torch.randn(1, 2, size, size, size, requires_grad=True)
    grid = (torch.rand(1, size, size, size, 3) * 2.2 - 1.1).requires_grad_()
    with reporting_compiles() as report:
        start = time.perf_counter()
        gs.grid_sample(x, grid, padding_mode="border", align_corners=False).square().sum().backward()
        seconds = time.perf_counter() - start
    results.append({"size": size, "compiled": report.names, "seconds": seconds})
print(json.dumps(results))
"""


def _python(site: Path, *arguments: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME")}
    env.update(PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1", HOME=str(site.parent / "home"))
    result = subprocess.run(
        [sys.executable, *arguments], capture_output=True, text=True, env=env, cwd=site.parent, timeout=TIMEOUT_S
    )
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.slow
def test_after_a_warm_up_the_first_call_compiles_nothing(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(PACKAGE, site / "gridsampler3d", ignore=shutil.ignore_patterns("__pycache__"))
    cache = site / "gridsampler3d" / "cpu" / "__pycache__"

    warmup = _python(site, "-m", "gridsampler3d", "warmup", *WARMED)
    summary = warmup.stdout.splitlines()
    assert summary[0].startswith("warmed 1 combinations: compiled ") and " kernels in " in summary[0]
    assert f"{cache}: written and read; " in warmup.stdout
    assert "compiling 1: " in warmup.stderr and "[####################] 1/1 bilinear border NCDHW float32 grid" in (
        warmup.stderr
    )

    calls = json.loads(_python(site, "-c", FIRST_CALLS).stdout)
    for call in calls:
        print(f"first forward and backward at {call['size']}³ after the warm-up: {call['seconds']:.3f} s")
    assert [call["compiled"] for call in calls] == [[], []]
    if not os.environ.get("CI"):  # a time, asserted only off CI (the bound; CI's machine is shared)
        assert all(call["seconds"] < 1.0 for call in calls), calls

    where = _python(site, "-m", "gridsampler3d", "warmup", "--where").stdout
    listed = {line.split(": ")[0]: int(line.split("; ")[1].split()[0]) for line in where.splitlines()}
    on_disk = {folder: len(list(Path(folder).glob("*.nb?"))) for folder in listed}
    assert listed == on_disk and listed[str(cache)] > 0
    cleared = _python(site, "-m", "gridsampler3d", "warmup", "--clear").stdout
    assert cleared.startswith(f"removed {sum(listed.values())} cached kernel files")
    assert not any(list(Path(folder).glob("*.nb?")) for folder in listed)


def test_every_field_kind_has_a_warm_up_call():
    """Each kind `--fields` offers runs a forward and a backward of its own kind (float64, whose kernels the rest of
    the suite compiles anyway)."""
    import torch

    from gridsampler3d.tools.commands.warmup import FIELDS, _calls

    for field in FIELDS:
        y, gradients = _calls("float64", "bilinear", "zeros", False, "NCDHW", field)()
        assert y.shape[:2] == (1, 6) and y.dtype == torch.float64, field
        assert gradients[0].shape == (1, 6, 4, 5, 6) and all(g is None or torch.isfinite(g).all() for g in gradients)
