"""The `gridsampler3d demo` command: a small registration that must improve the overlap."""

import json

import pytest

from gridsampler3d.tools.cli import main
from gridsampler3d.tools.commands.demo import run_demo

pytest.importorskip("matplotlib")


def test_run_demo_improves_overlap_and_writes_files(tmp_path):
    lines = []
    summary = run_demo(size=24, steps=40, out=tmp_path, echo=lines.append, progress=False)
    assert summary["dice_after"] > summary["dice_before"] + 0.05
    assert summary["similarity_after"] > summary["similarity_before"]
    assert summary["mse_after"] < 0.2 * summary["mse_before"]
    assert len(summary["losses"]) == 40 and summary["losses"][-1] < summary["losses"][0]
    for name in ("slices.png", "loss.png", "summary.json"):
        path = tmp_path / name
        assert path.is_file() and path.stat().st_size > 0, name
    assert (tmp_path / "slices.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["dice_after"] == summary["dice_after"]
    assert any("mean Dice" in line for line in lines)


def test_demo_command(tmp_path, capsys):
    assert main(["demo", "--size", "16", "--steps", "5", "--seed", "1", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "mean Dice" in captured.out and "NCC" in captured.out
    assert "5/5" in captured.err  # the progress bar
    assert (tmp_path / "slices.png").stat().st_size > 0


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--size", "4"], "argument --size: must be at least 8; got 4"),
        (["--steps", "0"], "argument --steps: must be at least 1; got 0"),
        (["--device", "tpu"], "--device must be cpu or cuda"),
    ],
)
def test_demo_errors_are_one_line(tmp_path, capsys, arguments, message):
    assert main(["demo", *arguments, "--out", str(tmp_path)]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and message in errors[0]
