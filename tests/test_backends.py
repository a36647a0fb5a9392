"""The backend registry: module layering, the `backends` command, and the warning when "auto" falls back."""

import ast
import importlib.metadata
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numba
import pytest
import torch

import gridsampler3d as gs
from gridsampler3d import backends
from gridsampler3d.tools.cli import main

PACKAGE = Path(__file__).resolve().parents[1] / "gridsampler3d"
ENGINE_FILES = sorted((PACKAGE / "cpu").glob("*.py")) + sorted((PACKAGE / "gpu").glob("*.py"))
# The registry imports the engines; an engine importing any of these closes a cycle.
ABOVE_THE_ENGINES = {
    "gridsampler3d",
    "gridsampler3d.backends",
    "gridsampler3d.api",
    "gridsampler3d.autograd",
    "gridsampler3d.call",
    "gridsampler3d.nn",
    "gridsampler3d.patch",
}


def _imported_modules(path: Path) -> set[str]:
    """Absolute names of the package modules that ``path`` imports (``from ..x import y`` counts x and x.y)."""
    package = ["gridsampler3d", path.parent.name]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in names if name.split(".")[0] == "gridsampler3d"}


@pytest.mark.parametrize("path", ENGINE_FILES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_engines_never_import_the_registry(path):
    """Not even inside a function (where a cycle would show only when the import runs)."""
    assert not _imported_modules(path) & ABOVE_THE_ENGINES


# Imports each engine module in turn into a process where the package is a bare namespace (its
# __init__, which imports the registry and the API, never runs) and prints, per module, the
# modules above the engines loaded by then.
IMPORT_THE_ENGINES_ALONE = """
import importlib, json, sys, types

package = types.ModuleType("gridsampler3d")
package.__path__ = [sys.argv[1]]
sys.modules["gridsampler3d"] = package
above = set(sys.argv[2].split(","))
loaded = {}
for name in sys.argv[3:]:
    importlib.import_module(name)
    loaded[name] = sorted(above & set(sys.modules))
print(json.dumps({"loaded": loaded, "package_intact": sys.modules["gridsampler3d"] is package}))
"""


def test_importing_the_engines_loads_nothing_above_them():
    """Each engine module imports, with everything it needs, before the registry or the API exists."""
    modules = [
        ".".join(("gridsampler3d", path.parent.name, path.stem)).removesuffix(".__init__") for path in ENGINE_FILES
    ]
    above = ",".join(sorted(ABOVE_THE_ENGINES - {"gridsampler3d"}))
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_THE_ENGINES_ALONE, str(PACKAGE), above, *modules],
        cwd=PACKAGE.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["package_intact"]
    assert list(report["loaded"]) == modules
    pulling = {name: loaded for name, loaded in report["loaded"].items() if loaded}
    assert not pulling, f"importing the engines loads modules above them: {pulling}"


@pytest.fixture
def registry(monkeypatch):
    """The registry module with a clean warn-once memory; replace entries with ``monkeypatch.setitem``."""
    monkeypatch.setattr(backends, "_warned_fallbacks", set())
    return backends


def _missing(name, device_type):
    return backends._Missing(name, ImportError(f"No module named '{name}'"), (device_type,))


def test_backends_command_lists_each_backend_and_the_versions(capsys):
    assert main(["backends"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line for line in lines[1:] if line.split() and line.split()[0] in backends.BACKENDS}
    assert set(rows) == set(backends.BACKENDS)
    for row in backends.describe_backends():
        printed = rows[row["name"]].split()
        assert printed[1] == ("yes" if row["available"] else "no")
        assert ", ".join(row["device_types"]) in rows[row["name"]]
        if row["reason"]:
            assert rows[row["name"]].endswith(row["reason"])
    assert rows["numba"].split()[1:3] == ["yes", "cpu"]
    assert f"cpu tensors -> {gs.backends.auto_choices()['cpu']}" in lines[-2]
    # The installed distribution's version, which may lack torch.__version__'s local part (+cu128).
    assert lines[-1].startswith(f"versions: torch {importlib.metadata.version('torch')}, numba ")
    assert "triton " in lines[-1]


def test_backends_command_says_why_a_backend_cannot_run(registry, monkeypatch, capsys):
    monkeypatch.setitem(registry.BACKENDS, "numba", _missing("numba", "cpu"))
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "numba      no         cpu           cannot be imported: No module named 'numba'" in out
    assert "cpu tensors -> reference" in out


def test_library_versions_names_absent_packages(monkeypatch):
    real = importlib.metadata.version

    def version(package):
        if package == "triton":
            raise importlib.metadata.PackageNotFoundError(package)
        return real(package)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert backends.library_versions()["triton"] == "not installed"
    assert backends.library_versions()["numba"] == numba.__version__


def test_auto_warns_once_when_cuda_tensors_fall_back_to_the_reference(registry, monkeypatch):
    monkeypatch.setitem(registry.BACKENDS, "triton", _missing("triton", "cuda"))
    cuda = torch.device("cuda")
    with pytest.warns(UserWarning) as caught:
        assert registry.select_backend("auto", cuda) is registry.BACKENDS["reference"]
    message = str(caught[0].message)
    assert "cuda tensors on the NumPy reference" in message and "No module named 'triton'" in message
    assert "pip install 'gridsampler3d[gpu]'" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert registry.select_backend("auto", cuda) is registry.BACKENDS["reference"]  # once only
        assert registry.select_backend("reference", cuda) is registry.BACKENDS["reference"]


def test_auto_warns_when_cpu_tensors_fall_back_to_the_reference(registry, monkeypatch):
    monkeypatch.setitem(registry.BACKENDS, "numba", _missing("numba", "cpu"))
    with pytest.warns(UserWarning, match="Remedy: for numba: pip install numba"):
        assert registry.select_backend("auto", torch.device("cpu")) is registry.BACKENDS["reference"]


def test_auto_is_silent_when_an_engine_runs(registry):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert registry.select_backend("auto", torch.device("cpu")) is registry.BACKENDS["numba"]
