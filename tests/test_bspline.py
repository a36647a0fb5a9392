"""The B-spline field: sampling at a cubic B-spline free-form deformation evaluated in the kernels.

The explicit path is written here from the formula, independently of the package: per axis
the dense basis ``beta(t - a)`` over the support (``floor(t) - 1 .. floor(t) + 2`` inside the
grid), the dense field ``u`` as their product with the control points (float64), the
positions ``p + u`` (or ``F.affine_grid``'s plus ``u``) normalised, then ``F.grid_sample``
(tricubic: the library's own sampler), differentiated by autograd. The reference (NumPy
float64) is checked against it to 1e-12 of each output's scale; the CPU engine against the
reference, y and dvolume bit for bit, the control points' and theta's gradients (summed in
float64 in another order) to 1e-13. Positions are generic: no point lies within 1e-9 voxels
of a cell boundary or a nearest-rounding midpoint (``_far_from_boundaries``), where a
rounding difference would be a jump.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import DTYPE_IDS, poisoned_allocations

import gridsampler3d as gs
from gridsampler3d import bspline, precision
from gridsampler3d.cpu import tuning
from gridsampler3d.cpu.planner import GridPass

pytestmark = [
    pytest.mark.usefixtures("split_small_calls"),
    # A one-voxel output axis with align_corners=True is one of the cases on purpose; F.affine_grid warns about it.
    pytest.mark.filterwarnings("ignore:Since version 1.3.0, affine_grid behavior:UserWarning"),
]

NAMES = ("y", "dvolume", "dcontrol_points", "dtheta")
FULL_MATRIX = [
    (mode, padding, corners, affine)
    for mode in ("bilinear", "nearest", "bicubic")
    for padding in ("zeros", "border", "reflection")
    for corners in (False, True)
    for affine in (False, True)
]
# Compile time bounds what the Numba engine is asked: every interpolation, padding and align_corners, with and
# without theta somewhere.
NUMBA_MODES = [
    ("bilinear", "zeros", False, False),
    ("bilinear", "border", True, True),
    ("bilinear", "reflection", False, True),
    ("nearest", "reflection", True, False),
    ("nearest", "zeros", False, True),
    ("bicubic", "border", False, False),
    ("bicubic", "reflection", True, True),
]
# (volume size, output size, control points, spacing, origin): the default grid, integer and non-integer
# spacings and origins, a grid that does not cover the output, an output of one voxel along an axis.
GRIDS = [
    ((5, 6, 7), None, (4, 5, 6), None, None),
    ((6, 5, 7), (7, 6, 5), (5, 4, 6), (2.0, 1.5, 1.25), (-1.5, -0.75, -2.0)),
    ((5, 7, 6), (4, 6, 9), (6, 5, 7), 1.7, 0.3),
    ((4, 5, 6), (1, 5, 6), (4, 4, 5), (1.0, 2.2, 1.9), (-1.0, -2.2, 0.5)),
]


def _basis(size: int, count: int, spacing: float, origin: float) -> torch.Tensor:
    """(size, count) float64: beta(t - a) on the support of each output voxel, 0 elsewhere."""
    t = (torch.arange(size, dtype=torch.float64) - origin) / spacing
    a = torch.arange(count, dtype=torch.float64)
    low = torch.floor(t)[:, None] - 1
    support = (a[None] >= low) & (a[None] <= low + 3)
    r = (t[:, None] - a[None]).abs()
    value = torch.where(r < 1, (4 - 6 * r**2 + 3 * r**3) / 6, torch.where(r < 2, (2 - r) ** 3 / 6, torch.zeros_like(r)))
    return torch.where(support, value, torch.zeros_like(value))


def explicit_field(control_points, out_size, parameters) -> torch.Tensor:
    """u (N, 3, Do, Ho, Wo) from the formula, differentiable in the control points (finite ones)."""
    spacing, origin = parameters[:3], parameters[3:]
    bases = [
        _basis(size, count, s, o).to(control_points.dtype)
        for size, count, s, o in zip(out_size, control_points.shape[2:], spacing, origin)
    ]
    return torch.einsum("da,hb,wc,nkabc->nkdhw", *bases, control_points)


def _positions(volume_size, out_size, theta, u, corners):
    """The normalised grid (N, Do, Ho, Wo, 3) of ``p + u`` or of F.affine_grid's position plus ``u``."""
    slopes = [(size - 1) / 2 if corners else size / 2 for size in reversed(volume_size)]  # x, y, z
    steps = torch.stack(
        [u[:, 2 - axis] / slopes[axis] if slopes[axis] else u[:, 2 - axis] * 0 for axis in range(3)], -1
    )
    if theta is not None:
        base = F.affine_grid(theta, (u.shape[0], 1, *out_size), align_corners=corners)
    else:
        d, h, w = torch.meshgrid(*[torch.arange(s, dtype=u.dtype) for s in out_size], indexing="ij")
        voxels = torch.stack([w, h, d], dim=-1)
        if corners:
            base = torch.stack([2 * voxels[..., a] / max(volume_size[2 - a] - 1, 1) - 1 for a in range(3)], -1)
        else:
            base = torch.stack([(2 * voxels[..., a] + 1) / volume_size[2 - a] - 1 for a in range(3)], -1)
        base = base.expand(u.shape[0], *base.shape)
    return base + steps


def _explicit(grad, volume, control_points, theta, out_size, parameters, mode, padding, corners):
    """y, dvolume, dcontrol_points, dtheta (None without theta) by autograd through the explicit path."""
    leaves = [volume.clone().requires_grad_(), control_points.clone().requires_grad_()]
    if theta is not None:
        leaves.append(theta.clone().requires_grad_())
    u = explicit_field(leaves[1], out_size, parameters)
    grid = _positions(tuple(volume.shape[2:]), out_size, leaves[2] if theta is not None else None, u, corners)
    sample = gs.grid_sample if mode == "bicubic" else F.grid_sample
    y = sample(leaves[0], grid, mode, padding, corners)
    grads = torch.autograd.grad(y, leaves, grad)
    return (y.detach(), *grads, *([None] if theta is None else []))


def _case(grid_index=0, batch=2, channels=3, affine=False, dtype=torch.float64, seed=0, scale=1.2):
    """(grad, volume, control points, theta or None, output size, spacing, origin) of GRIDS[grid_index]: control
    points up to ``scale`` voxels, a generic theta."""
    volume_size, out_size, counts, spacing, origin = GRIDS[grid_index]
    out_size = out_size or volume_size
    generator = torch.Generator().manual_seed(seed)
    volume = torch.randn((batch, channels, *volume_size), generator=generator, dtype=torch.float64)
    grad = torch.randn((batch, channels, *out_size), generator=generator, dtype=torch.float64)
    control = scale * (2 * torch.rand((batch, 3, *counts), generator=generator, dtype=torch.float64) - 1)
    theta = None
    if affine:
        theta = torch.eye(3, 4, dtype=torch.float64).repeat(batch, 1, 1)
        theta[:, :, :3] += 0.2 * torch.randn(batch, 3, 3, generator=generator, dtype=torch.float64)
        theta[:, :, 3] += 0.2 * torch.randn(batch, 3, generator=generator, dtype=torch.float64)
        theta = theta.to(dtype)
    return grad.to(dtype), volume.to(dtype), control.to(dtype), theta, out_size, spacing, origin


def _parameters(out_size, control, spacing, origin):
    return bspline.grid_of(out_size, control.shape[2:], spacing, origin)


def _far_from_boundaries(volume, control, theta, out_size, parameters, corners, mode) -> bool:
    grid = _positions(tuple(volume.shape[2:]), out_size, theta, explicit_field(control, out_size, parameters), corners)
    sizes = torch.tensor(list(reversed(volume.shape[2:])), dtype=torch.float64)
    index = (grid + 1) * (sizes - 1) / 2 if corners else ((grid + 1) * sizes - 1) / 2
    offset = 0.5 if mode == "nearest" else 0.0
    return bool((((index - offset) - torch.round(index - offset)).abs() > 1e-9).all())


def _ours(grad, volume, control, theta, out_size, spacing, origin, mode, padding, corners, backend="auto", **rest):
    common = dict(
        spacing=spacing,
        origin=origin,
        theta=theta,
        interpolation_mode=mode,
        padding_mode=padding,
        align_corners=corners,
        backend=backend,
        **rest,
    )
    y = gs.bspline_warp3d(volume, control, out_size, **common)
    return (y, *gs.bspline_warp3d_backward(grad, volume, control, out_size, **common))


def _assert_close(ours, theirs, tolerance, label):
    for name, mine, gold in zip(NAMES, ours, theirs):
        assert (mine is None) == (gold is None), f"{label} {name}"
        if gold is None:
            continue
        scale = max(1.0, float(gold.abs().max()))
        error = float((mine.double() - gold.double()).abs().max())
        assert error <= tolerance * scale, f"{label} {name}: {error} > {tolerance} x {scale}"


@pytest.mark.parametrize("grid_index", range(len(GRIDS)))
def test_the_field_is_the_formula(grid_index):
    """The tables' dense field (what the reference, the composite and ONNX export use) is the formula's."""
    _, _, control, _, out_size, spacing, origin = _case(grid_index)
    parameters = _parameters(out_size, control, spacing, origin)
    ours = bspline.dense_displacement(control, out_size, parameters)
    assert torch.allclose(ours, explicit_field(control, out_size, parameters), rtol=0, atol=1e-14)


def test_the_default_grid_spans_the_output():
    """Voxel 0 at control coordinate 1, voxel S - 1 at K - 2; a one-voxel axis has spacing 1."""
    assert bspline.grid_of((9, 1, 5), (7, 4, 5), None, None) == (2.0, 1.0, 2.0, -2.0, -1.0, -2.0)
    assert bspline.grid_of((9, 9, 9), (7, 7, 7), 2.5, None)[3:] == (-2.5, -2.5, -2.5)


@pytest.mark.parametrize("case", FULL_MATRIX, ids=lambda case: "-".join(map(str, case)))
def test_reference_is_the_explicit_path(case):
    mode, padding, corners, affine = case
    for grid_index in range(len(GRIDS)):
        grad, volume, control, theta, out_size, spacing, origin = _case(grid_index, affine=affine, seed=grid_index)
        parameters = _parameters(out_size, control, spacing, origin)
        assert _far_from_boundaries(volume, control, theta, out_size, parameters, corners, mode)
        ours = _ours(grad, volume, control, theta, out_size, spacing, origin, mode, padding, corners, "reference")
        theirs = _explicit(grad, volume, control, theta, out_size, parameters, mode, padding, corners)
        _assert_close(ours, theirs, 1e-12, (case, grid_index))


@pytest.mark.parametrize("plan", ["split", "serial"])
@pytest.mark.parametrize("case", NUMBA_MODES, ids=lambda case: "-".join(map(str, case)))
def test_numba_float64_is_the_reference(case, plan, monkeypatch):
    """y and dvolume bit for bit; the control points' and theta's gradients, summed in float64 in the engine's order
    (row by row, then plane by plane), to 1e-13 of their scale. Split as large calls are, and serial as small calls
    run: one part on scratch kept for the thread, which grids of other sizes one after the other must find large
    enough (row coefficients of Kw + 1, plane sums of Kh + 1 rows of Wo)."""
    if plan == "serial":
        monkeypatch.setattr(tuning, "PARALLEL_VALUES", 1 << 40)
        monkeypatch.setattr(tuning, "SERIAL_ITEM_BYTES", 1 << 40)
    mode, padding, corners, affine = case
    for grid_index in range(len(GRIDS)):
        grad, volume, control, theta, out_size, spacing, origin = _case(grid_index, affine=affine, seed=10 + grid_index)
        ours = _ours(grad, volume, control, theta, out_size, spacing, origin, mode, padding, corners, "numba")
        gold = _ours(grad, volume, control, theta, out_size, spacing, origin, mode, padding, corners, "reference")
        for name, mine, reference in zip(NAMES, ours, gold):
            assert (mine is None) == (reference is None), name
            if reference is None:
                continue
            if name in ("y", "dvolume"):
                assert torch.equal(mine, reference), (case, grid_index, name)
            else:
                scale = max(1.0, float(reference.abs().max()))
                assert torch.allclose(mine, reference, rtol=0, atol=1e-13 * scale), (case, grid_index, name)


def test_the_gradients_bits_do_not_depend_on_threads_or_plans(threads, monkeypatch):
    """The control points' and theta's gradients (and y, dvolume) have the same bits on one thread and on two, and
    with the tuning constants lowered so that small calls take the plans of large ones (channel groups, runs)."""
    grad, volume, control, theta, out_size, spacing, origin = _case(1, channels=5, affine=True, dtype=torch.float32)
    results = []
    for count, carry_bytes in ((1, tuning.CARRY_BYTES), (2, tuning.CARRY_BYTES), (2, 512)):
        threads(count)
        monkeypatch.setattr(tuning, "CARRY_BYTES", carry_bytes)
        for mode in ("bilinear", "bicubic"):
            results.append(_ours(grad, volume, control, theta, out_size, spacing, origin, mode, "zeros", False))
    for one, other in zip(results[:2], results[2:4]):
        assert all(torch.equal(a, b) for a, b in zip(one, other))
    for one, other in zip(results[:2], results[4:]):
        assert all(torch.equal(a, b) for a, b in zip(one, other))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_lower_precision_meets_the_precision_rule(dtype, mode):
    """The precision rule against the float64 golden of the same operands, the explicit path in the dtype the
    competitor (in float32 for the half types, rounded: PyTorch's grid sampler has no half CPU backward)."""
    grad, volume, control, theta, out_size, spacing, origin = _case(2, channels=4, affine=True, dtype=dtype, seed=3)
    ours = _ours(grad, volume, control, theta, out_size, spacing, origin, mode, "border", True)
    wide = [None if t is None else t.double() for t in (grad, volume, control, theta)]
    parameters = _parameters(out_size, control, spacing, origin)
    golden = _explicit(*wide, out_size, parameters, mode, "border", True)
    compute = torch.float32 if dtype != torch.float32 else dtype
    narrow = [None if t is None else t.to(compute) for t in (grad, volume, control, theta)]
    competitor = [t.to(dtype) for t in _explicit(*narrow, out_size, parameters, mode, "border", True)]
    for name, mine, gold, theirs in zip(NAMES, ours, golden, competitor):
        assert mine.dtype == dtype and mine.shape == gold.shape, name
        report = precision.compare(name, mine, gold, theirs, dtype)
        assert report.passed, str(report)


def test_layouts_output_mask_module_and_numpy():
    grad, volume, control, theta, out_size, spacing, origin = _case(1, affine=True, seed=4)
    y, dx, dcontrol, dtheta = _ours(grad, volume, control, theta, out_size, spacing, origin, "bilinear", "zeros", False)
    last = gs.bspline_warp3d(
        volume.permute(0, 2, 3, 4, 1), control, out_size, spacing, origin, theta, data_format="NDHWC"
    )
    assert torch.equal(last, y.permute(0, 2, 3, 4, 1))
    alone = [
        gs.bspline_warp3d_backward(grad, volume, control, out_size, spacing, origin, theta, output_mask=mask)
        for mask in ((True, False, False), (False, True, False), (False, False, True))
    ]
    assert alone[0][1:] == (None, None) and torch.equal(alone[0][0], dx)
    assert alone[1][0] is None and alone[1][2] is None and torch.equal(alone[1][1], dcontrol)
    assert alone[2][:2] == (None, None) and torch.equal(alone[2][2], dtheta)
    without = gs.bspline_warp3d_backward(grad, volume, control, out_size, spacing, origin)
    assert without[2] is None
    module = gs.BSplineWarp3d(out_size, spacing=spacing, origin=origin)
    assert torch.equal(module(volume, control, theta), y)
    assert torch.equal(gs.bspline_warp(volume, control, out_size, spacing=spacing, origin=origin, theta=theta), y)
    y_np = gs.bspline_warp3d(volume.numpy(), control.numpy(), out_size, spacing, origin, theta.numpy())
    assert isinstance(y_np, np.ndarray) and np.array_equal(y_np, y.numpy())


def test_no_dense_field_is_allocated():
    """Neither the forward nor the backward makes an (N, 3, Do, Ho, Wo) tensor (nor a grid)."""
    grad, volume, control, theta, out_size, spacing, origin = _case(2, batch=1, channels=2, affine=True, seed=5)
    with poisoned_allocations() as shapes:
        _ours(grad, volume, control, theta, out_size, spacing, origin, "bilinear", "zeros", False, "numba")
    assert shapes, "the outputs did not come from torch.empty / empty_like"
    assert (1, 3, *out_size) not in shapes and (1, *out_size, 3) not in shapes, shapes


@pytest.mark.parametrize("backend", ["reference", "numba"])
@pytest.mark.parametrize("padding", ["zeros", "border"])
def test_non_finite_values_land_where_the_explicit_path_puts_them(backend, padding):
    """NaN and infinity in the control points or theta: every output where the explicit path, the dense field (its
    sums over the support only: :func:`.bspline.dense_displacement`) then F.grid_sample and autograd, puts them."""
    for affine in (False, True):
        grad, volume, control, theta, out_size, spacing, origin = _case(0, affine=affine, seed=6)
        control[0, 1, 2, 1, 3] = float("nan")
        control[1, 2, 0, 3, 0] = float("inf")
        if affine:
            theta[1, 0, 1] = float("inf")
        parameters = _parameters(out_size, control, spacing, origin)
        ours = _ours(grad, volume, control, theta, out_size, spacing, origin, "bilinear", padding, False, backend)
        leaves = [t.clone().requires_grad_() for t in (volume, control) + ((theta,) if affine else ())]
        field = bspline.dense_displacement(leaves[1], out_size, parameters)
        grid = _positions(tuple(volume.shape[2:]), out_size, leaves[2] if affine else None, field, False)
        y = F.grid_sample(leaves[0], grid, "bilinear", padding, False)
        theirs = (y.detach(), *torch.autograd.grad(y, leaves, grad), *([] if affine else [None]))
        assert not torch.isfinite(field).all()  # the case reaches the positions
        for name, mine, gold in zip(NAMES, ours, theirs):
            if gold is None:
                continue
            same = torch.isnan(mine) == torch.isnan(gold)
            assert same.all(), (affine, name)
            finite = torch.isfinite(gold)
            scale = max(1.0, float(gold[finite].abs().max()))
            assert torch.allclose(mine[finite], gold[finite], rtol=0, atol=1e-12 * scale), (affine, name)


def test_gradcheck_and_second_derivatives():
    _, volume, control, theta, out_size, spacing, origin = _case(3, batch=1, channels=2, affine=True, seed=8)
    leaves = [tensor.clone().requires_grad_() for tensor in (volume, control, theta)]

    def function(v, c, t):
        return gs.bspline_warp(v, c, out_size, spacing=spacing, origin=origin, theta=t, padding_mode="border")

    assert torch.autograd.gradcheck(function, leaves)
    assert torch.autograd.gradgradcheck(function, leaves)


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        (dict(control_points=torch.zeros(1, 3, 3, 4, 4)), ValueError, "at least 4 points along each axis"),
        (dict(control_points=torch.zeros(1, 2, 4, 4, 4)), ValueError, "dimension 1 must be 3"),
        (dict(control_points=torch.zeros(2, 3, 4, 4, 4)), ValueError, "batch size N must equal"),
        (dict(control_points=torch.zeros(1, 3, 4, 4)), ValueError, "must be 5-D"),
        (dict(control_points=torch.zeros(1, 3, 4, 4, 4, dtype=torch.float64)), TypeError, "dtype"),
        (dict(spacing=0.0), ValueError, "spacing must be positive"),
        (dict(spacing=(1.0, 2.0)), TypeError, "spacing must be a number or three"),
        (dict(origin=float("nan")), ValueError, "origin must be finite"),
        (dict(spacing="2"), TypeError, "spacing must be a number or three"),
        (dict(theta=torch.zeros(1, 2, 4)), ValueError, "theta must be (N, 3, 4)"),
        (dict(size=(4, 0, 4)), ValueError, "size (Do, Ho, Wo) must be positive"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_bad_input_is_refused(arguments, error, message):
    call = dict(volume=torch.zeros(1, 1, 4, 5, 6), control_points=torch.zeros(1, 3, 4, 4, 4))
    call.update(arguments)
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        gs.bspline_warp3d(**call)
    with pytest.raises(error):
        gs.bspline_warp(**call)


def test_explain_plans_the_kind():
    """The CPU engine's plans of a B-spline call, with and without theta, as the call makes them."""
    grad, volume, control, theta, out_size, spacing, origin = _case(1, affine=True)
    common = dict(field_kind="bspline", size=out_size, spacing=spacing, origin=origin)
    forward = gs.explain(volume, control, **common)
    backward = gs.explain(volume, control, grad, theta=theta, output_mask=(True, True, True), **common)
    assert str(forward).startswith("forward") and str(backward).startswith("backward")
    assert forward.rows_joined == 1 and backward.rows_joined == 1  # a B-spline's rows are never joined
    assert "grid-gradient" in str(backward)  # float64: PyTorch's terms of the gradient with respect to the position
    only_dx = gs.explain(volume, control, grad, theta=theta, output_mask=(True, False, False), **common)
    assert "grid-gradient" not in str(only_dx) and only_dx.grid_pass in (GridPass.NONE, GridPass.ZEROS)


def test_simpleitk_grid_gives_simpleitks_field():
    sitk = pytest.importorskip("SimpleITK")
    rng = np.random.default_rng(0)
    for shape, mesh in (((20, 17, 23), (4, 5, 3)), ((9, 12, 10), (2, 3, 4))):
        image = sitk.GetImageFromArray(np.zeros(shape))
        transform = sitk.BSplineTransformInitializer(image, mesh)
        parameters = rng.uniform(-2, 2, len(transform.GetParameters()))
        transform.SetParameters(parameters.tolist())
        counts = tuple(m + 3 for m in reversed(mesh))
        control = bspline.simpleitk_control_points(parameters, counts)
        spacing, origin = bspline.simpleitk_grid(shape, mesh)
        ours = bspline.dense_displacement(control[None], shape, (*spacing, *origin))[0]
        field = sitk.TransformToDisplacementField(
            transform, sitk.sitkVectorFloat64, image.GetSize(), image.GetOrigin(), image.GetSpacing()
        )
        theirs = np.moveaxis(sitk.GetArrayFromImage(field), -1, 0)[::-1]
        assert np.abs(ours - theirs).max() < 1e-6


def test_deepali_grid_gives_deepalis_field():
    pytest.importorskip("deepali")
    from deepali.core import Grid
    from deepali.spatial import FreeFormDeformation

    generator = torch.Generator().manual_seed(0)
    for shape, stride in (((20, 24, 28), 5), ((13, 11, 9), (3, 4, 2))):
        counts, spacing, origin = bspline.deepali_grid(shape, stride)
        ffd = FreeFormDeformation(Grid(shape=shape), stride=stride)
        assert tuple(ffd.params.shape[2:]) == counts
        with torch.no_grad():
            ffd.params.copy_(0.05 * torch.randn(ffd.params.shape, generator=generator))
            theirs = ffd.tensor()  # (1, 3, D, H, W): (x, y, z) in deepali's normalised units
        control = bspline.deepali_control_points(ffd.params.detach().double(), shape)
        ours = bspline.dense_displacement(control, shape, (*spacing, *origin))
        theirs_voxels = bspline.deepali_control_points(theirs.double(), shape)
        # deepali evaluates its basis in float32 (~1e-7 of a voxel)
        assert float((ours - theirs_voxels).abs().max()) < 1e-5
