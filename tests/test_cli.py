"""The `gridsampler3d run` command: default case, files, and one-line errors."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import make_case

import gridsampler3d as gs
from gridsampler3d import precision
from gridsampler3d.tools.cli import build_parser, main


def test_run_default_case_writes_outputs(tmp_path, capsys):
    assert main(["run", "--size", "12", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "built-in default case" in printed and "dx" in printed and "dgrid" in printed
    # the compile is reported apart from the backward's own time (a second call)
    assert "first call: " in printed and "backward: " in printed and "(a second call" in printed
    assert "compiled " in printed or "no kernel compiled" in printed
    dx, dgrid = np.load(tmp_path / "dx.npy"), np.load(tmp_path / "dgrid.npy")
    assert dx.shape == (1, 1, 12, 12, 12) and dgrid.shape == (1, 12, 12, 12, 3)
    assert np.isfinite(dx).all() and np.abs(dgrid).max() > 0


def test_run_on_files_matches_golden(tmp_path):
    grad, x, grid = (t.numpy() for t in make_case(dtype=torch.float64, data_format="NDHWC"))
    for name, array in (("grad", grad), ("x", x), ("grid", grid)):
        np.save(tmp_path / f"{name}.npy", array)
    code = main(
        [
            "run",
            "--grad",
            str(tmp_path / "grad.npy"),
            "--input",
            str(tmp_path / "x.npy"),
            "--grid",
            str(tmp_path / "grid.npy"),
            "--padding-mode",
            "2",
            "--align-corners",
            "--data-format",
            "NDHWC",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    golden = precision.golden_backward(grad, x, grid, "bilinear", "reflection", True, data_format="NDHWC")
    # float64 on the CPU engine is PyTorch's float64 bit for bit, and .npy files keep every bit.
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "dx.npy"), golden[0].numpy())
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "dgrid.npy"), golden[1].numpy())


RUN_ERRORS = [
    (["--grad", "missing.npy", "--input", "missing.npy", "--grid", "missing.npy"], "no such file"),
    (["--grad", "bad.npy", "--input", "bad.npy", "--grid", "bad.npy"], "not a readable .npy array"),
    (["--grad", "x.npy"], "go together; missing --input, --grid"),
    (["--grad", "x.npy", "--input", "x.npy", "--grid", "x.npy"], "grid's last dimension must be 3"),
    (["--padding-mode", "wrap", "--size", "4"], "padding_mode must be one of"),
]


def _assert_one_line_error(code: int, stderr: str, message: str) -> None:
    assert code == 2
    assert message in stderr and "Traceback" not in stderr
    errors = [line for line in stderr.strip().splitlines() if not line.startswith("computing")]
    assert len(errors) == 1


@pytest.mark.parametrize("arguments, message", RUN_ERRORS)
def test_run_errors_are_one_line(tmp_path, monkeypatch, capsys, arguments, message):
    """In this process (the console script's entry point, main): each error is one line on stderr and exit status
    2; the test below runs one through a process of its own."""
    (tmp_path / "bad.npy").write_text("not an array")
    np.save(tmp_path / "x.npy", np.zeros((1, 1, 2, 2, 2)))
    monkeypatch.chdir(tmp_path)
    code = main(["run", *arguments, "--out", "o"])
    _assert_one_line_error(code, capsys.readouterr().err, message)


def test_a_run_error_in_its_own_process_is_one_line(tmp_path):
    """`python -m gridsampler3d.tools.cli`: the exit status and stderr a shell sees."""
    arguments, message = RUN_ERRORS[3]
    np.save(tmp_path / "x.npy", np.zeros((1, 1, 2, 2, 2)))
    result = subprocess.run(
        [sys.executable, "-m", "gridsampler3d.tools.cli", "run", *arguments, "--out", "o"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    _assert_one_line_error(result.returncode, result.stderr, message)


def test_help_names_every_mode_and_points_to_a_real_command():
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    helps = {action.dest: action.help for action in run._actions}
    for mode in gs.Interpolation:
        assert f"{mode.name.lower()} ({int(mode)}" in helps["interpolation_mode"]
        assert f'"{mode.name.lower()}"/{int(mode)}' in gs.grid_sampler3d.__doc__
    assert "`gridsampler3d backends`" in helps["backend"]
    assert build_parser().parse_args(["backends"]).command == "backends"


# Every command's bad arguments: exit 2, nothing on stdout, one `error:` line on stderr naming the command.
BAD_ARGUMENTS = [
    ([], "gridsampler3d: error: the following arguments are required: command"),
    (["nosuch"], "gridsampler3d: error: argument command: invalid choice: 'nosuch'"),
    (["--frobnicate"], "gridsampler3d: error:"),
    (["run", "--size", "0"], "gridsampler3d run: error: argument --size: must be at least 4; got 0"),
    (["run", "--size", "big"], "gridsampler3d run: error: argument --size: must be an integer; got 'big'"),
    (["run", "--grad", "missing.npy"], "gridsampler3d run: error:"),
    (["run", "--interpolation-mode", "cubic"], "gridsampler3d run: error:"),
    (["run", "--out", "/dev/null/out"], "gridsampler3d run: error:"),
    (["demo", "--size", "0"], "gridsampler3d demo: error: argument --size: must be at least 8; got 0"),
    (["demo", "--steps", "0"], "gridsampler3d demo: error: argument --steps: must be at least 1; got 0"),
    (["demo", "--device", "tpu"], "gridsampler3d demo: error: --device must be cpu or cuda"),
    (["check", "--device", "tpu"], "gridsampler3d check: error: --device must be cpu or cuda"),
    (["check", "--backends", "nosuch"], "gridsampler3d check: error: unknown backend 'nosuch'"),
    (["bench", "--repeats", "0"], "gridsampler3d bench: error: argument --repeats: must be at least 1; got 0"),
    (["bench", "--scale", "0"], "gridsampler3d bench: error: argument --scale: must be a finite number above 0"),
    (["bench", "--cases", "nosuch"], "gridsampler3d bench: error:"),
    (["bench", "--threads", "0"], "gridsampler3d bench: error:"),
    (["cases", "--count", "0"], "gridsampler3d cases: error: argument --count: must be at least 1; got 0"),
    (["cases", "--dtypes", "half"], "gridsampler3d cases: error:"),
    (["compare", "--case", "/nonexistent", "--dx", "dx.npy"], "gridsampler3d compare: error: --case:"),
    (["warmup", "--dtypes", "half"], "gridsampler3d warmup: error: argument --dtypes: must be among"),
    (["warmup", "--modes", "cubic"], "gridsampler3d warmup: error: argument --modes: must be among"),
    (["warmup", "--where", "--clear"], "gridsampler3d warmup: error:"),
    (["backends", "--all"], "gridsampler3d backends: error: unrecognized arguments: --all"),
]


@pytest.mark.parametrize(
    "arguments, message", BAD_ARGUMENTS, ids=[" ".join(case[0]) or "none" for case in BAD_ARGUMENTS]
)
def test_every_commands_bad_arguments_exit_2_with_one_error_line(tmp_path, monkeypatch, capsys, arguments, message):
    monkeypatch.chdir(tmp_path)
    assert main(arguments) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1, err
    assert lines[0].startswith(message), lines[0]
    assert not any(tmp_path.iterdir())  # nothing written


def test_every_command_has_a_description_and_the_version_is_printed(capsys):
    from gridsampler3d import __version__

    commands = build_parser()._subparsers._group_actions[0].choices
    for name, parser in commands.items():
        assert parser.description and len(parser.description) > 20, name
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"gridsampler3d {__version__}"
