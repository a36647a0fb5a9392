"""MONAI's ``Affine``, ``RandAffine``, ``Affined`` and ``RandAffined`` as drop-ins, sampling on the fused affine field.

Each class here is MONAI's own transform (a subclass: the same arguments, draws, outputs,
``MetaTensor`` metadata, ``applied_operations``, ``inverse()``, lazy application and
dictionary behaviour) in which two parts are replaced:

- the grid maker (MONAI's ``AffineGrid``, ``RandAffineGrid``, ``RandAffine``'s identity grid)
  hands over the matrix it would multiply the identity grid by, not the grid
  (:class:`AffineGridPlan`), so no grid tensor of the output's size is made;
- the resampler (MONAI's ``Resample``) samples at that matrix with
  :func:`gridsampler3d.affine_warp` (:func:`theta_from_monai`), in the dtype MONAI would
  sample in, and returns what MONAI's would (float32, the input's type and metadata).

Where this library's kernels do not apply, the resampler makes MONAI's grid from the plan
and runs MONAI's own code: 2-D images, integer (spline order) modes, MONAI's compiled
backend, an ``align_corners`` the grid and the resampler do not share, or a grid given by
the caller. Inverses (``inverse()``, ``Invertd``) run MONAI's code as they are.

    from gridsampler3d.monai import RandAffined
    augment = RandAffined(keys=["image", "label"], mode=("bilinear", "nearest"), prob=1.0,
                          rotate_range=(0.3, 0.3, 0.3), padding_mode="zeros")

The results are MONAI's to float32 rounding: MONAI builds its grid in float32, this
library its positions in float64. This module imports MONAI; ``import gridsampler3d``
does not import this module.
"""

from __future__ import annotations

import numpy as np
import torch

try:
    from monai.config import USE_COMPILED
    from monai.data import MetaTensor
    from monai.data.meta_obj import get_track_meta
    from monai.transforms import Affine as _Affine
    from monai.transforms import Affined as _Affined
    from monai.transforms import AffineGrid as _AffineGrid
    from monai.transforms import RandAffine as _RandAffine
    from monai.transforms import RandAffined as _RandAffined
    from monai.transforms import RandAffineGrid as _RandAffineGrid
    from monai.transforms import Resample as _Resample
    from monai.transforms.utils import create_grid, resolves_modes
    from monai.utils import (
        TransformBackends,
        convert_data_type,
        convert_to_dst_type,
        convert_to_tensor,
        fall_back_tuple,
        get_equivalent_dtype,
    )
except ImportError as error:  # pragma: no cover - the module is MONAI's drop-ins
    raise ImportError(f"gridsampler3d.monai needs MONAI (pip install monai): {error}") from error

from .affine import theta_from_voxel_matrix
from .nn import affine_warp

__all__ = ["Affine", "Affined", "AffineGridPlan", "RandAffine", "RandAffined", "theta_from_monai"]


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


# What this library samples: F.grid_sample's torch modes (MONAI's names resolved by resolves_modes).
_MODES = ("bilinear", "nearest")
_PADDINGS = ("zeros", "border", "reflection")


class AffineGridPlan:
    """The grid MONAI would make, not made: the matrix ``affine`` ((r + 1) x (r + 1), or None for the identity) it
    would apply to the identity grid of ``spatial_size``, with the grid maker's ``align_corners``, ``dtype`` and
    ``device``. :meth:`grid` makes it as MONAI would."""

    def __init__(self, affine, spatial_size, align_corners: bool, dtype, device):
        self.affine, self.spatial_size = affine, tuple(int(size) for size in spatial_size)
        self.align_corners, self.dtype, self.device = align_corners, dtype, device

    def grid(self) -> torch.Tensor:
        """MONAI's grid (r + 1, *spatial_size): ``create_grid``'s identity, or ``AffineGrid``'s product."""
        if self.affine is None:
            return create_grid(spatial_size=self.spatial_size, device=self.device, backend="torch")
        grid_maker = _AffineGrid(
            affine=self.affine, align_corners=self.align_corners, dtype=self.dtype, device=self.device
        )
        return grid_maker(self.spatial_size, lazy=False)[0]

    def __repr__(self) -> str:
        return f"AffineGridPlan(spatial_size={self.spatial_size}, align_corners={self.align_corners})"


def _grid_dtype(dtype):
    """The dtype of the grid, and of the matrix returned with it, that MONAI's ``AffineGrid`` makes for ``dtype``."""
    return dtype if dtype is not None else torch.float32


class _FusedAffineGrid(_AffineGrid):
    """MONAI's ``AffineGrid`` that returns an :class:`AffineGridPlan` for a 3-D grid it would make from a size."""

    def __call__(self, spatial_size=None, grid=None, lazy=None):
        lazy_ = self.lazy if lazy is None else lazy
        if lazy_ or grid is not None or spatial_size is None or len(spatial_size) != 3:
            return super().__call__(spatial_size, grid, lazy)
        _, affine = super().__call__(spatial_size, None, lazy=True)
        returned = convert_to_tensor(
            affine, device=self.device or torch.device("cpu"), dtype=_grid_dtype(self.dtype), track_meta=False
        )
        return AffineGridPlan(affine, spatial_size, self.align_corners, self.dtype, self.device), returned


class _FusedRandAffineGrid(_RandAffineGrid):
    """MONAI's ``RandAffineGrid`` that, given an identity :class:`AffineGridPlan`, draws as MONAI's does and returns
    the plan of its matrix."""

    def __call__(self, spatial_size=None, grid=None, randomize=True, lazy=None):
        lazy_ = self.lazy if lazy is None else lazy
        if lazy_ or not isinstance(grid, AffineGridPlan):
            return super().__call__(spatial_size, grid, randomize, lazy)
        if grid.affine is not None:  # not an identity: MONAI's own path on the grid itself
            return super().__call__(spatial_size, grid.grid(), randomize, lazy)
        if randomize:
            self.randomize()
        grid_maker = _AffineGrid(
            rotate_params=self.rotate_params,
            shear_params=self.shear_params,
            translate_params=self.translate_params,
            scale_params=self.scale_params,
            device=self.device,
            dtype=self.dtype,
            lazy=True,
        )
        _, affine = grid_maker(grid.spatial_size)
        self.affine = convert_to_tensor(
            affine, device=self.device or torch.device("cpu"), dtype=_grid_dtype(self.dtype), track_meta=False
        )
        return AffineGridPlan(affine, grid.spatial_size, False, self.dtype, self.device)


class _FusedResample(_Resample):
    """MONAI's ``Resample`` that samples an :class:`AffineGridPlan` with :func:`gridsampler3d.affine_warp` where it
    can, and MONAI's grid with MONAI's code otherwise."""

    def __call__(self, img, grid=None, mode=None, padding_mode=None, dtype=None, align_corners=None):
        if not isinstance(grid, AffineGridPlan):
            return super().__call__(img, grid, mode, padding_mode, dtype, align_corners)
        img = convert_to_tensor(img, track_meta=get_track_meta())
        _align_corners = self.align_corners if align_corners is None else align_corners
        spatial = tuple(img.peek_pending_shape() if isinstance(img, MetaTensor) else img.shape[1:])
        backend, interpolation, padding, _ = resolves_modes(
            self.mode if mode is None else mode,
            self.padding_mode if padding_mode is None else padding_mode,
            backend=None,
            use_compiled=USE_COMPILED,
        )
        fused = (
            backend == TransformBackends.TORCH
            and not USE_COMPILED
            and self.norm_coords
            and len(spatial) == 3
            and tuple(img.shape[1:]) == spatial  # no pending (lazy) operation
            and str(interpolation) in _MODES
            and str(padding) in _PADDINGS
            and isinstance(_align_corners, bool)
            and _align_corners == grid.align_corners
        )
        if not fused:
            return super().__call__(img, grid.grid(), mode, padding_mode, dtype, align_corners)
        _dtype = dtype or self.dtype or img.dtype
        if (
            img.dtype == torch.float32
            and img.device.type == "cpu"
            and get_equivalent_dtype(_dtype, torch.Tensor) == (torch.float64)
        ):
            # The CPU kernels compute in float64 and round a float32 result once: the float64 computation MONAI asks
            # for, rounded to the float32 MONAI returns, without widening the image first.
            _dtype = torch.float32
        image, *_ = convert_data_type(img, torch.Tensor, dtype=_dtype, device=img.device)
        volume = image.as_tensor() if isinstance(image, MetaTensor) else image
        affine = torch.eye(4, dtype=torch.float64) if grid.affine is None else grid.affine
        theta = theta_from_monai(affine, spatial, grid.spatial_size, _align_corners)
        output = affine_warp(
            volume[None],
            theta.to(device=volume.device, dtype=volume.dtype),
            grid.spatial_size,
            mode=str(interpolation),
            padding_mode=str(padding),
            align_corners=_align_corners,
        )[0]
        return convert_to_dst_type(output, dst=img, dtype=np.float32)[0]


def _fuse_affine(transform):
    """MONAI's ``Affine`` ``transform``, its grid maker and resampler replaced (their state is MONAI's own)."""
    transform.affine_grid.__class__ = _FusedAffineGrid
    transform.resampler.__class__ = _FusedResample
    return transform


def _fuse_rand_affine(transform):
    """MONAI's ``RandAffine`` ``transform`` as this module's :class:`RandAffine`."""
    transform.__class__ = RandAffine
    transform.rand_affine_grid.__class__ = _FusedRandAffineGrid
    transform.resampler.__class__ = _FusedResample
    return transform


class Affine(_Affine):
    """``monai.transforms.Affine``, the same arguments and outputs, sampling on the fused affine field (the module's
    docstring): image (C, *spatial) -> (C, *spatial_size), a ``MetaTensor`` where MONAI returns one, with
    ``image_only=False`` (MONAI's default) the pair (image, affine)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _fuse_affine(self)


class RandAffine(_RandAffine):
    """``monai.transforms.RandAffine``: MONAI's draws (``set_random_state``), arguments and outputs, sampling on the
    fused affine field (the module's docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _fuse_rand_affine(self)

    def get_identity_grid(self, spatial_size, lazy):
        """MONAI's identity grid of a 3-D ``spatial_size``, as an :class:`AffineGridPlan` (not made); MONAI's own
        otherwise."""
        if lazy or len(spatial_size) != 3:
            return super().get_identity_grid(spatial_size, lazy)
        if spatial_size != fall_back_tuple(spatial_size, [1] * 3) or spatial_size != fall_back_tuple(
            spatial_size, [2] * 3
        ):
            raise RuntimeError(f"spatial_size should not be dynamic, got {spatial_size}.")
        return AffineGridPlan(None, spatial_size, False, None, self.rand_affine_grid.device)


class Affined(_Affined):
    """``monai.transforms.Affined`` (the dictionary version: keys, per-key modes, ``allow_missing_keys``, inverse)
    on this module's :class:`Affine`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.affine.__class__ = Affine
        _fuse_affine(self.affine)


class RandAffined(_RandAffined):
    """``monai.transforms.RandAffined`` (the dictionary version: one draw for all keys, per-key modes, inverse) on this
    module's :class:`RandAffine`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _fuse_rand_affine(self.rand_affine)
