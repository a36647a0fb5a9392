"""The differentiable functions and modules: ``grid_sample``, ``warp``, ``affine_warp``, ``integrate_velocity``,
``Warp3d`` and ``AffineWarp3d``.

Each parses and checks its call once (:func:`.call.parse_options`, :func:`.call.parse_call`;
a module parses its options when it is made) and hands the :class:`.call.Call` to
:func:`.autograd.sample`, the one autograd path of every kind of field. Torch tensors only
(the operators of :mod:`.api` take NumPy arrays too); under ``torch.autocast`` they compute
in float32, as PyTorch's grid sampler does.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

from . import backends, validate
from .autograd import eager, sample
from .call import AUTOCAST_DEVICE_TYPES, Call, Options, parse_call, parse_options
from .layout import from_ncdhw, to_ncdhw
from .modes import DataFormat, DisplacementFormat
from .sampling import Field, FieldKind

__all__ = [
    "AffineWarp3d",
    "BSplineWarp3d",
    "Warp3d",
    "affine_warp",
    "bspline_warp",
    "grid_sample",
    "integrate_velocity",
    "warp",
]

# What F.grid_sample warns when align_corners is None; its first sentence as PyTorch words it, so that a filter
# written for PyTorch's warning matches this one too.
ALIGN_CORNERS_DEFAULT_WARNING = (
    "Default grid_sample and affine_grid behavior has changed to align_corners=False since 1.3.0. "
    "Pass align_corners=True for the behaviour before it."
)


def grid_sample(
    input: Tensor,
    grid: Tensor,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: bool | None = False,
    data_format: str = "NCDHW",
) -> Tensor:
    """``torch.nn.functional.grid_sample`` for 5-D input, on this library's kernels; differentiable.

    Args:
        input: (N, C, Di, Hi, Wi), or (N, Di, Hi, Wi, C) with ``data_format="NDHWC"``.
        grid: (N, Do, Ho, Wo, 3), (x, y, z) normalised to [-1, 1].
        mode: "bilinear", "nearest" or "bicubic" (tricubic on 5-D input; or the integer codes).
        padding_mode: "zeros", "border" or "reflection" (or 0, 1, 2).
        align_corners: as in ``F.grid_sample``; None, as there, warns that the default is False and takes it.
        data_format: "NCDHW" or "NDHWC" for ``input`` and the output.

    Returns:
        (N, C, Do, Ho, Wo), or (N, Do, Ho, Wo, C) for NDHWC. 4-D input is passed on to
        ``F.grid_sample`` unchanged. Under ``torch.autocast`` it computes in float32, as
        PyTorch's grid sampler does.
    """
    if align_corners is None:  # as F.grid_sample takes it, with its warning
        warnings.warn(ALIGN_CORNERS_DEFAULT_WARNING, stacklevel=2)
        align_corners = False
    options = parse_options(mode, padding_mode, align_corners, data_format=data_format)
    if options.data_format == DataFormat.NCDHW and isinstance(input, Tensor) and input.ndim == 4:
        sampling = options.sampling
        return F.grid_sample(
            input, grid, sampling.interpolation.name.lower(), sampling.padding.name.lower(), sampling.align_corners
        )
    call = parse_call(
        FieldKind.GRID, options, input, grid=grid, arrays=False, runs=False, autocast=True, where="grid_sample"
    )
    return from_ncdhw(sample(call), options.data_format)


def _warp(volume, displacement, options: Options) -> Tensor:
    call = parse_call(
        FieldKind.DISPLACEMENT,
        options,
        volume,
        displacement=displacement,
        arrays=False,
        runs=False,
        autocast=True,
        where="warp",
    )
    return from_ncdhw(sample(call), options.data_format)


def warp(
    volume: Tensor,
    displacement: Tensor,
    mode: str = "bilinear",
    padding_mode: str = "border",
    align_corners: bool = True,
    data_format: str = "NCDHW",
    displacement_format: str = "N3DHW",
) -> Tensor:
    """Warp ``volume`` by a dense displacement field in voxels, with no grid tensor; differentiable.

    Output voxel (d, h, w) is ``volume`` sampled at voxel position (w + dx, h + dy, d + dz):
    the registration layer of VoxelMorph and MONAI's ``Warp``, fused. Neither the forward
    nor the backward builds an (N, D, H, W, 3) grid; the backward returns d(volume) and
    d(displacement) directly. ``warp(flow, flow)`` (a field warping itself) is supported.

    Args:
        volume: (N, C, D, H, W), or (N, D, H, W, C) with ``data_format="NDHWC"``.
        displacement: (N, 3, D, H, W) with channels (dz, dy, dx) in voxels, or
            (N, D, H, W, 3) (same component order) with ``displacement_format="NDHW3"``;
            same N, D, H, W, dtype and device as ``volume``.
        mode: "bilinear", "nearest" or "bicubic".
        padding_mode: "zeros", "border" or "reflection".
        align_corners: does not move the sampling position; it sets reflection's bounds
            (0 and size - 1 when True, -0.5 and size - 0.5 when False), as for a grid
            normalised with the same setting (docs/semantics.md).
        data_format: "NCDHW" or "NDHWC" for ``volume`` and the output.
        displacement_format: "N3DHW" or "NDHW3".

    Returns:
        The warped volume, shaped and laid out like ``volume``. Under ``torch.autocast``
        it computes in float32, as :func:`grid_sample` does.
    """
    options = parse_options(
        mode, padding_mode, align_corners, data_format=data_format, displacement_format=displacement_format
    )
    return _warp(volume, displacement, options)


def affine_warp(
    volume: Tensor,
    theta: Tensor,
    size=None,
    *,
    displacement: Tensor | None = None,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: bool = False,
    data_format: str = "NCDHW",
    displacement_format: str = "N3DHW",
) -> Tensor:
    """Sample ``volume`` at ``F.affine_grid(theta, ...)``, plus an optional displacement, with no grid; differentiable.

    Equal to ``F.grid_sample(volume, F.affine_grid(theta, (N, C, *size), align_corners), mode,
    padding_mode, align_corners)`` without a displacement; with one, each output voxel samples
    at the affine's position plus the displacement in input voxels (:func:`.api.affine_warp3d`,
    docs/semantics.md). Gradients flow to the volume, to theta (summed in float64 in a fixed
    order, never through a stored grid) and to the displacement.

    Args:
        volume: (N, C, D, H, W), or (N, D, H, W, C) with ``data_format="NDHWC"``.
        theta: (N, 3, 4), as ``F.affine_grid`` takes it; the volume's dtype and device.
        size: the output's (Do, Ho, Wo); default the volume's (D, H, W).
        displacement: None, or (N, 3, Do, Ho, Wo) (with ``displacement_format="NDHW3"``,
            (N, Do, Ho, Wo, 3)), components (dz, dy, dx) in input voxels.
        mode: "bilinear", "nearest" or "bicubic" (tricubic).
        padding_mode: "zeros", "border" or "reflection".
        align_corners: as in ``F.affine_grid`` and ``F.grid_sample``.

    Returns:
        (N, C, Do, Ho, Wo), or (N, Do, Ho, Wo, C) for NDHWC. Under ``torch.autocast`` it
        computes in float32, as PyTorch's grid sampler does.
    """
    options = parse_options(
        mode, padding_mode, align_corners, data_format=data_format, displacement_format=displacement_format
    )
    return _affine_warp(volume, theta, size, displacement, options, "affine_warp")


def _affine_warp(volume, theta, size, displacement, options: Options, where: str) -> Tensor:
    call = parse_call(
        FieldKind.AFFINE,
        options,
        volume,
        theta=theta,
        size=size,
        displacement=displacement,
        arrays=False,
        runs=False,
        autocast=True,
        where=where,
    )
    return from_ncdhw(sample(call), options.data_format)


def bspline_warp(
    volume: Tensor,
    control_points: Tensor,
    size=None,
    *,
    spacing=None,
    origin=None,
    theta: Tensor | None = None,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: bool = False,
    data_format: str = "NCDHW",
) -> Tensor:
    """Warp ``volume`` by a cubic B-spline free-form deformation, evaluated in the kernels; differentiable.

    Output voxel p = (d, h, w) samples the volume at ``p + u(p)`` (or, with ``theta``, at the
    affine's position ``M p + u(p)``, :func:`affine_warp`'s composition), ``u`` the cubic
    B-spline of ``control_points`` (:mod:`gridsampler3d.bspline`, docs/semantics.md). No
    dense field is made: the engines evaluate ``u`` per point and reduce the gradient with
    respect to the control points (and theta) inside their kernels, in float64, in a fixed
    order.

    Args:
        volume: (N, C, D, H, W), or (N, D, H, W, C) with ``data_format="NDHWC"``.
        control_points: (N, 3, Kd, Kh, Kw), K >= 4 on each axis: displacements (dz, dy, dx)
            in input voxels, ``gs.warp``'s order and units; the volume's dtype and device.
        size: the output's (Do, Ho, Wo); default the volume's (D, H, W).
        spacing: the control points' spacing in output voxels, one number or (d, h, w);
            default ``(S - 1) / (K - 3)`` per axis (the grid spans the output with one point
            beyond each end; 1 where S = 1).
        origin: the output voxel position of control point 0, one number or (d, h, w);
            default ``-spacing``.
        theta: None, or (N, 3, 4) as ``F.affine_grid`` takes it.
        mode: "bilinear", "nearest" or "bicubic" (tricubic).
        padding_mode: "zeros", "border" or "reflection".
        align_corners: as for :func:`warp` (reflection's bounds), and as in ``F.affine_grid``
            for ``theta``.
        data_format: "NCDHW" or "NDHWC" for ``volume`` and the output.

    Returns:
        (N, C, Do, Ho, Wo), or (N, Do, Ho, Wo, C) for NDHWC. Under ``torch.autocast`` it
        computes in float32, as PyTorch's grid sampler does.
    """
    options = parse_options(mode, padding_mode, align_corners, data_format=data_format)
    return _bspline_warp(volume, control_points, size, spacing, origin, theta, options, "bspline_warp")


def _bspline_warp(volume, control_points, size, spacing, origin, theta, options: Options, where: str) -> Tensor:
    call = parse_call(
        FieldKind.BSPLINE,
        options,
        volume,
        control_points=control_points,
        theta=theta,
        size=size,
        spacing=spacing,
        origin=origin,
        arrays=False,
        runs=False,
        autocast=True,
        where=where,
    )
    return from_ncdhw(sample(call), options.data_format)


def integrate_velocity(
    velocity: Tensor,
    steps: int = 7,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: bool = True,
    displacement_format: str = "N3DHW",
) -> Tensor:
    """Displacement of the flow of a stationary velocity field, by scaling and squaring; differentiable.

    ``u = velocity / 2**steps``, then ``steps`` times ``u = u + warp(u, u)``: the
    integration of MONAI's ``DVF2DDF`` and VoxelMorph's ``VecInt`` (whose defaults, zeros
    padding and align_corners=True, are these), each step one fused self-warp.

    Args:
        velocity: (N, 3, D, H, W), (dz, dy, dx) in voxels, or (N, D, H, W, 3) with
            ``displacement_format="NDHW3"``; a floating torch tensor.
        steps: the number of squarings (>= 0); 0 returns ``velocity`` unchanged.
        mode, padding_mode, align_corners: of each warp (see :func:`warp`).

    Returns:
        The displacement, shaped like ``velocity``.
    """
    steps = validate.check_steps(steps)
    options = parse_options(mode, padding_mode, align_corners, displacement_format=displacement_format)
    # The velocity is the warped volume too: its channels lie where its components do.
    last = options.displacement_format == DisplacementFormat.NDHW3
    options = options._replace(data_format=DataFormat.NDHWC if last else DataFormat.NCDHW)
    velocity = validate.check_velocity(velocity, options.displacement_format)
    device_type = velocity.device.type
    # Under autocast each warp computes in float32, as grid_sample's.
    if device_type in AUTOCAST_DEVICE_TYPES and torch.is_autocast_enabled(device_type):
        velocity = velocity.float()
    engine = None
    if eager(velocity):
        engine = backends.select_backend("auto", velocity.device)
    displacement = velocity / (2.0**steps)
    for _ in range(steps):
        view = to_ncdhw(displacement, options.data_format)
        field = Field(FieldKind.DISPLACEMENT, view, None, tuple(view.shape[2:]))
        step = Call(view, field, options, engine=engine)
        displacement = displacement + from_ncdhw(sample(step), options.data_format)
    return displacement


class _Sampler(torch.nn.Module):
    """A module whose attributes (``mode``, ``padding_mode``, ``align_corners``, the layouts) are parsed when they are
    set: a bad one is an error at construction (or assignment), and a call parses none again."""

    _OPTIONS = ("mode", "padding_mode", "align_corners", "data_format", "displacement_format")

    def __init__(self, mode, padding_mode, align_corners, data_format, displacement_format):
        super().__init__()
        self._ready = False
        self.mode, self.padding_mode, self.align_corners = mode, padding_mode, align_corners
        self.data_format, self.displacement_format = data_format, displacement_format
        self._ready = True
        self._parse()

    def _parse(self) -> None:
        self._options = parse_options(
            self.mode,
            self.padding_mode,
            self.align_corners,
            data_format=self.data_format,
            displacement_format=self.displacement_format,
        )

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name in self._OPTIONS and self.__dict__.get("_ready"):
            self._parse()

    def extra_repr(self) -> str:
        return (
            f"mode={self.mode!r}, padding_mode={self.padding_mode!r}, align_corners={self.align_corners}, "
            f"data_format={self.data_format!r}, displacement_format={self.displacement_format!r}"
        )


class Warp3d(_Sampler):
    """Warp a volume by a dense displacement field given in voxels (the registration layer): :func:`warp` as a module.

    ``forward(volume, displacement)``: volume (N, C, D, H, W), displacement (N, 3, D, H, W)
    with channels (dz, dy, dx) in voxels -> the volume sampled at identity + displacement,
    (N, C, D, H, W). Other layouts through ``data_format`` and ``displacement_format``.
    """

    def __init__(
        self,
        mode: str = "bilinear",
        padding_mode: str = "border",
        align_corners: bool = True,
        data_format: str = "NCDHW",
        displacement_format: str = "N3DHW",
    ):
        super().__init__(mode, padding_mode, align_corners, data_format, displacement_format)

    def forward(self, volume: Tensor, displacement: Tensor) -> Tensor:
        return _warp(volume, displacement, self._options)


class AffineWarp3d(_Sampler):
    """:func:`affine_warp` as a module: ``forward(volume, theta, displacement=None)``.

    volume (N, C, D, H, W), theta (N, 3, 4), an optional displacement (N, 3, Do, Ho, Wo) in
    voxels -> (N, C, Do, Ho, Wo), ``size`` (Do, Ho, Wo) fixed at construction (default: the
    volume's). Other layouts through ``data_format`` and ``displacement_format``.
    """

    def __init__(
        self,
        size=None,
        mode: str = "bilinear",
        padding_mode: str = "zeros",
        align_corners: bool = False,
        data_format: str = "NCDHW",
        displacement_format: str = "N3DHW",
    ):
        size = None if size is None else validate.check_size(size, None)
        super().__init__(mode, padding_mode, align_corners, data_format, displacement_format)
        self._size = size

    @property
    def size(self):
        """The output's (Do, Ho, Wo), or None for the volume's."""
        return self._size

    def forward(self, volume: Tensor, theta: Tensor, displacement: Tensor | None = None) -> Tensor:
        return _affine_warp(volume, theta, self._size, displacement, self._options, "AffineWarp3d")

    def extra_repr(self) -> str:
        return f"size={self._size}, {super().extra_repr()}"


class BSplineWarp3d(_Sampler):
    """:func:`bspline_warp` as a module: ``forward(volume, control_points, theta=None)``.

    volume (N, C, D, H, W), control points (N, 3, Kd, Kh, Kw) in voxels, an optional theta
    (N, 3, 4) -> (N, C, Do, Ho, Wo). ``size`` (Do, Ho, Wo) (default: the volume's), and the
    control grid's ``spacing`` and ``origin`` (default: spanning the output), are fixed at
    construction.
    """

    def __init__(
        self,
        size=None,
        *,
        spacing=None,
        origin=None,
        mode: str = "bilinear",
        padding_mode: str = "zeros",
        align_corners: bool = False,
        data_format: str = "NCDHW",
    ):
        size = None if size is None else validate.check_size(size, None)
        validate.check_bspline_grid(spacing, origin)
        super().__init__(mode, padding_mode, align_corners, data_format, "N3DHW")
        self._size, self._spacing, self._origin = size, spacing, origin

    @property
    def size(self):
        """The output's (Do, Ho, Wo), or None for the volume's."""
        return self._size

    def forward(self, volume: Tensor, control_points: Tensor, theta: Tensor | None = None) -> Tensor:
        return _bspline_warp(
            volume, control_points, self._size, self._spacing, self._origin, theta, self._options, "BSplineWarp3d"
        )

    def extra_repr(self) -> str:
        return (
            f"size={self._size}, spacing={self._spacing}, origin={self._origin}, mode={self.mode!r}, "
            f"padding_mode={self.padding_mode!r}, align_corners={self.align_corners}, data_format={self.data_format!r}"
        )
