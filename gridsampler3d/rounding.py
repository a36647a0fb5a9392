"""Rounding a float64 result into its output dtype exactly once (SPEC section 4).

torch converts float64 to float16 and bfloat16 through float32, which rounds twice: a
value just above a half-precision tie lands on the tie in float32, then rounds to even.
Every engine's half-precision output goes through :func:`round_once` instead, and the
precision rule rounds the golden with it.
"""
from __future__ import annotations

import torch

__all__ = ["round_once"]

_HALF = (torch.float16, torch.bfloat16)


def round_once(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 ``values`` rounded to ``dtype`` once, to nearest even; other conversions as ``Tensor.to``.

    Rounding to float32 by truncation with the last bit set where anything was cut off
    ("round to odd") keeps the information the second rounding needs; float32's 24-bit
    significand holds more than the two extra bits that makes exact for both half types.
    Same shape, device and memory format as ``values``.
    """
    if values.dtype != torch.float64 or dtype not in _HALF:
        return values.to(dtype)
    single = values.to(torch.float32)  # to nearest
    back = single.to(torch.float64)
    # Toward zero: one step down in magnitude where rounding went up (the bit pattern of a
    # float counts magnitudes for either sign); then the sticky bit where anything was cut.
    bits = single.view(torch.int32) - (back.abs() > values.abs()).to(torch.int32)
    return (bits | (back != values).to(torch.int32)).view(torch.float32).to(dtype)
