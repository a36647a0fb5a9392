"""Rounding float64 into half precision once (docs/semantics.md, "Dtypes")."""

import pytest
import torch

import gridsampler3d as gs
from gridsampler3d.rounding import round_once


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_a_value_just_above_a_tie_rounds_up(dtype):
    """torch's float64 -> half conversion goes through float32 and lands on the tie; rounding once does not."""
    ulp = 2.0**-10 if dtype == torch.float16 else 2.0**-7
    above_tie = torch.tensor([1.0 + ulp / 2 + 2.0**-40], dtype=torch.float64)
    assert float(above_tie.to(dtype)) == 1.0  # the double rounding this module exists to avoid
    assert float(round_once(above_tie, dtype)) == 1.0 + ulp


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_matches_correct_rounding_everywhere(dtype):
    """Against exact rounding to the nearest neighbouring half value (finite range), and special values."""
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(20000, generator=generator, dtype=torch.float64) * torch.logspace(
        -8, 4, 20000, dtype=torch.float64
    )
    halves = values.to(torch.float32).to(dtype).to(torch.float64)  # near the answer; exact neighbours below
    special = torch.tensor(
        [0.0, -0.0, float("inf"), -float("inf"), 1e300, -1e300, 1e-300, 65504.0, 65520.0], dtype=torch.float64
    )
    rounded = round_once(values, dtype).to(torch.float64)
    for value, got, near in zip(values.tolist(), rounded.tolist(), halves.tolist()):
        below = torch.nextafter(torch.tensor(near, dtype=dtype), torch.tensor(-float("inf"), dtype=dtype))
        above = torch.nextafter(torch.tensor(near, dtype=dtype), torch.tensor(float("inf"), dtype=dtype))
        candidates = [float(below), near, float(above)]
        best = min(abs(candidate - value) for candidate in candidates)
        assert abs(got - value) == best, (value, got, candidates)
    torch.testing.assert_close(round_once(special, dtype), special.to(dtype), rtol=0, atol=0, equal_nan=True)
    assert torch.isnan(round_once(torch.tensor([float("nan")], dtype=torch.float64), dtype)).all()


def test_other_conversions_are_plain():
    values = torch.randn(5, dtype=torch.float64)
    assert torch.equal(round_once(values, torch.float32), values.to(torch.float32))
    assert round_once(values, torch.float64) is values or torch.equal(round_once(values, torch.float64), values)


@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_a_dx_just_above_a_float16_tie_rounds_up(backend):
    """Three points on one voxel add 1 + 2^-11 + 2^-24 into its dx: a hair above the float16 tie between 1 and
    1 + 2^-10, which it rounds up to. Through float32 the sum would land on the tie (float32 holds no 2^-24 there)
    and round to even, 1."""
    x = torch.zeros(1, 1, 1, 1, 2, dtype=torch.float16)
    grid = torch.zeros(1, 1, 1, 3, 3, dtype=torch.float16)
    grid[..., 0] = -1.0  # with align_corners, voxel 0 along W; the single voxel along D and H
    grad = torch.tensor([1.0, 2.0**-11, 2.0**-24], dtype=torch.float16).view(1, 1, 1, 1, 3)
    dx, _ = gs.grid_sampler3d_backward(grad, x, grid, "nearest", "zeros", True, backend=backend)
    assert dx.flatten().tolist() == [1.0 + 2.0**-10, 0.0]
