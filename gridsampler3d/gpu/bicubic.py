"""Tricubic ("bicubic") kernels of the GPU engine: 4 x 4 x 4 taps, padding applied per tap.

The rules are those of :mod:`gridsampler3d.reference` (docs/semantics.md): the point's
index is only unnormalised, each tap coordinate floor(index) - 1 .. + 2 is padded on its
own, an outside tap reads 0 (so a NaN weight still reaches y and dgrid), and the grid
multiplier is the unnormalising slope alone. Taps run z outermost, x innermost; y and dgrid
sum separably (along x, then y, then z) in the reference's order.

Deterministic dx: padding can send several taps of one point, and taps of far-away
points, to the same voxel, so cells cannot be bucketed by corner as for trilinear.
``bicubic_tap_keys_kernel`` writes the destination voxel of every (point, tap) entry; a
stable sort groups entries by voxel in (point, tap) order, and ``bicubic_dx_gather_kernel``
adds each voxel's group in that order onto what earlier chunks of points left there.

With ``VOXELS`` (the fused warp) the "grid" is a displacement, read and its gradient
written as by the trilinear kernels (:mod:`.backward`): the point's index is its
position plus the displacement, slope 1.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .coords import (component_offsets, cubic_slope, cubic_weight, cubic_weight_at, pad_tap, point_offset,
                     point_position, store_point_gradient, unnormalize, wide)


@triton.jit
def _grid_point(grid_ptr, n, d, h, w, grid_stride_n, grid_stride_d, grid_stride_h, grid_stride_w, grid_stride_k, mask,
                depth, height, width, ALIGN_CORNERS: tl.constexpr, VOXELS: tl.constexpr):
    """Unnormalised (ix, iy, iz), their floors and the multipliers (mx, my, mz), float64, of the output
    points (n, d, h, w)."""
    offset = point_offset(n, d, h, w, grid_stride_n, grid_stride_d, grid_stride_h, grid_stride_w)
    at_x, at_y, at_z = component_offsets(offset, grid_stride_k, VOXELS)
    ix, mx = unnormalize(tl.load(grid_ptr + at_x, mask=mask, other=0.0), width, w, ALIGN_CORNERS, VOXELS)
    iy, my = unnormalize(tl.load(grid_ptr + at_y, mask=mask, other=0.0), height, h, ALIGN_CORNERS, VOXELS)
    iz, mz = unnormalize(tl.load(grid_ptr + at_z, mask=mask, other=0.0), depth, d, ALIGN_CORNERS, VOXELS)
    return ix, iy, iz, tl.floor(ix), tl.floor(iy), tl.floor(iz), mx, my, mz


@triton.jit
def bicubic_fwd_kernel(
    x_ptr, grid_ptr, y_ptr,
    points, channels, depth, height, width, out_depth, out_height, out_width,
    x_stride_n, x_stride_c, x_stride_d, x_stride_h, x_stride_w,
    grid_stride_n, grid_stride_d, grid_stride_h, grid_stride_w, grid_stride_k,
    y_stride_n, y_stride_c, y_stride_d, y_stride_h, y_stride_w,
    PADDING: tl.constexpr, ALIGN_CORNERS: tl.constexpr, VOXELS: tl.constexpr, ACC: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """y (N, C, Do, Ho, Wo) from x (N, C, D, H, W) at grid (N, Do, Ho, Wo, 3), summed in ``ACC``."""
    depth, height, width = wide(depth), wide(height), wide(width)
    out_depth, out_height, out_width = wide(out_depth), wide(out_height), wide(out_width)
    point = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    channel = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    point_mask = point < points
    tile_mask = point_mask[:, None] & (channel < channels)[None, :]
    n, d, h, w = point_position(point, out_depth, out_height, out_width)
    ix, iy, iz, x0, y0, z0, _, _, _ = _grid_point(grid_ptr, n, d, h, w, grid_stride_n, grid_stride_d, grid_stride_h,
                                                  grid_stride_w, grid_stride_k, point_mask, depth, height, width,
                                                  ALIGN_CORNERS, VOXELS)
    batch_offset = n * x_stride_n
    channel_offset = (channel * x_stride_c)[None, :]
    # Separable, as the reference: along x within each (z, y) row, then along y, then z.
    total = tl.zeros([BLOCK_P, BLOCK_C], ACC)
    for k in tl.static_range(4):
        cz = pad_tap(z0 - 1.0 + k, depth, PADDING, ALIGN_CORNERS)
        plane = tl.zeros([BLOCK_P, BLOCK_C], ACC)
        for j in tl.static_range(4):
            cy = pad_tap(y0 - 1.0 + j, height, PADDING, ALIGN_CORNERS)
            row = tl.zeros([BLOCK_P, BLOCK_C], ACC)
            for i in tl.static_range(4):
                cx = pad_tap(x0 - 1.0 + i, width, PADDING, ALIGN_CORNERS)
                inside = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height) & (cz >= 0) & (cz < depth)
                offset = batch_offset + cz * x_stride_d + cy * x_stride_h + cx * x_stride_w
                value = tl.load(x_ptr + offset[:, None] + channel_offset, mask=tile_mask & inside[:, None], other=0.0)
                row += value.to(ACC) * cubic_weight(ix - x0, i).to(ACC)[:, None]
            plane += row * cubic_weight(iy - y0, j).to(ACC)[:, None]
        total += plane * cubic_weight(iz - z0, k).to(ACC)[:, None]
    out_offset = point_offset(n, d, h, w, y_stride_n, y_stride_d, y_stride_h, y_stride_w)
    tl.store(y_ptr + out_offset[:, None] + (channel * y_stride_c)[None, :], total, mask=tile_mask)


@triton.jit
def bicubic_bwd_kernel(
    grad_ptr, x_ptr, grid_ptr, dx_ptr, dgrid_ptr,
    points, channels, depth, height, width, out_depth, out_height, out_width,
    grad_stride_n, grad_stride_c, grad_stride_d, grad_stride_h, grad_stride_w,
    x_stride_n, x_stride_c, x_stride_d, x_stride_h, x_stride_w,
    grid_stride_n, grid_stride_d, grid_stride_h, grid_stride_w, grid_stride_k,
    dx_stride_n, dx_stride_c, dx_stride_d, dx_stride_h, dx_stride_w,
    dgrid_stride_n, dgrid_stride_d, dgrid_stride_h, dgrid_stride_w, dgrid_stride_k,
    PADDING: tl.constexpr, ALIGN_CORNERS: tl.constexpr, VOXELS: tl.constexpr, ACC: tl.constexpr,
    WANT_DX: tl.constexpr, WANT_DGRID: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """dx += grad through the 64 taps (atomics into a zeroed ``ACC`` buffer) and/or dgrid (through its strides,
    float64 sums)."""
    depth, height, width = wide(depth), wide(height), wide(width)
    out_depth, out_height, out_width = wide(out_depth), wide(out_height), wide(out_width)
    point = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    point_mask = point < points
    batch, d, h, w = point_position(point, out_depth, out_height, out_width)
    ix, iy, iz, x0, y0, z0, mx, my, mz = _grid_point(grid_ptr, batch, d, h, w, grid_stride_n, grid_stride_d,
                                                     grid_stride_h, grid_stride_w, grid_stride_k, point_mask, depth,
                                                     height, width, ALIGN_CORNERS, VOXELS)
    grad_offset = point_offset(batch, d, h, w, grad_stride_n, grad_stride_d, grad_stride_h, grad_stride_w)
    grad_x = tl.zeros([BLOCK_P], tl.float64)
    grad_y = tl.zeros([BLOCK_P], tl.float64)
    grad_z = tl.zeros([BLOCK_P], tl.float64)
    for first_channel in range(0, channels, BLOCK_C):
        channel = first_channel + tl.arange(0, BLOCK_C).to(tl.int64)
        tile_mask = point_mask[:, None] & (channel < channels)[None, :]
        grad = tl.load(grad_ptr + grad_offset[:, None] + (channel * grad_stride_c)[None, :], mask=tile_mask,
                       other=0.0).to(ACC)
        grad_wide = grad.to(tl.float64)
        # dgrid as the reference: per channel, the separable sums with one axis's weights
        # replaced by its slopes (float64), then times grad.
        total_x = tl.zeros([BLOCK_P, BLOCK_C], tl.float64)
        total_y = tl.zeros([BLOCK_P, BLOCK_C], tl.float64)
        total_z = tl.zeros([BLOCK_P, BLOCK_C], tl.float64)
        for k in tl.static_range(4):
            cz = pad_tap(z0 - 1.0 + k, depth, PADDING, ALIGN_CORNERS)
            wz = cubic_weight(iz - z0, k)
            plane_w = tl.zeros([BLOCK_P, BLOCK_C], tl.float64)
            plane_sx = tl.zeros([BLOCK_P, BLOCK_C], tl.float64)
            plane_sy = tl.zeros([BLOCK_P, BLOCK_C], tl.float64)
            for j in tl.static_range(4):
                cy = pad_tap(y0 - 1.0 + j, height, PADDING, ALIGN_CORNERS)
                wy = cubic_weight(iy - y0, j)
                row_w = tl.zeros([BLOCK_P, BLOCK_C], tl.float64)
                row_s = tl.zeros([BLOCK_P, BLOCK_C], tl.float64)
                for i in tl.static_range(4):
                    cx = pad_tap(x0 - 1.0 + i, width, PADDING, ALIGN_CORNERS)
                    wx = cubic_weight(ix - x0, i)
                    inside = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height) & (cz >= 0) & (cz < depth)
                    tap_mask = tile_mask & inside[:, None]
                    if WANT_DX:
                        offset = batch * dx_stride_n + cz * dx_stride_d + cy * dx_stride_h + cx * dx_stride_w
                        tl.atomic_add(dx_ptr + offset[:, None] + (channel * dx_stride_c)[None, :],
                                      grad * (wx * wy * wz).to(ACC)[:, None], mask=tap_mask, sem="relaxed")
                    if WANT_DGRID:
                        offset = batch * x_stride_n + cz * x_stride_d + cy * x_stride_h + cx * x_stride_w
                        # An outside tap reads 0 but still takes part (PyTorch's 2-D bicubic).
                        value = tl.load(x_ptr + offset[:, None] + (channel * x_stride_c)[None, :], mask=tap_mask,
                                        other=0.0).to(tl.float64)
                        row_w += value * wx[:, None]
                        row_s += value * cubic_slope(ix - x0, i)[:, None]
                if WANT_DGRID:
                    plane_w += row_w * wy[:, None]
                    plane_sx += row_s * wy[:, None]
                    plane_sy += row_w * cubic_slope(iy - y0, j)[:, None]
            if WANT_DGRID:
                total_x += plane_sx * wz[:, None]
                total_y += plane_sy * wz[:, None]
                total_z += plane_w * cubic_slope(iz - z0, k)[:, None]
        if WANT_DGRID:
            grad_x += tl.sum(tl.where(tile_mask, total_x * grad_wide, 0.0), axis=1)
            grad_y += tl.sum(tl.where(tile_mask, total_y * grad_wide, 0.0), axis=1)
            grad_z += tl.sum(tl.where(tile_mask, total_z * grad_wide, 0.0), axis=1)
    if WANT_DGRID:
        out = point_offset(batch, d, h, w, dgrid_stride_n, dgrid_stride_d, dgrid_stride_h, dgrid_stride_w)
        store_point_gradient(dgrid_ptr, out, dgrid_stride_k, point_mask, grad_x * mx, grad_y * my, grad_z * mz,
                             VOXELS)


@triton.jit
def bicubic_tap_keys_kernel(
    grid_ptr, keys_ptr, first_point, last_point, voxels, depth, height, width, out_depth, out_height, out_width,
    grid_stride_n, grid_stride_d, grid_stride_h, grid_stride_w, grid_stride_k,
    PADDING: tl.constexpr, ALIGN_CORNERS: tl.constexpr, VOXELS: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """keys[64 * q + tap] (int64): the voxel (n, z, y, x) that tap ``tap`` of point first_point + q lands in,
    or ``voxels`` (N * D * H * W, past every voxel) when it lands outside; points up to ``last_point``."""
    depth, height, width = wide(depth), wide(height), wide(width)
    out_depth, out_height, out_width = wide(out_depth), wide(out_height), wide(out_width)
    local = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    point = first_point + local
    point_mask = point < last_point
    batch, d, h, w = point_position(point, out_depth, out_height, out_width)
    _, _, _, x0, y0, z0, _, _, _ = _grid_point(grid_ptr, batch, d, h, w, grid_stride_n, grid_stride_d, grid_stride_h,
                                               grid_stride_w, grid_stride_k, point_mask, depth, height, width,
                                               ALIGN_CORNERS, VOXELS)
    for k in tl.static_range(4):
        cz = pad_tap(z0 - 1.0 + k, depth, PADDING, ALIGN_CORNERS)
        for j in tl.static_range(4):
            cy = pad_tap(y0 - 1.0 + j, height, PADDING, ALIGN_CORNERS)
            for i in tl.static_range(4):
                cx = pad_tap(x0 - 1.0 + i, width, PADDING, ALIGN_CORNERS)
                inside = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height) & (cz >= 0) & (cz < depth)
                key = ((batch * depth + cz) * height + cy) * width + cx
                tl.store(keys_ptr + local * 64 + (k * 16 + j * 4 + i), tl.where(inside, key, voxels), mask=point_mask)


@triton.jit
def bicubic_dx_gather_kernel(
    grad_ptr, grid_ptr, dx_ptr, order_ptr, starts_ptr, first_point,
    voxels, channels, depth, height, width, out_depth, out_height, out_width,
    grad_stride_n, grad_stride_c, grad_stride_d, grad_stride_h, grad_stride_w,
    grid_stride_n, grid_stride_d, grid_stride_h, grid_stride_w, grid_stride_k,
    dx_stride_n, dx_stride_c, dx_stride_d, dx_stride_h, dx_stride_w,
    ALIGN_CORNERS: tl.constexpr, VOXELS: tl.constexpr, ACC: tl.constexpr, FIRST_CHUNK: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """dx (``ACC``, N, C, D, H, W) += this chunk's entries, in sorted (point, tap) order; every element written.

    ``order`` lists entries 64 * q + tap (q counted from ``first_point``) stably sorted by
    voxel; ``starts[v]`` .. ``starts[v + 1]`` is voxel v's run. The first chunk starts
    from zero, later ones from what dx holds.
    """
    depth, height, width = wide(depth), wide(height), wide(width)
    out_depth, out_height, out_width = wide(out_depth), wide(out_height), wide(out_width)
    voxel = tl.program_id(0).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
    channel = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    voxel_mask = voxel < voxels
    tile_mask = voxel_mask[:, None] & (channel < channels)[None, :]
    vx = voxel % width
    vy = (voxel // width) % height
    vz = (voxel // (width * height)) % depth
    batch = voxel // (width * height * depth)
    out = dx_ptr + (batch * dx_stride_n + vz * dx_stride_d + vy * dx_stride_h + vx * dx_stride_w)[:, None] \
        + (channel * dx_stride_c)[None, :]
    if FIRST_CHUNK:
        total = tl.zeros([BLOCK_V, BLOCK_C], ACC)
    else:
        total = tl.load(out, mask=tile_mask, other=0.0)
    first = tl.load(starts_ptr + voxel, mask=voxel_mask, other=0).to(tl.int64)
    count = tl.load(starts_ptr + voxel + 1, mask=voxel_mask, other=0).to(tl.int64) - first
    for entry in range(0, tl.max(count, axis=0)):
        live = voxel_mask & (entry < count)
        code = tl.load(order_ptr + first + entry, mask=live, other=0)
        point = first_point + code // 64
        tap = code % 64
        n, d, h, w = point_position(point, out_depth, out_height, out_width)
        ix, iy, iz, x0, y0, z0, _, _, _ = _grid_point(grid_ptr, n, d, h, w, grid_stride_n, grid_stride_d, grid_stride_h,
                                                      grid_stride_w, grid_stride_k, live, depth, height, width,
                                                      ALIGN_CORNERS, VOXELS)
        weight = (cubic_weight_at(ix - x0, tap % 4) * cubic_weight_at(iy - y0, (tap // 4) % 4)
                  * cubic_weight_at(iz - z0, tap // 16))
        grad_offset = point_offset(n, d, h, w, grad_stride_n, grad_stride_d, grad_stride_h, grad_stride_w)
        grad = tl.load(grad_ptr + grad_offset[:, None] + (channel * grad_stride_c)[None, :],
                       mask=live[:, None] & tile_mask, other=0.0).to(ACC)
        total += tl.where(live[:, None], weight.to(ACC)[:, None] * grad, 0.0)
    tl.store(out, total, mask=tile_mask)
