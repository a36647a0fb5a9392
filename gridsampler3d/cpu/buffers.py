"""Output memory that stays resident between calls of the CPU engine.

PyTorch's CPU allocator hands each new tensor to the C library's ``malloc``, which
returns large freed blocks to the operating system (a block of 32 MiB or more at once,
smaller ones when the free memory at the top of the heap grows past a threshold). A new
output then starts as unmapped pages, and the kernel's first store into each 4 KiB page
takes a page fault that maps and zeroes it: about 0.2 ms per MiB here, which made the
forward of up2x (a 32 MiB output) 1.37 times slower, and bf16's calls (float64 copies
and results) 1.25 to 1.4 times (docs/cpu.md, "Output memory").

:func:`empty` serves the engine's outputs and widened copies from blocks that earlier
calls used and their tensors have since released: a training loop, which asks for the
same shapes every step, writes into pages that are already mapped. A block comes back
when the last tensor (or view) of it is freed. At most :data:`.tuning.CACHED_BYTES` of
released blocks are kept (the oldest go first); :func:`release` frees them all.

A tensor from :func:`empty` is an ordinary CPU tensor, except that its storage cannot be
resized (``resize_`` to a larger size raises), as with ``torch.from_numpy``.
"""

from __future__ import annotations

import collections
import math
import os
import threading

import numpy as np
import torch

from . import tuning

__all__ = ["cached_bytes", "empty", "release"]

_ALIGN = 64  # bytes, as PyTorch aligns its CPU tensors
_GRAIN = 64 << 10  # block sizes are rounded up to this, so that near sizes share blocks
# NumPy's type of each dtype's elements (bfloat16's bits as int16: NumPy has no bfloat16)
_TYPESTR = {torch.float32: "<f4", torch.float64: "<f8", torch.float16: "<f2", torch.bfloat16: "<i2"}

_lock = threading.Lock()
_free: collections.OrderedDict[int, list[np.ndarray]] = collections.OrderedDict()  # size -> blocks, oldest first
_free_bytes = 0
# Blocks come back from finalisers, which may run inside any allocation (the garbage
# collector) and on any thread: they append here, and whoever holds the lock next takes
# them in.
_returned: collections.deque[np.ndarray] = collections.deque()


class _Lease:
    """One tensor's claim on a block: NumPy's view of the block keeps it as its base, and freeing it returns
    the block."""

    __slots__ = ("block", "__array_interface__")

    def __init__(self, block: np.ndarray, shape, strides, typestr: str):
        self.block = block
        offset = -block.ctypes.data % _ALIGN
        self.__array_interface__ = {
            "data": (block.ctypes.data + offset, False),
            "shape": tuple(shape),
            "strides": tuple(strides),
            "typestr": typestr,
            "version": 3,
        }

    def __del__(self):
        try:
            if self.block.size > tuning.CACHED_BYTES:
                return  # larger than the whole cache: freed at once
            _returned.append(self.block)
            # Kept within the limit now where no call holds the lock (this finaliser may
            # run inside one, on this thread or another); else by the next call.
            if _lock.acquire(blocking=False):
                try:
                    _take_in_returned()
                finally:
                    _lock.release()
        except (AttributeError, TypeError):  # at interpreter exit, this module's globals gone
            pass


def _take_in_returned() -> None:
    global _free_bytes
    while _returned:
        block = _returned.popleft()
        _free.setdefault(block.size, []).append(block)
        _free.move_to_end(block.size)
        _free_bytes += block.size
    while _free_bytes > tuning.CACHED_BYTES and _free:
        _take_out(next(iter(_free)), oldest=True)


def _take_out(size: int, oldest: bool) -> np.ndarray:
    """Remove a cached block of ``size`` bytes (one must be there): the oldest, or the one returned last."""
    global _free_bytes
    blocks = _free[size]
    block = blocks.pop(0 if oldest else -1)
    _free_bytes -= size
    if not blocks:
        del _free[size]
    return block


def _block(size: int) -> np.ndarray:
    with _lock:
        _take_in_returned()
        if size in _free:
            return _take_out(size, oldest=False)
    return np.empty(size, np.uint8)


def empty(shape, dtype: torch.dtype, memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    """An uninitialised floating-point CPU tensor of ``shape``, dense in ``memory_format``, like ``torch.empty``.

    Its memory is a released block of an earlier output of the same size where one is
    cached; tensors below :data:`.tuning.CACHED_MIN_BYTES` (which ``malloc`` reuses
    anyway), dtypes other than the four floating ones, and any call while caching is off
    (``CACHED_BYTES`` 0) get ``torch.empty``'s own.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    if dtype not in _TYPESTR or nbytes < tuning.CACHED_MIN_BYTES or tuning.CACHED_BYTES <= 0:
        return torch.empty(shape, dtype=dtype, memory_format=memory_format)
    shape = tuple(int(size) for size in shape)
    strides = torch.empty(shape, dtype=dtype, memory_format=memory_format, device="meta").stride()
    block = _block(-(-(nbytes + _ALIGN) // _GRAIN) * _GRAIN)
    array = np.asarray(_Lease(block, shape, [stride * dtype.itemsize for stride in strides], _TYPESTR[dtype]))
    tensor = torch.from_numpy(array)
    return tensor.view(dtype) if tensor.dtype != dtype else tensor


def cached_bytes() -> int:
    """Bytes of released blocks held for later calls."""
    with _lock:
        _take_in_returned()
        return _free_bytes


def release() -> None:
    """Free every cached block (blocks still in use come back later, and are kept again)."""
    global _free_bytes
    with _lock:
        _take_in_returned()
        _free.clear()
        _free_bytes = 0


def _fresh_state_in_child() -> None:
    """A forked child starts with a lock of its own (another thread may have held the parent's) and no cache."""
    global _lock, _free_bytes
    _lock = threading.Lock()
    _free.clear()
    _free_bytes = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_state_in_child)
