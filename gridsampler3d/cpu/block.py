"""Phase A of the CPU kernels: a block of output points at a time, vectorised across the points.

Each helper walks ``count`` (at most ``BLOCK``) consecutive points of one output row in a
loop with no data-dependent branches and one store per scratch array per iteration, so
that LLVM turns it into SIMD code with hardware gathers (docs/cpu.md). Scratch arrays are
flat: ``array[k * BLOCK + i]`` is entry ``k`` (an axis side or a tap) of point ``i``.

Taps are numbered as PyTorch visits them: bit 0 steps x, bit 1 y, bit 2 z.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .coords import ROUNDER, source_index
from .tuning import BLOCK

helper = njit(cache=True, error_model="numpy", nogil=True, forceinline=True)


@helper
def block_coordinates(grid, first, step, component, count, sizes, padding, align_corners, forward, ix, iy, iz, mx,
                      my, mz):
    """Indices (ix, iy, iz) and multipliers (mx, my, mz) of ``count`` points, bitwise as the scalar rule.

    Point i's x, y, z components sit at ``first + i * step`` and ``component`` apart in
    the flat ``grid``. Reflection's rare far coordinates (and NaN) are redone exactly.
    """
    depth, height, width = sizes
    unresolved = 0
    for i in range(count):
        point = first + i * step
        ix[i], mx[i], done_x = source_index(float(grid[point]), width, padding, align_corners, forward, False)
        iy[i], my[i], done_y = source_index(float(grid[point + component]), height, padding, align_corners, forward,
                                            False)
        iz[i], mz[i], done_z = source_index(float(grid[point + 2 * component]), depth, padding, align_corners,
                                            forward, False)
        unresolved += not (done_x & done_y & done_z)
    if unresolved:
        for i in range(count):
            point = first + i * step
            ix[i], mx[i], _ = source_index(float(grid[point]), width, padding, align_corners, forward)
            iy[i], my[i], _ = source_index(float(grid[point + component]), height, padding, align_corners, forward)
            iz[i], mz[i], _ = source_index(float(grid[point + 2 * component]), depth, padding, align_corners, forward)


@helper
def tap_delta(tap, spatial):
    """Offset of tap ``tap`` from its cell's lowest corner, for (D, H, W) strides ``spatial``."""
    return (tap >> 2) * spatial[0] + ((tap >> 1) & 1) * spatial[1] + (tap & 1) * spatial[2]


@helper
def trilinear_cells(count, ix, iy, iz, sizes, spatial, sides, corner, inside):
    """Each point's cell: side weights, lowest-corner offset and in-volume taps.

    Fills ``sides[s * BLOCK + i]`` (s = 0..5: x low, x high, y low, y high, z low, z high;
    PyTorch's weights, low = floor + 1 - index, high = index - floor), ``corner[i]`` (the
    offset of the lowest corner under ``spatial`` strides; only meaningful with its
    taps' bits) and ``inside[i]`` (bit k set when tap k lies in the volume).
    """
    depth, height, width = sizes
    for i in range(count):
        x_low, y_low, z_low = np.floor(ix[i]), np.floor(iy[i]), np.floor(iz[i])
        sides[i] = x_low + 1.0 - ix[i]
        sides[BLOCK + i] = ix[i] - x_low
        sides[2 * BLOCK + i] = y_low + 1.0 - iy[i]
        sides[3 * BLOCK + i] = iy[i] - y_low
        sides[4 * BLOCK + i] = z_low + 1.0 - iz[i]
        sides[5 * BLOCK + i] = iz[i] - z_low
        x0, y0, z0 = np.int64(x_low), np.int64(y_low), np.int64(z_low)
        corner[i] = z0 * spatial[0] + y0 * spatial[1] + x0 * spatial[2]
        bits = 0
        for tap in range(8):
            cx, cy, cz = x0 + (tap & 1), y0 + ((tap >> 1) & 1), z0 + (tap >> 2)
            bits |= np.int64((cx >= 0) & (cx < width) & (cy >= 0) & (cy < height) & (cz >= 0) & (cz < depth)) << tap
        inside[i] = bits


@helper
def tap_weight(sides, tap, i):
    """Trilinear weight (wx * wy) * wz of tap ``tap`` of point ``i``, in PyTorch's association."""
    return (sides[(tap & 1) * BLOCK + i] * sides[(2 + ((tap >> 1) & 1)) * BLOCK + i]) \
        * sides[(4 + (tap >> 2)) * BLOCK + i]


@helper
def masked_offsets(count, corner, inside, spatial, offsets):
    """offsets[k * BLOCK + i]: tap k's offset, or 0 (a valid element) where the tap is outside.

    Lets the channel loops gather every tap without a branch; the tap's bit then selects
    whether its contribution counts.
    """
    for i in range(count):
        for tap in range(8):
            offset = corner[i] + tap_delta(tap, spatial)
            offsets[tap * BLOCK + i] = offset if (inside[i] >> tap) & 1 else 0


@helper
def nearest_cells(count, ix, iy, iz, sizes, spatial, offset, inside):
    """The nearest voxel (ties to even, as C nearbyint) of each point: offset (0 when outside) and 0/1 inside."""
    depth, height, width = sizes
    for i in range(count):
        cx = np.int64((ix[i] + ROUNDER) - ROUNDER)
        cy = np.int64((iy[i] + ROUNDER) - ROUNDER)
        cz = np.int64((iz[i] + ROUNDER) - ROUNDER)
        within = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height) & (cz >= 0) & (cz < depth)
        inside[i] = np.int64(within)
        at = cz * spatial[0] + cy * spatial[1] + cx * spatial[2]
        offset[i] = at if within else 0


@helper
def lowest_depths(count, iz, nearest, depth_of):
    """depth_of[i]: the lowest depth a point's taps touch (rint for nearest, floor otherwise)."""
    for i in range(count):
        depth_of[i] = np.int64((iz[i] + ROUNDER) - ROUNDER) if nearest else np.int64(np.floor(iz[i]))
