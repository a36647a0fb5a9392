"""Real clients, unchanged: MONAI's Warp block and kornia's warp_affine3d under ``gridsampler3d.patched()``
(``gridsampler3d.monai``'s drop-ins: tests/test_monai.py).

Each pipeline runs twice on the same inputs, on PyTorch's kernels and then patched, forward
and backward. The patched run must reach this library (both the forward and the backward)
and give PyTorch's outputs and gradients: equal in float64 (every sum in PyTorch's order),
within float32 rounding in float32.
"""

import pytest
import torch

import gridsampler3d as gs
from gridsampler3d import patch as patching

pytestmark = [
    pytest.mark.filterwarnings("ignore:Warning only once for all operators:UserWarning"),
    pytest.mark.filterwarnings("ignore:monai.networks.blocks.Warp. Using PyTorch native grid_sample:UserWarning"),
]


@pytest.fixture
def calls(monkeypatch):
    """The names of this library's entry points that the patched operators called, in order."""
    names = []
    for name in ("grid_sampler3d", "grid_sampler3d_backward"):
        original = getattr(patching.api, name)

        def spy(*args, _original=original, _name=name, **kwargs):
            names.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(patching.api, name, spy)
    return names


def _run(pipeline, leaves):
    """The pipeline's output and the gradients of a weighted sum of it with respect to ``leaves``."""
    leaves = [leaf.detach().clone().requires_grad_(True) for leaf in leaves]
    output = pipeline(*leaves)
    weights = torch.randn(output.shape, generator=torch.Generator().manual_seed(99), dtype=torch.float64)
    gradients = torch.autograd.grad((output * weights.to(output.dtype)).sum(), leaves)
    return (output.detach(), *gradients)


def _assert_same(ours, theirs, dtype):
    for name, a, b in zip(("output", "grad 0", "grad 1"), ours, theirs):
        if dtype == torch.float64:
            assert torch.equal(a, b), name
        else:
            # Not bitwise in float32: the two round their sums in different places (here up to
            # about 3 units in the last place of the largest value). Allow 2e-6 (17 float32
            # units) relative to each value or to the largest one, whichever is looser.
            torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6 * float(b.abs().max()), msg=name)


def _compare(pipeline, leaves, calls, dtype):
    theirs = _run(pipeline, leaves)
    assert calls == []
    with gs.patched():
        ours = _run(pipeline, leaves)
    assert calls == ["grid_sampler3d", "grid_sampler3d_backward"], "the patched call did not reach gridsampler3d"
    _assert_same(ours, theirs, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("mode, padding", [("bilinear", "border"), ("bilinear", "zeros"), ("nearest", "reflection")])
def test_monai_warp(mode, padding, dtype, calls):
    blocks = pytest.importorskip("monai.networks.blocks")
    warp = blocks.Warp(mode=mode, padding_mode=padding)
    generator = torch.Generator().manual_seed(0)
    image = torch.randn(2, 3, 7, 6, 9, generator=generator, dtype=torch.float64).to(dtype)
    ddf = (2.5 * torch.randn(2, 3, 7, 6, 9, generator=generator, dtype=torch.float64)).to(dtype)  # in voxels
    _compare(warp, (image, ddf), calls, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("flags, padding", [("bilinear", "zeros"), ("bilinear", "reflection"), ("nearest", "border")])
def test_kornia_warp_affine3d(flags, padding, dtype, calls):
    transform = pytest.importorskip("kornia.geometry.transform")
    generator = torch.Generator().manual_seed(1)
    source = torch.randn(2, 2, 6, 7, 5, generator=generator, dtype=torch.float64).to(dtype)
    centre = torch.tensor([[2.0, 3.0, 2.5], [2.5, 3.5, 2.0]], dtype=torch.float64)
    angles = torch.tensor([[10.0, -20.0, 35.0], [-5.0, 15.0, 60.0]], dtype=torch.float64)  # degrees
    matrix = transform.get_projective_transform(centre, angles, torch.full((2, 3), 1.1, dtype=torch.float64))
    matrix[..., 3] += torch.tensor([[0.3, -0.7, 0.2], [-0.4, 0.6, 0.1]], dtype=torch.float64)  # voxels
    matrix = matrix.to(dtype)

    def pipeline(volume, affine):
        return transform.warp_affine3d(volume, affine, (5, 8, 6), flags=flags, padding_mode=padding)

    _compare(pipeline, (source, matrix), calls, dtype)
