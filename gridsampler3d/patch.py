"""Run ``aten::grid_sampler_3d`` and its backward on this library's kernels (the drop-in).

``patch_torch()`` registers this library's kernels for PyTorch's own operators on the
CPU (and CUDA where present), in place of PyTorch's: every 5-D ``F.grid_sample`` call —
in MONAI, kornia or a model of your own — then runs here, unmodified. 4-D calls use other
operators and are untouched. This overrides an operator registration for the whole
process; ``unpatch_torch()`` removes the override, after which PyTorch's own kernels run
again exactly as before.

The patch is counted: each ``patch_torch()`` needs its ``unpatch_torch()``, and the
override goes with the last one, so that a library that patches and unpatches around its
own work leaves a user's patch in force. ``patched()`` is one such pair.

PyTorch warns, once per process, when any kernel of its own operators is overridden (a
nine-line ``UserWarning``, "Overriding a previously registered kernel"). The override is
what the patch is for, so that one warning is silenced while the patch registers, and no
other; the next override by other code in the process would have been told nothing
either way (PyTorch says it once, for all operators).

PyTorch refuses ``mode="bicubic"`` on 5-D input before it reaches those operators, so
the patch also wraps ``torch.nn.functional.grid_sample``: a 5-D bicubic call goes to
:func:`gridsampler3d.grid_sample`, every other call to PyTorch's function unchanged. (Code
that imported ``grid_sample`` by name before patching keeps PyTorch's refusal.)
"""

from __future__ import annotations

import contextlib
import threading
import warnings

import torch

from . import api, torch_hooks

__all__ = ["patch_torch", "unpatch_torch", "patched", "is_patched"]

_library = None
_torch_grid_sample = None
_patches = 0  # patch_torch() calls not yet matched by unpatch_torch()
_lock = threading.Lock()


def _grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    """``F.grid_sample`` that also takes 5-D bicubic (tricubic) input."""
    if mode == "bicubic" and isinstance(input, torch.Tensor) and input.dim() == 5:
        from .nn import grid_sample

        return grid_sample(input, grid, mode, padding_mode, align_corners)
    return _torch_grid_sample(input, grid, mode, padding_mode, align_corners)


def _forward(input, grid, interpolation_mode, padding_mode, align_corners):
    return api.grid_sampler3d(input, grid, interpolation_mode, padding_mode, align_corners)


def _backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    dx, dgrid = api.grid_sampler3d_backward(
        grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask=tuple(output_mask)
    )
    # PyTorch's kernel returns an undefined grad_input when it is not asked for.
    return dx, (torch.zeros_like(grid) if dgrid is None else dgrid)


def patch_torch() -> None:
    """Route ``aten::grid_sampler_3d{,_backward}`` on CPU (and CUDA if available) to this library.

    Counted: the override stays until as many :func:`unpatch_torch` calls as there were of this one.
    """
    global _library, _torch_grid_sample, _patches
    with _lock:
        _patches += 1
        if _library is not None:
            return
        library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=r"(?s).*Overriding a previously registered kernel", category=UserWarning
            )
            for device in ("CPU", "CUDA") if torch.cuda.is_available() else ("CPU",):
                library.impl("grid_sampler_3d", _forward, device)
                library.impl("grid_sampler_3d_backward", _backward, device)
        _library = library
        _torch_grid_sample = torch.nn.functional.grid_sample
        torch.nn.functional.grid_sample = _grid_sample


def unpatch_torch() -> None:
    """Undo one :func:`patch_torch`; the last one removes the override, and PyTorch's own kernels run again.
    Without a patch in force it does nothing."""
    global _library, _torch_grid_sample, _patches
    with _lock:
        if _library is None:
            return
        _patches -= 1
        if _patches > 0:
            return
        torch_hooks.remove_library(_library)
        _library = None
        torch.nn.functional.grid_sample = _torch_grid_sample
        _torch_grid_sample = None


def is_patched() -> bool:
    """Whether ``patch_torch()`` is in effect."""
    return _library is not None


@contextlib.contextmanager
def patched():
    """``with gridsampler3d.patched(): ...`` runs 5-D ``F.grid_sample`` on this library inside the block: one
    counted :func:`patch_torch` and its :func:`unpatch_torch`, so a patch in force outside stays."""
    patch_torch()
    try:
        yield
    finally:
        unpatch_torch()
