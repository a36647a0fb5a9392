"""Forward kernel of the CPU engine: ``y = sample(x, grid)``, parallel over output rows.

Operands are flat 1-D arrays with explicit element strides, so any layout (NCDHW,
channels-last, sliced) is read in place; offsets are int64 throughout. Kernels are built
per (interpolation, padding) pair, with the modes fixed at compile time: the per-point
code then carries no branch on them, which makes it markedly faster.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import njit, prange

from .coords import NEAREST, nearest_tap, point_index
from .taps import trilinear_accumulate, trilinear_sum
from .tuning import VECTOR_CHANNELS


@functools.cache
def forward_kernel(interpolation: int, padding: int):
    """The forward kernel for one (interpolation, padding) pair; compiled on first use, cached on disk.

    ``kernel(x, x_strides, grid, grid_strides, y, y_strides, batch, channels, sizes, out_sizes,
    align_corners)`` fills ``y`` (N, C, Do, Ho, Wo) from ``x`` (N, C, D, H, W) sampled at ``grid``
    (N, Do, Ho, Wo, 3); ``sizes`` = (D, H, W), ``out_sizes`` = (Do, Ho, Wo), strides in
    elements in the logical order of each shape. Every element of ``y`` is written. Each
    sum runs over the taps in PyTorch's order, in float64, and is rounded once into ``y``.
    """
    nearest = interpolation == NEAREST

    @njit(parallel=True, cache=True, error_model="numpy")
    def kernel(x, x_strides, grid, grid_strides, y, y_strides, batch, channels, sizes, out_sizes, align_corners):
        out_depth, out_height, out_width = out_sizes
        spatial = (x_strides[2], x_strides[3], x_strides[4])
        # Contiguous channels: each tap updates all channels in one vectorised loop.
        vector_channels = x_strides[1] == 1 and channels >= VECTOR_CHANNELS
        for row in prange(batch * out_depth * out_height):
            n = row // (out_depth * out_height)
            d = (row // out_height) % out_depth
            h = row % out_height
            first_point = n * grid_strides[0] + d * grid_strides[1] + h * grid_strides[2]
            first_out = n * y_strides[0] + d * y_strides[2] + h * y_strides[3]
            base = n * x_strides[0]
            # One loop per channel arrangement: a single path per loop keeps each one fast.
            if nearest:
                for w in range(out_width):
                    ix, iy, iz, _, _, _ = point_index(grid, first_point + w * grid_strides[3], grid_strides[4], sizes,
                                                      padding, align_corners, True)
                    inside, offset, _ = nearest_tap(ix, iy, iz, sizes, spatial, 0, sizes[0])
                    out = first_out + w * y_strides[4]
                    for c in range(channels):
                        y[out + c * y_strides[1]] = x[base + c * x_strides[1] + offset] if inside else 0
            elif channels == 1:
                for w in range(out_width):
                    ix, iy, iz, _, _, _ = point_index(grid, first_point + w * grid_strides[3], grid_strides[4], sizes,
                                                      padding, align_corners, True)
                    y[first_out + w * y_strides[4]] = trilinear_sum(x, base, spatial, sizes, ix, iy, iz)
            elif vector_channels:
                totals = np.empty(channels)
                for w in range(out_width):
                    ix, iy, iz, _, _, _ = point_index(grid, first_point + w * grid_strides[3], grid_strides[4], sizes,
                                                      padding, align_corners, True)
                    for c in range(channels):
                        totals[c] = 0.0
                    trilinear_accumulate(totals, x, base, spatial, sizes, ix, iy, iz, channels)
                    out = first_out + w * y_strides[4]
                    for c in range(channels):
                        y[out + c * y_strides[1]] = totals[c]
            else:
                for w in range(out_width):
                    ix, iy, iz, _, _, _ = point_index(grid, first_point + w * grid_strides[3], grid_strides[4], sizes,
                                                      padding, align_corners, True)
                    out = first_out + w * y_strides[4]
                    for c in range(channels):
                        y[out + c * y_strides[1]] = trilinear_sum(x, base + c * x_strides[1], spatial, sizes, ix, iy,
                                                                  iz)

    return kernel
