"""Grid sampling written with differentiable torch operations, for second-order gradients.

The kernels compute first derivatives directly; the derivative of *those* (double
backward, e.g. a gradient penalty on a registration loss) is taken by autograd through
this composite, which follows the same coordinate rules (reference.py) with torch ops.
It gathers per tap, so it takes memory proportional to channels x points: it is used
only when a second derivative is asked for.
"""
from __future__ import annotations

import torch

from .modes import Interpolation, Padding

__all__ = ["sample"]

_INT_MAX = 2**31 - 1
_INT_MIN = -(2**31)


def _reflect(index, twice_low: int, twice_high: int):
    if twice_low == twice_high:
        return index * 0
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    distance = (index - low).abs()
    extra = torch.fmod(distance, span)
    flips = torch.floor(distance / span).detach()
    odd = (flips <= _INT_MAX) & (torch.fmod(flips, 2) == 1)
    return torch.where(odd, span - extra + low, extra + low)


def _clip(index, size: int):
    # The bounds themselves count as outside: gradient 0 there, as in the kernels.
    zero = torch.zeros_like(index)
    return torch.where(index <= 0, zero, torch.where(index >= size - 1, zero + (size - 1), index))


def _source_index(coord, size: int, padding: Padding, align_corners: bool):
    if align_corners:
        index = (coord + 1) / 2 * (size - 1)
    else:
        index = ((coord + 1) * size - 1) / 2
    if padding == Padding.REFLECTION:
        index = _reflect(index, 0, 2 * (size - 1)) if align_corners else _reflect(index, -1, 2 * size - 1)
    if padding != Padding.ZEROS:
        index = _clip(index, size)
    bad = ~torch.isfinite(index) | (index > _INT_MAX - 1) | (index < _INT_MIN)
    return torch.where(bad, torch.full_like(index, -100.0), index)


def sample(x, grid, interpolation: int, padding: int, align_corners: bool):
    """Differentiable sampling: x (N, C, D, H, W), grid (N, Do, Ho, Wo, 3) -> (N, C, Do, Ho, Wo)."""
    interpolation, padding = Interpolation(interpolation), Padding(padding)
    batch, channels, depth, height, width = x.shape
    out_shape = (batch, channels) + tuple(grid.shape[1:4])
    index = [_source_index(grid[..., axis], size, padding, align_corners)
             for axis, size in enumerate((width, height, depth))]
    flat = x.reshape(batch, channels, depth * height * width)

    def tap(cx, cy, cz):
        valid = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height) & (cz >= 0) & (cz < depth)
        offset = torch.where(valid, (cz * height + cy) * width + cx, torch.zeros_like(cx)).long()
        gathered = flat.gather(2, offset.reshape(batch, 1, -1).expand(batch, channels, -1)).reshape(out_shape)
        return gathered, valid.unsqueeze(1)

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
