"""The public API on odd shapes, odd values and odd layouts, against the golden."""

import numpy as np
import pytest
import torch
from helpers import MATRIX, assert_backward_matches, assert_forward_matches, make_case, matrix_id, poisoned_allocations
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gridsampler3d as gs

# The engine splits even these small calls into parts on its threads, as it splits a large one.
pytestmark = pytest.mark.usefixtures("split_small_calls")

SHAPES = {  # N, C, (Di, Hi, Wi), (Do, Ho, Wo)
    "all-ones": (1, 1, (1, 1, 1), (1, 1, 1)),
    "unit-depth": (2, 2, (1, 5, 4), (3, 2, 3)),
    "unit-height": (1, 3, (3, 1, 4), (2, 3, 2)),
    "unit-width": (1, 2, (4, 3, 1), (2, 2, 5)),
    "primes": (3, 5, (7, 11, 13), (5, 3, 7)),
    "upsample": (1, 2, (3, 4, 5), (9, 8, 7)),
    "many-channels": (1, 257, (3, 4, 2), (2, 3, 2)),
    "batch-4": (4, 1, (2, 3, 2), (1, 2, 3)),
}


MANY_CHANNELS_THROUGH_TRITON = (("bilinear", "zeros", False), ("nearest", "zeros", False))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("attributes", MATRIX, ids=matrix_id)
def test_odd_shapes(attributes, shape, cpu_backend):
    batch, channels, in_size, out_size = SHAPES[shape]
    mode, padding, align_corners = attributes
    if cpu_backend == "triton" and shape == "many-channels" and attributes not in MANY_CHANNELS_THROUGH_TRITON:
        # 257 channels through the interpreter take seconds each: the channel loop does not depend on the padding
        # or align_corners, so trilinear and nearest with zeros padding cover it.
        pytest.skip("many channels through Triton's interpreter: trilinear and nearest with zeros cover the loop")
    # Through Triton's interpreter (seconds a call) float64 alone: the shapes' indexing is the same in every dtype,
    # and test_gpu.py holds the interpreter's float32 and half results to the golden on every mode.
    dtypes = (torch.float64,) if cpu_backend == "triton" else (torch.float32, torch.float64)
    for dtype in dtypes:
        grad, x, grid = make_case(batch, channels, in_size, out_size, dtype, low=-1.6, high=1.6)
        label = f"{shape} {matrix_id(attributes)} {dtype}"
        assert_backward_matches(grad, x, grid, mode, padding, align_corners, backend=cpu_backend, label=label)
        assert_forward_matches(x, grid, mode, padding, align_corners, backend=cpu_backend, label=label)


def _poison(tensor, every, value, offset=0):
    flat = tensor.reshape(-1)
    flat[offset::every] = value
    return tensor


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("attributes", MATRIX, ids=matrix_id)
def test_nonfinite_and_huge_values_follow_golden(attributes, dtype, cpu_backend):
    mode, padding, align_corners = attributes
    grad, x, grid = make_case(2, 3, (4, 5, 3), (3, 4, 5), torch.float64, low=-1.3, high=1.3)
    for value, offset in ((float("nan"), 0), (float("inf"), 3), (-float("inf"), 5), (1e30, 2), (-1e30, 1)):
        _poison(grid, 11, value, offset)
    _poison(x, 13, float("nan"))
    _poison(x, 17, float("inf"), 4)
    _poison(x, 19, 1e30, 6)
    _poison(grad, 14, float("nan"), 2)
    _poison(grad, 23, -float("inf"), 5)
    grad, x, grid = grad.to(dtype), x.to(dtype), grid.to(dtype)
    label = f"{matrix_id(attributes)} {dtype}"
    assert_backward_matches(grad, x, grid, mode, padding, align_corners, backend=cpu_backend, label=label)
    assert_forward_matches(x, grid, mode, padding, align_corners, backend=cpu_backend, label=label)


@pytest.mark.parametrize("data_format", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize(
    "sizes",
    [
        (0, 3, (4, 5, 6), (2, 3, 4)),
        (2, 3, (4, 5, 6), (0, 3, 4)),
        (2, 3, (4, 5, 6), (2, 0, 4)),
        (2, 0, (4, 5, 6), (2, 3, 4)),
    ],
    ids=["empty-batch", "empty-out-depth", "empty-out-height", "no-channels"],
)
def test_empty_inputs_give_zero_outputs(sizes, data_format, cpu_backend):
    batch, channels, in_size, out_size = sizes
    grad, x, grid = make_case(batch, channels, in_size, out_size, torch.float32, data_format)
    with poisoned_allocations():  # an output left as allocated holds NaN here, not zeros
        dx, dgrid = gs.grid_sampler3d_backward(grad, x, grid, data_format=data_format, backend=cpu_backend)
        y = gs.grid_sampler3d(x, grid, data_format=data_format, backend=cpu_backend)
    for name, output, like in (("dx", dx, x), ("dgrid", dgrid, grid)):
        assert output.shape == like.shape and output.dtype == like.dtype, name
        assert torch.equal(output, torch.zeros_like(like)), name  # every element 0, none NaN
    expected = (batch, channels, *out_size) if data_format == "NCDHW" else (batch, *out_size, channels)
    assert tuple(y.shape) == expected and y.dtype == x.dtype
    # An empty batch, output grid or channel axis leaves y itself without elements (an x with a
    # zero D, H or W is refused): equality with zeros of that shape is the whole check. The
    # zeros that can go wrong are dx's for an empty output grid, checked above.
    assert torch.equal(y, torch.zeros(expected))


@pytest.mark.parametrize("output_mask", [(False, True), (True, False), (False, False)], ids=str)
def test_output_mask(output_mask, cpu_backend):
    grad, x, grid = make_case(dtype=torch.float32)
    dx, dgrid = assert_backward_matches(
        grad, x, grid, "bilinear", "border", False, backend=cpu_backend, output_mask=output_mask
    )
    assert (dx is None) == (not output_mask[0]) and (dgrid is None) == (not output_mask[1])


@pytest.mark.parametrize("data_format", ["NCDHW", "NDHWC"])
def test_strided_and_sliced_inputs(data_format, cpu_backend):
    grad, x, grid = make_case(2, 4, (6, 7, 8), (5, 4, 6), torch.float64, data_format, low=-1.1, high=1.1)
    # Every other channel, a spatial slice, a transposed-then-back grid: none contiguous.
    if data_format == "NCDHW":
        x, grad = x[:, ::2, 1:, :, ::2], grad[:, ::2]
    else:
        x, grad = x[..., ::2][:, 1:, :, ::2], grad[..., ::2]
    grid = grid.transpose(1, 3).contiguous().transpose(1, 3)[:, :, ::1]
    assert not x.is_contiguous() and not grad.is_contiguous() and not grid.is_contiguous()
    assert_backward_matches(grad, x, grid, "bilinear", "reflection", True, data_format, cpu_backend)
    assert_forward_matches(x, grid, "bilinear", "reflection", True, data_format, cpu_backend)


def test_channels_last_tensor_is_accepted_as_ncdhw(cpu_backend):
    grad, x, grid = make_case(2, 5, (4, 6, 5), (3, 4, 2), torch.float32)
    x_cl = x.contiguous(memory_format=torch.channels_last_3d)
    dx, dgrid = assert_backward_matches(grad, x_cl, grid, backend=cpu_backend)
    assert dx.is_contiguous(memory_format=torch.channels_last_3d)
    expected_dx, expected_dgrid = gs.grid_sampler3d_backward(grad, x, grid, backend=cpu_backend)
    assert torch.equal(dx, expected_dx) and torch.equal(dgrid, expected_dgrid)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=str)
def test_numpy_in_numpy_out(dtype, cpu_backend):
    grad, x, grid = (t.numpy().astype(dtype) for t in make_case(dtype=torch.float64))
    dx, dgrid = gs.grid_sampler3d_backward(grad, x, grid, "nearest", "border", backend=cpu_backend)
    assert isinstance(dx, np.ndarray) and dx.dtype == dtype and dx.shape == x.shape
    assert isinstance(dgrid, np.ndarray) and dgrid.dtype == dtype and dgrid.shape == grid.shape
    assert_backward_matches(grad, x, grid, "nearest", "border", backend=cpu_backend)
    y = gs.grid_sampler3d(x[:, :, ::-1], grid, backend=cpu_backend)  # negative strides too
    assert isinstance(y, np.ndarray) and y.dtype == dtype


def test_integer_mode_codes_equal_strings(cpu_backend):
    grad, x, grid = make_case(dtype=torch.float64)
    by_name = gs.grid_sampler3d_backward(grad, x, grid, "nearest", "reflection", backend=cpu_backend)
    by_code = gs.grid_sampler3d_backward(grad, x, grid, 1, 2, backend=cpu_backend)
    assert all(torch.equal(a, b) for a, b in zip(by_name, by_code))


def test_results_are_bitwise_reproducible(cpu_backend):
    grad, x, grid = make_case(2, 8, (9, 8, 7), (6, 7, 8), torch.float32)
    first = gs.grid_sampler3d_backward(grad, x, grid, backend=cpu_backend)
    for _ in range(2):
        again = gs.grid_sampler3d_backward(grad, x, grid, backend=cpu_backend)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


def _values(moderate, specials):
    """Floats exact in float32: mostly ``moderate``, sometimes one of ``specials`` or any float at all."""
    return st.one_of(moderate, moderate, moderate, st.sampled_from(specials), st.floats(width=32))


# Coordinates that test the edges of the rules: non-finite, beyond the int32 range, exactly on a bound.
GRID_SPECIALS = [float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 2.0**31, -(2.0**31), 1.0, -1.0, 0.0]
GRID_VALUES = _values(st.floats(-1.625, 1.625, width=32), GRID_SPECIALS)
DATA_VALUES = _values(st.floats(-100, 100, width=32), [float("nan"), float("inf"), -float("inf"), 0.0])


@st.composite
def _cases(draw):
    """(grad, x, grid) in a drawn layout and dtype, every value drawn, so that a failure shrinks to its data."""
    batch, channels = draw(st.integers(1, 2)), draw(st.integers(1, 4))
    in_size = draw(st.tuples(st.integers(1, 5), st.integers(1, 5), st.integers(1, 5)))
    out_size = draw(st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)))
    data_format = draw(st.sampled_from(["NCDHW", "NDHWC"]))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    channels_last = data_format == "NDHWC"
    x_shape = (batch, *in_size, channels) if channels_last else (batch, channels, *in_size)
    grad_shape = (batch, *out_size, channels) if channels_last else (batch, channels, *out_size)
    x = draw(hnp.arrays(np.float64, x_shape, elements=DATA_VALUES))
    grad = draw(hnp.arrays(np.float64, grad_shape, elements=DATA_VALUES))
    grid = draw(hnp.arrays(np.float64, (batch, *out_size, 3), elements=GRID_VALUES))
    return tuple(torch.from_numpy(array).to(dtype) for array in (grad, x, grid)), data_format


# derandomize: CI must give the same verdict on every run; a case a random search finds is
# kept as a test of its own (helpers.cancelling_channels_last_case came from here).
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_cases(), attributes=st.sampled_from(MATRIX))
def test_property_random_shapes_attributes_and_values(case, attributes, cpu_backend):
    (grad, x, grid), data_format = case
    mode, padding, align_corners = attributes
    assert_backward_matches(grad, x, grid, mode, padding, align_corners, data_format, cpu_backend)
    assert_forward_matches(x, grid, mode, padding, align_corners, data_format, cpu_backend)
