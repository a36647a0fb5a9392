"""Tricubic ("bicubic") 3-D sampling: PyTorch's 2-D bicubic extended to 3-D, on every backend.

There is no PyTorch 3-D golden, so the proof is: (a) a volume constant along D sampled at
a fixed z reproduces PyTorch's 2-D bicubic forward and backward (float64); (b) float64
gradcheck; (c) every engine against the float64 reference by the precision rule
(competitor: the torch composite in the compute dtype); (d) at voxel centres the output
is the input.
"""

import pytest
import torch
import torch.nn.functional as F
from helpers import DTYPE_IDS, DTYPES, assert_backward_matches, assert_forward_matches, make_case, poisoned_allocations

import gridsampler3d as gs
from gridsampler3d import precision

# The engine splits even these small calls into parts on its threads, as it splits a large one.
pytestmark = pytest.mark.usefixtures("split_small_calls")

PADDINGS = ("zeros", "border", "reflection")
ATTRIBUTES = [(padding, align) for padding in PADDINGS for align in (False, True)]


def attribute_id(case):
    padding, align_corners = case
    return f"{padding}-{'ac' if align_corners else 'noac'}"


def _slice_case(padding, align_corners, seed=0):
    """A (2, 3, 7, 5, 6) volume constant along D, a 2-D grid and the z that keeps all z taps inside."""
    generator = torch.Generator().manual_seed(seed)
    image = torch.randn(2, 3, 5, 6, generator=generator, dtype=torch.float64)
    grid2d = torch.rand(2, 4, 5, 2, generator=generator, dtype=torch.float64) * 2.6 - 1.3
    depth = 7
    index = 3.3  # taps at depths 2..5, inside for every padding
    z = 2 * index / (depth - 1) - 1 if align_corners else (2 * index + 1) / depth - 1
    grid = torch.cat([grid2d, torch.full((2, 4, 5, 1), z, dtype=torch.float64)], -1).unsqueeze(1)
    return image, grid2d, image.unsqueeze(2).expand(2, 3, depth, 5, 6).contiguous(), grid


# The CPU engines only: test_triton_matches_the_rule holds the Triton kernels to the reference (the rule these two
# implement) for every padding and align_corners, so PyTorch's 2-D bicubic reaches them through it.
@pytest.mark.parametrize("backend", ["reference", "numba"])
@pytest.mark.parametrize("attributes", ATTRIBUTES, ids=attribute_id)
def test_constant_depth_reproduces_pytorch_2d_bicubic(attributes, backend):
    padding, align_corners = attributes
    image, grid2d, volume, grid = _slice_case(padding, align_corners)
    image.requires_grad_(True)
    grid2d.requires_grad_(True)
    expected = F.grid_sample(image, grid2d, "bicubic", padding, align_corners)
    grad2d = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    expected.backward(grad2d)

    y = gs.grid_sampler3d(volume, grid, "bicubic", padding, align_corners, backend=backend)
    # Not bitwise: the 3-D sums also weight four equal z taps, whose cubic weights add up to 1
    # only up to float64 rounding; values are of order 1, so 1e-12 is ample and still strict.
    torch.testing.assert_close(y[:, :, 0], expected.detach(), rtol=1e-12, atol=1e-12)
    dx, dgrid = gs.grid_sampler3d_backward(
        grad2d.unsqueeze(2), volume, grid, "bicubic", padding, align_corners, backend=backend, deterministic=True
    )
    # The volume's gradient, summed along D, is the image's; the grid's x and y parts are the 2-D grid's
    # (to float64 rounding, as for y).
    torch.testing.assert_close(dx.sum(2), image.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dgrid[:, 0, ..., :2], grid2d.grad, rtol=1e-12, atol=1e-12)
    # Nothing changes along D: the z component is zero up to rounding.
    assert dgrid[..., 2].abs().max() < 1e-12


@pytest.mark.parametrize("data_format", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("attributes", ATTRIBUTES, ids=attribute_id)
def test_numba_and_reference_match_the_rule(attributes, dtype, data_format):
    padding, align_corners = attributes
    grad, x, grid = make_case(dtype=dtype, data_format=data_format, seed=ATTRIBUTES.index(attributes))
    for backend in ("numba", "reference"):
        label = f"bicubic {attribute_id(attributes)} {DTYPE_IDS[dtype]} {data_format} {backend}"
        assert_backward_matches(grad, x, grid, "bicubic", padding, align_corners, data_format, backend, label=label)
        assert_forward_matches(x, grid, "bicubic", padding, align_corners, data_format, backend, label=label)


# The Triton cases, through the interpreter where there is no GPU: every padding and align_corners in float64 and
# float32, the half types for the first (zeros) only. The coordinates and weights are float64 in every dtype; what a
# dtype changes (the sums' precision, the rounding of half dx) does not depend on the padding. Each in both backward
# modes, but float64's deterministic dx for zeros padding only: test_triton_float64_sums_in_the_reference_order
# holds it to the reference bit for bit for every padding, and the float32 cases run the same deterministic kernels,
# with float64 coordinates, for every padding and align_corners.
TRITON_CASES = [
    (attributes, dtype, data_format, deterministic)
    for attributes in ATTRIBUTES
    for dtype, data_format in (
        (torch.float64, "NCDHW"),
        (torch.float32, "NDHWC"),
        (torch.bfloat16, "NCDHW"),
        (torch.float16, "NDHWC"),
    )
    for deterministic in (False, True)
    if dtype in (torch.float64, torch.float32) or attributes == ATTRIBUTES[0]
    if not (deterministic and dtype == torch.float64 and attributes[0] != "zeros")
]


@pytest.mark.skipif("triton" not in gs.available_backends(), reason="Triton cannot run here")
@pytest.mark.parametrize(
    "attributes, dtype, data_format, deterministic",
    TRITON_CASES,
    ids=[f"{attribute_id(a)}-{DTYPE_IDS[d]}-{f}-{'deterministic' if det else 'fast'}" for a, d, f, det in TRITON_CASES],
)
def test_triton_matches_the_rule(attributes, dtype, data_format, deterministic):
    padding, align_corners = attributes
    device = "cuda" if torch.cuda.is_available() else "cpu"
    grad, x, grid = (t.to(device) for t in make_case(1, 3, (4, 5, 3), (3, 2, 4), dtype, data_format, seed=4))
    label = f"bicubic {attribute_id(attributes)} {DTYPE_IDS[dtype]} {data_format} triton"
    assert_backward_matches(
        grad,
        x,
        grid,
        "bicubic",
        padding,
        align_corners,
        data_format,
        "triton",
        label=label,
        deterministic=deterministic,
    )
    if not deterministic:
        assert_forward_matches(x, grid, "bicubic", padding, align_corners, data_format, "triton", label=label)


@pytest.mark.skipif("triton" not in gs.available_backends(), reason="Triton cannot run here")
@pytest.mark.parametrize("padding", PADDINGS)
def test_triton_float64_sums_in_the_reference_order(padding):
    """y and dgrid sum separably and the deterministic dx adds (point, tap) entries in order, as the
    reference: bit for bit under the interpreter (a GPU compiler may fuse multiply-adds: to 1e-13 there). 24 points
    on a 3 x 4 x 3 volume: border and reflection padding pile several (point, tap) entries into each edge voxel."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    grad, x, grid = make_case(1, 2, (3, 4, 3), (2, 3, 4), torch.float64, seed=9, low=-1.5, high=1.5)
    expected_y = gs.grid_sampler3d(x, grid, "bicubic", padding, backend="reference")
    expected = gs.grid_sampler3d_backward(grad, x, grid, "bicubic", padding, backend="reference")
    y = gs.grid_sampler3d(x.to(device), grid.to(device), "bicubic", padding, backend="triton")
    ours = gs.grid_sampler3d_backward(
        grad.to(device), x.to(device), grid.to(device), "bicubic", padding, backend="triton", deterministic=True
    )
    for name, a, b in zip(("y", "dx", "dgrid"), (y, *ours), (expected_y, *expected)):
        if device == "cpu":
            assert torch.equal(a, b), name
        else:
            torch.testing.assert_close(a.cpu(), b, rtol=1e-13, atol=1e-13, msg=name)


@pytest.mark.parametrize("align_corners", [False, True])
def test_numba_is_the_reference_bit_for_bit(align_corners):
    grad, x, grid = make_case(2, 3, (5, 4, 6), (3, 4, 5), torch.float64, seed=2, low=-1.4, high=1.4)
    for padding in PADDINGS:
        expected = gs.grid_sampler3d_backward(grad, x, grid, "bicubic", padding, align_corners, backend="reference")
        ours = gs.grid_sampler3d_backward(grad, x, grid, "bicubic", padding, align_corners, backend="numba")
        assert all(torch.equal(a, b) for a, b in zip(ours, expected)), padding
        assert torch.equal(
            gs.grid_sampler3d(x, grid, "bicubic", padding, align_corners, backend="numba"),
            gs.grid_sampler3d(x, grid, "bicubic", padding, align_corners, backend="reference"),
        )


@pytest.mark.parametrize("output_mask", [(True, True), (True, False), (False, True)], ids=str)
@pytest.mark.parametrize(
    "dtype, data_format",
    [(torch.float64, "NCDHW"), (torch.float64, "NDHWC"), (torch.float32, "NDHWC"), (torch.bfloat16, "NCDHW")],
    ids=["f64-NCDHW", "f64-NDHWC", "f32-NDHWC", "bf16-NCDHW"],
)
@pytest.mark.parametrize("padding", PADDINGS)
def test_numba_writes_every_output_element(padding, dtype, data_format, output_mask):
    """Outputs allocated NaN-filled (the inputs are finite): y, dx and dgrid must come out equal to
    the reference, so every element was written, and dx was zeroed before the taps were added."""
    grad, x, grid = make_case(2, 3, (5, 4, 6), (3, 4, 5), dtype, data_format, seed=8, low=-1.4, high=1.4)
    attributes = ("bicubic", padding, False)
    with poisoned_allocations() as allocations:
        y = gs.grid_sampler3d(x, grid, *attributes, data_format=data_format, backend="numba")
        dx, dgrid = gs.grid_sampler3d_backward(
            grad, x, grid, *attributes, output_mask=output_mask, data_format=data_format, backend="numba"
        )
    assert len(allocations) >= 1 + sum(output_mask), "the engine's outputs no longer go through torch.empty"
    if dtype == torch.float64:  # the reference bit for bit
        expected = (
            gs.grid_sampler3d(x, grid, *attributes, data_format=data_format, backend="reference"),
            *gs.grid_sampler3d_backward(
                grad, x, grid, *attributes, output_mask=output_mask, data_format=data_format, backend="reference"
            ),
        )
        for name, ours, theirs in zip(("y", "dx", "dgrid"), (y, dx, dgrid), expected):
            assert (ours is None and theirs is None) or torch.equal(ours, theirs), name
        return
    goldens = (
        precision.golden_forward(x, grid, *attributes, data_format),
        *precision.golden_backward(grad, x, grid, *attributes, output_mask, data_format),
    )
    competitors = (
        precision.competitor_forward(x, grid, *attributes, data_format),
        *precision.competitor_backward(grad, x, grid, *attributes, output_mask, data_format),
    )
    for name, ours, golden, competitor in zip(("y", "dx", "dgrid"), (y, dx, dgrid), goldens, competitors):
        if golden is None:
            assert ours is None, name
            continue
        assert not ours.isnan().any(), f"{name}: {int(ours.isnan().sum())} elements never written"
        report = precision.compare(name, ours, golden, competitor, dtype)
        assert report.passed, str(report)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("padding", PADDINGS)
def test_voxel_centres_reproduce_the_input(padding, dtype, cpu_backend):
    """At integer positions the cubic weights are (0, 1, 0, 0): sampling returns the voxels exactly."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(1, 2, 5, 9, 3, generator=generator, dtype=torch.float64).to(dtype)
    # align_corners=True with size - 1 a power of two: every centre is exact in binary.
    axes = [torch.linspace(-1, 1, size, dtype=torch.float64) for size in (5, 9, 3)]
    zz, yy, xx = torch.meshgrid(*axes, indexing="ij")
    grid = torch.stack([xx, yy, zz], -1).unsqueeze(0).to(dtype)
    y = gs.grid_sampler3d(x, grid, "bicubic", padding, True, backend=cpu_backend)
    assert torch.equal(y, x)


def test_nonfinite_grid_follows_the_reference():
    grad, x, grid = make_case(1, 2, (4, 5, 3), (3, 4, 5), torch.float64, seed=5)
    grid.view(-1)[::7] = float("nan")
    grid.view(-1)[3::11] = float("inf")
    grid.view(-1)[5::13] = 1e30
    for padding in PADDINGS:
        assert_backward_matches(grad, x, grid, "bicubic", padding, False, backend="numba", label=f"nonfinite {padding}")
        assert_forward_matches(x, grid, "bicubic", padding, False, backend="numba", label=f"nonfinite {padding}")


@pytest.mark.parametrize("data_format", ["NCDHW", "NDHWC"])
def test_gradcheck_and_gradgradcheck(data_format):
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(1, 2, 3, 4, 3, generator=generator, dtype=torch.float64)
    if data_format == "NDHWC":
        x = x.permute(0, 2, 3, 4, 1).contiguous()
    grid = torch.rand(1, 2, 3, 2, 3, generator=generator, dtype=torch.float64) * 2.2 - 1.1
    x.requires_grad_(True)
    grid.requires_grad_(True)
    for padding in PADDINGS:

        def function(volume, points):
            return gs.grid_sample(volume, points, "bicubic", padding, False, data_format=data_format)

        # fast_mode: the Jacobians against random vectors (one product each way) rather than entry by entry; a wrong
        # entry still changes the product. test_torch.py checks the trilinear Jacobians entry by entry.
        assert torch.autograd.gradcheck(function, (x, grid), fast_mode=True)
        assert torch.autograd.gradgradcheck(function, (x, grid), fast_mode=True)


def test_integer_code_and_patched_functional():
    grad, x, grid = make_case(1, 2, (4, 4, 4), (3, 3, 3), torch.float64)
    by_name = gs.grid_sample(x, grid, "bicubic", "border", True)
    assert torch.equal(gs.grid_sample(x, grid, 2, 1, True), by_name)
    with pytest.raises(RuntimeError, match="bicubic"):
        F.grid_sample(x, grid, "bicubic", "border", True)
    with gs.patched():
        assert torch.equal(F.grid_sample(x, grid, "bicubic", "border", True), by_name)
        assert torch.equal(torch.ops.aten.grid_sampler_3d(x, grid, 2, 1, True), by_name)
    with pytest.raises(RuntimeError, match="bicubic"):
        F.grid_sample(x, grid, "bicubic", "border", True)


def test_precision_helpers_use_the_reference_as_golden():
    grad, x, grid = make_case(1, 2, (4, 4, 4), (3, 3, 3), torch.float64)
    golden = precision.golden_forward(x, grid, "bicubic", "reflection", False)
    assert torch.equal(golden, gs.grid_sampler3d(x, grid, "bicubic", "reflection", False, backend="reference"))
