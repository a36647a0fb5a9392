"""NumPy float64 golden for 3-D grid sampling, forward and backward.

Readable and vectorised over output points, independent of torch. It reproduces the
semantics of PyTorch's CPU ``grid_sampler_3d`` / ``grid_sampler_3d_backward`` (SPEC.md
section 3) including the non-finite rules; ``dx`` is even accumulated in the same order
(point by point, tap by tap), so it is bitwise equal to PyTorch's float64 result.

All arrays are float64 in NCDHW layout:

    x     (N, C, Di, Hi, Wi)
    grid  (N, Do, Ho, Wo, 3)     grid[..., 0] is x (along W), 1 is y (H), 2 is z (D)
    grad  (N, C, Do, Ho, Wo)
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .modes import Interpolation, Padding

__all__ = ["grid_sampler3d_fwd", "grid_sampler3d_bwd", "source_index"]

INT_MAX = 2**31 - 1
INT_MIN = -(2**31)
# A coordinate that cannot be used (NaN, inf, beyond int range) becomes this, so that
# every tap lands out of bounds; -100 has no meaning beyond that.
OUT_OF_RANGE = -100.0
# Cap on the entries of the per-chunk (channels x points x taps) scatter arrays.
_SCATTER_CHUNK = 1 << 24


def unnormalize(coord, size: int, align_corners: bool):
    """Map a normalised coordinate in [-1, 1] to a voxel index; returns (index, slope)."""
    if align_corners:
        return (coord + 1) / 2 * (size - 1), (size - 1) / 2
    return ((coord + 1) * size - 1) / 2, size / 2


def clip_with_grad(index, size: int):
    """Clip to [0, size - 1]; the bounds themselves count as outside (gradient 0).

    NaN passes through unchanged with gradient 1, as in PyTorch's backward.
    """
    upper = size - 1
    outside = (index <= 0) | (index >= upper)
    clipped = np.where(index <= 0, 0.0, np.where(index >= upper, float(upper), index))
    return clipped, np.where(outside, 0.0, 1.0)


def reflect_with_grad(index, twice_low: int, twice_high: int):
    """Reflect about [twice_low / 2, twice_high / 2] by the even/odd-flip rule.

    Returns (index, gradient sign). A degenerate span reflects everything to 0 with
    gradient 0.
    """
    if twice_low == twice_high:
        return np.zeros_like(index), np.zeros_like(index)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    shifted = index - low
    sign = np.where(shifted < 0, -1.0, 1.0)
    distance = np.abs(shifted)
    extra = np.fmod(distance, span)
    flips = np.floor(distance / span)
    # C++ casts the flip count to int: a count past INT_MAX (or NaN) becomes INT_MIN, even.
    with np.errstate(invalid="ignore"):
        odd = (flips <= INT_MAX) & (np.fmod(flips, 2) == 1)
    reflected = np.where(odd, span - extra + low, extra + low)
    return reflected, np.where(odd, -sign, sign)


def to_safe_range(index):
    """Replace NaN, +-inf and values outside the int32 range by an out-of-bounds index."""
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(index) | (index > INT_MAX - 1) | (index < INT_MIN)
    return np.where(bad, OUT_OF_RANGE, index)


def source_index(coord, size: int, padding: Padding, align_corners: bool, *, forward: bool = False):
    """Voxel index of normalised coordinates along one axis of ``size`` voxels.

    Returns ``(index, multiplier)`` where ``multiplier`` is d index / d coord. With
    ``forward=True`` a NaN that border or reflection padding clips goes to ``size - 1``
    (C++ ``min(size - 1, max(NaN, 0))``), as PyTorch's forward does; its backward
    instead keeps the NaN, which then falls out of range.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        index, slope = unnormalize(coord, size, align_corners)
        multiplier = np.full_like(index, slope)
        if padding == Padding.REFLECTION:
            if align_corners:
                index, sign = reflect_with_grad(index, 0, 2 * (size - 1))
            else:
                index, sign = reflect_with_grad(index, -1, 2 * size - 1)
            multiplier = multiplier * sign
        if padding in (Padding.BORDER, Padding.REFLECTION):
            unclipped = index
            index, inside = clip_with_grad(index, size)
            multiplier = multiplier * inside
            if forward:
                index = np.where(np.isnan(unclipped), float(size - 1), index)
        return to_safe_range(index), multiplier


class Taps(NamedTuple):
    """The taps of P sample points, T taps each.

    offset (P, T) int64 linear voxel offsets (0 where invalid); valid (P, T) bool;
    weight (P, T) = wx * wy * wz; axis_weight (P, T, 3) = (wx, wy, wz); axis_sign (T, 3):
    the sign of d weight / d index along (x, y, z) for each tap.
    """

    offset: np.ndarray
    valid: np.ndarray
    weight: np.ndarray
    axis_weight: np.ndarray
    axis_sign: np.ndarray


def _voxel_taps(corners, sizes) -> tuple[np.ndarray, np.ndarray]:
    """Integer tap coordinates (P, 3) in (x, y, z) order → (offset, valid)."""
    depth, height, width = sizes
    cx, cy, cz = corners[:, 0], corners[:, 1], corners[:, 2]
    valid = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height) & (cz >= 0) & (cz < depth)
    offset = np.where(valid, (cz * height + cy) * width + cx, 0)
    return offset, valid


def _bilinear_taps(index, sizes) -> Taps:
    """Eight taps: corners (x, y, z) ∈ {floor, floor + 1}³, z outermost, x innermost."""
    low = np.floor(index)
    weight_high = index - low
    weight_low = (low + 1) - index
    low = low.astype(np.int64)
    offsets, valids, axis_weights, axis_signs = [], [], [], []
    for dz in (0, 1):
        for dy in (0, 1):
            for dx in (0, 1):
                step = np.array([dx, dy, dz])
                offset, valid = _voxel_taps(low + step, sizes)
                offsets.append(offset)
                valids.append(valid)
                axis_weights.append(np.where(step == 1, weight_high, weight_low))
                axis_signs.append(np.where(step == 1, 1.0, -1.0))
    axis_weight = np.stack(axis_weights, 1)
    weight = axis_weight[..., 0] * axis_weight[..., 1] * axis_weight[..., 2]
    return Taps(np.stack(offsets, 1), np.stack(valids, 1), weight, axis_weight, np.stack(axis_signs))


def _nearest_taps(index, sizes) -> Taps:
    """One tap at the nearest voxel, ties to even (C ``nearbyint``)."""
    offset, valid = _voxel_taps(np.rint(index).astype(np.int64), sizes)
    points = index.shape[0]
    return Taps(offset[:, None], valid[:, None], np.ones((points, 1)), np.ones((points, 1, 3)), np.zeros((1, 3)))


def _sample_points(grid_n, sizes, interpolation, padding, align_corners, forward):
    """Taps and d index / d grid multipliers (P, 3) for one batch's grid (Do, Ho, Wo, 3)."""
    coords = grid_n.reshape(-1, 3)
    depth, height, width = sizes
    axes = [source_index(coords[:, axis], size, padding, align_corners, forward=forward)
            for axis, size in enumerate((width, height, depth))]
    index = np.stack([axis[0] for axis in axes], axis=-1)
    multiplier = np.stack([axis[1] for axis in axes], axis=-1)
    if interpolation == Interpolation.BILINEAR:
        return _bilinear_taps(index, sizes), multiplier
    if interpolation == Interpolation.NEAREST:
        return _nearest_taps(index, sizes), multiplier
    raise NotImplementedError(f"{interpolation.name.lower()} interpolation is not available in 3-D yet")


def grid_sampler3d_fwd(x, grid, interpolation: Interpolation, padding: Padding, align_corners: bool):
    """Sample ``x`` (N, C, Di, Hi, Wi) at ``grid`` (N, Do, Ho, Wo, 3) → (N, C, Do, Ho, Wo)."""
    batch, channels = x.shape[:2]
    sizes = x.shape[2:]
    out_sizes = grid.shape[1:4]
    output = np.zeros((batch, channels) + out_sizes)
    for n in range(batch):
        taps, _ = _sample_points(grid[n], sizes, interpolation, padding, align_corners, forward=True)
        values = x[n].reshape(channels, -1)
        accumulated = np.zeros((channels, taps.offset.shape[0]))
        with np.errstate(invalid="ignore", over="ignore"):
            for t in range(taps.offset.shape[1]):
                tap_values = values[:, taps.offset[:, t]]
                if interpolation != Interpolation.NEAREST:
                    tap_values = tap_values * taps.weight[:, t]
                accumulated += np.where(taps.valid[:, t], tap_values, 0.0)
        output[n] = accumulated.reshape((channels,) + out_sizes)
    return output


def grid_sampler3d_bwd(grad, x, grid, interpolation: Interpolation, padding: Padding,
                       align_corners: bool, output_mask=(True, True)):
    """Gradients of ``sum(grad * grid_sampler3d_fwd(x, grid))``.

    Returns ``(dx, dgrid)`` of shapes (N, C, Di, Hi, Wi) and (N, Do, Ho, Wo, 3); an output
    whose ``output_mask`` entry is False is ``None``.
    """
    want_dx, want_dgrid = output_mask
    batch, channels = x.shape[:2]
    sizes = x.shape[2:]
    voxels = int(np.prod(sizes))
    dx = np.zeros(x.shape) if want_dx else None
    dgrid = np.zeros(grid.shape) if want_dgrid else None
    for n in range(batch):
        taps, multiplier = _sample_points(grid[n], sizes, interpolation, padding, align_corners,
                                          forward=False)
        grad_n = grad[n].reshape(channels, -1)
        with np.errstate(invalid="ignore", over="ignore"):
            if want_dx:
                dx[n] = _scatter_dx(grad_n, taps, voxels).reshape(x.shape[1:])
            if want_dgrid and interpolation != Interpolation.NEAREST:
                grad_index = _contract_grid_gradient(grad_n, x[n].reshape(channels, voxels), taps)
                dgrid[n] = (multiplier * grad_index).reshape(grid.shape[1:])
    return dx, dgrid


def _contract_grid_gradient(grad_n, values, taps: Taps):
    """d loss / d index (P, 3): sum over channels and taps of ±x_tap * grad * the other two weights.

    Channels outermost, taps inside, each term as ((x_tap * w_a) * w_b) * grad: PyTorch's
    order, so that float64 results are bitwise equal to it.
    """
    grad_index = np.zeros((taps.offset.shape[0], 3))
    other_axes = ((1, 2), (0, 2), (0, 1))
    for channel in range(grad_n.shape[0]):
        for t in range(taps.offset.shape[1]):
            tap_values = values[channel, taps.offset[:, t]]
            for axis, (a, b) in enumerate(other_axes):
                term = tap_values * taps.axis_weight[:, t, a] * taps.axis_weight[:, t, b] * grad_n[channel]
                signed = term if taps.axis_sign[t, axis] > 0 else -term
                grad_index[:, axis] += np.where(taps.valid[:, t], signed, 0.0)
    return grad_index


def _scatter_dx(grad_n, taps: Taps, voxels: int):
    """Push ``grad_n`` (C, P) through the taps into a (C, voxels) array.

    Contributions are summed point by point, then tap by tap (``np.bincount`` adds in
    order), which is PyTorch's CPU order: the result is deterministic and exact.
    """
    channels, points = grad_n.shape
    n_taps = taps.offset.shape[1]
    dx = np.zeros((channels, voxels))
    if channels == 0 or points == 0:
        return dx
    valid = taps.valid.ravel()
    offset = taps.offset.ravel()[valid]
    block = max(1, _SCATTER_CHUNK // (points * n_taps))
    for start in range(0, channels, block):
        stop = min(channels, start + block)
        contributions = taps.weight[None, :, :] * grad_n[start:stop, :, None]  # (c, P, T)
        contributions = contributions.reshape(stop - start, -1)[:, valid]
        target = offset[None, :] + voxels * np.arange(stop - start)[:, None]
        summed = np.bincount(target.ravel(), contributions.ravel(), minlength=(stop - start) * voxels)
        dx[start:stop] = summed.reshape(stop - start, voxels)
    return dx
