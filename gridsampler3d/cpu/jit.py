"""How the CPU engine declares its Numba helpers: inlined by LLVM, compiled once per argument type.

A kernel is built per mode (:func:`.forward.forward_kernel`), and passes its modes to the
helpers as constants. Numba would type each constant as a literal and compile a helper,
and every helper below it, once per distinct set of constant values: the same helper a
dozen times across the modes of one process. Helpers declared here see plain types
(``int64``, ``bool``) instead, so each compiles once per dtype; LLVM then inlines it into
the kernel, where the constants fold and each kernel keeps only its own mode's code.

Kernels are declared here too (:func:`part_kernel`): each computes one part of a pass (a
thread's rows or slab) as a plain serial function, and :class:`Parallel` runs the parts
on the engine's threads (:func:`.pool.run_parts`). A ``prange`` loop around the kernel
body made Numba type that body twice (once for the kernel, once for the outlined parallel
body) and analyse it for parallelism, which cost about half of each kernel's compile
time; a small ``prange`` launcher calling the serial kernel still cost about 0.5 s of
compile per kernel family.

Both compile for the CPU the way :func:`.tuning.hardware_gathers_pay` decides: with
hardware gathers for the taps' indexed loads, or, where gathers are slow (AMD Zen),
with each lane's load a scalar load while the arithmetic stays vectorised. The choice
changes machine code only, never a result.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import pathlib

import llvmlite.binding
import numpy as np
from numba import config, types
from numba.core import cgutils, lowering
from numba.core.caching import FunctionCache
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import register_pass
from numba.core.dispatcher import _FunctionCompiler
from numba.core.registry import CPUDispatcher, cpu_target
from numba.core.typed_passes import NativeLowering
from numba.extending import intrinsic

from . import pool
from .tuning import hardware_gathers_pay

__all__ = ["Parallel", "borrowed", "gathers_in_use", "helper", "outlined_helper", "part_kernel", "part_rows",
           "zero_elements"]

_OPTIONS = {"nopython": True, "error_model": "numpy", "nogil": True, "boundscheck": None}


class _PlainTypeDispatcher(CPUDispatcher):
    """A dispatcher that types every call's arguments without their literal values."""

    def get_call_template(self, args, kws):
        args = tuple(types.unliteral(arg) for arg in args)
        kws = {name: types.unliteral(arg) for name, arg in kws.items()}
        return super().get_call_template(args, kws)


def _declare(func, cache: bool = True, **options):
    # Helpers are called from kernels only: no wrappers to call them from Python or C.
    options = {**_OPTIONS, "no_cpython_wrapper": True, "no_cfunc_wrapper": True, **options}
    dispatcher = _PlainTypeDispatcher(py_func=func, locals={}, targetoptions=options)
    _compile_without_aliases(dispatcher)
    if cache:
        _enable_caching(dispatcher)
    return dispatcher


def helper(func):
    """A helper LLVM inlines into each kernel that calls it (``forceinline``).

    Helpers compile with ``noalias`` too: Numba optimises, and vectorises, each helper in
    its own module before LLVM inlines it, so a helper's loops need their own guarantee
    that the arrays they store into overlap no other argument (see :func:`part_kernel`).
    A caller therefore never passes overlapping arrays to a helper that writes one of
    them (the same array may go to several arguments that the call leaves untouched).
    """
    return _declare(func, forceinline=True)


def outlined_helper(func, cache: bool = True):
    """A helper kept as a call: for code that, inlined, slows the compile of the loop beside it (``noalias`` too).

    ``cache=False`` compiles without the disk cache (whose code cannot be inspected).
    """
    return _declare(func, cache)


class _NoAliasCompiler(_FunctionCompiler):
    """Compiles with Numba's ``noalias`` flag: array arguments are declared not to overlap.

    It is what Numba gives the outlined body of a ``prange`` loop whose alias analysis finds
    no alias, and what lets LLVM vectorise the block loops (their stores cannot change the
    arrays the next lanes read).
    """

    def _customize_flags(self, flags):
        flags.noalias = True
        return flags


@functools.cache
def _cpu_name() -> str:
    """The LLVM name of the CPU Numba compiles for (``NUMBA_CPU_NAME`` or this machine's)."""
    return config.CPU_NAME or llvmlite.binding.get_host_cpu_name()


@functools.cache
def _features_without_gathers() -> str:
    """The ``target-features`` function attribute that turns LLVM's gathers into scalar loads.

    A function's ``target-features`` replaces the target machine's feature string for that
    function, so it is Numba's own string plus the tuning flag ``prefer-no-gather`` (with
    it LLVM's vectoriser loads each lane of an indexed load on its own and keeps the
    arithmetic in vectors). Every kernel and helper of the engine gets the same string, so
    LLVM still inlines the helpers into the kernels.
    """
    features = getattr(cpu_target.target_context.codegen(), "_tm_features", None)
    if features is None:
        features = config.CPU_FEATURES or llvmlite.binding.get_host_cpu_features().flatten()
    return f'"target-features"="{features},+prefer-no-gather"'


class _NoGatherLower(lowering.Lower):
    """Numba's lowering, with the functions it defines marked to compile without hardware gathers."""

    def post_lower(self):
        super().post_lower()
        marker = _features_without_gathers()
        for function in self.module.functions:
            if function.blocks:
                # llvmlite knows no string attributes; the set's entries are written out as
                # they are, after the function's signature.
                set.add(function.attributes, marker)


@register_pass(mutates_CFG=True, analysis_only=False)
class _NoGatherLowering(NativeLowering):
    _name = "gridsampler3d_no_gather_lowering"

    @property
    def lowering_class(self):
        return _NoGatherLower


class _NoGatherPipeline(CompilerBase):
    """Numba's nopython pipeline with :class:`_NoGatherLowering` in place of its lowering pass."""

    def define_pipelines(self):
        manager = DefaultPassBuilder.define_nopython_pipeline(self.state)
        manager.passes = [(_NoGatherLowering if step is NativeLowering else step, description)
                          for step, description in manager.passes]
        manager.finalize()
        return [manager]


def gathers_in_use() -> bool:
    """Whether the engine's kernels compile their indexed loads to hardware gathers on this CPU."""
    return hardware_gathers_pay(_cpu_name())


@functools.cache
def _engine_sources() -> str:
    """A digest of the CPU engine's source files (the helpers that every kernel inlines live in them) and of
    the modules whose numbers the kernels take in as constants (modes, the rules' numbers, rounding)."""
    digest = hashlib.sha256()
    engine = pathlib.Path(__file__).parent
    shared = [engine.parent / name for name in ("modes.py", "reference.py", "rounding.py")]
    for path in [*sorted(engine.glob("*.py")), *shared]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


class _BuildCache(FunctionCache):
    """Numba's disk cache with the build (gathers or lane-by-lane loads) and the engine's sources in every entry's key.

    Numba keys an entry by signature, CPU and the function's own code, and drops the entry
    when the function's file changes; the build is none of them, so without it a cache
    written by the other build would be loaded as it is. Nor are the helpers a kernel
    calls: a kernel cached before a helper's file (such as :mod:`.block`) changed would
    load with the old helper compiled into it.
    """

    def _index_key(self, sig, codegen):
        return (*super()._index_key(sig, codegen), "gathers" if gathers_in_use() else "lane loads",
                _engine_sources())


def _enable_caching(dispatcher):
    dispatcher._cache = _BuildCache(dispatcher.py_func)


def _compile_without_aliases(dispatcher):
    pipeline = dispatcher._compiler.pipeline_class if gathers_in_use() else _NoGatherPipeline
    dispatcher._compiler = _NoAliasCompiler(dispatcher.py_func, dispatcher.targetdescr, dispatcher.targetoptions, {},
                                            pipeline)


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
    dispatcher = CPUDispatcher(py_func=func, locals={}, targetoptions=dict(_OPTIONS))
    _compile_without_aliases(dispatcher)
    if cache:
        _enable_caching(dispatcher)
    return dispatcher


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
    return buffer[skip:skip + parts * width].reshape(parts, width)


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
        """(part kernel, operands with the scratch appended, part count): a launch for :func:`.pool.run_together`."""
        count = self.part_count(*operands)
        if self._scratch is not None:
            operands += self._scratch(count, *operands)
        return self.part, operands, count


@intrinsic
def borrowed(typingctx, array):
    """The same array without its reference to the memory manager: for the operands of a part kernel.

    An array that a kernel receives from Python carries its NumPy owner's reference
    count, and every view of it or call of an outlined helper with it counts a reference
    up and down, atomically: the channels-last forward, which calls a helper per block,
    ran 1.5 to 1.8 times slower, and its two threads contended for the one counter. The
    caller keeps the array alive for the whole call, so no count is needed (the
    outlined body of a ``prange`` loop receives its arrays this way too).
    """
    if not isinstance(array, types.Array):
        return None

    def codegen(context, builder, signature, arguments):
        view = cgutils.create_struct_proxy(array)(context, builder, value=arguments[0])
        view.meminfo = cgutils.get_null_value(view.meminfo.type)
        view.parent = cgutils.get_null_value(view.parent.type)
        return view._getvalue()

    return array(array), codegen


@intrinsic
def zero_elements(typingctx, array, start, count):
    """``array[start:start + count] = 0`` as one ``llvm.memset``, for a range the caller knows to be inside ``array``.

    ``count`` must not be negative (nothing is checked). Inside a kernel's loops, a loop of
    stores or a slice assignment cost seconds of compile: LLVM copied it many times over
    as unswitched and unrolled loops (docs/cpu.md, "Compilation"); this is one call.
    """
    if not (isinstance(array, types.Array) and isinstance(start, types.Integer) and isinstance(count, types.Integer)):
        return None

    def codegen(context, builder, signature, arguments):
        view = context.make_array(array)(context, builder, value=arguments[0])
        first = context.cast(builder, arguments[1], signature.args[1], types.intp)
        length = context.cast(builder, arguments[2], signature.args[2], types.intp)
        itemsize = context.get_abi_sizeof(context.get_data_type(array.dtype))
        pointer = builder.gep(view.data, [first])
        cgutils.memset(builder, pointer, builder.mul(length, cgutils.intp_t(itemsize)), 0)
        return context.get_dummy_value()

    return types.none(array, start, count), codegen
