"""Every bad input (docs/semantics.md, "Errors") gets a clear error naming the tensor, expected and actual."""

import numpy as np
import pytest
import torch
from helpers import make_case

import gridsampler3d as gs


def _backward(**overrides):
    grad, x, grid = make_case(dtype=torch.float32)
    arguments = {"grad": grad, "input": x, "grid": grid}
    arguments.update(overrides)
    return gs.grid_sampler3d_backward(**arguments)


CASES = {
    "grad-4d": (dict(grad=torch.zeros(2, 3, 4, 5)), ValueError, r"grad must be 5-D .* got 4-D"),
    "input-6d": (dict(input=torch.zeros(2, 3, 5, 6, 7, 1)), ValueError, r"input must be 5-D .* got 6-D"),
    "grid-4d": (dict(grid=torch.zeros(2, 4, 5, 3)), ValueError, r"grid must be 5-D .* got 4-D"),
    "grid-last-2": (
        dict(grid=torch.zeros(2, 4, 5, 3, 2)),
        ValueError,
        r"grid's last dimension must be 3.*\(2, 4, 5, 3, 2\)",
    ),
    "grid-batch": (
        dict(grid=torch.zeros(3, 4, 5, 3, 3)),
        ValueError,
        r"grid's batch size N must equal input's \(2\); got 3",
    ),
    "grad-batch": (
        dict(grad=torch.zeros(1, 3, 4, 5, 3)),
        ValueError,
        r"grad's batch size N must equal input's \(2\); got 1",
    ),
    "grad-channels": (
        dict(grad=torch.zeros(2, 4, 4, 5, 3)),
        ValueError,
        r"grad's channel count C must equal input's \(3\); got 4",
    ),
    "grad-spatial": (
        dict(grad=torch.zeros(2, 3, 4, 5, 4)),
        ValueError,
        r"grad's spatial sizes .* grid's \(4, 5, 3\); got \(4, 5, 4\)",
    ),
    "input-zero-depth": (
        dict(input=torch.zeros(2, 3, 0, 6, 7)),
        ValueError,
        r"input's spatial sizes .* non-zero; got \(0, 6, 7\)",
    ),
    "input-zero-width": (dict(input=torch.zeros(2, 3, 5, 6, 0)), ValueError, r"non-zero; got \(5, 6, 0\)"),
    "mode-str": (
        dict(interpolation_mode="trilinear"),
        ValueError,
        r"interpolation_mode must be one of .*'bilinear'.*got 'trilinear'",
    ),
    "mode-int": (dict(interpolation_mode=5), ValueError, r"interpolation_mode must be one of .* got 5"),
    "mode-float": (dict(interpolation_mode=0.0), TypeError, r"interpolation_mode must be a str or an int .* got float"),
    "padding-str": (dict(padding_mode="wrap"), ValueError, r"padding_mode must be one of .*'zeros'.* got 'wrap'"),
    "padding-int": (dict(padding_mode=-1), ValueError, r"padding_mode must be one of .* got -1"),
    "mask-one": (dict(output_mask=(True,)), TypeError, r"output_mask must be a pair of bools .* got \(True,\)"),
    "mask-ints": (dict(output_mask=(1, 0)), TypeError, r"output_mask must be a pair of bools .* got \(1, 0\)"),
    "mask-scalar": (dict(output_mask=True), TypeError, r"output_mask must be a pair of bools .* got bool True"),
    "dtype-mixed": (
        dict(grid=make_case()[2]),
        TypeError,
        r"grid must have the same dtype as input \(torch.float32\); got torch.float64",
    ),
    "dtype-int": (
        dict(input=torch.zeros(2, 3, 5, 6, 7, dtype=torch.int32)),
        TypeError,
        r"input must have dtype float16, .* got torch.int32",
    ),
    "dtype-complex": (
        dict(grad=torch.zeros(2, 3, 4, 5, 3, dtype=torch.complex64)),
        TypeError,
        r"grad must have dtype .* got torch.complex64",
    ),
    "numpy-int": (
        dict(grid=np.zeros((2, 4, 5, 3, 3), dtype=np.int64)),
        TypeError,
        r"grid must have a floating dtype .* got int64",
    ),
    "not-a-tensor": (dict(input=[[1.0]]), TypeError, r"input must be a torch.Tensor or a numpy.ndarray; got list"),
    "data-format": (dict(data_format="NHWC"), ValueError, r"data_format must be 'NCDHW' or 'NDHWC'; got 'NHWC'"),
    "data-format-type": (dict(data_format=1), TypeError, r"data_format must be the str .* got int 1"),
    "align-corners": (dict(align_corners="yes"), TypeError, r"align_corners must be a bool; got str 'yes'"),
    "backend": (dict(backend="cuda-magic"), ValueError, r"backend must be one of .*'reference'.* got 'cuda-magic'"),
    "deterministic": (dict(deterministic=1), TypeError, r"deterministic must be None or a bool; got int 1"),
}


@pytest.mark.parametrize("name", CASES)
def test_backward_rejects_bad_input(name):
    overrides, error, message = CASES[name]
    with pytest.raises(error, match=message):
        _backward(**overrides)


def test_backward_rejects_mixed_devices():
    grad, x, grid = make_case(dtype=torch.float32)
    with pytest.raises(ValueError, match=r"grid must be on the same device as input \(cpu\); got meta"):
        gs.grid_sampler3d_backward(grad, x, grid.to("meta"))


def test_ndhwc_shapes_are_checked_in_their_layout():
    grad, x, grid = make_case(dtype=torch.float32, data_format="NDHWC")
    # An NCDHW grad handed over as NDHWC is read with C last: its spatial sizes are off.
    with pytest.raises(ValueError, match=r"grad's spatial sizes .* grid's \(4, 5, 3\); got \(3, 4, 5\)"):
        gs.grid_sampler3d_backward(grad.permute(0, 4, 1, 2, 3), x, grid, data_format="NDHWC")
    with pytest.raises(ValueError, match=r"grad's channel count C must equal input's \(3\); got 2"):
        gs.grid_sampler3d_backward(grad[..., :2], x, grid, data_format="NDHWC")


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (dict(input=torch.zeros(2, 3, 5, 6)), ValueError, r"input must be 5-D"),
        (dict(grid=torch.zeros(2, 4, 5, 3, 4)), ValueError, r"grid's last dimension must be 3"),
        (dict(padding_mode="mirror"), ValueError, r"padding_mode must be one of"),
        (dict(input=torch.zeros(2, 3, 5, 6, 7, dtype=torch.float16)), TypeError, r"same dtype"),
    ],
    ids=["input-4d", "grid-last-4", "padding", "dtype-mixed"],
)
def test_forward_rejects_bad_input(overrides, error, message):
    _, x, grid = make_case(dtype=torch.float32)
    arguments = {"input": x, "grid": grid}
    arguments.update(overrides)
    with pytest.raises(error, match=message):
        gs.grid_sampler3d(**arguments)
