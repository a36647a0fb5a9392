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

With ``VOXELS`` (the fused warp) every kernel reads a displacement in place of the grid,
as the forward does, and the grid gradient is written through ``dgrid``'s strides, given
in the same grid order: d(displacement) lands in the displacement's own layout.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .coords import (NEAREST, base_corner, cell_taps, linear_weight, point_indices, point_offset, point_position,
                     store_point_gradient, tap_weight, tile_points, wide)


@triton.jit
def grid_sampler3d_bwd_kernel(
    grad_ptr, x_ptr, grid_ptr, dx_ptr, dgrid_ptr,
    channels, depth, height, width, out_depth, out_height, out_width,
    grad_stride_n, grad_stride_c, grad_stride_d, grad_stride_h, grad_stride_w,
    x_stride_n, x_stride_c, x_stride_d, x_stride_h, x_stride_w,
    grid_stride_n, grid_stride_d, grid_stride_h, grid_stride_w, grid_stride_k,
    dx_stride_n, dx_stride_c, dx_stride_d, dx_stride_h, dx_stride_w,
    dgrid_stride_n, dgrid_stride_d, dgrid_stride_h, dgrid_stride_w, dgrid_stride_k,
    INTERPOLATION: tl.constexpr, PADDING: tl.constexpr, ALIGN_CORNERS: tl.constexpr, VOXELS: tl.constexpr,
    ACC: tl.constexpr, WANT_DX: tl.constexpr, WANT_DGRID: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """dx += grad pushed through the taps (atomics, WANT_DX); dgrid (N, Do, Ho, Wo, 3) through its strides (WANT_DGRID).

    Launch grid: ``coords.tile_points``, as the forward. ``dx`` is zeroed by the
    caller and has the accumulation dtype ``ACC``; every program loops over all channels
    (``BLOCK_C`` at a time: 1 for NCDHW, lanes along points) so that its dgrid sums are
    complete. Taps, weights and offsets are computed once per point, before that loop.
    """
    depth, height, width = wide(depth), wide(height), wide(width)
    out_depth, out_height, out_width = wide(out_depth), wide(out_height), wide(out_width)
    n, d, h, w, point_mask = tile_points(out_depth, out_height, out_width, BLOCK_D, BLOCK_H, BLOCK_W)
    grid_offset = n * grid_stride_n + d * grid_stride_d + h * grid_stride_h + w * grid_stride_w
    ix, iy, iz, mx, my, mz = point_indices(grid_ptr, grid_offset, grid_stride_k, point_mask, depth, height, width, d,
                                           h, w, PADDING, ALIGN_CORNERS, False, VOXELS)
    x_offsets, insides, _ = cell_taps(ix, iy, iz, depth, height, width, x_stride_d, x_stride_h, x_stride_w,
                                      INTERPOLATION, ACC)
    dx_offsets, _, _ = cell_taps(ix, iy, iz, depth, height, width, dx_stride_d, dx_stride_h, dx_stride_w,
                                 INTERPOLATION, ACC)
    # Per-axis weights of the low and high taps, float64, for dgrid.
    x0, y0, z0 = base_corner(ix, INTERPOLATION), base_corner(iy, INTERPOLATION), base_corner(iz, INTERPOLATION)
    weights_x = (tap_weight(ix, x0, 0), tap_weight(ix, x0, 1))
    weights_y = (tap_weight(iy, y0, 0), tap_weight(iy, y0, 1))
    weights_z = (tap_weight(iz, z0, 0), tap_weight(iz, z0, 1))
    grad_points = grad_ptr + n * grad_stride_n + d * grad_stride_d + h * grad_stride_h + w * grad_stride_w
    x_item = x_ptr + n * x_stride_n
    dx_item = dx_ptr + n * dx_stride_n
    # dgrid sums many terms of both signs, where float32 loses most: it is summed in float64.
    grad_x = tl.zeros([BLOCK_D * BLOCK_H * BLOCK_W], tl.float64)
    grad_y = tl.zeros([BLOCK_D * BLOCK_H * BLOCK_W], tl.float64)
    grad_z = tl.zeros([BLOCK_D * BLOCK_H * BLOCK_W], tl.float64)
    for first_channel in range(0, channels, BLOCK_C):
        channel = first_channel + tl.arange(0, BLOCK_C).to(tl.int64)
        tile_mask = point_mask[:, None] & (channel < channels)[None, :]
        grad = tl.load(grad_points[:, None] + (channel * grad_stride_c)[None, :], mask=tile_mask, other=0.0).to(ACC)
        grad_wide = grad.to(tl.float64)
        # dgrid sums channels outer, taps inner, as PyTorch: each lane (point, channel) adds its
        # channel's taps in order, the block's first channel onto the point's running sum, and
        # the lanes are added up after the taps. One channel per block (NCDHW, float64) is then
        # PyTorch's order bit for bit; with a channel vector, a channel whose terms cancel still
        # adds exactly 0 (adding each tap's channel vector first left a residue).
        first_lane = (tl.arange(0, BLOCK_C) == 0)[None, :]
        lanes_x = tl.where(first_lane, grad_x[:, None], 0.0)
        lanes_y = tl.where(first_lane, grad_y[:, None], 0.0)
        lanes_z = tl.where(first_lane, grad_z[:, None], 0.0)
        for tap in tl.static_range(1 if INTERPOLATION == NEAREST else 8):
            step_x, step_y, step_z = tap & 1, (tap >> 1) & 1, tap >> 2
            tap_mask = tile_mask & insides[tap][:, None]
            if WANT_DX:
                if INTERPOLATION == NEAREST:
                    contribution = grad
                else:
                    # The float64 product rounded once (float32 weights would round twice).
                    wx = weights_x[tap & 1][:, None]
                    wy = weights_y[(tap >> 1) & 1][:, None]
                    wz = weights_z[tap >> 2][:, None]
                    contribution = (grad_wide * ((wx * wy) * wz)).to(ACC)
                tl.atomic_add(dx_item + dx_offsets[tap][:, None] + (channel * dx_stride_c)[None, :], contribution,
                              mask=tap_mask, sem="relaxed")
            if WANT_DGRID:
                value = tl.load(x_item + x_offsets[tap][:, None] + (channel * x_stride_c)[None, :], mask=tap_mask,
                                other=0.0).to(tl.float64)
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
    if WANT_DGRID:
        out = point_offset(n, d, h, w, dgrid_stride_n, dgrid_stride_d, dgrid_stride_h, dgrid_stride_w)
        store_point_gradient(dgrid_ptr, out, dgrid_stride_k, point_mask, grad_x * mx, grad_y * my, grad_z * mz,
                             VOXELS)


@triton.jit
def bucket_keys_kernel(
    grid_ptr, keys_ptr, points, depth, height, width, out_depth, out_height, out_width,
    grid_stride_n, grid_stride_d, grid_stride_h, grid_stride_w, grid_stride_k,
    INTERPOLATION: tl.constexpr, PADDING: tl.constexpr, ALIGN_CORNERS: tl.constexpr, VOXELS: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """keys[p] (int64): the lowest corner of point p's cell in the padded (N, D+1, H+1, W+1) index space.

    Corners run from -1 (stored as 0) so that every cell with a tap inside has a key; a
    point with none gets N*(D+1)*(H+1)*(W+1), which sorts last and belongs to no voxel.
    """
    depth, height, width = wide(depth), wide(height), wide(width)
    out_depth, out_height, out_width = wide(out_depth), wide(out_height), wide(out_width)
    point = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    point_mask = point < points
    batch, d, h, w = point_position(point, out_depth, out_height, out_width)
    grid_offset = point_offset(batch, d, h, w, grid_stride_n, grid_stride_d, grid_stride_h, grid_stride_w)
    ix, iy, iz, _, _, _ = point_indices(grid_ptr, grid_offset, grid_stride_k, point_mask, depth, height, width, d, h,
                                        w, PADDING, ALIGN_CORNERS, False, VOXELS)
    x0, y0, z0 = base_corner(ix, INTERPOLATION), base_corner(iy, INTERPOLATION), base_corner(iz, INTERPOLATION)
    lowest = 0 if INTERPOLATION == NEAREST else -1
    touches = ((x0 >= lowest) & (x0 < width) & (y0 >= lowest) & (y0 < height) & (z0 >= lowest)
               & (z0 < depth))
    key = ((batch * (depth + 1) + z0 + 1) * (height + 1) + y0 + 1) * (width + 1) + x0 + 1
    beyond = (points // (out_depth * out_height * out_width)) * (depth + 1) * (height + 1) * (width + 1)
    tl.store(keys_ptr + point, tl.where(touches, key, beyond), mask=point_mask)


@triton.jit
def sorted_records_kernel(
    grid_ptr, order_ptr, records_ptr, grad_offsets_ptr, entries, depth, height, width, out_depth, out_height,
    out_width, grad_stride_n, grad_stride_d, grad_stride_h, grad_stride_w,
    grid_stride_n, grid_stride_d, grid_stride_h, grid_stride_w, grid_stride_k,
    INTERPOLATION: tl.constexpr, PADDING: tl.constexpr, ALIGN_CORNERS: tl.constexpr, VOXELS: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """Each point's record, written once at its place in the sorted order (``order``).

    grad_offsets[j] (int64) is where sorted point j's grad starts (its channel 0); for
    trilinear, records[j], records[entries + j] and records[2 * entries + j] (float64) are
    its source indices ix, iy, iz, from which the gather and partial-sum kernels take
    every tap weight. They then read contiguous records instead of reading the grid at
    random and recomputing a point's coordinates once per tap.
    """
    depth, height, width = wide(depth), wide(height), wide(width)
    out_depth, out_height, out_width = wide(out_depth), wide(out_height), wide(out_width)
    entries = wide(entries)
    entry = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    entry_mask = entry < entries
    point = tl.load(order_ptr + entry, mask=entry_mask, other=0).to(tl.int64)
    n, d, h, w = point_position(point, out_depth, out_height, out_width)
    grad_offset = point_offset(n, d, h, w, grad_stride_n, grad_stride_d, grad_stride_h, grad_stride_w)
    tl.store(grad_offsets_ptr + entry, grad_offset, mask=entry_mask)
    if INTERPOLATION != NEAREST:
        grid_offset = point_offset(n, d, h, w, grid_stride_n, grid_stride_d, grid_stride_h, grid_stride_w)
        ix, iy, iz, _, _, _ = point_indices(grid_ptr, grid_offset, grid_stride_k, entry_mask, depth, height, width, d,
                                            h, w, PADDING, ALIGN_CORNERS, False, VOXELS)
        tl.store(records_ptr + entry, ix, mask=entry_mask)
        tl.store(records_ptr + entries + entry, iy, mask=entry_mask)
        tl.store(records_ptr + 2 * entries + entry, iz, mask=entry_mask)


@triton.jit
def dx_gather_kernel(
    grad_ptr, records_ptr, grad_offsets_ptr, dx_ptr, starts_ptr, chunk_starts_ptr, partials_ptr,
    entries, voxels, channels, depth, height, width, grad_stride_c,
    dx_stride_n, dx_stride_c, dx_stride_d, dx_stride_h, dx_stride_w,
    INTERPOLATION: tl.constexpr, ACC: tl.constexpr, SPLIT: tl.constexpr, BLOCK_V: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """dx (N, C, D, H, W), every element written: per voxel, the sum of grad * weight over the points whose taps hit it.

    ``starts[k]`` is where key k's bucket begins in the sorted order (``starts[k + 1]``
    where it ends), whose records :func:`sorted_records_kernel` wrote. With ``SPLIT``, a
    bucket with chunks (``chunk_starts[k]`` .. ``chunk_starts[k + 1]``) is summed from
    their partial sums (:func:`bucket_partials_kernel`), in chunk order, instead of point
    by point.
    """
    depth, height, width = wide(depth), wide(height), wide(width)
    entries = wide(entries)
    voxel = tl.program_id(0).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
    channel = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    voxel_mask = voxel < voxels
    channel_mask = (channel < channels)[None, :]
    vx = voxel % width
    vy = (voxel // width) % height
    vz = (voxel // (width * height)) % depth
    batch = voxel // (width * height * depth)
    total = tl.zeros([BLOCK_V, BLOCK_C], ACC)
    for tap in tl.static_range(1 if INTERPOLATION == NEAREST else 8):
        step_x, step_y, step_z = tap & 1, (tap >> 1) & 1, tap >> 2
        # The bucket of cells whose tap (step_x, step_y, step_z) is this voxel.
        key = ((batch * (depth + 1) + vz - step_z + 1) * (height + 1) + vy - step_y + 1) * (width + 1) + vx - step_x + 1
        first = tl.load(starts_ptr + key, mask=voxel_mask, other=0).to(tl.int64)
        count = tl.load(starts_ptr + key + 1, mask=voxel_mask, other=0) - first
        if SPLIT:
            first_chunk = tl.load(chunk_starts_ptr + key, mask=voxel_mask, other=0).to(tl.int64)
            chunks = tl.load(chunk_starts_ptr + key + 1, mask=voxel_mask, other=0) - first_chunk
            count = tl.where(chunks > 0, 0, count)
            for chunk in range(0, tl.max(chunks, axis=0)):
                live = (voxel_mask & (chunk < chunks))[:, None] & channel_mask
                partial = ((first_chunk + chunk) * (1 if INTERPOLATION == NEAREST else 8) + tap)[:, None] * channels \
                    + channel[None, :]
                total += tl.load(partials_ptr + partial, mask=live, other=0.0)
        for k in range(0, tl.max(count, axis=0)):
            live = voxel_mask & (k < count)
            total += _record_term(grad_ptr, records_ptr, grad_offsets_ptr, first + k, entries, live, channel,
                                  channel_mask, grad_stride_c, step_x, step_y, step_z, INTERPOLATION, ACC)
    out_offset = batch * dx_stride_n + vz * dx_stride_d + vy * dx_stride_h + vx * dx_stride_w
    tl.store(dx_ptr + out_offset[:, None] + (channel * dx_stride_c)[None, :], total,
             mask=voxel_mask[:, None] & channel_mask)


@triton.jit
def _record_term(grad_ptr, records_ptr, grad_offsets_ptr, entry, entries, live, channel, channel_mask,
                 grad_stride_c, step_x, step_y, step_z, INTERPOLATION: tl.constexpr, ACC: tl.constexpr):
    """grad * weight (BLOCK, BLOCK_C) of sorted entry ``entry`` for its tap (step_x, step_y, step_z),
    in ``ACC``: the float64 product rounded once; 0 where not ``live``."""
    grad_offset = tl.load(grad_offsets_ptr + entry, mask=live, other=0)
    grad = tl.load(grad_ptr + grad_offset[:, None] + (channel * grad_stride_c)[None, :],
                   mask=live[:, None] & channel_mask, other=0.0)
    if INTERPOLATION == NEAREST:
        return grad.to(ACC)
    ix = tl.load(records_ptr + entry, mask=live, other=0.0)
    iy = tl.load(records_ptr + entries + entry, mask=live, other=0.0)
    iz = tl.load(records_ptr + 2 * entries + entry, mask=live, other=0.0)
    weight = (linear_weight(ix, base_corner(ix, INTERPOLATION), step_x)
              * linear_weight(iy, base_corner(iy, INTERPOLATION), step_y)
              * linear_weight(iz, base_corner(iz, INTERPOLATION), step_z))
    return (grad.to(tl.float64) * weight[:, None]).to(ACC)


@triton.jit
def bucket_partials_kernel(
    grad_ptr, records_ptr, grad_offsets_ptr, partials_ptr, chunk_first_ptr, chunk_count_ptr,
    entries, chunks, channels, grad_stride_c,
    INTERPOLATION: tl.constexpr, ACC: tl.constexpr, CHUNK: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """partials (chunks, taps, C) in ``ACC``: per chunk of at most CHUNK consecutive entries
    of a long bucket (from ``chunk_first``, ``chunk_count`` of them, in the sorted order), per
    tap, the sum of grad * weight in point order. Launch grid: (cdiv(chunks, BLOCK_K), taps,
    cdiv(C, BLOCK_C)).

    A bucket with 10^5 points (border padding piles them into corner cells) is then summed
    by many lanes, CHUNK points each, and its voxels add the partial sums in chunk order:
    a fixed order, so still the same on every run.
    """
    entries = wide(entries)
    chunk = tl.program_id(0).to(tl.int64) * BLOCK_K + tl.arange(0, BLOCK_K)
    tap = tl.program_id(1)
    channel = tl.program_id(2).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    chunk_mask = chunk < chunks
    channel_mask = (channel < channels)[None, :]
    first = tl.load(chunk_first_ptr + chunk, mask=chunk_mask, other=0).to(tl.int64)
    count = tl.load(chunk_count_ptr + chunk, mask=chunk_mask, other=0)
    total = tl.zeros([BLOCK_K, BLOCK_C], ACC)
    for k in range(0, CHUNK):
        live = chunk_mask & (k < count)
        # The same product, in the same order, as dx_gather_kernel's.
        total += _record_term(grad_ptr, records_ptr, grad_offsets_ptr, first + k, entries, live, channel,
                              channel_mask, grad_stride_c, tap & 1, (tap >> 1) & 1, tap >> 2, INTERPOLATION, ACC)
    partial = (chunk * (1 if INTERPOLATION == NEAREST else 8) + tap)[:, None] * channels + channel[None, :]
    tl.store(partials_ptr + partial, total, mask=chunk_mask[:, None] & channel_mask)
