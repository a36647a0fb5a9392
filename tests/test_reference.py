"""The NumPy golden checked three ways: against PyTorch float64, by finite differences, by adjointness."""

import numpy as np
import pytest
import torch
from helpers import MATRIX, matrix_id

from gridsampler3d import reference
from gridsampler3d.modes import Interpolation, Padding

SHAPES = {  # (N, C, Di, Hi, Wi), (Do, Ho, Wo)
    "small": ((2, 3, 4, 5, 6), (3, 2, 5)),
    "ones": ((1, 2, 1, 1, 1), (2, 3, 1)),
    "flat-d": ((1, 1, 1, 3, 4), (4, 4, 4)),
    "primes": ((3, 5, 7, 2, 3), (5, 3, 2)),
}


def _run_both(x, grid, grad, attributes):
    mode, padding, align_corners = attributes
    interpolation, pad = Interpolation[mode.upper()], Padding[padding.upper()]
    ours = (
        reference.grid_sampler3d_fwd(x, grid, interpolation, pad, align_corners),
        *reference.grid_sampler3d_bwd(grad, x, grid, interpolation, pad, align_corners),
    )
    tx, tgrid, tgrad = (torch.from_numpy(a) for a in (x, grid, grad))
    y = torch.ops.aten.grid_sampler_3d(tx, tgrid, int(interpolation), int(pad), align_corners)
    dx, dgrid = torch.ops.aten.grid_sampler_3d_backward(
        tgrad, tx, tgrid, int(interpolation), int(pad), align_corners, [True, True]
    )
    return ours, (y.numpy(), dx.numpy(), dgrid.numpy())


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("attributes", MATRIX, ids=matrix_id)
def test_reference_equals_pytorch_float64(attributes, shape):
    rng = np.random.default_rng(MATRIX.index(attributes))
    (batch, channels, *in_size), out_size = SHAPES[shape]
    x = rng.standard_normal((batch, channels, *in_size))
    grid = rng.uniform(-1.4, 1.4, (batch, *out_size, 3))
    grad = rng.standard_normal((batch, channels, *out_size))
    # Non-finite and huge coordinates, each of which must land out of range (or clip).
    grid.flat[::7] = np.nan
    grid.flat[3::11] = np.inf
    grid.flat[5::13] = -np.inf
    grid.flat[2::17] = 1e30
    grid.flat[4::19] = -3e9
    ours, theirs = _run_both(x, grid, grad, attributes)
    for name, a, b in zip(("y", "dx", "dgrid"), ours, theirs):
        # A near miss first, with numbers in the message; then the real claim below.
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=name)  # NaNs must coincide too
    # Every sum runs in PyTorch's order, so float64 results are bitwise equal.
    for name, a, b in zip(("y", "dx", "dgrid"), ours, theirs):
        assert np.array_equal(a, b, equal_nan=True), name


@pytest.mark.parametrize("attributes", MATRIX, ids=matrix_id)
def test_reference_with_nonfinite_values(attributes):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 2, 3, 4, 5))
    grid = rng.uniform(-1.1, 1.1, (1, 3, 3, 3, 3))
    grad = rng.standard_normal((1, 2, 3, 3, 3))
    x.flat[::9] = np.inf
    x.flat[4::13] = np.nan
    x.flat[6::17] = 1e30
    grad.flat[::8] = -np.inf
    grad.flat[3::10] = np.nan
    ours, theirs = _run_both(x, grid, grad, attributes)
    for name, a, b in zip(("y", "dx", "dgrid"), ours, theirs):
        assert np.array_equal(a, b, equal_nan=True), name  # PyTorch's order of sums: bitwise, NaNs placed alike


def _index_space_grid(rng, points, sizes, align_corners):
    """Grid values whose voxel index is k + u with u away from 0 and 0.5 (no kinks nearby)."""
    columns = []
    for size in sizes:  # (W, H, D) for x, y, z
        base = rng.integers(-2, size + 2, points)
        frac = rng.choice([0.2, 0.3, 0.7, 0.8], points) + rng.uniform(-0.05, 0.05, points)
        index = base + frac
        columns.append(2 * index / (size - 1) - 1 if align_corners else (2 * index + 1) / size - 1)
    return np.stack(columns, axis=-1)


@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True], ids=["noac", "ac"])
def test_reference_gradient_by_finite_differences(padding, align_corners):
    rng = np.random.default_rng(11)
    sizes = (4, 3, 5)  # D, H, W
    out_size = (2, 3, 2)
    x = rng.standard_normal((1, 2, *sizes))
    grad = rng.standard_normal((1, 2, *out_size))
    points = int(np.prod(out_size))
    grid = _index_space_grid(rng, points, sizes[::-1], align_corners).reshape(1, *out_size, 3)
    interpolation, pad = Interpolation.BILINEAR, Padding[padding.upper()]

    def loss(x_, grid_):
        return float(np.sum(grad * reference.grid_sampler3d_fwd(x_, grid_, interpolation, pad, align_corners)))

    dx, dgrid = reference.grid_sampler3d_bwd(grad, x, grid, interpolation, pad, align_corners)
    step = 1e-6
    numeric_dgrid = np.zeros_like(grid)
    for i in range(grid.size):
        bump = np.zeros_like(grid)
        bump.flat[i] = step
        numeric_dgrid.flat[i] = (loss(x, grid + bump) - loss(x, grid - bump)) / (2 * step)
    # Central differences with a 1e-6 step: truncation error O(step^2) plus cancellation of
    # about 1e-16 / step in the loss, so agreement to about 1e-7 is what they can give.
    np.testing.assert_allclose(dgrid, numeric_dgrid, rtol=1e-6, atol=1e-7)
    numeric_dx = np.zeros_like(x)
    for i in range(x.size):
        bump = np.zeros_like(x)
        bump.flat[i] = step
        numeric_dx.flat[i] = (loss(x + bump, grid) - loss(x - bump, grid)) / (2 * step)
    np.testing.assert_allclose(dx, numeric_dx, rtol=1e-6, atol=1e-7)  # as for dgrid above


@pytest.mark.parametrize("attributes", MATRIX, ids=matrix_id)
def test_reference_dx_is_adjoint_of_forward(attributes):
    mode, padding, align_corners = attributes
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 5, 4, 6))
    grid = rng.uniform(-1.3, 1.3, (2, 4, 3, 5, 3))
    grad = rng.standard_normal((2, 3, 4, 3, 5))
    interpolation, pad = Interpolation[mode.upper()], Padding[padding.upper()]
    y = reference.grid_sampler3d_fwd(x, grid, interpolation, pad, align_corners)
    dx, _ = reference.grid_sampler3d_bwd(grad, x, grid, interpolation, pad, align_corners, (True, False))
    # The two inner products add the same terms grouped differently: equal up to float64 rounding.
    assert np.vdot(y, grad) == pytest.approx(np.vdot(x, dx), rel=1e-12)


def test_reflection_of_a_single_voxel_is_degenerate():
    coords = np.array([-3.0, -1.0, 0.0, 0.4, 1.0, 7.5])
    index, multiplier = reference.source_index(coords, 1, Padding.REFLECTION, True)
    assert np.all(index == 0) and np.all(multiplier == 0)
