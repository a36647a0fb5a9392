"""The B-spline field on the Triton engine: against the float64 reference, and by the precision rule below float64.

The kernels read the row coefficients V (N, 3, Do, Ho, Kw) in place of the control points and
sum each point's displacement from its four columns; the backward walk reduces the control
points' gradient to partial row sums per block of columns (and theta's to row moments) that
the engine sums in float64 in a fixed order, so dcontrol_points and dtheta are the same bits
in both backward modes. Without a GPU the kernels run on CPU tensors through Triton's
interpreter (conftest sets TRITON_INTERPRET=1), so the sizes are tiny.
"""

import importlib.util

import numpy as np
import pytest
import torch
from helpers import DTYPE_IDS, poisoned_allocations

import gridsampler3d as gs
from gridsampler3d import composite, precision, reference
from gridsampler3d.bspline import grid_of
from gridsampler3d.gpu import planner
from gridsampler3d.gpu.engine import plan_call
from gridsampler3d.problem import Stage
from gridsampler3d.sampling import Field, FieldKind, Outputs, Sampling

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU tensors run through the interpreter
NAMES = ("y", "dvolume", "dcontrol_points", "dtheta")
SIZE = (4, 5, 6)
OUT_SIZE = (3, 4, 7)  # not the volume's
# The tricubic cases' output: its 64 taps are slow through the interpreter, the deterministic dx's sort most.
TRICUBIC_OUT_SIZE = (2, 2, 5)
# Control grids (Kd, Kh, Kw), spacing, origin: the default (one point beyond each end of the output), one of
# non-integer spacing and origin, and one finer than the output along w (spacing 0.6) whose supports reach past
# its last column, so that some terms are left out.
GRIDS = {
    "default": ((5, 5, 6), None, None),
    "fractional": ((4, 6, 6), (1.3, 0.9, 1.7), (-0.5, -1.2, -2.3)),
    "fine": ((4, 5, 8), (1.1, 0.8, 0.6), (0.4, -0.7, -1.1)),
}
# (mode, padding, align_corners, theta, grid): every interpolation and padding, both align_corners, with and
# without theta. Tricubic runs twice, on a smaller output and with zeros padding (border and reflection pile its
# taps into the edge voxels, whose long runs the interpreter's deterministic dx walks slowly): the padding acts on
# a position the same way whatever field gave it, and the trilinear and nearest cases take the B-spline through
# every padding.
CASES = [
    ("bilinear", "zeros", False, False, "default"),
    ("bilinear", "border", True, True, "fractional"),
    ("bilinear", "reflection", False, True, "fine"),
    ("bilinear", "reflection", True, False, "fractional"),
    ("nearest", "reflection", True, True, "fractional"),
    ("nearest", "border", False, False, "fine"),
    ("nearest", "zeros", False, True, "default"),
    ("bicubic", "zeros", False, False, "fractional"),
    ("bicubic", "zeros", True, True, "fine"),
]


def bspline_case(grid="fractional", theta=True, batch=1, channels=2, out_size=OUT_SIZE, dtype=torch.float64, seed=0):
    """(grad, volume, control_points, theta or None) and the grid's (spacing, origin): control points of about 1.5
    voxels and a generic theta, so that points leave the volume on several sides."""
    generator = torch.Generator().manual_seed(seed)
    control_sizes, spacing, origin = GRIDS[grid]
    volume = torch.randn((batch, channels, *SIZE), generator=generator, dtype=torch.float64)
    grad = torch.randn((batch, channels, *out_size), generator=generator, dtype=torch.float64)
    control_points = 1.5 * torch.randn((batch, 3, *control_sizes), generator=generator, dtype=torch.float64)
    matrix = None
    if theta:
        matrix = torch.eye(3, 4, dtype=torch.float64).repeat(batch, 1, 1)
        matrix += 0.2 * torch.randn(batch, 3, 4, generator=generator, dtype=torch.float64)
    tensors = tuple(None if tensor is None else tensor.to(dtype) for tensor in (grad, volume, control_points, matrix))
    return tensors, (spacing, origin)


def _run(backend, tensors, grid, mode, padding, corners, out_size, **options):
    """(y, dvolume, dcontrol_points, dtheta) from one backend."""
    grad, volume, control_points, theta = tensors
    arguments = (out_size, *grid, theta, mode, padding, corners)
    data_format = options.pop("data_format", "NCDHW")
    y = gs.bspline_warp3d(volume, control_points, *arguments, data_format=data_format, backend=backend)
    grads = gs.bspline_warp3d_backward(
        grad, volume, control_points, *arguments, data_format=data_format, backend=backend, **options
    )
    return (y, *grads)


def _on(device, tensors):
    return tuple(None if tensor is None else tensor.to(device) for tensor in tensors)


def _golden(tensors, grid, mode, padding, corners, out_size, **options):
    wide = tuple(None if tensor is None else tensor.double() for tensor in tensors)
    return _run("reference", wide, grid, mode, padding, corners, out_size, **options)


def _far_from_boundaries(tensors, grid, corners, out_size, mode):
    """Every position is further than 1e-9 voxels from where the sampling jumps (cell boundaries, midpoints): the
    voxel matrix made in torch and in NumPy may differ by an ulp."""
    _, volume, control_points, theta = tensors
    parameters = grid_of(out_size, control_points.shape[2:], *grid)
    field = (control_points.double().numpy(), out_size, parameters, None if theta is None else theta.double().numpy())
    kind = FieldKind.BSPLINE if theta is None else FieldKind.BSPLINE_AFFINE
    positions = reference.positions(field, kind, tuple(volume.shape[2:]), corners)
    offset = 0.5 if mode == "nearest" else 0.0
    distance = np.abs((positions - offset) - np.round(positions - offset))
    return bool((distance > 1e-9).all())


def assert_near(ours, golden, label):
    """float64: each output within 1e-12 of the golden's largest finite magnitude (at least 1); NaN and infinities
    exactly where the golden has them; the golden's layout."""
    for name, mine, gold in zip(NAMES, ours, golden):
        assert (mine is None) == (gold is None), f"{label} {name}: {'computed' if gold is None else 'missing'}"
        if gold is None:
            continue
        assert mine.shape == gold.shape and mine.stride() == gold.stride(), f"{label} {name}: {mine.stride()}"
        mine = mine.cpu()
        assert torch.equal(torch.isnan(mine), torch.isnan(gold)), f"{label} {name}: NaN elsewhere"
        assert torch.equal(torch.isinf(mine), torch.isinf(gold)), f"{label} {name}: infinities elsewhere"
        assert torch.equal(mine[torch.isinf(mine)], gold[torch.isinf(gold)]), f"{label} {name}: infinities"
        finite = torch.isfinite(gold)
        scale = max(1.0, float(gold[finite].abs().max())) if bool(finite.any()) else 1.0
        error = float((mine[finite] - gold[finite]).abs().max()) if bool(finite.any()) else 0.0
        assert error <= 1e-12 * scale, f"{label} {name}: {error} > 1e-12 x {scale}"


def assert_both_modes(tensors, grid, mode, padding, corners, out_size, label, **options):
    """Both backward modes near the reference, outputs allocated NaN-poisoned (an element a kernel misses shows
    up), and the same dcontrol_points and dtheta bits in both."""
    on_device = _on(DEVICE, tensors)
    with poisoned_allocations():
        fast = _run("triton", on_device, grid, mode, padding, corners, out_size, deterministic=False, **options)
        exact = _run("triton", on_device, grid, mode, padding, corners, out_size, deterministic=True, **options)
    golden = _golden(tensors, grid, mode, padding, corners, out_size, **options)
    assert_near(fast, golden, f"{label} fast")
    assert_near(exact, golden, f"{label} deterministic")
    for index in (2, 3):
        if golden[index] is not None:
            assert torch.equal(fast[index], exact[index]), f"{label} {NAMES[index]}: differs between the modes"
    return fast, exact


@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(map(str, case)))
def test_float64_matches_the_reference_in_both_modes(case):
    mode, padding, corners, theta, grid = case
    out_size = TRICUBIC_OUT_SIZE if mode == "bicubic" else OUT_SIZE
    tensors, grid_values = bspline_case(grid, theta, out_size=out_size, seed=CASES.index(case))
    assert _far_from_boundaries(tensors, grid_values, corners, out_size, mode)
    assert_both_modes(tensors, grid_values, mode, padding, corners, out_size, str(case))


def test_channels_last_volume():
    """An NDHWC volume: read in place a channel vector at a time, dvolume channels-last."""
    (grad, volume, control_points, theta), grid = bspline_case("fractional", True, channels=3, seed=20)
    channels_last = (grad.permute(0, 2, 3, 4, 1).contiguous(), volume.permute(0, 2, 3, 4, 1).contiguous())
    tensors = (*channels_last, control_points, theta)
    assert _far_from_boundaries((grad, volume, control_points, theta), grid, False, OUT_SIZE, "bilinear")
    fast, _ = assert_both_modes(tensors, grid, "bilinear", "border", False, OUT_SIZE, "NDHWC", data_format="NDHWC")
    assert fast[1].shape == channels_last[1].shape and fast[1].is_contiguous()


def test_row_sums_of_several_column_blocks(monkeypatch):
    """A row wider than a program's block: each block's partial row sums land at its own first control column, and
    the engine adds the blocks in order (so do theta's moments). Programs as large as on a GPU (128 points)."""
    monkeypatch.setattr(planner, "INTERPRETED_SCALE", 1)
    out_size = (1, 2, 300)
    generator = torch.Generator().manual_seed(21)
    grad = torch.randn((1, 1, *out_size), generator=generator, dtype=torch.float64)
    volume = torch.randn((1, 1, 3, 4, 40), generator=generator, dtype=torch.float64)
    control_points = 1.5 * torch.randn((1, 3, 4, 4, 45), generator=generator, dtype=torch.float64)
    theta = torch.tensor([[[0.15, 0.0, 0.0, 0.02], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]], dtype=torch.float64)
    tensors, grid = (grad, volume, control_points, theta), ((1.0, 1.0, 7.3), (-1.0, -1.0, -4.6))
    field = Field.bspline(control_points, out_size, grid_of(out_size, control_points.shape[2:], *grid), theta)
    plan = plan_call(Stage.BACKWARD, volume, field, Sampling(), outputs=Outputs(True, True, True))
    assert plan.tile.block_w < out_size[2] and plan.tile.block_h == plan.tile.block_d == 1
    assert _far_from_boundaries(tensors, grid, False, out_size, "bilinear")
    assert_both_modes(tensors, grid, "bilinear", "zeros", False, out_size, "several blocks")


def test_non_finite_control_points_follow_the_reference():
    """A NaN and an infinite control point reach exactly the points whose support holds them, as in the reference;
    a column outside a point's support or the grid is left out, not multiplied by 0."""
    (grad, volume, control_points, theta), grid = bspline_case("fine", False, seed=22)
    control_points[0, 2, 1, 2, 0] = float("nan")
    control_points[0, 0, 2, 3, 7] = float("inf")
    tensors = (grad, volume, control_points, theta)
    assert_both_modes(tensors, grid, "bilinear", "border", True, OUT_SIZE, "non-finite")


def test_each_output_alone():
    tensors, grid = bspline_case("fractional", True, seed=23)
    grad, volume, control_points, theta = _on(DEVICE, tensors)
    arguments = (OUT_SIZE, *grid, theta, "bilinear", "reflection", False)
    # deterministic: a GPU's atomics would add dvolume in another order each time
    whole = gs.bspline_warp3d_backward(grad, volume, control_points, *arguments, backend="triton", deterministic=True)
    for index, mask in enumerate(((True, False, False), (False, True, False), (False, False, True))):
        alone = gs.bspline_warp3d_backward(
            grad, volume, control_points, *arguments, output_mask=mask, backend="triton", deterministic=True
        )
        assert all(alone[other] is None for other in range(3) if other != index)
        assert torch.equal(alone[index], whole[index])


def test_no_dense_field_or_gradient_is_allocated():
    """The kernels read the row coefficients (N, 3, Do, Ho, Kw) and write partial row sums: no (N, 3, Do, Ho, Wo)
    displacement or gradient, and no (N, Do, Ho, Wo, 3) grid, is ever allocated."""
    tensors, grid = bspline_case("fractional", True, seed=24)
    with poisoned_allocations() as shapes:
        _run("triton", _on(DEVICE, tensors), grid, "bilinear", "zeros", False, OUT_SIZE, deterministic=True)
    assert shapes
    assert (1, 3, *OUT_SIZE) not in shapes and (1, *OUT_SIZE, 3) not in shapes


def _competitor(tensors, grid, mode, padding, corners, out_size):
    """The precision rule's competitor: the differentiable torch composite (the dense field, then sampling) in the
    compute dtype (half types: float32 on the upcast inputs) and autograd, rounded back."""
    dtype = tensors[1].dtype
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    grad, volume, control_points, theta = (tensor.detach().to(compute) for tensor in tensors)
    leaves = [volume.requires_grad_(), control_points.requires_grad_(), theta.requires_grad_()]
    parameters = grid_of(out_size, control_points.shape[2:], *grid)
    with torch.enable_grad():
        y = composite.sample(
            leaves[0], Field.bspline(leaves[1], out_size, parameters, leaves[2]), Sampling.parse(mode, padding, corners)
        )
        grads = torch.autograd.grad(y, leaves, grad)
    return tuple(tensor.detach().to(dtype) for tensor in (y, *grads))


@pytest.mark.parametrize(
    "dtype, deterministic", [(torch.float32, False), (torch.bfloat16, True)], ids=["f32-fast", "bf16-deterministic"]
)
def test_lower_precision_meets_the_precision_rule(dtype, deterministic):
    """The row coefficients, each displacement and the row sums are float64 whatever the data's dtype, and the
    control points' gradient is rounded once."""
    tensors, grid = bspline_case("fractional", True, channels=3, dtype=dtype, seed=25)
    ours = _run("triton", _on(DEVICE, tensors), grid, "bilinear", "border", True, OUT_SIZE, deterministic=deterministic)
    golden = _golden(tensors, grid, "bilinear", "border", True, OUT_SIZE)
    competitor = _competitor(tensors, grid, "bilinear", "border", True, OUT_SIZE)
    for name, mine, gold, theirs in zip(NAMES, ours, golden, competitor):
        assert mine.dtype == dtype, name
        report = precision.compare(f"{DTYPE_IDS[dtype]} {name}", mine.cpu(), gold, theirs, dtype)
        assert report.passed, str(report)


def test_explain_plans_a_cuda_bspline_call_from_shapes_alone():
    """Meta tensors and device="cuda": a B-spline's backward walks patches one row high, untuned (its partial row
    sums follow block_w), the same shape in both modes."""
    volume = torch.empty(1, 2, 32, 32, 32, device="meta")
    control_points = torch.empty(1, 3, 8, 8, 8, device="meta")
    grad = torch.empty(1, 2, 24, 24, 24, device="meta")
    plans = [
        gs.explain(
            volume, control_points, grad, field_kind="bspline", size=(24, 24, 24), device="cuda", deterministic=flag
        )
        for flag in (False, True)
    ]
    for plan in plans:
        assert plan.tile.block_h == plan.tile.block_d == 1 and not plan.tuned
        assert "control points' gradient from the walk's row sums, summed in float64" in str(plan)
    assert plans[0].tile == plans[1].tile
    forward = gs.explain(volume, control_points, field_kind="bspline", size=(24, 24, 24), device="cuda")
    assert forward.stage.value == "forward"
