"""The documentation agrees with the code: every name and path it cites exists, every environment variable the
package reads is in docs/runtime.md's table (and the table names nothing else of the package's), and the outputs
it shows are what the code prints.

The docs checked are README.md, BENCHMARKS.md's header (above its first table), docs/*.md and
benchmarks/README.md; CHANGELOG.md is history and may name what is gone.

What counts as a citation is a short list of patterns, so that prose is never taken for a name:

- ``gridsampler3d.a.b`` and ``gs.a`` (``gs`` is how the README imports the package);
- ``module.attribute`` where ``module`` is the stem of one of the package's modules (``planner.facts_needed``):
  looked up first in the engine a page describes (docs/cpu.md and docs/runtime.md: ``gridsampler3d.cpu``;
  docs/gpu.md: ``gridsampler3d.gpu``), then in the package's top level, then in any subpackage;
- paths under ``benchmarks/``, ``tests/``, ``docs/`` and ``gridsampler3d/``, paths relative to the package
  (``cpu/planner.py``), and a bare ``name.py`` in backticks (in the root, benchmarks/, tests/, and the page's
  engine or else the package and its folders);
- ``test_...`` names in backticks (a test function of tests/);
- Markdown links to files of the repository, with their ``#anchors``.

Each test reports every disagreement it finds at once.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gridsampler3d"


def _benchmarks_header() -> str:
    """BENCHMARKS.md above its first section: how it is made, where, with what (the rest is the run's tables)."""
    return (ROOT / "BENCHMARKS.md").read_text().split("\n## ", 1)[0]


DOCS = {
    "README.md": (ROOT / "README.md").read_text(),
    "BENCHMARKS.md": _benchmarks_header(),
    "benchmarks/README.md": (ROOT / "benchmarks" / "README.md").read_text(),
    **{f"docs/{path.name}": path.read_text() for path in sorted((ROOT / "docs").glob("*.md"))},
}
# The subpackage a page describes: a bare module name there means that engine's module.
PAGE_PACKAGE = {
    "docs/cpu.md": "gridsampler3d.cpu",
    "docs/runtime.md": "gridsampler3d.cpu",
    "docs/gpu.md": "gridsampler3d.gpu",
}
FILE_SUFFIXES = ("py", "md", "sh", "toml", "json", "npy", "bin", "png", "onnx", "txt", "html", "in")


def _modules() -> dict[str, list[str]]:
    """Stem -> the package's modules of that name (``planner`` -> cpu.planner and gpu.planner)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules.setdefault(parts[-1], []).append(".".join(parts))
    return modules


MODULES = _modules()
NAME = re.compile(
    r"(?<![\w/.`-])((?:gs|" + "|".join(sorted(MODULES, key=len, reverse=True)) + r")(?:\.[A-Za-z_*][\w*]*)+)"
)
PATH = re.compile(r"(?<![\w/.-])((?:benchmarks|tests|docs|gridsampler3d)/[\w./-]*?\.(?:py|md|sh|png))(?![\w])")
PACKAGE_PATH = re.compile(r"(?<![\w/.-])((?:cpu|gpu|commands|bench)/\w+\.py)(?![\w])")
BARE_FILE = re.compile(r"^[\w-]+\.(?:py|sh|toml)$")  # sources; a bare .md may be an output (gpu_check.md)
TEST_NAME = re.compile(r"(?:^|::)(test_\w+)$")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """``text`` without its fenced blocks (each line kept, emptied), so that line numbers stay."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return "\n".join(lines)


def _plain_blocks(text: str) -> str:
    """The fenced blocks with no language (diagrams, command lines, layouts), the rest of ``text`` emptied."""
    lines, fence = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
            lines.append("")
        else:
            lines.append(line if fence == "" else "")
    return "\n".join(lines)


def _spans(text: str):
    """(line, text) of each inline code span outside fenced blocks (a span may wrap to the next line)."""
    prose = _prose(text)
    for match in re.finditer(r"`([^`]+)`", prose):
        yield prose.count("\n", 0, match.start()) + 1, " ".join(match.group(1).split())


def _cited_names(text: str):
    """(line, dotted name) of each package name cited in a code span or a plain fenced block."""
    for line, span in _spans(text):
        for match in NAME.finditer(span):
            yield line, match.group(1)
    plain = _plain_blocks(text)
    for match in NAME.finditer(plain):
        yield plain.count("\n", 0, match.start()) + 1, match.group(1)


def _defined_in(value, module_name: str) -> bool:
    """Whether ``value`` (a function or class) was defined in module ``module_name``, or is no function or class
    (a constant, a kernel object): ``rounding.round_once`` on docs/cpu.md must not pass by an import."""
    value = getattr(value, "py_func", value)  # a Numba dispatcher: its Python function
    defined = getattr(value, "__module__", None) if callable(value) else None
    return defined is None or not defined.startswith("gridsampler3d") or defined == module_name


def _has(owner, attributes: list[str]) -> bool:
    """Whether ``owner.a.b...`` exists (a ``*`` in a name matches any attribute: ``executors.run_*``), and a
    function or class named directly after a module is that module's own or in its ``__all__``."""
    module, module_name = owner, owner.__name__
    for index, attribute in enumerate(attributes):
        if "*" in attribute:
            matches = [name for name in dir(owner) if fnmatch.fnmatch(name, attribute)]
            if not matches:
                return False
            owner = getattr(owner, matches[0])
            continue
        if attribute in getattr(owner, "__dataclass_fields__", {}) or attribute in getattr(owner, "_fields", ()):
            owner = None  # a record's field: exists, nothing further to look into
            continue
        if owner is None or not hasattr(owner, attribute):
            return False
        owner = getattr(owner, attribute)
        if index == 0 and attribute not in getattr(module, "__all__", ()) and not _defined_in(owner, module_name):
            return False
    return True


def _resolves(name: str, page: str) -> bool:
    """Whether ``name`` (``gridsampler3d.x.y``, ``gs.x``, or ``stem.x`` as it stands on ``page``) exists."""
    parts = name.split(".")
    if parts[-1] in FILE_SUFFIXES:  # a file name (api.py), checked as a path
        return True
    if parts[0] in ("gs", "gridsampler3d") and len(parts) == 2 and parts[1] not in MODULES:
        return hasattr(importlib.import_module("gridsampler3d"), parts[1])  # a public name, re-exported
    if parts[0] in ("gs", "gridsampler3d"):
        candidates = [["gridsampler3d", *parts[1:]]]
    else:
        modules = MODULES[parts[0]]
        inside = [module for module in modules if module.rsplit(".", 1)[0] == PAGE_PACKAGE.get(page)]
        top = [module for module in modules if module.count(".") == 1]
        candidates = [[*module.split("."), *parts[1:]] for module in (inside or top or modules)]
    for dotted in candidates:
        # the longest importable prefix is the module, the rest attributes
        for cut in range(len(dotted), 0, -1):
            try:
                module = importlib.import_module(".".join(dotted[:cut]))
            except ImportError:
                continue
            if _has(module, dotted[cut:]):
                return True
            break
    return False


def _test_names() -> set[str]:
    names = set()
    for path in (ROOT / "tests").glob("*.py"):
        names |= set(re.findall(r"^\s*def (test_\w+)", path.read_text(), flags=re.MULTILINE))
    return names


def _file_exists(path: str, page: str) -> bool:
    """A path as cited on ``page``: from the repository's root, or relative to the package, or a bare file name in
    the root, benchmarks/, tests/ and the page's engine (other pages: the package and its folders)."""
    path = path.split("::")[0]
    if (ROOT / path).exists() or (PACKAGE / path).exists():
        return True
    if "/" in path:
        return False
    folders = [ROOT, ROOT / "benchmarks", ROOT / "tests"]
    engine = PAGE_PACKAGE.get(page)
    if engine is not None:
        folders.append(ROOT / engine.replace(".", "/"))
    else:
        folders += [PACKAGE, *[folder for folder in PACKAGE.iterdir() if folder.is_dir()]]
    return any((folder / path).exists() for folder in folders)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in _prose(path.read_text()).splitlines() if line.startswith("#")}


def test_every_cited_name_resolves():
    unresolved = sorted(
        {
            f"{page}:{line}: {name}"
            for page, text in DOCS.items()
            for line, name in _cited_names(text)
            if not _resolves(name, page)
        }
    )
    assert not unresolved, "names the docs cite that the package lacks:\n" + "\n".join(unresolved)


def test_every_cited_path_and_test_exists():
    tests = _test_names()
    missing = set()
    for page, text in DOCS.items():
        prose = _prose(text)
        for pattern in (PATH, PACKAGE_PATH):
            for match in pattern.finditer(text):
                if "*" not in match.group(1) and not _file_exists(match.group(1), page):
                    missing.add(f"{page}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(1)}")
        for line, span in _spans(text):
            if BARE_FILE.match(span) and not _file_exists(span, page):
                missing.add(f"{page}:{line}: {span}")
            test = TEST_NAME.search(span)
            if test and " " not in span and test.group(1) not in tests:
                missing.add(f"{page}:{line}: {span} (no such test)")
        for match in LINK.finditer(prose):
            target = match.group(1)
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            where = (ROOT / page).parent / file if file else ROOT / page
            line = prose.count("\n", 0, match.start()) + 1
            if not where.exists():
                missing.add(f"{page}:{line}: link to {target}")
            elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
                missing.add(f"{page}:{line}: link to {target} (no such heading)")
    assert not missing, "paths, tests and links the docs cite that do not exist:\n" + "\n".join(sorted(missing))


# -- the environment -------------------------------------------------------------------------------------------------

READERS = {"gridsampler3d", "numba", "triton", "torch"}


def _string_constants(tree: ast.Module) -> dict[str, str]:
    """A module's top-level names bound to a string (``ENVIRONMENT_VARIABLE = "GRIDSAMPLER3D_AUTOTUNE"``)."""
    return {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _is_os_environ(node) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "environ"
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _numba_config_names(tree: ast.Module) -> set[str]:
    """The local names under which a module holds ``numba.config`` (``from numba import config``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("numba", "numba.core"):
            names |= {alias.asname or alias.name for alias in node.names if alias.name == "config"}
    return names


def package_environment() -> dict[str, set[str]]:
    """Each environment variable the package reads -> the files that read it: ``os.environ.get(NAME)``,
    ``os.environ[NAME]``, ``NAME in os.environ``, ``os.getenv(NAME)`` (NAME a string or a module's string
    constant), and Numba's settings read through ``numba.config`` (``config.CPU_NAME`` is ``NUMBA_CPU_NAME``)."""
    reads = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        with warnings.catch_warnings():  # a source's own warnings (an escape sequence) are not this test's
            warnings.simplefilter("ignore")
            tree = ast.parse(path.read_text(), filename=str(path))
        constants, configs = _string_constants(tree), _numba_config_names(tree)

        def name_of(node):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                return node.value
            return constants.get(node.id) if isinstance(node, ast.Name) else None

        for node in ast.walk(tree):
            found = None
            if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
                if (node.func.attr == "get" and _is_os_environ(node.func.value)) or (
                    node.func.attr == "getenv" and isinstance(node.func.value, ast.Name) and node.func.value.id == "os"
                ):
                    found = name_of(node.args[0])
            elif isinstance(node, ast.Subscript) and _is_os_environ(node.value):
                found = name_of(node.slice)
            elif isinstance(node, ast.Compare) and any(_is_os_environ(item) for item in node.comparators):
                found = name_of(node.left)
            elif (
                isinstance(node, ast.Attribute)
                and node.attr.isupper()
                and (
                    (isinstance(node.value, ast.Name) and node.value.id in configs)
                    or (
                        isinstance(node.value, ast.Attribute)
                        and node.value.attr == "config"
                        and isinstance(node.value.value, ast.Name)
                        and node.value.value.id == "numba"
                    )
                )
            ):
                found = node.attr if node.attr.startswith("NUMBA_") else f"NUMBA_{node.attr}"
            if found:
                reads.setdefault(found, set()).add(str(path.relative_to(ROOT)))
    return reads


def _environment_table() -> dict[str, set[str]]:
    """docs/runtime.md's "Environment" table: variable -> who reads it (its "read by" column, lower case)."""
    section = DOCS["docs/runtime.md"].split("\n## Environment\n", 1)[1].split("\n## ", 1)[0]
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("|")
    ]
    header = [cell.lower() for cell in rows[0]]
    assert header[:2] == ["variable", "read by"], f"docs/runtime.md's environment table has columns {header}"
    table = {}
    for cells in rows[2:]:
        (variable,) = re.findall(r"`([A-Z][A-Z0-9_]+)`", cells[0])
        readers = re.sub(r"\([^)]*\)", "", cells[1])
        table[variable] = {reader.strip().split()[0].lower() for reader in readers.split(",") if reader.strip()}
    return table


def test_the_environment_table_names_every_variable_the_package_reads_and_who_reads_it():
    reads, table = package_environment(), _environment_table()
    assert {"GRIDSAMPLER3D_PLAIN_NUMBA", "GRIDSAMPLER3D_AUTOTUNE", "TRITON_INTERPRET", "NUMBA_CPU_NAME"} <= set(reads)
    problems = [
        f"{name} (read in {', '.join(sorted(files))}) is not in the table"
        for name, files in sorted(reads.items())
        if name not in table
    ]
    problems += [
        f"{name}: the table says gridsampler3d reads it; the package does not"
        for name, readers in sorted(table.items())
        if "gridsampler3d" in readers and name not in reads
    ]
    problems += [
        f"{name}: read in {', '.join(sorted(reads[name]))}, but the table's 'read by' omits gridsampler3d"
        for name, readers in sorted(table.items())
        if name in reads and "gridsampler3d" not in readers
    ]
    problems += [
        f"{name}: 'read by' must name gridsampler3d, Numba, Triton or torch; got {sorted(readers)}"
        for name, readers in sorted(table.items())
        if not readers or not readers <= READERS
    ]
    assert not problems, "docs/runtime.md's environment table disagrees with the code:\n" + "\n".join(problems)


def test_every_package_variable_the_docs_name_is_read():
    reads = package_environment()
    named = {(page, name) for page, text in DOCS.items() for name in re.findall(r"\bGRIDSAMPLER3D_[A-Z0-9_]+", text)}
    unread = sorted(f"{page}: {name}" for page, name in named if name not in reads)
    assert not unread, "variables the docs name that the package never reads:\n" + "\n".join(unread)


# -- outputs the docs show -------------------------------------------------------------------------------------------


def _masked(line: str) -> str:
    """``line`` with its version numbers masked: the docs' machine and this one differ there only."""
    return re.sub(r"\d+(?:\.\d+)+", "<version>", line.strip())


def _backends_lines(monkeypatch, capsys) -> set[str]:
    """The "CPU engine:" line `gridsampler3d backends` prints, for each path (hooked with either kind of load, plain)
    and each route of the parts."""
    from gridsampler3d.cpu import jit, numba_hooks, pool
    from gridsampler3d.tools import cli

    lines = set()
    for hooks, reason, gathers in (
        (numba_hooks, None, True),
        (numba_hooks, None, False),
        (None, "GRIDSAMPLER3D_PLAIN_NUMBA=1", True),
    ):
        for route in ("team", "workers"):
            monkeypatch.setattr(jit, "_hooks", hooks)
            monkeypatch.setattr(jit, "_plain_reason", reason)
            monkeypatch.setattr(jit, "gathers_in_use", lambda gathers=gathers: gathers)
            monkeypatch.setattr(pool, "route", lambda route=route: route)
            assert cli.main(["backends"]) == 0
            lines |= {line for line in capsys.readouterr().out.splitlines() if line.startswith("CPU engine: ")}
    return lines


def test_the_backends_lines_in_runtime_md_are_what_the_command_prints(monkeypatch, capsys):
    shown = [line.strip() for line in DOCS["docs/runtime.md"].splitlines() if line.startswith("    CPU engine: ")]
    assert len(shown) == 2, "docs/runtime.md shows the hooked and the plain path's line"
    printed = {_masked(line) for line in _backends_lines(monkeypatch, capsys)}
    wrong = [line for line in shown if _masked(line) not in printed]
    assert not wrong, (
        "docs/runtime.md shows lines `gridsampler3d backends` does not print (versions aside):\n"
        + "\n".join(wrong)
        + "\nit prints:\n"
        + "\n".join(sorted(printed))
    )


def test_the_plans_in_cpu_md_are_what_explain_gives():
    """docs/cpu.md's two plans: rand64's and feat48's backward at two threads (no kernel runs)."""
    import torch

    import gridsampler3d as gs
    from gridsampler3d.tools.bench.suite import build_inputs, select_cases

    block = DOCS["docs/cpu.md"].split("rand64's and\nfeat48's backward at two threads", 1)[1].split("```")[1]
    shown = [line.strip() for line in re.sub(r"\n  ", " ", block.strip()).splitlines()]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        plans = []
        for case in select_cases("rand64,feat48"):
            (grad, x, grid), _ = build_inputs(case)
            plans.append(
                str(gs.explain(x, grid, grad, case.mode, case.padding, case.align_corners, data_format=case.layout))
            )
    finally:
        torch.set_num_threads(threads)
    assert shown == plans


def test_the_golden_kit_verdict_is_what_compare_prints(tmp_path, capsys):
    """docs/golden-kit.md's verdict table: this library's outputs on case 000, judged by `gridsampler3d compare`."""
    import numpy as np

    import gridsampler3d as gs
    from gridsampler3d.tools import cli

    text = DOCS["docs/golden-kit.md"]
    shown = next(block for block in text.split("```")[1::2] if "verdict: PASS" in block).strip()
    assert cli.main(["cases", "--out", str(tmp_path), "--count", "1"]) == 0
    (case,) = tmp_path.iterdir()
    grad, x, grid = (np.load(case / f"{name}.npy") for name in ("grad", "input", "grid"))
    dx, dgrid = gs.grid_sampler3d_backward(grad, x, grid, "bilinear", "zeros", False)
    np.save(tmp_path / "dx.npy", dx)
    np.save(tmp_path / "dgrid.npy", dgrid)
    capsys.readouterr()
    assert (
        cli.main(
            ["compare", "--case", str(case), "--dx", str(tmp_path / "dx.npy"), "--dgrid", str(tmp_path / "dgrid.npy")]
        )
        == 0
    )
    assert capsys.readouterr().out.strip() == shown


def test_the_golden_kit_case_json_is_what_the_kit_writes(tmp_path):
    """docs/golden-kit.md's case.json is case 009's, the folder name it gives as an example."""
    import json

    from gridsampler3d.tools import golden_kit

    text = DOCS["docs/golden-kit.md"]
    shown = next(block for block in text.split("```")[1::2] if block.lstrip().startswith('{"dtype"'))
    spec, dtype = golden_kit.case_set()[9]
    assert golden_kit.folder_name(9, spec, dtype) in text
    folder = golden_kit.write_case(tmp_path, spec, dtype, seed=0, index=9)
    assert json.loads(shown) == json.loads((folder / "case.json").read_text())


def test_the_readme_speed_table_is_what_publish_makes_of_benchmarks_md():
    """The block between the README's speed-table markers is what `benchmarks/publish.py --readme` writes for the
    run BENCHMARKS.md holds."""
    from helpers import benchmark_script

    publish = benchmark_script("publish")
    made = publish.format_readme_table(publish.read_document((ROOT / "BENCHMARKS.md").read_text()))
    readme = DOCS["README.md"]
    assert made in readme, "README.md's speed table differs from the one made from BENCHMARKS.md:\n" + made
    assert publish.replace_readme_table(readme, made) == readme


def test_the_api_page_lists_every_public_name():
    import gridsampler3d

    section = DOCS["docs/api.md"].split("\n## API at a glance\n", 1)[1].split("\n## ", 1)[0]
    listed = {re.match(r"[\w.]+", span).group(0) for _, span in _spans(section) if re.match(r"[\w.]+", span)}
    missing = [name for name in gridsampler3d.__all__ if name not in listed]
    assert not missing, f"docs/api.md's API at a glance omits {', '.join(missing)}"
    for keyword in ("backend", "deterministic"):
        assert f"`{keyword}=" in section and f"`{keyword}`" in DOCS["docs/semantics.md"]


@pytest.mark.parametrize("keyword", ["backend", "deterministic"])
def test_semantics_md_names_every_public_name_that_takes_backend_and_deterministic(keyword):
    """The lists in docs/semantics.md, "Backends and determinism", are every public callable with that keyword."""
    import inspect

    import gridsampler3d

    section = DOCS["docs/semantics.md"].split("\n## Backends and determinism\n", 1)[1].split("\n## ", 1)[0]
    paragraph = next(part for part in section.split("\n\n") if part.strip().startswith(f"`{keyword}` (a keyword of"))
    named = set(re.findall(r"`(\w+)`", paragraph)) - {keyword}
    taking = {
        name
        for name in gridsampler3d.__all__
        if callable(getattr(gridsampler3d, name))
        and not isinstance(getattr(gridsampler3d, name), type)
        and keyword in inspect.signature(getattr(gridsampler3d, name)).parameters
    }
    assert named == taking


def test_every_module_is_in_the_one_module_list():
    """docs/architecture.md's list names every module of the package, each under its folder, once."""
    block = DOCS["docs/architecture.md"].split("\n## The modules\n", 1)[1].split("```", 2)[1]
    listed, folder = set(), ""
    for line in block.splitlines()[1:]:
        name = line.strip().split(" ", 1)[0]
        depth = (len(line) - len(line.lstrip())) // 2
        if depth == 1:
            folder = name if name.endswith("/") else ""
            listed.add(name)
        elif depth == 2 and folder:
            listed.add(folder + name)
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        parts = relative.split("/")
        if parts[-1] == "__init__.py" and len(parts) > 1:
            continue
        # A module at the top or one folder down is named itself; deeper ones by their folder (tools/commands/).
        expected = relative if len(parts) <= 2 else "/".join(parts[:2]) + "/"
        assert expected in listed, f"docs/architecture.md's module list omits gridsampler3d/{relative}"


def test_the_front_door_raises_no_input_error_of_its_own():
    """Every check of a call's arguments lives in validate.py (the attributes' names and codes in modes.py): the
    modules in front of the engines raise no TypeError, ValueError or NotImplementedError themselves."""
    front = ["api.py", "call.py", "nn.py", "autograd.py", "backends.py", "patch.py", "sampling.py", "layout.py"]
    found = []
    for name in front:
        for node in ast.walk(ast.parse((PACKAGE / name).read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                call = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(call, ast.Name) and call.id in ("TypeError", "ValueError", "NotImplementedError"):
                    found.append(f"{name}:{node.lineno}")
    assert not found, f"input errors raised outside validate.py and modes.py: {found}"


def test_the_readme_says_which_half_precision_sums_run_in_float32():
    """The README's claim about half precision holds for both engines' plans: float64 sums on the CPU and in the
    GPU's deterministic dx, float32 in the GPU's forward and fast dx."""
    import dataclasses

    from gridsampler3d.gpu.planner import GpuCall, Stage, make_plan

    claim = next(line for line in DOCS["README.md"].split("\n- ") if line.startswith("**Half precision"))
    assert "sum in float64" in claim and "sum in float32" in " ".join(claim.split())
    call = GpuCall(Stage.BACKWARD, 1, 4, (8, 8, 8), (8, 8, 8), dtype="float16")
    assert make_plan(dataclasses.replace(call, stage=Stage.FORWARD)).sums == "float32"
    assert make_plan(call).dx_sums == "float32"
    assert make_plan(dataclasses.replace(call, deterministic=True)).dx_sums == "float64"


def test_the_make_targets_the_readme_names_exist():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.search(r"^\.PHONY: (.+)$", makefile, flags=re.MULTILINE).group(1).split())
    named = set(re.findall(r"`make (\w+)`", DOCS["README.md"])) | set(
        re.findall(r"^make (\w+)", DOCS["README.md"], flags=re.MULTILINE)
    )
    assert named <= targets, f"README names make targets the Makefile lacks: {sorted(named - targets)}"
    assert {"run", "test", "demo", "bench", "docs"} <= named
    assert DOCS["README.md"].split("```", 2)[1].strip().splitlines()[:2] == [
        "make run     # dx and dgrid for the built-in 64³ case (creates .venv on first use)",
        "make test    # the whole test suite (creates .venv on first use)",
    ]


def test_the_command_lines_the_docs_show_parse():
    """Each ``gridsampler3d ...`` line of the docs' plain blocks (but those with ``[optional]`` parts or ``...``)
    is accepted by the command line's parser."""
    import shlex

    from gridsampler3d.tools import cli

    refused, parsed = [], set()
    for page, text in DOCS.items():
        for line in _plain_blocks(text).replace("\\\n", " ").splitlines():
            command = line.split("#")[0].strip()
            if not command.startswith("gridsampler3d ") or "[" in command or "..." in command:
                continue
            try:
                cli.build_parser().parse_args(shlex.split(command)[1:])
                parsed.add(page)
            except SystemExit:
                refused.append(f"{page}: {command}")
    assert {"README.md", "benchmarks/README.md"} <= parsed
    assert not refused, "command lines the parser refuses:\n" + "\n".join(refused)


def test_the_benchmark_suite_in_semantics_md_is_the_registry():
    from gridsampler3d.tools.bench.suite import BICUBIC_SUITE, SUITE, WARP_SUITE

    section = DOCS["docs/semantics.md"].split("\n## The benchmark suite\n", 1)[1]
    assert f"measured on {len(SUITE)} cases" in " ".join(section.split())
    assert re.findall(r"^\| (\w+) \| \d", section, flags=re.MULTILINE) == [case.name for case in SUITE[:8]]
    assert all(case.name in section for case in WARP_SUITE + BICUBIC_SUITE)


def test_the_cpu_design_doc_stays_short():
    """docs/cpu.md describes the engine as it is, within 300 lines; history goes to CHANGELOG.md."""
    assert len(DOCS["docs/cpu.md"].splitlines()) <= 300
