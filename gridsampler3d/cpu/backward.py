"""Backward kernels of the CPU engine: one owner-computes pass for dx and dgrid.

``dx`` receives contributions from many points. Instead of atomics or per-thread copies
of dx, its (n, z) planes are split into one slab per thread, balanced by the number of
taps that land in each plane; each thread walks the points in order and adds only the
taps that fall in its own slab, and computes the grid gradient of the points whose
lowest tap plane it owns. Every voxel therefore sums its contributions in point order,
as PyTorch's sequential loop does: results are deterministic, independent of the thread
count, and for float64 bitwise equal to PyTorch's.

Extra memory: one int32 per output point (the depth of its lowest tap) and one int64 per
(n, z) plane.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .coords import (BILINEAR, NEAREST, corner_weights, depth_base, nearest_tap, point_index, source_index,
                     tap_sign, trilinear_tap)
from .tuning import PLAN_SAMPLES, VECTOR_CHANNELS



@njit(parallel=True, cache=True, error_model="numpy")
def lowest_depth_kernel(grid, grid_strides, lowest_depth, batch, sizes, out_sizes, interpolation, padding,
                        align_corners):
    """``lowest_depth[p]`` (N * Do * Ho * Wo,) int32: the lowest depth index point p's taps touch."""
    out_depth, out_height, out_width = out_sizes
    for row in prange(batch * out_depth * out_height):
        n = row // (out_depth * out_height)
        d = (row // out_height) % out_depth
        h = row % out_height
        for w in range(out_width):
            point = n * grid_strides[0] + d * grid_strides[1] + h * grid_strides[2] + w * grid_strides[3]
            iz, _ = source_index(float(grid[point + 2 * grid_strides[4]]), sizes[0], padding, align_corners, False)
            lowest_depth[row * out_width + w] = depth_base(interpolation, iz)


@njit(cache=True, error_model="numpy")
def plan_slabs(lowest_depth, batch, depth, points_per_batch, interpolation, slab_count):
    """Split the N * D planes of dx into ``slab_count`` runs carrying about equal work.

    Returns the slab bounds (slab_count + 1,) int64 in plane units (plane = n * D + z).
    The load is estimated from a sample of the points.
    """
    planes = batch * depth
    load = np.ones(planes, np.int64)  # a plane with no taps still costs its zeroing
    reach = 2 if interpolation == BILINEAR else 1
    stride = max(1, lowest_depth.size // PLAN_SAMPLES)
    for p in range(0, lowest_depth.size, stride):
        n = p // points_per_batch
        for z in range(lowest_depth[p], lowest_depth[p] + reach):
            if 0 <= z < depth:
                load[n * depth + z] += stride
    total = load.sum()
    bounds = np.empty(slab_count + 1, np.int64)
    bounds[0] = 0
    running = 0
    plane = 0
    for slab in range(1, slab_count):
        target = total * slab // slab_count
        while plane < planes and running + load[plane] <= target:
            running += load[plane]
            plane += 1
        bounds[slab] = plane
    bounds[slab_count] = planes
    return bounds


@njit(cache=True, error_model="numpy")
def is_coherent(lowest_depth, out_width):
    """Whether neighbouring points mostly share their depth: a smooth grid, not a random one.

    Sampled; decides only whether dx and dgrid share one pass (faster for smooth grids) or
    take one each (faster for random grids, whose gathers and scatters thrash the cache).
    """
    stride = max(1, lowest_depth.size // PLAN_SAMPLES)
    near = pairs = 0
    for p in range(0, lowest_depth.size - 1, stride):
        if (p + 1) % out_width != 0:
            pairs += 1
            near += abs(lowest_depth[p + 1] - lowest_depth[p]) <= 1
    return near >= 0.9 * pairs


@njit(cache=True, error_model="numpy", inline="always")
def zero_planes(dx, dx_strides, first, last, channels, sizes):
    """Zero the (n, z) planes first .. last - 1 (plane = n * D + z) of dx (N, C, D, H, W), every channel."""
    depth, height, width = sizes
    for plane in range(first, last):
        n, z = plane // depth, plane % depth
        for c in range(channels):
            base = n * dx_strides[0] + c * dx_strides[1] + z * dx_strides[2]
            for yy in range(height):
                for xx in range(width):
                    dx[base + yy * dx_strides[3] + xx * dx_strides[4]] = 0


@njit(cache=True, error_model="numpy", inline="always")
def scatter_channels(dx, dx_start, grad, grad_start, weight, channels):
    """dx[dx_start + c] += weight * grad[grad_start + c] for every (contiguous) channel."""
    for c in range(channels):
        dx[dx_start + c] += weight * grad[grad_start + c]


@njit(parallel=True, cache=True, error_model="numpy")
def grid_sampler3d_bwd_kernel(grad, grad_strides, x, x_strides, grid, grid_strides, dx, dx_strides, dgrid,
                              lowest_depth, bounds, batch, channels, sizes, out_sizes, interpolation, padding,
                              align_corners, want_dx, want_dgrid):
    """Fill ``dx`` (N, C, D, H, W) if ``want_dx`` and ``dgrid`` (N * Do * Ho * Wo * 3,) if ``want_dgrid``.

    Every element of an output asked for is written. ``lowest_depth`` comes from
    :func:`lowest_depth_kernel`, ``bounds`` from :func:`plan_slabs`. The grid gradient is
    the sum over channels (outer) and taps (inner) of ±((x_tap * w_a) * w_b) * grad, in
    float64 and in PyTorch's order, times the coordinate multiplier.

    Both outputs can be computed in one call; for a random grid two calls (one per output,
    see :func:`is_coherent`) are faster, as each then keeps only one large array hot.
    """
    depth, height, width = sizes
    out_depth, out_height, out_width = out_sizes
    points_per_batch = out_depth * out_height * out_width
    x_spatial = (x_strides[2], x_strides[3], x_strides[4])
    dx_spatial = (dx_strides[2], dx_strides[3], dx_strides[4])
    reach = 2 if interpolation == BILINEAR else 1
    # Contiguous channels: each tap's dx update loops over the channels innermost, vectorised.
    vector_channels = channels >= VECTOR_CHANNELS and grad_strides[1] == 1 and (not want_dx or dx_strides[1] == 1)
    for slab in prange(bounds.size - 1):
        first, last = bounds[slab], bounds[slab + 1]
        if want_dx:
            zero_planes(dx, dx_strides, first, last, channels, sizes)
        for n in range(first // depth, (last + depth - 1) // depth):
            z_lo = max(first - n * depth, 0)
            z_hi = min(last - n * depth, depth)
            if z_lo >= z_hi:
                continue
            p = n * points_per_batch
            for d in range(out_depth):
                for h in range(out_height):
                    for w in range(out_width):
                        z_base = lowest_depth[p]
                        touches = want_dx and z_base + reach > z_lo and z_base < z_hi
                        owns = want_dgrid and z_lo <= min(max(z_base, 0), depth - 1) < z_hi
                        if touches or owns:
                            _backward_point(grad, grad_strides, x, x_strides, x_spatial, grid, grid_strides, dx,
                                            dx_strides, dx_spatial, dgrid, p, n, d, h, w, channels, sizes,
                                            interpolation, padding, align_corners, touches, owns, z_lo, z_hi,
                                            vector_channels)
                        p += 1


@njit(cache=True, error_model="numpy", inline="always")
def _backward_point(grad, grad_strides, x, x_strides, x_spatial, grid, grid_strides, dx, dx_strides, dx_spatial,
                    dgrid, p, n, d, h, w, channels, sizes, interpolation, padding, align_corners, touches, owns,
                    z_lo, z_hi, vector_channels):
    """One output point's share of the backward: its dgrid if it ``owns`` it, and its dx taps in [z_lo, z_hi)."""
    point = n * grid_strides[0] + d * grid_strides[1] + h * grid_strides[2] + w * grid_strides[3]
    ix, iy, iz, mx, my, mz = point_index(grid, point, grid_strides[4], sizes, padding, align_corners, False)
    out = n * grad_strides[0] + d * grad_strides[2] + h * grad_strides[3] + w * grad_strides[4]
    if interpolation == NEAREST:
        if owns:
            dgrid[3 * p] = dgrid[3 * p + 1] = dgrid[3 * p + 2] = 0.0
        if touches:
            inside, offset, _ = nearest_tap(ix, iy, iz, sizes, dx_spatial, z_lo, z_hi)
            if inside:
                for c in range(channels):
                    dx[n * dx_strides[0] + c * dx_strides[1] + offset] += grad[out + c * grad_strides[1]]
        return
    cell = corner_weights(ix, iy, iz)
    if owns:
        gx = gy = gz = 0.0
        for c in range(channels):
            g = float(grad[out + c * grad_strides[1]])
            base = n * x_strides[0] + c * x_strides[1]
            for tap in range(8):
                inside, offset, wx, wy, wz = trilinear_tap(tap, cell, sizes, x_spatial, 0, sizes[0])
                if inside:
                    value = x[base + offset]
                    gx += tap_sign(tap, 0) * (value * wy * wz * g)
                    gy += tap_sign(tap, 1) * (value * wx * wz * g)
                    gz += tap_sign(tap, 2) * (value * wx * wy * g)
        dgrid[3 * p] = mx * gx
        dgrid[3 * p + 1] = my * gy
        dgrid[3 * p + 2] = mz * gz
    if touches and vector_channels:
        for tap in range(8):
            inside, offset, wx, wy, wz = trilinear_tap(tap, cell, sizes, dx_spatial, z_lo, z_hi)
            if inside:
                scatter_channels(dx, n * dx_strides[0] + offset, grad, out, wx * wy * wz, channels)
    elif touches:
        for c in range(channels):
            g = float(grad[out + c * grad_strides[1]])
            base = n * dx_strides[0] + c * dx_strides[1]
            for tap in range(8):
                inside, offset, wx, wy, wz = trilinear_tap(tap, cell, sizes, dx_spatial, z_lo, z_hi)
                if inside:
                    dx[base + offset] += (wx * wy * wz) * g
