"""The benchmark registry: the operator's eight cases, the shapes users bring, the warp step and
tricubic sampling; one entry per case."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ... import bspline
from .. import inputs

__all__ = [
    "BenchCase",
    "SUITE",
    "WARP_SUITE",
    "AFFINE_SUITE",
    "BICUBIC_SUITE",
    "BSPLINE_SUITE",
    "bspline_grid",
    "select_cases",
    "build_inputs",
    "affine_theta",
]


@dataclass(frozen=True)
class BenchCase:
    """One benchmark case; a size is the edge of a cube or (D, H, W) (CPU sizes; ``scale`` grows them)."""

    name: str
    batch: int
    channels: int
    in_size: int | tuple
    out_size: int | tuple
    # warp | affine | uniform | identity | wide (uniform in [-3, 3]: most points clipped) |
    # displacement (a smooth field of a few voxels, for the fused warp: no grid) |
    # theta (an affine theta, for the affine field: no grid) | theta+displacement (and a displacement) |
    # mesh4 (a B-spline's control points on SimpleITK's grid of 4 intervals, 7 points per axis, up to 4 voxels) |
    # stride5 (control points every 5 voxels, on deepali's grid, about a voxel)
    grid_kind: str
    mode: str
    padding: str
    align_corners: bool
    dtype: str  # float16 | bfloat16 | float32 | float64
    layout: str  # NCDHW | NDHWC
    # What the case is timed against: PyTorch's op; or (for bicubic, which PyTorch lacks
    # in 3-D) this library's own bilinear sampling on the same inputs; or (for the fused
    # warp) PyTorch's registration step: grid plumbing plus F.grid_sample, under autograd;
    # or (for the affine field) F.affine_grid plus F.grid_sample, under autograd; or (for the B-spline
    # field) the dense field in torch then F.grid_sample (tools/bench/dense.py), under autograd.
    baseline: str = "torch"  # torch | bilinear | plumbing | affine | dense

    def describe(self) -> dict:
        return asdict(self)


SUITE = (
    BenchCase("reg128", 1, 1, 128, 128, "warp", "bilinear", "zeros", False, "float32", "NCDHW"),
    BenchCase("feat48", 2, 32, 48, 48, "affine", "bilinear", "border", False, "float32", "NCDHW"),
    BenchCase("rand64", 1, 16, 64, 64, "uniform", "bilinear", "zeros", False, "float32", "NCDHW"),
    BenchCase("cl64", 1, 16, 64, 64, "affine", "bilinear", "zeros", False, "float32", "NDHWC"),
    BenchCase("near64", 1, 16, 64, 64, "affine", "nearest", "reflection", False, "float32", "NCDHW"),
    BenchCase("bf16", 1, 16, 64, 64, "affine", "bilinear", "zeros", False, "bfloat16", "NCDHW"),
    BenchCase("fp64", 1, 8, 64, 64, "affine", "bilinear", "reflection", False, "float64", "NCDHW"),
    BenchCase("up2x", 1, 4, 64, 128, "identity", "bilinear", "border", True, "float32", "NCDHW"),
    # The shapes users bring beyond those eight, each class with its reason:
    # a batch of small crops (augmentation), where PyTorch's backward splits the batch among its threads
    BenchCase("crops4", 4, 4, 24, 24, "affine", "bilinear", "zeros", False, "float32", "NCDHW"),
    BenchCase("crops8", 8, 2, 16, 16, "warp", "bilinear", "zeros", False, "float32", "NCDHW"),
    # a brain MRI's anisotropic size, registered by a smooth warp
    BenchCase("mri", 1, 1, (160, 192, 224), (160, 192, 224), "warp", "bilinear", "border", False, "float32", "NCDHW"),
    # small odd sizes (no dimension a multiple of a vector or a block), reflection with align_corners
    BenchCase("odd", 1, 3, (37, 41, 43), (29, 31, 33), "affine", "bilinear", "reflection", True, "float32", "NCDHW"),
    # a grid that downsamples by two, few channels, channels-last (a multi-resolution pyramid)
    BenchCase("down4cl", 1, 4, 96, 48, "affine", "bilinear", "zeros", False, "float32", "NDHWC"),
    # many channels on a small volume (a feature map deep in a network)
    BenchCase("ch64", 1, 64, 24, 24, "affine", "bilinear", "border", False, "float32", "NCDHW"),
    # float16 on an affine grid (mixed-precision training)
    BenchCase("fp16", 1, 8, 48, 48, "affine", "bilinear", "zeros", False, "float16", "NCDHW"),
    # a grid reaching three spans out, folded back by reflection
    BenchCase("farrefl", 1, 4, 48, 48, "wide", "bilinear", "reflection", False, "float32", "NCDHW"),
    # small calls, where the cost per call above the kernels shows
    BenchCase("tiny8", 1, 2, 8, 8, "affine", "bilinear", "zeros", False, "float32", "NCDHW"),
    BenchCase("small16", 1, 2, 16, 16, "affine", "bilinear", "zeros", False, "float32", "NCDHW"),
)
# A VoxelMorph-style warp step: Warp3d (fused) against PyTorch's grid plumbing + F.grid_sample.
WARP_SUITE = (
    BenchCase("warp128", 1, 1, 128, 128, "displacement", "bilinear", "border", True, "float32", "NCDHW", "plumbing"),
)
# The affine field against F.affine_grid + F.grid_sample: an MRI volume's forward on one thread, a 128³ affine
# registration step (theta requires grad, MSE to a fixed image), and the same with a displacement too.
AFFINE_SUITE = (
    BenchCase(
        "affmri",
        1,
        1,
        (160, 192, 224),
        (160, 192, 224),
        "theta",
        "bilinear",
        "border",
        False,
        "float32",
        "NCDHW",
        "affine",
    ),
    BenchCase("affreg128", 1, 1, 128, 128, "theta", "bilinear", "zeros", False, "float32", "NCDHW", "affine"),
    BenchCase(
        "affdisp128", 1, 1, 128, 128, "theta+displacement", "bilinear", "border", False, "float32", "NCDHW", "affine"
    ),
)
# The B-spline field against its dense field in torch then F.grid_sample, on an MRI volume: the forward of an
# elastic augmentation (TorchIO's RandomElasticDeformation: SimpleITK's grid, 7 points per axis), and a free-form
# deformation registration step (control points every 5 voxels requiring grad, MSE to a fixed image; deepali's grid
# and its border padding with align_corners). benchmarks/bspline.py times both against SimpleITK and deepali too.
BSPLINE_SUITE = (
    BenchCase(
        "bsmri",
        1,
        1,
        (160, 192, 224),
        (160, 192, 224),
        "mesh4",
        "bilinear",
        "zeros",
        False,
        "float32",
        "NCDHW",
        "dense",
    ),
    BenchCase(
        "bsffd",
        1,
        1,
        (160, 192, 224),
        (160, 192, 224),
        "stride5",
        "bilinear",
        "border",
        True,
        "float32",
        "NCDHW",
        "dense",
    ),
)
# Tricubic sampling against this library's bilinear at equal size (64 taps against 8).
BICUBIC_SUITE = (
    BenchCase("cubic64", 1, 4, 64, 64, "warp", "bicubic", "zeros", False, "float32", "NCDHW", "bilinear"),
    BenchCase("cubiccl", 1, 16, 48, 48, "affine", "bicubic", "border", True, "float32", "NDHWC", "bilinear"),
)


def select_cases(names=None) -> list[BenchCase]:
    """The suite (PyTorch cases, the warp step, the affine field, the B-spline field, then bicubic ones), or the cases
    named (a list or a comma-separated string)."""
    if not names:
        return list(SUITE + WARP_SUITE + AFFINE_SUITE + BSPLINE_SUITE + BICUBIC_SUITE)
    if isinstance(names, str):
        names = [name.strip() for name in names.split(",") if name.strip()]
    by_name = {case.name: case for case in SUITE + WARP_SUITE + AFFINE_SUITE + BSPLINE_SUITE + BICUBIC_SUITE}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise ValueError(f"unknown benchmark case(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    return [by_name[name] for name in names]


def _scaled(size, scale: float) -> tuple:
    """(D, H, W) of a case's size (an edge or three) times ``scale``, at least 1 each."""
    edges = (size,) * 3 if isinstance(size, int) else tuple(size)
    return tuple(max(1, round(edge * scale)) for edge in edges)


def affine_theta(batch: int, seed: int = 2, strength: float = 0.1) -> torch.Tensor:
    """A random affine theta (N, 3, 4) near the identity, as registration and augmentation draw them, float64."""
    generator = torch.Generator().manual_seed(seed)
    return torch.eye(3, 4, dtype=torch.float64) + strength * (
        torch.rand(batch, 3, 4, generator=generator, dtype=torch.float64) * 2 - 1
    )


def bspline_grid(case: BenchCase, out_size: tuple) -> tuple:
    """(control sizes, spacing, origin) of a B-spline case's control grid on an output of ``out_size``."""
    if case.grid_kind == "mesh4":
        return ((4 + 3,) * 3, *bspline.simpleitk_grid(out_size, (4,) * 3))
    return bspline.deepali_grid(out_size, 5)


def _grid(case: BenchCase, out_size: tuple) -> torch.Tensor:
    if case.grid_kind in ("mesh4", "stride5"):  # control points (N, 3, Kd, Kh, Kw) in voxels
        control_sizes = bspline_grid(case, out_size)[0]
        generator = torch.Generator().manual_seed(5)
        if case.grid_kind == "mesh4":
            return 4 * (torch.rand(case.batch, 3, *control_sizes, generator=generator, dtype=torch.float64) * 2 - 1)
        return torch.randn(case.batch, 3, *control_sizes, generator=generator, dtype=torch.float64)
    if case.grid_kind in ("theta", "theta+displacement"):  # the displacement, if any, comes with the inputs
        return affine_theta(case.batch)
    if case.grid_kind == "displacement":  # (N, 3, D, H, W) in voxels: about 2 typical, 7 at most at 128³
        field = inputs.smooth_displacement(
            case.batch, out_size, magnitude=0.016 * max(out_size), seed=1, dtype=torch.float64
        )
        return field.permute(0, 4, 1, 2, 3).contiguous()
    if case.grid_kind == "warp":
        return inputs.warp_grid(case.batch, out_size, seed=1, align_corners=case.align_corners)
    if case.grid_kind == "affine":
        return inputs.random_affine_grid(case.batch, out_size, seed=2, align_corners=case.align_corners)
    if case.grid_kind == "uniform":
        return inputs.uniform_grid(case.batch, out_size, -1.1, 1.1, seed=3)
    if case.grid_kind == "wide":
        return inputs.uniform_grid(case.batch, out_size, -3.0, 3.0, seed=4)
    if case.grid_kind == "identity":
        return inputs.identity_grid(case.batch, out_size, case.align_corners)
    raise ValueError(f"unknown grid kind {case.grid_kind!r}")


def build_inputs(case: BenchCase, device="cpu", scale: float = 1.0):
    """Inputs of ``case``: ``(grad, x, grid)`` in the case's layout, and PyTorch's NCDHW views of them.

    For a displacement case the "grid" is the displacement (N, 3, D, H, W) in voxels; for an
    affine case, theta (N, 3, 4); for a B-spline case, the control points (N, 3, Kd, Kh, Kw) in
    voxels (their grid: :func:`bspline_grid`).

    Returns ``((grad, x, grid), (grad_ncdhw, x_ncdhw))``; for NDHWC the NCDHW views are
    channels-last strided, which is how PyTorch itself takes channels-last data.
    """
    dtype = getattr(torch, case.dtype)
    in_size, out_size = _scaled(case.in_size, scale), _scaled(case.out_size, scale)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(case.batch, case.channels, *in_size, generator=generator)
    grad = torch.randn(case.batch, case.channels, *out_size, generator=generator)
    grid = _grid(case, out_size)
    x, grad, grid = (t.to(device=device, dtype=dtype) for t in (x, grad, grid))
    if case.layout == "NDHWC":
        x, grad = x.permute(0, 2, 3, 4, 1).contiguous(), grad.permute(0, 2, 3, 4, 1).contiguous()
        return (grad, x, grid), (grad.permute(0, 4, 1, 2, 3), x.permute(0, 4, 1, 2, 3))
    return (grad, x, grid), (grad, x)
