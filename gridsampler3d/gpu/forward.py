"""Forward kernel of the GPU engine: ``y = sample(x, grid)``.

One program per BLOCK_D x BLOCK_H x BLOCK_W patch of the output (``coords.tile_points``),
so that a point's coordinates need no integer division. Each program computes its points'
taps and weights once, then loops over channel blocks: ``BLOCK_C = 1`` for NCDHW puts the
lanes along points (each gather and store covers consecutive points of one channel), a
wider block for channels-last reads each tap's channel vector at once. Operands are read in place through
their strides, with int64 offsets.

With ``VOXELS`` (the fused warp) the "grid" is a displacement (N, 3, Do, Ho, Wo) holding
(dz, dy, dx) in voxels, passed with its strides in grid order (n, d, h, w, component):
point (d, h, w) samples at (w + dx, h + dy, d + dz) (``coords.source_index``).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .coords import NEAREST, cell_taps, point_indices, tile_points, wide


@triton.jit
def grid_sampler3d_fwd_kernel(
    x_ptr, grid_ptr, y_ptr,
    channels, depth, height, width, out_depth, out_height, out_width,
    x_stride_n, x_stride_c, x_stride_d, x_stride_h, x_stride_w,
    grid_stride_n, grid_stride_d, grid_stride_h, grid_stride_w, grid_stride_k,
    y_stride_n, y_stride_c, y_stride_d, y_stride_h, y_stride_w,
    INTERPOLATION: tl.constexpr, PADDING: tl.constexpr, ALIGN_CORNERS: tl.constexpr, VOXELS: tl.constexpr,
    ACC: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """y (N, C, Do, Ho, Wo) from x (N, C, D, H, W) at grid (N, Do, Ho, Wo, 3); sums in ``ACC``, taps in PyTorch's order.

    Launch grid: ``coords.tile_points``.
    """
    depth, height, width = wide(depth), wide(height), wide(width)
    out_depth, out_height, out_width = wide(out_depth), wide(out_height), wide(out_width)
    n, d, h, w, point_mask = tile_points(out_depth, out_height, out_width, BLOCK_D, BLOCK_H, BLOCK_W)
    grid_offset = n * grid_stride_n + d * grid_stride_d + h * grid_stride_h + w * grid_stride_w
    ix, iy, iz, _, _, _ = point_indices(grid_ptr, grid_offset, grid_stride_k, point_mask, depth, height, width, d, h,
                                        w, PADDING, ALIGN_CORNERS, True, VOXELS)
    offsets, insides, weights = cell_taps(ix, iy, iz, depth, height, width, x_stride_d, x_stride_h, x_stride_w,
                                          INTERPOLATION, ACC)
    x_item = x_ptr + n * x_stride_n
    y_points = y_ptr + n * y_stride_n + d * y_stride_d + h * y_stride_h + w * y_stride_w
    for first_channel in range(0, channels, BLOCK_C):
        channel = first_channel + tl.arange(0, BLOCK_C).to(tl.int64)
        tile_mask = point_mask[:, None] & (channel < channels)[None, :]
        total = tl.zeros([BLOCK_D * BLOCK_H * BLOCK_W, BLOCK_C], ACC)
        for tap in tl.static_range(1 if INTERPOLATION == NEAREST else 8):
            value = tl.load(x_item + offsets[tap][:, None] + (channel * x_stride_c)[None, :],
                            mask=tile_mask & insides[tap][:, None], other=0.0).to(ACC)
            if INTERPOLATION == NEAREST:
                total += value
            else:
                total += value * weights[tap][:, None]
        tl.store(y_points[:, None] + (channel * y_stride_c)[None, :], total, mask=tile_mask)
