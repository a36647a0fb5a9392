"""Copies between NCDHW and channels-last (NDHWC) memory, for the passes that run faster channels-last.

With many channels, the channels-last kernels read each tap's channels as one vector and
add a tap's weighted grad into dx as one vector, where the NCDHW kernels load every
channel of every tap lane by lane and add into dx one element at a time. On a smooth
grid, feat48's backward kernels (32 channels) ran 2.2 times faster channels-last
(docs/cpu.md, "Channels-last copies"): enough to pay for copying grad and x in and dx out.

The copies move elements' bits only (the tensors are viewed as integers of the same
size), so that float16 and bfloat16 operands are copied before they are widened, at half
or a quarter of the bytes, and results after they are rounded.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import buffers, pool
from .jit import Parallel, borrowed, helper, part_kernel

__all__ = ["to_channels_last", "to_contiguous"]

_PART_ELEMENTS = 1 << 15  # a copy runs on one part per this many elements, at most one per thread
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@helper
def _quartets(source, target, planar, interleaved, channels, spatial, to_last):
    """One step of points (32 bytes of a channel), four channels at a time; the channels past the last four, one by one.

    Written out four channels by the step's points, with the step's length a constant of
    the element type, LLVM turns each four into vector loads, shuffles and vector stores
    (a plain loop over the points at channel stride stayed scalar: 2.4 to 2.7 times the
    time of float32's copy, docs/cpu.md "Channels-last copies").
    """
    # Derived here, not passed in: Numba optimises a helper in its own module before LLVM
    # inlines it, so only a constant known inside the helper unrolls its loops.
    step = 32 // source.itemsize
    for c in range(0, channels - 3, 4):
        rows = planar + c * spatial
        if to_last:
            r0, r1, r2, r3 = _four_rows(source, rows, spatial, step)
            for i in range(step):
                into = target[interleaved + i * channels + c : interleaved + i * channels + c + 4]
                into[0], into[1], into[2], into[3] = r0[i], r1[i], r2[i], r3[i]
        else:
            w0, w1, w2, w3 = _four_rows(target, rows, spatial, step)
            for i in range(step):
                values = source[interleaved + i * channels + c : interleaved + i * channels + c + 4]
                w0[i], w1[i], w2[i], w3[i] = values[0], values[1], values[2], values[3]
    _some(source, target, planar, interleaved, channels, spatial, to_last, channels - channels % 4, step)


@helper
def _four_rows(array, first, spatial, step):
    """Views of ``step`` elements of four channel rows ``spatial`` apart, from ``first`` on."""
    second, third, fourth = first + spatial, first + 2 * spatial, first + 3 * spatial
    return (
        array[first : first + step],
        array[second : second + step],
        array[third : third + step],
        array[fourth : fourth + step],
    )


@helper
def _some(source, target, planar, interleaved, channels, spatial, to_last, low, count):
    """Channels ``low`` on of ``count`` points, element by element."""
    for c in range(low, channels):
        row = planar + c * spatial
        for i in range(count):
            if to_last:
                target[interleaved + i * channels + c] = source[row + i]
            else:
                target[row + i] = source[interleaved + i * channels + c]


@part_kernel
def _copy_part(source_operand, target_operand, batch, channels, spatial, to_last, parts, part):
    """Part ``part`` of ``parts``: steps of 32 bytes of points, all channels, between (N, C, S) and (N, S, C).

    ``to_last``: ``source`` is (N, C, S) and ``target`` (N, S, C); otherwise the other way
    round. Both are dense and flat; the steps of every batch are split evenly over the parts.
    """
    source = borrowed(source_operand)
    target = borrowed(target_operand)
    step = 32 // source.itemsize
    per_batch = (spatial + step - 1) // step
    steps = batch * per_batch
    for at in range(steps * part // parts, steps * (part + 1) // parts):
        n = at // per_batch
        first = (at % per_batch) * step
        planar = n * channels * spatial + first  # the step's first point of channel 0, (N, C, S)
        interleaved = (n * spatial + first) * channels  # its first point's channel 0, (N, S, C)
        if first + step <= spatial:
            _quartets(source, target, planar, interleaved, channels, spatial, to_last)
        else:  # the batch's last points
            _some(source, target, planar, interleaved, channels, spatial, to_last, 0, spatial - first)


_copy = Parallel(_copy_part)


def _bits(tensor: torch.Tensor) -> np.ndarray:
    """The elements of ``tensor``, dense NCDHW or channels-last, in memory order: a flat NumPy view of integers of
    the element's size (no copy: ``view`` raises where one would be needed)."""
    bits = tensor.detach().view(_BITS[tensor.element_size()])
    return (bits if tensor.is_contiguous() else bits.permute(0, 2, 3, 4, 1)).view(-1).numpy()


def _copy_between(source: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
    target = buffers.empty(source.shape, source.dtype, memory_format)
    batch, channels = source.shape[:2]
    spatial = math.prod(source.shape[2:])
    if source.numel():
        parts = max(1, min(pool.threads(), source.numel() // _PART_ELEMENTS))
        _copy(_bits(source), _bits(target), batch, channels, spatial, memory_format == torch.channels_last_3d, parts)
    return target


def to_channels_last(tensor: torch.Tensor) -> torch.Tensor:
    """A channels-last copy of ``tensor`` (N, C, D, H, W), contiguous NCDHW, with the same bits."""
    return _copy_between(tensor, torch.channels_last_3d)


def to_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous NCDHW copy of ``tensor`` (N, C, D, H, W), dense channels-last, with the same bits."""
    return _copy_between(tensor, torch.contiguous_format)
