"""How the CPU engine declares its Numba helpers: inlined by LLVM, compiled once per argument type.

A kernel is built per mode (:func:`.forward.forward_kernel`), and passes its modes to the
helpers as constants. Numba would type each constant as a literal and compile a helper,
and every helper below it, once per distinct set of constant values: the same helper a
dozen times across the modes of one process. Helpers declared here see plain types
(``int64``, ``bool``) instead, so each compiles once per dtype; LLVM then inlines it into
the kernel, where the constants fold and each kernel keeps only its own mode's code.

Kernels are declared here too (:func:`part_kernel`): each computes one part of a pass, as
a plain serial function, and a small parallel launcher per kernel family runs the parts
(:func:`call_part`). A ``prange`` loop around the whole kernel body made Numba type that
body twice (once for the kernel, once for the outlined parallel body) and analyse it for
parallelism, about half of a kernel's compile time; a launcher that called the kernel
directly had its callee linked in and optimised by LLVM a second time, so the launchers
call it by address.
"""
from __future__ import annotations

from numba import typeof, types
from numba._dispatcher import compute_fingerprint
from numba.core import cgutils
from numba.core.dispatcher import _FunctionCompiler
from numba.core.registry import CPUDispatcher
from numba.extending import intrinsic

__all__ = ["Parallel", "address_of", "call_part", "helper", "outlined_helper", "part_kernel"]

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


class _NoAliasCompiler(_FunctionCompiler):
    """Compiles with Numba's ``noalias`` flag: array arguments are declared not to overlap.

    It is what Numba gives the outlined body of a ``prange`` loop whose alias analysis finds
    no alias, and what lets LLVM vectorise the block loops (their stores cannot change the
    arrays the next lanes read).
    """

    def _customize_flags(self, flags):
        flags.noalias = True
        return flags


def part_kernel(func, cache: bool = True):
    """Declare ``func(*operands, part)``: part ``part`` of a pass, compiled serially with ``noalias``, cached on disk.

    :class:`Parallel` pairs it with the launcher that runs its parts.
    """
    dispatcher = CPUDispatcher(py_func=func, locals={}, targetoptions=dict(_OPTIONS))
    dispatcher._compiler = _NoAliasCompiler(func, dispatcher.targetdescr, dispatcher.targetoptions, {},
                                            dispatcher._compiler.pipeline_class)
    if cache:
        dispatcher.enable_caching()
    return dispatcher


class Parallel:
    """A part kernel and its launcher, called as one parallel kernel: ``kernel(*operands)``.

    The launcher, ``launcher(address, *operands)``, runs every part of ``part``
    (:func:`part_kernel`, compiled for the operands' types) in parallel through
    :func:`call_part`, and returns how many parts failed.
    """

    def __init__(self, part, launcher):
        self.part = part
        self.launcher = launcher
        self.py_func = part.py_func

    @property
    def signatures(self):
        return self.part.signatures

    def __call__(self, *operands):
        if self.launcher(address_of(self.part, operands), *operands):
            raise MemoryError("a CPU kernel could not allocate its scratch memory")


_ADDRESSES: dict = {}


def address_of(kernel, operands) -> int:
    """The native address of ``kernel`` compiled for ``(*operands, part)`` (compiled, or loaded from the cache, once).

    Looked up by the operands' fingerprints, which Numba's own dispatcher computes in C to
    pick a compiled version: ``numba.typeof`` of every operand on every call cost more
    than a small kernel runs.
    """
    key = (kernel, tuple(map(compute_fingerprint, operands)))
    address = _ADDRESSES.get(key)
    if address is None:
        signature = tuple(typeof(value) for value in operands) + (types.int64,)
        kernel.compile(signature)
        result = kernel.overloads[signature]
        if result.signature.return_type != types.none:  # call_part's calling convention
            raise TypeError(f"a part kernel returns nothing, not {result.signature.return_type}")
        address = _ADDRESSES[key] = result.library.get_pointer_to_function(result.fndesc.llvm_func_name)
    return address


@intrinsic
def call_part(typingctx, address, operands, part):
    """Call the part kernel at ``address`` (from :func:`address_of`) as ``kernel(*operands, part)``.

    Returns 1 if the kernel returned an error (a failed allocation), else 0. A call by
    address, not by name, so that LLVM neither links nor re-optimises the kernel here.
    """
    if not isinstance(address, types.Integer) or not isinstance(operands, types.BaseTuple):
        return None
    argument_types = tuple(operands) + (types.int64,)

    def codegen(context, builder, signature, values):
        call_conv = context.call_conv
        function_type = call_conv.get_function_type(types.none, argument_types)
        callee = builder.inttoptr(values[0], function_type.as_pointer())
        items = [builder.extract_value(values[1], i) for i in range(len(operands))]
        items.append(context.cast(builder, values[2], part, types.int64))
        # Numba's calling convention: a slot for the result, one for an exception, the operands.
        result_type = call_conv.get_return_type(types.none).pointee
        result = cgutils.alloca_once_value(builder, cgutils.get_null_value(result_type))
        exception = cgutils.alloca_once(builder, function_type.args[1].pointee)
        packed = list(call_conv._get_arg_packer(argument_types).as_arguments(builder, items))
        code = builder.call(callee, [result, exception] + packed)
        status = call_conv._get_return_status(builder, code, builder.load(exception))
        return builder.zext(status.is_error, context.get_value_type(types.int64))

    return types.int64(address, operands, part), codegen
