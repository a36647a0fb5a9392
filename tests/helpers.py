"""Shared test helpers: case builders and the one comparison against the golden."""
from __future__ import annotations

import contextlib
import itertools

import torch

import gridsampler3d as gs
from gridsampler3d import precision

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPE_IDS = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64"}
MODES = ("bilinear", "nearest")
PADDINGS = ("zeros", "border", "reflection")
MATRIX = list(itertools.product(MODES, PADDINGS, (False, True)))


def matrix_id(case) -> str:
    mode, padding, align_corners = case
    return f"{mode}-{padding}-{'ac' if align_corners else 'noac'}"


def make_case(batch=2, channels=3, in_size=(5, 6, 7), out_size=(4, 5, 3), dtype=torch.float64,
              data_format="NCDHW", seed=0, low=-1.2, high=1.2):
    """Random (grad, input, grid) in ``data_format``; the grid is uniform in [low, high]."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn((batch, channels) + tuple(in_size), generator=generator, dtype=torch.float64)
    grad = torch.randn((batch, channels) + tuple(out_size), generator=generator, dtype=torch.float64)
    grid = low + (high - low) * torch.rand((batch,) + tuple(out_size) + (3,), generator=generator,
                                           dtype=torch.float64)
    if data_format == "NDHWC":
        x, grad = x.permute(0, 2, 3, 4, 1).contiguous(), grad.permute(0, 2, 3, 4, 1).contiguous()
    return grad.to(dtype), x.to(dtype), grid.to(dtype)


def assert_backward_matches(grad, x, grid, mode="bilinear", padding="zeros", align_corners=False,
                            data_format="NCDHW", backend="auto", output_mask=(True, True), label="", **extra):
    """Run the library's backward and assert the SPEC section 5 rule on each output asked for."""
    dtype = torch.as_tensor(x).dtype
    dx, dgrid = gs.grid_sampler3d_backward(grad, x, grid, mode, padding, align_corners, output_mask=output_mask,
                                           data_format=data_format, backend=backend, **extra)
    golden = precision.golden_backward(grad, x, grid, mode, padding, align_corners, output_mask, data_format)
    competitor = precision.competitor_backward(grad, x, grid, mode, padding, align_corners, output_mask,
                                               data_format)
    for name, ours, gold, theirs, like in zip(("dx", "dgrid"), (dx, dgrid), golden, competitor, (x, grid)):
        if gold is None:
            assert ours is None, f"{label} {name}: not asked for, but computed"
            continue
        assert ours is not None, f"{label} {name}: asked for, but None"
        assert tuple(ours.shape) == tuple(like.shape), f"{label} {name}: shape {tuple(ours.shape)}"
        assert ours.dtype == like.dtype, f"{label} {name}: dtype {ours.dtype}"
        report = precision.compare(f"{label} {name}", ours, gold, theirs, dtype)
        assert report.passed, str(report)
    return dx, dgrid


def assert_forward_matches(x, grid, mode="bilinear", padding="zeros", align_corners=False, data_format="NCDHW",
                           backend="auto", label=""):
    """Run the library's forward and assert the SPEC section 5 rule."""
    dtype = torch.as_tensor(x).dtype
    y = gs.grid_sampler3d(x, grid, mode, padding, align_corners, data_format=data_format, backend=backend)
    golden = precision.golden_forward(x, grid, mode, padding, align_corners, data_format)
    competitor = precision.competitor_forward(x, grid, mode, padding, align_corners, data_format)
    assert tuple(y.shape) == tuple(golden.shape), f"{label} y: shape {tuple(y.shape)}"
    assert y.dtype == x.dtype, f"{label} y: dtype {y.dtype}"
    report = precision.compare(f"{label} y", y, golden, competitor, dtype)
    assert report.passed, str(report)
    return y


@contextlib.contextmanager
def poisoned_allocations(fill=float("nan")):
    """Inside the block, ``torch.empty`` and ``torch.empty_like`` return floating tensors filled with ``fill``.

    An output element that a kernel never writes then shows up (as NaN by default) instead of
    passing by luck with whatever the allocator left there. Yields the list of shapes allocated,
    so that a test can check that the outputs did go through these functions.
    """
    empty, empty_like = torch.empty, torch.empty_like
    shapes = []

    def poison(tensor):
        shapes.append(tuple(tensor.shape))
        return tensor.fill_(fill) if tensor.is_floating_point() else tensor

    torch.empty = lambda *args, **kwargs: poison(empty(*args, **kwargs))
    torch.empty_like = lambda *args, **kwargs: poison(empty_like(*args, **kwargs))
    try:
        yield shapes
    finally:
        torch.empty, torch.empty_like = empty, empty_like

def cancelling_channels_last_case():
    """A case Hypothesis found: constant x, so every grid gradient is exactly 0, and two grad channels 14 orders apart.

    PyTorch (float32 and float64) sums channels outer and taps inner, and its terms
    cancel exactly; a sum that adds the channels inside each tap first leaves a float64
    residue of 64 on the larger channel's scale, which the precision rule rejects when the
    golden and the competitor are both exactly 0.
    """
    x = torch.full((1, 1, 2, 4, 4), 23.902585983276367)
    grad = torch.zeros(1, 1, 2, 4, 4)
    grad[0, 0, 1, 0, 0] = 84.22940826416016
    grad[0, 0, 1, 0, 2] = 3.5403290866876416e16
    grid = torch.full((1, 1, 2, 4, 3), 1.100000023841858)
    return grad, x, grid
