"""Backward kernels of the GPU engine.

``grid_sampler3d_bwd_kernel`` walks blocks of points once: dgrid (a per-point sum over
channels and taps, no atomics, the same in both modes) and, in the fast mode, dx by
atomic adds of ``grad * weight`` into each tap.

The deterministic mode builds dx as a gather instead (docs/gpu.md): ``bucket_keys_kernel``
gives every point the key of its lowest corner (one past the end when no tap can land
inside), a stable sort groups points by key in point order, ``sorted_records_kernel``
writes each point's record (its source indices and where its grad lies) once in that
order, and ``dx_gather_kernel`` gives each voxel its sum over the (up to eight) buckets
whose cells touch it, in a fixed order: taps in PyTorch's order, points ascending within
a bucket. Nothing depends on
timing, so the result is bitwise the same on every run.

For a displacement (``RULE.field``, the fused warp) every kernel reads a displacement in place of the
grid, as the forward does, and the grid gradient is written through ``dgrid``'s strides,
given in the same point order: d(displacement) lands in the displacement's own layout. An
affine field's positions come from its voxel matrix (``coords.field_coordinates``); the
walk reduces their gradient to partial row moments (``coords.store_row_moments``), from
which the engine sums theta's gradient in float64, in a fixed order. A B-spline's
displacement is summed from its row coefficients; the walk reduces the gradient with
respect to the positions to partial row sums (``coords.store_row_sums``), from which the
engine sums the control points' gradient in float64, in a fixed order.

Each operand is a :class:`.records.Operand`, the sizes a :class:`.records.Sizes`, and the
constexprs records too: ``RULE`` (:class:`.records.Rule`), ``OUTPUTS``
(:class:`~gridsampler3d.sampling.Outputs`) and ``TILE`` (:class:`.records.Blocks`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .coords import (
    NEAREST,
    base_corner,
    cell_taps,
    linear_weight,
    point_indices,
    point_position,
    store_position_gradient,
    tap_weight,
    tile_points,
    volume_offset,
    wide,
)


@triton.jit
def grid_sampler3d_bwd_kernel(
    grad,
    x,
    grid,
    dx,
    dgrid,
    partials,
    sizes,
    RULE: tl.constexpr,
    ACC: tl.constexpr,
    OUTPUTS: tl.constexpr,
    TILE: tl.constexpr,
):
    """dx += grad pushed through the taps (atomics, ``OUTPUTS.dx``); dgrid (N, Do, Ho, Wo, 3) through its strides,
    or a B-spline's partial row sums (``OUTPUTS.dfield``); an affine field's row moments (``OUTPUTS.dtheta``); both
    row partials in :class:`.records.RowPartials`.

    Launch grid: ``coords.tile_points``, as the forward. ``dx`` is zeroed by the
    caller and has the accumulation dtype ``ACC``; every program loops over all channels
    (``TILE.block_c`` at a time: 1 for NCDHW, lanes along points) so that its dgrid sums are
    complete. Taps, weights and offsets are computed once per point, before that loop.
    """
    channels = sizes.channels
    depth, height, width = wide(sizes.depth), wide(sizes.height), wide(sizes.width)
    out_depth, out_height, out_width = wide(sizes.out_depth), wide(sizes.out_height), wide(sizes.out_width)
    n, d, h, w, point_mask = tile_points(out_depth, out_height, out_width, TILE)
    ix, iy, iz, mx, my, mz = point_indices(grid, n, d, h, w, point_mask, depth, height, width, RULE, False)
    x_offsets, insides, _ = cell_taps(ix, iy, iz, depth, height, width, x.strides, RULE.interpolation, ACC)
    dx_offsets, _, _ = cell_taps(ix, iy, iz, depth, height, width, dx.strides, RULE.interpolation, ACC)
    weights_x, weights_y, weights_z = _axis_weights(ix, iy, iz, RULE.interpolation)
    grad_points = grad.data + n * grad.strides.n + d * grad.strides.d + h * grad.strides.h + w * grad.strides.w
    x_item = x.data + n * x.strides.n
    dx_item = dx.data + n * dx.strides.n
    # dgrid sums many terms of both signs, where float32 loses most: it is summed in float64.
    grad_x = tl.zeros([TILE.block_d * TILE.block_h * TILE.block_w], tl.float64)
    grad_y = tl.zeros([TILE.block_d * TILE.block_h * TILE.block_w], tl.float64)
    grad_z = tl.zeros([TILE.block_d * TILE.block_h * TILE.block_w], tl.float64)
    for first_channel in range(0, channels, TILE.block_c):
        channel = first_channel + tl.arange(0, TILE.block_c).to(tl.int64)
        tile_mask = point_mask[:, None] & (channel < channels)[None, :]
        grad_values = tl.load(grad_points[:, None] + (channel * grad.strides.c)[None, :], mask=tile_mask, other=0.0).to(
            ACC
        )
        grad_wide = grad_values.to(tl.float64)
        # dgrid sums channels outer, taps inner, as PyTorch: each lane (point, channel) adds its
        # channel's taps in order, the block's first channel onto the point's running sum, and
        # the lanes are added up after the taps. One channel per block (NCDHW, float64) is then
        # PyTorch's order bit for bit; with a channel vector, a channel whose terms cancel still
        # adds exactly 0 (adding each tap's channel vector first left a residue).
        first_lane = (tl.arange(0, TILE.block_c) == 0)[None, :]
        lanes_x = tl.where(first_lane, grad_x[:, None], 0.0)
        lanes_y = tl.where(first_lane, grad_y[:, None], 0.0)
        lanes_z = tl.where(first_lane, grad_z[:, None], 0.0)
        for tap in tl.static_range(1 if RULE.interpolation == NEAREST else 8):
            step_x, step_y, step_z = tap & 1, (tap >> 1) & 1, tap >> 2
            tap_mask = tile_mask & insides[tap][:, None]
            if OUTPUTS.dx:
                if RULE.interpolation == NEAREST:
                    contribution = grad_values
                else:
                    # The float64 product rounded once (float32 weights would round twice).
                    wx = weights_x[tap & 1][:, None]
                    wy = weights_y[(tap >> 1) & 1][:, None]
                    wz = weights_z[tap >> 2][:, None]
                    contribution = (grad_wide * ((wx * wy) * wz)).to(ACC)
                tl.atomic_add(
                    dx_item + dx_offsets[tap][:, None] + (channel * dx.strides.c)[None, :],
                    contribution,
                    mask=tap_mask,
                    sem="relaxed",
                )
            if OUTPUTS.dfield or OUTPUTS.dtheta:
                value = tl.load(
                    x_item + x_offsets[tap][:, None] + (channel * x.strides.c)[None, :], mask=tap_mask, other=0.0
                ).to(tl.float64)
                wx = weights_x[tap & 1][:, None]
                wy = weights_y[(tap >> 1) & 1][:, None]
                wz = weights_z[tap >> 2][:, None]
                # d weight / d index is +-1 along the stepped axis times the other two weights.
                # Each term is value * w * w * grad, PyTorch's product order. An outside tap
                # contributes nothing, not even 0 * an infinite grad.
                term_x = tl.where(tap_mask, value * wy * wz * grad_wide, 0.0)
                term_y = tl.where(tap_mask, value * wx * wz * grad_wide, 0.0)
                term_z = tl.where(tap_mask, value * wx * wy * grad_wide, 0.0)
                lanes_x += term_x if step_x else -term_x
                lanes_y += term_y if step_y else -term_y
                lanes_z += term_z if step_z else -term_z
        grad_x = tl.sum(lanes_x, axis=1)
        grad_y = tl.sum(lanes_y, axis=1)
        grad_z = tl.sum(lanes_z, axis=1)
    store_position_gradient(
        dgrid,
        partials,
        grid.columns,
        (n, d, h, w, point_mask),
        (grad_x * mx, grad_y * my, grad_z * mz),
        (out_depth, out_height),
        RULE,
        OUTPUTS,
    )


@triton.jit
def _axis_weights(ix, iy, iz, INTERPOLATION: tl.constexpr):
    """Per axis, the weights (float64) of the low and high taps of points at indices (ix, iy, iz), for dgrid:
    (weights_x, weights_y, weights_z), each a pair."""
    x0, y0, z0 = base_corner(ix, INTERPOLATION), base_corner(iy, INTERPOLATION), base_corner(iz, INTERPOLATION)
    weights_x = (tap_weight(ix, x0, 0), tap_weight(ix, x0, 1))
    weights_y = (tap_weight(iy, y0, 0), tap_weight(iy, y0, 1))
    weights_z = (tap_weight(iz, z0, 0), tap_weight(iz, z0, 1))
    return weights_x, weights_y, weights_z


@triton.jit
def bucket_keys_kernel(grid, keys, points, sizes, RULE: tl.constexpr, TILE: tl.constexpr):
    """keys[p] (int64): the lowest corner of point p's cell in the padded (N, D+1, H+1, W+1) index space.

    Corners run from -1 (stored as 0) so that every cell with a tap inside has a key; a
    point with none gets N*(D+1)*(H+1)*(W+1), which sorts last and belongs to no voxel.
    ``TILE.block_w`` points a program.
    """
    depth, height, width = wide(sizes.depth), wide(sizes.height), wide(sizes.width)
    out_depth, out_height, out_width = wide(sizes.out_depth), wide(sizes.out_height), wide(sizes.out_width)
    point = tl.program_id(0).to(tl.int64) * TILE.block_w + tl.arange(0, TILE.block_w)
    point_mask = point < points
    batch, d, h, w = point_position(point, out_depth, out_height, out_width)
    ix, iy, iz, _, _, _ = point_indices(grid, batch, d, h, w, point_mask, depth, height, width, RULE, False)
    x0, y0, z0 = (
        base_corner(ix, RULE.interpolation),
        base_corner(iy, RULE.interpolation),
        base_corner(iz, RULE.interpolation),
    )
    lowest = 0 if RULE.interpolation == NEAREST else -1
    touches = (x0 >= lowest) & (x0 < width) & (y0 >= lowest) & (y0 < height) & (z0 >= lowest) & (z0 < depth)
    key = ((batch * (depth + 1) + z0 + 1) * (height + 1) + y0 + 1) * (width + 1) + x0 + 1
    beyond = (points // (out_depth * out_height * out_width)) * (depth + 1) * (height + 1) * (width + 1)
    tl.store(keys + point, tl.where(touches, key, beyond), mask=point_mask)


@triton.jit
def sorted_records_kernel(grid, order, sorted_points, sizes, grad_strides, RULE: tl.constexpr, TILE: tl.constexpr):
    """Each point's record, written once at its place in the sorted order (``order``), into ``sorted_points``
    (:class:`.records.SortedRecords`).

    grad_offsets[j] (int64) is where sorted point j's grad starts (its channel 0; a grad
    with :class:`.records.VolumeStrides` ``grad_strides``); for trilinear, indices[j],
    indices[entries + j] and indices[2 * entries + j] (float64) are its source indices ix,
    iy, iz, from which the gather and partial-sum kernels take every tap weight. They then
    read contiguous records instead of reading the grid at random and recomputing a point's
    coordinates once per tap. ``TILE.block_w`` entries a program.
    """
    depth, height, width = wide(sizes.depth), wide(sizes.height), wide(sizes.width)
    out_depth, out_height, out_width = wide(sizes.out_depth), wide(sizes.out_height), wide(sizes.out_width)
    entries = wide(sorted_points.entries)
    entry = tl.program_id(0).to(tl.int64) * TILE.block_w + tl.arange(0, TILE.block_w)
    entry_mask = entry < entries
    point = tl.load(order + entry, mask=entry_mask, other=0).to(tl.int64)
    n, d, h, w = point_position(point, out_depth, out_height, out_width)
    grad_offset = volume_offset(n, d, h, w, grad_strides)
    tl.store(sorted_points.grad_offsets + entry, grad_offset, mask=entry_mask)
    if RULE.interpolation != NEAREST:
        ix, iy, iz, _, _, _ = point_indices(grid, n, d, h, w, entry_mask, depth, height, width, RULE, False)
        tl.store(sorted_points.indices + entry, ix, mask=entry_mask)
        tl.store(sorted_points.indices + entries + entry, iy, mask=entry_mask)
        tl.store(sorted_points.indices + 2 * entries + entry, iz, mask=entry_mask)


@triton.jit
def dx_gather_kernel(
    grad,
    sorted_points,
    dx,
    starts,
    chunk_starts,
    partials,
    voxels,
    sizes,
    INTERPOLATION: tl.constexpr,
    ACC: tl.constexpr,
    SPLIT: tl.constexpr,
    TILE: tl.constexpr,
):
    """dx (N, C, D, H, W), every element written: per voxel, the sum of grad * weight over the points whose taps hit it.

    ``starts[k]`` is where key k's bucket begins in the sorted order (``starts[k + 1]``
    where it ends), whose records :func:`sorted_records_kernel` wrote (``sorted_points``).
    With ``SPLIT``, a bucket with chunks (``chunk_starts[k]`` .. ``chunk_starts[k + 1]``)
    is summed from their ``partials`` (:func:`bucket_partials_kernel`), in chunk order,
    instead of point by point. ``TILE.block_w`` voxels x ``TILE.block_c`` channels a
    program; ``voxels`` is N * D * H * W.
    """
    channels = sizes.channels
    depth, height, width = wide(sizes.depth), wide(sizes.height), wide(sizes.width)
    entries = wide(sorted_points.entries)
    voxel = tl.program_id(0).to(tl.int64) * TILE.block_w + tl.arange(0, TILE.block_w)
    channel = tl.program_id(1).to(tl.int64) * TILE.block_c + tl.arange(0, TILE.block_c)
    voxel_mask = voxel < voxels
    channel_mask = (channel < channels)[None, :]
    vx = voxel % width
    vy = (voxel // width) % height
    vz = (voxel // (width * height)) % depth
    batch = voxel // (width * height * depth)
    total = tl.zeros([TILE.block_w, TILE.block_c], ACC)
    for tap in tl.static_range(1 if INTERPOLATION == NEAREST else 8):
        step_x, step_y, step_z = tap & 1, (tap >> 1) & 1, tap >> 2
        # The bucket of cells whose tap (step_x, step_y, step_z) is this voxel.
        key = ((batch * (depth + 1) + vz - step_z + 1) * (height + 1) + vy - step_y + 1) * (width + 1) + vx - step_x + 1
        first = tl.load(starts + key, mask=voxel_mask, other=0).to(tl.int64)
        count = tl.load(starts + key + 1, mask=voxel_mask, other=0) - first
        if SPLIT:
            first_chunk = tl.load(chunk_starts + key, mask=voxel_mask, other=0).to(tl.int64)
            chunks = tl.load(chunk_starts + key + 1, mask=voxel_mask, other=0) - first_chunk
            count = tl.where(chunks > 0, 0, count)
            for chunk in range(0, tl.max(chunks, axis=0)):
                live = (voxel_mask & (chunk < chunks))[:, None] & channel_mask
                partial = ((first_chunk + chunk) * (1 if INTERPOLATION == NEAREST else 8) + tap)[
                    :, None
                ] * channels + channel[None, :]
                total += tl.load(partials + partial, mask=live, other=0.0)
        for k in range(0, tl.max(count, axis=0)):
            live = voxel_mask & (k < count)
            total += _record_term(
                grad,
                sorted_points,
                entries,
                first + k,
                live,
                channel,
                channel_mask,
                (step_x, step_y, step_z),
                INTERPOLATION,
                ACC,
            )
    out_offset = batch * dx.strides.n + vz * dx.strides.d + vy * dx.strides.h + vx * dx.strides.w
    tl.store(
        dx.data + out_offset[:, None] + (channel * dx.strides.c)[None, :],
        total,
        mask=voxel_mask[:, None] & channel_mask,
    )


@triton.jit
def _record_term(
    grad,
    sorted_points,
    entries,
    entry,
    live,
    channel,
    channel_mask,
    steps,
    INTERPOLATION: tl.constexpr,
    ACC: tl.constexpr,
):
    """grad * weight (block_w, block_c) of sorted entry ``entry`` (of ``entries``, int64) for its tap ``steps`` =
    (step_x, step_y, step_z), in ``ACC``: the float64 product rounded once; 0 where not ``live``."""
    step_x, step_y, step_z = steps
    grad_offset = tl.load(sorted_points.grad_offsets + entry, mask=live, other=0)
    values = tl.load(
        grad.data + grad_offset[:, None] + (channel * grad.strides.c)[None, :],
        mask=live[:, None] & channel_mask,
        other=0.0,
    )
    if INTERPOLATION == NEAREST:
        return values.to(ACC)
    ix = tl.load(sorted_points.indices + entry, mask=live, other=0.0)
    iy = tl.load(sorted_points.indices + entries + entry, mask=live, other=0.0)
    iz = tl.load(sorted_points.indices + 2 * entries + entry, mask=live, other=0.0)
    weight = (
        linear_weight(ix, base_corner(ix, INTERPOLATION), step_x)
        * linear_weight(iy, base_corner(iy, INTERPOLATION), step_y)
        * linear_weight(iz, base_corner(iz, INTERPOLATION), step_z)
    )
    return (values.to(tl.float64) * weight[:, None]).to(ACC)


@triton.jit
def bucket_partials_kernel(
    grad,
    sorted_points,
    partials,
    chunk_first,
    chunk_count,
    chunks,
    channels,
    INTERPOLATION: tl.constexpr,
    ACC: tl.constexpr,
    CHUNK: tl.constexpr,
    TILE: tl.constexpr,
):
    """partials (chunks, taps, C) in ``ACC``: per chunk of at most CHUNK consecutive entries
    of a long bucket (from ``chunk_first``, ``chunk_count`` of them, in the sorted order of
    ``sorted_points``), per tap, the sum of grad * weight in point order. ``TILE.block_w``
    chunks x ``TILE.block_c`` channels a program; launch grid: (cdiv(chunks, block_w), taps,
    cdiv(C, block_c)).

    A bucket with 10^5 points (border padding piles them into corner cells) is then summed
    by many lanes, CHUNK points each, and its voxels add the partial sums in chunk order:
    a fixed order, so still the same on every run.
    """
    entries = wide(sorted_points.entries)
    chunk = tl.program_id(0).to(tl.int64) * TILE.block_w + tl.arange(0, TILE.block_w)
    tap = tl.program_id(1)
    channel = tl.program_id(2).to(tl.int64) * TILE.block_c + tl.arange(0, TILE.block_c)
    chunk_mask = chunk < chunks
    channel_mask = (channel < channels)[None, :]
    first = tl.load(chunk_first + chunk, mask=chunk_mask, other=0).to(tl.int64)
    count = tl.load(chunk_count + chunk, mask=chunk_mask, other=0)
    total = tl.zeros([TILE.block_w, TILE.block_c], ACC)
    for k in range(0, CHUNK):
        live = chunk_mask & (k < count)
        # The same product, in the same order, as dx_gather_kernel's.
        total += _record_term(
            grad,
            sorted_points,
            entries,
            first + k,
            live,
            channel,
            channel_mask,
            (tap & 1, (tap >> 1) & 1, tap >> 2),
            INTERPOLATION,
            ACC,
        )
    partial = (chunk * (1 if INTERPOLATION == NEAREST else 8) + tap)[:, None] * channels + channel[None, :]
    tl.store(partials + partial, total, mask=chunk_mask[:, None] & channel_mask)
