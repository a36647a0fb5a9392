"""The affine field: sampling at F.affine_grid's positions (plus a displacement) with no grid tensor.

The golden is the reference (NumPy float64), which is checked against PyTorch's explicit
path, ``F.affine_grid`` then ``F.grid_sample`` (with the displacement added in normalised
units), differentiated by autograd. The thetas are generic (a rotation, a scale and a shift
drawn at random), so no position lies within 1e-9 voxels of a cell boundary or of a
nearest-rounding midpoint: the explicit path and the voxel matrix differ there by a few
ulps of float64, and a point an ulp moves across a boundary would change dgrid, dtheta and
nearest's values by a jump, not by rounding. ``_far_from_boundaries`` checks that of every
case.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import DTYPE_IDS, poisoned_allocations

import gridsampler3d as gs
from gridsampler3d import precision, reference
from gridsampler3d.affine import explicit_grid, theta_from_voxel_matrix, voxel_matrix
from gridsampler3d.sampling import FieldKind, Outputs, Sampling

# The engine splits even these small calls into parts on its threads, as it splits a large one.
pytestmark = pytest.mark.usefixtures("split_small_calls")

FULL_MATRIX = [
    (mode, padding, corners, displaced)
    for mode in ("bilinear", "nearest", "bicubic")
    for padding in ("zeros", "border", "reflection")
    for corners in (True, False)
    for displaced in (False, True)
]
# Compile time bounds what the Numba engine is asked: every interpolation, padding and
# align_corners, each with and without a displacement somewhere.
NUMBA_MODES = [
    ("bilinear", "border", True, False),
    ("bilinear", "zeros", False, True),
    ("bilinear", "reflection", False, False),
    ("nearest", "zeros", True, True),
    ("bicubic", "reflection", False, True),
    ("bicubic", "border", True, False),
]
NAMES = ("y", "dvolume", "dtheta", "ddisplacement")


def affine_case(batch=2, channels=3, size=(5, 6, 7), out_size=(4, 6, 9), displaced=True, dtype=torch.float64, seed=0):
    """(grad, volume, theta, displacement or None): a generic theta (rotation, scale, shear, shift) and
    displacements up to 1.5 voxels, so that points leave the volume on several sides."""
    generator = torch.Generator().manual_seed(seed)
    volume = torch.randn((batch, channels) + size, generator=generator, dtype=torch.float64)
    grad = torch.randn((batch, channels) + out_size, generator=generator, dtype=torch.float64)
    theta = torch.eye(3, 4, dtype=torch.float64).repeat(batch, 1, 1)
    theta[:, :, :3] += 0.3 * torch.randn(batch, 3, 3, generator=generator, dtype=torch.float64)
    theta[:, :, 3] += 0.3 * torch.randn(batch, 3, generator=generator, dtype=torch.float64)
    displacement = None
    if displaced:
        displacement = 1.5 * (2 * torch.rand((batch, 3) + out_size, generator=generator, dtype=torch.float64) - 1)
        displacement = displacement.to(dtype)
    return grad.to(dtype), volume.to(dtype), theta.to(dtype), displacement


def _golden(grad, volume, theta, displacement, mode, padding, corners, out_size):
    """The float64 reference on the (upcast) operands: y, dvolume, dtheta, ddisplacement (None without one)."""
    kind = FieldKind.AFFINE if displacement is None else FieldKind.AFFINE_DISPLACEMENT
    rest = out_size if displacement is None else displacement.double().numpy()
    field = (theta.double().numpy(), rest)
    sampling = Sampling.parse(mode, padding, corners)
    y = reference.sample(volume.double().numpy(), field, kind, sampling)
    outputs = Outputs(True, displacement is not None, True)
    dx, dfield, dtheta = reference.sample_backward(
        grad.double().numpy(), volume.double().numpy(), field, kind, sampling, outputs
    )
    wrap = lambda array: None if array is None else torch.from_numpy(np.ascontiguousarray(array))  # noqa: E731
    return wrap(y), wrap(dx), wrap(dtheta), wrap(dfield)


def _explicit(grad, volume, theta, displacement, mode, padding, corners, out_size):
    """PyTorch's explicit path and its autograd gradients: y, dvolume, dtheta, ddisplacement."""
    leaves = [volume.clone().requires_grad_(), theta.clone().requires_grad_()]
    if displacement is not None:
        leaves.append(displacement.clone().requires_grad_())
    grid = explicit_grid(leaves[1], out_size, corners, tuple(volume.shape[2:]), leaves[2] if len(leaves) > 2 else None)
    sample = gs.grid_sample if mode == "bicubic" else F.grid_sample
    y = sample(leaves[0], grid, mode, padding, corners)
    grads = torch.autograd.grad(y, leaves, grad)
    return (y.detach(), *grads, *([None] if displacement is None else []))


def _far_from_boundaries(volume, theta, displacement, corners, out_size, mode):
    """Every position is further than 1e-9 voxels from where the sampling jumps (cell boundaries, midpoints)."""
    matrix = voxel_matrix(theta.double(), tuple(volume.shape[2:]), out_size, corners)
    d, h, w = torch.meshgrid(*[torch.arange(size, dtype=torch.float64) for size in out_size], indexing="ij")
    columns = torch.stack([w, h, d, torch.ones_like(w)], dim=-1)
    positions = torch.einsum("nij,dhwj->ndhwi", matrix, columns)
    if displacement is not None:
        positions = positions + displacement.double().permute(0, 2, 3, 4, 1).flip(-1)
    offset = 0.5 if mode == "nearest" else 0.0
    distance = ((positions - offset) - torch.round(positions - offset)).abs()
    return bool((distance > 1e-9).all())


def _assert_close(ours, theirs, tolerance, label):
    for name, mine, gold in zip(NAMES, ours, theirs):
        if gold is None:
            assert mine is None, f"{label} {name}: computed, not asked for"
            continue
        scale = max(1.0, float(gold.abs().max()))
        error = float((mine.double() - gold.double()).abs().max())
        assert error <= tolerance * scale, f"{label} {name}: {error} > {tolerance} x {scale}"


@pytest.mark.parametrize("case", FULL_MATRIX, ids=lambda case: "-".join(map(str, case)))
def test_reference_is_the_explicit_path(case):
    """The golden agrees with F.affine_grid + F.grid_sample and autograd to 1e-12 of each output's scale."""
    mode, padding, corners, displaced = case
    out_size = (4, 6, 9)
    grad, volume, theta, displacement = affine_case(displaced=displaced, out_size=out_size)
    assert _far_from_boundaries(volume, theta, displacement, corners, out_size, mode)
    ours = _golden(grad, volume, theta, displacement, mode, padding, corners, out_size)
    theirs = _explicit(grad, volume, theta, displacement, mode, padding, corners, out_size)
    _assert_close(ours, theirs, 1e-12, case)


@pytest.mark.parametrize("case", NUMBA_MODES, ids=lambda case: "-".join(map(str, case)))
def test_numba_float64_is_bitwise_the_reference(case):
    mode, padding, corners, displaced = case
    out_size = (4, 6, 9)
    grad, volume, theta, displacement = affine_case(displaced=displaced, out_size=out_size, seed=1)
    y = gs.affine_warp3d(volume, theta, out_size, displacement, mode, padding, corners, backend="numba")
    dx, dtheta, dfield = gs.affine_warp3d_backward(
        grad, volume, theta, out_size, displacement, mode, padding, corners, backend="numba"
    )
    golden = _golden(grad, volume, theta, displacement, mode, padding, corners, out_size)
    _assert_engine_matches((y, dx, dtheta, dfield), golden)


def _assert_engine_matches(ours, golden):
    """y, dvolume and ddisplacement bit for bit; dtheta to 1e-13 of its scale: the engine sums the points' terms
    row by row (row moments), the reference all at once (einsum), two float64 orders of the same terms."""
    for name, mine, gold in zip(NAMES, ours, golden):
        assert (mine is None) == (gold is None), name
        if gold is None:
            continue
        if name == "dtheta":
            scale = max(1.0, float(gold.abs().max()))
            assert torch.allclose(mine, gold, rtol=0, atol=1e-13 * scale), float((mine - gold).abs().max())
        else:
            assert torch.equal(mine, gold), (name, float((mine - gold).abs().max()))


def test_dtheta_bits_do_not_depend_on_the_thread_count():
    """theta's gradient is summed in float64 in a fixed order: the same bits on one thread and on two."""
    out_size = (9, 10, 11)
    grad, volume, theta, displacement = affine_case(
        batch=2, channels=2, size=(8, 9, 10), out_size=out_size, dtype=torch.float32, seed=2
    )
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            results.append(
                gs.affine_warp3d_backward(grad, volume, theta, out_size, displacement, "bilinear", "zeros", False)
            )
    finally:
        torch.set_num_threads(threads)
    for one, two in zip(*results):
        assert torch.equal(one, two)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=DTYPE_IDS.get)
def test_lower_precision_meets_the_precision_rule(dtype):
    """The precision rule against the float64 golden of the same operands, PyTorch's explicit path the competitor."""
    out_size = (5, 6, 7)
    grad, volume, theta, displacement = affine_case(channels=4, out_size=out_size, dtype=dtype, seed=3)
    y = gs.affine_warp3d(volume, theta, out_size, displacement, "bilinear", "border", True)
    dx, dtheta, dfield = gs.affine_warp3d_backward(
        grad, volume, theta, out_size, displacement, "bilinear", "border", True
    )
    golden = _golden(grad, volume, theta, displacement, "bilinear", "border", True, out_size)
    competitor = _explicit(grad, volume, theta, displacement, "bilinear", "border", True, out_size)
    for name, ours, gold, theirs in zip(NAMES, (y, dx, dtheta, dfield), golden, competitor):
        assert ours.dtype == dtype and ours.shape == gold.shape, name
        report = precision.compare(name, ours, gold, theirs, dtype)
        assert report.passed, str(report)


def test_layouts_output_mask_and_numpy():
    out_size = (4, 5, 6)
    grad, volume, theta, displacement = affine_case(out_size=out_size, seed=4)
    y = gs.affine_warp3d(volume, theta, out_size, displacement)
    dx, dtheta, dfield = gs.affine_warp3d_backward(grad, volume, theta, out_size, displacement)
    # channels-last volume and (N, Do, Ho, Wo, 3) displacement
    last = gs.affine_warp3d(
        volume.permute(0, 2, 3, 4, 1),
        theta,
        out_size,
        displacement.permute(0, 2, 3, 4, 1),
        data_format="NDHWC",
        displacement_format="NDHW3",
    )
    assert torch.equal(last, y.permute(0, 2, 3, 4, 1))
    # each output alone is the same
    alone = [
        gs.affine_warp3d_backward(grad, volume, theta, out_size, displacement, output_mask=mask)
        for mask in ((True, False, False), (False, True, False), (False, False, True))
    ]
    assert alone[0][1:] == (None, None) and torch.equal(alone[0][0], dx)
    assert alone[1][0] is None and alone[1][2] is None and torch.equal(alone[1][1], dtheta)
    assert alone[2][:2] == (None, None) and torch.equal(alone[2][2], dfield)
    # without a displacement there is no ddisplacement; size defaults to the volume's
    same = gs.affine_warp3d_backward(
        torch.ones(2, 3, 5, 6, 7, dtype=torch.float64), volume, theta, output_mask=(True, True, True)
    )
    assert same[2] is None and same[0].shape == volume.shape
    y_np = gs.affine_warp3d(volume.numpy(), theta.numpy(), out_size, displacement.numpy())
    assert isinstance(y_np, np.ndarray) and np.array_equal(y_np, y.numpy())


def test_no_grid_is_allocated_and_every_element_is_written():
    out_size = (4, 5, 6)
    grad, volume, theta, displacement = affine_case(batch=1, channels=2, out_size=out_size, seed=5)
    golden = _golden(grad, volume, theta, displacement, "bilinear", "zeros", False, out_size)
    with poisoned_allocations() as shapes:
        y = gs.affine_warp3d(volume, theta, out_size, displacement, backend="numba")
        grads = gs.affine_warp3d_backward(grad, volume, theta, out_size, displacement, backend="numba")
    assert shapes, "the outputs did not come from torch.empty / empty_like"
    assert (1, *out_size, 3) not in shapes, shapes
    _assert_engine_matches((y, *grads), golden)


def test_identity_theta_with_a_displacement_is_the_warp_bit_for_bit():
    _, volume, _, displacement = affine_case(out_size=(5, 6, 7), seed=6)
    identity = torch.eye(3, 4, dtype=torch.float64).repeat(2, 1, 1)
    for corners in (False, True):
        warped = gs.warp(volume, displacement, padding_mode="zeros", align_corners=corners)
        fused = gs.affine_warp(volume, identity, displacement=displacement, padding_mode="zeros", align_corners=corners)
        assert torch.equal(fused, warped)


def test_theta_round_trips_through_the_voxel_matrix():
    theta = affine_case(seed=7)[2]
    for corners in (False, True):
        matrix = voxel_matrix(theta, (5, 6, 7), (4, 6, 9), corners)
        again = theta_from_voxel_matrix(matrix, (5, 6, 7), (4, 6, 9), corners)
        assert torch.allclose(again, theta, rtol=0, atol=1e-14)


@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_non_finite_theta_follows_the_explicit_path(backend):
    out_size = (4, 5, 6)
    grad, volume, theta, displacement = affine_case(out_size=out_size, seed=8)
    theta[0, 0, 1] = float("nan")
    theta[1, 2, 3] = float("inf")
    y = gs.affine_warp3d(volume, theta, out_size, displacement, "bilinear", "border", backend=backend)
    grads = gs.affine_warp3d_backward(
        grad, volume, theta, out_size, displacement, "bilinear", "border", backend=backend
    )
    theirs = _explicit(grad, volume, theta, displacement, "bilinear", "border", False, out_size)
    for name, ours, gold in zip(NAMES, (y, *grads), theirs):
        assert torch.equal(ours.isnan(), gold.isnan()), name
        assert torch.allclose(torch.nan_to_num(ours), torch.nan_to_num(gold), rtol=0, atol=1e-12), name


def test_errors_name_the_operand_and_change_nothing():
    volume = torch.zeros(2, 3, 6, 5, 7)
    theta = torch.eye(3, 4).repeat(2, 1, 1)
    before = theta.clone()
    with pytest.raises(ValueError, match=r"theta must be \(N, 3, 4\) with volume's N \(2\)"):
        gs.affine_warp(volume, torch.zeros(2, 3, 3))
    with pytest.raises(ValueError, match=r"theta must be \(N, 3, 4\) with volume's N \(2\)"):
        gs.affine_warp(volume, torch.zeros(1, 3, 4))
    with pytest.raises(TypeError, match=r"theta must have the same dtype as volume"):
        gs.affine_warp(volume, theta.double())
    with pytest.raises(ValueError, match=r"size \(Do, Ho, Wo\) must be positive"):
        gs.affine_warp(volume, theta, (4, 0, 4))
    with pytest.raises(TypeError, match=r"size must be \(Do, Ho, Wo\), three ints"):
        gs.affine_warp(volume, theta, (4, 4))
    with pytest.raises(ValueError, match=r"displacement"):
        gs.affine_warp(volume, theta, (4, 4, 4), displacement=torch.zeros(2, 3, 4, 4, 5))
    with pytest.raises(ValueError, match=r"grad's spatial sizes \(Do, Ho, Wo\) must equal the output size \(6, 5, 7\)"):
        gs.affine_warp3d_backward(torch.zeros(2, 3, 6, 5, 6), volume, theta)
    with pytest.raises(TypeError, match=r"output_mask"):
        gs.affine_warp3d_backward(volume, volume, theta, output_mask=(True, True))
    assert torch.equal(theta, before)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_gradcheck_and_double_backward(mode):
    out_size = (3, 4, 5) if mode == "bilinear" else (2, 3, 3)  # bicubic's 64 taps: a smaller output
    _, volume, theta, displacement = affine_case(batch=1, channels=2, size=(4, 5, 6), out_size=out_size, seed=9)
    leaves = (volume.requires_grad_(), theta.requires_grad_(), displacement.requires_grad_())

    def warp(volume, theta, displacement):
        return gs.affine_warp(volume, theta, out_size, displacement=displacement, mode=mode, padding_mode="border")

    # fast_mode: the Jacobians against random vectors rather than entry by entry; a wrong entry still changes the
    # product, and test_reference_is_the_explicit_path holds every gradient to autograd's of the explicit path.
    assert torch.autograd.gradcheck(warp, leaves, fast_mode=True)
    assert torch.autograd.gradgradcheck(warp, leaves, fast_mode=True)


def test_torch_compile_export_and_opcheck():
    out_size = (3, 4, 5)
    _, volume, theta, displacement = affine_case(batch=1, channels=2, size=(4, 5, 6), out_size=out_size, seed=10)
    leaves = (volume.requires_grad_(), theta.requires_grad_(), displacement.requires_grad_())

    def step(volume, theta, displacement):
        return (gs.affine_warp(volume, theta, out_size, displacement=displacement) ** 2).sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    eager_grads = torch.autograd.grad(step(*leaves), leaves)
    compiled_grads = torch.autograd.grad(compiled(*leaves), leaves)
    for eager, compiled_grad in zip(eager_grads, compiled_grads):
        assert torch.equal(eager, compiled_grad)
    kind = int(FieldKind.AFFINE_DISPLACEMENT)
    operands = (volume.detach(), displacement.detach(), theta.detach(), kind, list(out_size), [], 0, 0, False)
    torch.library.opcheck(torch.ops.gridsampler3d.sample, operands)
    grad = torch.randn(1, 2, *out_size, dtype=volume.dtype)
    torch.library.opcheck(torch.ops.gridsampler3d.sample_backward, (grad, *operands, [True, True, True]))
    without = (volume.detach(), None, theta.detach(), int(FieldKind.AFFINE), list(out_size), [], 1, 1, True)
    torch.library.opcheck(torch.ops.gridsampler3d.sample_backward, (grad, *without, [True, False, True]))
    module = gs.AffineWarp3d(size=out_size, padding_mode="border")
    exported = torch.export.export(module, (volume.detach(), theta.detach()))
    assert torch.equal(exported.module()(volume.detach(), theta.detach()), module(volume.detach(), theta.detach()))


def test_module_repr_and_autocast():
    volume, theta = torch.randn(1, 2, 4, 5, 6), torch.eye(3, 4)[None] + 0.1
    module = gs.AffineWarp3d(size=(3, 4, 5), padding_mode="zeros")
    assert torch.equal(module(volume, theta), gs.affine_warp(volume, theta, (3, 4, 5), padding_mode="zeros"))
    assert "padding_mode='zeros'" in repr(module)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = gs.affine_warp(volume.bfloat16(), theta.bfloat16())
    assert out.dtype == torch.float32


def test_explain_describes_the_affine_plans():
    volume, theta = torch.randn(1, 2, 8, 9, 10), torch.eye(3, 4)[None]
    grad = torch.randn(1, 2, 8, 9, 10)
    forward = gs.explain(volume, theta, field_kind="affine")
    backward = gs.explain(volume, theta, grad=grad, field_kind="affine")
    assert "forward" in str(forward) and "backward" in str(backward)
    gpu = gs.explain(volume, theta, grad=grad, field_kind="affine", device="cuda", deterministic=True)
    assert "theta gradient from the walk's row moments, summed in float64" in str(gpu)
    assert not gpu.tuned


@pytest.mark.parametrize("align_corners", [False, True], ids=["noac", "ac"])
def test_the_cpu_engines_compiled_affine_math_has_the_bits_of_numpy_and_torch(align_corners):
    """cpu/theta.py compiles affine.py's entry-wise formulas and sums G's terms as NumPy's add.reduce does: the voxel
    matrix and dtheta are bit for bit those of the NumPy (and torch) functions, non-finite entries and signed zeros
    included, over row counts below, at and past NumPy's pairwise block (128) and its buffer (8192)."""
    from gridsampler3d import affine
    from gridsampler3d.cpu import theta as compiled

    generator = np.random.default_rng(4)
    for (depth, height), batch in [((1, 1), 1), ((3, 5), 2), ((16, 8), 1), ((7, 300), 3), ((91, 100), 1)]:
        for in_sizes, out_sizes in [((5, 6, 7), (depth, height, 9)), ((1, 1, 1), (depth, height, 1))]:
            theta = generator.normal(size=(batch, 3, 4))
            theta[0, 1, 1], theta[-1, 2, 3] = -0.0, np.inf
            axes = affine.axes(in_sizes, out_sizes, align_corners)
            expected = affine.voxel_matrix(theta, in_sizes, out_sizes, align_corners).reshape(-1)
            assert compiled.voxel_matrix(theta, axes).tobytes() == expected.tobytes()
            assert (
                compiled.voxel_matrix(theta.astype(np.float32), axes).tobytes()
                == affine.voxel_matrix(theta.astype(np.float32).astype(np.float64), in_sizes, out_sizes, align_corners)
                .reshape(-1)
                .tobytes()
            )
            torch_matrix = affine.voxel_matrix(torch.from_numpy(theta), in_sizes, out_sizes, align_corners)
            assert torch_matrix.numpy().reshape(-1).tobytes() == expected.tobytes()
            rows = batch * depth * height
            moments = (generator.normal(size=(rows, 6)) * generator.choice([1e-6, 1, 1e6], size=6)).reshape(-1)
            moments[::13] = -0.0
            moments[5::71] = np.nan
            matrix_grad = affine.matrix_gradient(moments, batch, out_sizes)
            grad = affine.theta_gradient(matrix_grad, in_sizes, out_sizes, align_corners)
            assert compiled.theta_gradient(moments, batch, out_sizes, axes).tobytes() == grad.tobytes()


def test_the_numpy_matrix_gradient_is_twelve_sums_over_the_rows():
    """affine.matrix_gradient's one reduction over the twelve stacked terms gives the bits of twelve reductions of
    their own (the definition: G[i, j] sums g_i * (w, h, d, 1)[j] over every point)."""
    from gridsampler3d import affine

    generator = np.random.default_rng(5)
    for batch, depth, height in [(1, 1, 1), (2, 3, 5), (1, 128, 129), (1, 300, 30)]:
        moments = generator.normal(size=(batch * depth * height, 6)) * generator.choice([1e-5, 1, 1e5], size=6)
        rows = moments.reshape(batch, depth, height, 6)
        h, d = np.arange(height, dtype=np.float64), np.arange(depth, dtype=np.float64)[:, None]
        for i in range(3):
            terms = [rows[..., 3 + i], rows[..., i] * h, rows[..., i] * d, rows[..., i]]
            expected = np.stack([term.sum(axis=(1, 2)) for term in terms], axis=1)
            got = affine.matrix_gradient(moments, batch, (depth, height, 4))[:, i]
            assert got.tobytes() == expected.tobytes()
