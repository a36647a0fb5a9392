"""The one module that reads PyTorch's non-public API: each read, what it is for, and its public fallback.

Tested with torch 2.9.1 (the lowest release ``pyproject.toml`` admits) and 2.13.0
(``TESTED_TORCH``; ``tests/test_torch_hooks.py`` checks each hook). Each private name is
looked up once, at import; where a torch release lacks one, its hook falls back to a public
way that is correct but slower or less precise, and warns once naming the release (or, for
:func:`remove_library`, raises a clear error when it is asked for). Nothing here changes
anything in torch.

Each hook, the private API it reads, what for, and what happens where it is missing:

- :func:`functorch_wrapped`: ``torch._C._functorch.is_functorch_wrapped_tensor``, so that
  vmap / grad tensors take the custom ops; where missing, every call takes the custom ops.
  ``torch._C._are_functorch_transforms_active`` first, which ``autograd.Function`` asks
  too: outside a transform no tensor is asked about; where missing, every tensor is.
- :func:`dispatch_mode_active`: ``torch._C._len_torch_dispatch_stack`` (what
  ``torch.utils._python_dispatch._get_current_dispatch_mode`` reads), so that tensors under
  a dispatch mode take the custom ops; where missing, every call takes the custom ops.

- :func:`remove_library`: ``torch.library.Library._destroy``, so that ``unpatch_torch``
  removes the override; where missing, ``unpatch_torch`` raises, naming the remedy.
- :func:`onnx_export_in_progress`: the exporters' flags (``torch.onnx._internal``), so that
  an ONNX export's strict capture traces the composites; where missing,
  ``torch.onnx.is_in_onnx_export()``.
- :func:`requested_opset`: the TorchScript exporter's globals and the dynamo exporter's
  entry point's frame, to refuse opsets below 20 while the export traces; where missing,
  no opset is known and nothing is refused at trace time.

The dynamo exporter traces the model with ``torch.export`` first and converts the finished
model to the opset asked for afterwards; while the model is traced, the opset lives only in
the exporter's entry point's argument. torch has no public function, and no state of its
own, that holds it then: :func:`requested_opset` reads that argument from the entry point's
frame on the call stack.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
import warnings

import torch

__all__ = [
    "HOOKS",
    "TESTED_TORCH",
    "dispatch_mode_active",
    "functorch_wrapped",
    "missing_hooks",
    "onnx_export_in_progress",
    "remove_library",
    "requested_opset",
]

#: The oldest and newest torch releases the hooks were tested with.
TESTED_TORCH = ("2.9.1", "2.13.0")


def _lookup(module_name: str, *names: str):
    """``module_name``'s attribute ``names[0]``, then that one's ``names[1]``, ...; None where any is missing."""
    try:
        found = importlib.import_module(module_name)
    except ImportError:
        return None
    for name in names:
        found = getattr(found, name, None)
        if found is None:
            return None
    return found


_is_functorch_wrapped = _lookup("torch._C._functorch", "is_functorch_wrapped_tensor")
_functorch_active = _lookup("torch._C", "_are_functorch_transforms_active")
_dispatch_stack_depth = _lookup("torch._C", "_len_torch_dispatch_stack")
_library_destroy = getattr(torch.library.Library, "_destroy", None)
# The dynamo exporter's flag, and the TorchScript exporter's globals: their home since torch
# 2.9, or the one before.
_dynamo_flags = _lookup("torch.onnx._internal.exporter._flags")
_torchscript_globals = _lookup("torch.onnx._internal.torchscript_exporter._globals", "GLOBALS") or _lookup(
    "torch.onnx._globals", "GLOBALS"
)
# The dynamo exporter's entry point, whose frame holds the opset asked for. Looked up on first use: its module
# imports onnxscript (about two seconds), which importing this package should not pay.
_EXPORT_ENTRY = ("torch.onnx._internal.exporter._compat", "export_compat")


@functools.cache
def _export_entry():
    return _lookup(*_EXPORT_ENTRY)


def _module_exists(module_name: str) -> bool:
    """Whether ``module_name`` can be imported, without importing it (its parent packages excepted)."""
    try:
        return importlib.util.find_spec(module_name) is not None
    except ImportError:
        return False


#: Each hook and whether this torch has what it reads.
HOOKS = {
    "functorch_wrapped": _is_functorch_wrapped is not None and _functorch_active is not None,
    "dispatch_mode_active": _dispatch_stack_depth is not None,
    "remove_library": _library_destroy is not None,
    "onnx_export_in_progress": _dynamo_flags is not None or _torchscript_globals is not None,
    "requested_opset": _torchscript_globals is not None or _module_exists(_EXPORT_ENTRY[0]),
}


def missing_hooks() -> list[str]:
    """The hooks that fall back to public API with this torch."""
    return [name for name, present in HOOKS.items() if not present]


if missing_hooks():
    warnings.warn(
        f"gridsampler3d: torch {torch.__version__} lacks what these hooks read: "
        f"{', '.join(missing_hooks())}; they fall back to public API (torch_hooks.py says how). "
        f"Tested with torch {TESTED_TORCH[0]} to {TESTED_TORCH[1]}.",
        RuntimeWarning,
        stacklevel=2,
    )


def functorch_wrapped(*tensors: torch.Tensor) -> bool:
    """Whether any of ``tensors`` (None ones aside) is wrapped by a functorch transform (``vmap``, ``grad``): such
    calls take the custom ops. Outside a transform none is (one test for all).

    Without the private test, every tensor counts as wrapped: correct, and slower.
    """
    if _is_functorch_wrapped is None or _functorch_active is None:
        return True
    if not _functorch_active():
        return False
    for tensor in tensors:
        if tensor is not None and _is_functorch_wrapped(tensor):
            return True
    return False


def dispatch_mode_active() -> bool:
    """Whether a ``TorchDispatchMode`` is active (fake tensors, FlopCounter, ...): such calls take the custom ops.

    Without the private read, a mode counts as active: correct, and slower.
    """
    return True if _dispatch_stack_depth is None else _dispatch_stack_depth() > 0


def remove_library(library: torch.library.Library) -> None:
    """Remove every kernel ``library`` registered: PyTorch's own kernels run again."""
    if _library_destroy is None:
        raise RuntimeError(
            f"gridsampler3d: torch {torch.__version__} cannot remove a registered kernel (no "
            f"Library._destroy); PyTorch's own kernels come back in a new process. Tested with "
            f"torch {TESTED_TORCH[0]} to {TESTED_TORCH[1]}."
        )
    _library_destroy(library)


def onnx_export_in_progress() -> bool:
    """Whether ``torch.onnx.export`` is under way, by either exporter.

    torch.export's strict capture, the dynamo exporter's second try, reads the public
    ``torch.onnx.is_in_onnx_export()`` as False: only the exporters' own flags tell.
    """
    if _dynamo_flags is None and _torchscript_globals is None:
        return torch.onnx.is_in_onnx_export()
    if getattr(_dynamo_flags, "_is_onnx_exporting", False):
        return True
    # The TorchScript exporter never runs under Dynamo, which will not trace its globals' property (torch 2.9).
    if torch.compiler.is_dynamo_compiling():
        return False
    return bool(getattr(_torchscript_globals, "in_onnx_export", False))


def requested_opset() -> int | None:
    """The opset of the model the export under way writes, or None where torch does not say (see above)."""
    if _torchscript_globals is not None and getattr(_torchscript_globals, "in_onnx_export", False):
        return _torchscript_globals.export_onnx_opset_version
    entry = _export_entry()
    if entry is None:
        return None
    code = inspect.unwrap(entry).__code__
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return frame.f_locals.get("opset_version")
        frame = frame.f_back
    return None
