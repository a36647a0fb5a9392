"""The trilinear tap loops of the CPU forward kernels.

Each visits the eight corners of a point's cell z outermost, then y, then x (PyTorch's
order), skips a corner outside the volume, and is inlined into its kernel, where the
loops unroll. ``spatial`` are the (D, H, W) element strides, ``sizes`` = (D, H, W).
"""
from __future__ import annotations

from numba import njit

from .coords import axis_cell

inline = njit(cache=True, error_model="numpy", inline="always")


@inline
def trilinear_sum(x, base, spatial, sizes, ix, iy, iz):
    """sum over taps of x[tap] * (wx * wy * wz) for one channel starting at ``base``, in float64."""
    depth, height, width = sizes
    x0, wx_low, wx_high = axis_cell(ix)
    y0, wy_low, wy_high = axis_cell(iy)
    z0, wz_low, wz_high = axis_cell(iz)
    total = 0.0
    for step_z in range(2):
        cz = z0 + step_z
        if cz < 0 or cz >= depth:
            continue
        wz = wz_high if step_z else wz_low
        for step_y in range(2):
            cy = y0 + step_y
            if cy < 0 or cy >= height:
                continue
            wy = wy_high if step_y else wy_low
            for step_x in range(2):
                cx = x0 + step_x
                if cx < 0 or cx >= width:
                    continue
                wx = wx_high if step_x else wx_low
                total += x[base + cz * spatial[0] + cy * spatial[1] + cx * spatial[2]] * (wx * wy * wz)
    return total


@inline
def trilinear_accumulate(totals, x, base, spatial, sizes, ix, iy, iz, channels):
    """totals[c] += x[tap + c] * (wx * wy * wz) over the taps, in tap order, for contiguous channels.

    The channel loop is innermost and vectorised. (With strided channels the same order
    would touch one page per channel per tap: there the kernels loop channels outermost.)
    """
    depth, height, width = sizes
    x0, wx_low, wx_high = axis_cell(ix)
    y0, wy_low, wy_high = axis_cell(iy)
    z0, wz_low, wz_high = axis_cell(iz)
    for step_z in range(2):
        cz = z0 + step_z
        if cz < 0 or cz >= depth:
            continue
        wz = wz_high if step_z else wz_low
        for step_y in range(2):
            cy = y0 + step_y
            if cy < 0 or cy >= height:
                continue
            wy = wy_high if step_y else wy_low
            for step_x in range(2):
                cx = x0 + step_x
                if cx < 0 or cx >= width:
                    continue
                wx = wx_high if step_x else wx_low
                weight = wx * wy * wz
                tap = base + cz * spatial[0] + cy * spatial[1] + cx * spatial[2]
                for c in range(channels):
                    totals[c] += x[tap + c] * weight
