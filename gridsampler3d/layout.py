"""Tensor layouts: the logical NCDHW view every engine works in, and the memory format a result keeps.

An NDHWC operand (N, D, H, W, C) becomes a permuted view (N, C, D, H, W) of the same
storage, strided channels-last: nothing is copied on the way in. Of the package this module
imports only the DataFormat enum, so that the API, the registry and the engines can all use it
without importing one another.
"""

from __future__ import annotations

import torch

from .modes import DataFormat

__all__ = ["memory_format_of", "to_ncdhw", "from_ncdhw"]


def memory_format_of(tensor: torch.Tensor) -> torch.memory_format:
    """channels_last_3d when ``tensor`` (N, C, D, H, W) is stored channels-last, else contiguous."""
    if not tensor.is_contiguous() and tensor.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return torch.contiguous_format


def to_ncdhw(tensor: torch.Tensor, data_format: DataFormat) -> torch.Tensor:
    """A zero-copy logical (N, C, D, H, W) view of a 5-D tensor given in ``data_format``."""
    return tensor.permute(0, 4, 1, 2, 3) if data_format == DataFormat.NDHWC else tensor


def from_ncdhw(tensor: torch.Tensor, data_format: DataFormat) -> torch.Tensor:
    """A logical (N, C, D, H, W) tensor back in ``data_format``; NDHWC comes back contiguous
    (free when the tensor is stored channels-last, as the engines store an NDHWC result)."""
    return tensor.permute(0, 2, 3, 4, 1).contiguous() if data_format == DataFormat.NDHWC else tensor
