"""The backend registry: module layering, the `backends` command, and the warning when "auto" falls back."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gridsampler3d"
ENGINE_FILES = sorted((PACKAGE / "cpu").glob("*.py")) + sorted((PACKAGE / "gpu").glob("*.py"))
# The registry imports the engines; an engine importing any of these closes a cycle.
ABOVE_THE_ENGINES = {"gridsampler3d", "gridsampler3d.backends", "gridsampler3d.api", "gridsampler3d.torch_ops",
                     "gridsampler3d.patch"}


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
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in names if name.split(".")[0] == "gridsampler3d"}


def test_import_scan_sees_relative_imports():
    assert {"gridsampler3d.layout", "gridsampler3d.layout.memory_format_of"} <= _imported_modules(
        PACKAGE / "cpu" / "engine.py")


@pytest.mark.parametrize("path", ENGINE_FILES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_engines_never_import_the_registry(path):
    assert not _imported_modules(path) & ABOVE_THE_ENGINES
