"""Backend registry: which engine runs a call.

A backend receives torch tensors already validated and in logical NCDHW order (an NDHWC
operand arrives as a permuted, channels-last strided view; nothing is copied on the way)
and returns tensors in logical NCDHW order, laid out like its ``x``:

    forward(x, grid, interpolation, padding, align_corners) -> y
    backward(grad, x, grid, interpolation, padding, align_corners, output_mask,
             deterministic) -> (dx or None, dgrid or None)

and the fused warp, with ``displacement`` a logical (N, 3, D, H, W) tensor ((dz, dy, dx)
in voxels, any strides) and ``ddisplacement`` laid out like it:

    warp(x, displacement, interpolation, padding, align_corners) -> y
    warp_backward(grad, x, displacement, interpolation, padding, align_corners, output_mask,
                  deterministic) -> (dx or None, ddisplacement or None)
"""
from __future__ import annotations

import importlib.metadata
import warnings

import torch

from . import reference
from .layout import memory_format_of
from .modes import Interpolation, Padding
from .rounding import round_once

__all__ = ["BACKENDS", "available_backends", "select_backend", "describe_backends", "auto_choices",
           "cpu_engine", "library_versions", "ReferenceBackend"]

# The device types a backend is asked about when it describes itself.
DEVICE_TYPES = ("cpu", "cuda")


def _to_float64_numpy(tensor: torch.Tensor):
    return tensor.detach().to(device="cpu", dtype=torch.float64).numpy()


def _tensor_like(values, like: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
    """A float64 array rounded once into a new tensor of ``like``'s dtype and device, in ``memory_format``."""
    out = torch.empty(values.shape, dtype=like.dtype, device=like.device, memory_format=memory_format)
    return out.copy_(round_once(torch.from_numpy(values), like.dtype))


class ReferenceBackend:
    """The NumPy float64 golden: computes in float64 on the CPU, rounds once to the dtype.

    The grid sampler and the fused warp run the same code: :mod:`.reference`'s warp samples
    at the displacement's voxel positions with the grid sampler's functions.
    """

    name = "reference"

    def unavailable_reason(self) -> str | None:
        return None

    def supports(self, device: torch.device) -> bool:
        return True

    def forward(self, x, grid, interpolation: Interpolation, padding: Padding, align_corners: bool):
        return _sample(reference.grid_sampler3d_fwd, x, grid, interpolation, padding, align_corners)

    def backward(self, grad, x, grid, interpolation: Interpolation, padding: Padding,
                 align_corners: bool, output_mask, deterministic: bool):
        return _gradients(reference.grid_sampler3d_bwd, grad, x, grid, torch.contiguous_format, interpolation,
                          padding, align_corners, output_mask)

    def warp(self, x, displacement, interpolation: Interpolation, padding: Padding, align_corners: bool):
        return _sample(reference.warp_fwd, x, displacement, interpolation, padding, align_corners)

    def warp_backward(self, grad, x, displacement, interpolation: Interpolation, padding: Padding,
                      align_corners: bool, output_mask, deterministic: bool):
        return _gradients(reference.warp_bwd, grad, x, displacement, memory_format_of(displacement), interpolation,
                          padding, align_corners, output_mask)


def _sample(golden, x, field, interpolation, padding, align_corners):
    """``golden`` (``reference.grid_sampler3d_fwd`` or ``warp_fwd``) of ``x`` at ``field`` (a grid or a
    displacement): y (N, C, Do, Ho, Wo), laid out like ``x``."""
    y = golden(_to_float64_numpy(x), _to_float64_numpy(field), interpolation, padding, align_corners)
    return _tensor_like(y, x, memory_format_of(x))


def _gradients(golden, grad, x, field, field_format, interpolation, padding, align_corners, output_mask):
    """``golden`` (``reference.grid_sampler3d_bwd`` or ``warp_bwd``): (dx laid out like ``x``, d field shaped
    like ``field`` in ``field_format``), None for an output ``output_mask`` leaves out."""
    dx, dfield = golden(_to_float64_numpy(grad), _to_float64_numpy(x), _to_float64_numpy(field), interpolation,
                        padding, align_corners, output_mask)
    return (None if dx is None else _tensor_like(dx, x, memory_format_of(x)),
            None if dfield is None else _tensor_like(dfield, field, field_format))


class _Missing:
    """Stands in for a backend whose module cannot be imported here; ``device_types``: what it would run on."""

    def __init__(self, name: str, error: ImportError, device_types: tuple[str, ...]):
        self.name, self._reason, self._device_types = name, f"cannot be imported: {error}", device_types

    def unavailable_reason(self) -> str | None:
        return self._reason

    def supports(self, device: torch.device) -> bool:
        return device.type in self._device_types


def _registry():
    try:
        from .cpu import NumbaBackend

        numba = NumbaBackend()
    except ImportError as error:
        numba = _Missing("numba", error, ("cpu",))
    from .gpu import TritonBackend  # imports Triton only when a kernel first runs

    return {"numba": numba, "triton": TritonBackend(), "reference": ReferenceBackend()}


BACKENDS = _registry()
# Preference order of "auto" per device type; the first available one that supports it wins.
_AUTO_ORDER = {"cpu": ("numba", "reference"), "cuda": ("triton", "reference")}


# What makes each engine available, named when "auto" has to pass it over.
_REMEDIES = {"numba": "pip install numba",
             "triton": "pip install 'gridsampler3d[gpu]' (Triton) next to a CUDA build of PyTorch"}
_warned_fallbacks: set[str] = set()


def _auto_backend(device: torch.device):
    """The backend "auto" picks for ``device``, and (name, reason) of each preferred one passed over."""
    passed_over = []
    for candidate in _AUTO_ORDER.get(device.type, ("reference",)):
        backend = BACKENDS[candidate]
        reason = backend.unavailable_reason()
        if reason is None and backend.supports(device):
            return backend, passed_over
        passed_over.append((candidate, reason or f"does not run on {device.type} tensors"))
    return BACKENDS["reference"], passed_over


def _warn_slow_fallback(device: torch.device, passed_over) -> None:
    """Warn once per device type that "auto" runs it on the NumPy reference (host copies, float64)."""
    if device.type in _warned_fallbacks:
        return
    _warned_fallbacks.add(device.type)
    if passed_over:
        why = "; ".join(f"{name}: {reason}" for name, reason in passed_over)
        remedy = "; ".join(f"for {name}: {_REMEDIES[name]}" for name, _ in passed_over if name in _REMEDIES)
    else:
        why, remedy = f"no engine runs {device.type} tensors", "compute on CPU or CUDA tensors"
    warnings.warn(f"gridsampler3d: backend='auto' runs {device.type} tensors on the NumPy reference, which copies "
                  f"them to the host and back and is far slower ({why}). Remedy: {remedy}. Pass "
                  f"backend='reference' to choose it knowingly. (Warned once.)", UserWarning, stacklevel=3)


def select_backend(name: str, device: torch.device):
    """The backend object for ``name`` ("auto" or a registered name) on ``device``.

    "auto" takes the first engine of the device type's preference order that runs here; when
    none does and only the (slow) reference is left, it warns once per device type, naming the remedy.
    """
    if not isinstance(name, str):
        raise TypeError(f"backend must be a str; got {type(name).__name__} {name!r}")
    if name == "auto":
        backend, passed_over = _auto_backend(device)
        if backend is BACKENDS["reference"]:
            _warn_slow_fallback(device, passed_over)
        return backend
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


def describe_backends() -> list[dict]:
    """One entry per backend: ``name``, ``available``, ``reason`` (why not, or None) and the
    ``device_types`` (of :data:`DEVICE_TYPES`) whose tensors it runs."""
    return [{"name": name, "available": backend.unavailable_reason() is None, "reason": backend.unavailable_reason(),
             "device_types": [kind for kind in DEVICE_TYPES if backend.supports(torch.device(kind))]}
            for name, backend in BACKENDS.items()]


def auto_choices() -> dict[str, str | None]:
    """The backend "auto" picks here for each device type of :data:`DEVICE_TYPES` (without warning);
    None for a type that has no device here (CUDA without a GPU)."""
    present = {"cpu": True, "cuda": torch.cuda.is_available()}
    return {kind: _auto_backend(torch.device(kind))[0].name if present[kind] else None for kind in DEVICE_TYPES}


def cpu_engine() -> str | None:
    """How the CPU engine compiles and runs here: its Numba path (docs/runtime.md) and the threads its parts
    run on; None where it cannot be imported. Asking chooses the threads, as the first call would."""
    if isinstance(BACKENDS["numba"], _Missing):
        return None
    from .cpu import jit, pool

    threads = {"team": "torch's OpenMP team", "workers": "the engine's worker threads"}[pool.route()]
    return f"{jit.describe()}; parts on {threads}"


def library_versions() -> dict[str, str]:
    """Installed versions of torch, numba and triton ("not installed" where absent); nothing is imported."""
    versions = {}
    for package in ("torch", "numba", "triton"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions
