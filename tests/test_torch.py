"""PyTorch integration: autograd, custom ops, torch.compile, autocast, Warp3d, the drop-in patch."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers import MATRIX, make_case, matrix_id
from torch.library import opcheck

import gridsampler3d as gs
from gridsampler3d import patch as patching
from gridsampler3d.autograd import sample_backward_op, sample_op
from gridsampler3d.sampling import FieldKind


def _grid_op(x, grid, *attributes):
    """The forward custom op on a grid: what traced and compiled calls of ``gs.grid_sample`` run."""
    return sample_op(x, grid, None, int(FieldKind.GRID), [], None, *attributes)


def _leaves(data_format="NCDHW", seed=0):
    _, x, grid = make_case(1, 2, (3, 4, 5), (2, 3, 2), torch.float64, data_format, seed, -1.1, 1.1)
    return x.requires_grad_(), grid.requires_grad_()


@pytest.mark.parametrize("data_format", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("attributes", MATRIX, ids=matrix_id)
def test_gradcheck(attributes, data_format):
    mode, padding, align_corners = attributes
    x, grid = _leaves(data_format)
    if mode == "nearest":  # the grid gradient of nearest is zero (piecewise constant): input only
        grid.requires_grad_(False)
    # NCDHW compares the Jacobians entry by entry; NDHWC, the same function of other strides, against random vectors
    # (torch's fast mode: a wrong entry still changes the product).
    assert torch.autograd.gradcheck(
        lambda a, b: gs.grid_sample(a, b, mode, padding, align_corners, data_format),
        (x, grid),
        fast_mode=data_format == "NDHWC",
    )


@pytest.mark.parametrize("attributes", MATRIX, ids=matrix_id)
def test_grid_sample_equals_torch(attributes):
    mode, padding, align_corners = attributes
    x, grid = _leaves(seed=3)
    ours = gs.grid_sample(x, grid, mode, padding, align_corners)
    theirs = F.grid_sample(x, grid, mode, padding, align_corners)
    assert torch.equal(ours, theirs)  # float64: bitwise
    weights = torch.randn_like(ours)
    ours_grads = torch.autograd.grad((ours * weights).sum(), (x, grid))
    theirs_grads = torch.autograd.grad((theirs * weights).sum(), (x, grid))
    assert all(torch.equal(a, b) for a, b in zip(ours_grads, theirs_grads))


@pytest.mark.parametrize("output_mask", [[True, True], [True, False], [False, True]], ids=str)
def test_opcheck(output_mask):
    grad, x, grid = make_case(1, 2, (3, 4, 5), (2, 3, 2), torch.float64)
    field = (grid, None, int(FieldKind.GRID), [], None)
    opcheck(sample_op, (x, *field, 0, 2, True))
    opcheck(sample_op, (x.contiguous(memory_format=torch.channels_last_3d), *field, 1, 1, False))
    opcheck(sample_backward_op, (grad, x, *field, 0, 1, False, [*output_mask, False]))


def test_compile_fullgraph_has_no_graph_break():
    x, grid = _leaves()

    def loss(volume, sampling_grid):
        return (gs.grid_sample(volume, sampling_grid, "bilinear", "border", True) ** 2).sum()

    # aot_eager traces the whole graph (fullgraph=True fails on any break) without a C++ build.
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    expected, got = loss(x, grid), compiled(x, grid)
    assert torch.equal(expected, got)
    assert all(
        torch.equal(a, b) for a, b in zip(torch.autograd.grad(expected, (x, grid)), torch.autograd.grad(got, (x, grid)))
    )


def test_eager_calls_skip_the_custom_ops_and_traced_ones_keep_them(monkeypatch):
    """Plain tensors run eagerly through an autograd.Function over the api (the custom ops' dispatch cost
    more than a small call's kernels); fake tensors, dispatch modes and tracing see the custom ops."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from gridsampler3d import autograd

    x, grid = _leaves()
    assert type(gs.grid_sample(x, grid).grad_fn).__name__ == "SampleBackward"
    with torch.no_grad():
        assert torch.equal(gs.grid_sample(x, grid), _grid_op(x, grid, 0, 0, False))
    calls = []
    monkeypatch.setattr(autograd, "sample_op", lambda *args: calls.append(args) or sample_op(*args))
    with FlopCounterMode(display=False):
        gs.grid_sample(x, grid)
    with FakeTensorMode():
        fake = gs.grid_sample(torch.empty(1, 2, 3, 4, 5), torch.empty(1, 2, 3, 2, 3))
    assert len(calls) == 2 and fake.shape == (1, 2, 2, 3, 2)


def test_second_derivatives_through_the_eager_route_match_the_custom_ops():
    x, grid = _leaves(seed=5)
    results = []
    for run in (
        lambda a, b: gs.grid_sample(a, b, "bilinear", "border", True),
        lambda a, b: _grid_op(a, b, 0, 1, True),
    ):
        y = run(x, grid)
        grads = torch.autograd.grad(y.square().sum(), (x, grid), create_graph=True)
        results.append(torch.autograd.grad(sum(g.square().sum() for g in grads), (x, grid)))
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("needs", [(True, False), (False, True)], ids=["input-only", "grid-only"])
def test_only_the_gradient_asked_for_is_computed(needs, monkeypatch):
    x, grid = _leaves()
    x.requires_grad_(needs[0])
    grid.requires_grad_(needs[1])
    masks = []
    original = gs.backends.backward

    def spy(engine, grad, x, field, sampling, outputs, *args):
        assert not outputs.dtheta  # a grid has no theta
        masks.append((outputs.dx, outputs.dfield))
        return original(engine, grad, x, field, sampling, outputs, *args)

    monkeypatch.setattr(gs.backends, "backward", spy)
    gs.grid_sample(x, grid).sum().backward()
    assert masks == [needs]
    assert (x.grad is not None) == needs[0] and (grid.grad is not None) == needs[1]


def test_autocast_computes_in_float32_like_torch():
    x, grid = _leaves()
    x, grid = x.detach().float(), grid.detach().float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = gs.grid_sample(x.bfloat16(), grid, align_corners=False)
        theirs = F.grid_sample(x.bfloat16(), grid, align_corners=False)
    assert ours.dtype == theirs.dtype == torch.float32
    # Not bitwise: the two float32 results may round their sums in different orders. Values are
    # of order 1 (unit normal x, weights summing to at most 1), where float32's spacing is
    # 1.2e-7; 1e-6 allows the few units in the last place that PyTorch's float32 sum can be off.
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


def test_ndhwc_equals_ncdhw():
    x, grid = _leaves()
    ours = gs.grid_sample(x.permute(0, 2, 3, 4, 1), grid, "bilinear", "reflection", False, data_format="NDHWC")
    assert torch.equal(ours, gs.grid_sample(x, grid, "bilinear", "reflection", False).permute(0, 2, 3, 4, 1))


def test_warp3d_identity_and_shift():
    volume = torch.randn(2, 3, 6, 5, 7, dtype=torch.float64)
    warp = gs.Warp3d()
    # Exact: the fused warp samples at identity + displacement with no normalising round trip.
    assert torch.equal(warp(volume, torch.zeros(2, 3, 6, 5, 7, dtype=torch.float64)), volume)
    shift = torch.zeros(2, 3, 6, 5, 7, dtype=torch.float64)
    shift[:, 2] = 1.0  # one voxel along x: output[..., i] = volume[..., i + 1]
    shifted = warp(volume, shift)
    assert torch.equal(shifted[..., :-1], volume[..., 1:])
    with pytest.raises(ValueError, match=r"displacement's dimension 1 must be 3"):
        warp(volume, torch.zeros(2, 2, 6, 5, 7, dtype=torch.float64))


@pytest.mark.filterwarnings("ignore:Warning only once for all operators:UserWarning")
def test_patch_routes_5d_grid_sample_and_unpatch_restores(monkeypatch):
    x, grid = _leaves(seed=5)
    calls = []
    for name in ("grid_sampler3d", "grid_sampler3d_backward"):
        original = getattr(gs.api, name)
        monkeypatch.setattr(patching.api, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))

    def run():
        y = F.grid_sample(x, grid, "bilinear", "border", align_corners=True)
        return (y, *torch.autograd.grad((y * y).sum(), (x, grid)))

    before = run()
    assert calls == []
    with gs.patched():
        assert gs.is_patched()
        during = run()
        assert calls == ["grid_sampler3d", "grid_sampler3d_backward"]
        image = torch.randn(1, 2, 4, 4, dtype=torch.float64)
        F.grid_sample(image, torch.zeros(1, 2, 2, 2, dtype=torch.float64), align_corners=False)  # 4-D: untouched
        assert len(calls) == 2
    assert not gs.is_patched()
    after = run()
    assert len(calls) == 2
    assert all(torch.equal(a, b) for a, b in zip(before, during))  # float64: ours equals PyTorch bitwise
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_the_patch_is_counted():
    """Each patch_torch() needs its unpatch_torch(); patched() inside a patch leaves it in force; an unpatch
    without a patch does nothing."""
    assert not gs.is_patched()
    gs.patch_torch()
    gs.patch_torch()
    with gs.patched():
        assert gs.is_patched()
    gs.unpatch_torch()
    assert gs.is_patched()
    gs.unpatch_torch()
    assert not gs.is_patched()
    gs.unpatch_torch()
    assert not gs.is_patched()
    with gs.patched():
        assert gs.is_patched()
    assert not gs.is_patched()


def test_the_patch_raises_no_warning_in_a_fresh_process():
    """PyTorch warns once per process about an overridden kernel: the patch's own registration says nothing
    (with every warning made an error), and a patched call runs."""
    code = (
        "import warnings, torch\n"
        "import gridsampler3d as gs\n"
        "warnings.simplefilter('error')\n"
        "with gs.patched():\n"
        "    x = torch.randn(1, 1, 3, 3, 3)\n"
        "    torch.nn.functional.grid_sample(x, torch.zeros(1, 2, 2, 2, 3), align_corners=False)\n"
        "print('quiet')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stdout.strip() == "quiet", result.stderr
    assert result.stderr == ""


@pytest.mark.parametrize("data_format", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True], ids=["noac", "ac"])
def test_gradgradcheck_bilinear(padding, align_corners, data_format):
    """NCDHW compares the second derivatives entry by entry; NDHWC, the same function of other strides, against
    random vectors (fast mode), as test_gradcheck does."""
    x, grid = _leaves(data_format, seed=7)
    assert torch.autograd.gradgradcheck(
        lambda a, b: gs.grid_sample(a, b, "bilinear", padding, align_corners, data_format),
        (x, grid),
        fast_mode=data_format == "NDHWC",
    )


@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_double_backward_matches_torch(padding):
    x, grid = _leaves(seed=11)

    def second_order(sample):
        y = sample(x, grid, "bilinear", padding, True)
        grad_x, grad_grid = torch.autograd.grad(y.square().sum(), (x, grid), create_graph=True)
        return torch.autograd.grad(grad_grid.square().sum() + (grad_x * grad_x).sum(), (x, grid))

    try:
        expected = second_order(F.grid_sample)
    except RuntimeError as error:  # torch before 2.10 has no derivative of its 3-D grid sampler's backward
        pytest.skip(f"this torch cannot differentiate its own grid sampler's backward: {error}")
    # Not bitwise: our second derivatives come from the torch composite (composite.py), whose
    # operations group the products differently from PyTorch's C++ double backward; float64
    # rounding of those sums stays far below 1e-10 at these sizes.
    for ours, theirs in zip(second_order(gs.grid_sample), expected):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)


def test_align_corners_none_is_taken_as_f_grid_sample_takes_it():
    """None warns (the warning a filter for PyTorch's matches) and samples as align_corners=False."""
    x, grid = _leaves(seed=11)
    with pytest.warns(UserWarning, match="Default grid_sample and affine_grid behavior"):
        ours = gs.grid_sample(x, grid, align_corners=None)
    with pytest.warns(UserWarning, match="Default grid_sample and affine_grid behavior"):
        theirs = F.grid_sample(x, grid, align_corners=None)
    assert torch.equal(ours, theirs) and torch.equal(ours, gs.grid_sample(x, grid, align_corners=False))
