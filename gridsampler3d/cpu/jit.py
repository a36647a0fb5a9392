"""How the CPU engine declares its Numba helpers: inlined by LLVM, compiled once per argument type.

A kernel is built per mode (:func:`.forward.forward_kernel`), and passes its modes to the
helpers as constants. Numba would type each constant as a literal and compile a helper,
and every helper below it, once per distinct set of constant values: the same helper a
dozen times across the modes of one process. Helpers declared here see plain types
(``int64``, ``bool``) instead, so each compiles once per dtype; LLVM then inlines it into
the kernel, where the constants fold and each kernel keeps only its own mode's code.
"""
from __future__ import annotations

from numba import types
from numba.core.registry import CPUDispatcher

__all__ = ["helper", "outlined_helper"]

_OPTIONS = {"nopython": True, "error_model": "numpy", "nogil": True, "boundscheck": None}


class _PlainTypeDispatcher(CPUDispatcher):
    """A dispatcher that types every call's arguments without their literal values."""

    def get_call_template(self, args, kws):
        args = tuple(types.unliteral(arg) for arg in args)
        kws = {name: types.unliteral(arg) for name, arg in kws.items()}
        return super().get_call_template(args, kws)


def _declare(func, **options):
    dispatcher = _PlainTypeDispatcher(py_func=func, locals={}, targetoptions={**_OPTIONS, **options})
    dispatcher.enable_caching()
    return dispatcher


def helper(func):
    """A helper LLVM inlines into each kernel that calls it (``forceinline``)."""
    return _declare(func, forceinline=True)


def outlined_helper(func):
    """A helper kept as a call: for code that, inlined, slows the compile of the loop beside it."""
    return _declare(func)
