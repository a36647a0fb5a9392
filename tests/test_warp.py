"""The fused warp: sampling at identity + displacement with no grid tensor, on the CPU engines and through torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import DTYPE_IDS, competitor_warp, poisoned_allocations

import gridsampler3d as gs
from gridsampler3d import precision, reference
from gridsampler3d.sampling import FieldKind
from gridsampler3d.tools.bench.runner import plumbed_grid

# The engine splits even these small calls into parts on its threads, as it splits a large one.
pytestmark = pytest.mark.usefixtures("split_small_calls")

# Compile time bounds what the Numba engine is asked here: each (mode, padding,
# align_corners) builds its own kernels. These cover every padding, both align_corners and
# every interpolation; the reference runs the whole matrix.
NUMBA_MODES = [
    ("bilinear", "border", True),
    ("bilinear", "zeros", True),
    ("bilinear", "reflection", False),
    ("nearest", "zeros", True),
    ("bicubic", "reflection", False),
    ("bicubic", "border", True),
]
FULL_MATRIX = [
    (mode, padding, corners)
    for mode in ("bilinear", "nearest", "bicubic")
    for padding in ("zeros", "border", "reflection")
    for corners in (True, False)
]


def warp_case(batch=2, channels=3, size=(5, 6, 7), magnitude=2.5, dtype=torch.float64, seed=0):
    """(grad, volume, displacement): displacements up to ``magnitude`` voxels, so that points leave the volume."""
    generator = torch.Generator().manual_seed(seed)
    volume = torch.randn((batch, channels) + size, generator=generator, dtype=torch.float64)
    grad = torch.randn((batch, channels) + size, generator=generator, dtype=torch.float64)
    displacement = magnitude * (2 * torch.rand((batch, 3) + size, generator=generator, dtype=torch.float64) - 1)
    return grad.to(dtype), volume.to(dtype), displacement.to(dtype)


def _golden(grad, volume, displacement, mode, padding, corners, output_mask=(True, True)):
    """The float64 reference of the fused warp on the (upcast) operands: y, dvolume, ddisplacement."""
    args = (gs.Interpolation[mode.upper()], gs.Padding[padding.upper()], corners)
    x, field = volume.double().numpy(), displacement.double().numpy()
    y = torch.from_numpy(reference.warp_fwd(x, field, *args))
    dx, dfield = reference.warp_bwd(grad.double().numpy(), x, field, *args, output_mask=output_mask)
    return y, (None if dx is None else torch.from_numpy(dx)), (None if dfield is None else torch.from_numpy(dfield))


@pytest.mark.parametrize("case", FULL_MATRIX, ids=lambda case: "-".join(map(str, case)))
def test_reference_warp_is_the_explicit_grid_warp(case):
    """The golden agrees with sampling at the normalised grid of the same positions, to rounding.

    The explicit grid normalises each position and F.grid_sample unnormalises it back,
    which moves it by a few ulps; with values and gradients of order 1 and positions below
    10, that moves results by far less than 1e-12.
    """
    mode, padding, corners = case
    grad, volume, displacement = warp_case()
    y, dx, dfield = _golden(grad, volume, displacement, mode, padding, corners)
    x, field = volume.clone().requires_grad_(), displacement.clone().requires_grad_()
    grid = plumbed_grid(field, corners)
    sample = gs.grid_sample if mode == "bicubic" else F.grid_sample
    y_grid = sample(x, grid, mode, padding, corners)
    dx_grid, dfield_grid = torch.autograd.grad(y_grid, (x, field), grad)
    for name, ours, theirs in (("y", y, y_grid), ("dx", dx, dx_grid), ("ddisplacement", dfield, dfield_grid)):
        assert torch.allclose(ours, theirs, rtol=0, atol=1e-12), (name, float((ours - theirs).abs().max()))


@pytest.mark.parametrize("case", NUMBA_MODES, ids=lambda case: "-".join(map(str, case)))
def test_numba_float64_is_bitwise_the_reference(case):
    mode, padding, corners = case
    grad, volume, displacement = warp_case(seed=1)
    # a few points far outside, and some exactly on voxel centres and bounds
    displacement[0, 2, 0, 0, :3] = torch.tensor([-40.0, 37.5, 1e9], dtype=torch.float64)
    displacement[1, :, 1] = torch.round(displacement[1, :, 1])
    y = gs.warp3d(volume, displacement, mode, padding, corners, backend="numba")
    dx, dfield = gs.warp3d_backward(grad, volume, displacement, mode, padding, corners, backend="numba")
    y_ref, dx_ref, dfield_ref = _golden(grad, volume, displacement, mode, padding, corners)
    assert torch.equal(y, y_ref)
    assert torch.equal(dx, dx_ref)
    assert torch.equal(dfield, dfield_ref)


@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_non_finite_displacements_follow_the_golden(backend):
    grad, volume, displacement = warp_case(seed=2)
    displacement[0, 0, 0, 0, 0] = float("nan")
    displacement[0, 1, 1, 2, 3] = float("inf")
    displacement[1, 2, 2, 3, 4] = -float("inf")
    for padding in ("zeros", "border"):
        y = gs.warp3d(volume, displacement, "bilinear", padding, True, backend=backend)
        dx, dfield = gs.warp3d_backward(grad, volume, displacement, "bilinear", padding, True, backend=backend)
        y_ref, dx_ref, dfield_ref = _golden(grad, volume, displacement, "bilinear", padding, True)
        for ours, gold in ((y, y_ref), (dx, dx_ref), (dfield, dfield_ref)):
            assert torch.equal(ours.isnan(), gold.isnan())
            assert torch.equal(torch.nan_to_num(ours), torch.nan_to_num(gold))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=DTYPE_IDS.get)
def test_lower_precision_meets_the_precision_rule(dtype):
    """The precision rule against the float64 golden of the same operands, PyTorch's plumbed step the competitor."""
    grad, volume, displacement = warp_case(batch=2, channels=5, size=(6, 7, 8), dtype=dtype, seed=3)
    y = gs.warp3d(volume, displacement, "bilinear", "border", True, backend="numba")
    dx, dfield = gs.warp3d_backward(grad, volume, displacement, "bilinear", "border", True, backend="numba")
    golden = _golden(grad, volume, displacement, "bilinear", "border", True)
    competitor = competitor_warp(grad, volume, displacement, "bilinear", "border", True)
    for name, ours, gold, theirs in zip(("y", "dvolume", "ddisplacement"), (y, dx, dfield), golden, competitor):
        assert ours.dtype == dtype and ours.shape == gold.shape, name
        report = precision.compare(name, ours, gold, theirs, dtype)
        assert report.passed, str(report)


@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_layouts_strides_and_output_mask(backend):
    """Channels-last volume, (N, D, H, W, 3) and sliced displacements, and each output alone, give the same values."""
    grad, volume, displacement = warp_case(seed=4)
    y, dx, dfield = _golden(grad, volume, displacement, "bilinear", "border", True)
    # channels-last storage of the volume, NDHWC data format
    y_cl = gs.warp3d(volume.permute(0, 2, 3, 4, 1).contiguous(), displacement, data_format="NDHWC", backend=backend)
    assert torch.equal(y_cl, y.permute(0, 2, 3, 4, 1))
    # displacement as (N, D, H, W, 3), and its gradient back in that layout
    field_last = displacement.permute(0, 2, 3, 4, 1).contiguous()
    dx_last, dfield_last = gs.warp3d_backward(grad, volume, field_last, displacement_format="NDHW3", backend=backend)
    assert torch.equal(dx_last, dx) and torch.equal(dfield_last, dfield.permute(0, 2, 3, 4, 1))
    assert dfield_last.is_contiguous()
    # a sliced, non-contiguous displacement is read in place
    wide = torch.zeros(2, 5, 5, 6, 14, dtype=torch.float64)
    wide[:, 1:4, :, :, ::2] = displacement
    strided = wide[:, 1:4, :, :, ::2]
    assert torch.equal(gs.warp3d(volume, strided, backend=backend), y)
    only_dx, none = gs.warp3d_backward(grad, volume, displacement, output_mask=(True, False), backend=backend)
    none_dx, only_dfield = gs.warp3d_backward(grad, volume, displacement, output_mask=(False, True), backend=backend)
    assert none is None and none_dx is None
    assert torch.equal(only_dx, dx) and torch.equal(only_dfield, dfield)
    # NumPy in, NumPy out
    y_np = gs.warp3d(volume.numpy(), displacement.numpy(), backend=backend)
    assert isinstance(y_np, np.ndarray) and np.array_equal(y_np, y.numpy())


def test_every_element_is_written_and_no_grid_is_allocated():
    """Poisoned allocations show any element left unwritten; no (N, D, H, W, 3) tensor is made, forward or backward."""
    grad, volume, displacement = warp_case(batch=1, channels=2, size=(4, 5, 6), seed=5)
    grid_shape = (1, 4, 5, 6, 3)
    y_ref, dx_ref, dfield_ref = _golden(grad, volume, displacement, "bilinear", "zeros", True)
    with poisoned_allocations() as shapes:
        y = gs.warp3d(volume, displacement, "bilinear", "zeros", True, backend="numba")
        dx, dfield = gs.warp3d_backward(grad, volume, displacement, "bilinear", "zeros", True, backend="numba")
    assert shapes, "the outputs did not come from torch.empty / empty_like"
    assert grid_shape not in shapes, shapes
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref) and torch.equal(dfield, dfield_ref)


def test_identity_and_whole_voxel_shifts_are_exact():
    volume = torch.randn(2, 3, 6, 5, 7, dtype=torch.float64)
    assert torch.equal(gs.warp(volume, torch.zeros(2, 3, 6, 5, 7, dtype=torch.float64)), volume)
    shift = torch.zeros(2, 3, 6, 5, 7, dtype=torch.float64)
    shift[:, 2] = 1.0  # one voxel along x: output[..., i] = volume[..., i + 1]
    shift[:, 0] = -1.0  # and one voxel back along z
    shifted = gs.warp(volume, shift, padding_mode="zeros")
    assert torch.equal(shifted[:, :, 1:, :, :-1], volume[:, :, :-1, :, 1:])
    assert torch.equal(shifted[..., -1], torch.zeros_like(shifted[..., -1]))


def test_errors_name_the_operand():
    volume = torch.zeros(2, 3, 6, 5, 7)
    with pytest.raises(ValueError, match=r"displacement's dimension 1 must be 3 \(dz, dy, dx\)"):
        gs.warp(volume, torch.zeros(2, 2, 6, 5, 7))
    with pytest.raises(ValueError, match=r"displacement's last dimension must be 3"):
        gs.warp(volume, torch.zeros(2, 6, 5, 7, 2), displacement_format="NDHW3")
    with pytest.raises(ValueError, match=r"spatial sizes \(D, H, W\) must equal volume's \(6, 5, 7\)"):
        gs.warp(volume, torch.zeros(2, 3, 6, 5, 8))
    with pytest.raises(ValueError, match=r"batch size N must equal volume's \(2\)"):
        gs.warp3d(volume, torch.zeros(1, 3, 6, 5, 7))
    with pytest.raises(TypeError, match=r"displacement must have the same dtype as volume"):
        gs.warp(volume, torch.zeros(2, 3, 6, 5, 7, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"displacement_format must be 'N3DHW' or 'NDHW3'"):
        gs.warp(volume, torch.zeros(2, 3, 6, 5, 7), displacement_format="NCDHW")
    with pytest.raises(ValueError, match=r"grad's spatial sizes \(Do, Ho, Wo\) must equal the volume's \(6, 5, 7\)"):
        gs.warp3d_backward(torch.zeros(2, 3, 6, 5, 6), volume, torch.zeros(2, 3, 6, 5, 7))
    with pytest.raises(TypeError, match=r"output_mask must be a pair of bools \(dvolume, ddisplacement\)"):
        gs.warp3d_backward(volume, volume, torch.zeros(2, 3, 6, 5, 7), output_mask=(True,))
    with pytest.raises(ValueError, match=r"steps must be an int >= 0"):
        gs.integrate_velocity(torch.zeros(1, 3, 4, 4, 4), steps=-1)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_gradcheck_and_double_backward(mode):
    generator = torch.Generator().manual_seed(6)
    size = (4, 5, 6) if mode == "bilinear" else (3, 3, 4)  # bicubic's 64 taps: a smaller volume
    volume = torch.randn(1, 2, *size, generator=generator, dtype=torch.float64, requires_grad=True)
    displacement = (1.5 * torch.randn(1, 3, *size, generator=generator, dtype=torch.float64)).requires_grad_()

    def warp(volume, displacement):
        return gs.warp(volume, displacement, mode, "reflection", True)

    # fast_mode: the Jacobians against random vectors rather than entry by entry (a wrong entry still changes the
    # product); test_self_warp_gradients below checks the warp's Jacobian entry by entry.
    assert torch.autograd.gradcheck(warp, (volume, displacement), fast_mode=True)
    assert torch.autograd.gradgradcheck(warp, (volume, displacement), fast_mode=True)


def test_self_warp_gradients():
    """warp(flow, flow): the same tensor is both inputs; autograd sums both gradients into it."""
    generator = torch.Generator().manual_seed(7)
    flow = (0.8 * torch.randn(1, 3, 4, 5, 6, generator=generator, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(lambda field: gs.warp(field, field), (flow,))


def _integrate_reference(velocity, steps):
    """Scaling and squaring composed from PyTorch's own pieces in float64: plumbed grid, F.grid_sample."""
    displacement = velocity / 2**steps
    for _ in range(steps):
        displacement = displacement + F.grid_sample(
            displacement, plumbed_grid(displacement, True), "bilinear", "zeros", True
        )
    return displacement


def test_integrate_velocity_matches_the_reference_composition():
    generator = torch.Generator().manual_seed(8)
    velocity = (3.0 * torch.randn(2, 3, 6, 7, 8, generator=generator, dtype=torch.float64)).requires_grad_()
    ours = gs.integrate_velocity(velocity, steps=5)
    theirs = _integrate_reference(velocity, steps=5)
    # Each step's explicit grid round trip moves positions by a few ulps (see
    # test_reference_warp_is_the_explicit_grid_warp); five compositions stay far below 1e-11.
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-11), float((ours - theirs).abs().max())
    weights = torch.randn(ours.shape, generator=generator, dtype=torch.float64)
    (ours_grad,) = torch.autograd.grad((ours * weights).sum(), velocity)
    (theirs_grad,) = torch.autograd.grad((theirs * weights).sum(), velocity)
    assert torch.allclose(ours_grad, theirs_grad, rtol=0, atol=1e-10)
    assert torch.equal(gs.integrate_velocity(velocity, steps=0), velocity)
    # (N, D, H, W, 3) in, the same layout out
    last = gs.integrate_velocity(velocity.detach().permute(0, 2, 3, 4, 1), steps=5, displacement_format="NDHW3")
    assert torch.equal(last, ours.detach().permute(0, 2, 3, 4, 1))


def test_torch_compile_fullgraph_and_opcheck():
    generator = torch.Generator().manual_seed(9)
    volume = torch.randn(1, 2, 4, 5, 6, generator=generator, dtype=torch.float64, requires_grad=True)
    displacement = torch.randn(1, 3, 4, 5, 6, generator=generator, dtype=torch.float64, requires_grad=True)

    def step(volume, displacement):
        return (gs.warp(volume, displacement) ** 2).sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    eager_grads = torch.autograd.grad(step(volume, displacement), (volume, displacement))
    compiled_grads = torch.autograd.grad(compiled(volume, displacement), (volume, displacement))
    for eager, compiled_grad in zip(eager_grads, compiled_grads):
        assert torch.equal(eager, compiled_grad)
    field = (displacement.detach(), None, int(FieldKind.DISPLACEMENT), [], None)
    torch.library.opcheck(torch.ops.gridsampler3d.sample, (volume.detach(), *field, 0, 1, True))
    torch.library.opcheck(
        torch.ops.gridsampler3d.sample_backward,
        (torch.randn_like(volume), volume.detach(), *field, 0, 1, True, [True, True, False]),
    )


def test_warp3d_module_and_autocast():
    volume, displacement = torch.randn(1, 2, 4, 5, 6), torch.randn(1, 3, 4, 5, 6)
    module = gs.Warp3d(padding_mode="zeros")
    assert torch.equal(module(volume, displacement), gs.warp(volume, displacement, padding_mode="zeros"))
    assert "padding_mode='zeros'" in repr(module)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = gs.warp(volume.bfloat16(), displacement.bfloat16())
    assert out.dtype == torch.float32
    assert torch.equal(out, gs.warp(volume.bfloat16().float(), displacement.bfloat16().float()))
