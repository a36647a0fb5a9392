"""Tricubic ("bicubic") kernels of the CPU engine: 4 x 4 x 4 taps, padding applied per tap.

The rules are PyTorch's 2-D bicubic extended to 3-D (docs/semantics.md): the point's
index is only unnormalised; each tap coordinate floor(index) - 1 .. + 2 is padded on its
own; an outside tap reads 0 (and so still carries a NaN weight into y and dgrid); the grid
multiplier is the unnormalising slope alone. Taps run z outermost, x innermost; all
arithmetic is float64, in the reference's order (y and dgrid sum separably: along x, then
y, then z, PyTorch's 2-D order), so float64 results equal the reference bit for bit.

For a displacement (the fused warp) the "grid" is the displacement in voxels with strides
given as (n, d, h, w, -component), as for the trilinear kernels (:mod:`.forward`), and
the point's index is its identity position plus the displacement, slope 1. A B-spline's
"grid" is its row coefficients, its "dgrid" its row sums (:mod:`.spline`).

Each kernel is a part kernel run by :class:`.jit.Parallel`, with these operands: each
tensor as an (array, strides) pair (:func:`.engine.operand`), ``geometry`` = (N, C, (D,
H, W), (Do, Ho, Wo)) and ``rule`` the call's :class:`.records.Rule`. :data:`forward`
and :data:`dgrid` take ``parts`` equal runs of output rows. :data:`dx` is
owner-computes: ``parts`` holds one (first, last) run of (n, z) planes per part, and each
part walks every point in order, adding only the taps that land in its planes, so each
voxel sums in point order, deterministic and independent of the number of parts.
"""

from __future__ import annotations

import functools

import numpy as np

from ..sampling import FieldKind
from .backward import zero_planes
from .block import is_spline, point_origin, row_origin, row_position
from .coords import AFFINE, GRID, cubic_slope, cubic_weight, pad_tap, unnormalize
from .jit import Parallel, borrowed, helper, part_kernel, part_rows
from .records import Operand, Rule
from .spline import add_row_sums, coefficient_entries, columns_at, fill_row, fold_row, spline_displacement

__all__ = ["dgrid", "dx", "forward"]


def _scratch(parts: int, *operands, matrix_at: int, rule_at: int):
    """(taps, offsets, weights, slopes, coefficients, row sums) for every part (see :func:`.jit.part_kernel`), one row
    per part; ``matrix_at`` and ``rule_at``: where the kernel's operands hold the field's constants and the rule.

    taps, weights and slopes: 4 per axis, x, y, z (``4 * axis + step``); offsets: 64, one per
    tap; a B-spline's row coefficients and row sums (:mod:`.spline`).
    """
    row = coefficient_entries(operands[matrix_at]) if FieldKind(operands[rule_at][3]).spline else 0
    return (
        (
            part_rows(parts, 12, np.int64),
            part_rows(parts, 64, np.int64),
            part_rows(parts, 12),
            part_rows(parts, 12),
            part_rows(parts, row),
            part_rows(parts, row),
        ),
    )


@helper
def _part_scratch(scratch, part):
    """Part ``part``'s rows of :func:`_scratch`'s arrays."""
    taps, offsets, weights, slopes, coefficients, row_sums = scratch
    return (
        borrowed(taps)[part],
        borrowed(offsets)[part],
        borrowed(weights)[part],
        borrowed(slopes)[part],
        borrowed(coefficients)[part],
        borrowed(row_sums)[part],
    )


@helper
def _start_row(grid, grid_strides, matrix, field, n, d, h, coefficients):
    """A B-spline row's coefficients (:func:`.spline.fill_row`), for ``field`` a B-spline's; nothing otherwise."""
    if is_spline(field):
        plane = n * grid_strides[0] + d * grid_strides[1] - 2 * grid_strides[4]
        fill_row(grid, plane, grid_strides[2], grid_strides[3], grid_strides[4], matrix, h, coefficients)


@helper
def _first_point(grid_strides, n, d, h, w, field):
    """Where the grid (or a displacement, as ``field`` says) holds the x component of output point (n, d, h, w) (a
    B-spline's values come from its row's coefficients instead, :func:`_start_row`)."""
    point = n * grid_strides[0] + d * grid_strides[1] + h * grid_strides[2] + w * grid_strides[3]
    return point - 2 * grid_strides[4] if field != GRID else point


@helper
def _axis_taps(index, size, padding, align_corners, taps, weights, slopes, axis):
    """Fill the 4 padded int tap coordinates, weights and slopes of ``axis`` (0 x, 1 y, 2 z) at ``index``."""
    # np.floor keeps a float: NaN and inf stay representable (math.floor would need an int)
    low = np.floor(index)
    t = index - low
    for step in range(4):
        taps[4 * axis + step] = pad_tap(low - 1.0 + step, size, padding, align_corners)
        weights[4 * axis + step] = cubic_weight(step, t)
        slopes[4 * axis + step] = cubic_slope(step, t)


@helper
def _origin(matrix, field, n, d, h, w):
    """The position (x, y, z) from which output point (n, d, h, w) is displaced (:func:`.block.point_origin`)."""
    return point_origin(field, row_origin(matrix, field, n, h, d, w), 0)


@helper
def _values(grid, grid_strides, point, field, matrix, coefficients, w):
    """The grid (or displacement) values (x, y, z) of output column ``w``, whose x sits at ``point`` (y and z a
    component stride and twice that after it): 0 for an affine field without a displacement, which has none; a
    B-spline's displacement from its row's ``coefficients`` (:func:`.spline.spline_displacement`; ``matrix``: the
    field's constants, with its columns' supports)."""
    step = grid_strides[4]
    if is_spline(field):
        return spline_displacement(coefficients, columns_at(matrix), w)
    if field == AFFINE:
        return 0.0, 0.0, 0.0
    return float(grid[point]), float(grid[point + step]), float(grid[point + 2 * step])


@helper
def _point_taps(values, sizes, rule, origin, taps, weights, slopes):
    """Fill the taps, weights and slopes of a point whose grid values (x, y, z) are ``values`` (:func:`_values`),
    of an output point whose origin (x, y, z) is ``origin`` (:func:`_origin`); return its multipliers (mx, my,
    mz)."""
    padding, align_corners, field = rule.padding, rule.align_corners, rule.field
    ix, mx = unnormalize(values[0], sizes[2], align_corners, field, origin[0])
    iy, my = unnormalize(values[1], sizes[1], align_corners, field, origin[1])
    iz, mz = unnormalize(values[2], sizes[0], align_corners, field, origin[2])
    _axis_taps(ix, sizes[2], padding, align_corners, taps, weights, slopes, 0)
    _axis_taps(iy, sizes[1], padding, align_corners, taps, weights, slopes, 1)
    _axis_taps(iz, sizes[0], padding, align_corners, taps, weights, slopes, 2)
    return mx, my, mz


@helper
def _tap_offsets(taps, sizes, spatial, offsets):
    """offsets[16k + 4j + i]: spatial offset of tap (i, j, k), or -1 when it lies outside the volume."""
    depth, height, width = sizes
    for k in range(4):
        for j in range(4):
            for i in range(4):
                cx, cy, cz = taps[i], taps[4 + j], taps[8 + k]
                inside = 0 <= cx < width and 0 <= cy < height and 0 <= cz < depth
                offsets[16 * k + 4 * j + i] = cz * spatial[0] + cy * spatial[1] + cx * spatial[2] if inside else -1


@helper
def _tap_sum(x, base, offsets, weights):
    """The weighted sum of the 64 taps of the channel plane at ``base``: along x, then y, then z."""
    total = 0.0
    for k in range(4):
        plane = 0.0
        for j in range(4):
            row = 0.0
            for i in range(4):
                t = 16 * k + 4 * j + i
                row += (x[base + offsets[t]] if offsets[t] >= 0 else 0.0) * weights[i]
            plane += row * weights[4 + j]
        total += plane * weights[8 + k]
    return total


@part_kernel
def _forward(x_operand, grid_operand, matrix_array, y_operand, geometry, rule, parts, scratch, part):
    """y (N, C, Do, Ho, Wo) from x (N, C, D, H, W) at grid (N, Do, Ho, Wo, 3): run ``part`` of ``parts`` runs of
    output rows, every element written; ``matrix`` an affine field's voxel matrix (N * 12), else empty."""
    rule = Rule(*rule)  # named again, from the plain tuple a kernel is given
    matrix = borrowed(matrix_array)
    x, x_strides = borrowed(x_operand[0]), x_operand[1]
    grid, grid_strides = borrowed(grid_operand[0]), grid_operand[1]
    y, y_strides = borrowed(y_operand[0]), y_operand[1]
    batch, channels, sizes, out_sizes = geometry
    taps, offsets, weights, slopes, coefficients, _ = _part_scratch(scratch, part)
    out_depth, out_height, out_width = out_sizes
    spatial = (x_strides[2], x_strides[3], x_strides[4])
    rows = batch * out_depth * out_height
    for row in range(part * rows // parts, (part + 1) * rows // parts):
        n, d, h = row_position(row, out_sizes)
        _start_row(grid, grid_strides, matrix, rule.field, n, d, h, coefficients)
        for w in range(out_width):
            point = _first_point(grid_strides, n, d, h, w, rule.field)
            values = _values(grid, grid_strides, point, rule.field, matrix, coefficients, w)
            _point_taps(values, sizes, rule, _origin(matrix, rule.field, n, d, h, w), taps, weights, slopes)
            _tap_offsets(taps, sizes, spatial, offsets)
            out = n * y_strides[0] + d * y_strides[2] + h * y_strides[3] + w * y_strides[4]
            for c in range(channels):
                y[out + c * y_strides[1]] = _tap_sum(x, n * x_strides[0] + c * x_strides[1], offsets, weights)


@helper
def _gradient_sums(grad, out, grad_step, x, base, x_step, channels, offsets, weights, slopes):
    """(gx, gy, gz): per channel, the separable sums with one axis's weights replaced by its slopes, times grad at
    ``out``, accumulated over channels in order (channel planes at ``base``, ``x_step`` apart)."""
    gx = gy = gz = 0.0
    for c in range(channels):
        g = float(grad[out + c * grad_step])
        plane_base = base + c * x_step
        # Separable: along x (weights and slopes), then y, then z, as the reference.
        total_x = total_y = total_z = 0.0
        for k in range(4):
            plane_w = plane_sx = plane_sy = 0.0
            for j in range(4):
                row_w = row_s = 0.0
                for i in range(4):
                    t = 16 * k + 4 * j + i
                    value = x[plane_base + offsets[t]] if offsets[t] >= 0 else 0.0
                    row_w += value * weights[i]
                    row_s += value * slopes[i]
                plane_w += row_w * weights[4 + j]
                plane_sx += row_s * weights[4 + j]
                plane_sy += row_w * slopes[4 + j]
            total_x += plane_sx * weights[8 + k]
            total_y += plane_sy * weights[8 + k]
            total_z += plane_w * slopes[8 + k]
        gx += total_x * g
        gy += total_y * g
        gz += total_z * g
    return gx, gy, gz


@part_kernel
def _dgrid(
    grad_operand,
    x_operand,
    grid_operand,
    matrix_array,
    dgrid_operand,
    moments_array,
    geometry,
    rule,
    parts,
    scratch,
    part,
):
    """dgrid (N, Do, Ho, Wo, 3) (strides in grid order, as the grid's) of run ``part`` of ``parts`` runs of
    output rows: the multipliers times :func:`_gradient_sums`. For an affine field (``matrix``), the row's
    moments too (:class:`.backward.BackwardOperands`), into ``moments`` where not empty; dgrid where not empty."""
    rule = Rule(*rule)  # named again, from the plain tuple a kernel is given
    grad, grad_strides = borrowed(grad_operand[0]), grad_operand[1]
    x, x_strides = borrowed(x_operand[0]), x_operand[1]
    grid, grid_strides = borrowed(grid_operand[0]), grid_operand[1]
    dgrid, dgrid_strides = borrowed(dgrid_operand[0]), dgrid_operand[1]
    matrix, moments = borrowed(matrix_array), borrowed(moments_array)
    batch, channels, sizes, out_sizes = geometry
    taps, offsets, weights, slopes, coefficients, row_sums = _part_scratch(scratch, part)
    spatial = (x_strides[2], x_strides[3], x_strides[4])
    spline = is_spline(rule.field)
    # A B-spline's (n, d) planes each stay in one part, so that its rows' sums add into their plane in order.
    unit = out_sizes[1] if spline else 1
    groups = batch * out_sizes[0] * out_sizes[1] // unit
    for row in range(part * groups // parts * unit, (part + 1) * groups // parts * unit):
        n, d, h = row_position(row, out_sizes)
        row_moments = moments[row * 6 : row * 6 + 6]
        row_moments[:] = 0.0
        _start_row(grid, grid_strides, matrix, rule.field, n, d, h, coefficients)
        row_sums[:] = 0.0
        for w in range(out_sizes[2]):
            point = _first_point(grid_strides, n, d, h, w, rule.field)
            values = _values(grid, grid_strides, point, rule.field, matrix, coefficients, w)
            mx, my, mz = _point_taps(
                values, sizes, rule, _origin(matrix, rule.field, n, d, h, w), taps, weights, slopes
            )
            _tap_offsets(taps, sizes, spatial, offsets)
            out = n * grad_strides[0] + d * grad_strides[2] + h * grad_strides[3] + w * grad_strides[4]
            gx, gy, gz = _gradient_sums(
                grad, out, grad_strides[1], x, n * x_strides[0], x_strides[1], channels, offsets, weights, slopes
            )
            if row_moments.size:
                _add_moment(row_moments, float(w), mx * gx, my * gy, mz * gz)
            if dgrid.size and spline:  # the row's sums (:mod:`.spline`)
                add_row_sums(row_sums, columns_at(matrix), w, mx * gx, my * gy, mz * gz)
            elif dgrid.size:
                target = _first_point(dgrid_strides, n, d, h, w, rule.field)
                dgrid[target] = mx * gx
                dgrid[target + dgrid_strides[4]] = my * gy
                dgrid[target + 2 * dgrid_strides[4]] = mz * gz
        if dgrid.size and spline:  # the row's sums into its plane's, along h
            plane = n * dgrid_strides[0] + d * dgrid_strides[1] - 2 * dgrid_strides[4]
            fold_row(dgrid, plane, dgrid_strides[2], dgrid_strides[3], dgrid_strides[4], matrix, h, row_sums)


@helper
def _add_moment(row_moments, w, g_x, g_y, g_z):
    """An affine field's row moments gain one point's gradient (g_x, g_y, g_z) at column ``w``."""
    row_moments[0] += g_x
    row_moments[1] += g_y
    row_moments[2] += g_z
    row_moments[3] += g_x * w
    row_moments[4] += g_y * w
    row_moments[5] += g_z * w


@helper
def _reaches(values, sizes, rule, origin, slab, taps, weights, slopes):
    """Whether a z tap of the point whose grid values are ``values`` (:func:`_values`) lies in the planes ``slab`` =
    (z_lo, z_hi); if so, every axis's taps, weights and slopes are filled (see :func:`_point_taps`)."""
    padding, align_corners, field = rule.padding, rule.align_corners, rule.field
    iz, _ = unnormalize(values[2], sizes[0], align_corners, field, origin[2])
    _axis_taps(iz, sizes[0], padding, align_corners, taps, weights, slopes, 2)
    mine = False
    for k in range(4):
        mine = mine or slab[0] <= taps[8 + k] < slab[1]
    if mine:
        ix, _ = unnormalize(values[0], sizes[2], align_corners, field, origin[0])
        iy, _ = unnormalize(values[1], sizes[1], align_corners, field, origin[1])
        _axis_taps(ix, sizes[2], padding, align_corners, taps, weights, slopes, 0)
        _axis_taps(iy, sizes[1], padding, align_corners, taps, weights, slopes, 1)
    return mine


@helper
def _scatter(grad, out, grad_step, dx, first, dx_strides, channels, sizes, slab, taps, weights):
    """Add one point's grad at ``out`` into the taps of dx (its batch's planes at ``first``) within ``slab``."""
    depth, height, width = sizes
    for k in range(4):
        cz = taps[8 + k]
        if cz < slab[0] or cz >= slab[1]:
            continue
        for j in range(4):
            cy = taps[4 + j]
            if cy < 0 or cy >= height:
                continue
            for i in range(4):
                cx = taps[i]
                if cx < 0 or cx >= width:
                    continue
                weight = weights[i] * weights[4 + j] * weights[8 + k]
                offset = first + cz * dx_strides[2] + cy * dx_strides[3] + cx * dx_strides[4]
                for c in range(channels):
                    dx[offset + c * dx_strides[1]] += weight * grad[out + c * grad_step]


@part_kernel
def _dx(grad_operand, grid_operand, matrix_array, dx_operand, geometry, rule, parts, scratch, part):
    """dx (N, C, D, H, W) of planes parts[part, 0] .. parts[part, 1] - 1 (plane = n * D + z), every element written."""
    rule = Rule(*rule)  # named again, from the plain tuple a kernel is given
    matrix = borrowed(matrix_array)
    grad, grad_strides = borrowed(grad_operand[0]), grad_operand[1]
    grid, grid_strides = borrowed(grid_operand[0]), grid_operand[1]
    dx, dx_strides = borrowed(dx_operand[0]), dx_operand[1]
    batch, channels, sizes, out_sizes = geometry
    taps, _, weights, slopes, coefficients, _ = _part_scratch(scratch, part)
    slabs = borrowed(parts)
    first, last = slabs[part, 0], slabs[part, 1]
    zero_planes(Operand(dx, dx_strides), first, last, channels, sizes)
    depth = sizes[0]
    out_depth, out_height, out_width = out_sizes
    for n in range(first // depth, (last + depth - 1) // depth):
        slab = (max(first - n * depth, 0), min(last - n * depth, depth))
        if slab[0] >= slab[1]:
            continue
        for d in range(out_depth):
            for h in range(out_height):
                _start_row(grid, grid_strides, matrix, rule.field, n, d, h, coefficients)
                for w in range(out_width):
                    point = _first_point(grid_strides, n, d, h, w, rule.field)
                    values = _values(grid, grid_strides, point, rule.field, matrix, coefficients, w)
                    origin = _origin(matrix, rule.field, n, d, h, w)
                    if not _reaches(values, sizes, rule, origin, slab, taps, weights, slopes):
                        continue
                    out = n * grad_strides[0] + d * grad_strides[2] + h * grad_strides[3] + w * grad_strides[4]
                    _scatter(
                        grad,
                        out,
                        grad_strides[1],
                        dx,
                        n * dx_strides[0],
                        dx_strides,
                        channels,
                        sizes,
                        slab,
                        taps,
                        weights,
                    )


#: ``forward(x, grid, matrix, y, geometry, rule, parts)``: see :func:`_forward`.
forward = Parallel(_forward, functools.partial(_scratch, matrix_at=2, rule_at=5))
#: ``dgrid(grad, x, grid, matrix, dgrid, moments, geometry, rule, parts)``: see :func:`_dgrid`.
dgrid = Parallel(_dgrid, functools.partial(_scratch, matrix_at=3, rule_at=7))
#: ``dx(grad, grid, matrix, dx, geometry, rule, parts)``, ``parts`` an int64 (count, 2) array of plane runs: see
#: :func:`_dx`.
dx = Parallel(_dx, functools.partial(_scratch, matrix_at=2, rule_at=5))
