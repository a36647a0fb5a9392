"""``gridsampler3d.monai``: MONAI's Affine, RandAffine, Affined and RandAffined as drop-ins, against MONAI's own.

Each drop-in and MONAI's transform run on the same input (a MetaTensor with an affine of its
own, a plain tensor, a NumPy array), with the same seed for the random ones. What MONAI
returns must come back: the same types, shapes, dtypes and metadata (the affine,
``applied_operations`` and what it records), the pair (image, affine) where MONAI returns
one, and images within float32 rounding of MONAI's: MONAI builds its grid in float32, the
library its positions in float64 (1e-5 of the image's scale). ``inverse()`` and the
dictionary versions' inverse go through MONAI's own code. Where the library's kernels do
not apply (2-D, lazy application) MONAI's own code runs: the same values exactly.
"""

import pickle

import numpy as np
import pytest
import torch

monai = pytest.importorskip("monai")
transforms = pytest.importorskip("monai.transforms")

from monai.data import MetaTensor  # noqa: E402

from gridsampler3d import monai as gs_monai  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TOLERANCE = 1e-5  # of the image's scale: MONAI's float32 grid against float64 positions
AFFINE = dict(
    rotate_params=(0.3, -0.2, 0.1),
    shear_params=(0.05, 0.0, 0.1, 0.0, 0.0, 0.05),
    translate_params=(1.5, -2.0, 0.5),
    scale_params=(1.1, 0.9, 1.05),
)
RANDOM = dict(prob=1.0, rotate_range=(0.4, 0.3, 0.2), scale_range=(0.1, 0.1, 0.1), translate_range=(2, 2, 2))


def _image(channels=2, size=(9, 10, 11), seed=0):
    generator = torch.Generator().manual_seed(seed)
    return MetaTensor(
        torch.rand(channels, *size, generator=generator), affine=torch.diag(torch.tensor([1.5, 1.0, 2.0, 1.0]))
    )


def _plain(value):
    return torch.as_tensor(value.as_tensor() if isinstance(value, MetaTensor) else value)


def assert_same_output(ours, theirs, label, exact=False, ties=None):
    """The same type, shape and dtype; values within TOLERANCE of the scale (exact: equal; ``ties``: nearest, where
    a position within float32 rounding of a half voxel may round the other way, at most that many elements differ);
    for a MetaTensor the same affine and the same applied operations (class, sizes, the matrix recorded)."""
    assert type(ours) is type(theirs), f"{label}: {type(ours).__name__} against {type(theirs).__name__}"
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, label
    mine, gold = _plain(ours).double(), _plain(theirs).double()
    if ties is not None:
        assert int((mine != gold).sum()) <= ties, f"{label}: {int((mine != gold).sum())} elements differ"
    else:
        error = float((mine - gold).abs().max()) if gold.numel() else 0.0
        limit = 0.0 if exact else TOLERANCE * max(1.0, float(gold.abs().max()))
        assert error <= limit, f"{label}: {error} > {limit}"
    if isinstance(theirs, MetaTensor):
        assert torch.allclose(ours.affine, theirs.affine, atol=1e-6), label
        assert len(ours.applied_operations) == len(theirs.applied_operations), label
        for mine_op, gold_op in zip(ours.applied_operations, theirs.applied_operations):
            assert mine_op["class"] == gold_op["class"] and mine_op["orig_size"] == gold_op["orig_size"], label
            mine_extra, gold_extra = mine_op.get("extra_info", {}), gold_op.get("extra_info", {})
            assert set(mine_extra) == set(gold_extra), label
            if "affine" in gold_extra:
                assert np.allclose(np.asarray(mine_extra["affine"]), np.asarray(gold_extra["affine"])), label


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding", ["border", "zeros", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_affine_returns_what_monai_returns(mode, padding, align_corners):
    """MONAI's default image_only=False: the pair (image, affine); both output sizes; the inverse."""
    image = _image()
    for spatial_size in (None, (7, 12, 8)):
        options = dict(AFFINE, mode=mode, padding_mode=padding, align_corners=align_corners, spatial_size=spatial_size)
        theirs, ours = transforms.Affine(**options), gs_monai.Affine(**options)
        (gold, gold_affine), (mine, mine_affine) = theirs(image), ours(image)
        label = f"{mode} {padding} {align_corners} {spatial_size}"
        assert_same_output(mine, gold, label, ties=2 if mode == "nearest" else None)
        assert type(mine_affine) is type(gold_affine) and np.allclose(mine_affine, gold_affine), label
        assert_same_output(
            ours.inverse(mine), theirs.inverse(gold), f"{label} inverse", ties=2 if mode == "nearest" else None
        )


def test_random_draws_are_monais():
    """set_random_state and the draws are MONAI's: the same transform call after call, a cached grid, a resize with
    no transform drawn."""
    image = _image(seed=1)
    theirs, ours = (
        transforms.RandAffine(**RANDOM, padding_mode="zeros"),
        gs_monai.RandAffine(**RANDOM, padding_mode="zeros"),
    )
    theirs.set_random_state(5)
    ours.set_random_state(5)
    for call in range(3):
        assert_same_output(ours(image), theirs(image), f"call {call}")
    cached = dict(RANDOM, spatial_size=(8, 8, 8), cache_grid=True)
    theirs, ours = transforms.RandAffine(**cached), gs_monai.RandAffine(**cached)
    theirs.set_random_state(1)
    ours.set_random_state(1)
    assert_same_output(ours(image), theirs(image), "cache_grid")
    theirs, ours = (
        transforms.RandAffine(prob=0.0, spatial_size=(8, 8, 8)),
        gs_monai.RandAffine(prob=0.0, spatial_size=(8, 8, 8)),
    )
    assert_same_output(ours(image), theirs(image), "resize, no transform drawn")
    theirs, ours = transforms.RandAffine(prob=0.0), gs_monai.RandAffine(prob=0.0)
    assert_same_output(ours(image), theirs(image), "nothing to do", exact=True)


def test_dictionary_versions_and_their_inverse():
    """RandAffined with an image and a label (bilinear, nearest: one draw for both), its inverse; Affined."""
    image, label = _image(seed=2), MetaTensor((torch.rand(1, 9, 10, 11) > 0.5).float())
    options = dict(keys=["image", "label"], mode=("bilinear", "nearest"), padding_mode="zeros", **RANDOM)
    theirs, ours = transforms.RandAffined(**options), gs_monai.RandAffined(**options)
    theirs.set_random_state(3)
    ours.set_random_state(3)
    gold, mine = theirs({"image": image, "label": label}), ours({"image": image, "label": label})
    assert_same_output(mine["image"], gold["image"], "RandAffined image")
    assert_same_output(mine["label"], gold["label"], "RandAffined label", ties=2)
    inverted_gold, inverted_mine = theirs.inverse(gold), ours.inverse(mine)
    assert_same_output(inverted_mine["image"], inverted_gold["image"], "RandAffined inverse")
    theirs, ours = transforms.Affined(keys="image", **AFFINE), gs_monai.Affined(keys="image", **AFFINE)
    assert_same_output(ours({"image": image})["image"], theirs({"image": image})["image"], "Affined")


def test_what_the_kernels_do_not_take_runs_monais_code():
    """2-D images and lazy application: MONAI's own code, the same values exactly; a NumPy image and a plain tensor
    as MONAI takes them."""
    plane = torch.rand(1, 10, 12)
    options = dict(rotate_params=0.3, image_only=True)
    assert_same_output(gs_monai.Affine(**options)(plane), transforms.Affine(**options)(plane), "2-D", exact=True)
    lazy = dict(AFFINE, lazy=True, image_only=True)
    assert_same_output(gs_monai.Affine(**lazy)(_image()), transforms.Affine(**lazy)(_image()), "lazy", exact=True)
    volume = _image().as_tensor()
    for value, label in ((volume, "tensor"), (volume.numpy(), "numpy")):
        options = dict(AFFINE, image_only=True)
        assert_same_output(gs_monai.Affine(**options)(value), transforms.Affine(**options)(value), label)


def test_the_drop_ins_are_monais_classes_and_pickle():
    """Subclasses of MONAI's transforms (Compose's inverse and Invertd look for InvertibleTransform), picklable for
    DataLoader workers, the grid never made: the resampler gets the plan."""
    pairs = [
        (gs_monai.Affine(), transforms.Affine),
        (gs_monai.RandAffine(), transforms.RandAffine),
        (gs_monai.Affined(keys="image"), transforms.Affined),
        (gs_monai.RandAffined(keys="image"), transforms.RandAffined),
    ]
    for ours, theirs in pairs:
        assert isinstance(ours, theirs) and isinstance(ours, transforms.InvertibleTransform)
        copy = pickle.loads(pickle.dumps(ours))
        assert type(copy) is type(ours)
    seen = []
    transform = gs_monai.Affine(**AFFINE, image_only=True)
    original = type(transform.resampler).__call__

    def spy(self, img, grid=None, *args, **kwargs):
        seen.append(type(grid).__name__)
        return original(self, img, grid, *args, **kwargs)

    type(transform.resampler).__call__ = spy
    try:
        transform(_image())
    finally:
        type(transform.resampler).__call__ = original
    assert seen == ["AffineGridPlan"]


@pytest.mark.parametrize("how", ["Compose.inverse", "Invertd"])
def test_pipelines_invert_through_monais_machinery(how):
    """A Compose of RandAffined on an image and its label, inverted by Compose.inverse and by Invertd (which find
    the drop-in as an InvertibleTransform and match its recorded operations): MONAI's result."""

    def run(module):
        image = _image(channels=1, size=(12, 10, 11), seed=4)
        label = MetaTensor((image.as_tensor() > 0.5).float())
        options = dict(keys=["image", "label"], mode=("bilinear", "nearest"), prob=1.0, rotate_range=(0.3,) * 3)
        pipeline = transforms.Compose([module.RandAffined(**options, padding_mode="zeros")])
        pipeline.set_random_state(7)
        out = pipeline({"image": image, "label": label})
        if how == "Compose.inverse":
            return pipeline.inverse(out)["image"]
        prediction = MetaTensor(
            out["image"].as_tensor().clone(), meta=out["image"].meta, applied_operations=out["image"].applied_operations
        )
        invert = transforms.Invertd(keys="pred", transform=pipeline, orig_keys="image", nearest_interp=False)
        return invert({**out, "pred": prediction})["pred"]

    assert_same_output(run(gs_monai), run(transforms), how)
