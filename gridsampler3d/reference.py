"""NumPy float64 golden for 3-D grid sampling, forward and backward.

Readable and vectorised over output points, independent of torch. It reproduces the
semantics of PyTorch's CPU ``grid_sampler_3d`` / ``grid_sampler_3d_backward``
(docs/semantics.md) including the non-finite rules; ``dx`` is even accumulated in the same order
(point by point, tap by tap), so it is bitwise equal to PyTorch's float64 result.

All arrays are float64 in NCDHW layout:

    x     (N, C, Di, Hi, Wi)
    grid  (N, Do, Ho, Wo, 3)     grid[..., 0] is x (along W), 1 is y (H), 2 is z (D)
    grad  (N, C, Do, Ho, Wo)

Every kind of field (:class:`.sampling.FieldKind`) runs through :func:`sample` and
:func:`sample_backward`. A displacement (N, 3, Do, Ho, Wo) holds (dz, dy, dx) in voxels,
and output point (d, h, w) samples at voxel position (w + dx, h + dy, d + dz), each sum
formed once in float64 (:func:`warp_positions`); padding then applies exactly as to an
unnormalised grid coordinate. :func:`grid_sampler3d_fwd` / :func:`grid_sampler3d_bwd` and
:func:`warp_fwd` / :func:`warp_bwd` name the two kinds' goldens with the modes spelled out.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .affine import theta_gradient, voxel_matrix
from .bspline import dense_displacement, tables
from .modes import Interpolation, Padding
from .sampling import FieldKind, Gradients, Outputs, Sampling

__all__ = [
    "positions",
    "sample",
    "sample_backward",
    "grid_sampler3d_fwd",
    "grid_sampler3d_bwd",
    "warp_fwd",
    "warp_bwd",
    "warp_positions",
    "source_index",
    "cubic_coefficients",
    "cubic_slopes",
    "pad_tap",
]

# The numbers of the rules, here once: the engines' coordinate rules (cpu/coords.py,
# gpu/coords.py) and the torch composite take them from this module.
INT_MAX = 2**31 - 1
INT_MIN = -(2**31)
# A coordinate that cannot be used (NaN, inf, beyond int range) becomes this, so that
# every tap lands out of bounds; -100 has no meaning beyond that.
OUT_OF_RANGE = -100.0
CUBIC_A = -0.75  # the cubic convolution constant of PyTorch's (and OpenCV's) bicubic
# Cap on the entries of the per-chunk (channels x points x taps) scatter arrays.
_SCATTER_CHUNK = 1 << 24


def unnormalize(coord, size: int, align_corners: bool, kind: FieldKind = FieldKind.GRID):
    """Map a normalised coordinate in [-1, 1] to a voxel index; returns (index, slope).

    Where the field's positions are in voxels already (``kind.in_voxels``: a displacement
    from the output point), the index is the coordinate itself, with slope 1.
    """
    if kind.in_voxels:
        return coord, 1.0
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


def source_index(
    coord, size: int, padding: Padding, align_corners: bool, *, forward: bool = False, kind: FieldKind = FieldKind.GRID
):
    """Voxel index of normalised coordinates along one axis of ``size`` voxels.

    Returns ``(index, multiplier)`` where ``multiplier`` is d index / d coord. With
    ``forward=True`` a NaN that border or reflection padding clips goes to ``size - 1``
    (C++ ``min(size - 1, max(NaN, 0))``), as PyTorch's forward does; its backward
    instead keeps the NaN, which then falls out of range. ``kind``: see :func:`unnormalize`.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        index, slope = unnormalize(coord, size, align_corners, kind)
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
    weight (P, T) = wx * wy * wz; axis_weight (P, T, 3) = (wx, wy, wz); axis_slope
    (P or 1, T, 3): d (axis weight) / d index along (x, y, z).
    """

    offset: np.ndarray
    valid: np.ndarray
    weight: np.ndarray
    axis_weight: np.ndarray
    axis_slope: np.ndarray


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
    offsets, valids, axis_weights, axis_slopes = [], [], [], []
    for dz in (0, 1):
        for dy in (0, 1):
            for dx in (0, 1):
                step = np.array([dx, dy, dz])
                offset, valid = _voxel_taps(low + step, sizes)
                offsets.append(offset)
                valids.append(valid)
                axis_weights.append(np.where(step == 1, weight_high, weight_low))
                axis_slopes.append(np.where(step == 1, 1.0, -1.0))
    axis_weight = np.stack(axis_weights, 1)
    weight = axis_weight[..., 0] * axis_weight[..., 1] * axis_weight[..., 2]
    return Taps(np.stack(offsets, 1), np.stack(valids, 1), weight, axis_weight, np.stack(axis_slopes)[None])


def _nearest_taps(index, sizes) -> Taps:
    """One tap at the nearest voxel, ties to even (C ``nearbyint``)."""
    offset, valid = _voxel_taps(np.rint(index).astype(np.int64), sizes)
    points = index.shape[0]
    return Taps(offset[:, None], valid[:, None], np.ones((points, 1)), np.ones((points, 1, 3)), np.zeros((1, 1, 3)))


def cubic_coefficients(t):
    """Weights (4, P) of taps floor - 1 .. floor + 2 at fraction ``t`` = index - floor(index).

    Keys' cubic convolution with A = -0.75, written as PyTorch evaluates it.
    """
    a = CUBIC_A

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)])


def cubic_slopes(t):
    """d weight / d t (4, P) of :func:`cubic_coefficients` (PyTorch's gradient coefficients, negated)."""
    a = CUBIC_A
    x0, x1, x2, x3 = -1 - t, -t, 1 - t, 2 - t
    return -np.stack(
        [
            (-3 * a * x0 - 10 * a) * x0 - 8 * a,
            (-3 * (a + 2) * x1 - 2 * (a + 3)) * x1,
            (3 * (a + 2) * x2 - 2 * (a + 3)) * x2,
            (3 * a * x3 - 10 * a) * x3 + 8 * a,
        ]
    )


def pad_tap(coord, size: int, padding: Padding, align_corners: bool):
    """Where padding sends the integer tap coordinate ``coord``: PyTorch's ``compute_coordinates``.

    Border clips, reflection reflects and clips; anything then unusable falls out of range.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        if padding == Padding.REFLECTION:
            if align_corners:
                coord, _ = reflect_with_grad(coord, 0, 2 * (size - 1))
            else:
                coord, _ = reflect_with_grad(coord, -1, 2 * size - 1)
        if padding != Padding.ZEROS:
            coord, _ = clip_with_grad(coord, size)
        # C++ truncates toward zero; every padded tap is integral already.
        return np.trunc(to_safe_range(coord)).astype(np.int64)


def _bicubic_taps(index, sizes, padding, align_corners) -> Taps:
    """64 taps: (x, y, z) ∈ {floor - 1, ..., floor + 2}³, each padded on its own; z outermost, x innermost."""
    with np.errstate(invalid="ignore", over="ignore"):
        low = np.floor(index)
        fraction = index - low
    depth, height, width = sizes
    axis_sizes = (width, height, depth)
    weights = [cubic_coefficients(fraction[:, axis]) for axis in range(3)]  # 3 x (4, P)
    slopes = [cubic_slopes(fraction[:, axis]) for axis in range(3)]
    corners = [
        [pad_tap(low[:, axis] - 1 + step, axis_sizes[axis], padding, align_corners) for step in range(4)]
        for axis in range(3)
    ]
    offsets, valids, axis_weights, axis_slopes = [], [], [], []
    for k in range(4):
        for j in range(4):
            for i in range(4):
                offset, valid = _voxel_taps(np.stack([corners[0][i], corners[1][j], corners[2][k]], 1), sizes)
                offsets.append(offset)
                valids.append(valid)
                axis_weights.append(np.stack([weights[0][i], weights[1][j], weights[2][k]], 1))
                axis_slopes.append(np.stack([slopes[0][i], slopes[1][j], slopes[2][k]], 1))
    axis_weight = np.stack(axis_weights, 1)
    with np.errstate(invalid="ignore", over="ignore"):
        weight = axis_weight[..., 0] * axis_weight[..., 1] * axis_weight[..., 2]
    return Taps(np.stack(offsets, 1), np.stack(valids, 1), weight, axis_weight, np.stack(axis_slopes, 1))


def _cubic_sum(values, weights):
    """Sum over the last axis (4) of values * weights, left to right: PyTorch's ``cubic_interp1d``."""
    return (
        values[..., 0] * weights[..., 0]
        + values[..., 1] * weights[..., 1]
        + values[..., 2] * weights[..., 2]
        + values[..., 3] * weights[..., 3]
    )


def _bicubic_values(values, taps: Taps):
    """The 64 tap values (C, P, 4, 4, 4) indexed [k (z), j (y), i (x)]; a tap outside reads 0."""
    gathered = np.where(taps.valid[None], values[:, taps.offset], 0.0)
    return gathered.reshape(values.shape[0], -1, 4, 4, 4)


def _bicubic_axes(table):
    """Per-axis (P, 4) columns of a (P, 64, 3) tap table: x along i, y along j, z along k."""
    grid = np.broadcast_to(table, (table.shape[0], 64, 3)).reshape(-1, 4, 4, 4, 3)
    return grid[:, 0, 0, :, 0], grid[:, 0, :, 0, 1], grid[:, :, 0, 0, 2]


def _bicubic_forward(values, taps: Taps):
    """y (C, P), separably: along x within each (z, y) row, then along y, then along z (PyTorch's 2-D order)."""
    wx, wy, wz = _bicubic_axes(taps.axis_weight)
    rows = _cubic_sum(_bicubic_values(values, taps), wx[:, None, None, :])
    return _cubic_sum(_cubic_sum(rows, wy[:, None, :]), wz)


def _bicubic_grid_gradient(grad_n, values, taps: Taps):
    """d loss / d index (P, 3): per channel the separable sums with one axis's weights replaced by its slopes,
    times grad, accumulated over channels in order."""
    wx, wy, wz = _bicubic_axes(taps.axis_weight)
    sx, sy, sz = _bicubic_axes(taps.axis_slope)
    grad_index = np.zeros((taps.offset.shape[0], 3))
    for channel in range(grad_n.shape[0]):
        tap_values = _bicubic_values(values[channel : channel + 1], taps)[0]
        rows_w = _cubic_sum(tap_values, wx[:, None, None, :])
        rows_s = _cubic_sum(tap_values, sx[:, None, None, :])
        planes_w = _cubic_sum(rows_w, wy[:, None, :])
        planes_sx = _cubic_sum(rows_s, wy[:, None, :])
        planes_sy = _cubic_sum(rows_w, sy[:, None, :])
        grad_index[:, 0] += _cubic_sum(planes_sx, wz) * grad_n[channel]
        grad_index[:, 1] += _cubic_sum(planes_sy, wz) * grad_n[channel]
        grad_index[:, 2] += _cubic_sum(planes_w, sz) * grad_n[channel]
    return grad_index


def _sample_points(positions_n, sizes, sampling: Sampling, kind: FieldKind, forward: bool):
    """Taps and d index / d position multipliers (P, 3) for one batch item's positions (Do, Ho, Wo, 3) as (x, y, z)."""
    coords = positions_n.reshape(-1, 3)
    depth, height, width = sizes
    padding, align_corners = sampling.padding, sampling.align_corners
    if sampling.interpolation == Interpolation.BICUBIC:
        # Padding applies to each tap, not to the point: the index is only unnormalised,
        # and the multiplier is the unnormalising slope alone (PyTorch's 2-D bicubic).
        with np.errstate(invalid="ignore", over="ignore"):
            axes = [
                unnormalize(coords[:, axis], size, align_corners, kind)
                for axis, size in enumerate((width, height, depth))
            ]
        index = np.stack([axis[0] for axis in axes], axis=-1)
        multiplier = np.broadcast_to(np.array([axis[1] for axis in axes], dtype=np.float64), index.shape)
        return _bicubic_taps(index, sizes, padding, align_corners), multiplier
    axes = [
        source_index(coords[:, axis], size, padding, align_corners, forward=forward, kind=kind)
        for axis, size in enumerate((width, height, depth))
    ]
    index = np.stack([axis[0] for axis in axes], axis=-1)
    multiplier = np.stack([axis[1] for axis in axes], axis=-1)
    if sampling.interpolation == Interpolation.BILINEAR:
        return _bilinear_taps(index, sizes), multiplier
    return _nearest_taps(index, sizes), multiplier


def positions(field, kind: FieldKind, in_sizes, align_corners: bool):
    """The positions (N, Do, Ho, Wo, 3) as (x, y, z) that ``field`` gives, for an input of ``in_sizes`` (D, H, W).

    A grid's normalised coordinates as they are; a displacement's voxel positions
    (:func:`warp_positions`); an affine field's, ``field`` = (theta (N, 3, 4), output size
    (Do, Ho, Wo)) or (theta, displacement): ``M @ (w, h, d, 1)`` (:func:`.affine.voxel_matrix`),
    plus the displacement's (dx, dy, dz); a B-spline field's, ``field`` = (control points
    (N, 3, Kd, Kh, Kw), output size, parameters, theta or None): the own or affine position
    plus the dense field (:func:`.bspline.dense_displacement`).
    """
    if kind == FieldKind.GRID:
        return field
    if kind == FieldKind.DISPLACEMENT:
        return warp_positions(field)
    if kind.spline:
        control_points, out_sizes, parameters, theta = field
        displacement = dense_displacement(np.asarray(control_points, dtype=np.float64), out_sizes, parameters)
        if theta is None:
            return warp_positions(displacement)
        return positions((theta, displacement), FieldKind.AFFINE_DISPLACEMENT, in_sizes, align_corners)
    theta, rest = field
    out_sizes = tuple(rest) if kind == FieldKind.AFFINE else rest.shape[2:]
    matrix = voxel_matrix(np.asarray(theta, dtype=np.float64), in_sizes, out_sizes, align_corners)
    zz, yy, xx = np.meshgrid(*[np.arange(size, dtype=np.float64) for size in out_sizes], indexing="ij")
    with np.errstate(invalid="ignore", over="ignore"):
        axes = [
            matrix[:, axis, 0, None, None, None] * xx
            + (
                (matrix[:, axis, 1, None, None, None] * yy + matrix[:, axis, 2, None, None, None] * zz)
                + matrix[:, axis, 3, None, None, None]
            )
            for axis in range(3)
        ]
        if kind == FieldKind.AFFINE_DISPLACEMENT:
            axes = [axes[axis] + np.asarray(rest, dtype=np.float64)[:, 2 - axis] for axis in range(3)]
    return np.stack(axes, axis=-1)


def _field_gradients(dpositions, field, kind: FieldKind, in_sizes, align_corners: bool, outputs: Outputs):
    """(the gradient of the field's tensor, theta's) from d loss / d position (N, Do, Ho, Wo, 3).

    A grid's is ``dpositions``; a displacement's (d position / d displacement is 1) its
    components reordered to (dz, dy, dx), (N, 3, Do, Ho, Wo); a B-spline's the sum over the
    points of each control point's weight times theirs (:func:`_control_gradient`); theta's
    the chain rule through :func:`.affine.voxel_matrix`, summed in float64
    (:func:`.affine.theta_gradient`).
    """
    dfield = dtheta = None
    if outputs.dfield and kind == FieldKind.GRID:
        dfield = dpositions
    elif outputs.dfield and kind.displaced:
        dfield = np.ascontiguousarray(dpositions[..., ::-1].transpose(0, 4, 1, 2, 3))
    elif outputs.dfield and kind.spline:
        control_points, out_sizes, parameters, _ = field
        dfield = _control_gradient(dpositions[..., ::-1].transpose(0, 4, 1, 2, 3), control_points.shape, parameters)
    if outputs.dtheta and kind.affine:
        out_sizes = dpositions.shape[1:4]
        zz, yy, xx = np.meshgrid(*[np.arange(size, dtype=np.float64) for size in out_sizes], indexing="ij")
        homogeneous = np.stack([xx, yy, zz, np.ones_like(xx)], axis=-1).reshape(-1, 4)
        matrix_grad = np.einsum("npi,pj->nij", dpositions.reshape(dpositions.shape[0], -1, 3), homogeneous)
        dtheta = theta_gradient(matrix_grad, in_sizes, out_sizes, align_corners)
    return dfield, dtheta


def _control_gradient(ddisplacement, control_shape, parameters):
    """dC (N, 3, Kd, Kh, Kw): each control point's weight times d loss / d displacement (N, 3, Do, Ho, Wo), summed
    over the points whose support holds it (:func:`.bspline.tables`), one einsum per support step."""
    out_sizes = ddisplacement.shape[2:]
    depth, height, width = tables(out_sizes, control_shape[2:], parameters)
    gradient = np.zeros(control_shape)
    with np.errstate(invalid="ignore", over="ignore"):
        for md in range(4):
            for mh in range(4):
                for mw in range(4):
                    weight = np.einsum(
                        "d,h,w->dhw",
                        np.where(depth.valid[:, md], depth.weight[:, md], 0.0),
                        np.where(height.valid[:, mh], height.weight[:, mh], 0.0),
                        np.where(width.valid[:, mw], width.weight[:, mw], 0.0),
                    )
                    inside = (
                        depth.valid[:, md, None, None]
                        & height.valid[None, :, mh, None]
                        & width.valid[None, None, :, mw]
                    )
                    terms = np.where(inside, weight * ddisplacement, 0.0)
                    index = np.ix_(depth.index[:, md], height.index[:, mh], width.index[:, mw])
                    for n in range(control_shape[0]):
                        for k in range(3):
                            np.add.at(gradient[n, k], index, terms[n, k])
    return gradient


def sample(x, field, kind: FieldKind, sampling: Sampling):
    """``x`` (N, C, Di, Hi, Wi) sampled at ``field`` (of ``kind``, see :func:`positions`)
    → (N, C, Do, Ho, Wo)."""
    sizes = x.shape[2:]
    points = positions(field, kind, sizes, sampling.align_corners)
    batch, channels = x.shape[:2]
    out_sizes = points.shape[1:4]
    output = np.zeros((batch, channels) + out_sizes)
    for n in range(batch):
        taps, _ = _sample_points(points[n], sizes, sampling, kind, forward=True)
        values = x[n].reshape(channels, -1)
        accumulated = np.zeros((channels, taps.offset.shape[0]))
        with np.errstate(invalid="ignore", over="ignore"):
            if sampling.interpolation == Interpolation.BICUBIC:
                output[n] = _bicubic_forward(values, taps).reshape((channels,) + out_sizes)
                continue
            for t in range(taps.offset.shape[1]):
                tap_values = values[:, taps.offset[:, t]]
                if sampling.interpolation != Interpolation.NEAREST:
                    tap_values = tap_values * taps.weight[:, t]
                accumulated += np.where(taps.valid[:, t], tap_values, 0.0)
        output[n] = accumulated.reshape((channels,) + out_sizes)
    return output


def sample_backward(grad, x, field, kind: FieldKind, sampling: Sampling, outputs=Outputs()):
    """Gradients of ``sum(grad * sample(x, field, kind, sampling))``: :class:`.sampling.Gradients` (dx, dfield, dtheta).

    dx is (N, C, Di, Hi, Wi); dfield is shaped like the field's grid or displacement,
    dtheta like theta; an output that ``outputs`` (:class:`.sampling.Outputs`) leaves out,
    or the field does not have, is ``None``.
    """
    sizes = x.shape[2:]
    points = positions(field, kind, sizes, sampling.align_corners)
    batch, channels = x.shape[:2]
    volume = int(np.prod(sizes))
    dx = np.zeros(x.shape) if outputs.dx else None
    want_positions = (outputs.dfield and not kind == FieldKind.AFFINE) or (outputs.dtheta and kind.affine)
    dpositions = np.zeros(points.shape) if want_positions else None
    for n in range(batch):
        taps, multiplier = _sample_points(points[n], sizes, sampling, kind, forward=False)
        grad_n = grad[n].reshape(channels, -1)
        with np.errstate(invalid="ignore", over="ignore"):
            if outputs.dx:
                dx[n] = _scatter_dx(grad_n, taps, volume).reshape(x.shape[1:])
            if want_positions and sampling.interpolation == Interpolation.BICUBIC:
                grad_index = _bicubic_grid_gradient(grad_n, x[n].reshape(channels, volume), taps)
                dpositions[n] = (multiplier * grad_index).reshape(points.shape[1:])
            elif want_positions and sampling.interpolation != Interpolation.NEAREST:
                grad_index = _contract_grid_gradient(grad_n, x[n].reshape(channels, volume), taps)
                dpositions[n] = (multiplier * grad_index).reshape(points.shape[1:])
    if dpositions is None:
        return Gradients(dx)
    return Gradients(dx, *_field_gradients(dpositions, field, kind, sizes, sampling.align_corners, outputs))


def grid_sampler3d_fwd(x, grid, interpolation: Interpolation, padding: Padding, align_corners: bool):
    """Sample ``x`` (N, C, Di, Hi, Wi) at ``grid`` (N, Do, Ho, Wo, 3) → (N, C, Do, Ho, Wo)."""
    return sample(x, grid, FieldKind.GRID, Sampling(interpolation, padding, align_corners))


def grid_sampler3d_bwd(
    grad, x, grid, interpolation: Interpolation, padding: Padding, align_corners: bool, output_mask=(True, True)
):
    """Gradients of ``sum(grad * grid_sampler3d_fwd(x, grid))``: ``(dx, dgrid)``, (N, C, Di, Hi, Wi) and
    (N, Do, Ho, Wo, 3); an output whose ``output_mask`` entry is False is ``None``."""
    return sample_backward(
        grad, x, grid, FieldKind.GRID, Sampling(interpolation, padding, align_corners), Outputs(*output_mask)
    )[:2]


def warp_positions(displacement):
    """Voxel positions (N, Do, Ho, Wo, 3) as (x, y, z) of ``displacement`` (N, 3, Do, Ho, Wo) as (dz, dy, dx).

    Point (d, h, w) sits at (w + dx, h + dy, d + dz): one float64 sum per axis.
    """
    displacement = np.asarray(displacement, dtype=np.float64)
    depth, height, width = displacement.shape[2:]
    zz, yy, xx = np.meshgrid(
        np.arange(depth, dtype=np.float64),
        np.arange(height, dtype=np.float64),
        np.arange(width, dtype=np.float64),
        indexing="ij",
    )
    with np.errstate(invalid="ignore", over="ignore"):
        return np.stack([xx + displacement[:, 2], yy + displacement[:, 1], zz + displacement[:, 0]], axis=-1)


def warp_fwd(x, displacement, interpolation: Interpolation, padding: Padding, align_corners: bool):
    """Sample ``x`` (N, C, D, H, W) at identity + ``displacement`` (N, 3, Do, Ho, Wo) → (N, C, Do, Ho, Wo).

    ``align_corners`` only sets reflection's bounds here (-0.5 and size - 0.5 when False,
    0 and size - 1 when True); the position itself is the same either way.
    """
    return sample(x, displacement, FieldKind.DISPLACEMENT, Sampling(interpolation, padding, align_corners))


def warp_bwd(
    grad, x, displacement, interpolation: Interpolation, padding: Padding, align_corners: bool, output_mask=(True, True)
):
    """Gradients of ``sum(grad * warp_fwd(x, displacement))``: (dx (N, C, D, H, W), ddisplacement (N, 3, Do, Ho, Wo)).

    d position / d displacement is 1, so ddisplacement is the gradient with respect to
    the voxel position (through padding), its components reordered to (dz, dy, dx).
    """
    return sample_backward(
        grad,
        x,
        displacement,
        FieldKind.DISPLACEMENT,
        Sampling(interpolation, padding, align_corners),
        Outputs(*output_mask),
    )[:2]


def _contract_grid_gradient(grad_n, values, taps: Taps):
    """d loss / d index (P, 3): sum over channels and taps of x_tap * slope * the other two weights * grad.

    Channels outermost, taps inside, each term as (((x_tap * slope) * w_a) * w_b) * grad:
    PyTorch's order (for bilinear the slope is ±1, which rounds symmetrically), so that
    float64 results are bitwise equal to it.
    """
    grad_index = np.zeros((taps.offset.shape[0], 3))
    other_axes = ((1, 2), (0, 2), (0, 1))
    slope = np.broadcast_to(taps.axis_slope, taps.axis_weight.shape)
    for channel in range(grad_n.shape[0]):
        for t in range(taps.offset.shape[1]):
            tap_values = values[channel, taps.offset[:, t]]
            for axis, (a, b) in enumerate(other_axes):
                term = (
                    tap_values
                    * slope[:, t, axis]
                    * taps.axis_weight[:, t, a]
                    * taps.axis_weight[:, t, b]
                    * grad_n[channel]
                )
                grad_index[:, axis] += np.where(taps.valid[:, t], term, 0.0)
    return grad_index


def _scatter_dx(grad_n, taps: Taps, voxel_count: int):
    """Push ``grad_n`` (C, P) through the taps into a (C, voxel_count) array.

    Contributions are summed point by point, then tap by tap (``np.bincount`` adds in
    order), which is PyTorch's CPU order: the result is deterministic and exact.
    """
    channels, points = grad_n.shape
    n_taps = taps.offset.shape[1]
    dx = np.zeros((channels, voxel_count))
    if channels == 0 or points == 0:
        return dx
    valid = taps.valid.ravel()
    offset = taps.offset.ravel()[valid]
    block = max(1, _SCATTER_CHUNK // (points * n_taps))
    for start in range(0, channels, block):
        stop = min(channels, start + block)
        contributions = taps.weight[None, :, :] * grad_n[start:stop, :, None]  # (c, P, T)
        contributions = contributions.reshape(stop - start, -1)[:, valid]
        target = offset[None, :] + voxel_count * np.arange(stop - start)[:, None]
        summed = np.bincount(target.ravel(), contributions.ravel(), minlength=(stop - start) * voxel_count)
        dx[start:stop] = summed.reshape(stop - start, voxel_count)
    return dx
