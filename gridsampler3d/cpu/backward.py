"""Backward kernels of the CPU engine: dgrid by gathering, dx by owner-computes scattering.

``dgrid`` needs nothing but the point itself, so it runs parallel over output rows. ``dx``
receives contributions from many points; instead of atomics or per-thread copies of dx,
its (n, z) planes are split into one slab per thread, balanced by the number of taps that
land in each plane, and each thread walks the points in order and adds only the taps
that fall in its own slab. Every voxel therefore sums its contributions in point order,
exactly as PyTorch's sequential loop does: the result is deterministic, independent of
the thread count, and in float64 bitwise equal to PyTorch. Extra memory: one int32 per
output point (the depth of its lowest tap) and one int64 per (n, z) plane.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .coords import BILINEAR, NEAREST, corner_weights, depth_base, nearest_tap, point_index, tap_sign, trilinear_tap


@njit(parallel=True, cache=True, error_model="numpy")
def grid_gradient_kernel(grad, grad_strides, x, x_strides, grid, grid_strides, dgrid, lowest_depth, batch,
                         channels, sizes, out_sizes, interpolation, padding, align_corners, want_dgrid):
    """Fill ``dgrid`` (N, Do, Ho, Wo, 3), contiguous, if ``want_dgrid``, and ``lowest_depth``.

    ``lowest_depth`` (N * Do * Ho * Wo,) int32 receives each point's lowest tap depth for
    the dx pass (an empty array skips it). The grid gradient of a point is
    sum over channels, then taps, of ±((x_tap * w_a) * w_b) * grad, in that order (PyTorch's),
    accumulated in float64, times the coordinate multiplier.
    """
    out_depth, out_height, out_width = out_sizes
    spatial_strides = (x_strides[2], x_strides[3], x_strides[4])
    want_depths = lowest_depth.size > 0
    for row in prange(batch * out_depth * out_height):
        n = row // (out_depth * out_height)
        d = (row // out_height) % out_depth
        h = row % out_height
        for w in range(out_width):
            point = n * grid_strides[0] + d * grid_strides[1] + h * grid_strides[2] + w * grid_strides[3]
            ix, iy, iz, mx, my, mz = point_index(grid, point, grid_strides[4], sizes, padding, align_corners,
                                                 False)
            flat_point = row * out_width + w
            if want_depths:
                lowest_depth[flat_point] = depth_base(interpolation, iz)
            if not want_dgrid:
                continue
            gx = gy = gz = 0.0
            if interpolation == BILINEAR:
                cell = corner_weights(ix, iy, iz)
                out = n * grad_strides[0] + d * grad_strides[2] + h * grad_strides[3] + w * grad_strides[4]
                for c in range(channels):
                    g = float(grad[out + c * grad_strides[1]])
                    base = n * x_strides[0] + c * x_strides[1]
                    for tap in range(8):
                        inside, offset, wx, wy, wz = trilinear_tap(tap, cell, sizes,
                                                                   spatial_strides, 0, sizes[0])
                        if inside:
                            value = x[base + offset]
                            gx += tap_sign(tap, 0) * (value * wy * wz * g)
                            gy += tap_sign(tap, 1) * (value * wx * wz * g)
                            gz += tap_sign(tap, 2) * (value * wx * wy * g)
            dgrid[3 * flat_point] = mx * gx
            dgrid[3 * flat_point + 1] = my * gy
            dgrid[3 * flat_point + 2] = mz * gz


@njit(cache=True, error_model="numpy")
def plan_slabs(lowest_depth, batch, depth, points_per_batch, interpolation, slab_count):
    """Split the N * D planes of dx into ``slab_count`` runs carrying about equal tap counts.

    Returns the slab bounds (slab_count + 1,) int64 in plane units (plane = n * D + z).
    """
    planes = batch * depth
    load = np.ones(planes, np.int64)  # a plane with no taps still costs its zeroing
    reach = 2 if interpolation == BILINEAR else 1
    for p in range(lowest_depth.size):
        n = p // points_per_batch
        for z in range(lowest_depth[p], lowest_depth[p] + reach):
            if 0 <= z < depth:
                load[n * depth + z] += 1
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


@njit(parallel=True, cache=True, error_model="numpy")
def input_gradient_kernel(grad, grad_strides, grid, grid_strides, dx, dx_strides, lowest_depth, bounds, batch,
                          channels, sizes, out_sizes, interpolation, padding, align_corners):
    """Fill ``dx`` (N, C, D, H, W): zero each slab of planes, then add its taps in point order.

    Every element of ``dx`` is written. ``bounds`` comes from :func:`plan_slabs`.
    """
    depth, height, width = sizes
    out_depth, out_height, out_width = out_sizes
    points_per_batch = out_depth * out_height * out_width
    spatial_strides = (dx_strides[2], dx_strides[3], dx_strides[4])
    reach = 2 if interpolation == BILINEAR else 1
    for slab in prange(bounds.size - 1):
        first, last = bounds[slab], bounds[slab + 1]
        for plane in range(first, last):
            n, z = plane // depth, plane % depth
            for c in range(channels):
                base = n * dx_strides[0] + c * dx_strides[1] + z * dx_strides[2]
                for yy in range(height):
                    for xx in range(width):
                        dx[base + yy * dx_strides[3] + xx * dx_strides[4]] = 0
        for n in range(first // depth, (last + depth - 1) // depth):
            z_lo = max(first - n * depth, 0)
            z_hi = min(last - n * depth, depth)
            if z_lo >= z_hi:
                continue
            for local in range(points_per_batch):
                p = n * points_per_batch + local
                z_base = lowest_depth[p]
                if z_base + reach <= z_lo or z_base >= z_hi:
                    continue
                w = local % out_width
                h = (local // out_width) % out_height
                d = local // (out_width * out_height)
                point = n * grid_strides[0] + d * grid_strides[1] + h * grid_strides[2] + w * grid_strides[3]
                ix, iy, iz, _, _, _ = point_index(grid, point, grid_strides[4], sizes, padding, align_corners,
                                                  False)
                out = n * grad_strides[0] + d * grad_strides[2] + h * grad_strides[3] + w * grad_strides[4]
                if interpolation == NEAREST:
                    inside, offset, _ = nearest_tap(ix, iy, iz, sizes, spatial_strides, z_lo, z_hi)
                    if inside:
                        for c in range(channels):
                            dx[n * dx_strides[0] + c * dx_strides[1] + offset] += grad[out + c * grad_strides[1]]
                    continue
                cell = corner_weights(ix, iy, iz)
                for c in range(channels):
                    g = float(grad[out + c * grad_strides[1]])
                    base = n * dx_strides[0] + c * dx_strides[1]
                    for tap in range(8):
                        inside, offset, wx, wy, wz = trilinear_tap(tap, cell, sizes,
                                                                   spatial_strides, z_lo, z_hi)
                        if inside:
                            dx[base + offset] += (wx * wy * wz) * g
