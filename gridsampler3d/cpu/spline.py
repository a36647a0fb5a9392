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
whatever the weight. The constants end with (Kh, where the columns start, Wo, where the
rows start, Ho, Kw).

At the start of an output row (n, d, h) a kernel sums ``T`` along h into the row's
coefficients ``V`` (3 x (Kw + 1), x, y and z one after the other; :func:`fill_row`); a
point at column w then has the displacement ``sum over m of weight_m V[index_m]``, m in
order (:func:`spline_coordinates`, a run of columns at a time, so that the loop over the
points vectorises). The trilinear backward adds each point's gradient ``g`` times its
row's four weights along h into the plane's sums ``P`` (3 x (Kh + 1) x Wo, a row of Wo
per control row b; :func:`add_plane_sums`, vectorised over the points), and at the
plane's end sums ``P`` along w, a run of columns at a time, into ``dT`` (shaped like
``T``; :func:`fold_plane`). The tricubic backward adds ``g`` times its column's weights
into the row's sums ``R`` (laid out as ``V``; :func:`add_row_sums`) and at the row's end
adds ``R`` along h into ``dT`` (:func:`fold_row`). Each (n, d) plane of ``dT`` is summed
by one part, its rows in order, so its bits do not depend on the thread count.
:func:`plane_gradient` then sums ``dT`` along d (as
:func:`gridsampler3d.bspline.plane_control_gradient`); both d steps are part kernels here
(:func:`_contract_part`), with no temporaries of the planes' size.
"""

from __future__ import annotations

import numpy as np
import torch

from ..bspline import tables, transposed_table
from . import pool
from .jit import Parallel, borrowed, helper, part_kernel
from .tuning import BLOCK

__all__ = [
    "HEADER",
    "TABLE_ROWS",
    "add_row_sums",
    "add_plane_sums",
    "add_run_sums",
    "coefficient_entries",
    "fold_plane",
    "plane_entries",
    "columns_at",
    "field_constants",
    "fill_row",
    "fold_row",
    "plane_gradient",
    "planes",
    "row_width",
    "spline_coordinates",
    "spline_displacement",
]

#: Rows of the columns' table in the constants: four weights, four control indices, the run's end.
TABLE_ROWS = 9
#: Entries at the end of the constants: Kh, where the columns start, Wo, where the rows start, Ho, Kw.
HEADER = 6


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


def plane_entries(constants) -> int:
    """How many entries a plane's sums :func:`add_plane_sums` take in a kernel's scratch, from a B-spline field's
    ``constants``: 3 * (Kh + 1) * Wo."""
    return 3 * (int(constants[-HEADER]) + 1) * int(constants[-4])


@helper
def add_plane_sums(sums, constants, h, start, count, g_x, g_y, g_z):
    """Add the gradients (g_x[i], g_y[i], g_z[i]) of a block's ``count`` points of row h from column ``start``, times
    each of the row's four weights along h, into the plane's sums ``sums`` (x, y, z one after the other, each Kh + 1
    rows of Wo: the control row b's entries at ``b * Wo + w``; the zero row Kh gathers what the grid leaves out)."""
    size = constants.size
    first, height, width = np.int64(constants[size - 3]), np.int64(constants[size - 2]), np.int64(constants[size - 4])
    component = (np.int64(constants[size - 6]) + 1) * width
    for m in range(4):
        weight = constants[first + m * height + h]
        at = np.int64(constants[first + (4 + m) * height + h]) * width + start
        target_x = sums[at : at + count]
        for i in range(count):
            target_x[i] += weight * g_x[i]
        target_y = sums[component + at : component + at + count]
        for i in range(count):
            target_y[i] += weight * g_y[i]
        target_z = sums[2 * component + at : 2 * component + at + count]
        for i in range(count):
            target_z[i] += weight * g_z[i]


@helper
def fold_plane(planes, at, b_step, c_step, component, constants, sums, row):
    """Add the plane's sums ``sums`` (:func:`add_plane_sums`) along w into ``planes`` (``dT``, laid out as ``T``) for
    each control row b < Kh: the columns' weights times the sums, a run of columns at a time
    (:func:`add_run_sums`, into ``row``, laid out as :func:`fill_row`'s coefficients, then added into the plane)."""
    size = constants.size
    width = np.int64(constants[size - 4])
    rows = np.int64(constants[size - 6])
    plane_component = (rows + 1) * width
    length = row_width(constants)
    columns = columns_at(constants)
    for b in range(rows):
        row[: 3 * length] = 0.0
        first = b * width
        add_run_sums(
            row,
            columns,
            0,
            width,
            sums[first : first + width],
            sums[plane_component + first : plane_component + first + width],
            sums[2 * plane_component + first : 2 * plane_component + first + width],
        )
        for a in range(3):
            base = at + a * component + b * b_step
            source = row[a * length : (a + 1) * length]
            for c in range(length):
                planes[np.uint64(base + c * c_step)] += source[c]


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


@part_kernel
def _contract_part(source_operand, source_shape, target_operand, target_shape, table, parts, part):
    """Part ``part`` of ``parts``: ``target[p, t, b, c] = sum over l of weight[t, l] source[p, index[t, l], b, c]``
    for b < Kh and c < Kw, a term whose ``valid`` is 0 left out (added as 0), l in order.

    ``source`` and ``target`` are dense (planes, rows, Hs, Ws) and (planes, rows, Ht, Wt), flat, with
    (Kh, Kw) the smaller of their last two sizes; ``table`` (3, rows of target, L) holds the weights, the
    indices into the source's rows and whether each is valid: :func:`.bspline.contract`'s sum, in its order
    and with its bits (its first term is the sum's start, as there). The parts take whole (p, t) planes.
    """
    source = borrowed(source_operand)
    target = borrowed(target_operand)
    planes, source_rows, source_height, source_width = source_shape
    _, target_rows, target_height, target_width = target_shape
    height, width = min(source_height, target_height), min(source_width, target_width)
    terms = table.shape[2]
    units = planes * target_rows
    for unit in range(units * part // parts, units * (part + 1) // parts):
        p, t = unit // target_rows, unit % target_rows
        for b in range(height):
            into = target[((p * target_rows + t) * target_height + b) * target_width :][:width]
            for term in range(terms):
                weight, valid = table[0, t, term], table[2, t, term] != 0.0
                row = np.int64(table[1, t, term])
                start = ((p * source_rows + row) * source_height + b) * source_width
                values = source[start : start + width]
                if term == 0:
                    for c in range(width):
                        into[c] = weight * values[c] if valid else 0.0
                elif valid:
                    for c in range(width):
                        into[c] = into[c] + weight * values[c]
                else:
                    for c in range(width):
                        into[c] = into[c] + 0.0


_contract = Parallel(_contract_part)
_PART_ENTRIES = 1 << 15  # a contraction runs on one part per this many target entries, at most one per thread


def _contract_planes(source: torch.Tensor, target: torch.Tensor, table) -> None:
    """:func:`_contract_part` over all of ``target`` (N, 3, rows, Ht, Wt) from ``source`` (N, 3, rows', Hs, Ws), both
    float64 and contiguous, with ``table`` an (index, weight, valid) table of the target's rows."""
    index, weight, valid = table
    packed = np.stack([weight, index.astype(np.float64), valid.astype(np.float64)])
    shapes = [(t.shape[0] * t.shape[1], *t.shape[2:]) for t in (source, target)]
    parts = max(1, min(pool.threads(), target.numel() // _PART_ENTRIES, shapes[1][0] * shapes[1][1]))
    _contract(source.view(-1).numpy(), shapes[0], target.view(-1).numpy(), shapes[1], packed, parts)


def planes(field) -> torch.Tensor:
    """``T`` (N, 3, Do, Kh + 1, Kw + 1), float64: a B-spline field's control points summed along d (the d step of
    :func:`gridsampler3d.bspline.row_coefficients`, bit for bit), with a zero row and a zero column."""
    control_points = field.tensor.detach().to(torch.float64).contiguous()
    batch, _, _, control_h, control_w = control_points.shape
    depth = tables(field.out_sizes, control_points.shape[2:], field.parameters)[0]
    target = torch.zeros((batch, 3, int(field.out_sizes[0]), control_h + 1, control_w + 1), dtype=torch.float64)
    _contract_planes(control_points, target, depth)
    return target


def plane_gradient(sums: torch.Tensor, field) -> torch.Tensor:
    """dC (N, 3, Kd, Kh, Kw), float64, from the plane sums ``dT`` (N, 3, Do, Kh + 1, Kw + 1) (its zero row and
    column left out): the sum over d, the planes in increasing order
    (:func:`gridsampler3d.bspline.plane_control_gradient`'s sum, bit for bit)."""
    control_sizes = tuple(field.tensor.shape[2:])
    table = transposed_table(int(field.out_sizes[0]), control_sizes[0], field.parameters[0], field.parameters[3])
    target = torch.empty((sums.shape[0], 3, *control_sizes), dtype=torch.float64)
    _contract_planes(sums, target, table)
    return target


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
    header = [control_h, before, width, before + columns.size, row_index.shape[0], control_w]
    return np.concatenate([columns, rows, np.array(header, dtype=np.float64)])
