"""How the CPU engine declares its Numba kernels and helpers, on one of two paths.

A kernel is built per mode (:func:`.forward.forward_kernel`), and passes its modes to the
helpers as constants. Numba would type each constant as a literal and compile a helper,
and every helper below it, once per distinct set of constant values: the same helper a
dozen times across the modes of one process. Helpers declared here see plain types
(``int64``, ``bool``) instead, so each compiles once per dtype; LLVM then inlines it into
the kernel, where the constants fold and each kernel keeps only its own mode's code.

Every kernel is declared here (:func:`part_kernel`): each computes one part of a pass (a
thread's rows or slab) as a plain serial function, and :class:`Parallel` runs the parts
on the engine's threads (:func:`.pool.run_parts`); no kernel uses ``prange``, so the
engine never starts a Numba threading layer. A ``prange`` loop around the kernel body
made Numba type that body twice (once for the kernel, once for the outlined parallel
body) and analyse it for parallelism, which cost about half of each kernel's compile
time; a small ``prange`` launcher calling the serial kernel still cost about 0.5 s of
compile per kernel family.

Both compile for the CPU the way :func:`.tuning.hardware_gathers_pay` decides: with
hardware gathers for the taps' indexed loads, or, where gathers are slow (AMD Zen),
with each lane's load a scalar load while the arithmetic stays vectorised. The choice
changes machine code only, never a result.

The two paths (docs/runtime.md):

- hooked, the default: :mod:`.numba_hooks`, the one module that uses Numba's non-public
  API, gives the plain-type helpers, ``noalias``, the choice of gathers, and a disk cache
  keyed on the engine's sources (every ``*.py`` of this folder);
- plain: ``numba.njit`` with documented options only, where :mod:`.numba_hooks` cannot be
  imported with the installed Numba (one warning naming its version), or on request
  (``GRIDSAMPLER3D_PLAIN_NUMBA=1``). The same results, bit for bit; slower kernels and
  compiles, and no disk cache: Numba's own cache is keyed on a kernel's file alone, so a
  kernel cached before a helper's file changed would load with the old helper in it.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import pathlib
import warnings

import llvmlite.binding
import numba
import numpy as np

from . import pool
from .records import unnamed
from .tuning import hardware_gathers_pay

__all__ = [
    "TESTED_NUMBA",
    "Parallel",
    "borrowed",
    "compile_path",
    "gathers_in_use",
    "helper",
    "outlined_helper",
    "part_kernel",
    "part_rows",
    "plain",
    "zero_elements",
]

#: The oldest and newest Numba releases the hooks were tested with (``pyproject.toml`` requires this range).
TESTED_NUMBA = ("0.62.1", "0.68.1")

_OPTIONS = {"nopython": True, "error_model": "numpy", "nogil": True, "boundscheck": None}
# Numba's documented decorator options, for the plain path (njit implies nopython).
_PLAIN_OPTIONS = {"error_model": "numpy", "nogil": True}


def _load_hooks():
    """(:mod:`.numba_hooks`, None), or (None, why the plain path is taken)."""
    requested = os.environ.get("GRIDSAMPLER3D_PLAIN_NUMBA", "")
    if requested not in ("", "0"):
        return None, f"GRIDSAMPLER3D_PLAIN_NUMBA={requested}"
    try:
        from . import numba_hooks
    except (ImportError, AttributeError) as error:
        warnings.warn(
            f"gridsampler3d: Numba {numba.__version__} lacks a hook of the CPU engine ({error}); its "
            f"kernels compile with Numba's public API instead: the same results, slower, and compiled "
            f"anew in every process. Tested with Numba {TESTED_NUMBA[0]} to {TESTED_NUMBA[1]}.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None, f"Numba {numba.__version__} lacks a hook: {error}"
    return numba_hooks, None


_hooks, _plain_reason = _load_hooks()


def plain() -> bool:
    """Whether the engine declares its kernels with ``numba.njit`` alone (the plain path)."""
    return _hooks is None


def compile_path() -> str:
    """One line on how the kernels compile here: the path, the Numba version and, hooked, the hooks in use."""
    if _hooks is None:
        return f"plain: numba.njit alone (numba {numba.__version__}; {_plain_reason}; no disk cache)"
    loads = "hardware gathers" if gathers_in_use() else "lane-by-lane loads"
    return f"numba {numba.__version__}, hooks: {', '.join(_hooks.HOOKS)}, {loads}"


@functools.cache
def _cpu_name() -> str:
    """The LLVM name of the CPU Numba compiles for (``NUMBA_CPU_NAME`` or this machine's)."""
    return numba.config.CPU_NAME or llvmlite.binding.get_host_cpu_name()


def gathers_in_use() -> bool:
    """Whether the engine's kernels compile their indexed loads to hardware gathers on this CPU.

    On the plain path LLVM decides, as for any Numba code.
    """
    return _hooks is None or hardware_gathers_pay(_cpu_name())


@functools.cache
def _engine_sources() -> str:
    """A digest of the CPU engine's source files (the helpers that every kernel inlines live in them) and of
    the modules whose numbers the kernels take in as constants (modes, the rules' numbers, rounding, the field
    kinds) or whose functions they compile (the affine field's entry-wise formulas)."""
    digest = hashlib.sha256()
    engine = pathlib.Path(__file__).parent
    shared = [engine.parent / name for name in ("affine.py", "modes.py", "reference.py", "rounding.py", "sampling.py")]
    for path in [*sorted(engine.glob("*.py")), *shared]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _cache_key() -> tuple[str, str]:
    """What a cache entry's key holds besides Numba's own: the build and the engine's sources."""
    return "gathers" if gathers_in_use() else "lane loads", _engine_sources()


def _declare(func, options: dict, plain_types: bool, cache: bool):
    if _hooks is None:
        plain_options = {name: value for name, value in options.items() if name in ("forceinline",)}
        return numba.njit(func, **_PLAIN_OPTIONS, **plain_options)
    return _hooks.declare(
        func,
        {**_OPTIONS, **options},
        plain_types=plain_types,
        gathers=gathers_in_use(),
        link_only=plain_types,
        cache_key=_cache_key if cache else None,
    )


# Helpers are called from kernels only: no wrappers to call them from Python or C.
_HELPER_OPTIONS = {"no_cpython_wrapper": True, "no_cfunc_wrapper": True}


def helper(func):
    """A helper LLVM inlines into each kernel that calls it (``forceinline``).

    Helpers compile with ``noalias`` too: Numba optimises, and vectorises, each helper in
    its own module before LLVM inlines it, so a helper's loops need their own guarantee
    that the arrays they store into overlap no other argument (see :func:`part_kernel`).
    A caller therefore never passes overlapping arrays to a helper that writes one of
    them (the same array may go to several arguments that the call leaves untouched).
    """
    return _declare(func, {**_HELPER_OPTIONS, "forceinline": True}, True, True)


def outlined_helper(func, cache: bool = True):
    """A helper kept as a call: for code that, inlined, slows the compile of the loop beside it (``noalias`` too).

    ``cache=False`` compiles without the disk cache (whose code cannot be inspected).
    """
    return _declare(func, _HELPER_OPTIONS, True, cache)


def part_kernel(func, cache: bool = True):
    """Declare ``func(*operands, part)``: part ``part`` of a pass, compiled serially with ``noalias``, cached on disk.

    It releases the GIL while it runs, so that :class:`Parallel` can run its parts on
    several Python threads at once. Its array operands are to go through :func:`borrowed`.

    Scratch arrays belong among the operands too (:class:`Parallel` allocates them, a row
    per part). Arrays allocated inside the kernel are not known to be disjoint, and LLVM
    guards each vectorised loop with a run-time overlap test whose bounds it
    overestimates (Numba's wrap-around of negative indices): the test failed or passed by
    the chance of where the allocator put the arrays, and when it failed the loop ran its
    scalar copy, the backward's grid gradient 1.3 times slower on 32 channels
    (docs/cpu.md). (A jitted wrapper that allocates and calls the kernel costs about 1 s
    of compile per kernel: Numba optimises the linked kernel again inside the wrapper.)
    """
    return _declare(func, {}, False, cache)


def _borrowed(array):
    """The array itself (the plain path's :func:`borrowed`: its reference is counted as any other)."""
    return array


def _zero_elements(array, start, count):
    """``array[start:start + count] = 0`` (the plain path's :func:`zero_elements`)."""
    array[start : start + count] = 0


#: ``borrowed(array)``: the same array without its reference to the memory manager, for
#: the operands of a part kernel (:func:`.numba_hooks.borrowed`).
borrowed = helper(_borrowed) if _hooks is None else _hooks.borrowed
#: ``zero_elements(array, start, count)``: ``array[start:start + count] = 0`` as one
#: memset (:func:`.numba_hooks.zero_elements`).
zero_elements = helper(_zero_elements) if _hooks is None else _hooks.zero_elements


_LINE_BYTES = 64  # a cache line


def part_rows(parts: int, entries: int, dtype=np.float64) -> np.ndarray:
    """An uninitialised scratch array of ``parts`` rows of at least ``entries`` entries, each row on lines of its own.

    Rows are ``entries`` rounded up to whole cache lines, the first starting on a line.
    Packed rows of neighbouring parts shared a line where one ended and the next began:
    two threads storing into their rows then took the line from each other at every
    store (the channels-last forward's per-channel sums, 128-byte rows 32 bytes off a
    line, at two threads: each part took as long as the whole forward on one thread).
    """
    itemsize = np.dtype(dtype).itemsize
    per_line = _LINE_BYTES // itemsize
    width = -(-entries // per_line) * per_line
    buffer = np.empty(parts * width + per_line, dtype)
    skip = (-buffer.ctypes.data % _LINE_BYTES) // itemsize
    return buffer[skip : skip + parts * width].reshape(parts, width)


class Parallel:
    """A part kernel called as one parallel kernel: ``kernel(*operands)`` runs ``part(*operands, p)`` for every part p.

    The operand named ``parts`` gives the part count: a number, or an array with one row
    per part. ``scratch``, where given, is called as ``scratch(count, *operands)`` and
    returns the arrays the parts work in, each with a row per part: they are appended to
    the operands (see :func:`part_kernel`). :func:`.pool.run_parts` runs the parts on the
    engine's threads and returns when all are done.
    """

    def __init__(self, part, scratch=None):
        self.part = part
        self.py_func = part.py_func
        self._scratch = scratch
        self._parts_at = list(inspect.signature(part.py_func).parameters).index("parts")

    @property
    def signatures(self):
        return self.part.signatures

    def __call__(self, *operands):
        pool.run_parts(*self.launch(*operands))

    def part_count(self, *operands) -> int:
        """How many parts a call with ``operands`` runs."""
        parts = operands[self._parts_at]
        return len(parts) if hasattr(parts, "__len__") else int(parts)

    def scratch(self, count: int, *operands) -> tuple:
        """The arrays ``count`` parts of a call with ``operands`` work in (appended to the operands), or ()."""
        return self._scratch(count, *operands) if self._scratch is not None else ()

    def launch(self, *operands):
        """(part kernel, operands with the scratch appended, part count): a launch for :func:`.pool.run_together`.

        The operands go to the kernel with their records as plain tuples (:func:`.records.unnamed`).
        """
        count = self.part_count(*operands)
        if self._scratch is not None:
            operands += self._scratch(count, *operands)
        return self.part, unnamed(operands), count
