"""The records the CPU kernels take their arguments in, and the named constants they share.

A kernel never takes a tensor's array and its strides as two loose arguments: an
:class:`Operand` carries both, a :class:`Geometry` carries every size, and flags travel
as named records (:class:`~gridsampler3d.sampling.Outputs`, :class:`Rule`).
The call's :class:`~gridsampler3d.sampling.Sampling` and field kind reach the kernels as
one :class:`Rule` of plain ints and bools, made by :func:`kernel_rule` only. Numba passes tuples to
compiled code as plain structures, flattened into the arguments (so every array in them
still gets the ``noalias`` promise of :mod:`.jit`).

Records cross into a kernel as plain tuples (:func:`unnamed`), and the kernel names them
again on entry (``Geometry(*geometry)``, :func:`.block.borrow`), where that costs
nothing: Numba's dispatcher fingerprints a named tuple by its class and field names in
Python, about 0.4 us a record against 0.07 us for a plain tuple, and a backward launch
takes 12 records (6 us of an 8³ call's 20 us kernel call).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import numpy as np

from ..sampling import FieldKind, Outputs, Sampling

__all__ = [
    "ALL_TAPS",
    "AXIS_TAPS",
    "Carry",
    "CarryMode",
    "Rule",
    "Geometry",
    "Operand",
    "Outputs",
    "Cells",
    "Origin",
    "Points",
    "RowRanges",
    "kernel_rule",
    "unnamed",
]


class Operand(NamedTuple):
    """A tensor as a kernel reads or writes it: a flat 1-D array from its first element, and its element strides.

    ``strides`` follow the tensor's logical order: (n, c, d, h, w) for volumes, (n, d, h, w,
    component) for grids; a displacement's are given in grid order too (see
    :func:`.forward.forward_kernel`).
    """

    data: np.ndarray
    strides: tuple


class Geometry(NamedTuple):
    """The sizes of one call: batch N, channels C, the input's (D, H, W) and the output's (Do, Ho, Wo)."""

    batch: int
    channels: int
    sizes: tuple
    out_sizes: tuple


class Rule(NamedTuple):
    """A call's :class:`~gridsampler3d.sampling.Sampling` and field kind as the kernels read them
    (:func:`kernel_rule`).

    ``interpolation``, ``padding`` and ``field`` are the codes of the records' enums;
    ``forward`` marks the forward's rule (which differs from the backward's for NaN with
    border padding, as PyTorch's); ``exact_remainder`` takes libm's remainder for
    reflection (:func:`.coords.reflect_with_grad`). A kernel factory unpacks it into the
    constants its kernel is compiled with; the tricubic kernels and the slab planner take
    it as an argument.
    """

    interpolation: int
    padding: int
    align_corners: bool
    field: int
    forward: bool
    exact_remainder: bool


def kernel_rule(sampling: Sampling, field: FieldKind, *, forward: bool = False, exact_remainder: bool = False) -> Rule:
    """The :class:`Rule` of ``sampling`` and ``field``, in plain Python ints and bools."""
    return Rule(
        int(sampling.interpolation),
        int(sampling.padding),
        bool(sampling.align_corners),
        int(field),
        bool(forward),
        bool(exact_remainder),
    )


class Origin(NamedTuple):
    """Where a block of points stands: its first point's output column ``w``, its row's ``h`` and ``d``; for an
    affine field, its row of the voxel matrix as per-row bases and per-column steps (:func:`.block.row_origin`)."""

    w: float
    h: float
    d: float
    base_x: float
    base_y: float
    base_z: float
    step_x: float
    step_y: float
    step_z: float


class Points(NamedTuple):
    """A run of ``count`` consecutive output points of one row in a flat grid.

    Point i's x component sits at ``first + i * step``, its y and z ``component`` and twice
    ``component`` after it.
    """

    first: int
    step: int
    component: int
    count: int


class Cells(NamedTuple):
    """Phase A's results for a block of points (:func:`.block.trilinear_cells`), one part's scratch rows.

    ``coords`` (3 * BLOCK) the grid components; ``sides`` (6 * BLOCK) the axis weights;
    ``corner`` and ``other_corner`` the lowest corner's offset under two sets of strides;
    ``inside`` the taps in the volume; ``lowest`` the cell's low depth; ``mx``, ``my``,
    ``mz`` the grid gradient's multipliers (empty where no multipliers are kept).
    """

    coords: np.ndarray
    sides: np.ndarray
    corner: np.ndarray
    other_corner: np.ndarray
    inside: np.ndarray
    lowest: np.ndarray
    mx: np.ndarray
    my: np.ndarray
    mz: np.ndarray


class RowRanges(NamedTuple):
    """Per output row (n * Do * Ho + d * Ho + h), the least and greatest depth its points' lowest taps reach."""

    first: np.ndarray
    last: np.ndarray


class CarryMode(enum.IntEnum):
    """Where a pass of the grid gradient over a group of channels starts and ends its sums."""

    WHOLE = 0  # every channel in one pass: from zero into dgrid
    FIRST = 1  # the first group: from zero into the carried sums
    MIDDLE = 2  # from the carried sums into the carried sums
    LAST = 3  # from the carried sums into dgrid


class Carry(NamedTuple):
    """The grid gradient's sums carried between groups of channels: x, y, z rows of points, and the pass's mode."""

    sums: np.ndarray
    mode: int


#: Tap k of a cell steps x with bit 0, y with bit 1 and z with bit 2 (PyTorch's order).
#: AXIS_TAPS[2 * axis + side]: the taps on the low (side 0) or high (side 1) side of an axis.
AXIS_TAPS = (0x55, 0xAA, 0x33, 0xCC, 0x0F, 0xF0)
#: Every tap of a cell.
ALL_TAPS = 0xFF


def unnamed(arguments: tuple) -> tuple:
    """A kernel's arguments with every record in them, and every record in a record, a plain tuple (see above).

    Records nest two deep at most (an :class:`Operand` in the backward's operands, the
    :class:`Cells` in a scratch record); a record deeper down would pass named, correct
    but slower to dispatch. A record is told by its class deriving from ``tuple`` alone,
    without a call per argument: a small call passes about 60 values.
    """
    return tuple(
        [
            tuple([tuple(field) if tuple in type(field).__bases__ else field for field in argument])
            if tuple in type(argument).__bases__
            else argument
            for argument in arguments
        ]
    )
