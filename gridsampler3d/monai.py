"""MONAI's ``Affine`` and ``RandAffine`` with the sampling fused: MONAI makes the matrix, this library samples.

MONAI's affine transforms build a grid of output coordinates, multiply it by their 4 x 4
matrix and hand it to ``F.grid_sample``; building that grid costs as much as sampling. Here
MONAI's own transform (run lazily, so that it makes its matrix and nothing else) gives the
matrix, :func:`theta_from_monai` turns it into ``F.affine_grid``'s theta, and
:func:`gridsampler3d.affine_warp` samples with no grid tensor:

    from gridsampler3d.monai import Affine, RandAffine
    rotate = Affine(rotate_params=(0.1, 0.0, 0.2), scale_params=(1.1, 1.0, 0.9), padding_mode="border")
    output = rotate(image)                                  # image (C, D, H, W), as MONAI's

The results are MONAI's (to float32 rounding: the positions are computed in float64 here),
for ``normalized=False`` (MONAI's default), both ``align_corners``, and the interpolation
modes ``F.grid_sample`` takes (and ``"bicubic"``, tricubic, which MONAI's torch path lacks
in 3-D). The output is a torch tensor (C, *spatial_size) in the input's dtype, without
MONAI's metadata. MONAI is imported when a transform is made, not with this module.
"""

from __future__ import annotations

import torch

from .affine import theta_from_voxel_matrix
from .nn import affine_warp

__all__ = ["Affine", "RandAffine", "theta_from_monai"]


def theta_from_monai(affine, in_spatial, out_spatial, align_corners: bool = False) -> torch.Tensor:
    """The theta (1, 3, 4), float64, of MONAI's resampling by the 4 x 4 ``affine`` (``normalized=False``).

    MONAI maps output voxel i (spatial order (dim 1, dim 2, dim 3) of an image (C, *spatial))
    to ``p = affine @ (i - (S_out - 1) / 2, 1)``, scaled by ``max(S_out, 2) / (max(S_out, 2) - 1)``
    first with ``align_corners``, and hands ``2 p / max(2, S_in)`` to ``F.grid_sample``. That is
    one affine map from output voxels to input voxel positions, which this composes and turns
    into ``F.affine_grid``'s theta (:func:`.affine.theta_from_voxel_matrix`), axes reordered to
    (x, y, z) = (dim 3, dim 2, dim 1).
    """
    affine = torch.as_tensor(affine, dtype=torch.float64).cpu()
    in_spatial, out_spatial = tuple(int(size) for size in in_spatial), tuple(int(size) for size in out_spatial)
    linear, translation = affine[:3, :3], affine[:3, 3]
    if align_corners:
        linear = linear * torch.tensor([max(size, 2) / (max(size, 2) - 1) for size in out_spatial], dtype=torch.float64)
    # index_k = a_k p_k + b_k: F.grid_sample's unnormalisation of 2 p / max(2, S_in)
    scale = torch.tensor(
        [(size - 1 if align_corners else size) / max(2, size) for size in in_spatial], dtype=torch.float64
    )
    shift = torch.tensor([(size - 1) / 2 for size in in_spatial], dtype=torch.float64)
    centre = torch.tensor([(size - 1) / 2 for size in out_spatial], dtype=torch.float64)
    matrix = scale[:, None] * linear
    offset = scale * (translation - linear @ centre) + shift
    order = [2, 1, 0]  # MONAI's spatial order (dim 1, 2, 3) is (z, y, x)
    voxel = torch.cat([matrix[order][:, order], offset[order, None]], dim=1)[None]
    return theta_from_voxel_matrix(voxel, in_spatial, out_spatial, align_corners)


def _sample(image, theta, spatial_size, mode, padding_mode, align_corners) -> torch.Tensor:
    """image (C, *spatial) sampled at theta (1, 3, 4) into (C, *spatial_size)."""
    volume = image.as_tensor() if hasattr(image, "as_tensor") else torch.as_tensor(image)
    output = affine_warp(
        volume[None],
        theta.to(device=volume.device, dtype=volume.dtype),
        spatial_size,
        mode=mode,
        padding_mode=padding_mode,
        align_corners=align_corners,
    )
    return output[0]


def _spatial(image) -> tuple:
    return tuple(image.peek_pending_shape() if hasattr(image, "peek_pending_shape") else image.shape[1:])


class Affine:
    """``monai.transforms.Affine`` with the sampling fused (see the module's docstring).

    Takes MONAI's ``rotate_params``, ``shear_params``, ``translate_params``, ``scale_params``,
    ``affine``, ``spatial_size``, ``mode``, ``padding_mode`` (MONAI's default "reflection")
    and ``align_corners``; ``normalized`` must stay False.
    """

    def __init__(
        self,
        rotate_params=None,
        shear_params=None,
        translate_params=None,
        scale_params=None,
        affine=None,
        spatial_size=None,
        mode: str = "bilinear",
        padding_mode: str = "reflection",
        align_corners: bool = False,
    ):
        from monai.transforms import Affine as MonaiAffine

        self.monai = MonaiAffine(
            rotate_params=rotate_params,
            shear_params=shear_params,
            translate_params=translate_params,
            scale_params=scale_params,
            affine=affine,
            spatial_size=spatial_size,
            mode=mode,
            padding_mode=padding_mode,
            align_corners=align_corners,
            lazy=True,
        )
        self.mode, self.padding_mode, self.align_corners = mode, padding_mode, align_corners

    def __call__(self, image, spatial_size=None, mode: str | None = None, padding_mode: str | None = None):
        """image (C, D, H, W) (a tensor, MetaTensor or array) -> (C, *spatial_size), default the image's size."""
        from monai.utils import fall_back_tuple

        in_spatial = _spatial(image)
        out_spatial = fall_back_tuple(spatial_size or self.monai.spatial_size, in_spatial)
        _, affine = self.monai.affine_grid(spatial_size=out_spatial, lazy=True)
        theta = theta_from_monai(affine, in_spatial, out_spatial, self.align_corners)
        return _sample(
            image, theta, out_spatial, mode or self.mode, padding_mode or self.padding_mode, self.align_corners
        )


class RandAffine:
    """``monai.transforms.RandAffine`` with the sampling fused: MONAI's own randomisation (the same draws for the
    same seed, ``set_random_state``), its matrix, this library's sampling.

    Takes MONAI's arguments (``prob``, ``rotate_range``, ``shear_range``, ``translate_range``,
    ``scale_range``, ``spatial_size``, ``mode``, ``padding_mode`` (MONAI's default
    "reflection"), ``cache_grid`` is ignored); ``align_corners`` is ``F.grid_sample``'s,
    False as MONAI's resampler.
    """

    def __init__(
        self,
        prob: float = 0.1,
        rotate_range=None,
        shear_range=None,
        translate_range=None,
        scale_range=None,
        spatial_size=None,
        mode: str = "bilinear",
        padding_mode: str = "reflection",
        align_corners: bool = False,
    ):
        from monai.transforms import RandAffine as MonaiRandAffine

        self.monai = MonaiRandAffine(
            prob=prob,
            rotate_range=rotate_range,
            shear_range=shear_range,
            translate_range=translate_range,
            scale_range=scale_range,
            spatial_size=spatial_size,
            mode=mode,
            padding_mode=padding_mode,
            lazy=True,
        )
        self.mode, self.padding_mode, self.align_corners = mode, padding_mode, align_corners

    def set_random_state(self, seed=None, state=None) -> RandAffine:
        """Seed MONAI's random state, as ``monai.transforms.RandAffine.set_random_state``."""
        self.monai.set_random_state(seed, state)
        return self

    def __call__(
        self, image, spatial_size=None, mode: str | None = None, padding_mode: str | None = None, randomize: bool = True
    ):
        """image (C, D, H, W) -> (C, *spatial_size): randomised as MONAI's transform would be, then sampled here."""
        from monai.utils import ensure_tuple, fall_back_tuple

        if randomize:
            self.monai.randomize()
        in_spatial = _spatial(image)
        out_spatial = fall_back_tuple(spatial_size or self.monai.spatial_size, in_spatial)
        if not self.monai._do_transform and tuple(out_spatial) == ensure_tuple(in_spatial):
            volume = image.as_tensor() if hasattr(image, "as_tensor") else torch.as_tensor(image)
            return volume.float() if not volume.is_floating_point() else volume
        if self.monai._do_transform:
            self.monai.rand_affine_grid(out_spatial, randomize=randomize, lazy=True)
            affine = self.monai.rand_affine_grid.get_transformation_matrix()
        else:
            affine = torch.eye(4, dtype=torch.float64)
        theta = theta_from_monai(affine, in_spatial, out_spatial, self.align_corners)
        return _sample(
            image, theta, out_spatial, mode or self.mode, padding_mode or self.padding_mode, self.align_corners
        )
