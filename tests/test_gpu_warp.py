"""The fused warp on the Triton engine: against the float64 reference, and by the precision rule below float64.

The kernels read the displacement where they read a grid (``RULE.field``) and write
d(displacement) in the displacement's own layout. Without a GPU they run on CPU tensors
through Triton's interpreter (conftest sets TRITON_INTERPRET=1), so the sizes are tiny and
odd: 3 x 4 x 5 voxels, displacements of about 2.5 voxels, so that many points leave the volume.
"""

import importlib.util

import pytest
import torch
from helpers import DTYPE_IDS, MATRIX, assert_warp_matches, make_warp_case, matrix_id, poisoned_allocations

import gridsampler3d as gs
from gridsampler3d.backends import BACKENDS
from gridsampler3d.layout import memory_format_of
from gridsampler3d.sampling import Field, Outputs, Sampling

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU tensors run through the interpreter
NAMES = ("y", "dvolume", "ddisplacement")


def _on(device, *tensors):
    return tuple(t.to(device) for t in tensors)


def _warp_both_ways(
    backend, grad, volume, displacement, mode, padding, align_corners, output_mask=(True, True), **options
):
    """(y, dvolume, ddisplacement) from one backend."""
    formats = {key: options.pop(key) for key in ("data_format", "displacement_format") if key in options}
    y = gs.warp3d(volume, displacement, mode, padding, align_corners, backend=backend, **formats)
    return (
        y,
        *gs.warp3d_backward(
            grad, volume, displacement, mode, padding, align_corners, output_mask, backend=backend, **formats, **options
        ),
    )


def assert_near_reference(
    grad, volume, displacement, mode, padding, align_corners, output_mask=(True, True), label="", **options
):
    """float64: each output within 1e-12 of the reference, relative to the element or, where terms cancel,
    to the output's largest finite magnitude; NaN and infinities exactly where the reference has them.

    The forward and d(displacement) sum in the reference's order and come out equal bit for
    bit; dvolume adds the points into a voxel in another order (atomics, or buckets)."""
    ours = _warp_both_ways(
        "triton", *_on(DEVICE, grad, volume, displacement), mode, padding, align_corners, output_mask, **options
    )
    options.pop("deterministic", None)
    expected = _warp_both_ways(
        "reference", grad, volume, displacement, mode, padding, align_corners, output_mask, **options
    )
    for name, mine, theirs in zip(NAMES, ours, expected):
        if theirs is None:
            assert mine is None, f"{label} {name}: not asked for, but computed"
            continue
        assert mine is not None, f"{label} {name}: asked for, but None"
        assert mine.stride() == theirs.stride(), f"{label} {name}: strides {mine.stride()}, not {theirs.stride()}"
        mine = mine.cpu()
        assert torch.equal(torch.isnan(mine), torch.isnan(theirs)), f"{label} {name}: NaN elsewhere"
        assert torch.equal(torch.isinf(mine), torch.isinf(theirs)), f"{label} {name}: infinities elsewhere"
        assert torch.equal(mine[torch.isinf(mine)], theirs[torch.isinf(theirs)]), f"{label} {name}: infinities"
        finite = torch.isfinite(theirs)
        scale = float(theirs[finite].abs().max()) if bool(finite.any()) else 0.0
        torch.testing.assert_close(
            mine[finite],
            theirs[finite],
            rtol=1e-12,
            atol=1e-12 * scale,
            msg=lambda message, name=name: f"{label} {name}: {message}",
        )
    return ours


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
@pytest.mark.parametrize("attributes", MATRIX, ids=matrix_id)
def test_float64_matches_the_reference(attributes, deterministic):
    """Outputs are allocated NaN-poisoned, so an element a kernel misses shows up."""
    mode, padding, align_corners = attributes
    case = make_warp_case(1, 2, seed=MATRIX.index(attributes))
    with poisoned_allocations():
        assert_near_reference(
            *case, mode, padding, align_corners, label=matrix_id(attributes), deterministic=deterministic
        )


@pytest.mark.parametrize(
    "padding, align_corners", [("zeros", False), ("border", True), ("reflection", False), ("reflection", True)]
)
def test_bicubic_float64_matches_the_reference(padding, align_corners):
    case = make_warp_case(seed=3, spread=1.5)
    assert_near_reference(*case, "bicubic", padding, align_corners, label=f"bicubic {padding}", deterministic=False)


def test_bicubic_deterministic_dvolume_matches_the_reference():
    """The gather sorts (point, tap) entries by voxel: the reference's order, bit for bit."""
    grad, volume, displacement = make_warp_case(1, 2, (2, 3, 4), seed=4, spread=1.0)
    ours = gs.warp3d_backward(
        *_on(DEVICE, grad, volume, displacement),
        "bicubic",
        "zeros",
        False,
        (True, False),
        backend="triton",
        deterministic=True,
    )[0]
    expected = gs.warp3d_backward(
        grad, volume, displacement, "bicubic", "zeros", False, (True, False), backend="reference"
    )[0]
    assert torch.equal(ours.cpu(), expected)


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
@pytest.mark.parametrize("output_mask", [(True, False), (False, True)], ids=["dvolume", "ddisplacement"])
def test_each_output_alone(output_mask, deterministic):
    case = make_warp_case(seed=5)
    assert_near_reference(
        *case, "bilinear", "zeros", False, output_mask, label=str(output_mask), deterministic=deterministic
    )


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
def test_channels_last_volume_and_ndhw3_displacement(deterministic):
    """A volume stored channels_last_3d and a displacement given as (N, D, H, W, 3): read in place,
    dvolume stored channels-last, ddisplacement (N, D, H, W, 3) contiguous."""
    grad, volume, displacement = make_warp_case(2, 3, seed=6, displacement_format="NDHW3")
    grad, volume = (tensor.contiguous(memory_format=torch.channels_last_3d) for tensor in (grad, volume))
    y, dvolume, ddisplacement = assert_near_reference(
        grad,
        volume,
        displacement,
        "bilinear",
        "border",
        True,
        label="channels-last",
        deterministic=deterministic,
        displacement_format="NDHW3",
    )
    assert y.is_contiguous(memory_format=torch.channels_last_3d)
    assert dvolume.is_contiguous(memory_format=torch.channels_last_3d)
    assert ddisplacement.shape == displacement.shape and ddisplacement.is_contiguous()


def test_strided_displacement_is_read_in_place():
    """A displacement sliced out of a larger tensor (no unit stride anywhere) and a channels-last volume."""
    grad, volume, _ = make_warp_case(2, 3, seed=7)
    wider = 2.5 * torch.randn(2, 5, 6, 4, 11, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    displacement = wider[:, 1:4, ::2, :, ::2][:, :, :, :, :5]
    assert displacement.shape == (2, 3, 3, 4, 5) and displacement.stride()[-1] == 2
    assert_near_reference(
        grad,
        volume.contiguous(memory_format=torch.channels_last_3d),
        displacement,
        "bilinear",
        "zeros",
        False,
        label="strided",
        deterministic=False,
    )


@pytest.mark.parametrize("channels_last", [False, True], ids=["N3DHW-layout", "NDHW3-layout"])
def test_ddisplacement_is_written_in_its_own_layout(channels_last):
    """The engine writes d(displacement) through the displacement's strides: no (N, D, H, W, 3)
    staging tensor, no copy, and every element written (allocations are poisoned)."""
    grad, volume, displacement = make_warp_case(1, 2, seed=9)
    if channels_last:
        displacement = displacement.permute(0, 2, 3, 4, 1).contiguous().permute(0, 4, 1, 2, 3)
    grad, volume, displacement = _on(DEVICE, grad, volume, displacement)
    with poisoned_allocations() as shapes:
        _, ddisplacement, _ = BACKENDS["triton"].backward(
            grad,
            volume,
            Field.displacement(displacement),
            Sampling.parse("bilinear", "border", True),
            Outputs(dx=False, dfield=True),
            False,
        )
    assert ddisplacement.stride() == displacement.stride()
    assert memory_format_of(ddisplacement) == memory_format_of(displacement)
    assert (1, 3, 4, 5, 3) not in shapes and shapes.count((1, 3, 3, 4, 5)) == 1
    expected = gs.warp3d_backward(
        grad.cpu(), volume.cpu(), displacement.cpu(), output_mask=(False, True), backend="reference"
    )[1]
    assert torch.equal(ddisplacement.cpu(), expected)


LOWER_PRECISION = [
    (torch.float32, False),
    (torch.float32, True),
    (torch.bfloat16, False),
    (torch.bfloat16, True),
    (torch.float16, True),
]


LOWER_PRECISION_IDS = [f"{DTYPE_IDS[dtype]}-{'deterministic' if flag else 'fast'}" for dtype, flag in LOWER_PRECISION]


@pytest.mark.parametrize("dtype, deterministic", LOWER_PRECISION, ids=LOWER_PRECISION_IDS)
def test_lower_precision_follows_the_rule(dtype, deterministic):
    """Half types: the fast dx sums in float32, the deterministic one in float64, rounded once.
    (The deterministic runs pad with zeros: reflection's longer buckets cost the interpreter seconds.)"""
    case = _on(DEVICE, *make_warp_case(dtype=dtype, seed=10))
    padding = "zeros" if deterministic else "reflection"
    assert_warp_matches(
        *case,
        "bilinear",
        padding,
        False,
        backend="triton",
        label=f"{DTYPE_IDS[dtype]} {padding}",
        deterministic=deterministic,
    )


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
def test_lower_precision_channels_last_follows_the_rule(dtype, mode):
    case = _on(DEVICE, *make_warp_case(2, 3, dtype=dtype, seed=11, data_format="NDHWC", displacement_format="NDHW3"))
    assert_warp_matches(
        *case,
        mode,
        "border",
        True,
        "NDHWC",
        "NDHW3",
        backend="triton",
        label=f"{mode} {DTYPE_IDS[dtype]} NDHWC",
        deterministic=False,
    )


def test_bicubic_float32_follows_the_rule():
    case = _on(DEVICE, *make_warp_case(dtype=torch.float32, seed=12, spread=1.5))
    assert_warp_matches(*case, "bicubic", "border", True, backend="triton", label="bicubic f32", deterministic=False)


NON_FINITE = (float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 2.0**31)


@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_non_finite_displacements_follow_the_reference(mode, padding):
    """NaN, infinities and values past the int32 range, in each component: the padding and
    safe-range rules of a grid, applied to the position."""
    grad, volume, displacement = make_warp_case(1, 2, seed=13)
    flat = displacement.view(-1)
    positions = torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(14))[: 3 * len(NON_FINITE)]
    flat[positions] = torch.tensor(NON_FINITE * 3, dtype=flat.dtype)
    assert_near_reference(
        grad,
        volume,
        displacement,
        mode,
        padding,
        True,
        label=f"{mode} {padding} non-finite",
        deterministic=mode == "nearest",
    )
