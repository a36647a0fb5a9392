"""The package as users get it: ``python -m build`` makes the sdist and the wheel without a warning, and the wheel,
installed in a fresh environment that holds its declared dependencies and nothing else, runs a forward and a backward
that equal PyTorch's float64 results."""

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import gridsampler3d

ROOT = Path(__file__).resolve().parents[1]
# What a checkout may hold beside its sources (environments, outputs, caches).
NOT_SOURCES = shutil.ignore_patterns(
    ".git",
    ".venv",
    "out",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "*.py[cod]",
    ".pytest_cache",
    ".hypothesis",
    "*.nbi",
    "*.nbc",
)

# Run by the installed package, from a directory outside the source tree.
RUN_INSTALLED = """
import json
import torch
import gridsampler3d as gs
from gridsampler3d.backends import auto_choices

generator = torch.Generator().manual_seed(0)
x = torch.randn(2, 3, 5, 6, 7, generator=generator, dtype=torch.float64)
grid = torch.rand(2, 4, 3, 5, 3, generator=generator, dtype=torch.float64) * 2.4 - 1.2
grad = torch.randn(2, 3, 4, 3, 5, generator=generator, dtype=torch.float64)
y = gs.grid_sampler3d(x, grid, "bilinear", "border")
dx, dgrid = gs.grid_sampler3d_backward(grad, x, grid, "bilinear", "border")
golden_y = torch.ops.aten.grid_sampler_3d(x, grid, 0, 1, False)
golden_dx, golden_dgrid = torch.ops.aten.grid_sampler_3d_backward(grad, x, grid, 0, 1, False, [True, True])
print(json.dumps({"file": gs.__file__, "cpu_backend": auto_choices()["cpu"],
                  "equal": {"y": torch.equal(y, golden_y), "dx": torch.equal(dx, golden_dx),
                            "dgrid": torch.equal(dgrid, golden_dgrid)}}))
"""


def _build(tmp_path: Path) -> tuple[Path, Path, str]:
    """(sdist, wheel, the build's output) of a copy of the sources, built with this environment's setuptools."""
    source, dist = tmp_path / "source", tmp_path / "dist"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    # Byte-compiling off (as some shells set it) makes setuptools warn that it skips it.
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    (sdist,), (wheel,) = dist.glob("*.tar.gz"), dist.glob("*.whl")
    return sdist, wheel, output


def _requirement_closure(wheel: Path) -> set[str]:
    """The distributions the wheel needs here: its requirements, theirs, and so on (markers evaluated, no extras)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(entry for entry in archive.namelist() if entry.endswith(".dist-info/METADATA"))
        wanted = [
            line.split(":", 1)[1].strip()
            for line in archive.read(name).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    closure = set()
    while wanted:
        requirement = Requirement(wanted.pop())
        key = canonicalize_name(requirement.name)
        if key in closure or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        closure.add(key)
        wanted += metadata.distribution(requirement.name).requires or []
    return closure


def _link_installed(distribution, site_packages: Path) -> None:
    """Make this environment's install of ``distribution`` appear in another environment's ``site_packages``:
    a symbolic link per top-level entry (packages, modules, the dist-info), and per file it installed outside
    site-packages (shared libraries, scripts) at the same place relative to it."""
    entries = set()
    for file in distribution.files or []:
        entries.add(Path(file) if file.parts[0] == ".." else Path(file.parts[0]))
    for entry in entries:
        target = Path(os.path.normpath(site_packages / entry))
        if entry.name != "__pycache__" and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(Path(distribution.locate_file(entry)).resolve())


@pytest.mark.slow
def test_build_is_clean_and_the_installed_wheel_equals_the_golden(tmp_path):
    sdist, wheel, output = _build(tmp_path)
    assert not re.findall(r".*(?:warn|deprecat).*", output, flags=re.IGNORECASE)

    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "tests/conftest.py",
        "docs/semantics.md",
        "benchmarks/gpu_check.py",
        "gridsampler3d/cpu/coords.py",
    } <= names
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(name for name in names if name.endswith(".dist-info/METADATA"))
        fields = archive.read(info).decode()
    assert all(name.startswith("gridsampler3d") for name in names), names
    assert f"Version: {gridsampler3d.__version__}" in fields
    assert "License-Expression: Apache-2.0" in fields and any(name.endswith("/licenses/LICENSE") for name in names)

    environment = tmp_path / "environment"
    venv.EnvBuilder().create(environment)  # without pip or setuptools: this environment's pip installs into it
    python = environment / "bin" / "python"
    site_packages = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    for name in _requirement_closure(wheel):
        _link_installed(metadata.distribution(name), site_packages)
    isolated = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    isolated.update(PYTHONNOUSERSITE="1", NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", str(wheel)],
        env=isolated,
        check=True,
        capture_output=True,
        timeout=300,
    )
    check = subprocess.run([*pip, "check"], env=isolated, capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr  # every declared dependency is there
    assert (environment / "bin" / "gridsampler3d").exists()

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    result = subprocess.run(
        [str(python), "-c", RUN_INSTALLED], cwd=outside, env=isolated, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert Path(report["file"]).is_relative_to(site_packages), report["file"]
    assert report["cpu_backend"] == "numba"
    assert report["equal"] == {"y": True, "dx": True, "dgrid": True}
