"""The affine field on the Triton engine: against the float64 reference, and by the precision rule below float64.

The kernels compute each point's position from the voxel matrix (and add the
displacement where there is one); the backward walk reduces theta's gradient to row
moments that the engine sums in float64. Without a GPU the kernels run on CPU tensors
through Triton's interpreter (conftest sets TRITON_INTERPRET=1), so the sizes are tiny.
"""

import importlib.util

import pytest
import torch
from helpers import DTYPE_IDS, poisoned_allocations
from test_affine import NAMES, _explicit, _far_from_boundaries, _golden, affine_case

import gridsampler3d as gs
from gridsampler3d import precision

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU tensors run through the interpreter
OUT_SIZE = (3, 4, 5)
# The tricubic cases' output: four rows (the backward's programs take a row each), the interpreter's time goes with
# the programs times the 64 taps.
TRICUBIC_OUT_SIZE = (2, 2, 5)
# (mode, padding, align_corners, displaced, deterministic): both modes of each interpolation; tricubic's 64 taps
# are slow through the interpreter, so it runs twice only, on a smaller output and with zeros padding (border piles
# taps into the edge voxels, whose long buckets the interpreter walks slowly, three times the time): the padding
# acts on a position the same way whatever field gave it, and the trilinear and nearest cases here take the affine
# field through border and reflection.
CASES = [
    ("bilinear", "zeros", False, False, False),
    ("bilinear", "zeros", False, False, True),
    ("bilinear", "border", True, True, False),
    ("bilinear", "border", True, True, True),
    ("bilinear", "reflection", False, True, True),
    ("nearest", "reflection", True, True, False),
    ("nearest", "reflection", True, True, True),
    ("bicubic", "zeros", False, False, False),
    ("bicubic", "zeros", True, True, True),
]


def _run(backend, grad, volume, theta, displacement, mode, padding, corners, out_size=OUT_SIZE, **options):
    """(y, dvolume, dtheta, ddisplacement) from one backend."""
    y = gs.affine_warp3d(volume, theta, out_size, displacement, mode, padding, corners, backend=backend)
    grads = gs.affine_warp3d_backward(
        grad, volume, theta, out_size, displacement, mode, padding, corners, backend=backend, **options
    )
    return (y, *grads)


def _on(device, *tensors):
    return tuple(None if tensor is None else tensor.to(device) for tensor in tensors)


@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(map(str, case)))
def test_float64_matches_the_reference(case):
    """Each output within 1e-12 of the reference's scale; outputs allocated NaN-poisoned, so an element a kernel
    misses shows up. dvolume and dtheta sum in other orders than the reference's (atomics or buckets; row
    moments), so they are not compared bit for bit."""
    mode, padding, corners, displaced, deterministic = case
    out_size = TRICUBIC_OUT_SIZE if mode == "bicubic" else OUT_SIZE
    grad, volume, theta, displacement = affine_case(1, 2, (4, 5, 6), out_size, displaced, seed=CASES.index(case))
    assert _far_from_boundaries(volume, theta, displacement, corners, out_size, mode)
    with poisoned_allocations():
        ours = _run(
            "triton",
            *_on(DEVICE, grad, volume, theta, displacement),
            mode,
            padding,
            corners,
            out_size,
            deterministic=deterministic,
        )
    golden = _golden(grad, volume, theta, displacement, mode, padding, corners, out_size)
    for name, mine, gold in zip(NAMES, ours, golden):
        assert (mine is None) == (gold is None), name
        if gold is None:
            continue
        scale = max(1.0, float(gold.abs().max()))
        error = float((mine.cpu() - gold).abs().max())
        assert error <= 1e-12 * scale, f"{case} {name}: {error}"


def test_deterministic_mode_gives_the_same_bits_twice():
    grad, volume, theta, displacement = _on(DEVICE, *affine_case(1, 2, (4, 5, 6), OUT_SIZE, True, seed=7))
    first, second = (
        _run("triton", grad, volume, theta, displacement, "bilinear", "border", False, deterministic=True)
        for _ in range(2)
    )
    for name, one, two in zip(NAMES, first, second):
        assert torch.equal(one, two), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
def test_lower_precision_meets_the_precision_rule(dtype):
    grad, volume, theta, displacement = affine_case(1, 3, (4, 5, 6), OUT_SIZE, True, dtype=dtype, seed=8)
    ours = _run("triton", *_on(DEVICE, grad, volume, theta, displacement), "bilinear", "zeros", True)
    golden = _golden(grad, volume, theta, displacement, "bilinear", "zeros", True, OUT_SIZE)
    competitor = _explicit(grad, volume, theta, displacement, "bilinear", "zeros", True, OUT_SIZE)
    for name, mine, gold, theirs in zip(NAMES, ours, golden, competitor):
        assert mine.dtype == dtype, name
        report = precision.compare(name, mine.cpu(), gold, theirs, dtype)
        assert report.passed, str(report)


def test_each_output_alone():
    grad, volume, theta, displacement = _on(DEVICE, *affine_case(1, 2, (4, 5, 6), OUT_SIZE, True, seed=9))
    # deterministic: a GPU's atomics would add dvolume in another order each time
    whole = gs.affine_warp3d_backward(grad, volume, theta, OUT_SIZE, displacement, backend="triton", deterministic=True)
    for index, mask in enumerate(((True, False, False), (False, True, False), (False, False, True))):
        alone = gs.affine_warp3d_backward(
            grad, volume, theta, OUT_SIZE, displacement, output_mask=mask, backend="triton", deterministic=True
        )
        assert all(alone[other] is None for other in range(3) if other != index)
        assert torch.equal(alone[index], whole[index])
