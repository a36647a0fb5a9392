"""The API reference (`make docs`): pdoc builds it from the docstrings, and every public name it documents has one."""

import importlib
import re
from pathlib import Path

import pdoc
import pdoc.doc
import pytest

MAKEFILE = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
# The modules `make docs` documents.
API_MODULES = re.search(r"^API_MODULES \?= (.+)$", MAKEFILE, flags=re.MULTILINE).group(1).split()


def _public_names(module_name: str) -> list[tuple[str, pdoc.doc.Doc]]:
    """(name, pdoc's view) of each name in the module's ``__all__``, and of each public method of its classes."""
    documented = pdoc.doc.Module(importlib.import_module(module_name))
    names = []
    for name in documented.obj.__all__:
        member = documented.members[name]
        names.append((name, member))
        if isinstance(member, pdoc.doc.Class):
            names += [
                (f"{name}.{method.name}", method)
                for method in member.own_members
                if isinstance(method, pdoc.doc.Function) and not method.name.startswith("_")
            ]
    return names


def test_the_api_reference_covers_the_package():
    assert API_MODULES[0] == "gridsampler3d"
    assert {"gridsampler3d.cpu.planner", "gridsampler3d.precision", "gridsampler3d.tools.golden_kit"} <= set(
        API_MODULES
    )


@pytest.mark.parametrize("module_name", API_MODULES)
def test_every_public_name_has_a_docstring(module_name):
    assert importlib.import_module(module_name).__doc__, f"{module_name} has no docstring"
    missing = [name for name, member in _public_names(module_name) if not member.docstring.strip()]
    assert not missing, f"{module_name}: no docstring for {', '.join(missing)}"


def test_pdoc_builds_a_page_per_module_with_every_public_name(tmp_path):
    pdoc.pdoc(*API_MODULES, output_directory=tmp_path)
    for module_name in API_MODULES:
        page = (tmp_path / f"{module_name.replace('.', '/')}.html").read_text()
        absent = [name for name, _ in _public_names(module_name) if f'id="{name}"' not in page]
        assert not absent, f"{module_name}'s page lacks {', '.join(absent)}"
