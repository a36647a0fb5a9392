"""Every example in README.md runs: the Python blocks as written, the command lines through the CLI's parser."""
import shlex
from pathlib import Path

import pytest

from gridsampler3d import cli

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _blocks():
    """(language, text) of each fenced block, in order."""
    blocks, language, lines = [], None, []
    for line in README.splitlines():
        if line.startswith("```") and language is None:
            language, lines = line[3:].strip(), []
        elif line.startswith("```"):
            blocks.append((language, "\n".join(lines) + "\n"))
            language = None
        elif language is not None:
            lines.append(line)
    return blocks


PYTHON_BLOCKS = [text for language, text in _blocks() if language == "python" and "onnxruntime" not in text]
# The "Deploy with ONNX" example stands alone: it needs the onnx extra, which the test extra leaves out.
ONNX_BLOCKS = [text for language, text in _blocks() if language == "python" and "onnxruntime" in text]
PLAIN_BLOCKS = [text for language, text in _blocks() if language == ""]


def _command_lines():
    """The ``gridsampler3d ...`` lines of the README's plain blocks, continuation lines joined."""
    lines = []
    for block in PLAIN_BLOCKS:
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("#")[0].strip()
            if command.startswith("gridsampler3d "):
                lines.append(command)
    return lines


def test_readme_has_examples():
    assert len(PYTHON_BLOCKS) >= 2 and len(ONNX_BLOCKS) == 1 and len(_command_lines()) >= 4


def test_python_examples_run_in_order():
    namespace = {}
    for block in PYTHON_BLOCKS:
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - the README's own examples


def test_onnx_example_runs(tmp_path, monkeypatch):
    """The "Deploy with ONNX" example, on its own, in a scratch directory (it writes warp.onnx)."""
    for module in ("onnx", "onnxruntime", "onnxscript"):
        pytest.importorskip(module, reason=f"the ONNX example needs {module} (the 'onnx' extra)")
    monkeypatch.chdir(tmp_path)
    exec(compile(ONNX_BLOCKS[0], "README.md", "exec"), {})  # noqa: S102 - the README's own example
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
    for engine in ("cpu", "gpu"):
        for module in sorted((PACKAGE / engine).glob("*.py")):
            if module.name != "__init__.py":
                assert module.stem in entries[f"{engine}/"], f"README's layout omits {engine}/{module.name}"


@pytest.mark.parametrize("engine", ["cpu", "gpu"])
def test_engine_notes_name_every_module(engine):
    notes = (DOCS / f"{engine}.md").read_text()
    for module in sorted((PACKAGE / engine).glob("*.py")):
        if module.name != "__init__.py":
            assert f"`{module.name}`" in notes, f"docs/{engine}.md omits {module.name}"
