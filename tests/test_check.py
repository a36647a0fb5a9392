"""The `gridsampler3d check` command: the mode matrix against PyTorch, and that it can fail."""

import pytest
import torch

from gridsampler3d.backends import BACKENDS
from gridsampler3d.tools.cli import main
from gridsampler3d.tools.commands.check import run_check

BACKENDS_HERE = ["reference", "numba"]


@pytest.mark.slow
def test_quick_check_passes_on_cpu():
    lines = []
    rows = run_check(device="cpu", backends=BACKENDS_HERE, quick=True, echo=lines.append)
    # 3 modes x 3 paddings x 2 align_corners x 2 dtypes x 2 layouts per backend
    assert len(rows) == 2 * 72
    assert {row["backend"] for row in rows} == set(BACKENDS_HERE)
    assert {row["dtype"] for row in rows} == {"float32", "float64"}
    failed = [row for row in rows if not row["passed"]]
    assert not failed, failed[:3]
    assert all(set(row["worst_ratio"]) == {"y", "dx", "dgrid"} for row in rows)
    assert len(lines) == len(rows) + 3 and lines[-1].startswith("PASSED: 144/144")


def test_check_command_exit_code(capsys):
    assert main(["check", "--quick", "--backends", "reference"]) == 0
    assert "PASSED: 72/72" in capsys.readouterr().out


def test_broken_backend_fails(monkeypatch, capsys):
    reference = BACKENDS["reference"]
    forward = reference.forward

    def off_by_a_little(x, grid, *attributes):
        return forward(x, grid, *attributes) * 1.01

    monkeypatch.setattr(reference, "forward", off_by_a_little)
    assert main(["check", "--quick", "--backends", "reference"]) == 1
    printed = capsys.readouterr().out
    assert "FAILED" in printed and "y: FAIL" in printed
    rows = run_check(backends=["reference"], quick=True, echo=lambda line: None)
    assert not any(row["passed"] for row in rows if row["mode"] == "bilinear")
    assert all(failure.startswith("y: FAIL") for row in rows for failure in row["failures"])


def test_crashing_backend_fails_each_case(monkeypatch):
    def crash(*arguments):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(BACKENDS["reference"], "backward", crash)
    rows = run_check(backends=["reference"], quick=True, echo=lambda line: None)
    assert all(not row["passed"] and "kernel exploded" in row["error"] for row in rows)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--backends", "nonesuch"], "unknown backend 'nonesuch'"),
        (["--device", "cuda"] if not torch.cuda.is_available() else ["--device", "tpu"], "--device"),
    ],
)
def test_check_errors_are_one_line(capsys, arguments, message):
    assert main(["check", "--quick", *arguments]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and message in errors[0]
