"""Rounding: a float64 result into its output dtype exactly once, and a float64 index to the nearest integer.

torch converts float64 to float16 and bfloat16 through float32, which rounds twice: a
value just above a half-precision tie lands on the tie in float32, then rounds to even.
Every engine's half-precision output goes through :func:`round_once` instead, and the
precision rule rounds the golden with it (docs/semantics.md, "Dtypes").
"""

from __future__ import annotations

import torch

from .dtypes import HALF_DTYPES

__all__ = ["ROUNDER", "round_once"]

# 1.5 * 2**52: (x + ROUNDER) - ROUNDER is float64 x rounded to the nearest integer, ties to
# even (C nearbyint, nearest mode's rule), for |x| < 2**51, which every index is once out
# of range ones are replaced; cheaper than rint. The engines' kernels take it in as a constant.
ROUNDER = 1.5 * 2**52


def round_once(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 ``values`` rounded to ``dtype`` once, to nearest even; other conversions as ``Tensor.to``.

    Rounding to float32 by truncation with the last bit set where anything was cut off
    ("round to odd") keeps the information the second rounding needs; float32's 24-bit
    significand holds more than the two extra bits that makes exact for both half types.
    Same shape, device and memory format as ``values``.
    """
    if values.dtype != torch.float64 or dtype not in HALF_DTYPES:
        return values.to(dtype)
    single = values.to(torch.float32)  # to nearest
    back = single.to(torch.float64)
    # Toward zero: one step down in magnitude where rounding went up (the bit pattern of a
    # float counts magnitudes for either sign); then the sticky bit where anything was cut.
    bits = single.view(torch.int32) - (back.abs() > values.abs()).to(torch.int32)
    return (bits | (back != values).to(torch.int32)).view(torch.float32).to(dtype)
