"""Every example in README.md runs and prints what the README shows; its command lines parse; its layout of the
code names every module.

A ```python block directly followed by a ```text block prints that text (``...`` in it stands for any
text, and runs of white space compare equal); a ```python block with no ```text block after it prints
nothing.
"""

import contextlib
import doctest
import io
import shlex
from pathlib import Path
from typing import NamedTuple

import pytest

from gridsampler3d.tools import cli

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


class Block(NamedTuple):
    language: str
    text: str
    line: int  # of the opening fence, 1-based
    end: int  # of the closing fence


class Example(NamedTuple):
    code: str
    line: int
    output: str | None  # what the README shows it prints, None where it shows nothing


def _blocks() -> list[Block]:
    """Each fenced block, in order."""
    blocks, opened, language, lines = [], None, None, []
    for number, line in enumerate(README.splitlines(), start=1):
        if line.startswith("```") and opened is None:
            opened, language, lines = number, line[3:].strip(), []
        elif line.startswith("```"):
            blocks.append(Block(language, "\n".join(lines) + "\n", opened, number))
            opened = None
        elif opened is not None:
            lines.append(line)
    return blocks


def _examples() -> list[Example]:
    """The ```python blocks, each with the ```text block that follows it (blank lines apart at most)."""
    blocks, examples = _blocks(), []
    readme_lines = README.splitlines()
    for block, after in zip(blocks, blocks[1:] + [None]):
        if block.language != "python":
            continue
        follows = (
            after is not None
            and after.language == "text"
            and not any(line.strip() for line in readme_lines[block.end : after.line - 1])
        )
        examples.append(Example(block.text, block.line, after.text if follows else None))
    return examples


# The "Deploy with ONNX" example stands alone: it needs the onnx extra, which the test extra leaves out.
PYTHON_EXAMPLES = [example for example in _examples() if "onnxruntime" not in example.code]
ONNX_EXAMPLES = [example for example in _examples() if "onnxruntime" in example.code]
PLAIN_BLOCKS = [block.text for block in _blocks() if block.language == ""]


def _command_lines():
    """The ``gridsampler3d ...`` lines of the README's plain blocks, continuation lines joined."""
    lines = []
    for block in PLAIN_BLOCKS:
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("#")[0].strip()
            if command.startswith("gridsampler3d "):
                lines.append(command)
    return lines


def _run(example: Example, namespace: dict) -> None:
    """Run ``example`` in ``namespace`` and compare what it prints with what the README shows."""
    printed = io.StringIO()
    # Blank lines first, so that a traceback names the example's line in README.md.
    code = compile("\n" * example.line + example.code, "README.md", "exec")
    with contextlib.redirect_stdout(printed):
        exec(code, namespace)  # noqa: S102 - the README's own examples
    where = f"README.md, the example at line {example.line}"
    if example.output is None:
        assert not printed.getvalue(), f"{where} prints what the README does not show:\n{printed.getvalue()}"
    else:
        matches = doctest.OutputChecker().check_output(
            example.output, printed.getvalue(), doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
        )
        assert matches, f"{where} prints\n{printed.getvalue()}\nwhere the README shows\n{example.output}"


def test_python_examples_run_in_order_and_print_what_the_readme_shows():
    """One namespace for all of them: each example builds on the ones before it, as a reader runs them."""
    namespace = {}
    for example in PYTHON_EXAMPLES:
        _run(example, namespace)


def test_the_explain_example_shows_the_plan_it_returns():
    """``gs.explain`` returns a plan record (it prints nothing); the README shows its ``str()``, one line, exactly."""
    from gridsampler3d.cpu.planner import Plan

    namespace = {}
    example = next(example for example in PYTHON_EXAMPLES if "gs.explain(" in example.code)
    for earlier in PYTHON_EXAMPLES[: PYTHON_EXAMPLES.index(example) + 1]:
        _run(earlier, namespace)
    plan = namespace["plan"]
    assert isinstance(plan, Plan) and "\n" not in str(plan)
    assert example.output is not None and example.output.strip() == str(plan)


@pytest.mark.parametrize("example", ONNX_EXAMPLES, ids=lambda example: f"line-{example.line}")
def test_onnx_example_runs(example, tmp_path, monkeypatch):
    """The "Deploy with ONNX" example, on its own, in a scratch directory (it writes warp.onnx)."""
    for module in ("onnx", "onnxruntime", "onnxscript"):
        pytest.importorskip(module, reason=f"the ONNX example needs {module} (the 'onnx' extra)")
    monkeypatch.chdir(tmp_path)
    _run(example, {})
    assert (tmp_path / "warp.onnx").exists()


@pytest.mark.parametrize("command", _command_lines())
def test_command_lines_parse(command):
    """Each command the README shows is accepted by the parser (the commands themselves have their own tests)."""
    arguments = shlex.split(command)[1:]
    parsed = cli.build_parser().parse_args(arguments)
    assert parsed.command == arguments[0] and callable(parsed.handler)


def test_builtin_run_example_executes(tmp_path):
    assert cli.main(["run", "--size", "16", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "dx.npy").exists() and (tmp_path / "dgrid.npy").exists()


PACKAGE = Path(__file__).resolve().parents[1] / "gridsampler3d"
DOCS = Path(__file__).resolve().parents[1] / "docs"


def _layout_entries() -> dict[str, str]:
    """The README's "Layout of the code" block: entry name -> its description, continuation lines joined."""
    block = README.split("## Layout of the code", 1)[1].split("```", 2)[1]
    entries, name = {}, None
    for line in block.splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            name, _, text = line.strip().partition(" ")
            entries[name] = text
        elif line.startswith("   ") and name is not None:
            entries[name] += " " + line.strip()
    return entries


def test_readme_layout_names_every_module():
    entries = _layout_entries()
    for module in sorted(PACKAGE.glob("*.py")):
        if module.name != "__init__.py":
            assert module.name in entries, f"README's layout omits gridsampler3d/{module.name}"
    for folder in ("cpu", "gpu", "commands"):
        for module in sorted((PACKAGE / folder).glob("*.py")):
            if module.name != "__init__.py":
                assert module.stem in entries[f"{folder}/"], f"README's layout omits {folder}/{module.name}"


@pytest.mark.parametrize("engine", ["cpu", "gpu"])
def test_engine_notes_name_every_module(engine):
    notes = (DOCS / f"{engine}.md").read_text()
    for module in sorted((PACKAGE / engine).glob("*.py")):
        if module.name != "__init__.py":
            assert f"`{module.name}`" in notes, f"docs/{engine}.md omits {module.name}"
