"""A B-spline field in the CPU kernels: each output row's coefficients, the displacement of its points, and the
gradient with respect to the control points summed row by row.

The engine hands the kernels, in place of a displacement, the control points summed along
d, ``T`` (N, 3, Do, Kh + 1, Kw + 1) (the d step of
:func:`gridsampler3d.bspline.row_coefficients`, float64, with a zero row Kh and a zero
column Kw), strides in the kernels' order (n, d, b, c, -component: its dx 2 components
above dz, as a displacement's). The field's constants (the array that holds an affine
field's voxel matrix first) hold the supports along w and along h
(:func:`gridsampler3d.bspline.axis_table`): for each output column, nine rows of Wo
entries (four weights, four control indices, where the column's run of equal indices
ends); for each output row h, eight rows of Ho entries (four weights, four indices). An
index outside the grid is given as the zero row or column, so that its term adds nothing
whatever the weight. The constants end with (where the columns start, Wo, where the rows
start, Ho, Kw).

At the start of an output row (n, d, h) a kernel sums ``T`` along h into the row's
coefficients ``V`` (3 x (Kw + 1), x, y and z one after the other; :func:`fill_row`); a
point at column w then has the displacement ``sum over m of weight_m V[index_m]``, m in
order (:func:`spline_coordinates`, a run of columns at a time, so that the loop over the
points vectorises). The backward adds ``weight_m g`` into the row's sums ``R`` (laid out as
``V``) point by point, in order (:func:`add_row_sums`), and at the row's end adds ``R``
along h into ``dT`` (shaped like ``T``; :func:`fold_row`): each (n, d) plane of ``dT`` is
summed by one part, its rows in order, so its bits do not depend on the thread count.
:func:`gridsampler3d.bspline.plane_control_gradient` then sums ``dT`` along d.
"""

from __future__ import annotations

import numpy as np
import torch

from ..bspline import contract, tables
from .jit import helper
from .tuning import BLOCK

__all__ = [
    "HEADER",
    "TABLE_ROWS",
    "add_row_sums",
    "add_run_sums",
    "coefficient_entries",
    "columns_at",
    "field_constants",
    "fill_row",
    "fold_row",
    "planes",
    "row_width",
    "spline_coordinates",
    "spline_displacement",
]

#: Rows of the columns' table in the constants: four weights, four control indices, the run's end.
TABLE_ROWS = 9
#: Entries at the end of the constants: where the columns start, Wo, where the rows start, Ho, Kw.
HEADER = 5


@helper
def columns_at(constants):
    """(the columns' table, Wo, Kw + 1) from the field's ``constants``: row ``r`` of column ``w`` at ``r * Wo + w``;
    Kw + 1 the length of each component's run in a row's coefficients (a scratch row may be longer)."""
    size = constants.size
    first, width = np.int64(constants[size - 5]), np.int64(constants[size - 4])
    return constants[first : first + TABLE_ROWS * width], width, np.int64(constants[size - 1]) + 1


@helper
def row_width(constants):
    """The length of a row's coefficients (and sums) per component: Kw + 1 (the zero column)."""
    return np.int64(constants[constants.size - 1]) + 1


def coefficient_entries(constants) -> int:
    """How many entries a row's coefficients (or sums) take in a kernel's scratch, from a B-spline field's
    ``constants``: 3 * (Kw + 1)."""
    return 3 * (int(constants[-1]) + 1)


@helper
def fill_row(planes, at, b_step, c_step, component, constants, h, row):
    """The coefficients of output row h, ``row[a * (Kw + 1) + c]`` (a = 0, 1, 2: x, y, z; c up to Kw), from ``planes``
    (``T``) whose (n, d) plane's dx for b = c = 0 sits at ``at`` (dy ``component`` and dz twice that after it):
    the sum over m of the row's weight times ``T`` at its index, in m order."""
    size = constants.size
    first, height = np.int64(constants[size - 3]), np.int64(constants[size - 2])
    width = row_width(constants)
    for a in range(3):
        target = row[a * width : (a + 1) * width]
        target[:] = 0.0
        for m in range(4):  # m outer, c inner: the loop over c vectorises, each entry's sum still in m order
            weight = constants[first + m * height + h]
            base = at + a * component + np.int64(constants[first + (4 + m) * height + h]) * b_step
            for c in range(width):
                target[c] += weight * planes[np.uint64(base + c * c_step)]  # unsigned: no wrap-around select


@helper
def fold_row(planes, at, b_step, c_step, component, constants, h, row):
    """Add the sums ``row`` of output row h (laid out as :func:`fill_row`'s) into ``planes`` (``dT``, laid out as
    ``T``) at the row's indices, times its weights; the zero row and column gather what the grid leaves out."""
    size = constants.size
    first, height = np.int64(constants[size - 3]), np.int64(constants[size - 2])
    width = row_width(constants)
    for a in range(3):
        source = row[a * width : (a + 1) * width]
        for m in range(4):
            weight = constants[first + m * height + h]
            base = at + a * component + np.int64(constants[first + (4 + m) * height + h]) * b_step
            for c in range(width):
                planes[np.uint64(base + c * c_step)] += weight * source[c]


@helper
def spline_displacement(row, columns, w):
    """(dx, dy, dz) of the point at column ``w`` from its row's coefficients ``row`` (:func:`fill_row`); ``columns``
    from :func:`columns_at`."""
    table, width, length = columns
    total_x = total_y = total_z = 0.0
    for m in range(4):
        weight = table[m * width + w]
        c = np.int64(table[(4 + m) * width + w])
        total_x += weight * row[c]
        total_y += weight * row[length + c]
        total_z += weight * row[2 * length + c]
    return total_x, total_y, total_z


@helper
def spline_coordinates(row, count, columns, start, coords):
    """coords[a * BLOCK + i] (a = 0, 1, 2: x, y, z): the displacement of point i of a block of ``count`` from column
    ``start``, as :func:`spline_displacement` computes it, one run of columns at a time (the phase A read of
    :func:`.block.grid_coordinates` for a B-spline)."""
    table, width, length = columns
    i = 0
    while i < count:
        w = start + i
        end = min(np.int64(table[8 * width + w]), start + count) - start
        c0, c1 = np.int64(table[4 * width + w]), np.int64(table[5 * width + w])
        c2, c3 = np.int64(table[6 * width + w]), np.int64(table[7 * width + w])
        x0, x1, x2, x3 = row[c0], row[c1], row[c2], row[c3]
        y0, y1, y2, y3 = row[length + c0], row[length + c1], row[length + c2], row[length + c3]
        z0, z1 = row[2 * length + c0], row[2 * length + c1]
        z2, z3 = row[2 * length + c2], row[2 * length + c3]
        # Indices typed unsigned: a flat index that might be negative wraps around, a select per access that keeps
        # the loop scalar (docs/cpu.md); views per run cost more than a run of a few points.
        for k in range(i, end):
            column = np.uint64(start + k)
            w0, w1 = table[column], table[column + np.uint64(width)]
            w2, w3 = table[column + np.uint64(2 * width)], table[column + np.uint64(3 * width)]
            coords[np.uint64(k)] = (((0.0 + w0 * x0) + w1 * x1) + w2 * x2) + w3 * x3
            coords[np.uint64(BLOCK + k)] = (((0.0 + w0 * y0) + w1 * y1) + w2 * y2) + w3 * y3
            coords[np.uint64(2 * BLOCK + k)] = (((0.0 + w0 * z0) + w1 * z1) + w2 * z2) + w3 * z3
        i = end


@helper
def add_run_sums(sums, columns, start, count, g_x, g_y, g_z):
    """Add the gradients (g_x[i], g_y[i], g_z[i]) of a block's ``count`` points from column ``start``, times each
    support weight of their columns, into their row's sums ``sums``: one run of columns at a time, each run's
    twelve sums (points in order) kept in registers and added once (:func:`add_row_sums`, a run at a time)."""
    table, width, length = columns
    i = 0
    while i < count:
        w = start + i
        end = min(np.int64(table[8 * width + w]), start + count) - start
        x0 = x1 = x2 = x3 = y0 = y1 = y2 = y3 = z0 = z1 = z2 = z3 = 0.0
        for k in range(i, end):
            column = start + k
            w0, w1 = table[column], table[width + column]
            w2, w3 = table[2 * width + column], table[3 * width + column]
            gx, gy, gz = g_x[k], g_y[k], g_z[k]
            x0 += w0 * gx
            x1 += w1 * gx
            x2 += w2 * gx
            x3 += w3 * gx
            y0 += w0 * gy
            y1 += w1 * gy
            y2 += w2 * gy
            y3 += w3 * gy
            z0 += w0 * gz
            z1 += w1 * gz
            z2 += w2 * gz
            z3 += w3 * gz
        c0, c1 = np.int64(table[4 * width + w]), np.int64(table[5 * width + w])
        c2, c3 = np.int64(table[6 * width + w]), np.int64(table[7 * width + w])
        sums[c0] += x0
        sums[c1] += x1
        sums[c2] += x2
        sums[c3] += x3
        sums[length + c0] += y0
        sums[length + c1] += y1
        sums[length + c2] += y2
        sums[length + c3] += y3
        sums[2 * length + c0] += z0
        sums[2 * length + c1] += z1
        sums[2 * length + c2] += z2
        sums[2 * length + c3] += z3
        i = end


@helper
def add_row_sums(sums, columns, w, g_x, g_y, g_z):
    """Add one point's gradient (g_x, g_y, g_z) with respect to its position, times each support weight of its
    column ``w``, into its row's sums ``sums`` (laid out as :func:`fill_row`'s coefficients)."""
    table, width, length = columns
    for m in range(4):
        weight = table[m * width + w]
        c = np.int64(table[(4 + m) * width + w])
        sums[c] += weight * g_x
        sums[length + c] += weight * g_y
        sums[2 * length + c] += weight * g_z


def planes(field) -> torch.Tensor:
    """``T`` (N, 3, Do, Kh + 1, Kw + 1), float64: a B-spline field's control points summed along d (the d step of
    :func:`gridsampler3d.bspline.row_coefficients`), with a zero row and a zero column."""
    control_points = field.tensor.detach().to(torch.float64)
    depth = tables(field.out_sizes, control_points.shape[2:], field.parameters)[0]
    return torch.nn.functional.pad(contract(control_points, 2, *depth), (0, 1, 0, 1)).contiguous()


def field_constants(field, before: int) -> np.ndarray:
    """A B-spline field's part of the constants (the module's docstring), float64, following ``before`` entries (an
    affine field's voxel matrix): the columns' table, the rows' table, the header."""
    control_h, control_w = field.tensor.shape[3], field.tensor.shape[4]
    _, along_h, along_w = tables(field.out_sizes, field.tensor.shape[2:], field.parameters)
    column_index = np.where(along_w.valid, along_w.index, control_w)  # outside the grid: the zero column
    width = column_index.shape[0]
    changes = np.flatnonzero((column_index[1:] != column_index[:-1]).any(axis=1)) + 1
    ends = np.append(changes, width)[np.searchsorted(changes, np.arange(width), side="right")]
    columns = np.concatenate([along_w.weight.T, column_index.T, ends[None]]).reshape(-1)
    row_index = np.where(along_h.valid, along_h.index, control_h)  # outside the grid: the zero row
    rows = np.concatenate([along_h.weight.T, row_index.T]).reshape(-1)
    header = [before, width, before + columns.size, row_index.shape[0], control_w]
    return np.concatenate([columns, rows, np.array(header, dtype=np.float64)])
