"""Forward kernel of the CPU engine: ``y = sample(x, grid)``, parallel over output rows.

Operands are flat 1-D arrays with explicit element strides, so any layout (NCDHW,
channels-last, sliced) is read in place; offsets are int64 throughout.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .tuning import VECTOR_CHANNELS
from .coords import NEAREST, corner_weights, nearest_tap, point_index, trilinear_tap


@njit(parallel=True, cache=True, error_model="numpy")
def grid_sampler3d_fwd_kernel(x, x_strides, grid, grid_strides, y, y_strides, batch, channels, sizes, out_sizes,
                              interpolation, padding, align_corners):
    """Fill ``y`` (N, C, Do, Ho, Wo) from ``x`` (N, C, D, H, W) sampled at ``grid`` (N, Do, Ho, Wo, 3).

    ``sizes`` = (D, H, W), ``out_sizes`` = (Do, Ho, Wo); strides are in elements, in the
    logical order of each shape. Every element of ``y`` is written. A point's cell is
    computed once; each tap then updates all channels' float64 sums (a contiguous,
    vectorised loop for channels-last data), so every sum still runs over the taps in
    PyTorch's order and is rounded once into ``y``.
    """
    out_depth, out_height, out_width = out_sizes
    spatial_strides = (x_strides[2], x_strides[3], x_strides[4])
    # Contiguous channels: each tap updates all channels in one vectorised loop.
    vector_channels = x_strides[1] == 1 and channels >= VECTOR_CHANNELS
    for row in prange(batch * out_depth * out_height):
        n = row // (out_depth * out_height)
        d = (row // out_height) % out_depth
        h = row % out_height
        totals = np.empty(channels)
        for w in range(out_width):
            point = n * grid_strides[0] + d * grid_strides[1] + h * grid_strides[2] + w * grid_strides[3]
            ix, iy, iz, _, _, _ = point_index(grid, point, grid_strides[4], sizes, padding, align_corners, True)
            out = n * y_strides[0] + d * y_strides[2] + h * y_strides[3] + w * y_strides[4]
            if interpolation == NEAREST:
                inside, offset, _ = nearest_tap(ix, iy, iz, sizes, spatial_strides, 0, sizes[0])
                for c in range(channels):
                    y[out + c * y_strides[1]] = x[n * x_strides[0] + c * x_strides[1] + offset] if inside else 0
                continue
            cell = corner_weights(ix, iy, iz)
            if vector_channels:
                for c in range(channels):
                    totals[c] = 0.0
                for tap in range(8):
                    inside, offset, wx, wy, wz = trilinear_tap(tap, cell, sizes, spatial_strides, 0, sizes[0])
                    if inside:
                        _accumulate(totals, x, n * x_strides[0] + offset, wx * wy * wz, channels)
                for c in range(channels):
                    y[out + c * y_strides[1]] = totals[c]
                continue
            for c in range(channels):
                base = n * x_strides[0] + c * x_strides[1]
                total = 0.0
                for tap in range(8):
                    inside, offset, wx, wy, wz = trilinear_tap(tap, cell, sizes, spatial_strides, 0, sizes[0])
                    if inside:
                        total += x[base + offset] * (wx * wy * wz)
                y[out + c * y_strides[1]] = total


@njit(cache=True, error_model="numpy", inline="always")
def _accumulate(totals, x, start, weight, channels):
    """totals[c] += x[start + c] * weight for every (contiguous) channel: one tap, in tap order."""
    for c in range(channels):
        totals[c] += x[start + c] * weight
