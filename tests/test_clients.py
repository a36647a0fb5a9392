"""Real clients, unchanged: MONAI's Warp block and kornia's warp_affine3d under ``gridsampler3d.patched()``; and
MONAI's Affine and RandAffine against their fused versions (``gridsampler3d.monai``).

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


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding", ["border", "zeros", "reflection"])
def test_monai_affine_fused_gives_monais_result(padding, align_corners):
    """gridsampler3d.monai.Affine: MONAI's matrix, sampled here with no grid; MONAI's result within 1e-4 of the scale
    (float32: MONAI builds and scales its grid in float32, the library its positions in float64)."""
    transforms = pytest.importorskip("monai.transforms")
    from gridsampler3d import monai as gs_monai

    generator = torch.Generator().manual_seed(2)
    image = torch.rand(2, 9, 10, 11, generator=generator)
    parameters = dict(
        rotate_params=(0.3, -0.2, 0.1),
        shear_params=(0.05, 0.0, 0.1, 0.0, 0.0, 0.05),
        translate_params=(1.5, -2.0, 0.5),
        scale_params=(1.1, 0.9, 1.05),
        padding_mode=padding,
        align_corners=align_corners,
    )
    for spatial_size in (None, (7, 12, 8)):
        theirs = transforms.Affine(**parameters, spatial_size=spatial_size, image_only=True)(image)
        ours = gs_monai.Affine(**parameters, spatial_size=spatial_size)(image)
        assert ours.shape == theirs.shape
        assert float((ours - theirs.as_tensor()).abs().max()) <= 1e-4 * float(theirs.abs().max())


def test_monai_rand_affine_fused_draws_monais_transform():
    transforms = pytest.importorskip("monai.transforms")
    from gridsampler3d import monai as gs_monai

    generator = torch.Generator().manual_seed(3)
    image = torch.rand(1, 12, 10, 9, generator=generator)
    parameters = dict(
        prob=1.0,
        rotate_range=(0.4, 0.3, 0.2),
        scale_range=(0.1, 0.1, 0.1),
        translate_range=(2, 2, 2),
        padding_mode="zeros",
    )
    theirs, ours = transforms.RandAffine(**parameters), gs_monai.RandAffine(**parameters)
    theirs.set_random_state(5)
    ours.set_random_state(5)
    for _ in range(3):  # the same draws, call after call
        expected, got = theirs(image), ours(image)
        assert float((got - expected.as_tensor()).abs().max()) <= 1e-4 * float(expected.abs().max())
