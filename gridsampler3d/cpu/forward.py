"""Forward kernels of the CPU engine: ``y = sample(x, grid)``, one block of points at a time.

Per block, phase A (:mod:`.block`) computes coordinates, weights and tap offsets with the
points as SIMD lanes; then every channel gathers its taps across the same lanes. Channels-
last data with enough channels instead runs the channel vector innermost. Operands are
flat 1-D arrays with element strides (any layout is read in place); offsets are int64.

Kernels are built per (interpolation, padding, align_corners), so the per-point code
carries no branch on the modes; each is compiled on first use and cached on disk.
"""
from __future__ import annotations

import functools

import numpy as np

from .block import masked_offsets, nearest_cells, slot, tap_weight, trilinear_cells, unsigned
from .coords import NEAREST
from .jit import Parallel, borrowed, helper, outlined_helper, part_kernel, part_rows
from .tuning import BLOCK, VECTOR_CHANNELS


@functools.cache
def forward_kernel(interpolation: int, padding: int, align_corners: bool, voxels: bool = False,
                   exact_remainder: bool = False, channels_last: bool = False):
    """The forward kernel of one mode triple (and coordinate source).

    ``kernel(x, x_strides, grid, grid_strides, y, y_strides, batch, channels, sizes, out_sizes, parts, unresolved,
    part)`` fills part ``part`` of ``parts`` equal row ranges of ``y`` (N, C, Do, Ho, Wo) from
    ``x`` (N, C, D, H, W) sampled at ``grid`` (N, Do, Ho, Wo, 3); ``sizes`` = (D, H, W),
    ``out_sizes`` = (Do, Ho, Wo), strides in elements in the logical order of each shape.
    Returned as one parallel kernel (:class:`.jit.Parallel`), called without ``part``, which
    runs the ``parts`` parts at once. Every element of ``y`` is written; each sum runs over the taps in
    PyTorch's order in float64 and is rounded once into ``y``.

    Reflection takes its remainder without libm, which is exact within two spans of the
    volume. A part that meets a coordinate farther out (or infinite) sets
    ``unresolved[part]`` to 1 and leaves its rows unfinished: the caller then runs the
    kernel built with ``exact_remainder``, which takes libm's remainder everywhere (its
    loops do not vectorise) and never sets the flag. (The exact pass is a kernel of its
    own because, inlined beside the fast pass as a rare re-run, it left the fast pass
    several times slower.)

    With ``voxels`` (the fused warp) ``grid`` is instead a displacement (N, 3, Do, Ho, Wo)
    as (dz, dy, dx) in voxels, whose ``grid_strides`` are given as (n, d, h, w, -component):
    dx sits 2 components above dz, read at a negative component step.

    With ``channels_last`` (the engine sets it for channels-last data) the kernel runs the
    channel loop innermost where the strides allow; without it the kernel never compiles
    that path (about 0.4 s of a first call's compile).
    """
    nearest = interpolation == NEAREST

    @part_kernel
    def kernel(x_operand, x_strides, grid_operand, grid_strides, y_operand, y_strides, batch, channels, sizes,
               out_sizes, parts, unresolved_operand, reals, integers, part):
        x = borrowed(x_operand)
        grid = borrowed(grid_operand)
        y = borrowed(y_operand)
        unresolved = borrowed(unresolved_operand)
        # This part's rows of the scratch arrays (see _scratch)
        sides, weights, no_multipliers, totals, coords = reals  # the forward needs no multipliers
        sides, weights, totals = borrowed(sides)[part], borrowed(weights)[part], borrowed(totals)[part]
        coords = borrowed(coords)[part]
        no_multipliers = borrowed(no_multipliers)[part]
        offsets, corner, unused, inside, lowest = integers
        offsets, corner, unused = borrowed(offsets)[part], borrowed(corner)[part], borrowed(unused)[part]
        inside, lowest = borrowed(inside)[part], borrowed(lowest)[part]
        rows = batch * out_sizes[0] * out_sizes[1]
        out_depth, out_height, out_width = out_sizes
        spatial = (x_strides[2], x_strides[3], x_strides[4])
        channel_inner = not nearest and channels >= VECTOR_CHANNELS and x_strides[1] == 1 and y_strides[1] == 1
        unresolved[part] = 0
        for row in range(part * rows // parts, (part + 1) * rows // parts):
            if unresolved[part]:
                break
            n = row // (out_depth * out_height)
            d = (row // out_height) % out_depth
            h = row % out_height
            first_point = n * grid_strides[0] + d * grid_strides[1] + h * grid_strides[2]
            if voxels:
                first_point -= 2 * grid_strides[4]
            first_out = n * y_strides[0] + d * y_strides[2] + h * y_strides[3]
            x_batch = n * x_strides[0]
            for start in range(0, out_width, BLOCK):
                count = min(BLOCK, out_width - start)
                first = first_point + start * grid_strides[3]
                out = first_out + start * y_strides[4]
                origin = (float(start), float(h), float(d))
                if nearest:
                    if nearest_cells(grid, first, grid_strides[3], grid_strides[4], count, sizes, padding,
                                     align_corners, True, exact_remainder, voxels, origin, spatial, coords, corner,
                                     inside, lowest):
                        unresolved[part] = 1
                        break
                    for c in range(channels):
                        source = x_batch + c * x_strides[1]
                        target = out + c * y_strides[1]
                        if y_strides[4] == 1:  # a view, so that the stores are contiguous
                            row = y[target:target + count]
                            for i in range(count):
                                row[i] = _nearest_value(x, source, corner, inside, i)
                            continue
                        for i in range(count):
                            y[target + i * y_strides[4]] = _nearest_value(x, source, corner, inside, i)
                    continue
                if trilinear_cells(grid, first, grid_strides[3], grid_strides[4], count, sizes, padding,
                                   align_corners, True, exact_remainder, voxels, origin, spatial, spatial, coords,
                                   sides, corner, unused, inside, lowest, False, no_multipliers, no_multipliers,
                                   no_multipliers):
                    unresolved[part] = 1
                    break
                masked_offsets(count, corner, inside, spatial, offsets)
                if channels_last:  # a constant of the kernel, so that other kernels never compile this path
                    if channel_inner:
                        for i in range(count):
                            for tap in range(8):
                                weights[slot(tap, i)] = tap_weight(sides, tap, i)
                        _channels_inner(count, x, x_batch, y, out, y_strides[4], channels, weights, offsets, inside,
                                        totals)
                        continue
                for c in range(channels):
                    source = x_batch + c * x_strides[1]
                    target = out + c * y_strides[1]
                    if y_strides[4] == 1:  # a view, so that the stores are contiguous
                        row = y[target:target + count]
                        for i in range(count):
                            row[i] = _tap_sum(x, source, offsets, sides, inside, i)
                        continue
                    for i in range(count):
                        y[target + i * y_strides[4]] = _tap_sum(x, source, offsets, sides, inside, i)

    return Parallel(kernel, _scratch)


def _scratch(parts: int, x, x_strides, grid, grid_strides, y, y_strides, batch, channels, *shapes):
    """(reals, integers): the arrays a forward pass works in, each with one row per part.

    In the kernel's order: sides (6 entries per point), weights (8), no multipliers (none),
    totals (one per channel), coords (3 per point); offsets (8), corner, unused, inside,
    lowest (1 each); ``BLOCK`` points. See :func:`.jit.part_kernel`.
    """
    reals = tuple(part_rows(parts, entries) for entries in (6 * BLOCK, 8 * BLOCK, 0, channels, 3 * BLOCK))
    integers = tuple(part_rows(parts, entries * BLOCK, np.int64) for entries in (8, 1, 1, 1, 1))
    return reals, integers


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
                values = x[source:source + channels]
                for c in range(channels):
                    totals[c] += values[c] * weight
        target = out + i * y_step
        for c in range(channels):
            y[target + c] = totals[c]
