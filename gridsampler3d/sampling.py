"""What a call samples, and how: the records made once at the API edge and handed unchanged to every engine.

    Sampling(interpolation, padding, align_corners)   how a value is read at a position
    Field(kind, tensor, theta, size)                  where: the kind of field and the tensors that hold it
    Outputs(dx, dfield, dtheta)                       which gradients a backward computes
    Gradients(dx, dfield, dtheta)                     what it returns

A backend (:class:`.backends.Backend`) takes these records; its planner, its executors,
its kernel factories (as their cache key: ``(sampling, field.kind)``) and its coordinate
rules read them as they are, and each engine turns them into constants only at the last
step, where a Numba kernel or a Triton ``constexpr`` needs scalars. A new kind of field is
a new :class:`FieldKind`, not a new flag in every signature.

The field kinds and the layout each engine sees (logical NCDHW order, any strides):

    GRID                 tensor (N, Do, Ho, Wo, 3)   normalised (x, y, z) in [-1, 1] per output point
    DISPLACEMENT         tensor (N, 3, Do, Ho, Wo)   (dz, dy, dx) in input voxels from the output point's
                                                     own position (the fused warp: the input's sizes)
    AFFINE               theta (N, 3, 4), size       ``F.affine_grid``'s theta; the output's (Do, Ho, Wo)
    AFFINE_DISPLACEMENT  theta, tensor (N, 3, Do, Ho, Wo)   the affine's position plus a displacement in
                                                     input voxels
    BSPLINE              tensor (N, 3, Kd, Kh, Kw), size   control points of a cubic B-spline displacement
                                                     (dz, dy, dx) in input voxels from the output point's
                                                     own position; ``parameters``: the control grid's
                                                     spacing and origin (:mod:`.bspline`)
    BSPLINE_AFFINE       theta, tensor (N, 3, Kd, Kh, Kw), size   the affine's position plus the B-spline's
                                                     displacement

An affine field samples output voxel (w, h, d) at the input voxel position
``M @ (w, h, d, 1)``, where ``M`` (:func:`.affine.voxel_matrix`) is theta in voxel terms
(docs/semantics.md, "The affine field").
"""

from __future__ import annotations

import dataclasses
import enum
import math
import operator
from typing import NamedTuple

import torch

from .layout import memory_format_of
from .modes import Interpolation, Padding, parse_align_corners, parse_interpolation, parse_padding

__all__ = ["FieldKind", "Field", "Gradients", "Sampling", "Outputs"]


class FieldKind(enum.IntEnum):
    """What the positions of a call are given as; the values are the codes the kernels compare with."""

    GRID = 0  # normalised coordinates, (N, Do, Ho, Wo, 3) as (x, y, z)
    DISPLACEMENT = 1  # voxels from each output point's own position, (N, 3, Do, Ho, Wo) as (dz, dy, dx)
    AFFINE = 2  # an affine theta (N, 3, 4), as F.affine_grid takes it
    AFFINE_DISPLACEMENT = 3  # an affine theta, plus a displacement in voxels from its position
    BSPLINE = 4  # a cubic B-spline displacement's control points, (N, 3, Kd, Kh, Kw) as (dz, dy, dx)
    BSPLINE_AFFINE = 5  # an affine theta, plus a B-spline displacement from its position

    # Each member's facts, set below as plain attributes (read on every call, by every layer):
    in_voxels: bool  # the positions are voxel indices (slope 1) rather than normalised coordinates
    affine: bool  # the field has an affine theta
    displaced: bool  # the field's tensor is a displacement (N, 3, Do, Ho, Wo)
    spline: bool  # the field's tensor is a B-spline's control points (N, 3, Kd, Kh, Kw)


for _kind in FieldKind:
    _kind.in_voxels = _kind != FieldKind.GRID
    _kind.affine = _kind in (FieldKind.AFFINE, FieldKind.AFFINE_DISPLACEMENT, FieldKind.BSPLINE_AFFINE)
    _kind.displaced = _kind in (FieldKind.DISPLACEMENT, FieldKind.AFFINE_DISPLACEMENT)
    _kind.spline = _kind in (FieldKind.BSPLINE, FieldKind.BSPLINE_AFFINE)
del _kind


class Sampling(NamedTuple):
    """How a value is read at a position: interpolation, padding and ``align_corners``.

    Immutable and hashable: the engines key their plans and compiled kernels on it. A named
    tuple rather than a dataclass, for its hash and equality in C: every call looks up a
    plan and two kernels by it.
    """

    interpolation: Interpolation = Interpolation.BILINEAR
    padding: Padding = Padding.ZEROS
    align_corners: bool = False

    @classmethod
    def parse(cls, interpolation_mode="bilinear", padding_mode="zeros", align_corners=False) -> Sampling:
        """The record of the API's attributes: names or aclnn codes (:mod:`.modes`), and a bool."""
        return cls(
            parse_interpolation(interpolation_mode), parse_padding(padding_mode), parse_align_corners(align_corners)
        )

    def __str__(self) -> str:
        corners = ", align_corners" if self.align_corners else ""
        return f"{self.interpolation.name.lower()}, {self.padding.name.lower()}{corners}"


class Outputs(NamedTuple):
    """Which gradients a backward computes: dx, the field's tensor's (a grid's or a displacement's), theta's."""

    dx: bool = True
    dfield: bool = True
    dtheta: bool = False


class Gradients(NamedTuple):
    """What a backward returns: dx, the gradient of the field's tensor and of theta; None where not computed."""

    dx: torch.Tensor | None = None
    dfield: torch.Tensor | None = None
    dtheta: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class Field:
    """The positions a call samples at: their kind, the tensors that hold them, in the engines' layout, and the
    output's sizes.

    ``tensor`` is a logical view (any strides, nothing copied): a grid (N, Do, Ho, Wo, 3), a
    displacement (N, 3, Do, Ho, Wo) or a B-spline's control points (N, 3, Kd, Kh, Kw) (see
    the module's table), None for an affine field without a displacement. The engines read
    it through :meth:`point_strides` and write its gradient in :meth:`gradient_format`.
    ``theta`` (N, 3, 4) is an affine field's. ``out_sizes`` is the output's (Do, Ho, Wo),
    ``parameters`` the numbers a kind of field carries beside its tensors (a B-spline's
    spacing and origin per axis, :func:`.bspline.grid_of`; no other kind has any): together
    with ``kind`` they are what the custom ops take besides the tensors (:mod:`.autograd`).

    ``derived`` keeps what the engines derive from the record's tensors (an affine field's
    voxel matrix, whether theta is finite), so that a forward and its backward, which share
    the record, derive it once. Its entries are keyed by what else they depend on.
    """

    kind: FieldKind
    tensor: torch.Tensor | None
    theta: torch.Tensor | None
    out_sizes: tuple
    parameters: tuple = ()
    derived: dict = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def grid(cls, grid: torch.Tensor) -> Field:
        """A grid's field: ``grid`` (N, Do, Ho, Wo, 3)."""
        return cls(FieldKind.GRID, grid, None, tuple(grid.shape[1:4]))

    @classmethod
    def displacement(cls, displacement: torch.Tensor) -> Field:
        """A displacement's field: ``displacement`` (N, 3, D, H, W), a logical view."""
        return cls(FieldKind.DISPLACEMENT, displacement, None, tuple(displacement.shape[2:]))

    @classmethod
    def affine(cls, theta: torch.Tensor, size, displacement: torch.Tensor | None = None) -> Field:
        """An affine field: ``theta`` (N, 3, 4), output ``size`` (Do, Ho, Wo), and an optional displacement
        (N, 3, Do, Ho, Wo) added to the affine's position."""
        kind = FieldKind.AFFINE if displacement is None else FieldKind.AFFINE_DISPLACEMENT
        return cls(kind, displacement, theta, tuple(size))

    @classmethod
    def bspline(cls, control_points: torch.Tensor, size, parameters, theta: torch.Tensor | None = None) -> Field:
        """A B-spline field: ``control_points`` (N, 3, Kd, Kh, Kw), output ``size`` (Do, Ho, Wo), ``parameters``
        (:func:`.bspline.grid_of`), and an optional ``theta`` (N, 3, 4) whose position the B-spline displaces."""
        kind = FieldKind.BSPLINE if theta is None else FieldKind.BSPLINE_AFFINE
        return cls(kind, control_points, theta, tuple(size), tuple(parameters))

    @property
    def batch(self) -> int:
        """N."""
        return (self.theta if self.tensor is None else self.tensor).shape[0]

    @property
    def points(self) -> int:
        """N * Do * Ho * Wo: how many points the field gives."""
        return self.batch * math.prod(self.out_sizes)

    def point_strides(self, strides=None) -> tuple[int, ...]:
        """The field's element strides in point order (n, d, h, w, component), components in the kind's own order.

        ``strides`` default to the tensor's; given, they are another tensor's of the field's
        shape (its gradient's, or a copy's in another dtype).
        """
        strides = tuple(self.tensor.stride() if strides is None else strides)
        return POINT_ORDER(strides) if self.kind.displaced else strides

    def gradient_format(self) -> torch.memory_format:
        """The memory format of the field's gradient: a grid's is contiguous, a displacement's laid out like it
        (:func:`.layout.memory_format_of`)."""
        if not self.kind.displaced or self.tensor.is_contiguous():
            return torch.contiguous_format
        return memory_format_of(self.tensor)


#: A displacement's (N, 3, Do, Ho, Wo) strides in point order (n, d, h, w, component).
POINT_ORDER = operator.itemgetter(0, 2, 3, 4, 1)
