"""The CPU engine's place in a process: its Numba boundary, the plain path, and no process-wide effect.

Each check runs tests/runtime_checks.py in a process of its own (docs/runtime.md).
"""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gridsampler3d"
# Long enough for a cold compile of several kernels on a busy machine.
TIMEOUT_S = 600


def _run(check, package_root=ROOT, cache=None, **variables):
    """The output of ``runtime_checks.py check`` in a new process, the package imported from ``package_root``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("GRIDSAMPLER3D_PLAIN_NUMBA", "NUMBA_THREADING_LAYER", "NUMBA_THREADING_LAYER_PRIORITY")
    }
    env.update(variables)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package_root), env.get("PYTHONPATH")]))
    if cache is not None:
        env["NUMBA_CACHE_DIR"] = str(cache)
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "runtime_checks.py"), check],
        cwd=package_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0 and result.stdout.rstrip().endswith("ok"), (
        f"{check}: exit status {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result.stdout


def test_import_and_kernels_change_nothing_process_wide():
    """No Numba setting, library or thread at import; no Numba threading layer started by any kernel."""
    _run("import")


@pytest.mark.parametrize("layer", ["workqueue", "omp"])
def test_the_users_threading_layer_is_kept(layer):
    _run("user-layer", NUMBA_THREADING_LAYER=layer)


@pytest.mark.slow
def test_the_plain_path_matches_pytorch(tmp_path):
    """Numba's public API alone: float64 bitwise PyTorch's, float32 by the rule, no disk cache, named "plain"."""
    _run("plain", cache=tmp_path / "cache", GRIDSAMPLER3D_PLAIN_NUMBA="1")


def test_a_missing_hook_falls_back_to_the_plain_path_with_one_warning():
    _run("missing-hook")


def _sums(output: str) -> dict:
    return {line.split()[0]: line.split()[1] for line in output.splitlines() if line.startswith("bi")}


@pytest.mark.slow
def test_an_edited_helper_reaches_the_next_call(tmp_path):
    """A helper's file changes, the kernels' files do not: the next call compiles anew instead of loading the old.

    Numba's own cache key holds only the kernel's file; the engine's holds every source of
    the engine (tricubic and trilinear kernels, the disk cache shared by the runs).
    """
    copy = tmp_path / "copy"
    shutil.copytree(PACKAGE, copy / "gridsampler3d", ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / "cache"
    first = _run("checksum", copy, cache)
    assert f"package {copy / 'gridsampler3d'}" in first
    assert _sums(_run("checksum", copy, cache)) == _sums(first)  # loaded from the cache: the same sums
    coords = copy / "gridsampler3d" / "cpu" / "coords.py"
    text = coords.read_text()
    # The unnormalising rule without align_corners, in the tricubic and in the trilinear helper.
    edits = {
        "return ((coord + 1.0) * size - 1.0) * 0.5, size * 0.5": "return ((coord + 1.0) * size) * 0.5, size * 0.5",
        "index = ((coord + 1.0) * size - 1.0) * 0.5": "index = ((coord + 1.0) * size) * 0.5",
    }
    for old, new in edits.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    coords.write_text(text)
    edited = _sums(_run("checksum", copy, cache))
    assert edited["bicubic"] != _sums(first)["bicubic"] and edited["bilinear"] != _sums(first)["bilinear"], (
        _sums(first),
        edited,
    )


# Numba's internals: what its documentation does not describe for users (its private names too, not its dunders).
INTERNAL = ("numba.core", "numba.np", "numba.parfors", "numba.cpython", "numba.misc", "numba.experimental", "numba._")
# Under numba.core but documented for applications: the event API ("Event API" in Numba's documentation), by which
# cpu/compile_report.py names the kernels a first call compiles.
DOCUMENTED = ("numba.core.event",)


def _dotted(node) -> str | None:
    """``a.b.c`` of an attribute chain rooted at a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _numba_internals(path: Path) -> set[str]:
    """The internal Numba modules ``path`` imports or reaches through ``numba.<module>`` attributes."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Attribute):
            names.add(_dotted(node) or "")
    return {name for name in names if name.startswith(INTERNAL) and not name.startswith(("numba.__", *DOCUMENTED))}


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_only_the_hooks_module_uses_numbas_internals(path):
    used = _numba_internals(path)
    if path.name == "numba_hooks.py":
        assert used, "the hooks module is where the internals are used"
    else:
        assert not used, f"{path.name} uses Numba's internals {sorted(used)}: they belong in cpu/numba_hooks.py"


def test_the_required_numba_is_the_tested_range():
    """pyproject's bounds, the hooks module's word and the fallback's warning name the same releases."""
    from gridsampler3d.cpu import jit

    tomllib = pytest.importorskip("tomllib")
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    oldest, newest = jit.TESTED_NUMBA
    major, minor, _ = newest.split(".")
    assert f"numba>={oldest},<{major}.{int(minor) + 1}" in dependencies
    hooks = (PACKAGE / "cpu" / "numba_hooks.py").read_text()
    assert f"Numba {oldest}" in hooks and newest in hooks


def test_the_backends_command_names_the_path(capsys):
    from gridsampler3d.cpu import jit
    from gridsampler3d.tools.cli import main

    assert main(["backends"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("CPU engine: "))
    assert line.startswith(f"CPU engine: {jit.compile_path()}; parts on ")
    assert line.startswith("CPU engine: plain: ") == jit.plain() and ("hooks: " in line) != jit.plain()


# A first forward and backward in a process whose folders under the first argument refuse every write ("/": all
# of them; "-": none): Numba's write check of each location (NUMBA_CACHE_DIR, beside the package, the user's
# cache folder) fails there, as on a read-only install run by a user without a home. Run as root, a permission
# cannot refuse the write, so the check itself is made to fail. Prints where the package came from and how many
# kernels compiled.
FIRST_CALL = """
import os, sys, tempfile, warnings
if sys.argv[1] != "-":
    _temporary_file = tempfile.TemporaryFile
    def _refuse(*args, dir=None, **kwargs):
        if dir is not None and os.path.abspath(dir).startswith(sys.argv[1]):
            raise PermissionError(13, "read-only file system", dir)
        return _temporary_file(*args, **kwargs)
    tempfile.TemporaryFile = _refuse
warnings.simplefilter("always")
import torch
import gridsampler3d as gs
from gridsampler3d.cpu.compile_report import reporting_compiles
x = torch.randn(1, 2, 5, 6, 7, requires_grad=True)
grid = (torch.rand(1, 3, 4, 5, 3) * 2 - 1).requires_grad_()
with reporting_compiles() as report:
    gs.grid_sample(x, grid).square().sum().backward()
print("from", gs.__file__)
print("ran", tuple(x.grad.shape), tuple(grid.grad.shape))
print("compiled", len(report.names))
"""


def _first_call(site, writes, cache_dir=None):
    """Run FIRST_CALL with the package imported from ``site``; its stdout and stderr."""
    env = {key: value for key, value in os.environ.items() if key not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME")}
    env.update(PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1", HOME=str(site.parent / "no-home"))
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = str(cache_dir)
    result = subprocess.run(
        [sys.executable, "-c", FIRST_CALL, writes],
        capture_output=True,
        text=True,
        env=env,
        cwd=site.parent,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr
    assert f"from {site / 'gridsampler3d' / '__init__.py'}" in result.stdout
    assert "ran (1, 2, 5, 6, 7) (1, 3, 4, 5, 3)" in result.stdout
    return result.stdout, result.stderr


def _compiled(stdout):
    return int(stdout.rsplit("compiled ", 1)[1].split()[0])


@pytest.mark.slow
def test_without_a_writable_cache_folder_the_package_runs_and_reads_a_cache_warmed_beside_it(tmp_path):
    """A copy of the package with no cache: refused every write, it compiles in memory and warns once; once a
    writable run has cached its kernels beside it, a process refused every write loads them (nothing compiles, no
    warning), and so does one that may write only to the user's cache folder. NUMBA_CACHE_DIR, an empty folder,
    is a cold cache."""
    site = tmp_path / "site"
    shutil.copytree(PACKAGE, site / "gridsampler3d", ignore=shutil.ignore_patterns("__pycache__"))
    warning = "Numba's disk cache has no writable folder"

    stdout, stderr = _first_call(site, "/")
    assert _compiled(stdout) > 0
    assert stderr.count(warning) == 1 and "NUMBA_CACHE_DIR" in stderr

    stdout, stderr = _first_call(site, "-")  # the installer's warm-up: kernels cached beside the package
    assert _compiled(stdout) > 0 and warning not in stderr
    assert list((site / "gridsampler3d" / "cpu" / "__pycache__").glob("*.nbi"))

    stdout, stderr = _first_call(site, "/")
    assert _compiled(stdout) == 0 and warning not in stderr

    stdout, stderr = _first_call(site, str(site))  # only the home's cache folder takes files
    assert _compiled(stdout) == 0 and warning not in stderr

    stdout, stderr = _first_call(site, "-", cache_dir=tmp_path / "elsewhere")
    assert _compiled(stdout) > 0 and warning not in stderr


def test_as_an_unprivileged_user_without_a_home_the_package_imports_and_runs(tmp_path):
    """The real thing where this machine allows it: root running the interpreter as ``nobody``."""
    runuser = shutil.which("runuser")
    if os.geteuid() != 0 or runuser is None:
        pytest.skip("needs root and runuser to act as another user")
    probe = subprocess.run([runuser, "-u", "nobody", "--", sys.executable, "-c", "pass"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("this interpreter is not readable by the user nobody")
    code = FIRST_CALL.split("import torch", 1)[1]
    env = {"HOME": "/nonexistent", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [
            runuser,
            "-u",
            "nobody",
            "--",
            "env",
            "-i",
            *(f"{k}={v}" for k, v in env.items()),
            sys.executable,
            "-c",
            "import torch" + code,
            "-",
        ],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr
    assert "ran (1, 2, 5, 6, 7) (1, 3, 4, 5, 3)" in result.stdout
