"""Backward kernels of the CPU engine: dx and dgrid, a block of points at a time.

Per block of one output row, phase A (:mod:`.block`) computes coordinates, weights and
tap offsets with the points as SIMD lanes. The grid gradient then gathers every channel's
taps across the same lanes, summing channels outer and taps inner in float64, PyTorch's
order. Phase B walks the block's points in order and adds their taps into dx, each
thread only into the (n, z) planes it owns (:mod:`.plan`), with a branch-free path for
points whose eight taps all land there. Kernels are built per (interpolation, padding,
align_corners), compiled on first use and cached on disk.
"""
from __future__ import annotations

import functools

import numpy as np

from .block import masked_offsets, nearest_cells, slab_taps, slot, tap_delta, tap_weight, trilinear_cells, unsigned
from .coords import NEAREST, ZEROS
from .jit import Parallel, borrowed, helper, outlined_helper, part_kernel, part_rows, zero_elements
from .tuning import BLOCK, VECTOR_CHANNELS

ALL_TAPS = 255


def _scratch(parts: int, grad, grad_strides, x, x_strides, grid, grid_strides, dx, dx_strides, dgrid, dgrid_strides,
             row_first, row_last, part_bounds, batch, channels, *rest):
    """(reals, integers): the arrays a backward pass works in, each with one row per part.

    In the kernel's order: sides (6 entries per point), weights (8), pairs (12: the separable
    gradient's pair weights, or the exact gradient's eight tap values), mx, my,
    mz, grad_x, grad_y, grad_z (1 each), ``BLOCK`` points each; terms (3 per channel, one
    point's); coords (3 per point, ``BLOCK`` points); offsets (8), corner, dx_corner,
    inside, lowest, taps (1 each), ``BLOCK`` points; then the run of planes zeroed (2
    entries, see :func:`zero_reached`). See :func:`.jit.part_kernel`.
    """
    reals = tuple(part_rows(parts, entries * BLOCK) for entries in (6, 8, 12, 1, 1, 1, 1, 1, 1))
    integers = tuple(part_rows(parts, entries * BLOCK, np.int64) for entries in (8, 1, 1, 1, 1, 1))
    return reals + (part_rows(parts, 3 * channels), part_rows(parts, 3 * BLOCK)), integers + (
        part_rows(parts, 2, np.int64),)


@helper
def zero_planes(dx, dx_strides, first, last, channels, sizes):
    """Zero the (n, z) planes first .. last - 1 (plane = n * D + z) of dx (N, C, D, H, W), every channel.

    ``dx`` is dense, NCDHW or channels-last, as the engine allocates it: a batch's planes
    in the range are then one run of memory per channel (NCDHW) or one run for all
    channels (channels-last), each zeroed by one memset.
    """
    depth, height, width = sizes
    n_stride, c_stride, z_stride, _, x_stride = dx_strides
    channels_last = c_stride == 1 and x_stride == channels
    runs = 1 if channels_last else channels
    length = height * width * (channels if channels_last else 1)
    for n in range(first // depth, (last + depth - 1) // depth):
        z_first, z_last = max(first - n * depth, 0), min(last - n * depth, depth)
        for run in range(runs if z_first < z_last else 0):
            zero_elements(dx, n * n_stride + z_first * z_stride + run * c_stride, (z_last - z_first) * length)


@helper
def zero_reached(dx, dx_strides, channels, sizes, zeroed, whole, count, lowest, taps, reach, base, first, last):
    """Zero the dx planes a block's taps reach that the run ``zeroed`` lacks, then grow the run over them.

    The backward zeroes its dx planes as its points first reach them, so that a plane's
    scatter finds it in the cache instead of reading back what a separate zeroing pass
    wrote out to memory. ``zeroed`` holds the run [zeroed[0], zeroed[1]) of planes
    (n * D + z) zeroed so far; it stays one interval: what lies between it and a new
    plane is zeroed too (once, as it would be anyway).

    The planes are those of base + [first, last) that a point's taps reach (base +
    lowest[i] .. base + lowest[i] + reach - 1), counting only points with a tap flagged
    in ``taps``; with ``whole``, all of base + [first, last).
    """
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
        zero_planes(dx, dx_strides, start, end, channels, sizes)
    zeroed[0], zeroed[1] = min(below, first), max(above, last)


@functools.cache
def backward_kernel(interpolation: int, padding: int, align_corners: bool, exact: bool = True, voxels: bool = False,
                    exact_remainder: bool = False, channels_last: bool = False):
    """The backward kernel of one mode triple (and coordinate source).

    ``exact`` keeps PyTorch's association in the grid gradient (float64 bitwise equal to
    PyTorch); otherwise (for float32 and half data, computed in float64 and rounded once)
    it sums the separable form, a third of the arithmetic.

    ``kernel(grad, grad_strides, x, x_strides, grid, grid_strides, dx, dx_strides, dgrid,
    dgrid_strides, row_first, row_last, parts, batch, channels, sizes, out_sizes, want_dx,
    want_dgrid, carry, carry_mode, unresolved, part)`` computes part ``part`` of the pass (returned
    as one parallel kernel, :class:`.jit.Parallel`, called without ``part``, which runs
    every part at once): it fills ``dx`` (N, C, D, H, W) if ``want_dx``
    and ``dgrid`` (N, Do, Ho, Wo, 3), strides ``dgrid_strides``, if ``want_dgrid``. With
    ``voxels`` (the fused warp) ``grid`` and ``dgrid`` are a displacement and its gradient
    (N, 3, Do, Ho, Wo) as (dz, dy, dx) in voxels, both with strides given as (n, d, h, w,
    -component) (see :func:`.forward.forward_kernel`). ``parts`` (P, 4) gives each parallel part its dx planes
    [first, end) (plane = n * D + z) and rows [first, end) (row = n * Do * Ho + d * Ho + h);
    ``row_first``/``row_last`` (one per row, from :func:`.plan.depth_ranges`) let a part
    skip rows that miss its planes (a part that owns every plane needs no row bounds:
    rows left at (0, 0) are walked). A part writes the grid gradient of every point in its
    rows, so a pass that computes both outputs runs as one part. Nearest kernels compute
    dx only: their grid gradient is zero. ``carry`` (float64, 3 * rows * Wo for the rows from
    ``parts[0, 2]`` on: the x, y and z sums of each point, as rows of points) lets a grid
    gradient run as several passes over groups of channels, each continuing the sums of the
    one before in PyTorch's order:
    ``carry_mode`` 0 sums from zero into ``dgrid`` (one pass), 1 from zero into ``carry``, 2
    from ``carry`` into ``carry``, 3 from ``carry`` into ``dgrid``. Every element of an
    output asked for is written, unless a part sets ``unresolved[part]`` to 1: then the
    caller runs the kernel built with
    ``exact_remainder`` instead (see :func:`.forward.forward_kernel`). ``channels_last`` as
    for :func:`.forward.forward_kernel`: only such kernels compile the channels-inner scatters.
    """
    nearest = interpolation == NEAREST
    reach = 1 if nearest else 2

    @part_kernel
    def kernel(grad_operand, grad_strides, x_operand, x_strides, grid_operand, grid_strides, dx_operand, dx_strides,
               dgrid_operand, dgrid_strides, row_first_operand, row_last_operand, parts, batch, channels, sizes,
               out_sizes, want_dx, want_dgrid, carry_operand, carry_mode, unresolved_operand, reals, integers, part):
        grad = borrowed(grad_operand)
        x = borrowed(x_operand)
        grid = borrowed(grid_operand)
        dx = borrowed(dx_operand)
        dgrid = borrowed(dgrid_operand)
        row_first = borrowed(row_first_operand)
        row_last = borrowed(row_last_operand)
        unresolved = borrowed(unresolved_operand)
        carry = borrowed(carry_operand)
        points = carry.size // 3  # each component's row of sums in carry
        # This part's rows of the scratch arrays (see _scratch)
        sides, weights, pairs, mx, my, mz, grad_x, grad_y, grad_z, terms, coords = reals
        sides, weights, pairs = borrowed(sides)[part], borrowed(weights)[part], borrowed(pairs)[part]
        mx, my, mz = borrowed(mx)[part], borrowed(my)[part], borrowed(mz)[part]
        grad_x, grad_y, grad_z = borrowed(grad_x)[part], borrowed(grad_y)[part], borrowed(grad_z)[part]
        terms, coords = borrowed(terms)[part], borrowed(coords)[part]
        offsets, corner, dx_corner, inside, lowest, taps, zeroed = integers
        offsets, corner, dx_corner = borrowed(offsets)[part], borrowed(corner)[part], borrowed(dx_corner)[part]
        inside, lowest, taps = borrowed(inside)[part], borrowed(lowest)[part], borrowed(taps)[part]
        zeroed = borrowed(zeroed)[part]
        depth = sizes[0]
        out_depth, out_height, out_width = out_sizes
        x_spatial = (x_strides[2], x_strides[3], x_strides[4])
        dx_spatial = (dx_strides[2], dx_strides[3], dx_strides[4])
        # Contiguous channels: each tap's dx update runs over the channels innermost (dx's
        # contiguous too), and the separable grid gradient reads each tap's channels as a
        # vector (x's contiguous too).
        contiguous_grad = channels >= VECTOR_CHANNELS and grad_strides[1] == 1
        channel_inner = contiguous_grad and dx_strides[1] == 1
        x_channel_inner = contiguous_grad and x_strides[1] == 1
        # With zeros padding the multipliers are these constant slopes (coords.source_index);
        # otherwise phase A leaves them per point in mx, my, mz.
        zeros = padding == ZEROS
        unit = 1 if align_corners else 0
        slope_x, slope_y, slope_z = (sizes[2] - unit) * 0.5, (sizes[1] - unit) * 0.5, (sizes[0] - unit) * 0.5
        if voxels:
            slope_x, slope_y, slope_z = 1.0, 1.0, 1.0
        # Where a row's x components start in grid and dgrid (a displacement's dx sits above dz).
        grid_shift = -2 * grid_strides[4] if voxels else 0
        dgrid_shift = -2 * dgrid_strides[4] if voxels else 0
        dgrid_step = dgrid_strides[3]
        dgrid_component = dgrid_strides[4]
        plane_lo = parts[part, 0]
        plane_hi = parts[part, 1]
        row_lo = parts[part, 2]
        row_hi = parts[part, 3]
        unresolved[part] = 0
        zeroed[0], zeroed[1] = plane_lo, plane_lo  # the run of this part's dx planes zeroed so far
        for row in range(row_lo, row_hi):
            if unresolved[part]:
                break
            n = row // (out_depth * out_height)
            d = (row // out_height) % out_depth
            h = row % out_height
            z_lo = max(plane_lo - n * depth, 0)
            z_hi = min(plane_hi - n * depth, depth)
            if z_lo >= z_hi:
                continue
            do_dx = want_dx and row_last[row] + reach > z_lo and row_first[row] < z_hi
            if not (do_dx or want_dgrid):
                continue
            first_point = n * grid_strides[0] + d * grid_strides[1] + h * grid_strides[2] + grid_shift
            first_dgrid = n * dgrid_strides[0] + d * dgrid_strides[1] + h * dgrid_strides[2] + dgrid_shift
            first_grad = n * grad_strides[0] + d * grad_strides[2] + h * grad_strides[3]
            x_batch, dx_batch = n * x_strides[0], n * dx_strides[0]
            for start in range(0, out_width, BLOCK):
                count = min(BLOCK, out_width - start)
                first = first_point + start * grid_strides[3]
                grad_at = first_grad + start * grad_strides[4]
                origin = (float(start), float(h), float(d))
                if nearest:
                    if nearest_cells(grid, first, grid_strides[3], grid_strides[4], count, sizes, padding,
                                     align_corners, False, exact_remainder, voxels, origin, dx_spatial, coords,
                                     dx_corner, inside, lowest):
                        unresolved[part] = 1
                        break
                elif trilinear_cells(grid, first, grid_strides[3], grid_strides[4], count, sizes, padding,
                                     align_corners, False, exact_remainder, voxels, origin, x_spatial, dx_spatial,
                                     coords, sides, corner, dx_corner, inside, lowest, True, mx, my, mz):
                    unresolved[part] = 1
                    break
                if do_dx:
                    slab_taps(count, inside, lowest, z_lo, z_hi, taps)
                    zero_reached(dx, dx_strides, channels, sizes, zeroed, False, count, lowest, taps, reach,
                                 n * depth, z_lo, z_hi)
                if nearest:  # nearest kernels compute no grid gradient
                    if do_dx:
                        _scatter_nearest(count, dx, dx_batch, dx_strides, grad, grad_at, grad_strides, channels,
                                         channel_inner, dx_corner, taps)
                    continue
                if want_dgrid:
                    masked_offsets(count, corner, inside, x_spatial, offsets)
                    at = (row - parts[0, 2]) * out_width + start  # the block's first point in carry
                    if carry_mode >= 2:  # continue the sums of the channels before
                        for i in range(count):
                            grad_x[i] = carry[at + i]
                        for i in range(count):
                            grad_y[i] = carry[points + at + i]
                        for i in range(count):
                            grad_z[i] = carry[2 * points + at + i]
                    else:
                        grad_x[:count] = 0.0
                        grad_y[:count] = 0.0
                        grad_z[:count] = 0.0
                    if exact:
                        _grid_gradient(count, grad, grad_at, grad_strides, x, x_batch, x_strides, channels,
                                       sides, inside, offsets, pairs, grad_x, grad_y, grad_z)
                    elif channels_last and x_channel_inner:  # a constant first: see forward_kernel
                        # (Each separable path computes its pair weights: hoisted above both, the
                        # backward took 1.05 (cl64) to 1.08 (feat48) of its time at two threads.)
                        _pair_weights(count, sides, pairs)
                        _grid_gradient_channels_inner(count, grad, grad_at, grad_strides[4], x, x_batch, channels,
                                                      inside, offsets, pairs, terms, grad_x, grad_y, grad_z)
                    else:
                        _grid_gradient_separable(count, grad, grad_at, grad_strides, x, x_batch, x_strides,
                                                 channels, sides, inside, offsets, pairs, grad_x, grad_y, grad_z)
                    p = first_dgrid + start * dgrid_step
                    if carry_mode == 1 or carry_mode == 2:  # channels after these follow
                        for i in range(count):
                            carry[at + i] = grad_x[i]
                        for i in range(count):
                            carry[points + at + i] = grad_y[i]
                        for i in range(count):
                            carry[2 * points + at + i] = grad_z[i]
                    elif voxels and dgrid_step == 1:
                        # A displacement's components are three contiguous rows: stored through
                        # views, each in a loop of its own, the stores vectorise (docs/cpu.md).
                        row_x = dgrid[p:p + count]
                        row_y = dgrid[p + dgrid_component:p + dgrid_component + count]
                        row_z = dgrid[p + 2 * dgrid_component:p + 2 * dgrid_component + count]
                        for i in range(count):
                            row_x[i] = (slope_x if zeros else mx[i]) * grad_x[i]
                        for i in range(count):
                            row_y[i] = (slope_y if zeros else my[i]) * grad_y[i]
                        for i in range(count):
                            row_z[i] = (slope_z if zeros else mz[i]) * grad_z[i]
                    else:
                        for i in range(count):
                            at = p + i * dgrid_step
                            dgrid[at] = (slope_x if zeros else mx[i]) * grad_x[i]
                            dgrid[at + dgrid_component] = (slope_y if zeros else my[i]) * grad_y[i]
                            dgrid[at + 2 * dgrid_component] = (slope_z if zeros else mz[i]) * grad_z[i]
                if do_dx:
                    for i in range(count):
                        for tap in range(8):
                            weights[slot(tap, i)] = tap_weight(sides, tap, i)
                    if channels_last:
                        if channel_inner:
                            _scatter_channels_inner(count, dx, dx_batch, dx_spatial, grad, grad_at, grad_strides[4],
                                                    channels, weights, dx_corner, taps)
                            continue
                    _scatter(count, dx, dx_batch, dx_strides, dx_spatial, grad, grad_at, grad_strides, channels,
                             weights, dx_corner, taps)
        if want_dx:  # the planes no point reached
            zero_reached(dx, dx_strides, channels, sizes, zeroed, True, 0, lowest, taps, 1, 0, plane_lo, plane_hi)

    return Parallel(kernel, _scratch)


@helper
def _grid_gradient(count, grad, grad_at, grad_strides, x, x_batch, x_strides, channels, sides, inside, offsets,
                   values, grad_x, grad_y, grad_z):
    """Per point i: grad_x/y/z[i] = sum over channels (outer) and taps (inner) of ±((x_tap * w_a) * w_b) * grad.

    PyTorch's terms in PyTorch's order, vectorised across the points; an outside tap's
    term is not added (its gather reads a valid element that the tap's bit discards). The
    sums continue from what grad_x/y/z hold (zero, or the sums of channels before).
    """
    for c in range(channels):
        source = x_batch + c * x_strides[1]
        at = grad_at + c * grad_strides[1]
        # The taps' values first, in a loop of their own: loaded lane by lane (no hardware
        # gathers) inside the loop below, they left LLVM's cost model keeping it scalar.
        for i in range(count):
            for tap in range(8):
                values[slot(tap, i)] = float(x[unsigned(source + offsets[slot(tap, i)])])
        for i in range(count):
            g = float(grad[at + i * grad_strides[4]])
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
def _grid_gradient_separable(count, grad, grad_at, grad_strides, x, x_batch, x_strides, channels, sides, inside,
                             offsets, pairs, grad_x, grad_y, grad_z):
    """The grid gradient as differences along each axis weighted by the other two axes' weights.

    d/d ix = sum over the four (y, z) edges of (wy * wz) * (x[high x] - x[low x]), and so
    on per axis; outside taps read as 0. The pair weights depend on the point only, so
    each channel costs 8 gathers and about 35 operations instead of about 100. The sums
    continue from what grad_x/y/z hold, as in :func:`_grid_gradient`.
    """
    _pair_weights(count, sides, pairs)
    for c in range(channels):
        source = x_batch + c * x_strides[1]
        at = grad_at + c * grad_strides[1]
        for i in range(count):
            g = float(grad[at + i * grad_strides[4]])
            bits = inside[i]
            along_x = along_y = along_z = 0.0
            for edge in range(4):
                first, second = edge & 1, edge >> 1
                # the edge's two taps along x (y, z), fixed by the edge's sides on the other axes
                tx = (first << 1) | (second << 2)
                ty = first | (second << 2)
                tz = first | (second << 1)
                along_x += pairs[slot(edge, i)] * (_tap_value(x, source, offsets, bits, tx | 1, i)
                                                   - _tap_value(x, source, offsets, bits, tx, i))
                along_y += pairs[slot(4 + edge, i)] * (_tap_value(x, source, offsets, bits, ty | 2, i)
                                                       - _tap_value(x, source, offsets, bits, ty, i))
                along_z += pairs[slot(8 + edge, i)] * (_tap_value(x, source, offsets, bits, tz | 4, i)
                                                       - _tap_value(x, source, offsets, bits, tz, i))
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
def _grid_gradient_channels_inner(count, grad, grad_at, grad_step, x, x_batch, channels, inside, offsets, pairs,
                                  terms, grad_x, grad_y, grad_z):
    """Channels-last :func:`_grid_gradient_separable`, bit for bit: each tap's channels read as one vector.

    Per point, each channel's three terms ``along * g`` are computed across the channels
    (contiguous loads instead of a lane-by-lane gather per channel and tap), then summed
    onto grad_x/y/z[i] channel by channel, the separable pass's order. ``terms`` holds
    one point's 3 * ``channels`` terms.
    """
    term_x, term_y, term_z = terms[:channels], terms[channels:2 * channels], terms[2 * channels:3 * channels]
    for i in range(count):
        bits = inside[i]
        # The eight taps' channel vectors (an outside tap's offset is 0: a valid row, read as 0 below).
        v0 = x[x_batch + offsets[slot(0, i)]:x_batch + offsets[slot(0, i)] + channels]
        v1 = x[x_batch + offsets[slot(1, i)]:x_batch + offsets[slot(1, i)] + channels]
        v2 = x[x_batch + offsets[slot(2, i)]:x_batch + offsets[slot(2, i)] + channels]
        v3 = x[x_batch + offsets[slot(3, i)]:x_batch + offsets[slot(3, i)] + channels]
        v4 = x[x_batch + offsets[slot(4, i)]:x_batch + offsets[slot(4, i)] + channels]
        v5 = x[x_batch + offsets[slot(5, i)]:x_batch + offsets[slot(5, i)] + channels]
        v6 = x[x_batch + offsets[slot(6, i)]:x_batch + offsets[slot(6, i)] + channels]
        v7 = x[x_batch + offsets[slot(7, i)]:x_batch + offsets[slot(7, i)] + channels]
        g_row = grad[grad_at + i * grad_step:grad_at + i * grad_step + channels]
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
def _scatter_nearest(count, dx, dx_batch, dx_strides, grad, grad_at, grad_strides, channels, channel_inner, dx_corner,
                     taps):
    """Phase B of nearest: dx[voxel] += grad for every point whose voxel lies in the slab, points in order.

    The channels-inner path is chosen here at run time in every nearest kernel: with it
    left out of the NCDHW kernels, near64's one-thread backward took 1.3 times as long
    (docs/cpu.md, "Compilation").
    """
    if channel_inner:
        _scatter_nearest_channels_inner(count, dx, dx_batch, grad, grad_at, grad_strides[4], channels, dx_corner, taps)
        return
    for c in range(channels):
        target = dx_batch + c * dx_strides[1]
        source = grad_at + c * grad_strides[1]
        for i in range(count):
            if taps[i]:
                dx[unsigned(target + dx_corner[i])] += grad[unsigned(source + i * grad_strides[4])]


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
            voxel = dx[target:target + channels]
            values = grad[source:source + channels]
            for c in range(channels):
                voxel[c] += values[c]


@helper
def _scatter(count, dx, dx_batch, dx_strides, dx_spatial, grad, grad_at, grad_strides, channels, weights, dx_corner,
             in_slab):
    """Phase B: dx[tap] += weight * grad for every tap whose bit is set in ``in_slab``, points in order."""
    for c in range(channels):
        plane = dx_batch + c * dx_strides[1]
        at = grad_at + c * grad_strides[1]
        for i in range(count):
            bits = in_slab[i]
            if bits == 0:
                continue
            g = float(grad[at + i * grad_strides[4]])
            target = plane + dx_corner[i]
            if bits == ALL_TAPS:
                for tap in range(8):
                    dx[unsigned(target + tap_delta(tap, dx_spatial))] += weights[slot(tap, i)] * g
            else:
                for tap in range(8):
                    if (bits >> tap) & 1:
                        dx[unsigned(target + tap_delta(tap, dx_spatial))] += weights[slot(tap, i)] * g


@outlined_helper
def _scatter_channels_inner(count, dx, dx_batch, dx_spatial, grad, grad_at, grad_step, channels, weights, dx_corner,
                            in_slab):
    """Channels-last phase B: each tap adds weight * grad to the tap's contiguous channel vector."""
    for i in range(count):
        bits = in_slab[i]
        if bits == 0:
            continue
        source = grad_at + i * grad_step
        values = grad[source:source + channels]  # views: see _scatter_nearest_channels_inner
        for tap in range(8):
            if (bits >> tap) & 1:
                weight = weights[slot(tap, i)]
                target = dx_batch + dx_corner[i] + tap_delta(tap, dx_spatial)
                voxel = dx[target:target + channels]
                for c in range(channels):
                    voxel[c] += weight * values[c]
