"""Shared test helpers: case builders and the one comparison against the golden."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
from pathlib import Path

import torch

import gridsampler3d as gs
from gridsampler3d import composite, precision
from gridsampler3d.sampling import Field, Sampling
from gridsampler3d.tools.bench.runner import plumbed_warp

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPE_IDS = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64"}
MODES = ("bilinear", "nearest")
PADDINGS = ("zeros", "border", "reflection")
MATRIX = list(itertools.product(MODES, PADDINGS, (False, True)))
LAYOUTS = ("NCDHW", "NDHWC")
# Every backend that runs on CPU tensors here (Triton through its interpreter when there is no GPU).
CPU_BACKENDS = [
    name
    for name in gs.available_backends()
    if name in ("reference", "numba") or (name == "triton" and gs.backends.BACKENDS[name].supports(torch.device("cpu")))
]


def in_rotation(attributes, dtype, data_format, turn: int = 0) -> bool:
    """Whether Triton's interpreter (CPU tensors, a second or more a case) runs this case of the full matrix of
    attribute sets x dtypes x layouts: every attribute set in both layouts, each with one dtype in rotation. Every
    dtype still meets every mode, padding, align_corners and layout (each pair of values runs together), in a
    quarter of the cases; ``turn`` turns the rotation, so that two tests of one kernel path take different quarters.
    """
    position = MATRIX.index(attributes) + LAYOUTS.index(data_format) + turn
    return DTYPES.index(dtype) == position % len(DTYPES)


def matrix_id(case) -> str:
    mode, padding, align_corners = case
    return f"{mode}-{padding}-{'ac' if align_corners else 'noac'}"


def make_case(
    batch=2,
    channels=3,
    in_size=(5, 6, 7),
    out_size=(4, 5, 3),
    dtype=torch.float64,
    data_format="NCDHW",
    seed=0,
    low=-1.2,
    high=1.2,
):
    """Random (grad, input, grid) in ``data_format``; the grid is uniform in [low, high]."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn((batch, channels) + tuple(in_size), generator=generator, dtype=torch.float64)
    grad = torch.randn((batch, channels) + tuple(out_size), generator=generator, dtype=torch.float64)
    grid = low + (high - low) * torch.rand((batch,) + tuple(out_size) + (3,), generator=generator, dtype=torch.float64)
    if data_format == "NDHWC":
        x, grad = x.permute(0, 2, 3, 4, 1).contiguous(), grad.permute(0, 2, 3, 4, 1).contiguous()
    return grad.to(dtype), x.to(dtype), grid.to(dtype)


def assert_backward_matches(
    grad,
    x,
    grid,
    mode="bilinear",
    padding="zeros",
    align_corners=False,
    data_format="NCDHW",
    backend="auto",
    output_mask=(True, True),
    label="",
    **extra,
):
    """Run the library's backward and assert the precision rule (docs/semantics.md) on each output asked for."""
    dtype = torch.as_tensor(x).dtype
    dx, dgrid = gs.grid_sampler3d_backward(
        grad,
        x,
        grid,
        mode,
        padding,
        align_corners,
        output_mask=output_mask,
        data_format=data_format,
        backend=backend,
        **extra,
    )
    golden = precision.golden_backward(grad, x, grid, mode, padding, align_corners, output_mask, data_format)
    competitor = precision.competitor_backward(grad, x, grid, mode, padding, align_corners, output_mask, data_format)
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


def assert_forward_matches(
    x, grid, mode="bilinear", padding="zeros", align_corners=False, data_format="NCDHW", backend="auto", label=""
):
    """Run the library's forward and assert the precision rule."""
    dtype = torch.as_tensor(x).dtype
    y = gs.grid_sampler3d(x, grid, mode, padding, align_corners, data_format=data_format, backend=backend)
    golden = precision.golden_forward(x, grid, mode, padding, align_corners, data_format)
    competitor = precision.competitor_forward(x, grid, mode, padding, align_corners, data_format)
    assert tuple(y.shape) == tuple(golden.shape), f"{label} y: shape {tuple(y.shape)}"
    assert y.dtype == x.dtype, f"{label} y: dtype {y.dtype}"
    report = precision.compare(f"{label} y", y, golden, competitor, dtype)
    assert report.passed, str(report)
    return y


def make_warp_case(
    batch=2,
    channels=2,
    size=(3, 4, 5),
    dtype=torch.float64,
    data_format="NCDHW",
    displacement_format="N3DHW",
    seed=0,
    spread=2.5,
):
    """Random (grad, volume, displacement) in the given formats; the displacement (voxels) is normal
    with standard deviation ``spread``, so that many points leave the volume."""
    generator = torch.Generator().manual_seed(seed)
    volume = torch.randn((batch, channels) + tuple(size), generator=generator, dtype=torch.float64)
    grad = torch.randn((batch, channels) + tuple(size), generator=generator, dtype=torch.float64)
    displacement = spread * torch.randn((batch, 3) + tuple(size), generator=generator, dtype=torch.float64)
    if data_format == "NDHWC":
        volume, grad = volume.permute(0, 2, 3, 4, 1).contiguous(), grad.permute(0, 2, 3, 4, 1).contiguous()
    if displacement_format == "NDHW3":
        displacement = displacement.permute(0, 2, 3, 4, 1).contiguous()
    return grad.to(dtype), volume.to(dtype), displacement.to(dtype)


def _warp_by_hand(volume, displacement, mode, padding, align_corners, data_format, displacement_format):
    """y as a PyTorch user warps: identity + displacement normalised into a grid, then F.grid_sample
    (bicubic, which PyTorch lacks in 3-D: the torch composite); returns (y, logical x, logical field)."""
    channels_last = data_format == "NDHWC"
    x = volume.permute(0, 4, 1, 2, 3) if channels_last else volume
    field = displacement.permute(0, 4, 1, 2, 3) if displacement_format == "NDHW3" else displacement
    if mode == "bicubic":
        y = composite.sample(x, Field.displacement(field), Sampling.parse("bicubic", padding, align_corners))
    else:
        y = plumbed_warp(x, field, mode, padding, align_corners)
    return (y.permute(0, 2, 3, 4, 1) if channels_last else y), x, field


def competitor_warp(
    grad,
    volume,
    displacement,
    mode="bilinear",
    padding="border",
    align_corners=True,
    data_format="NCDHW",
    displacement_format="N3DHW",
):
    """(y, dvolume, ddisplacement) of :func:`_warp_by_hand` in the compute dtype (half types: float32 on
    the upcast inputs), rounded back: the precision rule's competitor of the fused warp."""
    dtype = volume.dtype
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    volume = volume.detach().cpu().to(compute).requires_grad_(True)
    displacement = displacement.detach().cpu().to(compute).requires_grad_(True)
    with torch.enable_grad():
        y, _, _ = _warp_by_hand(volume, displacement, mode, padding, align_corners, data_format, displacement_format)
        dvolume, ddisplacement = torch.autograd.grad(y, (volume, displacement), grad.detach().cpu().to(compute))
    return tuple(tensor.detach().to(dtype) for tensor in (y, dvolume, ddisplacement))


def assert_warp_matches(
    grad,
    volume,
    displacement,
    mode="bilinear",
    padding="border",
    align_corners=True,
    data_format="NCDHW",
    displacement_format="N3DHW",
    backend="auto",
    output_mask=(True, True),
    label="",
    **extra,
):
    """Run the library's warp3d and warp3d_backward and assert the precision rule on y, dvolume and
    ddisplacement (the golden: the float64 reference; the competitor: :func:`competitor_warp`)."""
    dtype = volume.dtype
    formats = dict(data_format=data_format, displacement_format=displacement_format)
    y = gs.warp3d(volume, displacement, mode, padding, align_corners, backend=backend, **formats)
    ours = (
        y,
        *gs.warp3d_backward(
            grad, volume, displacement, mode, padding, align_corners, output_mask, backend=backend, **formats, **extra
        ),
    )
    wide = [tensor.detach().cpu().double() for tensor in (grad, volume, displacement)]
    golden = (
        gs.warp3d(*wide[1:], mode, padding, align_corners, backend="reference", **formats),
        *gs.warp3d_backward(*wide, mode, padding, align_corners, backend="reference", **formats),
    )
    competitor = competitor_warp(grad, volume, displacement, mode, padding, align_corners, **formats)
    for index, (name, like) in enumerate(zip(("y", "dvolume", "ddisplacement"), (volume, volume, displacement))):
        if index and not output_mask[index - 1]:
            assert ours[index] is None, f"{label} {name}: not asked for, but computed"
            continue
        assert ours[index] is not None, f"{label} {name}: asked for, but None"
        assert tuple(ours[index].shape) == tuple(like.shape), f"{label} {name}: shape {tuple(ours[index].shape)}"
        assert ours[index].dtype == dtype, f"{label} {name}: dtype {ours[index].dtype}"
        report = precision.compare(f"{label} {name}", ours[index], golden[index], competitor[index], dtype)
        assert report.passed, str(report)
    return ours


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


def benchmark_script(name: str):
    """``benchmarks/<name>.py`` imported as a module (the scripts beside the package are not installed)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
