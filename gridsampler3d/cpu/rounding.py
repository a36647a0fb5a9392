"""The CPU engine's rounding of float64 results into float16 or bfloat16: one pass, in parts on its threads.

:func:`gridsampler3d.rounding.round_once` rounds to float32 by round-to-odd, then to the
half type, so that the result is the float64 value rounded once. Its torch form makes
about ten passes with temporaries: in the bfloat16 case of the suite it cost nearly as
much as the kernels. Here the round-to-odd step is one part kernel over the dense
tensor's memory; torch's conversion does the rest.
"""

from __future__ import annotations

import numpy as np
import torch

from ..rounding import HALF_DTYPES, round_once
from . import pool, tuning
from .jit import Parallel, borrowed, part_kernel

__all__ = ["round_in_parts"]


@part_kernel
def _round_to_odd_part(values_operand, single_operand, parts, part):
    """single[i]: float64 values[i] rounded to float32 toward zero, last bit set where anything was cut off, for
    the ``part``-th of ``parts`` equal runs of i."""
    first, last = part * values_operand.size // parts, (part + 1) * values_operand.size // parts
    # Views from 0, so that every index is provably non-negative: an index that might wrap
    # around (negative indexing) kept the loop scalar, three times as slow.
    values, single = borrowed(values_operand)[first:last], borrowed(single_operand)[first:last]
    bits = single.view(np.int32)  # derived from ``single`` in the kernel: the arguments never overlap
    for i in range(values.size):
        value = values[i]
        single[i] = np.float32(value)  # to nearest
        back = np.float64(single[i])
        bits[i] = (bits[i] - np.int32(abs(back) > abs(value))) | np.int32(back != value)


_round_to_odd = Parallel(_round_to_odd_part)


def _memory(tensor: torch.Tensor):
    """The tensor's elements as a 1-D array in memory order, or None where its memory has gaps or overlaps."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    if span != tensor.numel():
        return None
    array = tensor.detach().numpy()
    return np.lib.stride_tricks.as_strided(array, shape=(span,), strides=(array.itemsize,))


def round_in_parts(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """:func:`gridsampler3d.rounding.round_once`, with its round-to-odd step as one pass on dense tensors, in parts on
    the engine's threads."""
    if values.dtype != torch.float64 or dtype not in HALF_DTYPES or values.numel() == 0:
        return round_once(values, dtype)
    single = torch.empty_like(values, dtype=torch.float32)
    flat_values = _memory(values)
    if flat_values is None or single.stride() != values.stride():
        return round_once(values, dtype)
    threads = pool.threads() if values.numel() >= tuning.PARALLEL_VALUES else 1
    # Runs that the threads take in turn, as a pass by rows: one thread kept off its core
    # leaves the others no more than a short run's wait.
    runs = 1 if threads == 1 else tuning.SHARED_RUNS * threads
    pool.run_together([], [_round_to_odd.launch(flat_values, _memory(single), runs)])
    return single.to(dtype)
