"""Backward kernels of the CPU engine: dx and dgrid, a block of points at a time.

Per block of one output row, phase A (:mod:`.block`) computes coordinates, weights and
tap offsets with the points as SIMD lanes. The grid gradient then gathers every channel's
taps across the same lanes, summing channels outer and taps inner in float64, PyTorch's
order. Phase B walks the block's points in order and adds their taps into dx, each
thread only into the (n, z) planes it owns (:mod:`.slabs`), with a branch-free path for
points whose eight taps all land there. Kernels are built per (interpolation, padding,
align_corners) and kind of field, compiled on first use and cached on disk.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from ..sampling import FieldKind, Sampling
from .block import (
    borrow,
    is_affine,
    is_spline,
    masked_offsets,
    nearest_cells,
    row_origin,
    row_position,
    scratch_cells,
    slab_taps,
    slot,
    tap_delta,
    tap_weight,
    trilinear_cells,
    unsigned,
)
from .compile_report import label
from .coords import AFFINE, GRID, NEAREST, ZEROS
from .jit import Parallel, borrowed, helper, outlined_helper, part_kernel, part_rows, zero_elements
from .records import (
    ALL_TAPS,
    Carry,
    CarryMode,
    Cells,
    Geometry,
    Operand,
    Outputs,
    Points,
    RowRanges,
    Rule,
    kernel_rule,
)
from .spline import add_plane_sums, coefficient_entries, fill_row, fold_plane, plane_entries
from .tuning import BLOCK, VECTOR_CHANNELS


class _Scratch(NamedTuple):
    """The arrays a backward pass works in, each with one row per part (see :func:`.jit.part_kernel`).

    ``cells`` phase A's results (its ``other_corner`` is the corner in dx); ``weights`` the
    taps' weights (8 per point); ``pairs`` the separable gradient's pair weights, or the
    exact gradient's eight tap values (12 per point); ``grad_x``, ``grad_y``, ``grad_z``
    the grid gradient's sums (1 per point); ``terms`` one point's 3 terms per channel;
    ``offsets`` the taps' offsets in x (8 per point); ``taps`` the taps in the part's
    slab (1 per point); ``zeroed`` the run of dx planes zeroed so far (2 entries, see
    :func:`zero_reached`); ``coefficients`` a B-spline's row coefficients, ``plane_sums``
    its plane's sums of the gradient and ``row_sums`` one control row's of them summed along
    w (:mod:`.spline`).
    """

    cells: Cells
    weights: np.ndarray
    pairs: np.ndarray
    grad_x: np.ndarray
    grad_y: np.ndarray
    grad_z: np.ndarray
    terms: np.ndarray
    offsets: np.ndarray
    taps: np.ndarray
    zeroed: np.ndarray
    coefficients: np.ndarray
    plane_sums: np.ndarray
    row_sums: np.ndarray


def _scratch(parts: int, operands, geometry, *rest, spline: bool = False):
    """(:class:`_Scratch`,): a backward pass's scratch, one row per part; ``spline``: the field is a B-spline's."""
    reals = [part_rows(parts, entries * BLOCK) for entries in (8, 12, 1, 1, 1)]
    row = coefficient_entries(operands[5]) if spline else 0  # operands' matrix: the field's constants
    plane = plane_entries(operands[5]) if spline else 0
    return (
        _Scratch(
            scratch_cells(parts, multipliers=True),
            *reals,
            part_rows(parts, 3 * geometry.channels),
            part_rows(parts, 8 * BLOCK, np.int64),
            part_rows(parts, BLOCK, np.int64),
            part_rows(parts, 2, np.int64),
            part_rows(parts, row),
            part_rows(parts, plane),
            part_rows(parts, row),
        ),
    )


@helper
def _part_scratch(scratch, part):
    """Part ``part``'s rows of a :class:`_Scratch` (written out, not through :func:`.block.part_cells`: a helper
    inside a helper is optimised once more, and compile time is a first call's)."""
    cells = Cells(*scratch[0])  # named again, as every record a kernel is given (:func:`.records.unnamed`)
    scratch = _Scratch(cells, *scratch[1:])
    return _Scratch(
        Cells(
            borrowed(cells.coords)[part],
            borrowed(cells.sides)[part],
            borrowed(cells.corner)[part],
            borrowed(cells.other_corner)[part],
            borrowed(cells.inside)[part],
            borrowed(cells.lowest)[part],
            borrowed(cells.mx)[part],
            borrowed(cells.my)[part],
            borrowed(cells.mz)[part],
        ),
        borrowed(scratch.weights)[part],
        borrowed(scratch.pairs)[part],
        borrowed(scratch.grad_x)[part],
        borrowed(scratch.grad_y)[part],
        borrowed(scratch.grad_z)[part],
        borrowed(scratch.terms)[part],
        borrowed(scratch.offsets)[part],
        borrowed(scratch.taps)[part],
        borrowed(scratch.zeroed)[part],
        borrowed(scratch.coefficients)[part],
        borrowed(scratch.plane_sums)[part],
        borrowed(scratch.row_sums)[part],
    )


class BackwardOperands(NamedTuple):
    """The operands of a backward launch, each a :class:`.records.Operand`, an output not written empty; and two
    flat float64 arrays read and written in order, without strides.

    ``matrix`` is an affine field's voxel matrix (N * 12), ``moments`` its gradient's per-row
    sums (6 per output row: sum_w g and sum_w g * w, per axis x, y, z, of the gradient g with
    respect to the position; :func:`gridsampler3d.affine.matrix_gradient`); both empty for
    other fields.
    """

    grad: Operand
    x: Operand
    grid: Operand
    dx: Operand
    dgrid: Operand
    matrix: np.ndarray
    moments: np.ndarray


@helper
def zero_planes(dx, first, last, channels, sizes):
    """Zero the (n, z) planes first .. last - 1 (plane = n * D + z) of dx (N, C, D, H, W), every channel.

    ``dx`` (an operand) is dense, NCDHW or channels-last, as the engine allocates it: a
    batch's planes in the range are then one run of memory per channel (NCDHW) or one run
    for all channels (channels-last), each zeroed by one memset.
    """
    depth, height, width = sizes
    n_stride, c_stride, z_stride, _, x_stride = dx.strides
    channels_last = c_stride == 1 and x_stride == channels
    runs = 1 if channels_last else channels
    length = height * width * (channels if channels_last else 1)
    for n in range(first // depth, (last + depth - 1) // depth):
        z_first, z_last = max(first - n * depth, 0), min(last - n * depth, depth)
        for run in range(runs if z_first < z_last else 0):
            zero_elements(dx.data, n * n_stride + z_first * z_stride + run * c_stride, (z_last - z_first) * length)


@helper
def zero_reached(dx, geometry, zeroed, reached, whole, base, first, last):
    """Zero the dx planes a block's taps reach that the run ``zeroed`` lacks, then grow the run over them.

    The backward zeroes its dx planes as its points first reach them, so that a plane's
    scatter finds it in the cache instead of reading back what a separate zeroing pass
    wrote out to memory. ``zeroed`` holds the run [zeroed[0], zeroed[1]) of planes
    (n * D + z) zeroed so far; it stays one interval: what lies between it and a new
    plane is zeroed too (once, as it would be anyway).

    The planes are those of base + [first, last) that the block's taps reach: ``reached``
    is (count, lowest, taps, reach), point i reaching base + lowest[i] .. base +
    lowest[i] + reach - 1 when it has a tap flagged in ``taps``; with ``whole``, all of
    base + [first, last).
    """
    count, lowest, taps, reach = reached
    low, high = last, first
    for i in range(count):
        used = taps[i] != 0
        low = min(low, lowest[i]) if used else low
        high = max(high, lowest[i] + reach) if used else high
    if not whole:
        first, last = max(low, first), min(high, last)
    first, last = base + first, base + last
    if first >= last:
        return
    if zeroed[0] >= zeroed[1]:
        zeroed[0], zeroed[1] = first, first
    below, above = zeroed[0], zeroed[1]
    # [first, below) then [above, last), from one loop: one copy of the zeroing code in the
    # kernel (LLVM multiplies each copy inside the kernel's loops; docs/cpu.md, "Compilation")
    for side in range(2):
        start = first if side == 0 else above
        end = below if side == 0 else last
        zero_planes(dx, start, end, geometry.channels, geometry.sizes)
    zeroed[0], zeroed[1] = min(below, first), max(above, last)


class RowPlace(NamedTuple):
    """Where an output row stands for one part (:func:`_row_place`): whether it computes dx and the field's
    gradient, its (n, d, h), this part's planes z_lo .. z_hi - 1 of batch n its taps may reach, and where
    its first point lies in the field, in the field's gradient and in grad."""

    do_dx: bool
    do_dfield: bool
    n: int
    d: int
    h: int
    z_lo: int
    z_hi: int
    field_at: int
    dfield_at: int
    grad_at: int


class BlockPlace(NamedTuple):
    """Where a block of a row's points starts: in grad, in the field's gradient and in the carried sums; its
    batch item, and the part's slab z_lo .. z_hi - 1; its row and its first point's column."""

    grad_at: int
    dfield_at: int
    carry_at: int
    n: int
    z_lo: int
    z_hi: int
    row: int
    start: int


@functools.cache
def backward_kernel(
    sampling: Sampling,
    field: FieldKind,
    pytorch_terms: bool = True,
    exact_remainder: bool = False,
    channels_last: bool = False,
):
    """The backward kernel of one sampling rule and kind of field.

    ``pytorch_terms`` keeps PyTorch's terms and association in the grid gradient (float64
    bitwise equal to PyTorch); otherwise (for float32 and half data, computed in float64
    and rounded once) it sums the separable form, a third of the arithmetic.

    ``kernel(operands, geometry, parts, rows, outputs, carry, unresolved)`` is one parallel
    kernel (:class:`.jit.Parallel`). ``operands`` (:class:`BackwardOperands`) holds grad,
    x, grid, dx (N, C, D, H, W) and dgrid (N, Do, Ho, Wo, 3); it fills dx if
    ``outputs.dx`` and dgrid if ``outputs.dfield`` (:class:`~gridsampler3d.sampling.Outputs`).
    For a displacement (``field``) grid and dgrid are the displacement and its gradient
    (N, 3, Do, Ho, Wo) as (dz, dy, dx) in voxels, both with strides given as (n, d, h, w,
    -component) (see :func:`.forward.forward_kernel`).

    ``parts`` (P, 4) gives each part its dx planes [first, end) (plane = n * D + z) and
    rows [first, end) (row = n * Do * Ho + d * Ho + h); ``rows``
    (:class:`.records.RowRanges`, from :func:`.slabs.depth_ranges`) lets a part skip rows
    that miss its planes (a part that owns every plane needs none: with empty ranges every
    row is walked). A part writes the grid gradient of every point in its rows, so a pass
    that computes both outputs runs as one part. Nearest kernels compute dx only: their
    grid gradient is zero.

    ``carry`` (:class:`.records.Carry`: float64 sums, 3 * rows * Wo for the rows from
    ``parts[0, 2]`` on, and a :class:`.records.CarryMode`) lets a grid gradient run as
    several passes over groups of channels, each continuing the sums of the one before in
    PyTorch's order. Every element of an output asked for is written, unless a part sets
    ``unresolved[part]`` to 1: then the caller runs the kernel built with
    ``exact_remainder`` instead (see :func:`.forward.forward_kernel`). ``channels_last``
    as for :func:`.forward.forward_kernel`: only such kernels compile the channels-inner
    paths.
    """
    # The records as the constants the kernel is compiled with.
    interpolation, padding, align_corners, field_code, forward, exact = kernel_rule(
        sampling, field, forward=False, exact_remainder=exact_remainder
    )
    nearest = interpolation == NEAREST
    spline = field.spline

    @part_kernel
    def kernel(operands, geometry, parts, rows, outputs, carry, unresolved_operand, scratch, part):
        # The records, given as plain tuples (:func:`.records.unnamed`), named again.
        ops = BackwardOperands(
            borrow(operands[0]),
            borrow(operands[1]),
            borrow(operands[2]),
            borrow(operands[3]),
            borrow(operands[4]),
            borrowed(operands[5]),
            borrowed(operands[6]),
        )
        geometry, outputs = Geometry(*geometry), Outputs(*outputs)
        work = _part_scratch(scratch, part)
        ranges, carried = RowRanges(borrowed(rows[0]), borrowed(rows[1])), Carry(borrowed(carry[0]), carry[1])
        unresolved = borrowed(unresolved_operand)
        rule = Rule(interpolation, padding, align_corners, field_code, forward, exact)
        planes = (parts[part, 0], parts[part, 1], parts[0, 2])  # this part's planes; the carry's first row
        work.zeroed[0], work.zeroed[1] = planes[0], planes[0]  # the run of this part's dx planes zeroed so far
        unresolved[part] = 0
        for row in range(parts[part, 2], parts[part, 3]):
            at = _row_place(ops, geometry, field_code, row, planes, ranges, outputs, 1 if nearest else 2)
            n, do_dx = at.n, at.do_dx
            if spline and (do_dx or at.do_dfield):  # the row's coefficients; a plane's sums from zero
                _start_spline_row(ops, at, row == parts[part, 2], work)
            for start in range(0, geometry.out_sizes[2] if do_dx or at.do_dfield else 0, BLOCK):
                points = Points(
                    at.field_at + start * ops.grid.strides[3],
                    ops.grid.strides[3],
                    ops.grid.strides[4],
                    min(BLOCK, geometry.out_sizes[2] - start),
                )
                origin = row_origin(ops.matrix, field_code, n, at.h, at.d, start)
                place = BlockPlace(
                    at.grad_at + start * ops.grad.strides[4],
                    at.dfield_at + start * ops.dgrid.strides[3],
                    (row - planes[2]) * geometry.out_sizes[2] + start,
                    n,
                    at.z_lo,
                    at.z_hi,
                    row,
                    start,
                )
                # Each choice below is made by the kernel's constants, so that each kernel
                # compiles only its own path (docs/cpu.md, "Compilation").
                # The field's values: a B-spline's row coefficients (by the kernel's constant: one array type).
                values = work.coefficients if spline else ops.grid.data
                if nearest:
                    if not _nearest_block(ops, values, geometry, rule, points, origin, place, do_dx, work):
                        unresolved[part] = 1
                        return
                    continue
                if trilinear_cells(
                    values,
                    ops.matrix,
                    points,
                    geometry.sizes,
                    rule,
                    origin,
                    ops.x.strides[2:],
                    ops.dx.strides[2:],
                    work.cells,
                    True,
                ):
                    unresolved[part] = 1
                    return
                if do_dx:  # the taps in this part's slab; the planes they reach, zeroed where not yet
                    slab_taps(points.count, work.cells.inside, work.cells.lowest, place.z_lo, place.z_hi, work.taps)
                    zero_reached(
                        ops.dx,
                        geometry,
                        work.zeroed,
                        (points.count, work.cells.lowest, work.taps, 2),
                        False,
                        n * geometry.sizes[0],
                        place.z_lo,
                        place.z_hi,
                    )
                if at.do_dfield:
                    masked_offsets(points.count, work.cells.corner, work.cells.inside, ops.x.strides[2:], work.offsets)
                    sums = (work.grad_x, work.grad_y, work.grad_z)
                    _start_sums(points.count, carried, place.carry_at, sums)
                    if pytorch_terms:
                        _grid_gradient(
                            points.count,
                            ops.grad,
                            place.grad_at,
                            ops.x,
                            n * ops.x.strides[0],
                            geometry.channels,
                            work.cells,
                            work.offsets,
                            work.pairs,
                            sums,
                        )
                    elif channels_last:
                        _channels_last_gradient(ops, geometry.channels, points.count, place, work, sums)
                    else:
                        _grid_gradient_separable(
                            points.count,
                            ops.grad,
                            place.grad_at,
                            ops.x,
                            n * ops.x.strides[0],
                            geometry.channels,
                            work.cells,
                            work.offsets,
                            work.pairs,
                            sums,
                        )
                    _store_sums(points.count, ops, geometry, rule, place, carried, work, sums)
                if do_dx and channels_last:
                    _channels_last_scatter(ops, geometry.channels, points.count, place, work)
                elif do_dx:
                    _scatter(
                        points.count, ops.dx, n * ops.dx.strides[0], ops.grad, place.grad_at, geometry.channels, work
                    )
            if spline and at.do_dfield and (carried.mode == CarryMode.WHOLE or carried.mode == CarryMode.LAST):
                _end_spline_row(ops, geometry, at, row == parts[part, 3] - 1, work)
        if outputs.dx:  # the planes no point reached
            zero_reached(
                ops.dx, geometry, work.zeroed, (0, work.cells.lowest, work.taps, 1), True, 0, planes[0], planes[1]
            )

    label(kernel, "backward", sampling, field, channels_last, exact_remainder)
    return Parallel(kernel, functools.partial(_scratch, spline=spline))


@helper
def _start_spline_row(ops, at, first_row, work):
    """A B-spline row's start: its coefficients (:func:`.spline.fill_row`), and at a plane's first row (or the part's)
    the plane's sums from zero."""
    grid = ops.grid
    plane = at.n * grid.strides[0] + at.d * grid.strides[1] - 2 * grid.strides[4]
    fill_row(grid.data, plane, grid.strides[2], grid.strides[3], grid.strides[4], ops.matrix, at.h, work.coefficients)
    if at.h == 0 or first_row:
        work.plane_sums[:] = 0.0


@helper
def _end_spline_row(ops, geometry, at, last_row, work):
    """A B-spline row's end: at a plane's last row (or the part's), the plane's sums along w into its (n, d) plane of
    dT (:func:`.spline.fold_plane`): a plane's rows are one part's, in order."""
    if at.h == geometry.out_sizes[1] - 1 or last_row:
        dgrid = ops.dgrid
        plane = at.n * dgrid.strides[0] + at.d * dgrid.strides[1] - 2 * dgrid.strides[4]
        fold_plane(
            dgrid.data,
            plane,
            dgrid.strides[2],
            dgrid.strides[3],
            dgrid.strides[4],
            ops.matrix,
            work.plane_sums,
            work.row_sums,
        )


@helper
def _row_place(ops, geometry, field, row, planes, ranges, outputs, reach):
    """Where output row ``row`` stands for this part (:class:`RowPlace`); ``field`` the kind's code."""
    depth = geometry.sizes[0]
    n, d, h = row_position(row, geometry.out_sizes)
    z_lo = max(planes[0] - n * depth, 0)
    z_hi = min(planes[1] - n * depth, depth)
    in_slab = z_lo < z_hi
    # Empty ranges: every row is walked (the part owns every plane).
    do_dx = (
        in_slab
        and outputs.dx
        and (ranges.first.size == 0 or (ranges.last[row] + reach > z_lo and ranges.first[row] < z_hi))
    )
    grid, dgrid, grad = ops.grid.strides, ops.dgrid.strides, ops.grad.strides
    # Where the row's x components start in grid and dgrid (a displacement's dx sits above dz).
    first_point = n * grid[0] + d * grid[1] + h * grid[2] - (2 * grid[4] if field != GRID else 0)
    first_dgrid = n * dgrid[0] + d * dgrid[1] + h * dgrid[2] - (2 * dgrid[4] if field != GRID else 0)
    first_grad = n * grad[0] + d * grad[2] + h * grad[3]
    return RowPlace(do_dx, in_slab and outputs.dfield, n, d, h, z_lo, z_hi, first_point, first_dgrid, first_grad)


@helper
def _nearest_block(ops, values, geometry, rule, points, origin, place, do_dx, work):
    """One block of nearest: its points' voxels, and their grad added into dx; False where unresolved; ``values``
    the field's (:func:`.block.field_coordinates`)."""
    n, z_lo, z_hi = place.n, place.z_lo, place.z_hi
    cells = work.cells
    dx_spatial = (ops.dx.strides[2], ops.dx.strides[3], ops.dx.strides[4])
    if nearest_cells(values, ops.matrix, points, geometry.sizes, rule, origin, dx_spatial, cells):
        return False
    if do_dx:
        slab_taps(points.count, cells.inside, cells.lowest, z_lo, z_hi, work.taps)
        zero_reached(
            ops.dx,
            geometry,
            work.zeroed,
            (points.count, cells.lowest, work.taps, 1),
            False,
            n * geometry.sizes[0],
            z_lo,
            z_hi,
        )
        _scatter_nearest(
            points.count,
            ops.dx,
            n * ops.dx.strides[0],
            ops.grad,
            place.grad_at,
            geometry.channels,
            cells.corner,
            work.taps,
        )
    return True


@helper
def _channels_last_gradient(ops, channels, count, place, work, sums):
    """The separable grid gradient of channels-last data: with enough contiguous channels, each tap's channels read
    as vectors (the same sums)."""
    x_batch = place.n * ops.x.strides[0]
    if channels >= VECTOR_CHANNELS and ops.grad.strides[1] == 1 and ops.x.strides[1] == 1:
        # (Each separable path computes its pair weights: hoisted above both, the
        # backward took 1.05 (cl64) to 1.08 (feat48) of its time at two threads.)
        _pair_weights(count, work.cells.sides, work.pairs)
        _grid_gradient_channels_inner(
            count,
            ops.grad.data,
            place.grad_at,
            ops.grad.strides[4],
            ops.x.data,
            x_batch,
            channels,
            work.cells.inside,
            work.offsets,
            work.pairs,
            work.terms,
            sums,
        )
        return
    _grid_gradient_separable(
        count, ops.grad, place.grad_at, ops.x, x_batch, channels, work.cells, work.offsets, work.pairs, sums
    )


@helper
def _channels_last_scatter(ops, channels, count, place, work):
    """Phase B of a channels-last block: with enough contiguous channels, each tap adds to a channel vector."""
    dx_batch = place.n * ops.dx.strides[0]
    if channels >= VECTOR_CHANNELS and ops.grad.strides[1] == 1 and ops.dx.strides[1] == 1:
        dx_spatial = (ops.dx.strides[2], ops.dx.strides[3], ops.dx.strides[4])
        _scatter_channels_inner(
            count,
            ops.dx.data,
            dx_batch,
            dx_spatial,
            ops.grad.data,
            place.grad_at,
            ops.grad.strides[4],
            channels,
            _tap_weights(count, work),
            work.cells.other_corner,
            work.taps,
        )
        return
    _scatter(count, ops.dx, dx_batch, ops.grad, place.grad_at, channels, work)


@helper
def _tap_weights(count, work):
    """``work.weights`` filled with each point's eight tap weights (for the scatter); returned."""
    weights, sides = work.weights, work.cells.sides
    for i in range(count):
        for tap in range(8):
            weights[slot(tap, i)] = tap_weight(sides, tap, i)
    return weights


@helper
def _start_sums(count, carry, at, sums):
    """The grid gradient's sums of a block: the carried sums of the channels before, or zero."""
    grad_x, grad_y, grad_z = sums
    if carry.mode == CarryMode.MIDDLE or carry.mode == CarryMode.LAST:
        points = carry.sums.size // 3  # each component's row of sums in the carry
        for i in range(count):
            grad_x[i] = carry.sums[at + i]
        for i in range(count):
            grad_y[i] = carry.sums[points + at + i]
        for i in range(count):
            grad_z[i] = carry.sums[2 * points + at + i]
    else:
        grad_x[:count] = 0.0
        grad_y[:count] = 0.0
        grad_z[:count] = 0.0


@helper
def _store_sums(count, ops, geometry, rule, place, carry, work, sums):
    """A block's sums into the carry (where channels after these follow) or, times their multipliers, into dgrid
    (and an affine field's into its moments, :func:`_add_moments`; a B-spline's into its row sums,
    :func:`_add_spline_sums`).

    With zeros padding the multipliers are the constant slopes (:func:`.coords.source_index`).
    """
    grad_x, grad_y, grad_z = sums
    dgrid, cells = ops.dgrid, work.cells
    if carry.mode == CarryMode.FIRST or carry.mode == CarryMode.MIDDLE:
        at, points = place.carry_at, carry.sums.size // 3
        for i in range(count):
            carry.sums[at + i] = grad_x[i]
        for i in range(count):
            carry.sums[points + at + i] = grad_y[i]
        for i in range(count):
            carry.sums[2 * points + at + i] = grad_z[i]
        return
    unit = 1 if rule.align_corners else 0
    depth, height, width = geometry.sizes
    slope_x, slope_y, slope_z = (
        (1.0, 1.0, 1.0) if rule.field != GRID else ((width - unit) * 0.5, (height - unit) * 0.5, (depth - unit) * 0.5)
    )
    zeros = rule.padding == ZEROS
    if is_affine(rule.field):
        if ops.moments.size:
            _add_moments(count, ops.moments, place, zeros, cells, sums)
        if rule.field == AFFINE or not dgrid.data.size:
            return
    if is_spline(rule.field):
        if dgrid.data.size:
            _add_spline_sums(count, ops, place, place.row % geometry.out_sizes[1], zeros, work, sums)
        return
    at, step, component = place.dfield_at, dgrid.strides[3], dgrid.strides[4]
    if rule.field != GRID and step == 1:
        # A displacement's components are three contiguous rows: stored through views,
        # each in a loop of its own, the stores vectorise (docs/cpu.md).
        row_x = dgrid.data[at : at + count]
        row_y = dgrid.data[at + component : at + component + count]
        row_z = dgrid.data[at + 2 * component : at + 2 * component + count]
        for i in range(count):
            row_x[i] = (slope_x if zeros else cells.mx[i]) * grad_x[i]
        for i in range(count):
            row_y[i] = (slope_y if zeros else cells.my[i]) * grad_y[i]
        for i in range(count):
            row_z[i] = (slope_z if zeros else cells.mz[i]) * grad_z[i]
        return
    for i in range(count):
        point = at + i * step
        dgrid.data[point] = (slope_x if zeros else cells.mx[i]) * grad_x[i]
        dgrid.data[point + component] = (slope_y if zeros else cells.my[i]) * grad_y[i]
        dgrid.data[point + 2 * component] = (slope_z if zeros else cells.mz[i]) * grad_z[i]


@helper
def _add_spline_sums(count, ops, place, h, zeros, work, sums):
    """A B-spline's plane sums (``work.plane_sums``) gain this block's points of row h: each point's gradient with
    respect to its position ``g`` (as :func:`_add_moments` takes it) times its row's support weights along h
    (:func:`.spline.add_plane_sums`)."""
    grad_x, grad_y, grad_z = sums
    cells = work.cells
    if not zeros:  # the multipliers, in place: the sums are not read again
        for i in range(count):
            grad_x[i] *= cells.mx[i]
        for i in range(count):
            grad_y[i] *= cells.my[i]
        for i in range(count):
            grad_z[i] *= cells.mz[i]
    add_plane_sums(work.plane_sums, ops.matrix, h, place.start, count, grad_x, grad_y, grad_z)


@helper
def _add_moments(count, moments, place, zeros, cells, sums):
    """An affine field's row moments (:class:`BackwardOperands`) gain this block's points, in order; the row's first
    block starts them from zero. ``g``, the gradient with respect to the position, is the multiplier (1 with
    zeros padding) times the sum, as the displacement's gradient stores it."""
    row = moments[place.row * 6 : place.row * 6 + 6]
    if place.start == 0:
        row[:] = 0.0
    grad_x, grad_y, grad_z = sums
    # In registers over the block, so that the six chains do not wait on memory.
    sum_x, sum_y, sum_z, moment_x, moment_y, moment_z = row[0], row[1], row[2], row[3], row[4], row[5]
    for i in range(count):
        w = float(place.start + i)
        g_x = (1.0 if zeros else cells.mx[i]) * grad_x[i]
        g_y = (1.0 if zeros else cells.my[i]) * grad_y[i]
        g_z = (1.0 if zeros else cells.mz[i]) * grad_z[i]
        sum_x += g_x
        sum_y += g_y
        sum_z += g_z
        moment_x += g_x * w
        moment_y += g_y * w
        moment_z += g_z * w
    row[0], row[1], row[2], row[3], row[4], row[5] = sum_x, sum_y, sum_z, moment_x, moment_y, moment_z


@helper
def _grid_gradient(count, grad, grad_at, x, x_batch, channels, cells, offsets, values, sums):
    """Per point i: grad_x/y/z[i] = sum over channels (outer) and taps (inner) of ±((x_tap * w_a) * w_b) * grad.

    PyTorch's terms in PyTorch's order, vectorised across the points; an outside tap's
    term is not added (its gather reads a valid element that the tap's bit discards). The
    sums continue from what grad_x/y/z (``sums``) hold (zero, or the sums of channels before).
    """
    grad_x, grad_y, grad_z = sums
    sides, inside = cells.sides, cells.inside
    for c in range(channels):
        source = x_batch + c * x.strides[1]
        at = grad_at + c * grad.strides[1]
        # The taps' values first, in a loop of their own: loaded lane by lane (no hardware
        # gathers) inside the loop below, they left LLVM's cost model keeping it scalar.
        for i in range(count):
            for tap in range(8):
                values[slot(tap, i)] = float(x.data[unsigned(source + offsets[slot(tap, i)])])
        for i in range(count):
            g = float(grad.data[at + i * grad.strides[4]])
            sum_x, sum_y, sum_z = grad_x[i], grad_y[i], grad_z[i]
            for tap in range(8):
                value = values[slot(tap, i)]
                wx = sides[slot(tap & 1, i)]
                wy = sides[slot(2 + ((tap >> 1) & 1), i)]
                wz = sides[slot(4 + (tap >> 2), i)]
                counts = (inside[i] >> tap) & 1
                # d weight / d index is -1 for a tap's low side along an axis, +1 for its high side
                term_x = value * wy * wz * g
                term_y = value * wx * wz * g
                term_z = value * wx * wy * g
                sum_x = (sum_x + term_x if tap & 1 else sum_x - term_x) if counts else sum_x
                sum_y = (sum_y + term_y if (tap >> 1) & 1 else sum_y - term_y) if counts else sum_y
                sum_z = (sum_z + term_z if tap >> 2 else sum_z - term_z) if counts else sum_z
            grad_x[i], grad_y[i], grad_z[i] = sum_x, sum_y, sum_z


@helper
def _grid_gradient_separable(count, grad, grad_at, x, x_batch, channels, cells, offsets, pairs, sums):
    """The grid gradient as differences along each axis weighted by the other two axes' weights.

    d/d ix = sum over the four (y, z) edges of (wy * wz) * (x[high x] - x[low x]), and so
    on per axis; outside taps read as 0. The pair weights depend on the point only, so
    each channel costs 8 gathers and about 35 operations instead of about 100. The sums
    continue from what grad_x/y/z hold, as in :func:`_grid_gradient`.
    """
    grad_x, grad_y, grad_z = sums
    _pair_weights(count, cells.sides, pairs)
    x_array = x.data
    for c in range(channels):
        source = x_batch + c * x.strides[1]
        at = grad_at + c * grad.strides[1]
        for i in range(count):
            g = float(grad.data[at + i * grad.strides[4]])
            bits = cells.inside[i]
            along_x = along_y = along_z = 0.0
            for edge in range(4):
                first, second = edge & 1, edge >> 1
                # the edge's two taps along x (y, z), fixed by the edge's sides on the other axes
                tx = (first << 1) | (second << 2)
                ty = first | (second << 2)
                tz = first | (second << 1)
                along_x += pairs[slot(edge, i)] * (
                    _tap_value(x_array, source, offsets, bits, tx | 1, i)
                    - _tap_value(x_array, source, offsets, bits, tx, i)
                )
                along_y += pairs[slot(4 + edge, i)] * (
                    _tap_value(x_array, source, offsets, bits, ty | 2, i)
                    - _tap_value(x_array, source, offsets, bits, ty, i)
                )
                along_z += pairs[slot(8 + edge, i)] * (
                    _tap_value(x_array, source, offsets, bits, tz | 4, i)
                    - _tap_value(x_array, source, offsets, bits, tz, i)
                )
            grad_x[i] += along_x * g
            grad_y[i] += along_y * g
            grad_z[i] += along_z * g


@helper
def _pair_weights(count, sides, pairs):
    """pairs[slot(4 * axis + edge, i)]: the product of the other two axes' sides of edge ``edge`` of point i."""
    for pair in range(12):
        # the other two axes' sides: (edge & 1, edge >> 1)
        axis, low, high = pair >> 2, pair & 1, (pair >> 1) & 1
        first = low if axis else 2 + low
        second = 2 + high if axis == 2 else 4 + high
        for i in range(count):  # one store per loop, so that it vectorises
            pairs[slot(pair, i)] = sides[slot(first, i)] * sides[slot(second, i)]


# Called, not inlined, as the other channels-last paths.
@outlined_helper
def _grid_gradient_channels_inner(
    count, grad, grad_at, grad_step, x, x_batch, channels, inside, offsets, pairs, terms, sums
):
    """Channels-last :func:`_grid_gradient_separable`, bit for bit: each tap's channels read as one vector.

    Per point, each channel's three terms ``along * g`` are computed across the channels
    (contiguous loads instead of a lane-by-lane gather per channel and tap), then summed
    onto grad_x/y/z[i] channel by channel, the separable pass's order. ``terms`` holds
    one point's 3 * ``channels`` terms.
    """
    grad_x, grad_y, grad_z = sums
    term_x, term_y, term_z = terms[:channels], terms[channels : 2 * channels], terms[2 * channels : 3 * channels]
    for i in range(count):
        bits = inside[i]
        # The eight taps' channel vectors (an outside tap's offset is 0: a valid row, read as 0 below).
        v0 = x[x_batch + offsets[slot(0, i)] : x_batch + offsets[slot(0, i)] + channels]
        v1 = x[x_batch + offsets[slot(1, i)] : x_batch + offsets[slot(1, i)] + channels]
        v2 = x[x_batch + offsets[slot(2, i)] : x_batch + offsets[slot(2, i)] + channels]
        v3 = x[x_batch + offsets[slot(3, i)] : x_batch + offsets[slot(3, i)] + channels]
        v4 = x[x_batch + offsets[slot(4, i)] : x_batch + offsets[slot(4, i)] + channels]
        v5 = x[x_batch + offsets[slot(5, i)] : x_batch + offsets[slot(5, i)] + channels]
        v6 = x[x_batch + offsets[slot(6, i)] : x_batch + offsets[slot(6, i)] + channels]
        v7 = x[x_batch + offsets[slot(7, i)] : x_batch + offsets[slot(7, i)] + channels]
        g_row = grad[grad_at + i * grad_step : grad_at + i * grad_step + channels]
        in0, in1, in2, in3 = bits & 1, (bits >> 1) & 1, (bits >> 2) & 1, (bits >> 3) & 1
        in4, in5, in6, in7 = (bits >> 4) & 1, (bits >> 5) & 1, (bits >> 6) & 1, (bits >> 7) & 1
        px0, px1, px2, px3 = pairs[slot(0, i)], pairs[slot(1, i)], pairs[slot(2, i)], pairs[slot(3, i)]
        py0, py1, py2, py3 = pairs[slot(4, i)], pairs[slot(5, i)], pairs[slot(6, i)], pairs[slot(7, i)]
        pz0, pz1, pz2, pz3 = pairs[slot(8, i)], pairs[slot(9, i)], pairs[slot(10, i)], pairs[slot(11, i)]
        for c in range(channels):
            a0 = float(v0[c]) if in0 else 0.0
            a1 = float(v1[c]) if in1 else 0.0
            a2 = float(v2[c]) if in2 else 0.0
            a3 = float(v3[c]) if in3 else 0.0
            a4 = float(v4[c]) if in4 else 0.0
            a5 = float(v5[c]) if in5 else 0.0
            a6 = float(v6[c]) if in6 else 0.0
            a7 = float(v7[c]) if in7 else 0.0
            g = float(g_row[c])
            # The separable pass's edges in its order (taps: bit 0 x, bit 1 y, bit 2 z)
            along_x = 0.0
            along_x += px0 * (a1 - a0)
            along_x += px1 * (a3 - a2)
            along_x += px2 * (a5 - a4)
            along_x += px3 * (a7 - a6)
            along_y = 0.0
            along_y += py0 * (a2 - a0)
            along_y += py1 * (a3 - a1)
            along_y += py2 * (a6 - a4)
            along_y += py3 * (a7 - a5)
            along_z = 0.0
            along_z += pz0 * (a4 - a0)
            along_z += pz1 * (a5 - a1)
            along_z += pz2 * (a6 - a2)
            along_z += pz3 * (a7 - a3)
            term_x[c] = along_x * g
            term_y[c] = along_y * g
            term_z[c] = along_z * g
        sum_x, sum_y, sum_z = grad_x[i], grad_y[i], grad_z[i]
        for c in range(channels):
            sum_x += term_x[c]
            sum_y += term_y[c]
            sum_z += term_z[c]
        grad_x[i], grad_y[i], grad_z[i] = sum_x, sum_y, sum_z


@helper
def _tap_value(x, source, offsets, bits, tap, i):
    """x at tap ``tap`` of point ``i``, or 0 when the tap lies outside the volume."""
    value = float(x[unsigned(source + offsets[slot(tap, i)])])
    return value if (bits >> tap) & 1 else 0.0


@helper
def _scatter_nearest(count, dx, dx_batch, grad, grad_at, channels, dx_corner, taps):
    """Phase B of nearest: dx[voxel] += grad for every point whose voxel lies in the slab, points in order.

    The channels-inner path is chosen here at run time in every nearest kernel: with it
    left out of the NCDHW kernels, near64's one-thread backward took 1.3 times as long
    (docs/cpu.md, "Compilation").
    """
    if channels >= VECTOR_CHANNELS and grad.strides[1] == 1 and dx.strides[1] == 1:
        _scatter_nearest_channels_inner(
            count, dx.data, dx_batch, grad.data, grad_at, grad.strides[4], channels, dx_corner, taps
        )
        return
    for c in range(channels):
        target = dx_batch + c * dx.strides[1]
        source = grad_at + c * grad.strides[1]
        for i in range(count):
            if taps[i]:
                dx.data[unsigned(target + dx_corner[i])] += grad.data[unsigned(source + i * grad.strides[4])]


# The channels-last paths are called, not inlined: inlined beside the channel-outer loops
# they made LLVM compile those loops markedly slower.
@outlined_helper
def _scatter_nearest_channels_inner(count, dx, dx_batch, grad, grad_at, grad_step, channels, dx_corner, taps):
    for i in range(count):
        if taps[i]:
            target = dx_batch + dx_corner[i]
            source = grad_at + i * grad_step
            # Views, so that the channel index is provably non-negative: a flat index might
            # wrap around (negative indexing) and keeps the loop scalar (docs/cpu.md).
            voxel = dx[target : target + channels]
            values = grad[source : source + channels]
            for c in range(channels):
                voxel[c] += values[c]


@helper
def _scatter(count, dx, dx_batch, grad, grad_at, channels, work):
    """Phase B: dx[tap] += weight * grad for every tap whose bit is set in ``work.taps``, points in order.

    The taps' weights are computed first, into ``work.weights`` (as :func:`_tap_weights`,
    written out here: a helper inside a helper costs compile time).
    """
    weights, sides, dx_corner, in_slab = work.weights, work.cells.sides, work.cells.other_corner, work.taps
    for i in range(count):
        for tap in range(8):
            weights[slot(tap, i)] = tap_weight(sides, tap, i)
    dx_array, dx_spatial = dx.data, (dx.strides[2], dx.strides[3], dx.strides[4])
    for c in range(channels):
        plane = dx_batch + c * dx.strides[1]
        at = grad_at + c * grad.strides[1]
        for i in range(count):
            bits = in_slab[i]
            if bits == 0:
                continue
            g = float(grad.data[at + i * grad.strides[4]])
            target = plane + dx_corner[i]
            if bits == ALL_TAPS:
                for tap in range(8):
                    dx_array[unsigned(target + tap_delta(tap, dx_spatial))] += weights[slot(tap, i)] * g
            else:
                for tap in range(8):
                    if (bits >> tap) & 1:
                        dx_array[unsigned(target + tap_delta(tap, dx_spatial))] += weights[slot(tap, i)] * g


@outlined_helper
def _scatter_channels_inner(
    count, dx, dx_batch, dx_spatial, grad, grad_at, grad_step, channels, weights, dx_corner, in_slab
):
    """Channels-last phase B: each tap adds weight * grad to the tap's contiguous channel vector."""
    for i in range(count):
        bits = in_slab[i]
        if bits == 0:
            continue
        source = grad_at + i * grad_step
        values = grad[source : source + channels]  # views: see _scatter_nearest_channels_inner
        for tap in range(8):
            if (bits >> tap) & 1:
                weight = weights[slot(tap, i)]
                target = dx_batch + dx_corner[i] + tap_delta(tap, dx_spatial)
                voxel = dx[target : target + channels]
                for c in range(channels):
                    voxel[c] += weight * values[c]
