"""Forward kernels of the CPU engine: ``y = sample(x, grid)``, one block of points at a time.

Per block, phase A (:mod:`.block`) computes coordinates, weights and tap offsets with the
points as SIMD lanes; then every channel gathers its taps across the same lanes. Channels-
last data with enough channels instead runs the channel vector innermost. Operands are
flat 1-D arrays with element strides (any layout is read in place); offsets are int64.

Kernels are built per (:class:`~gridsampler3d.sampling.Sampling`, field kind), so the
per-point code carries no branch on the modes; each is compiled on first use and cached on disk.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from ..sampling import FieldKind, Sampling
from .block import (
    borrow,
    masked_offsets,
    nearest_cells,
    part_cells,
    row_origin,
    row_position,
    scratch_cells,
    slot,
    tap_weight,
    trilinear_cells,
    unsigned,
)
from .compile_report import label
from .coords import GRID, NEAREST
from .jit import Parallel, borrowed, helper, outlined_helper, part_kernel, part_rows
from .records import Cells, Geometry, Points, Rule, kernel_rule
from .spline import coefficient_entries, fill_row
from .tuning import BLOCK, VECTOR_CHANNELS


@functools.cache
def forward_kernel(sampling: Sampling, field: FieldKind, exact_remainder: bool = False, channels_last: bool = False):
    """The forward kernel of one sampling rule and kind of field.

    ``kernel(x, grid, matrix, y, geometry, parts, unresolved)`` (:class:`.records.Operand` and
    :class:`.records.Geometry` records) fills ``y`` (N, C, Do, Ho, Wo) from ``x`` (N, C,
    D, H, W) sampled at ``grid`` (N, Do, Ho, Wo, 3); ``matrix`` (N * 12, float64) is an affine
    field's voxel matrix (:func:`gridsampler3d.affine.voxel_matrix`), empty for other fields. It is one parallel kernel
    (:class:`.jit.Parallel`) whose ``parts`` parts each fill an equal run of the output
    rows. Every element of ``y`` is written; each sum runs over the taps in PyTorch's
    order in float64 and is rounded once into ``y``.

    Reflection takes its remainder without libm, which is exact within two spans of the
    volume. A part that meets a coordinate farther out (or infinite) sets
    ``unresolved[part]`` to 1 and leaves its rows unfinished: the caller then runs the
    kernel built with ``exact_remainder``, which takes libm's remainder everywhere (its
    loops do not vectorise) and never sets the flag. (The exact pass is a kernel of its
    own because, inlined beside the fast pass as a rare re-run, it left the fast pass
    several times slower.)

    For a displacement (``field``) ``grid`` is (N, 3, Do, Ho, Wo) as (dz, dy, dx) in voxels,
    its strides given as (n, d, h, w, -component): dx sits 2 components above dz, read at a
    negative component step. An affine field with a displacement reads it so too, from the
    affine's position instead of the point's own; one without reads no grid. A B-spline's
    ``grid`` is its control points summed along d, strides (n, d, b, c, -component), from which
    each row's coefficients are summed as the row starts, and ``matrix`` holds its supports
    (:mod:`.spline`).

    With ``channels_last`` (the engine sets it for channels-last data) the kernel runs the
    channel loop innermost where the strides allow; without it the kernel never compiles
    that path (about 0.4 s of a first call's compile).
    """
    # The records as the constants the kernel is compiled with.
    interpolation, padding, align_corners, field_code, forward, exact = kernel_rule(
        sampling, field, forward=True, exact_remainder=exact_remainder
    )
    nearest = interpolation == NEAREST
    spline = field.spline

    @part_kernel
    def kernel(x_operand, grid_operand, matrix_array, y_operand, geometry, parts, unresolved_operand, scratch, part):
        x, grid, y, matrix = borrow(x_operand), borrow(grid_operand), borrow(y_operand), borrowed(matrix_array)
        # The records, given as plain tuples (:func:`.records.unnamed`), named again.
        geometry, scratch = Geometry(*geometry), _Scratch(*scratch)
        unresolved = borrowed(unresolved_operand)
        coefficients = borrowed(scratch.coefficients)[part]  # a B-spline's row coefficients (:mod:`.spline`)
        cells = part_cells(scratch.cells, part)
        work = (borrowed(scratch.weights)[part], borrowed(scratch.offsets)[part], borrowed(scratch.totals)[part])
        rule = Rule(interpolation, padding, align_corners, field_code, forward, exact)
        out_depth, out_height, out_width = geometry.out_sizes
        rows = geometry.batch * out_depth * out_height
        spatial = (x.strides[2], x.strides[3], x.strides[4])
        unresolved[part] = 0
        for row in range(part * rows // parts, (part + 1) * rows // parts):
            n, d, h = row_position(row, geometry.out_sizes)
            first_point = n * grid.strides[0] + d * grid.strides[1] + h * grid.strides[2]
            if field_code != GRID:  # a displacement's x component sits 2 components above
                first_point -= 2 * grid.strides[4]
            first_out = n * y.strides[0] + d * y.strides[2] + h * y.strides[3]
            if spline:
                plane = n * grid.strides[0] + d * grid.strides[1] - 2 * grid.strides[4]
                fill_row(grid.data, plane, grid.strides[2], grid.strides[3], grid.strides[4], matrix, h, coefficients)
            for start in range(0, out_width, BLOCK):
                points = Points(
                    first_point + start * grid.strides[3],
                    grid.strides[3],
                    grid.strides[4],
                    min(BLOCK, out_width - start),
                )
                origin = row_origin(matrix, field_code, n, h, d, start)
                out = first_out + start * y.strides[4]
                # Chosen by the kernel's constants, so that each kernel compiles only its own path.
                # The field's values: a B-spline's row coefficients (chosen by the kernel's constant, so that each
                # kernel is typed with one of the two arrays).
                if spline:
                    values = coefficients
                else:
                    values = grid.data
                if nearest:
                    if not _nearest_block(x, values, matrix, y, geometry, rule, points, origin, n, out, cells):
                        unresolved[part] = 1
                        return
                    continue
                if trilinear_cells(
                    values, matrix, points, geometry.sizes, rule, origin, spatial, spatial, cells, False
                ):
                    unresolved[part] = 1
                    return
                masked_offsets(points.count, cells.corner, cells.inside, spatial, work[1])
                if channels_last:
                    _channels_last_sums(x, y, geometry.channels, points.count, n * x.strides[0], out, cells, work)
                else:
                    _channel_sums(x, y, geometry.channels, points.count, n * x.strides[0], out, cells, work[1])

    label(kernel, "forward", sampling, field, channels_last, exact_remainder)
    return Parallel(kernel, functools.partial(_scratch, spline=spline))


class _Scratch(NamedTuple):
    """The arrays a forward pass works in, each with one row per part: phase A's cells, the taps' weights (8 per
    point) and offsets (8 per point), one point's channel totals, a B-spline's row coefficients."""

    cells: Cells
    weights: np.ndarray
    offsets: np.ndarray
    totals: np.ndarray
    coefficients: np.ndarray


def _scratch(parts: int, x, grid, matrix, y, geometry, *rest, spline: bool = False):
    """(:class:`_Scratch`,): a forward pass's scratch (see :func:`.jit.part_kernel`); the forward keeps no
    multipliers; ``spline``: the field is a B-spline's, whose rows' coefficients take room too."""
    return (
        _Scratch(
            scratch_cells(parts, multipliers=False),
            part_rows(parts, 8 * BLOCK),
            part_rows(parts, 8 * BLOCK, np.int64),
            part_rows(parts, geometry.channels),
            part_rows(parts, coefficient_entries(matrix) if spline else 0),
        ),
    )


@helper
def _nearest_block(x, values, constants, y, geometry, rule, points, origin, n, out, cells):
    """One block of nearest: each channel's nearest voxels into ``y`` from ``out`` on; False where unresolved;
    ``values`` the field's (:func:`.block.field_coordinates`)."""
    spatial = (x.strides[2], x.strides[3], x.strides[4])
    if nearest_cells(values, constants, points, geometry.sizes, rule, origin, spatial, cells):
        return False
    count = points.count
    for c in range(geometry.channels):
        source = n * x.strides[0] + c * x.strides[1]
        target = out + c * y.strides[1]
        if y.strides[4] == 1:  # a view, so that the stores are contiguous
            row = y.data[target : target + count]
            for i in range(count):
                row[i] = _nearest_value(x.data, source, cells.corner, cells.inside, i)
            continue
        for i in range(count):
            y.data[target + i * y.strides[4]] = _nearest_value(x.data, source, cells.corner, cells.inside, i)
    return True


@helper
def _channels_last_sums(x, y, channels, count, x_batch, out, cells, work):
    """:func:`_channel_sums` of channels-last data: with enough channels, the channel vector innermost."""
    weights, offsets, totals = work
    if channels >= VECTOR_CHANNELS and x.strides[1] == 1 and y.strides[1] == 1:
        for i in range(count):
            for tap in range(8):
                weights[slot(tap, i)] = tap_weight(cells.sides, tap, i)
        _channels_inner(
            count, x.data, x_batch, y.data, out, y.strides[4], channels, weights, offsets, cells.inside, totals
        )
        return
    _channel_sums(x, y, channels, count, x_batch, out, cells, offsets)


@helper
def _channel_sums(x, y, channels, count, x_batch, out, cells, offsets):
    """Each channel's weighted tap sums of a block's points, into ``y`` from ``out`` on."""
    for c in range(channels):
        source = x_batch + c * x.strides[1]
        target = out + c * y.strides[1]
        if y.strides[4] == 1:  # a view, so that the stores are contiguous
            row = y.data[target : target + count]
            for i in range(count):
                row[i] = _tap_sum(x.data, source, offsets, cells.sides, cells.inside, i)
            continue
        for i in range(count):
            y.data[target + i * y.strides[4]] = _tap_sum(x.data, source, offsets, cells.sides, cells.inside, i)


@helper
def _nearest_value(x, source, corner, inside, i):
    """Point i's nearest voxel in the channel plane at ``source``, or 0 outside (where ``corner[i]`` is 0)."""
    value = x[unsigned(source + corner[i])]
    return value if inside[i] else 0


@helper
def _tap_sum(x, source, offsets, sides, inside, i):
    """Point i's weighted sum of its inside taps in the channel plane at ``source``, taps in PyTorch's order.

    Each tap's weight is computed from the point's sides here, per channel: two vector
    multiplies beside the tap's lane-by-lane loads cost less than storing the weights
    once and loading them back for every channel.
    """
    total = 0.0
    for tap in range(8):
        term = x[unsigned(source + offsets[slot(tap, i)])] * tap_weight(sides, tap, i)
        total += term if (inside[i] >> tap) & 1 else 0.0
    return total


# Not inlined on purpose: this path inside the kernel made LLVM compile the channel-outer
# loop beside it twice as slow.
@outlined_helper
def _channels_inner(count, x, x_batch, y, out, y_step, channels, weights, offsets, inside, totals):
    """Channels-last forward of one block: per point, the taps' channel vectors summed in tap order."""
    for i in range(count):
        totals[:] = 0.0
        for tap in range(8):
            if (inside[i] >> tap) & 1:
                weight = weights[slot(tap, i)]
                source = x_batch + offsets[slot(tap, i)]
                # A view, so that the channel index is provably non-negative: a flat index
                # might wrap around (negative indexing), which keeps the loop scalar.
                values = x[source : source + channels]
                for c in range(channels):
                    totals[c] += values[c] * weight
        target = out + i * y_step
        for c in range(channels):
            y[target + c] = totals[c]
