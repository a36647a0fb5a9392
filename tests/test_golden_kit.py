"""The golden kit: `gridsampler3d cases` writes case folders, `gridsampler3d compare` judges outputs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import gridsampler3d as gs
from gridsampler3d import precision, reference
from gridsampler3d.dtypes import DTYPES
from gridsampler3d.modes import Interpolation, Padding
from gridsampler3d.tools import golden_kit
from gridsampler3d.tools.cli import build_parser, main
from gridsampler3d.tools.golden_kit import CASE_SET, read_array, read_case, write_array

REPOSITORY = Path(__file__).resolve().parents[1]
FOLDERS = [golden_kit.folder_name(index, spec, dtype) for index, (spec, dtype) in enumerate(golden_kit.case_set())]
CASE_KEYS = {"dtype", "data_format", "interpolation_mode", "padding_mode", "align_corners", "files", "shapes"}
# Cases the failure tests use: trilinear, so that both outputs have non-zero golden values.
FLOAT16_CASE, BFLOAT16_CASE = FOLDERS[0], FOLDERS[9]


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """The default case set, written once: its folder."""
    out = tmp_path_factory.mktemp("cases")
    assert main(["cases", "--out", str(out)]) == 0
    return out


def _our_outputs(folder: Path, out: Path, transform=None) -> tuple[Path, Path]:
    """This library's dx and dgrid for a case folder, written as the case's inputs are (.bin for bfloat16).

    ``transform`` (name, tensor) -> tensor changes an output before it is written.
    """
    case = read_case(folder)
    outputs = dict(
        zip(("dx", "dgrid"), gs.grid_sampler3d_backward(case.grad, case.input, case.grid, **case.attributes()))
    )
    suffix = ".bin" if case.dtype == torch.bfloat16 else ".npy"
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, tensor in outputs.items():
        paths.append(out / f"{name}{suffix}")
        write_array(paths[-1], tensor if transform is None else transform(name, tensor))
    return tuple(paths)


def _compare(capsys, *arguments) -> tuple[int, str, str]:
    code = main(["compare", *map(str, arguments)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gridsampler3d compare: error: "), err
    return lines[0]


def test_case_set_covers_every_attribute_and_dtype():
    entries = golden_kit.case_set()
    assert len(entries) == len(CASE_SET) == len(set(FOLDERS))
    covered = {
        field: {getattr(spec, field) for spec, _ in entries}
        for field in ("interpolation_mode", "padding_mode", "align_corners", "data_format", "grid_kind")
    }
    assert covered == {
        "interpolation_mode": {"bilinear", "nearest", "bicubic"},
        "padding_mode": {"zeros", "border", "reflection"},
        "align_corners": {False, True},
        "data_format": {"NCDHW", "NDHWC"},
        "grid_kind": {"uniform", "far", "nonfinite"},
    }
    assert {dtype for _, dtype in entries} == set(DTYPES)
    assert any(spec.batch == 2 for spec, _ in entries)
    assert any(1 in spec.input_size + spec.output_size for spec, _ in entries)
    for count in range(4, len(CASE_SET) + 1):
        assert {dtype for _, dtype in golden_kit.case_set(count)} == set(DTYPES), count
    assert {dtype for _, dtype in golden_kit.case_set(2, ["float32", "bfloat16"])} == {"float32", "bfloat16"}


def test_case_folders_hold_what_case_json_says(cases):
    assert sorted(path.name for path in cases.iterdir()) == FOLDERS
    for folder, (spec, dtype) in zip(FOLDERS, golden_kit.case_set()):
        description = json.loads((cases / folder / "case.json").read_text())
        assert set(description) == CASE_KEYS, folder
        assert (
            description["dtype"],
            description["data_format"],
            description["interpolation_mode"],
            description["padding_mode"],
            description["align_corners"],
        ) == (dtype, spec.data_format, spec.interpolation_mode, spec.padding_mode, spec.align_corners)
        suffix = ".bin" if dtype == "bfloat16" else ".npy"
        assert description["files"] == {
            "grad": "grad" + suffix,
            "input": "input" + suffix,
            "grid": "grid" + suffix,
            "dx_golden": "dx_golden.npy",
            "dgrid_golden": "dgrid_golden.npy",
        }
        shapes = description["shapes"]
        assert set(shapes) == {"grad", "input", "grid", "dx", "dgrid"}
        assert shapes["dx"] == shapes["input"] and shapes["dgrid"] == shapes["grid"]
        channels_last = spec.data_format == "NDHWC"
        assert shapes["input"][4 if channels_last else 1] == spec.channels
        case = read_case(cases / folder)
        assert case.dtype == DTYPES[dtype]
        for name in ("grad", "input", "grid"):
            assert list(getattr(case, name).shape) == shapes[name]
            if suffix == ".npy":
                assert np.load(cases / folder / description["files"][name]).dtype == np.dtype(dtype)
        for name in ("dx", "dgrid"):
            golden = np.load(cases / folder / description["files"][f"{name}_golden"])
            assert golden.dtype == np.float64 and list(golden.shape) == shapes[name]


def test_count_takes_the_first_cases_and_seed_sets_the_values(cases, tmp_path):
    assert main(["cases", "--out", str(tmp_path / "five"), "--count", "5"]) == 0
    assert main(["cases", "--out", str(tmp_path / "seeded"), "--count", "1", "--seed", "7"]) == 0
    assert sorted(path.name for path in (tmp_path / "five").iterdir()) == FOLDERS[:5]
    for folder in FOLDERS[:5]:
        for path in (cases / folder).iterdir():
            assert (tmp_path / "five" / folder / path.name).read_bytes() == path.read_bytes(), (folder, path.name)
    reseeded = (tmp_path / "seeded" / FOLDERS[0] / "input.npy").read_bytes()
    assert reseeded != (cases / FOLDERS[0] / "input.npy").read_bytes()


def test_the_grid_kinds_are_what_they_say(cases):
    for folder, (spec, dtype) in zip(FOLDERS, golden_kit.case_set()):
        grid = read_case(cases / folder).grid.double()
        finite = torch.isfinite(grid)
        if spec.grid_kind == "nonfinite":
            assert grid.isnan().any() and grid.isposinf().any() and grid.isneginf().any(), folder
        else:
            assert finite.all(), folder
        largest = float(grid[finite].abs().max())
        if spec.grid_kind == "far":
            assert largest > (1e4 if dtype == "float16" else 1e9), folder
        else:
            assert largest <= golden_kit.GRID_BOUND + 0.01, folder


def _pytorch_float64_backward(case):
    """PyTorch's float64 CPU backward (this library's float64 reference for bicubic), called directly."""
    channels_last = case.data_format == "NDHWC"
    grad, x = (
        tensor.double().permute(0, 4, 1, 2, 3) if channels_last else tensor.double()
        for tensor in (case.grad, case.input)
    )
    grid = case.grid.double()
    padding = int(Padding[case.padding_mode.upper()])
    if case.interpolation_mode == "bicubic":
        dx, dgrid = (
            torch.from_numpy(array)
            for array in reference.grid_sampler3d_bwd(
                grad.numpy(), x.numpy(), grid.numpy(), Interpolation.BICUBIC, Padding(padding), case.align_corners
            )
        )
    else:
        interpolation = int(Interpolation[case.interpolation_mode.upper()])
        dx, dgrid = torch.ops.aten.grid_sampler_3d_backward(
            grad, x, grid, interpolation, padding, case.align_corners, [True, True]
        )
    return (dx.permute(0, 2, 3, 4, 1) if channels_last else dx), dgrid


def test_golden_files_equal_pytorch_float64_backward(cases):
    for folder in FOLDERS:
        case = read_case(cases / folder)
        dx, dgrid = _pytorch_float64_backward(case)
        np.testing.assert_array_equal(np.load(cases / folder / "dx_golden.npy"), dx.numpy(), err_msg=folder)
        np.testing.assert_array_equal(np.load(cases / folder / "dgrid_golden.npy"), dgrid.numpy(), err_msg=folder)
        if case.interpolation_mode == "nearest":
            assert not np.load(cases / folder / "dgrid_golden.npy").any(), folder


def test_bfloat16_round_trips_through_bin(cases, tmp_path):
    values = torch.tensor(
        [1.0, -2.5, 3.0e38, 1.0e-40, float("inf"), float("-inf"), float("nan"), 0.0078125], dtype=torch.bfloat16
    ).reshape(2, 4)
    write_array(tmp_path / "values.bin", values)
    raw = (tmp_path / "values.bin").read_bytes()
    assert len(raw) == 2 * values.numel()
    assert raw[:2] == (0x3F80).to_bytes(2, "little")  # 1.0, little-endian
    back = read_array(tmp_path / "values.bin", label="test", dtype=torch.bfloat16, shape=(2, 4))
    assert back.dtype == torch.bfloat16 and torch.equal(back.view(torch.int16), values.view(torch.int16))
    index = FOLDERS.index(BFLOAT16_CASE)
    spec, _ = golden_kit.case_set()[index]
    written = golden_kit.case_operands(spec, torch.bfloat16, seed=0, index=index)
    case = read_case(cases / BFLOAT16_CASE)
    for name, tensor in zip(("grad", "input", "grid"), written):
        assert torch.equal(getattr(case, name).view(torch.int16), tensor.view(torch.int16)), name


@pytest.mark.parametrize("folder", FOLDERS)
def test_this_librarys_outputs_pass(cases, tmp_path, capsys, folder):
    dx, dgrid = _our_outputs(cases / folder, tmp_path)
    code, out, err = _compare(
        capsys, "--case", cases / folder, "--dx", dx, "--dgrid", dgrid, "--json", tmp_path / "verdict.json"
    )
    assert code == 0, out + err
    assert out.strip().endswith("verdict: PASS") and "FAIL" not in out
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["verdict"] == "pass" and set(verdict["outputs"]) == {"dx", "dgrid"}
    floor = precision.FLOORS[read_case(cases / folder).dtype]
    for output in verdict["outputs"].values():
        assert output["pass"] is True and output["nonfinite_mismatches"] == 0
        for metric, ratio in zip(("mare", "mere", "rmse"), precision.RATIOS):
            assert output["limits"][metric] == ratio * max(output["competitor"][metric], floor)
            assert output[metric] <= output["limits"][metric]


@pytest.mark.parametrize("folder", [FLOAT16_CASE, BFLOAT16_CASE])
def test_outputs_scaled_by_five_percent_fail(cases, tmp_path, capsys, folder):
    dx, dgrid = _our_outputs(cases / folder, tmp_path, lambda name, tensor: (tensor.double() * 1.05).to(tensor.dtype))
    code, out, _ = _compare(
        capsys, "--case", cases / folder, "--dx", dx, "--dgrid", dgrid, "--json", tmp_path / "verdict.json"
    )
    assert code == 1, out
    assert "verdict: FAIL (dx MARE, dx MERE, dx RMSE, dgrid MARE, dgrid MERE, dgrid RMSE)" in out
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["verdict"] == "fail"
    assert [output["pass"] for output in verdict["outputs"].values()] == [False, False]


def test_a_nan_where_the_golden_is_finite_fails(cases, tmp_path, capsys):
    def poison(name, tensor):
        if name == "dx":
            tensor = tensor.clone()
            tensor.view(-1)[0] = float("nan")
        return tensor

    assert np.isfinite(np.load(cases / FLOAT16_CASE / "dx_golden.npy").reshape(-1)[0])
    dx, dgrid = _our_outputs(cases / FLOAT16_CASE, tmp_path, poison)
    code, out, _ = _compare(
        capsys, "--case", cases / FLOAT16_CASE, "--dx", dx, "--dgrid", dgrid, "--json", tmp_path / "verdict.json"
    )
    assert code == 1, out
    assert out.strip().endswith("verdict: FAIL (dx non-finite)")
    row = next(line for line in out.splitlines() if line.startswith("dx") and "non-finite" in line)
    assert row.split()[2:4] == ["1", "misplaced"] and row.endswith("FAIL")
    outputs = json.loads((tmp_path / "verdict.json").read_text())["outputs"]
    assert outputs["dx"]["nonfinite_mismatches"] == 1 and not outputs["dx"]["pass"] and outputs["dgrid"]["pass"]


def test_swapped_outputs_are_unusable(cases, tmp_path, capsys):
    dx, dgrid = _our_outputs(cases / FLOAT16_CASE, tmp_path)
    code, out, err = _compare(capsys, "--case", cases / FLOAT16_CASE, "--dx", dgrid, "--dgrid", dx)
    assert code == 2 and out == ""
    shape = tuple(json.loads((cases / FLOAT16_CASE / "case.json").read_text())["shapes"]["dx"])
    assert f"--dx: {dgrid} has shape (1, 4, 5, 3, 3); expected {shape}" in _one_line_error(err)


def test_a_truncated_bin_is_unusable(cases, tmp_path, capsys):
    dx, dgrid = _our_outputs(cases / BFLOAT16_CASE, tmp_path)
    size = dgrid.stat().st_size
    dgrid.write_bytes(dgrid.read_bytes()[:-2])
    code, _, err = _compare(capsys, "--case", cases / BFLOAT16_CASE, "--dx", dx, "--dgrid", dgrid)
    assert code == 2
    shape = tuple(json.loads((cases / BFLOAT16_CASE / "case.json").read_text())["shapes"]["dgrid"])
    assert (
        f"--dgrid: {dgrid} has {size - 2} bytes; expected {size} (shape {shape} of bfloat16, 2 bytes each, "
        "little-endian)"
    ) in _one_line_error(err)


class _Tripwire:
    """Unpickling this makes a folder: proof that a pickled .npy was (or was not) unpickled."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_unusable_inputs_exit_2_with_one_line(cases, tmp_path, capsys):
    dx, dgrid = _our_outputs(cases / FLOAT16_CASE, tmp_path)
    np.save(tmp_path / "pickled.npy", np.array([_Tripwire(tmp_path / "unpickled")], dtype=object), allow_pickle=True)
    shape = read_case(cases / BFLOAT16_CASE).input.shape
    np.save(tmp_path / "dx16.npy", np.zeros(shape, np.float16))
    (tmp_path / "dx.txt").write_text("0")
    case = ["--case", cases / FLOAT16_CASE]
    expectations = [
        ((*case, "--dx", tmp_path / "missing.npy"), f"--dx: no such file: {tmp_path / 'missing.npy'}"),
        (
            (*case, "--dx", tmp_path / "pickled.npy"),
            f"--dx: {tmp_path / 'pickled.npy'} holds pickled Python objects, "
            "which are never unpickled; expected a float16, float32 or float64 array",
        ),
        (
            ("--case", cases / BFLOAT16_CASE, "--dx", tmp_path / "dx16.npy"),
            f"--dx: {tmp_path / 'dx16.npy'} holds float16; expected bfloat16 or a wider float; .npy cannot hold "
            "bfloat16: write float32, or raw little-endian .bin",
        ),
        ((*case, "--dx", tmp_path / "dx.txt"), "must be a .npy file or a raw little-endian .bin file"),
        ((*case,), "nothing to judge: give --dx, --dgrid or both"),
        (
            (*case, "--dx", dx, "--padding-mode", "border"),
            "--case gives the inputs, the attributes and the dtype; drop --padding-mode",
        ),
        (("--case", tmp_path, "--dx", dx), f"--case: no case.json in {tmp_path}"),
        (("--grad", dx, "--dx", dx), "give --case, or --grad, --input and --grid; missing --input, --grid"),
    ]
    for arguments, message in expectations:
        code, out, err = _compare(capsys, *arguments)
        assert code == 2 and out == "", arguments
        assert message in _one_line_error(err), (arguments, err)
    assert not (tmp_path / "unpickled").exists()


def test_a_wider_npy_output_is_rounded_to_the_case_and_judged_as_it(cases, tmp_path, capsys):
    """bfloat16's .bin and the same values widened to a float32 .npy get the same verdict and metrics; the
    rounding is said."""
    dx, dgrid = _our_outputs(cases / BFLOAT16_CASE, tmp_path)
    case = read_case(cases / BFLOAT16_CASE)
    np.save(tmp_path / "dx.npy", read_array(dx, label="test", dtype=torch.bfloat16, shape=case.input.shape).float())
    code_bin, out_bin, _ = _compare(capsys, "--case", cases / BFLOAT16_CASE, "--dx", dx, "--json", tmp_path / "b.json")
    code_npy, out_npy, _ = _compare(
        capsys, "--case", cases / BFLOAT16_CASE, "--dx", tmp_path / "dx.npy", "--json", tmp_path / "n.json"
    )
    assert code_bin == code_npy == 0
    assert (tmp_path / "b.json").read_text() == (tmp_path / "n.json").read_text()
    assert (
        out_npy.splitlines()[0]
        == f"--dx: {tmp_path / 'dx.npy'} holds float32, rounded to bfloat16 (the case's dtype) to be judged"
    )
    assert out_npy.split("\n", 1)[1] == out_bin


@pytest.mark.parametrize("folder", FOLDERS[::3])
def test_a_cases_own_float64_golden_passes_in_any_dtype(cases, folder, capsys):
    """The golden files (float64) judged for the case they belong to, whatever its dtype: they pass."""
    flags = ["--dx", cases / folder / "dx_golden.npy", "--dgrid", cases / folder / "dgrid_golden.npy"]
    code, out, _ = _compare(capsys, "--case", cases / folder, *flags)
    assert code == 0 and out.rstrip().endswith("verdict: PASS"), out


def _as_npy_case(cases, folder, tmp_path) -> list[str]:
    """The flags that give a case folder's inputs and attributes without --case (inputs as float32 .npy
    when the case is bfloat16)."""
    case = read_case(cases / folder)
    for name in ("grad", "input", "grid"):
        tensor = getattr(case, name)
        np.save(tmp_path / f"{name}.npy", (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy())
    flags = [
        "--grad",
        tmp_path / "grad.npy",
        "--input",
        tmp_path / "input.npy",
        "--grid",
        tmp_path / "grid.npy",
        "--interpolation-mode",
        case.interpolation_mode,
        "--padding-mode",
        case.padding_mode,
        "--data-format",
        case.data_format,
    ]
    return flags + (["--align-corners"] if case.align_corners else [])


@pytest.mark.parametrize("folder", [FOLDERS[3], BFLOAT16_CASE])
def test_flags_in_place_of_a_case_give_the_same_verdict(cases, tmp_path, capsys, folder):
    dx, dgrid = _our_outputs(cases / folder, tmp_path / "out")
    flags = _as_npy_case(cases, folder, tmp_path)
    if folder == BFLOAT16_CASE:
        # Without --dtype the case is float32, the dtype of --input, and dx.bin is half as long as that needs.
        code, _, err = _compare(capsys, *flags, "--dx", dx)
        assert code == 2 and "of float32, 4 bytes each" in err
        flags += ["--dtype", "bfloat16"]
    assert (
        _compare(capsys, "--case", cases / folder, "--dx", dx, "--dgrid", dgrid, "--json", tmp_path / "case.json")[0]
        == 0
    )
    assert _compare(capsys, *flags, "--dx", dx, "--dgrid", dgrid, "--json", tmp_path / "flags.json")[0] == 0
    assert (tmp_path / "flags.json").read_text() == (tmp_path / "case.json").read_text()


def test_flags_refuse_what_they_cannot_describe(cases, tmp_path, capsys):
    dx, _ = _our_outputs(cases / BFLOAT16_CASE, tmp_path / "out")
    flags = _as_npy_case(cases, BFLOAT16_CASE, tmp_path)
    np.save(tmp_path / "grid.npy", np.load(tmp_path / "grid.npy") + np.float32(2.0**-12))
    expectations = [
        (
            (*flags, "--dtype", "bfloat16", "--dx", dx),
            f"--grid: {tmp_path / 'grid.npy'} holds float32 values that bfloat16 cannot hold exactly",
        ),
        ((*flags, "--dtype", "half", "--dx", dx), "--dtype must be one of float16, bfloat16, float32, float64"),
        ((*flags, "--interpolation-mode", "cubic", "--dx", dx), "interpolation_mode must be one of"),
        ((*flags[:2], "--input", dx, *flags[4:], "--dx", dx), "raw .bin, whose dtype and shape only a case folder"),
    ]
    for arguments, message in expectations:
        code, out, err = _compare(capsys, *arguments)
        assert code == 2 and out == "", arguments
        assert message in _one_line_error(err), (arguments, err)


def test_one_output_alone_is_judged(cases, tmp_path, capsys):
    _, dgrid = _our_outputs(cases / FLOAT16_CASE, tmp_path)
    code, out, _ = _compare(capsys, "--case", cases / FLOAT16_CASE, "--dgrid", dgrid, "--json", tmp_path / "v.json")
    assert code == 0 and not any(line.startswith("dx ") for line in out.splitlines())
    assert set(json.loads((tmp_path / "v.json").read_text())["outputs"]) == {"dgrid"}


def test_cases_refuses_bad_arguments(tmp_path, capsys):
    for arguments, message in [
        (["--count", "0"], "argument --count: must be at least 1; got 0"),
        (["--count", str(len(CASE_SET) + 1)], f"count must be between 1 and {len(CASE_SET)}; got {len(CASE_SET) + 1}"),
        (["--dtypes", "float32,half"], "dtypes must be among float16, bfloat16, float32, float64; got half"),
        (["--seed", "-1"], "seed must be a non-negative integer; got -1"),
    ]:
        assert main(["cases", "--out", str(tmp_path), *arguments]) == 2
        assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_python_m_gridsampler3d_reports_one_line_and_no_traceback(tmp_path):
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    result = subprocess.run(
        [sys.executable, "-m", "gridsampler3d", "compare", "--case", str(tmp_path), "--dx", "dx.npy"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"gridsampler3d compare: error: --case: no case.json in {tmp_path}"


def test_help_says_what_the_commands_take():
    commands = build_parser()._subparsers._group_actions[0].choices
    helps = {name: {action.dest: action.help for action in commands[name]._actions} for name in ("cases", "compare")}
    assert f"default: all {len(CASE_SET)}" in helps["cases"]["count"]
    assert ".bin" in helps["compare"]["dx"] and ".bin" in helps["compare"]["dgrid"]
    assert "Exit 0: every output given passes; 1: one fails; 2: unusable input." in commands["compare"].description
