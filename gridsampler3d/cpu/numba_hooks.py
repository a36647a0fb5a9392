"""Every use of Numba's non-public API in the package: the hooks :mod:`.jit` declares kernels and helpers with.

Tested with Numba 0.62.1 and 0.68.1 (llvmlite 0.45.1 and 0.50.0); ``pyproject.toml``
requires that range. (With 0.61.2 the CPU tests passed but one: its LLVM 15 ignores the
no-gather flag, so Zen builds kept their gathers.) Importing this module raises ImportError or AttributeError where a
Numba release lacks a class or method hooked here; :mod:`.jit` then declares everything
with ``numba.njit`` and its documented options alone (the plain path, docs/runtime.md).

The hooks, each kept for a measured reason (docs/runtime.md, "The Numba boundary"):

- plain-type helpers (:class:`_PlainTypeDispatcher`): a helper is compiled once per
  dtype, not once per set of constant mode values;
- link-only helpers (:class:`_LinkOnlyLibrary`): a helper's IR is linked into the kernels
  that call it, and Numba emits no machine code of its own for it;
- ``noalias`` (:class:`_NoAliasCompiler`): array arguments are declared not to overlap,
  which lets LLVM vectorise the block loops;
- scalar lane loads where hardware gathers are slow (:class:`_NoGatherLowering`);
- a disk cache keyed on the engine's sources (:class:`_EngineKeyedCache`), which also
  reads a cache warmed beside the package where it cannot write there
  (:class:`_ReadOnlyBesideSources`);
- two intrinsics that write LLVM IR with ``numba.core.cgutils``: :func:`borrowed`,
  :func:`zero_elements`.

Nothing here changes Numba for other code: the classes are used only by the dispatchers
:func:`declare` returns (the lowering pass is registered under a name of its own).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import pickle
import warnings

import llvmlite.binding
from numba import config, types
from numba.core import cgutils, lowering
from numba.core.caching import (
    CompileResultCacheImpl,
    FunctionCache,
    IndexDataCacheFile,
    InTreeCacheLocator,
    NullCache,
)
from numba.core.codegen import JITCodeLibrary
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import register_pass
from numba.core.dispatcher import _FunctionCompiler
from numba.core.registry import CPUDispatcher, cpu_target
from numba.core.typed_passes import NativeLowering
from numba.extending import intrinsic

__all__ = ["HOOKS", "borrowed", "cache_folders", "declare", "zero_elements"]

# What `gridsampler3d backends` names.
HOOKS = ("plain-type helpers", "link-only helpers", "noalias", "engine-keyed cache")


def _require(owner, *names: str) -> None:
    """Raise AttributeError unless ``owner`` has every attribute in ``names`` (the methods overridden here)."""
    missing = [name for name in names if not hasattr(owner, name)]
    if missing:
        raise AttributeError(f"{owner.__module__}.{owner.__qualname__} has no {', '.join(missing)}")


_require(CPUDispatcher, "get_call_template")
_require(_FunctionCompiler, "_customize_flags")
_require(lowering.Lower, "post_lower")
_require(NativeLowering, "lowering_class")
_require(DefaultPassBuilder, "define_nopython_pipeline")
_require(FunctionCache, "_index_key", "_load_overload", "_save_overload")
_require(CompileResultCacheImpl, "_locator_classes")


class _PlainTypeDispatcher(CPUDispatcher):
    """A dispatcher that types every call's arguments without their literal values."""

    def get_call_template(self, args, kws):
        args = tuple(types.unliteral(arg) for arg in args)
        kws = {name: types.unliteral(arg) for name, arg in kws.items()}
        return super().get_call_template(args, kws)


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


class _LinkOnlyLibrary(JITCodeLibrary):
    """A helper's code library: LLVM IR to link into the kernels that call it, never machine code of its own.

    Numba finalises every function it compiles: it optimises the function's module once
    more as a whole and emits its machine code. A helper runs only inside the kernels that
    call it, and each kernel links the helper's IR in and optimises and emits the whole, so
    for a helper both steps were spent for nothing (measured in CHANGELOG.md, 2026-12-04;
    the first call's time: docs/cpu.md, "Compilation"). The helper's module keeps its
    function-level optimisation; only its environment global goes to the execution engine.
    The disk cache keeps the helper's IR (Numba's cache keeps machine code), so a process
    that compiles a new mode's kernel still loads the helpers compiled before.
    """

    def _optimize_final_module(self):
        pass

    def _finalize_final_module(self):
        self._finalize_dynamic_globals()
        self._verify_declare_only_symbols()
        # Numba writes the environment's address into the helper's environment global
        # once it is compiled (CPUCodegen.set_env), so the engine must define that global.
        names = [
            variable.name
            for variable in self._final_module.global_variables
            if variable.name.startswith("_ZN08NumbaEnv")
        ]
        if names:
            self._codegen._add_module(
                llvmlite.binding.parse_assembly("\n".join(f'@"{name}" = common global i8* null' for name in names))
            )
        self._finalized = True

    def get_asm_str(self):
        """The helper's machine code as a kernel holds it: a copy of its module optimised as a kernel's is."""
        final = self._final_module
        self._final_module = final.clone()
        try:
            super()._optimize_final_module()
            return super().get_asm_str()
        finally:
            self._final_module = final

    def serialize_using_object_code(self):
        # For the disk cache, which Numba fills with machine code: there is none, so the IR.
        return self.serialize_using_bitcode()


@register_pass(mutates_CFG=True, analysis_only=False)
class _LinkOnlyLowering(NativeLowering):
    """Numba's lowering into a :class:`_LinkOnlyLibrary` (for helpers)."""

    _name = "gridsampler3d_link_only_lowering"

    def run_pass(self, state):
        if state.library is None:
            state.library = _LinkOnlyLibrary(state.targetctx.codegen(), state.func_id.func_qualname)
        return super().run_pass(state)


@register_pass(mutates_CFG=True, analysis_only=False)
class _NoGatherLinkOnlyLowering(_LinkOnlyLowering, _NoGatherLowering):
    """Both: a :class:`_LinkOnlyLibrary`, lowered by :class:`_NoGatherLower`."""

    _name = "gridsampler3d_no_gather_link_only_lowering"


@functools.cache
def _pipeline(gathers: bool, link_only: bool):
    """Numba's nopython pipeline with its lowering pass replaced as ``gathers`` and ``link_only`` ask."""
    lowering_pass = {
        (True, False): NativeLowering,
        (False, False): _NoGatherLowering,
        (True, True): _LinkOnlyLowering,
        (False, True): _NoGatherLinkOnlyLowering,
    }[gathers, link_only]

    class Pipeline(CompilerBase):
        def define_pipelines(self):
            manager = DefaultPassBuilder.define_nopython_pipeline(self.state)
            manager.passes = [
                (lowering_pass if step is NativeLowering else step, description) for step, description in manager.passes
            ]
            manager.finalize()
            return [manager]

    return Pipeline


class _KeyNamedCacheFile(IndexDataCacheFile):
    """Numba's index and data files, each entry's data named by a digest of its key and written before the index.

    Numba names a new entry's data file by the first number its index does not use. Every
    mode's kernel is a closure of one function, so all share one index: two processes
    compiling two modes at once (pytest's workers, DataLoader workers) both took the same
    number, and one process's index then named the other's kernel. A kernel of another
    mode loaded and ran (the channels-last forward with border padding returned another
    padding's values, tests/test_matrix.py, seen in a test run beside a second process).
    """

    def _load_index(self):
        """The index, or an empty one where it cannot be read back: an index written by another version of the
        package names records (in its keys) that this version renamed or removed, and unpickling it fails before
        Numba's own check of the source's stamp would find it obsolete."""
        try:
            return super()._load_index()
        except (AttributeError, ImportError, EOFError, pickle.UnpicklingError):
            return {}

    def save(self, key, data):
        digest = hashlib.sha256(pickle.dumps(key, protocol=-1)).hexdigest()[:24]
        data_name = self._data_name_pattern.replace("{number:d}", digest)
        self._save_data(data_name, data)
        overloads = self._load_index()
        if overloads.get(key) != data_name:
            overloads[key] = data_name
            self._save_index(overloads)


class _ReadOnlyBesideSources(InTreeCacheLocator):
    """The ``__pycache__`` folder beside the sources, where no other folder takes a file: read, never written.

    Numba picks the first folder it can write to (NUMBA_CACHE_DIR, beside the sources,
    the user's cache folder) and reads nothing else, so a cache warmed beside the package
    by the user who installed it (root in an image build) was ignored by every other user,
    and a user without a writable home could not import the package at all. This locator
    comes last: such a user loads the warmed kernels and compiles the others in memory.
    """

    @classmethod
    def from_function(cls, py_func, py_file):
        locator = cls(py_func, py_file)
        return locator if os.path.isdir(locator.get_cache_path()) else None

    def ensure_cache_path(self):
        raise PermissionError(errno.EACCES, "the cache beside the package is read here, not written", self._cache_path)


class _CacheImpl(CompileResultCacheImpl):
    """Numba's compile-result cache with :class:`_ReadOnlyBesideSources` after its own locators."""

    _locator_classes = [*CompileResultCacheImpl._locator_classes, _ReadOnlyBesideSources]


class _InMemory(NullCache):
    """No disk cache at all (no folder beside the sources either): every compile says so, once per process."""

    def save_overload(self, sig, data):
        _warn_no_cache()


class _EngineKeyedCache(FunctionCache):
    """Numba's disk cache with ``key()`` (the build and the engine's sources, :mod:`.jit`) in every entry's key.

    Numba keys an entry by signature, CPU and the function's own code, and drops the entry
    when the function's file changes. Neither the build (gathers or lane-by-lane loads) nor
    the helpers a kernel calls are in that key: a kernel cached before a helper's file
    changed would load with the old helper compiled into it, and a cache written by the
    other build would load as it is.

    Where Numba fell back to the user's cache folder (the one beside the sources not
    writable, NUMBA_CACHE_DIR unset), the folder beside the sources is read too (after its
    own): kernels warmed there by the installer load for every user.
    """

    _impl_class = _CacheImpl

    def __init__(self, py_func, key):
        super().__init__(py_func)
        self._extra_key = key
        self._cache_file.__class__ = _KeyNamedCacheFile
        beside = os.path.join(os.path.dirname(os.path.abspath(self._impl.locator._py_file)), "__pycache__")
        self._shelf = None
        # NUMBA_CACHE_DIR, where set, is the one folder (as Numba has it): a cold cache stays cold.
        if not config.CACHE_DIR and os.path.abspath(self._cache_path) != beside and os.path.isdir(beside):
            self._shelf = _KeyNamedCacheFile(
                cache_path=beside, filename_base=self._impl.filename_base, source_stamp=self._cache_file._source_stamp
            )

    def _index_key(self, sig, codegen):
        return (*super()._index_key(sig, codegen), *self._extra_key())

    def _load_overload(self, sig, target_context):
        data = super()._load_overload(sig, target_context)
        if data is None and self._shelf is not None and self._enabled:
            data = self._shelf.load(self._index_key(sig, target_context.codegen()))
            if data is not None:
                data = self._impl.rebuild(target_context, data)
        return data

    def _save_overload(self, sig, data):
        if isinstance(self._impl.locator, _ReadOnlyBesideSources):
            _warn_no_cache()
            return
        super()._save_overload(sig, data)


def declare(func, options: dict, *, plain_types: bool, gathers: bool, link_only: bool = False, cache_key=None):
    """A dispatcher of ``func`` compiled with ``options`` (Numba's target options) and ``noalias``.

    ``plain_types`` types the arguments of calls from other compiled code without their
    literal values (for helpers); ``gathers`` False compiles without hardware gathers;
    ``link_only`` compiles into a :class:`_LinkOnlyLibrary` (helpers, which run only inlined
    into or linked with kernels);
    ``cache_key``, a function returning a tuple of strings, turns on the disk cache with
    that tuple in every entry's key.
    """
    dispatcher = (_PlainTypeDispatcher if plain_types else CPUDispatcher)(
        py_func=func, locals={}, targetoptions=dict(options)
    )
    pipeline = _pipeline(gathers, link_only)
    dispatcher._compiler = _NoAliasCompiler(
        dispatcher.py_func, dispatcher.targetdescr, dispatcher.targetoptions, {}, pipeline
    )
    if cache_key is not None:
        try:
            dispatcher._cache = _EngineKeyedCache(dispatcher.py_func, cache_key)
            _CACHES.append(dispatcher._cache)
        except RuntimeError as error:  # no folder at all: compile in memory, and say so at the first compile
            if "no locator available" not in str(error):
                raise
            dispatcher._cache = _InMemory()
    return dispatcher


# Every disk cache declare() made, for cache_folders().
_CACHES: list = []


def cache_folders() -> dict[str, bool]:
    """The folders the disk caches declared so far keep kernels in, each with whether new kernels are written
    there (False: a folder beside the package, only read). Empty where every kernel compiles in memory."""
    folders: dict[str, bool] = {}
    for cache in _CACHES:
        writable = not isinstance(cache._impl.locator, _ReadOnlyBesideSources)
        folders[cache.cache_path] = folders.get(cache.cache_path, False) or writable
        if cache._shelf is not None:
            folders.setdefault(cache._shelf._cache_path, False)
    return folders


@functools.cache
def _warn_no_cache() -> None:
    """Say once per process that new kernels compile in memory, and how to keep them."""
    warnings.warn(
        "gridsampler3d: Numba's disk cache has no writable folder here (beside the package, NUMBA_CACHE_DIR, or "
        "the user's cache folder): kernels not already cached beside the package compile in memory, again in each "
        'process. Set NUMBA_CACHE_DIR to a writable folder to keep them (docs/runtime.md, "The kernel cache").',
        RuntimeWarning,
        stacklevel=2,
    )


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
