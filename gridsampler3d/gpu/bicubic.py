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

For a displacement (``RULE.field``, the fused warp) the "grid" is a displacement, read and its gradient
written as by the trilinear kernels (:mod:`.backward`): the point's index is its
position plus the displacement, slope 1.

The kernels take their operands and constexprs as records, as :mod:`.backward`'s do
(:mod:`.records`); they read ``RULE.padding``, ``RULE.align_corners`` and ``RULE.field``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .coords import (
    cubic_slope,
    cubic_weight,
    cubic_weight_at,
    field_coordinates,
    pad_tap,
    point_position,
    store_position_gradient,
    unnormalize,
    volume_offset,
    wide,
)


@triton.jit
def _grid_point(grid, n, d, h, w, mask, depth, height, width, RULE: tl.constexpr):
    """Unnormalised (ix, iy, iz), their floors and the multipliers (mx, my, mz), float64, of the output
    points (n, d, h, w) of ``grid``."""
    gx, gy, gz, ox, oy, oz = field_coordinates(grid, n, d, h, w, mask, RULE)
    ix, mx = unnormalize(gx, width, ox, RULE)
    iy, my = unnormalize(gy, height, oy, RULE)
    iz, mz = unnormalize(gz, depth, oz, RULE)
    return ix, iy, iz, tl.floor(ix), tl.floor(iy), tl.floor(iz), mx, my, mz


@triton.jit
def bicubic_fwd_kernel(x, grid, y, points, sizes, RULE: tl.constexpr, ACC: tl.constexpr, TILE: tl.constexpr):
    """y (N, C, Do, Ho, Wo) from x (N, C, D, H, W) at grid (N, Do, Ho, Wo, 3), summed in ``ACC``.

    ``TILE.block_w`` of the ``points`` (N * Do * Ho * Wo) x ``TILE.block_c`` channels a program.
    """
    channels = sizes.channels
    depth, height, width = wide(sizes.depth), wide(sizes.height), wide(sizes.width)
    out_depth, out_height, out_width = wide(sizes.out_depth), wide(sizes.out_height), wide(sizes.out_width)
    point = tl.program_id(0).to(tl.int64) * TILE.block_w + tl.arange(0, TILE.block_w)
    channel = tl.program_id(1).to(tl.int64) * TILE.block_c + tl.arange(0, TILE.block_c)
    point_mask = point < points
    tile_mask = point_mask[:, None] & (channel < channels)[None, :]
    n, d, h, w = point_position(point, out_depth, out_height, out_width)
    ix, iy, iz, x0, y0, z0, _, _, _ = _grid_point(grid, n, d, h, w, point_mask, depth, height, width, RULE)
    batch_offset = n * x.strides.n
    channel_offset = (channel * x.strides.c)[None, :]
    # Separable, as the reference: along x within each (z, y) row, then along y, then z.
    total = tl.zeros([TILE.block_w, TILE.block_c], ACC)
    for k in tl.static_range(4):
        cz = pad_tap(z0 - 1.0 + k, depth, RULE)
        plane = tl.zeros([TILE.block_w, TILE.block_c], ACC)
        for j in tl.static_range(4):
            cy = pad_tap(y0 - 1.0 + j, height, RULE)
            row = tl.zeros([TILE.block_w, TILE.block_c], ACC)
            for i in tl.static_range(4):
                cx = pad_tap(x0 - 1.0 + i, width, RULE)
                inside = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height) & (cz >= 0) & (cz < depth)
                offset = batch_offset + cz * x.strides.d + cy * x.strides.h + cx * x.strides.w
                value = tl.load(x.data + offset[:, None] + channel_offset, mask=tile_mask & inside[:, None], other=0.0)
                row += value.to(ACC) * cubic_weight(ix - x0, i).to(ACC)[:, None]
            plane += row * cubic_weight(iy - y0, j).to(ACC)[:, None]
        total += plane * cubic_weight(iz - z0, k).to(ACC)[:, None]
    out_offset = volume_offset(n, d, h, w, y.strides)
    tl.store(y.data + out_offset[:, None] + (channel * y.strides.c)[None, :], total, mask=tile_mask)


@triton.jit
def bicubic_bwd_kernel(
    grad,
    x,
    grid,
    dx,
    dgrid,
    partials,
    points,
    sizes,
    RULE: tl.constexpr,
    ACC: tl.constexpr,
    OUTPUTS: tl.constexpr,
    TILE: tl.constexpr,
):
    """dx += grad through the 64 taps (atomics into a zeroed ``ACC`` buffer, ``OUTPUTS.dx``), dgrid (through its
    strides, float64 sums) or a B-spline's partial row sums (``OUTPUTS.dfield``), and an affine field's row
    moments (``OUTPUTS.dtheta``); both row partials in :class:`.records.RowPartials`.

    ``TILE.block_w`` of the ``points`` a program, every channel ``TILE.block_c`` at a time;
    for an affine field or a B-spline, ``TILE.block_w`` columns of one output row a program (launch grid
    (N * Do * Ho, cdiv(Wo, block_w))), so that a program's partial sums are one row's.
    """
    channels = sizes.channels
    depth, height, width = wide(sizes.depth), wide(sizes.height), wide(sizes.width)
    out_depth, out_height, out_width = wide(sizes.out_depth), wide(sizes.out_height), wide(sizes.out_width)
    if RULE.affine or RULE.spline:
        column = tl.program_id(1).to(tl.int64) * TILE.block_w + tl.arange(0, TILE.block_w)
        point = tl.program_id(0).to(tl.int64) * out_width + column
        point_mask = column < out_width
    else:
        point = tl.program_id(0).to(tl.int64) * TILE.block_w + tl.arange(0, TILE.block_w)
        point_mask = point < points
    batch, d, h, w = point_position(point, out_depth, out_height, out_width)
    ix, iy, iz, x0, y0, z0, mx, my, mz = _grid_point(grid, batch, d, h, w, point_mask, depth, height, width, RULE)
    grad_offset = volume_offset(batch, d, h, w, grad.strides)
    grad_x = tl.zeros([TILE.block_w], tl.float64)
    grad_y = tl.zeros([TILE.block_w], tl.float64)
    grad_z = tl.zeros([TILE.block_w], tl.float64)
    for first_channel in range(0, channels, TILE.block_c):
        channel = first_channel + tl.arange(0, TILE.block_c).to(tl.int64)
        tile_mask = point_mask[:, None] & (channel < channels)[None, :]
        grad_values = tl.load(
            grad.data + grad_offset[:, None] + (channel * grad.strides.c)[None, :], mask=tile_mask, other=0.0
        ).to(ACC)
        grad_wide = grad_values.to(tl.float64)
        total_x, total_y, total_z = _tap_sums(
            x,
            dx,
            batch,
            channel,
            tile_mask,
            grad_values,
            (ix, iy, iz, x0, y0, z0),
            (depth, height, width),
            RULE,
            ACC,
            OUTPUTS,
        )
        if OUTPUTS.dfield or OUTPUTS.dtheta:
            grad_x += tl.sum(tl.where(tile_mask, total_x * grad_wide, 0.0), axis=1)
            grad_y += tl.sum(tl.where(tile_mask, total_y * grad_wide, 0.0), axis=1)
            grad_z += tl.sum(tl.where(tile_mask, total_z * grad_wide, 0.0), axis=1)
    store_position_gradient(
        dgrid,
        partials,
        grid.columns,
        (batch, d, h, w, point_mask),
        (grad_x * mx, grad_y * my, grad_z * mz),
        (out_depth, out_height),
        RULE,
        OUTPUTS,
    )


@triton.jit
def _tap_sums(
    x,
    dx,
    batch,
    channel,
    tile_mask,
    grad_values,
    point,
    volume_sizes,
    RULE: tl.constexpr,
    ACC: tl.constexpr,
    OUTPUTS: tl.constexpr,
):
    """One block of channels of :func:`bicubic_bwd_kernel` over the 64 taps: dx += grad * weight (atomics,
    ``OUTPUTS.dx``), and with ``OUTPUTS.dfield`` or ``OUTPUTS.dtheta`` the (block_w, block_c) float64 sums
    (total_x, total_y, total_z) that dgrid takes times grad (else zeros).

    ``point`` is (ix, iy, iz, x0, y0, z0) of :func:`_grid_point`, ``volume_sizes`` the int64 (depth, height,
    width).
    """
    ix, iy, iz, x0, y0, z0 = point
    depth, height, width = volume_sizes
    # dgrid as the reference: per channel, the separable sums with one axis's weights
    # replaced by its slopes (float64), then times grad.
    total_x = tl.zeros(tile_mask.shape, tl.float64)
    total_y = tl.zeros(tile_mask.shape, tl.float64)
    total_z = tl.zeros(tile_mask.shape, tl.float64)
    for k in tl.static_range(4):
        cz = pad_tap(z0 - 1.0 + k, depth, RULE)
        wz = cubic_weight(iz - z0, k)
        plane_w = tl.zeros(tile_mask.shape, tl.float64)
        plane_sx = tl.zeros(tile_mask.shape, tl.float64)
        plane_sy = tl.zeros(tile_mask.shape, tl.float64)
        for j in tl.static_range(4):
            cy = pad_tap(y0 - 1.0 + j, height, RULE)
            wy = cubic_weight(iy - y0, j)
            row_w = tl.zeros(tile_mask.shape, tl.float64)
            row_s = tl.zeros(tile_mask.shape, tl.float64)
            for i in tl.static_range(4):
                cx = pad_tap(x0 - 1.0 + i, width, RULE)
                wx = cubic_weight(ix - x0, i)
                inside = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height) & (cz >= 0) & (cz < depth)
                tap_mask = tile_mask & inside[:, None]
                if OUTPUTS.dx:
                    offset = batch * dx.strides.n + cz * dx.strides.d + cy * dx.strides.h + cx * dx.strides.w
                    tl.atomic_add(
                        dx.data + offset[:, None] + (channel * dx.strides.c)[None, :],
                        grad_values * (wx * wy * wz).to(ACC)[:, None],
                        mask=tap_mask,
                        sem="relaxed",
                    )
                if OUTPUTS.dfield or OUTPUTS.dtheta:
                    offset = batch * x.strides.n + cz * x.strides.d + cy * x.strides.h + cx * x.strides.w
                    # An outside tap reads 0 but still takes part (PyTorch's 2-D bicubic).
                    value = tl.load(
                        x.data + offset[:, None] + (channel * x.strides.c)[None, :], mask=tap_mask, other=0.0
                    ).to(tl.float64)
                    row_w += value * wx[:, None]
                    row_s += value * cubic_slope(ix - x0, i)[:, None]
            if OUTPUTS.dfield or OUTPUTS.dtheta:
                plane_w += row_w * wy[:, None]
                plane_sx += row_s * wy[:, None]
                plane_sy += row_w * cubic_slope(iy - y0, j)[:, None]
        if OUTPUTS.dfield or OUTPUTS.dtheta:
            total_x += plane_sx * wz[:, None]
            total_y += plane_sy * wz[:, None]
            total_z += plane_w * cubic_slope(iz - z0, k)[:, None]
    return total_x, total_y, total_z


@triton.jit
def bicubic_tap_keys_kernel(grid, keys, first_point, last_point, voxels, sizes, RULE: tl.constexpr, TILE: tl.constexpr):
    """keys[64 * q + tap] (int64): the voxel (n, z, y, x) that tap ``tap`` of point first_point + q lands in,
    or ``voxels`` (N * D * H * W, past every voxel) when it lands outside; points up to ``last_point``,
    ``TILE.block_w`` a program."""
    depth, height, width = wide(sizes.depth), wide(sizes.height), wide(sizes.width)
    out_depth, out_height, out_width = wide(sizes.out_depth), wide(sizes.out_height), wide(sizes.out_width)
    local = tl.program_id(0).to(tl.int64) * TILE.block_w + tl.arange(0, TILE.block_w)
    point = first_point + local
    point_mask = point < last_point
    batch, d, h, w = point_position(point, out_depth, out_height, out_width)
    _, _, _, x0, y0, z0, _, _, _ = _grid_point(grid, batch, d, h, w, point_mask, depth, height, width, RULE)
    for k in tl.static_range(4):
        cz = pad_tap(z0 - 1.0 + k, depth, RULE)
        for j in tl.static_range(4):
            cy = pad_tap(y0 - 1.0 + j, height, RULE)
            for i in tl.static_range(4):
                cx = pad_tap(x0 - 1.0 + i, width, RULE)
                inside = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height) & (cz >= 0) & (cz < depth)
                key = ((batch * depth + cz) * height + cy) * width + cx
                tl.store(keys + local * 64 + (k * 16 + j * 4 + i), tl.where(inside, key, voxels), mask=point_mask)


@triton.jit
def bicubic_dx_gather_kernel(
    grad,
    grid,
    dx,
    order,
    starts,
    first_point,
    voxels,
    sizes,
    RULE: tl.constexpr,
    ACC: tl.constexpr,
    FIRST_CHUNK: tl.constexpr,
    TILE: tl.constexpr,
):
    """dx (``ACC``, N, C, D, H, W) += this chunk's entries, in sorted (point, tap) order; every element written.

    ``order`` lists entries 64 * q + tap (q counted from ``first_point``) stably sorted by
    voxel; ``starts[v]`` .. ``starts[v + 1]`` is voxel v's run. The first chunk starts
    from zero, later ones from what dx holds. ``TILE.block_w`` voxels x ``TILE.block_c``
    channels a program. The weights do not depend on ``RULE.padding`` (the taps' voxels do,
    and the sort has placed them).
    """
    channels = sizes.channels
    depth, height, width = wide(sizes.depth), wide(sizes.height), wide(sizes.width)
    out_depth, out_height, out_width = wide(sizes.out_depth), wide(sizes.out_height), wide(sizes.out_width)
    voxel = tl.program_id(0).to(tl.int64) * TILE.block_w + tl.arange(0, TILE.block_w)
    channel = tl.program_id(1).to(tl.int64) * TILE.block_c + tl.arange(0, TILE.block_c)
    voxel_mask = voxel < voxels
    tile_mask = voxel_mask[:, None] & (channel < channels)[None, :]
    vx = voxel % width
    vy = (voxel // width) % height
    vz = (voxel // (width * height)) % depth
    batch = voxel // (width * height * depth)
    out = (
        dx.data
        + (batch * dx.strides.n + vz * dx.strides.d + vy * dx.strides.h + vx * dx.strides.w)[:, None]
        + (channel * dx.strides.c)[None, :]
    )
    if FIRST_CHUNK:
        total = tl.zeros([TILE.block_w, TILE.block_c], ACC)
    else:
        total = tl.load(out, mask=tile_mask, other=0.0)
    first = tl.load(starts + voxel, mask=voxel_mask, other=0).to(tl.int64)
    count = tl.load(starts + voxel + 1, mask=voxel_mask, other=0).to(tl.int64) - first
    for entry in range(0, tl.max(count, axis=0)):
        live = voxel_mask & (entry < count)
        code = tl.load(order + first + entry, mask=live, other=0)
        point = first_point + code // 64
        tap = code % 64
        n, d, h, w = point_position(point, out_depth, out_height, out_width)
        ix, iy, iz, x0, y0, z0, _, _, _ = _grid_point(grid, n, d, h, w, live, depth, height, width, RULE)
        weight = (
            cubic_weight_at(ix - x0, tap % 4)
            * cubic_weight_at(iy - y0, (tap // 4) % 4)
            * cubic_weight_at(iz - z0, tap // 16)
        )
        grad_offset = volume_offset(n, d, h, w, grad.strides)
        values = tl.load(
            grad.data + grad_offset[:, None] + (channel * grad.strides.c)[None, :],
            mask=live[:, None] & tile_mask,
            other=0.0,
        ).to(ACC)
        total += tl.where(live[:, None], weight.to(ACC)[:, None] * values, 0.0)
    tl.store(out, total, mask=tile_mask)
