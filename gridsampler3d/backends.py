"""Backend registry: which engine runs a call.

A backend receives torch tensors already validated and in logical NCDHW order (an NDHWC
operand arrives as a permuted, channels-last strided view; nothing is copied on the way)
and returns tensors in logical NCDHW order, laid out like its ``x``:

    forward(x, grid, interpolation, padding, align_corners) -> y
    backward(grad, x, grid, interpolation, padding, align_corners, output_mask,
             deterministic) -> (dx or None, dgrid or None)
"""
from __future__ import annotations

import torch

from . import reference
from .layout import memory_format_of
from .modes import Interpolation, Padding

__all__ = ["BACKENDS", "available_backends", "select_backend", "ReferenceBackend"]


def _to_float64_numpy(tensor: torch.Tensor):
    return tensor.detach().to(device="cpu", dtype=torch.float64).numpy()


class ReferenceBackend:
    """The NumPy float64 golden: computes in float64 on the CPU, rounds once to the dtype."""

    name = "reference"

    def unavailable_reason(self) -> str | None:
        return None

    def supports(self, device: torch.device) -> bool:
        return True

    def forward(self, x, grid, interpolation: Interpolation, padding: Padding, align_corners: bool):
        y = reference.grid_sampler3d_fwd(_to_float64_numpy(x), _to_float64_numpy(grid),
                                         interpolation, padding, align_corners)
        out = torch.empty(y.shape, dtype=x.dtype, device=x.device, memory_format=memory_format_of(x))
        return out.copy_(torch.from_numpy(y))

    def backward(self, grad, x, grid, interpolation: Interpolation, padding: Padding,
                 align_corners: bool, output_mask, deterministic: bool):
        dx, dgrid = reference.grid_sampler3d_bwd(
            _to_float64_numpy(grad), _to_float64_numpy(x), _to_float64_numpy(grid),
            interpolation, padding, align_corners, output_mask)
        if dx is not None:
            dx = torch.empty_like(x, memory_format=memory_format_of(x)).copy_(torch.from_numpy(dx))
        if dgrid is not None:
            dgrid = torch.empty_like(grid, memory_format=torch.contiguous_format).copy_(torch.from_numpy(dgrid))
        return dx, dgrid


class _Missing:
    """Stands in for a backend whose module cannot be imported here."""

    def __init__(self, name: str, error: ImportError):
        self.name, self._reason = name, f"cannot be imported: {error}"

    def unavailable_reason(self) -> str | None:
        return self._reason

    def supports(self, device: torch.device) -> bool:
        return False


def _registry():
    try:
        from .cpu import NumbaBackend

        numba = NumbaBackend()
    except ImportError as error:
        numba = _Missing("numba", error)
    from .gpu import TritonBackend  # imports Triton only when a kernel first runs

    return {"numba": numba, "triton": TritonBackend(), "reference": ReferenceBackend()}


BACKENDS = _registry()
# Preference order of "auto" per device type; the first available one that supports it wins.
_AUTO_ORDER = {"cpu": ("numba", "reference"), "cuda": ("triton", "reference")}


def select_backend(name: str, device: torch.device):
    """The backend object for ``name`` ("auto" or a registered name) on ``device``."""
    if not isinstance(name, str):
        raise TypeError(f"backend must be a str; got {type(name).__name__} {name!r}")
    if name == "auto":
        for candidate in _AUTO_ORDER.get(device.type, ("reference",)):
            backend = BACKENDS[candidate]
            if backend.unavailable_reason() is None and backend.supports(device):
                return backend
        return BACKENDS["reference"]
    if name not in BACKENDS:
        known = ", ".join(repr(key) for key in ("auto", *BACKENDS))
        raise ValueError(f"backend must be one of {known}; got {name!r}")
    backend = BACKENDS[name]
    reason = backend.unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"backend {name!r} is not available: {reason}")
    if not backend.supports(device):
        raise RuntimeError(f"backend {name!r} does not run on device {device}")
    return backend


def available_backends() -> list[str]:
    """Names of the backends that can run here (``"auto"`` picks among them)."""
    return [name for name, backend in BACKENDS.items() if backend.unavailable_reason() is None]
