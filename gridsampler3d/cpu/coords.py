"""Coordinate rules of the CPU engine: unnormalise, pad (clip / reflect), their slopes.

Scalar Numba twins of :mod:`gridsampler3d.reference`'s vectorised rules, written with the
same operations in the same order, in float64, so that the engine's indices and
multipliers equal the golden's bit for bit. The kernels call these and nothing else for
coordinates.
"""
from __future__ import annotations

import math

import numpy as np

from numba import njit

INT_MAX = 2147483647
INT_MIN = -2147483648
OUT_OF_RANGE = -100.0

# Small ints that travel into the kernels (the values of modes.Interpolation / Padding).
BILINEAR, NEAREST = 0, 1
ZEROS, BORDER, REFLECTION = 0, 1, 2

kernel = njit(cache=True, error_model="numpy", nogil=True)


@kernel
def reflect_with_grad(index, twice_low, twice_high):
    """Reflect about [twice_low / 2, twice_high / 2]: (index, gradient sign)."""
    if twice_low == twice_high:
        return 0.0, 0.0
    low = twice_low / 2.0
    span = (twice_high - twice_low) / 2.0
    shifted = index - low
    sign = 1.0
    if shifted < 0:
        sign = -1.0
        shifted = -shifted
    extra = np.fmod(shifted, span)
    flips = math.floor(shifted / span)
    # C++ casts the flip count to int: past INT_MAX (or NaN) it is INT_MIN, which is even.
    odd = flips <= INT_MAX and int(flips) % 2 == 1
    if odd:
        return span - extra + low, -sign
    return extra + low, sign


@kernel
def clip_with_grad(index, size):
    """Clip to [0, size - 1]; the bounds count as outside (gradient 0); NaN passes with 1."""
    if index <= 0:
        return 0.0, 0.0
    upper = float(size - 1)
    if index >= upper:
        return upper, 0.0
    return index, 1.0


@kernel
def to_safe_range(index):
    """NaN, +-inf and values outside the int32 range become an out-of-bounds index."""
    if not math.isfinite(index) or index > INT_MAX - 1 or index < INT_MIN:
        return OUT_OF_RANGE
    return index


@kernel
def source_index(coord, size, padding, align_corners, forward):
    """Voxel index and d index / d coord of one normalised coordinate along ``size`` voxels.

    ``forward`` selects PyTorch's forward treatment of a NaN under border/reflection
    padding (clipped to ``size - 1``); the backward lets it fall out of range.
    """
    if align_corners:
        index = (coord + 1.0) / 2.0 * (size - 1)
        multiplier = (size - 1) / 2.0
    else:
        index = ((coord + 1.0) * size - 1.0) / 2.0
        multiplier = size / 2.0
    if padding == REFLECTION:
        if align_corners:
            index, sign = reflect_with_grad(index, 0, 2 * (size - 1))
        else:
            index, sign = reflect_with_grad(index, -1, 2 * size - 1)
        multiplier = multiplier * sign
    if padding != ZEROS:
        was_nan = index != index
        index, inside = clip_with_grad(index, size)
        multiplier = multiplier * inside
        if forward and was_nan:
            index = float(size - 1)
    return to_safe_range(index), multiplier


@kernel
def point_index(grid, offset, step, sizes, padding, align_corners, forward):
    """(ix, iy, iz, mx, my, mz): indices and multipliers of the grid point at ``offset``.

    ``grid`` is flat; its x, y, z components sit ``step`` elements apart; ``sizes`` is
    (D, H, W).
    """
    ix, mx = source_index(float(grid[offset]), sizes[2], padding, align_corners, forward)
    iy, my = source_index(float(grid[offset + step]), sizes[1], padding, align_corners, forward)
    iz, mz = source_index(float(grid[offset + 2 * step]), sizes[0], padding, align_corners, forward)
    return ix, iy, iz, mx, my, mz


@kernel
def point_taps(interpolation, ix, iy, iz, sizes, strides, z_lo, z_hi, offsets, weights, signs):
    """The in-bounds taps of one point whose depth index lies in [z_lo, z_hi), in PyTorch's order.

    Fills ``offsets[k]`` (spatial offset z*sD + y*sH + x*sW with ``strides`` = (sD, sH, sW)),
    ``weights[k]`` = (wx*wy*wz, wx, wy, wz) and ``signs[k]`` = (sx, sy, sz), the sign of
    d weight / d index per axis; returns the number of taps. Bilinear: the 8 corners, z
    outermost, x innermost; nearest: the voxel at rint (ties to even).
    """
    depth, height, width = sizes
    if interpolation == NEAREST:
        cx, cy, cz = int(np.rint(ix)), int(np.rint(iy)), int(np.rint(iz))
        if 0 <= cx < width and 0 <= cy < height and max(z_lo, 0) <= cz < min(z_hi, depth):
            offsets[0] = cz * strides[0] + cy * strides[1] + cx * strides[2]
            weights[0, 0] = 1.0
            return 1
        return 0
    x0, y0, z0 = math.floor(ix), math.floor(iy), math.floor(iz)
    low = (x0 + 1 - ix, y0 + 1 - iy, z0 + 1 - iz)
    high = (ix - x0, iy - y0, iz - z0)
    count = 0
    for tap in range(8):
        step_x, step_y, step_z = tap & 1, (tap >> 1) & 1, tap >> 2
        cx, cy, cz = int(x0) + step_x, int(y0) + step_y, int(z0) + step_z
        if not (0 <= cx < width and 0 <= cy < height and max(z_lo, 0) <= cz < min(z_hi, depth)):
            continue
        wx = high[0] if step_x else low[0]
        wy = high[1] if step_y else low[1]
        wz = high[2] if step_z else low[2]
        offsets[count] = cz * strides[0] + cy * strides[1] + cx * strides[2]
        weights[count, 0] = wx * wy * wz
        weights[count, 1] = wx
        weights[count, 2] = wy
        weights[count, 3] = wz
        signs[count, 0] = 1.0 if step_x else -1.0
        signs[count, 1] = 1.0 if step_y else -1.0
        signs[count, 2] = 1.0 if step_z else -1.0
        count += 1
    return count


@kernel
def depth_base(interpolation, iz):
    """The lowest depth index a point's taps can touch (floor for bilinear, rint for nearest)."""
    if interpolation == NEAREST:
        return int(np.rint(iz))
    return int(math.floor(iz))
