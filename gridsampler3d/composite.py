"""Grid sampling written with differentiable torch operations, for second-order gradients.

The kernels compute first derivatives directly; the derivative of *those* (double
backward, e.g. a gradient penalty on a registration loss) is taken by autograd through
this composite, which follows the same coordinate rules (reference.py) with torch ops.
It gathers per tap, so it takes memory proportional to channels x points: it is used
only when a second derivative is asked for.
"""

from __future__ import annotations

import torch

from .affine import voxel_matrix
from .bspline import dense_displacement
from .modes import Interpolation, Padding
from .reference import CUBIC_A, INT_MAX, INT_MIN, OUT_OF_RANGE
from .sampling import Field, FieldKind, Sampling

__all__ = ["sample"]


def _reflect(index, twice_low: int, twice_high: int):
    if twice_low == twice_high:
        return index * 0
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    distance = (index - low).abs()
    extra = torch.fmod(distance, span)
    flips = torch.floor(distance / span).detach()
    odd = (flips <= INT_MAX) & (torch.fmod(flips, 2) == 1)
    return torch.where(odd, span - extra + low, extra + low)


def _clip(index, size: int):
    # The bounds themselves count as outside: gradient 0 there, as in the kernels.
    zero = torch.zeros_like(index)
    return torch.where(index <= 0, zero, torch.where(index >= size - 1, zero + (size - 1), index))


def _source_index(coord, size: int, padding: Padding, align_corners: bool, kind: FieldKind):
    if kind.in_voxels:
        index = coord
    elif align_corners:
        index = (coord + 1) / 2 * (size - 1)
    else:
        index = ((coord + 1) * size - 1) / 2
    if padding == Padding.REFLECTION:
        index = _reflect(index, 0, 2 * (size - 1)) if align_corners else _reflect(index, -1, 2 * size - 1)
    if padding != Padding.ZEROS:
        index = _clip(index, size)
    bad = ~torch.isfinite(index) | (index > INT_MAX - 1) | (index < INT_MIN)
    return torch.where(bad, torch.full_like(index, OUT_OF_RANGE), index)


def _unnormalize(coord, size: int, align_corners: bool, kind: FieldKind):
    if kind.in_voxels:
        return coord
    return (coord + 1) / 2 * (size - 1) if align_corners else ((coord + 1) * size - 1) / 2


def _pad_tap(coord, size: int, padding: Padding, align_corners: bool):
    """Where padding sends an integer tap coordinate (no gradient flows through it)."""
    if padding == Padding.REFLECTION:
        coord = _reflect(coord, 0, 2 * (size - 1)) if align_corners else _reflect(coord, -1, 2 * size - 1)
    if padding != Padding.ZEROS:
        coord = _clip(coord, size)
    bad = ~torch.isfinite(coord) | (coord > INT_MAX - 1) | (coord < INT_MIN)
    return torch.trunc(torch.where(bad, torch.full_like(coord, OUT_OF_RANGE), coord))


def _cubic_weights(t):
    """The four cubic convolution weights (taps floor - 1 .. floor + 2) at fraction t."""

    def near(x):
        return ((CUBIC_A + 2) * x - (CUBIC_A + 3)) * x * x + 1

    def far(x):
        return ((CUBIC_A * x - 5 * CUBIC_A) * x + 8 * CUBIC_A) * x - 4 * CUBIC_A

    return far(t + 1), near(t), near(1 - t), far(2 - t)


def _bicubic(x, grid, padding: Padding, align_corners: bool, tap, out_shape, kind: FieldKind):
    depth, height, width = x.shape[2:]
    sizes = (width, height, depth)
    index = [_unnormalize(grid[..., axis], size, align_corners, kind) for axis, size in enumerate(sizes)]
    lows = [torch.floor(i).detach() for i in index]
    weights = [_cubic_weights(i - low) for i, low in zip(index, lows)]
    corners = [
        [_pad_tap(low - 1 + step, size, padding, align_corners) for step in range(4)] for low, size in zip(lows, sizes)
    ]
    output = torch.zeros(out_shape, dtype=x.dtype, device=x.device)
    for k in range(4):
        for j in range(4):
            for i in range(4):
                values, valid = tap(corners[0][i], corners[1][j], corners[2][k])
                weight = (weights[0][i] * weights[1][j] * weights[2][k]).unsqueeze(1)
                # An outside tap reads 0, and still multiplies its weight (PyTorch's 2-D bicubic).
                output = output + torch.where(valid, values, torch.zeros_like(values)) * weight
    return output


def _positions(field: Field, in_sizes, align_corners: bool):
    """The positions (N, Do, Ho, Wo, 3) as (x, y, z) of ``field``: a grid's normalised coordinates; else voxel
    positions: identity + displacement (N, 3, D, H, W; (dz, dy, dx)), or an affine field's ``M @ (w, h, d, 1)``
    (:func:`.affine.voxel_matrix`, differentiable in theta) plus its displacement, if any; a B-spline's
    displacement is its dense field (:func:`.bspline.dense_displacement`)."""
    if field.kind == FieldKind.GRID:
        return field.tensor
    out_sizes = field.out_sizes
    like = field.tensor if field.tensor is not None else field.theta
    options = {"dtype": like.dtype, "device": like.device}
    zz, yy, xx = torch.meshgrid(*[torch.arange(size, **options) for size in out_sizes], indexing="ij")
    if field.kind.affine:
        matrix = voxel_matrix(field.theta, in_sizes, out_sizes, align_corners)[:, :, :, None, None, None]
        identity = [
            matrix[:, axis, 0] * xx + ((matrix[:, axis, 1] * yy + matrix[:, axis, 2] * zz) + matrix[:, axis, 3])
            for axis in range(3)
        ]
    else:
        identity = [xx, yy, zz]
    if field.tensor is None:
        return torch.stack(identity, dim=-1)
    displacement = dense_displacement(field.tensor, out_sizes, field.parameters) if field.kind.spline else field.tensor
    return torch.stack([identity[axis] + displacement[:, 2 - axis] for axis in range(3)], dim=-1)


def sample(x, field: Field, sampling: Sampling):
    """Differentiable sampling: x (N, C, D, H, W) at ``field`` (:class:`.sampling.Field`: a grid (N, Do, Ho, Wo, 3),
    a displacement (N, 3, D, H, W), an affine theta and its displacement, if any) -> (N, C, Do, Ho, Wo)."""
    interpolation, padding, align_corners = sampling.interpolation, sampling.padding, sampling.align_corners
    kind = field.kind
    grid = _positions(field, tuple(x.shape[2:]), align_corners)
    batch, channels, depth, height, width = x.shape
    out_shape = (batch, channels) + tuple(grid.shape[1:4])
    flat = x.reshape(batch, channels, depth * height * width)

    def tap(cx, cy, cz):
        valid = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height) & (cz >= 0) & (cz < depth)
        offset = torch.where(valid, (cz * height + cy) * width + cx, torch.zeros_like(cx)).long()
        gathered = flat.gather(2, offset.reshape(batch, 1, -1).expand(batch, channels, -1)).reshape(out_shape)
        return gathered, valid.unsqueeze(1)

    if interpolation == Interpolation.BICUBIC:
        return _bicubic(x, grid, padding, align_corners, tap, out_shape, kind)
    index = [
        _source_index(grid[..., axis], size, padding, align_corners, kind)
        for axis, size in enumerate((width, height, depth))
    ]

    if interpolation == Interpolation.NEAREST:
        values, valid = tap(*(torch.round(i).detach() for i in index))  # round half to even, as nearbyint
        return torch.where(valid, values, torch.zeros_like(values))
    lows = [torch.floor(i).detach() for i in index]
    output = torch.zeros(out_shape, dtype=x.dtype, device=x.device)
    for step_z in (0, 1):
        for step_y in (0, 1):
            for step_x in (0, 1):
                steps = (step_x, step_y, step_z)
                weights = [i - low if step else low + 1 - i for i, low, step in zip(index, lows, steps)]
                values, valid = tap(*(low + step for low, step in zip(lows, steps)))
                weight = (weights[0] * weights[1] * weights[2]).unsqueeze(1)
                output = output + torch.where(valid, values * weight, torch.zeros_like(values))
    return output
