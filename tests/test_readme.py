"""Every example in README.md and docs/api.md runs and prints what the page shows; their command lines parse.

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

ROOT = Path(__file__).resolve().parents[1]
PAGES = {name: (ROOT / name).read_text() for name in ("README.md", "docs/api.md")}
README = PAGES["README.md"]


class Block(NamedTuple):
    language: str
    text: str
    line: int  # of the opening fence, 1-based
    end: int  # of the closing fence


class Example(NamedTuple):
    code: str
    line: int
    output: str | None  # what the page shows it prints, None where it shows nothing
    page: str = "README.md"


def _blocks(text: str = README) -> list[Block]:
    """Each fenced block of ``text``, in order."""
    blocks, opened, language, lines = [], None, None, []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("```") and opened is None:
            opened, language, lines = number, line[3:].strip(), []
        elif line.startswith("```"):
            blocks.append(Block(language, "\n".join(lines) + "\n", opened, number))
            opened = None
        elif opened is not None:
            lines.append(line)
    return blocks


def _examples(page: str = "README.md") -> list[Example]:
    """The ```python blocks of ``page``, each with the ```text block that follows it (blank lines apart at most)."""
    blocks, examples = _blocks(PAGES[page]), []
    readme_lines = PAGES[page].splitlines()
    for block, after in zip(blocks, blocks[1:] + [None]):
        if block.language != "python":
            continue
        follows = (
            after is not None
            and after.language == "text"
            and not any(line.strip() for line in readme_lines[block.end : after.line - 1])
        )
        examples.append(Example(block.text, block.line, after.text if follows else None, page))
    return examples


# The "Deploy with ONNX" example (docs/api.md) stands alone: it needs the onnx extra, which the test extra leaves out.
PYTHON_EXAMPLES = [example for example in _examples() if "onnxruntime" not in example.code]
ONNX_EXAMPLES = [example for page in PAGES for example in _examples(page) if "onnxruntime" in example.code]
PLAIN_BLOCKS = [block.text for page in PAGES.values() for block in _blocks(page) if block.language == ""]


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
    """Run ``example`` in ``namespace`` and compare what it prints with what its page shows."""
    printed = io.StringIO()
    # Blank lines first, so that a traceback names the example's line in its page.
    code = compile("\n" * example.line + example.code, example.page, "exec")
    with contextlib.redirect_stdout(printed):
        exec(code, namespace)  # noqa: S102 - the docs' own examples
    where = f"{example.page}, the example at line {example.line}"
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


@pytest.mark.parametrize("example", ONNX_EXAMPLES, ids=lambda example: f"{example.page}-line-{example.line}")
def test_onnx_example_runs(example, tmp_path, monkeypatch):
    """The "Deploy with ONNX" example, on its own, in a scratch directory (it writes warp.onnx)."""
    for module in ("onnx", "onnxruntime", "onnxscript"):
        pytest.importorskip(module, reason=f"the ONNX example needs {module} (the 'onnx' extra)")
    monkeypatch.chdir(tmp_path)
    _run(example, {})
    assert (tmp_path / "warp.onnx").exists()


def test_the_api_page_shows_how_to_deploy_with_onnx():
    assert [example.page for example in ONNX_EXAMPLES] == ["docs/api.md"]


@pytest.mark.parametrize("command", _command_lines())
def test_command_lines_parse(command):
    """Each command the README shows is accepted by the parser (the commands themselves have their own tests)."""
    arguments = shlex.split(command)[1:]
    parsed = cli.build_parser().parse_args(arguments)
    assert parsed.command == arguments[0] and callable(parsed.handler)


def test_builtin_run_example_executes(tmp_path):
    assert cli.main(["run", "--size", "16", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "dx.npy").exists() and (tmp_path / "dgrid.npy").exists()
