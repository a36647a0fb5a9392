"""Tricubic ("bicubic") kernels of the CPU engine: 4 x 4 x 4 taps, padding applied per tap.

The rules are PyTorch's 2-D bicubic extended to 3-D (docs/semantics.md): the point's
index is only unnormalised; each tap coordinate floor(index) - 1 .. + 2 is padded on its
own; an outside tap reads 0 (and so still carries a NaN weight into y and dgrid); the grid
multiplier is the unnormalising slope alone. Taps run z outermost, x innermost; all
arithmetic is float64, in the reference's order (y and dgrid sum separably: along x, then
y, then z, PyTorch's 2-D order), so float64 results equal the reference bit for bit.

With ``voxels`` (the fused warp) the "grid" is a displacement in voxels with strides
given as (n, d, h, w, -component), as for the trilinear kernels (:mod:`.forward`), and
the point's index is its identity position plus the displacement, slope 1.

Forward and dgrid are parallel over output rows. dx is owner-computes: the (n, z) planes
are split into one slab per thread, and each thread walks every point in order, adding
only the taps that land in its slab, so each voxel sums in point order, deterministic
and independent of the thread count.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .backward import zero_planes
from .records import Operand
from .coords import cubic_slope, cubic_weight, pad_tap, unnormalize

inline = njit(cache=True, error_model="numpy", inline="always")


@inline
def _cell(grid, offset, step, sizes, align_corners, voxels, w, h, d):
    """(index, floor) per axis (x, y, z) and the three multipliers of the grid point at ``offset``,
    output point (d, h, w)."""
    ix, mx = unnormalize(float(grid[offset]), sizes[2], align_corners, voxels, float(w))
    iy, my = unnormalize(float(grid[offset + step]), sizes[1], align_corners, voxels, float(h))
    iz, mz = unnormalize(float(grid[offset + 2 * step]), sizes[0], align_corners, voxels, float(d))
    # np.floor keeps a float: NaN and inf stay representable (math.floor would need an int)
    return ix, iy, iz, np.floor(ix), np.floor(iy), np.floor(iz), mx, my, mz


@inline
def _axis_taps(index, low, size, padding, align_corners, taps, weights, slopes):
    """Fill taps[0..3] (padded int coordinates), weights[0..3] and slopes[0..3] along one axis."""
    t = index - low
    for step in range(4):
        taps[step] = pad_tap(low - 1.0 + step, size, padding, align_corners)
        weights[step] = cubic_weight(step, t)
        slopes[step] = cubic_slope(step, t)


@inline
def _point_taps(grid, point, step, sizes, padding, align_corners, voxels, w, h, d, taps, weights, slopes):
    """Fill the (3, 4) per-axis taps, weights and slopes of the grid point at ``point``; return (mx, my, mz)."""
    ix, iy, iz, x0, y0, z0, mx, my, mz = _cell(grid, point, step, sizes, align_corners, voxels, w, h, d)
    _axis_taps(ix, x0, sizes[2], padding, align_corners, taps[0], weights[0], slopes[0])
    _axis_taps(iy, y0, sizes[1], padding, align_corners, taps[1], weights[1], slopes[1])
    _axis_taps(iz, z0, sizes[0], padding, align_corners, taps[2], weights[2], slopes[2])
    return mx, my, mz


@inline
def _tap_offsets(taps, sizes, spatial, offsets):
    """offsets[16k + 4j + i]: spatial offset of tap (i, j, k), or -1 when it lies outside the volume."""
    depth, height, width = sizes
    for k in range(4):
        for j in range(4):
            for i in range(4):
                cx, cy, cz = taps[0, i], taps[1, j], taps[2, k]
                inside = 0 <= cx < width and 0 <= cy < height and 0 <= cz < depth
                offsets[16 * k + 4 * j + i] = cz * spatial[0] + cy * spatial[1] + cx * spatial[2] if inside else -1


@njit(parallel=True, cache=True, error_model="numpy")
def bicubic_fwd_kernel(x, x_strides, grid, grid_strides, y, y_strides, batch, channels, sizes, out_sizes, padding,
                       align_corners, voxels):
    """y (N, C, Do, Ho, Wo) from x (N, C, D, H, W) at grid (N, Do, Ho, Wo, 3); every element written."""
    out_depth, out_height, out_width = out_sizes
    spatial = (x_strides[2], x_strides[3], x_strides[4])
    shift = -2 * grid_strides[4] if voxels else 0
    for row in prange(batch * out_depth * out_height):
        n = row // (out_depth * out_height)
        d = (row // out_height) % out_depth
        h = row % out_height
        taps = np.empty((3, 4), np.int64)
        weights = np.empty((3, 4))
        slopes = np.empty((3, 4))
        offsets = np.empty(64, np.int64)
        for w in range(out_width):
            point = n * grid_strides[0] + d * grid_strides[1] + h * grid_strides[2] + w * grid_strides[3] + shift
            _point_taps(grid, point, grid_strides[4], sizes, padding, align_corners, voxels, w, h, d, taps, weights,
                        slopes)
            _tap_offsets(taps, sizes, spatial, offsets)
            out = n * y_strides[0] + d * y_strides[2] + h * y_strides[3] + w * y_strides[4]
            for c in range(channels):
                base = n * x_strides[0] + c * x_strides[1]
                total = 0.0
                for k in range(4):
                    plane = 0.0
                    for j in range(4):
                        row = 0.0
                        for i in range(4):
                            t = 16 * k + 4 * j + i
                            row += (x[base + offsets[t]] if offsets[t] >= 0 else 0.0) * weights[0, i]
                        plane += row * weights[1, j]
                    total += plane * weights[2, k]
                y[out + c * y_strides[1]] = total


@njit(parallel=True, cache=True, error_model="numpy")
def bicubic_dgrid_kernel(grad, grad_strides, x, x_strides, grid, grid_strides, dgrid, dgrid_strides, batch, channels,
                         sizes, out_sizes, padding, align_corners, voxels):
    """dgrid (N, Do, Ho, Wo, 3) with strides ``dgrid_strides``: per point and channel, separable sums with one
    axis's weights replaced by its slopes, times grad, accumulated over channels in order."""
    out_depth, out_height, out_width = out_sizes
    spatial = (x_strides[2], x_strides[3], x_strides[4])
    shift = -2 * grid_strides[4] if voxels else 0
    dgrid_shift = -2 * dgrid_strides[4] if voxels else 0
    for row in prange(batch * out_depth * out_height):
        n = row // (out_depth * out_height)
        d = (row // out_height) % out_depth
        h = row % out_height
        taps = np.empty((3, 4), np.int64)
        weights = np.empty((3, 4))
        slopes = np.empty((3, 4))
        offsets = np.empty(64, np.int64)
        for w in range(out_width):
            point = n * grid_strides[0] + d * grid_strides[1] + h * grid_strides[2] + w * grid_strides[3] + shift
            mx, my, mz = _point_taps(grid, point, grid_strides[4], sizes, padding, align_corners, voxels, w, h, d, taps,
                                     weights, slopes)
            out = n * grad_strides[0] + d * grad_strides[2] + h * grad_strides[3] + w * grad_strides[4]
            _tap_offsets(taps, sizes, spatial, offsets)
            gx = gy = gz = 0.0
            for c in range(channels):
                g = float(grad[out + c * grad_strides[1]])
                base = n * x_strides[0] + c * x_strides[1]
                # Separable: along x (weights and slopes), then y, then z, as the reference.
                total_x = total_y = total_z = 0.0
                for k in range(4):
                    plane_w = plane_sx = plane_sy = 0.0
                    for j in range(4):
                        row_w = row_s = 0.0
                        for i in range(4):
                            t = 16 * k + 4 * j + i
                            value = x[base + offsets[t]] if offsets[t] >= 0 else 0.0
                            row_w += value * weights[0, i]
                            row_s += value * slopes[0, i]
                        plane_w += row_w * weights[1, j]
                        plane_sx += row_s * weights[1, j]
                        plane_sy += row_w * slopes[1, j]
                    total_x += plane_sx * weights[2, k]
                    total_y += plane_sy * weights[2, k]
                    total_z += plane_w * slopes[2, k]
                gx += total_x * g
                gy += total_y * g
                gz += total_z * g
            p = n * dgrid_strides[0] + d * dgrid_strides[1] + h * dgrid_strides[2] + w * dgrid_strides[3] + dgrid_shift
            dgrid[p] = mx * gx
            dgrid[p + dgrid_strides[4]] = my * gy
            dgrid[p + 2 * dgrid_strides[4]] = mz * gz


@njit(parallel=True, cache=True, error_model="numpy")
def bicubic_dx_kernel(grad, grad_strides, grid, grid_strides, dx, dx_strides, bounds, batch, channels, sizes,
                      out_sizes, padding, align_corners, voxels):
    """dx (N, C, D, H, W), every element written; slab s owns planes bounds[s] .. bounds[s + 1] (plane = n * D + z)."""
    depth, height, width = sizes
    out_depth, out_height, out_width = out_sizes
    shift = -2 * grid_strides[4] if voxels else 0
    for slab in prange(bounds.size - 1):
        first, last = bounds[slab], bounds[slab + 1]
        zero_planes(Operand(dx, dx_strides), first, last, channels, sizes)
        taps = np.empty((3, 4), np.int64)
        weights = np.empty((3, 4))
        slopes = np.empty((3, 4))
        for n in range(first // depth, (last + depth - 1) // depth):
            z_lo = max(first - n * depth, 0)
            z_hi = min(last - n * depth, depth)
            if z_lo >= z_hi:
                continue
            for d in range(out_depth):
                for h in range(out_height):
                    for w in range(out_width):
                        point = n * grid_strides[0] + d * grid_strides[1] + h * grid_strides[2] \
                            + w * grid_strides[3] + shift
                        iz, _ = unnormalize(float(grid[point + 2 * grid_strides[4]]), depth, align_corners, voxels,
                                            float(d))
                        z0 = np.floor(iz)
                        _axis_taps(iz, z0, depth, padding, align_corners, taps[2], weights[2], slopes[2])
                        mine = False
                        for k in range(4):
                            mine = mine or z_lo <= taps[2, k] < z_hi
                        if not mine:
                            continue
                        ix, iy, _, x0, y0, _, _, _, _ = _cell(grid, point, grid_strides[4], sizes, align_corners,
                                                              voxels, w, h, d)
                        _axis_taps(ix, x0, width, padding, align_corners, taps[0], weights[0], slopes[0])
                        _axis_taps(iy, y0, height, padding, align_corners, taps[1], weights[1], slopes[1])
                        out = n * grad_strides[0] + d * grad_strides[2] + h * grad_strides[3] + w * grad_strides[4]
                        for k in range(4):
                            cz = taps[2, k]
                            if cz < z_lo or cz >= z_hi:
                                continue
                            for j in range(4):
                                cy = taps[1, j]
                                if cy < 0 or cy >= height:
                                    continue
                                for i in range(4):
                                    cx = taps[0, i]
                                    if cx < 0 or cx >= width:
                                        continue
                                    weight = weights[0, i] * weights[1, j] * weights[2, k]
                                    offset = n * dx_strides[0] + cz * dx_strides[2] + cy * dx_strides[3] \
                                        + cx * dx_strides[4]
                                    for c in range(channels):
                                        dx[offset + c * dx_strides[1]] += weight * grad[out + c * grad_strides[1]]
