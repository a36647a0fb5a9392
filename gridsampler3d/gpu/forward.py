"""Forward kernel of the GPU engine: ``y = sample(x, grid)``.

One program per block of output points and block of channels. Operands are read in
place through their strides (NCDHW, channels-last, sliced), with int64 offsets.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .coords import NEAREST, base_corner, point_indices, point_offset, tap_weight, wide


@triton.jit
def grid_sampler3d_fwd_kernel(
    x_ptr, grid_ptr, y_ptr,
    points, channels, depth, height, width, out_depth, out_height, out_width,
    x_stride_n, x_stride_c, x_stride_d, x_stride_h, x_stride_w,
    grid_stride_n, grid_stride_d, grid_stride_h, grid_stride_w, grid_stride_k,
    y_stride_n, y_stride_c, y_stride_d, y_stride_h, y_stride_w,
    INTERPOLATION: tl.constexpr, PADDING: tl.constexpr, ALIGN_CORNERS: tl.constexpr, ACC: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """y (N, C, Do, Ho, Wo) from x (N, C, D, H, W) at grid (N, Do, Ho, Wo, 3); sums in ``ACC``, taps in PyTorch's order."""
    depth, height, width = wide(depth), wide(height), wide(width)
    out_depth, out_height, out_width = wide(out_depth), wide(out_height), wide(out_width)
    point = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    channel = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    point_mask = point < points
    tile_mask = point_mask[:, None] & (channel < channels)[None, :]
    grid_offset = point_offset(point, out_depth, out_height, out_width, grid_stride_n, grid_stride_d,
                               grid_stride_h, grid_stride_w)
    ix, iy, iz, _, _, _ = point_indices(grid_ptr, grid_offset, grid_stride_k, point_mask, depth, height, width,
                                        PADDING, ALIGN_CORNERS, True)
    batch_offset = (point // (out_depth * out_height * out_width)) * x_stride_n
    channel_offset = (channel * x_stride_c)[None, :]
    x0, y0, z0 = base_corner(ix, INTERPOLATION), base_corner(iy, INTERPOLATION), base_corner(iz, INTERPOLATION)
    total = tl.zeros([BLOCK_P, BLOCK_C], ACC)
    if INTERPOLATION == NEAREST:
        inside = (x0 >= 0) & (x0 < width) & (y0 >= 0) & (y0 < height) & (z0 >= 0) & (z0 < depth)
        offset = batch_offset + z0 * x_stride_d + y0 * x_stride_h + x0 * x_stride_w
        total += tl.load(x_ptr + offset[:, None] + channel_offset, mask=tile_mask & inside[:, None],
                         other=0.0).to(ACC)
    else:
        for tap in tl.static_range(8):
            # tap bit 0 steps x, bit 1 y, bit 2 z: PyTorch's corner order.
            cx, cy, cz = x0 + (tap & 1), y0 + ((tap >> 1) & 1), z0 + (tap >> 2)
            inside = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height) & (cz >= 0) & (cz < depth)
            weight = (tap_weight(ix, x0, tap & 1) * tap_weight(iy, y0, (tap >> 1) & 1)
                      * tap_weight(iz, z0, tap >> 2)).to(ACC)
            offset = batch_offset + cz * x_stride_d + cy * x_stride_h + cx * x_stride_w
            value = tl.load(x_ptr + offset[:, None] + channel_offset, mask=tile_mask & inside[:, None], other=0.0)
            total += value.to(ACC) * weight[:, None]
    out_offset = point_offset(point, out_depth, out_height, out_width, y_stride_n, y_stride_d, y_stride_h, y_stride_w)
    tl.store(y_ptr + out_offset[:, None] + (channel * y_stride_c)[None, :], total, mask=tile_mask)
