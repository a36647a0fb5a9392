"""Phase A of the CPU kernels: a block of output points at a time, vectorised across the points.

Each helper walks ``count`` (at most ``BLOCK``) consecutive points of one output row in a
loop with no data-dependent branches and one store per scratch array per iteration, so
that LLVM turns it into SIMD code with hardware gathers (docs/cpu.md). Scratch arrays are
flat: ``array[slot(k, i)]`` is entry ``k`` (an axis side or a tap) of point ``i``.

Taps are numbered as PyTorch visits them: bit 0 steps x, bit 1 y, bit 2 z.
"""

from __future__ import annotations

import numpy as np

from ..rounding import ROUNDER
from .coords import AFFINE, AFFINE_DISPLACEMENT, BSPLINE, BSPLINE_AFFINE, ZEROS, source_index
from .jit import borrowed, helper, part_rows
from .records import AXIS_TAPS, Cells, Operand, Origin
from .spline import columns_at, spline_coordinates
from .tuning import BLOCK


def scratch_cells(parts: int, multipliers: bool) -> Cells:
    """Phase A's scratch (:class:`.records.Cells`), one row per part; ``multipliers`` keeps mx, my, mz."""
    reals = [part_rows(parts, entries * BLOCK) for entries in (3, 6)]
    integers = [part_rows(parts, BLOCK, np.int64) for _ in range(4)]
    kept = [part_rows(parts, BLOCK if multipliers else 0) for _ in range(3)]
    return Cells(*reals, *integers, *kept)


@helper
def part_cells(cells, part):
    """Part ``part``'s rows of phase A's scratch, as :class:`.records.Cells` of rows (see :func:`borrow`)."""
    cells = Cells(*cells)  # named again, from the plain tuple a kernel is given (:func:`.records.unnamed`)
    return Cells(
        borrowed(cells.coords)[part],
        borrowed(cells.sides)[part],
        borrowed(cells.corner)[part],
        borrowed(cells.other_corner)[part],
        borrowed(cells.inside)[part],
        borrowed(cells.lowest)[part],
        borrowed(cells.mx)[part],
        borrowed(cells.my)[part],
        borrowed(cells.mz)[part],
    )


@helper
def borrow(operand):
    """``operand`` with its array :func:`.jit.borrowed`: how a kernel takes each operand it is given.

    Named again: a kernel is given its records as plain tuples (:func:`.records.unnamed`).
    """
    return Operand(borrowed(operand[0]), operand[1])


def decode_row(row, out_sizes):
    """(n, d, h) of output row ``row`` (an int or an array of them), rows numbered n * Do * Ho + d * Ho + h over the
    output's (Do, Ho, Wo)."""
    out_depth, out_height, _ = out_sizes
    return row // (out_depth * out_height), (row // out_height) % out_depth, row % out_height


#: :func:`decode_row` as the kernels call it.
row_position = helper(decode_row)


@helper
def unsigned(index):
    """``index``, which the caller knows to be a valid (so non-negative) index, typed unsigned.

    A signed index may be negative as far as Numba knows, and Numba wraps a negative index
    around to the array's end: a select per access, which across points turns a scratch
    row's loads into gathers and adds three vector operations to every gather's index.
    Only the final index is cast: unsigned arithmetic mixed with signed would give float64.
    Used where measured to pay (docs/cpu.md): the taps' gathers and the dx scatter. The
    grid's reads in phase A and the grid gradient's stores, cast too, turned phase A's loop
    scalar (docs/cpu.md, "What keeps the loops vectorised"); the grid is read through views instead
    (:func:`grid_coordinates`).
    """
    return np.uint64(index)


@helper
def slot(k, i):
    """Index ``k * BLOCK + i`` of entry ``k`` of point ``i`` in a scratch array (unsigned, see :func:`unsigned`)."""
    return unsigned(k * BLOCK + i)


@helper
def grid_coordinates(grid, first, step, component, count, coords):
    """coords[slot(a, i)] (a = 0, 1, 2: x, y, z): the grid components of point i, as float64.

    Point i's x component sits at ``first + i * step`` in the flat ``grid``, its y and z
    ``component`` and twice that after it. The two dense layouts are read through views of
    their rows, whose indices are provably non-negative: a contiguous grid (x, y, z
    interleaved, step 3) as one row, a displacement's contiguous rows (step 1) as three.
    Read by flat index, each component was an emulated gather with a wrap-around select
    per lane, about a third of the fused warp's phase A (docs/cpu.md, "Per-phase profile").
    Any other strides are read element by element.
    """
    if step == 3 and component == 1:
        row = grid[first : first + 3 * count]
        for i in range(count):
            coords[i] = float(row[3 * i])
            coords[slot(1, i)] = float(row[3 * i + 1])
            coords[slot(2, i)] = float(row[3 * i + 2])
    elif step == 1:
        for axis in range(3):
            start = first + axis * component
            row = grid[start : start + count]
            along = coords[axis * BLOCK : axis * BLOCK + count]
            for i in range(count):
                along[i] = float(row[i])
    else:
        for i in range(count):
            point = first + i * step
            coords[i] = float(grid[point])
            coords[slot(1, i)] = float(grid[point + component])
            coords[slot(2, i)] = float(grid[point + 2 * component])


@helper
def is_affine(field):
    """Whether the kind ``field`` (its code) has a theta."""
    return field == AFFINE or field == AFFINE_DISPLACEMENT or field == BSPLINE_AFFINE


@helper
def is_spline(field):
    """Whether the kind ``field`` (its code) is a B-spline's."""
    return field == BSPLINE or field == BSPLINE_AFFINE


@helper
def row_origin(matrix, field, n, h, d, start):
    """The :class:`.records.Origin` of a block of row (n, d, h) from output column ``start``: an affine field's
    row of its voxel matrix, ``matrix[12 n : 12 n + 12]`` (:func:`gridsampler3d.affine.voxel_matrix`), read only
    for an affine ``field``."""
    if not is_affine(field):
        return Origin(float(start), float(h), float(d), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    m = matrix[n * 12 : n * 12 + 12]
    return Origin(
        float(start),
        float(h),
        float(d),
        (m[1] * h + m[2] * d) + m[3],
        (m[5] * h + m[6] * d) + m[7],
        (m[9] * h + m[10] * d) + m[11],
        m[0],
        m[4],
        m[8],
    )


@helper
def point_origin(field, origin, i):
    """The position (x, y, z) in voxels from which point i of the block at ``origin`` is displaced: its own
    (w, h, d), or an affine field's ``M @ (w, h, d, 1)``, each axis ``M[0] w + ((M[1] h + M[2] d) + M[3])``."""
    w = origin.w + i
    if is_affine(field):
        return origin.step_x * w + origin.base_x, origin.step_y * w + origin.base_y, origin.step_z * w + origin.base_z
    return w, origin.h, origin.d


@helper
def field_coordinates(grid, constants, points, rule, origin, coords):
    """Phase A's read of a block's field values into ``coords`` (:func:`grid_coordinates`): a grid's or a
    displacement's from ``grid``, a B-spline's displacement from its row coefficients and the columns' supports
    in the field's ``constants`` (:mod:`.spline`); an affine field without a displacement has none."""
    if is_spline(rule.field):  # ``grid``: the row's coefficients
        spline_coordinates(grid, points.count, columns_at(constants), np.int64(origin.w), coords)
    elif rule.field != AFFINE:
        grid_coordinates(grid, points.first, points.step, points.component, points.count, coords)


@helper
def _point(coords, i, sizes, rule, origin):
    """(ix, iy, iz, mx, my, mz, resolved) of point i, its grid components in ``coords`` (:func:`grid_coordinates`).

    A field other than a grid (``rule.field``) is in voxels from the point's origin (:func:`point_origin`).
    """
    depth, height, width = sizes
    _, padding, align_corners, field, forward, exact = rule
    origin_x, origin_y, origin_z = point_origin(field, origin, i)
    ix, mx, done_x = source_index(coords[i], width, padding, align_corners, forward, exact, field, origin_x)
    iy, my, done_y = source_index(coords[slot(1, i)], height, padding, align_corners, forward, exact, field, origin_y)
    iz, mz, done_z = source_index(coords[slot(2, i)], depth, padding, align_corners, forward, exact, field, origin_z)
    return ix, iy, iz, mx, my, mz, done_x & done_y & done_z


@helper
def _cell_offset(x_low, y_low, z_low, sizes, spatial):
    """Offset of a cell's lowest corner (its low sides clamped to [-2, size], where no tap is inside anyway).

    Computed in float64, exact for any offset inside a tensor, so no slow 64-bit
    integer multiply is needed; the clamp keeps it finite for unusable coordinates.
    """
    depth, height, width = sizes
    x_c = min(max(x_low, -2.0), float(width))
    y_c = min(max(y_low, -2.0), float(height))
    z_c = min(max(z_low, -2.0), float(depth))
    return x_c, y_c, z_c, np.int64(z_c * spatial[0] + y_c * spatial[1] + x_c * spatial[2])


@helper
def _side_bits(low, size, low_taps, high_taps):
    """Mask of the taps inside [0, size) along one axis, given the cell's low index ``low``."""
    return np.int64((low >= 0) & (low < size)) * low_taps | np.int64((low >= -1) & (low < size - 1)) * high_taps


@helper
def trilinear_cells(grid, constants, points, sizes, rule, origin, spatial, other_spatial, cells, multipliers):
    """Each point's cell, computed bitwise as the scalar rules: side weights, corner offsets, inside taps.

    ``points`` (:class:`.records.Points`) locates the block's grid values in the flat
    ``grid``; they are read into ``cells.coords`` by :func:`field_coordinates` (an affine
    field without a displacement has none; a B-spline's ``grid`` is its row coefficients,
    ``constants`` the field's). For a
    field other than a grid (``rule.field``) they are a displacement in voxels from point
    i's origin (:func:`point_origin` of ``origin``, a :class:`.records.Origin`). Fills, in
    ``cells`` (:class:`.records.Cells`):

    - ``sides[slot(s, i)]`` (s = 0..5: x low, x high, y low, y high, z low, z high;
      PyTorch's weights, low = floor + 1 - index, high = index - floor);
    - ``corner[i]`` and ``other_corner[i]``: the offset of the lowest corner under
      ``spatial`` and ``other_spatial`` strides (meaningful where a tap is inside);
    - ``inside[i]``: bit k set when tap k lies in the volume;
    - ``lowest[i]``: the cell's low depth, clamped to [-2, D];
    - with ``multipliers`` and unless padding is zeros, ``mx``, ``my``, ``mz``.

    Returns how many points need reflection's exact remainder (always 0 with
    ``rule.exact_remainder``, or with other paddings; see :func:`.coords.reflect_with_grad`): their
    entries are then not to be used, and the engine runs the kernel built with
    ``exact_remainder`` (:func:`.forward.forward_kernel`).
    """
    depth, height, width = sizes
    sides = cells.sides
    field_coordinates(grid, constants, points, rule, origin, cells.coords)
    unresolved = 0
    for i in range(points.count):
        ix, iy, iz, mult_x, mult_y, mult_z, done = _point(cells.coords, i, sizes, rule, origin)
        unresolved += 1 - done
        x_low, y_low, z_low = np.floor(ix), np.floor(iy), np.floor(iz)
        sides[i] = x_low + 1.0 - ix
        sides[slot(1, i)] = ix - x_low
        sides[slot(2, i)] = y_low + 1.0 - iy
        sides[slot(3, i)] = iy - y_low
        sides[slot(4, i)] = z_low + 1.0 - iz
        sides[slot(5, i)] = iz - z_low
        x_c, y_c, z_c, cells.corner[i] = _cell_offset(x_low, y_low, z_low, sizes, spatial)
        cells.other_corner[i] = np.int64(z_c * other_spatial[0] + y_c * other_spatial[1] + x_c * other_spatial[2])
        x0, y0, z0 = np.int64(x_c), np.int64(y_c), np.int64(z_c)
        cells.inside[i] = (
            _side_bits(x0, width, AXIS_TAPS[0], AXIS_TAPS[1])
            & _side_bits(y0, height, AXIS_TAPS[2], AXIS_TAPS[3])
            & _side_bits(z0, depth, AXIS_TAPS[4], AXIS_TAPS[5])
        )
        cells.lowest[i] = z0
        if multipliers and rule.padding != ZEROS:  # with zeros padding they are the constant slopes
            cells.mx[i], cells.my[i], cells.mz[i] = mult_x, mult_y, mult_z
    return unresolved


@helper
def nearest_cells(grid, constants, points, sizes, rule, origin, spatial, cells):
    """Each point's nearest voxel: ``cells.corner[i]`` its offset (0 outside), ``cells.inside[i]`` 0/1,
    ``cells.lowest[i]`` its depth.

    Arguments and result as :func:`trilinear_cells`.
    """
    depth, height, width = sizes
    field_coordinates(grid, constants, points, rule, origin, cells.coords)
    unresolved = 0
    for i in range(points.count):
        ix, iy, iz, _, _, _, done = _point(cells.coords, i, sizes, rule, origin)
        unresolved += 1 - done
        # x + 1.5 * 2^52 - 1.5 * 2^52 rounds to the nearest integer, ties to even (as C nearbyint)
        x_c, y_c, z_c, offset = _cell_offset(
            (ix + ROUNDER) - ROUNDER, (iy + ROUNDER) - ROUNDER, (iz + ROUNDER) - ROUNDER, sizes, spatial
        )
        x0, y0, z0 = np.int64(x_c), np.int64(y_c), np.int64(z_c)
        within = (x0 >= 0) & (x0 < width) & (y0 >= 0) & (y0 < height) & (z0 >= 0) & (z0 < depth)
        cells.inside[i] = np.int64(within)
        cells.corner[i] = offset if within else 0
        cells.lowest[i] = z0
    return unresolved


@helper
def tap_delta(tap, spatial):
    """Offset of tap ``tap`` from its cell's lowest corner, for (D, H, W) strides ``spatial``."""
    return (tap >> 2) * spatial[0] + ((tap >> 1) & 1) * spatial[1] + (tap & 1) * spatial[2]


@helper
def tap_weight(sides, tap, i):
    """Trilinear weight (wx * wy) * wz of tap ``tap`` of point ``i``, in PyTorch's association."""
    return (sides[slot(tap & 1, i)] * sides[slot(2 + ((tap >> 1) & 1), i)]) * sides[slot(4 + (tap >> 2), i)]


@helper
def masked_offsets(count, corner, inside, spatial, offsets):
    """offsets[slot(k, i)]: tap k's offset, or 0 (a valid element) where the tap is outside.

    Lets the channel loops gather every tap without a branch; the tap's bit then selects
    whether its contribution counts.
    """
    for i in range(count):
        for tap in range(8):
            offset = corner[i] + tap_delta(tap, spatial)
            offsets[slot(tap, i)] = offset if (inside[i] >> tap) & 1 else 0


@helper
def slab_taps(count, inside, lowest, z_lo, z_hi, taps):
    """taps[i]: the inside taps of point i whose depth lies in [z_lo, z_hi) (a thread's slab)."""
    for i in range(count):
        low_in = np.int64((lowest[i] >= z_lo) & (lowest[i] < z_hi))
        high_in = np.int64((lowest[i] + 1 >= z_lo) & (lowest[i] + 1 < z_hi))
        taps[i] = inside[i] & (low_in * AXIS_TAPS[4] | high_in * AXIS_TAPS[5])
