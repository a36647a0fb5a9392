"""How the backward splits its work: which dx planes each thread owns, and which rows touch them.

``dx`` receives contributions from many points. Instead of atomics or per-thread copies
of dx, its (n, z) planes are split into one slab per thread, balanced by the number of
points whose taps land in each plane; each thread walks the rows in order, skips those
whose taps miss its slab, and adds only the taps that fall in its slab. Every voxel
therefore sums its contributions in point order, as PyTorch's sequential loop does:
results are deterministic, independent of the thread count, and for float64 bitwise
equal to PyTorch's. The grid gradient is computed in the same walk (one part owning every
plane), or by runs of rows in a pass of its own (the plan decides: :mod:`.planner`).

Extra memory: two int64 per output row and one per (n, z) plane.
"""

from __future__ import annotations

import numpy as np

from ..bspline import contract, row_coefficients, tables
from ..modes import Interpolation
from ..rounding import ROUNDER
from ..sampling import Field, FieldKind, Sampling
from .block import borrow, decode_row, is_affine, is_spline, point_origin, row_origin, row_position
from .coords import AFFINE, GRID, NEAREST, REFLECTION, source_index, unnormalize
from .jit import Parallel, borrowed, helper, part_kernel
from .records import Geometry, RowRanges, Rule
from .spline import columns_at, fill_row, row_width, spline_displacement
from .tuning import BLOCK

# Below this magnitude a grid value (or displacement) maps to an index well inside the int32
# range for any size a tensor can have along one axis, so the index rules are monotonic.
_MONOTONIC_LIMIT = 2.0**20


@helper
def _lowest_depths(grid, constants, first, step, count, depth, rule, origin, lowest):
    """lowest[i]: the lowest depth point i's taps touch (rint for nearest, floor otherwise), clamped to [-2, D].

    ``rule`` (:class:`.records.Rule`) without the exact remainder; ``origin`` the
    block's :class:`.records.Origin`, from which a displacement is measured (an affine field
    without one reads no grid); ``constants`` the field's (a B-spline's columns, :mod:`.spline`).
    Returns how many points need the exact reflection remainder (see coords.reflect_with_grad),
    which is not taken here: their entries are not to be used.
    """
    unresolved = 0
    spline = is_spline(rule.field)
    for i in range(count):
        if spline:  # a B-spline's dz from its row coefficients (``grid``)
            value = spline_displacement(grid, columns_at(constants), np.int64(origin.w) + i)[2]
        else:
            value = 0.0 if rule.field == AFFINE else float(grid[first + i * step])
        iz, _, done = source_index(
            value,
            depth,
            rule.padding,
            rule.align_corners,
            False,
            False,
            rule.field,
            point_origin(rule.field, origin, i)[2],
        )
        unresolved += 1 - done
        low = (iz + ROUNDER) - ROUNDER if rule.interpolation == NEAREST else np.floor(iz)
        lowest[i] = np.int64(min(max(low, -2.0), float(depth)))
    return unresolved


@helper
def _lowest_depth(value, depth, rule, origin):
    """The lowest depth of the taps of one point whose z grid value (or displacement) is ``value``.

    For zeros and border padding, where the remainder of reflection plays no part.
    """
    iz, _, _ = source_index(value, depth, rule.padding, rule.align_corners, False, False, rule.field, origin)
    low = (iz + ROUNDER) - ROUNDER if rule.interpolation == NEAREST else np.floor(iz)
    return np.int64(min(max(low, -2.0), float(depth)))


@helper
def _unfolded(smallest, largest, depth, rule, origin):
    """Whether z values in [smallest, largest] all map inside reflection's first span, where it folds nothing.

    There reflection (then the clip) is non-decreasing in the z value, so a row's range of
    lowest depths follows from its extreme z values, as for zeros and border padding.
    """
    low, _ = unnormalize(smallest, depth, rule.align_corners, rule.field, origin)
    high, _ = unnormalize(largest, depth, rule.align_corners, rule.field, origin)
    if rule.align_corners:
        return low >= 0.0 and high <= depth - 1.0
    return low >= -0.5 and high <= depth - 0.5


@part_kernel
def _depth_ranges(grid_operand, matrix_array, geometry, rule, visits, rows, parts, part):
    """Per row r: the least and greatest lowest-tap depth of its points, into ``rows`` (:class:`.records.RowRanges`).

    Rows are (n, d, h), numbered n * Do * Ho + d * Ho + h. ``rule`` is the call's
    :class:`.records.Rule`; ``visits`` is (row_step, every_row): every
    ``row_step``-th row is visited point by point; with ``every_row`` the others get
    their range too, from the least and greatest z value alone (a plain scan) where the
    lowest depth grows with the z value: for zeros and border padding, and for reflection
    on a row that stays within the span that it does not fold (:func:`_unfolded`). Rows
    not visited are left as they are. A row with a reflection past two spans of the volume
    gets every plane as its range (-2 to D): libm's exact remainder is not taken here (its
    code beside the vectorised loop slows that loop), and a wider range only makes fewer
    rows skipped. For a displacement (``rule.field``) the grid is the displacement, strides as for the kernels
    (:func:`.forward.forward_kernel`): its dz component comes first. An affine field's rows
    (``matrix``: its voxel matrix) are visited point by point. This is part ``part`` of
    ``parts``, equal runs of the visited rows.
    """
    grid, matrix = borrow(grid_operand), borrowed(matrix_array)
    # The records, given as plain tuples (:func:`.records.unnamed`), named again.
    geometry, ranges = Geometry(*geometry), RowRanges(borrowed(rows[0]), borrowed(rows[1]))
    rule = Rule(*rule)
    out_depth, out_height, _ = geometry.out_sizes
    row_step, every_row = visits
    stride = 1 if every_row else row_step
    visited = (geometry.batch * out_depth * out_height + stride - 1) // stride
    lowest = np.empty(BLOCK, np.int64)
    spline = is_spline(rule.field)
    coefficients = np.empty(3 * row_width(matrix) if spline else 0)  # a B-spline row's (:mod:`.spline`)
    for visit in range(part * visited // parts, (part + 1) * visited // parts):
        row = visit * stride
        n, d, h = row_position(row, geometry.out_sizes)
        if spline:
            plane = n * grid.strides[0] + d * grid.strides[1] - 2 * grid.strides[4]
            fill_row(grid.data, plane, grid.strides[2], grid.strides[3], grid.strides[4], matrix, h, coefficients)
            _range_point_by_point(coefficients, 0, 0, (matrix, n, h, d), geometry, rule, row, ranges, lowest)
            continue
        first_point = n * grid.strides[0] + d * grid.strides[1] + h * grid.strides[2]
        if rule.field == GRID:  # a grid's z is its third component; a displacement's dz its first
            first_point += 2 * grid.strides[4]
        if row % row_step != 0 and _range_from_extremes(grid, first_point, geometry, rule, float(d), row, ranges):
            continue
        _range_point_by_point(
            grid.data, first_point, grid.strides[3], (matrix, n, h, d), geometry, rule, row, ranges, lowest
        )


@helper
def _range_from_extremes(grid, first_point, geometry, rule, origin, row, ranges):
    """A row's range from its extreme z values; False (nothing set) where one is NaN, infinite or huge (where the
    index rules stop being monotonic) or reflection folds the row, and for an affine field (whose z moves along
    the row) or a B-spline (whose row holds coefficients, not values)."""
    if is_affine(rule.field) or is_spline(rule.field):
        return False
    depth, out_width = geometry.sizes[0], geometry.out_sizes[2]
    smallest, largest = np.inf, -np.inf
    usable = 1
    for i in range(out_width):
        value = float(grid.data[first_point + i * grid.strides[3]])
        usable &= abs(value) < _MONOTONIC_LIMIT
        smallest = value if value < smallest else smallest
        largest = value if value > largest else largest
    if usable and rule.padding == REFLECTION:
        usable = 1 if _unfolded(smallest, largest, depth, rule, origin) else 0
    if not usable:
        return False
    ranges.first[row] = _lowest_depth(smallest, depth, rule, origin)
    ranges.last[row] = _lowest_depth(largest, depth, rule, origin)
    return True


@helper
def _range_point_by_point(values, first_point, step, place, geometry, rule, row, ranges, lowest):
    """A row's range from each point's lowest depth (every plane where a point needs the exact remainder), its z
    values in ``values`` from ``first_point``, ``step`` apart (a B-spline's: its row's coefficients); ``place`` is
    (matrix, n, h, d)."""
    depth, out_width = geometry.sizes[0], geometry.out_sizes[2]
    matrix, n, h, d = place
    least, most = np.int64(2**62), -np.int64(2**62)
    for start in range(0, out_width, BLOCK):
        count = min(BLOCK, out_width - start)
        origin = row_origin(matrix, rule.field, n, h, d, start)
        if _lowest_depths(values, matrix, first_point + start * step, step, count, depth, rule, origin, lowest):
            least = min(least, -2)
            most = max(most, depth)
            continue
        for i in range(count):
            least = min(least, lowest[i])
            most = max(most, lowest[i])
    ranges.first[row] = least
    ranges.last[row] = most


#: ``depth_ranges(grid, matrix, geometry, rule, visits, rows, parts)``: :func:`_depth_ranges` with its visited rows in
#: ``parts`` equal runs, run at once.
depth_ranges = Parallel(_depth_ranges)


def looks_coherent(field: Field, depth: int, sampling: Sampling, row_step: int, matrix=None) -> bool:
    """Whether neighbouring points mostly share their depth: a smooth grid (or displacement), not a random one.

    Judged from every ``row_step``-th row, in torch, with no kernel to compile: at most one
    in ten neighbouring pairs may have lowest depths more than one apart. The depths are the
    unnormalised source indices before padding: each padding maps a smooth run of
    indices to a smooth one (a clamp or a fold), and the golden's
    padded index rule took most of the verdict's time (0.4 of 0.6 ms with reflection on a
    64³ grid). An affine field's depths come from its voxel matrix ``matrix`` (N, 12). The
    verdict decides only how the engine splits the work (fused or split passes, channel
    groups, see :mod:`.planner`); results never depend on it.
    """
    out_depth, out_height, out_width = field.out_sizes
    row = np.arange(0, field.points // out_width, row_step)
    n, d, h = decode_row(row, field.out_sizes)
    kind = field.kind
    if kind == FieldKind.GRID:
        z = field.tensor[n, d, h, :, 2].double().numpy()
        index = (z + 1) * ((depth - 1) / 2) if sampling.align_corners else ((z + 1) * depth - 1) / 2
    elif kind.affine:  # the depth the affine map gives each point
        m = matrix[: 12 * field.batch].reshape(-1, 3, 4)[n, 2]
        index = m[:, :1] * np.arange(out_width) + ((m[:, 1:2] * h[:, None] + m[:, 2:3] * d[:, None]) + m[:, 3:])
    else:  # the point's own depth
        index = np.broadcast_to(d[:, None].astype(np.float64), (row.size, out_width))
    if kind.displaced:  # (N, 3, Do, Ho, Wo), dz first
        index = index + field.tensor[n, 0, d, h].double().numpy()
    elif kind.spline:  # dz of the sampled rows, from the row coefficients (:mod:`gridsampler3d.bspline`)
        coefficients = field.derived.get("cpu spline rows")
        if coefficients is None:
            coefficients = row_coefficients(field.tensor.detach().double(), field.out_sizes, field.parameters)
        width = tables(field.out_sizes, field.tensor.shape[2:], field.parameters)[2]
        index = index + contract(coefficients[n, 0, d, h].numpy(), 1, *width)
    nearest = sampling.interpolation == Interpolation.NEAREST
    with np.errstate(invalid="ignore"):  # a non-finite index counts as no jump
        lowest = np.clip(np.rint(index) if nearest else np.floor(index), -2, depth)
    jumps = int((np.abs(np.diff(lowest, axis=1)) > 1).sum())
    return jumps <= 0.1 * lowest.shape[0] * (lowest.shape[1] - 1)


def plan_slabs(
    row_first: np.ndarray,
    row_last: np.ndarray,
    batch: int,
    depth: int,
    plane_voxels: int,
    out_width: int,
    reach: int,
    slab_count: int,
) -> np.ndarray:
    """Split the N * D planes of dx into ``slab_count`` runs of about equal work.

    Returns parts (slab_count, 4) int64: [first plane, end plane, first row, end row],
    planes numbered n * D + z, every slab walking all rows. A plane's work is the points
    whose taps reach it (``out_width`` per row whose depth range covers it) plus its
    zeroing. NumPy, not a kernel: it is cheap, and costs no compile time.
    """
    rows = row_first.size
    batch_of_row = np.arange(rows) // (rows // batch)
    low = np.clip(row_first, 0, depth) + batch_of_row * depth
    high = np.clip(row_last + reach, 0, depth) + batch_of_row * depth
    change = np.zeros(batch * depth + 1, np.int64)
    covered = low < high
    np.add.at(change, low[covered], out_width)
    np.add.at(change, high[covered], -out_width)
    load = np.cumsum(change[:-1]) + plane_voxels // 8 + 1
    # slab s ends where the running load first passes s / slab_count of the total
    targets = load.sum() * np.arange(1, slab_count) // slab_count
    ends = np.searchsorted(np.cumsum(load), targets, side="right")
    bounds = np.concatenate(([0], ends, [batch * depth]))
    parts = np.empty((slab_count, 4), np.int64)
    parts[:, 0], parts[:, 1] = bounds[:-1], bounds[1:]
    parts[:, 2], parts[:, 3] = 0, rows
    return parts


def row_parts(rows: int, planes: int, count: int, unit: int = 1) -> np.ndarray:
    """Parts (count, 4) that split the rows evenly, every part seeing all planes (for the dgrid-only pass), each
    part's rows whole runs of ``unit`` rows."""
    bounds = np.linspace(0, rows // unit, count + 1).round().astype(np.int64) * unit
    parts = np.empty((count, 4), np.int64)
    parts[:, 0], parts[:, 1] = 0, planes
    parts[:, 2], parts[:, 3] = bounds[:-1], bounds[1:]
    return parts
