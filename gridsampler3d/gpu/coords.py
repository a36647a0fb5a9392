"""Coordinate rules of the GPU engine: unnormalise, pad (clip / reflect), their slopes, taps.

Triton twins of :mod:`gridsampler3d.reference`'s rules, element-wise over a block of
points. Indices, weights and multipliers are computed in float64 whatever the data's
dtype, so a float32 coordinate near an integer rounds the way the golden's does; the
kernels round weights to their accumulation type afterwards. The kernels call these and
nothing else for coordinates. ``RULE`` is the call's :class:`.records.Rule` (a constexpr),
a grid or its gradient an :class:`.records.Operand` with :class:`.records.PointStrides`.
A B-spline's displacement and its row sums follow :mod:`gridsampler3d.cpu.spline`, operation for operation.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..modes import Interpolation, Padding
from ..reference import CUBIC_A, INT_MAX, INT_MIN, OUT_OF_RANGE
from ..rounding import ROUNDER
from ..sampling import FieldKind

# The shared numbers as constexprs: a Triton kernel reads no other globals.
INT_MAX = tl.constexpr(INT_MAX)
INT_MIN = tl.constexpr(INT_MIN)
OUT_OF_RANGE = tl.constexpr(OUT_OF_RANGE)
CUBIC_A = tl.constexpr(CUBIC_A)
ROUNDER = tl.constexpr(ROUNDER)

# Triton's interpreter has no libdevice; its % on floats is NumPy's fmod, which is C fmod.
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"))

# The values of modes.Interpolation / Padding, as compile-time constants.
BILINEAR = tl.constexpr(Interpolation.BILINEAR.value)
NEAREST = tl.constexpr(Interpolation.NEAREST.value)
ZEROS = tl.constexpr(Padding.ZEROS.value)
BORDER = tl.constexpr(Padding.BORDER.value)
REFLECTION = tl.constexpr(Padding.REFLECTION.value)
GRID = tl.constexpr(FieldKind.GRID.value)
AFFINE = tl.constexpr(FieldKind.AFFINE.value)


@triton.jit
def wide(value):
    """``value`` as int64. Integer kernel arguments arrive as int32 when they fit, and a
    product of two of them is an int32 multiply that wraps past 2**31: every size is
    widened once, at the top of a kernel, before it enters a product or an offset."""
    return tl.cast(value, tl.int64)


@triton.jit
def reflect(index, twice_low, twice_high):
    """Reflect about [twice_low / 2, twice_high / 2] (float64): (index, gradient sign)."""
    # * 0.5 is exact (and bit-identical to / 2.0) without a division.
    low = twice_low * 0.5
    span = (twice_high - twice_low) * 0.5
    shifted = index - low
    sign = tl.where(shifted < 0, -1.0, 1.0)
    shifted = tl.abs(shifted)
    # C fmod, exact. Compiled, Triton's % on floats is x - trunc(x / y) * y, which is off
    # by a whole span when x / y rounds up to an integer (x a few ulps below k * span).
    if INTERPRETED:
        extra = shifted % span
    else:
        extra = libdevice.fmod(shifted, span)
    flips = tl.floor(shifted / span)
    # C++ casts the flip count to int: past INT_MAX (or NaN) it is INT_MIN, which is even.
    flips = tl.where(flips <= INT_MAX, flips, 0.0)
    odd = (flips.to(tl.int64) % 2) == 1
    reflected = tl.where(odd, span - extra + low, extra + low)
    sign = tl.where(odd, -sign, sign)
    degenerate = twice_low == twice_high
    return tl.where(degenerate, 0.0, reflected), tl.where(degenerate, 0.0, sign)


@triton.jit
def source_index(coord, size, origin, RULE: tl.constexpr, FORWARD: tl.constexpr):
    """Voxel index and d index / d coord (both float64) of normalised coordinates along ``size`` voxels.

    For a field other than a grid (``RULE.field``) ``coord`` is a displacement in voxels (0
    for an affine field alone) from the position ``origin`` (:func:`field_coordinates`): the
    index is ``origin + coord`` and its slope 1, before padding. ``FORWARD`` selects PyTorch's forward
    treatment of a NaN under border/reflection padding (clipped to ``size - 1``); the backward
    lets it fall out of range.
    """
    coord = coord.to(tl.float64)
    extent = tl.cast(size, tl.float64)  # size may arrive as a constexpr (Triton specialises ints equal to 1)
    if RULE.field != GRID:
        index = origin.to(tl.float64) + coord
        multiplier = tl.zeros_like(coord) + 1.0
    elif RULE.align_corners:
        index = (coord + 1.0) * 0.5 * (extent - 1.0)
        multiplier = tl.zeros_like(coord) + (extent - 1.0) * 0.5
    else:
        index = ((coord + 1.0) * extent - 1.0) * 0.5
        multiplier = tl.zeros_like(coord) + extent * 0.5
    if RULE.padding == REFLECTION:
        if RULE.align_corners:
            index, sign = reflect(index, 0.0, 2.0 * (extent - 1.0))
        else:
            index, sign = reflect(index, -1.0, 2.0 * extent - 1.0)
        multiplier = multiplier * sign
    if RULE.padding != ZEROS:
        was_nan = index != index
        upper = extent - 1.0
        # The clip's bounds count as outside (gradient 0); NaN passes with 1.
        inside = tl.where((index <= 0.0) | (index >= upper), 0.0, 1.0)
        index = tl.where(index <= 0.0, 0.0, tl.where(index >= upper, upper, index))
        multiplier = multiplier * inside
        if FORWARD:
            index = tl.where(was_nan, upper, index)
    # NaN, +-inf and values outside the int32 range become an out-of-bounds index.
    safe = (index <= INT_MAX - 1) & (index >= INT_MIN)
    return tl.where(safe, index, OUT_OF_RANGE), multiplier


@triton.jit
def component_offsets(offset, step, FIELD: tl.constexpr):
    """Offsets (int64) of the x, y and z components of the points at ``offset`` (components ``step`` apart).

    A grid holds (x, y, z); a displacement (any other ``FIELD``) holds (dz, dy, dx), so its x is 2 components up.
    """
    if FIELD != GRID:
        return offset + 2 * wide(step), offset + step, offset
    return offset, offset + step, offset + 2 * wide(step)


@triton.jit
def affine_position(matrix, n, d, h, w, mask):
    """(px, py, pz), float64: an affine field's positions of the output points (n, d, h, w), ``M @ (w, h, d, 1)``
    from the rows of its voxel matrix (N, 12), each axis ``M[0] w + ((M[1] h + M[2] d) + M[3])`` as every engine
    evaluates it (:mod:`gridsampler3d.affine`)."""
    row = matrix + (n * 12 + tl.zeros_like(w))
    wf, hf, df = w.to(tl.float64), h.to(tl.float64), d.to(tl.float64)
    px = tl.load(row, mask=mask, other=0.0) * wf + (
        (tl.load(row + 1, mask=mask, other=0.0) * hf + tl.load(row + 2, mask=mask, other=0.0) * df)
        + tl.load(row + 3, mask=mask, other=0.0)
    )
    py = tl.load(row + 4, mask=mask, other=0.0) * wf + (
        (tl.load(row + 5, mask=mask, other=0.0) * hf + tl.load(row + 6, mask=mask, other=0.0) * df)
        + tl.load(row + 7, mask=mask, other=0.0)
    )
    pz = tl.load(row + 8, mask=mask, other=0.0) * wf + (
        (tl.load(row + 9, mask=mask, other=0.0) * hf + tl.load(row + 10, mask=mask, other=0.0) * df)
        + tl.load(row + 11, mask=mask, other=0.0)
    )
    return px, py, pz


@triton.jit
def bspline_weight(t):
    """The uniform cubic B-spline at ``t`` (float64), as :func:`gridsampler3d.bspline.beta` writes it."""
    magnitude = tl.abs(t)
    near = (4.0 - 6.0 * magnitude * magnitude + 3.0 * magnitude * magnitude * magnitude) / 6.0
    far = (2.0 - magnitude) * (2.0 - magnitude) * (2.0 - magnitude) / 6.0
    return tl.where(magnitude < 1.0, near, tl.where(magnitude < 2.0, far, 0.0))


@triton.jit
def spline_support(columns, w, mask):
    """(lowest, weights, count) of the output columns ``w`` on a B-spline's control grid along w (``columns``:
    spacing, origin, count, float64): each point's support is the control columns ``lowest + m`` (m = 0..3,
    float64, ``floor(t) - 1 + m``, ``t = (w - origin) / spacing``) of weights ``beta(t - lowest - m)``, those
    inside the grid (0 .. count - 1) only; as :func:`gridsampler3d.cpu.spline.column` computes them."""
    lanes = tl.zeros_like(w)
    spacing = tl.load(columns + lanes, mask=mask, other=1.0)
    origin = tl.load(columns + 1 + lanes, mask=mask, other=0.0)
    count = tl.load(columns + 2 + lanes, mask=mask, other=0.0)
    t = (w.to(tl.float64) - origin) / spacing
    lowest = tl.floor(t) - 1.0
    weights = ()
    for m in tl.static_range(4):
        weights = weights + (bspline_weight(t - (lowest + m)),)
    return lowest, weights, count


@triton.jit
def spline_displacement(field, n, d, h, w, mask, FIELD: tl.constexpr):
    """(dx, dy, dz), float64, of a B-spline at the output points (n, d, h, w): the sum over m in order of
    ``beta(t - c_m) V[n, :, d, h, c_m]`` for the support's columns c_m inside the grid (:func:`spline_support`), V
    the row coefficients ``field.data`` (a :class:`.records.FieldOperand`; a column outside is left out, not
    multiplied by 0)."""
    lowest, weights, count = spline_support(field.columns, w, mask)
    total_x = tl.zeros(w.shape, tl.float64)
    total_y = tl.zeros(w.shape, tl.float64)
    total_z = tl.zeros(w.shape, tl.float64)
    for m in tl.static_range(4):
        index = lowest + m
        valid = mask & (index >= 0.0) & (index < count)
        column = tl.minimum(tl.maximum(index, 0.0), count - 1.0).to(tl.int64)
        at_x, at_y, at_z = component_offsets(point_offset(n, d, h, column, field.strides), field.strides.k, FIELD)
        total_x = tl.where(valid, total_x + weights[m] * tl.load(field.data + at_x, mask=valid, other=0.0), total_x)
        total_y = tl.where(valid, total_y + weights[m] * tl.load(field.data + at_y, mask=valid, other=0.0), total_y)
        total_z = tl.where(valid, total_z + weights[m] * tl.load(field.data + at_z, mask=valid, other=0.0), total_z)
    return total_x, total_y, total_z


@triton.jit
def field_coordinates(field, n, d, h, w, mask, RULE: tl.constexpr):
    """(gx, gy, gz, ox, oy, oz) of the output points (n, d, h, w) of ``field`` (a :class:`.records.FieldOperand`):
    what the field holds along x, y and z, and the positions a displacement is measured from.

    A grid holds normalised coordinates (the origins are unused); a displacement is measured
    from the point's own (w, h, d); an affine field's from its affine position
    (:func:`affine_position`), and an affine field alone holds zeros. A B-spline's displacement is summed from its
    row coefficients (:func:`spline_displacement`).
    """
    if RULE.field == AFFINE:
        gx = tl.zeros(w.shape, tl.float64)
        gy = tl.zeros(w.shape, tl.float64)
        gz = tl.zeros(w.shape, tl.float64)
    elif RULE.spline:
        gx, gy, gz = spline_displacement(field, n, d, h, w, mask, RULE.field)
    else:
        offset = point_offset(n, d, h, w, field.strides)
        at_x, at_y, at_z = component_offsets(offset, field.strides.k, RULE.field)
        gx = tl.load(field.data + at_x, mask=mask, other=0.0)
        gy = tl.load(field.data + at_y, mask=mask, other=0.0)
        gz = tl.load(field.data + at_z, mask=mask, other=0.0)
    if RULE.affine:
        ox, oy, oz = affine_position(field.matrix, n, d, h, w, mask)
    else:
        ox, oy, oz = w, h, d
    return gx, gy, gz, ox, oy, oz


@triton.jit
def point_indices(field, n, d, h, w, mask, depth, height, width, RULE: tl.constexpr, FORWARD: tl.constexpr):
    """(ix, iy, iz, mx, my, mz) of the output points (n, d, h, w) of ``field`` (:func:`field_coordinates`)."""
    gx, gy, gz, ox, oy, oz = field_coordinates(field, n, d, h, w, mask, RULE)
    ix, mx = source_index(gx, width, ox, RULE, FORWARD)
    iy, my = source_index(gy, height, oy, RULE, FORWARD)
    iz, mz = source_index(gz, depth, oz, RULE, FORWARD)
    return ix, iy, iz, mx, my, mz


@triton.jit
def store_point_gradient(dgrid, offset, mask, grad_x, grad_y, grad_z, FIELD: tl.constexpr):
    """Write the gradients along x, y and z of the points of ``dgrid`` at ``offset``, in the component order of
    their grid or displacement (:func:`component_offsets`)."""
    at_x, at_y, at_z = component_offsets(offset, dgrid.strides.k, FIELD)
    tl.store(dgrid.data + at_x, grad_x, mask=mask)
    tl.store(dgrid.data + at_y, grad_y, mask=mask)
    tl.store(dgrid.data + at_z, grad_z, mask=mask)


@triton.jit
def store_position_gradient(
    dgrid, partials, columns, point, gradient, out_sizes, RULE: tl.constexpr, OUTPUTS: tl.constexpr
):
    """Write what a backward walk makes of its points' gradient with respect to their positions, ``gradient`` =
    (x, y, z), float64, the multipliers applied, at the output points ``point`` = (n, d, h, w, mask): the field's
    gradient (``OUTPUTS.dfield``) through ``dgrid``'s strides (:func:`store_point_gradient`), or a B-spline's
    partial row sums (:func:`store_row_sums`, its control grid along w in ``columns``); an affine field's partial
    row moments (``OUTPUTS.dtheta``, :func:`store_row_moments`); both row partials in ``partials``
    (:class:`.records.RowPartials`). ``out_sizes`` is (Do, Ho), int64."""
    n, d, h, w, mask = point
    grad_x, grad_y, grad_z = gradient
    out_depth, out_height = out_sizes
    if OUTPUTS.dfield and RULE.spline:
        store_row_sums(partials, columns, program_row(n, d, h, mask, out_depth, out_height), w, mask, gradient)
    elif OUTPUTS.dfield:
        store_point_gradient(dgrid, point_offset(n, d, h, w, dgrid.strides), mask, grad_x, grad_y, grad_z, RULE.field)
    if OUTPUTS.dtheta:
        store_row_moments(partials, program_row(n, d, h, mask, out_depth, out_height), w, mask, gradient)


@triton.jit
def program_row(n, d, h, mask, out_depth, out_height):
    """The output row (n * Do + d) * Ho + h, int64, of a program whose points are one output row, its first lane in
    it: the plan of a walk that sums per row (:class:`.records.RowPartials`) takes patches one row high and deep,
    the tricubic walk one row a program."""
    # The same in every lane of the row; a lane past its end may be in the next row (flat numbering).
    return tl.max(tl.where(mask, (n * out_depth + d) * out_height + h, 0), axis=0)


@triton.jit
def store_row_moments(partials, row, w, mask, gradient):
    """Write this program's partial row moments of an affine field (:class:`.records.RowPartials`): the sums over
    its points of their position gradient (``gradient`` = (x, y, z), float64) and of it times w, into the block of
    column ``program_id(1)`` of their output ``row`` (:func:`program_row`).

    ``tl.sum`` adds its lanes in a fixed order, and no two programs write the same entry.
    """
    grad_x, grad_y, grad_z = gradient
    gx = tl.where(mask, grad_x, 0.0)
    gy = tl.where(mask, grad_y, 0.0)
    gz = tl.where(mask, grad_z, 0.0)
    columns = w.to(tl.float64)
    at = partials.moments + (row * partials.blocks + tl.program_id(1)) * 6
    tl.store(at, tl.sum(gx, axis=0))
    tl.store(at + 1, tl.sum(gy, axis=0))
    tl.store(at + 2, tl.sum(gz, axis=0))
    tl.store(at + 3, tl.sum(gx * columns, axis=0))
    tl.store(at + 4, tl.sum(gy * columns, axis=0))
    tl.store(at + 5, tl.sum(gz * columns, axis=0))


@triton.jit
def store_row_sums(partials, columns, row, w, mask, gradient):
    """Write this program's partial row sums of a B-spline (:class:`.records.RowPartials`): for each control
    column c of its window, the sum over its points of ``beta(t - c) g`` where c is in the point's support and
    inside the grid (:func:`spline_support`; ``g`` = ``gradient``, (x, y, z), float64), into the block of column
    ``program_id(1)`` of their output ``row`` (:func:`program_row`), components (dz, dy, dx).

    Every entry of the window is written (0 where no point's support holds its column); ``tl.sum`` adds its lanes
    in a fixed order, and no two programs write the same entry.
    """
    grad_x, grad_y, grad_z = gradient
    lowest, weights, count = spline_support(columns, w, mask)
    block = tl.program_id(1)
    window = wide(partials.window)
    first = tl.load(partials.firsts + block).to(tl.float64)
    at = partials.sums + (row * partials.blocks + block) * 3 * window
    for slot in range(0, window):
        index = first + slot
        # The support step m whose column is this one: exact, both are integers.
        step = index - lowest
        weight = tl.where(step == 0.0, weights[0], tl.where(step == 1.0, weights[1], weights[2]))
        weight = tl.where(step == 3.0, weights[3], weight)
        hit = mask & (step >= 0.0) & (step <= 3.0) & (index < count)
        tl.store(at + slot, tl.sum(tl.where(hit, weight * grad_z, 0.0), axis=0))
        tl.store(at + window + slot, tl.sum(tl.where(hit, weight * grad_y, 0.0), axis=0))
        tl.store(at + 2 * window + slot, tl.sum(tl.where(hit, weight * grad_x, 0.0), axis=0))


@triton.jit
def nearest_voxel(index):
    """nearbyint(index) as int64 (ties to even)."""
    return ((index + ROUNDER) - ROUNDER).to(tl.int64)


@triton.jit
def base_corner(index, INTERPOLATION: tl.constexpr):
    """The lowest tap along one axis, int64: floor for trilinear, nearbyint for nearest."""
    if INTERPOLATION == NEAREST:
        return nearest_voxel(index)
    return tl.floor(index).to(tl.int64)


@triton.jit
def tap_weight(index, corner, STEP: tl.constexpr):
    """Linear weight (float64) of the tap ``corner + STEP`` (STEP 0 or 1) of ``index``."""
    if STEP == 1:
        return index - corner.to(tl.float64)
    return (corner + 1).to(tl.float64) - index


@triton.jit
def linear_weight(index, corner, step):
    """:func:`tap_weight` for a run-time ``step`` (0 or 1): the same float64 value."""
    return tl.where(step == 1, index - corner.to(tl.float64), (corner + 1).to(tl.float64) - index)


@triton.jit
def cell_taps(ix, iy, iz, depth, height, width, strides, INTERPOLATION: tl.constexpr, WEIGHT: tl.constexpr):
    """The taps of points at indices (ix, iy, iz), as three tuples over taps: offset (int64, within
    a batch item of a volume with these ``strides``), inside (bool) and weight (the float64
    product rounded once to ``WEIGHT``; trilinear only). Trilinear has 8 taps in PyTorch's order
    (bit 0 steps x, bit 1 y, bit 2 z), nearest one. Computed once per point, used by every channel."""
    x0, y0, z0 = base_corner(ix, INTERPOLATION), base_corner(iy, INTERPOLATION), base_corner(iz, INTERPOLATION)
    offsets, insides, weights = (), (), ()
    for tap in tl.static_range(1 if INTERPOLATION == NEAREST else 8):
        step_x, step_y, step_z = tap & 1, (tap >> 1) & 1, tap >> 2
        cx, cy, cz = x0 + step_x, y0 + step_y, z0 + step_z
        offsets = offsets + (cz * strides.d + cy * strides.h + cx * strides.w,)
        insides = insides + ((cx >= 0) & (cx < width) & (cy >= 0) & (cy < height) & (cz >= 0) & (cz < depth),)
        weight = tap_weight(ix, x0, step_x) * tap_weight(iy, y0, step_y) * tap_weight(iz, z0, step_z)
        weights = weights + (weight.to(WEIGHT),)
    return offsets, insides, weights


@triton.jit
def tile_points(out_depth, out_height, out_width, TILE: tl.constexpr):
    """This program's output points: (n, d, h, w, mask), n a scalar, d, h, w int64 vectors.

    Programs tile each batch item of the output in patches of the :class:`.records.Blocks`'s
    block_d x block_h x block_w points (launch grid: ``launch.patch_grid``, (N * cdiv(Do,
    block_d) * cdiv(Ho, block_h), cdiv(Wo, block_w))), so the only divisions by a size are a
    few per program; a point's d, h and w come from its lane by shifts and masks. A wide
    output gives patches of one row (block_d = block_h = 1).
    """
    h_blocks = tl.cdiv(out_height, TILE.block_h)
    d_blocks = tl.cdiv(out_depth, TILE.block_d)
    program = tl.program_id(0).to(tl.int64)
    lane = tl.arange(0, TILE.block_d * TILE.block_h * TILE.block_w)
    w = tl.program_id(1).to(tl.int64) * TILE.block_w + lane % TILE.block_w
    h = (program % h_blocks) * TILE.block_h + (lane // TILE.block_w) % TILE.block_h
    d = ((program // h_blocks) % d_blocks) * TILE.block_d + lane // (TILE.block_w * TILE.block_h)
    return program // (h_blocks * d_blocks), d, h, w, (d < out_depth) & (h < out_height) & (w < out_width)


@triton.jit
def point_position(point, out_depth, out_height, out_width):
    """(n, d, h, w), int64, of output point ``point`` (flat over N, Do, Ho, Wo)."""
    w = point % out_width
    h = (point // out_width) % out_height
    d = (point // (out_width * out_height)) % out_depth
    n = point // (out_width * out_height * out_depth)
    return n, d, h, w


# Two helpers for one sum: Triton instantiates a helper once per kernel for each list of
# argument types, and a record's type is its members' types without their names, so one
# helper called with a VolumeStrides and a PointStrides of the same member types would read
# the second through the first's field names (records.py). A helper takes one record class.


@triton.jit
def point_offset(n, d, h, w, strides):
    """Element offset (int64) of point (n, d, h, w) (its component 0) in a field with these
    :class:`.records.PointStrides`."""
    return n * strides.n + d * strides.d + h * strides.h + w * strides.w


@triton.jit
def volume_offset(n, d, h, w, strides):
    """Element offset (int64) of voxel (n, d, h, w) (its channel 0) in an (N, C, D, H, W) tensor with these
    :class:`.records.VolumeStrides`."""
    return n * strides.n + d * strides.d + h * strides.h + w * strides.w


# ---- bicubic: padding applies to each tap; the point's index is only unnormalised ----


@triton.jit
def unnormalize(coord, size, origin, RULE: tl.constexpr):
    """(index, d index / d coord), float64, of normalised coordinates along ``size`` voxels
    (for a field other than a grid, ``RULE.field``: of displacements from ``origin``, see :func:`source_index`)."""
    coord = coord.to(tl.float64)
    if RULE.field != GRID:
        return origin.to(tl.float64) + coord, tl.zeros_like(coord) + 1.0
    extent = tl.cast(size, tl.float64)  # size may arrive as a constexpr (Triton specialises ints equal to 1)
    if RULE.align_corners:
        return (coord + 1.0) * 0.5 * (extent - 1.0), tl.zeros_like(coord) + (extent - 1.0) * 0.5
    return ((coord + 1.0) * extent - 1.0) * 0.5, tl.zeros_like(coord) + extent * 0.5


# The cubic convolution constant is a local ``a`` in each helper, every operation with a
# tensor written tensor first: a constexpr on the left of an operation with a tensor does
# not evaluate under the interpreter.


@triton.jit
def cubic_weight(t, STEP: tl.constexpr):
    """Cubic convolution weight (A = -0.75) of tap floor - 1 + STEP at fraction ``t``, PyTorch's evaluation."""
    a = CUBIC_A
    if STEP == 0:
        x = t + 1.0
        return ((x * a - a * 5) * x + a * 8) * x - a * 4
    elif STEP == 1:
        return (t * (a + 2) - (a + 3)) * t * t + 1
    elif STEP == 2:
        x = 1.0 - t
        return (x * (a + 2) - (a + 3)) * x * x + 1
    else:
        x = 2.0 - t
        return ((x * a - a * 5) * x + a * 8) * x - a * 4


@triton.jit
def cubic_weight_at(t, step):
    """:func:`cubic_weight` for a run-time ``step`` (int tensor)."""
    return tl.where(
        step == 0,
        cubic_weight(t, 0),
        tl.where(step == 1, cubic_weight(t, 1), tl.where(step == 2, cubic_weight(t, 2), cubic_weight(t, 3))),
    )


@triton.jit
def cubic_slope(t, STEP: tl.constexpr):
    """d weight / d t of :func:`cubic_weight` (PyTorch's gradient coefficient, negated)."""
    a = CUBIC_A
    if STEP == 0:
        x = -1.0 - t
        return -((x * (a * -3) - a * 10) * x - a * 8)
    elif STEP == 1:
        x = -t
        return -((x * ((a + 2) * -3) - (a + 3) * 2) * x)
    elif STEP == 2:
        x = 1.0 - t
        return -((x * ((a + 2) * 3) - (a + 3) * 2) * x)
    else:
        x = 2.0 - t
        return -((x * (a * 3) - a * 10) * x + a * 8)


@triton.jit
def pad_tap(coord, size, RULE: tl.constexpr):
    """Where padding sends the integer tap coordinate ``coord`` (float64), as int64; unusable -> out of range."""
    extent = tl.cast(size, tl.float64)  # size may arrive as a constexpr (Triton specialises ints equal to 1)
    if RULE.padding == REFLECTION:
        if RULE.align_corners:
            coord, _ = reflect(coord, 0.0, 2.0 * (extent - 1.0))
        else:
            coord, _ = reflect(coord, -1.0, 2.0 * extent - 1.0)
    if RULE.padding != ZEROS:
        upper = extent - 1.0
        coord = tl.where(coord <= 0.0, 0.0, tl.where(coord >= upper, upper, coord))
    safe = (coord <= INT_MAX - 1) & (coord >= INT_MIN)
    return tl.where(safe, coord, OUT_OF_RANGE).to(tl.int64)
