"""Forward kernel of the GPU engine: ``y = sample(x, grid)``.

One program per block_d x block_h x block_w patch of the output (``coords.tile_points``),
so that a point's coordinates need no integer division. Each program computes its points'
taps and weights once, then loops over channel blocks: ``block_c = 1`` for NCDHW puts the
lanes along points (each gather and store covers consecutive points of one channel), a
wider block for channels-last reads each tap's channel vector at once. Operands are read in
place through their strides (:class:`.records.Operand`), with int64 offsets.

For a displacement (``RULE.field``, the fused warp) the "grid" is a displacement (N, 3, Do, Ho, Wo) holding
(dz, dy, dx) in voxels, passed with its strides in point order (:class:`.records.PointStrides`):
point (d, h, w) samples at (w + dx, h + dy, d + dz) (``coords.source_index``). An affine field
(``RULE.field``) samples at its voxel matrix's position of the point, plus a displacement
where it has one (``coords.field_coordinates``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .coords import NEAREST, cell_taps, point_indices, tile_points, wide


@triton.jit
def grid_sampler3d_fwd_kernel(x, grid, y, sizes, RULE: tl.constexpr, ACC: tl.constexpr, TILE: tl.constexpr):
    """y (N, C, Do, Ho, Wo) from x (N, C, D, H, W) at grid (N, Do, Ho, Wo, 3); sums in ``ACC``, taps in PyTorch's order.

    ``x``, ``grid`` and ``y``: :class:`.records.Operand`; ``sizes``: :class:`.records.Sizes`;
    ``RULE``: :class:`.records.Rule`; ``TILE``: :class:`.records.Blocks`. Launch grid:
    ``coords.tile_points``.
    """
    channels = sizes.channels
    depth, height, width = wide(sizes.depth), wide(sizes.height), wide(sizes.width)
    out_depth, out_height, out_width = wide(sizes.out_depth), wide(sizes.out_height), wide(sizes.out_width)
    n, d, h, w, point_mask = tile_points(out_depth, out_height, out_width, TILE)
    ix, iy, iz, _, _, _ = point_indices(grid, n, d, h, w, point_mask, depth, height, width, RULE, True)
    offsets, insides, weights = cell_taps(ix, iy, iz, depth, height, width, x.strides, RULE.interpolation, ACC)
    x_item = x.data + n * x.strides.n
    y_points = y.data + n * y.strides.n + d * y.strides.d + h * y.strides.h + w * y.strides.w
    for first_channel in range(0, channels, TILE.block_c):
        channel = first_channel + tl.arange(0, TILE.block_c).to(tl.int64)
        tile_mask = point_mask[:, None] & (channel < channels)[None, :]
        total = tl.zeros([TILE.block_d * TILE.block_h * TILE.block_w, TILE.block_c], ACC)
        for tap in tl.static_range(1 if RULE.interpolation == NEAREST else 8):
            value = tl.load(
                x_item + offsets[tap][:, None] + (channel * x.strides.c)[None, :],
                mask=tile_mask & insides[tap][:, None],
                other=0.0,
            ).to(ACC)
            if RULE.interpolation == NEAREST:
                total += value
            else:
                total += value * weights[tap][:, None]
        tl.store(y_points[:, None] + (channel * y.strides.c)[None, :], total, mask=tile_mask)
