"""The API reference (`make docs`): pdoc builds it from the docstrings, and every public name it documents has one."""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pdoc
import pdoc.doc
import pdoc.render
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


# `make docs`'s recipe: pdoc and its options.
RECIPE = re.search(r"^docs:.*\n\t\$\(PY\) -m pdoc (.+) --output-directory out/api \$\(API_MODULES\)$", MAKEFILE, re.M)


def test_the_api_reference_covers_the_package():
    assert API_MODULES[0] == "gridsampler3d"
    assert {
        "gridsampler3d.cpu.planner",
        "gridsampler3d.precision",
        "gridsampler3d.monai",
        "gridsampler3d.onnx",
        "gridsampler3d.tools.golden_kit",
    } <= set(API_MODULES)


def test_make_docs_builds_without_a_warning_and_links_every_page(tmp_path):
    """The recipe of `make docs` as it is written, into a folder of the test's: pdoc prints nothing on stderr, the
    docstrings' sections render as sections (the Google style), and the package's page links every other page."""
    assert RECIPE, "the docs target no longer reads `$(PY) -m pdoc OPTIONS --output-directory out/api $(API_MODULES)`"
    command = [sys.executable, "-m", "pdoc", *RECIPE.group(1).split(), "--output-directory", str(tmp_path)]
    result = subprocess.run([*command, *API_MODULES], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    package = (tmp_path / "gridsampler3d.html").read_text()
    for module_name in API_MODULES[1:]:
        assert f'href="{module_name.replace(".", "/")}.html"' in package, f"no link to {module_name}'s page"
    assert '<h6 id="arguments">Arguments:</h6>' in package and '<h6 id="returns">Returns:</h6>' in package
    assert '<div class="pdoc-code codehilite">' in package.split('id="grid_sampler3d"')[0]  # the example, a block


@pytest.mark.parametrize("module_name", API_MODULES)
def test_every_public_name_has_a_docstring(module_name):
    assert importlib.import_module(module_name).__doc__, f"{module_name} has no docstring"
    missing = [name for name, member in _public_names(module_name) if not member.docstring.strip()]
    assert not missing, f"{module_name}: no docstring for {', '.join(missing)}"


def test_pdoc_builds_a_page_per_module_with_every_public_name(tmp_path):
    pdoc.render.configure(docformat="google")
    pdoc.pdoc(*API_MODULES, output_directory=tmp_path)
    for module_name in API_MODULES:
        page = (tmp_path / f"{module_name.replace('.', '/')}.html").read_text()
        absent = [name for name, _ in _public_names(module_name) if f'id="{name}"' not in page]
        assert not absent, f"{module_name}'s page lacks {', '.join(absent)}"
