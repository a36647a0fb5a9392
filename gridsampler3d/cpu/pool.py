"""The CPU engine's threads: its own workers for the part kernels, and a Numba layer that survives fork.

The trilinear and nearest kernels are part kernels (:func:`.jit.part_kernel`):
:func:`run_parts` runs their parts on the calling thread and on worker threads of this
module, which a forked child recreates. The bicubic kernels and the rounding pass are
``prange`` kernels on Numba's threading layer.

Numba picks its threading layer once per process, at the first parallel launch by anyone,
and each layer has a catch:

- ``omp`` on Linux is GNU libgomp, which is not fork-safe: a process forked after the
  parent launched a kernel (a DataLoader worker, say) is killed at its first launch;
- ``workqueue`` survives fork but aborts the process when two Python threads launch
  kernels at once;
- ``tbb`` is safe for both, but the ``tbb`` wheel installs ``libtbb.so.12`` in the
  environment's ``lib/``, where Numba's TBB extension does not look.

So, at import, before any launch, this module loads the wheel's TBB library and, unless
the user chose a layer, asks Numba for a fork-safe one: TBB, or else the workqueue, whose
launches :func:`exclusive` then takes one at a time. docs/cpu.md has the measurements.

Where torch's own threads are an OpenMP team (its Linux wheels), the parts run on that
team rather than on worker threads of this module. An OpenMP thread spins for milliseconds
after every parallel torch operation, waiting for the next one; beside a spinning thread a
part kernel ran at half speed and started late (docs/cpu.md, "Whose threads"). Run on the
team, the part kernels take the spinning threads' places instead of competing with them.
A forked child, a torch whose threads are not OpenMP's, or ``GRIDSAMPLER3D_OPENMP=0``
(read at import) keeps the worker threads.
"""
from __future__ import annotations

import collections
import concurrent.futures
import ctypes
import functools
import importlib.metadata
import itertools
import os
import re
import sys
import threading

import numba
import torch

__all__ = ["exclusive", "layer", "run_parts", "run_together", "threads"]

_TBB_LIBRARY = {"win32": "tbb12.dll", "darwin": "libtbb.12.dylib"}.get(sys.platform, "libtbb.so.12")
_DEFAULT_PRIORITY = ["tbb", "omp", "workqueue"]
_THREAD_SAFE_LAYERS = ("tbb", "omp")


def _load_tbb() -> None:
    """Load the ``tbb`` wheel's library process-wide, so that Numba's TBB layer finds it."""
    try:
        files = importlib.metadata.files("tbb") or []
    except importlib.metadata.PackageNotFoundError:
        return
    for file in files:
        if file.name == _TBB_LIBRARY:
            try:
                ctypes.CDLL(str(file.locate()), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                pass  # Numba then falls back to another layer
            return


def _user_chose_layer() -> bool:
    return ("NUMBA_THREADING_LAYER" in os.environ or "NUMBA_THREADING_LAYER_PRIORITY" in os.environ
            or str(numba.config.THREADING_LAYER).lower() != "default"
            or list(numba.config.THREADING_LAYER_PRIORITY) != _DEFAULT_PRIORITY)


def _prefer_fork_safe_layer() -> None:
    if not _user_chose_layer():
        # Numba's own name for "TBB, else a layer that survives fork" (on Linux, the
        # workqueue; elsewhere OpenMP comes before it, being fork-safe there).
        numba.config.THREADING_LAYER = "forksafe"


def layer() -> str | None:
    """The threading layer Numba runs on, or None before its first parallel launch."""
    try:
        return numba.threading_layer()
    except ValueError:
        return None


# Serialises launches on a layer that is not thread-safe (and before the layer is known).
_launch_lock = threading.Lock()


# The threads that run the parts of the trilinear and nearest kernels (created on first need).
_workers: concurrent.futures.ThreadPoolExecutor | None = None
_workers_lock = threading.Lock()


def _fresh_state_in_child() -> None:
    # A fork taken while another thread held a lock would leave it held forever here, and
    # the parent's worker threads do not exist in the child. Nor do its OpenMP threads:
    # GNU libgomp would wait for them at the child's first parallel region.
    global _launch_lock, _workers, _workers_lock, _team
    _launch_lock = threading.Lock()
    _workers = None
    _workers_lock = threading.Lock()
    _team = None


def _worker_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _workers
    with _workers_lock:
        if _workers is None:
            # As many as Numba may run (threads() never asks for more); idle ones cost nothing.
            _workers = concurrent.futures.ThreadPoolExecutor(max(1, numba.config.NUMBA_NUM_THREADS - 1),
                                                             thread_name_prefix="gridsampler3d")
        return _workers


class _OpenMPTeam:
    """Runs tasks on torch's OpenMP team: one ``GOMP_parallel`` region whose threads take the tasks in turn.

    ``runtime`` is the OpenMP library torch runs on (GNU libgomp, or a runtime with its
    entry points: LLVM's libomp, Intel's libiomp5). Each thread of the region calls back
    into Python, runs its tasks (kernels that release the GIL), then takes shared ones while
    any are left, and keeps their errors.
    """

    def __init__(self, runtime: ctypes.CDLL):
        self._parallel = runtime.GOMP_parallel
        self._parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        self._parallel.restype = None
        self._thread_num = runtime.omp_get_thread_num
        self._thread_count = runtime.omp_get_num_threads
        self._thread_num.restype = self._thread_count.restype = ctypes.c_int
        self._callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self._region_body)  # kept alive with the team
        self._body = ctypes.cast(self._callback, ctypes.c_void_p)
        self._regions = {}  # key -> (tasks, fixed, queue, errors) of the regions running now, from any Python thread
        self._keys = itertools.count(1)

    def _region_body(self, key) -> None:
        _run_share(*self._regions[key], self._thread_num(), self._thread_count())

    def run(self, tasks, fixed: int, queue, errors: list, team: int) -> None:
        """:func:`_run_share` on ``team`` threads of the OpenMP team, the calling thread among them."""
        key = next(self._keys)
        self._regions[key] = (tasks, fixed, queue, errors)
        try:
            # The region reuses torch's threads; ctypes lets the GIL go for its length.
            self._parallel(self._body, key, team, 0)
        finally:
            del self._regions[key]


_OPENMP_RUNTIME = re.compile(r"(?:^|/)lib(gomp|i?omp5?)([-.][^/]*)?\.(so|dylib)([.][^/]*)?$")


def _torch_openmp_team() -> _OpenMPTeam | None:
    """The team of torch's OpenMP threads, or None where torch does not run on OpenMP or its runtime is not found.

    The runtime is the OpenMP library mapped into this process from torch's own
    directory, or else the only OpenMP library mapped at all (Linux); elsewhere the one
    in torch's ``lib/``.
    """
    if os.environ.get("GRIDSAMPLER3D_OPENMP", "1") == "0":
        return None
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    home = os.path.dirname(os.path.realpath(torch.__file__))
    try:
        with open("/proc/self/maps") as maps:  # address, permissions, offset, device, inode, path
            mapped = {fields[5].strip() for fields in (line.split(None, 5) for line in maps) if len(fields) == 6}
    except OSError:
        try:
            mapped = {os.path.join(home, "lib", name) for name in os.listdir(os.path.join(home, "lib"))}
        except OSError:
            return None
    runtimes = sorted(path for path in mapped if _OPENMP_RUNTIME.search(path))
    chosen = [path for path in runtimes if os.path.realpath(path).startswith(home + os.sep)] or runtimes
    if len(chosen) != 1:
        return None
    try:
        return _OpenMPTeam(ctypes.CDLL(chosen[0]))
    except (OSError, AttributeError):  # not loadable, or without GOMP_parallel
        return None


_team: _OpenMPTeam | None = None  # set at import, below


def run_parts(kernel, operands, parts: int) -> None:
    """Run ``kernel(*operands, part)`` for every part 0 .. ``parts`` - 1 at once; return when all are done.

    ``kernel`` releases the GIL (a part kernel, :func:`.jit.part_kernel`). Part 0 runs on
    the calling thread, the others on torch's OpenMP team or the engine's worker threads.
    Which thread runs a part never changes a result: the parts write disjoint elements. An
    error in any part is raised here once every part has finished.
    """
    run_together([(kernel, operands, parts)])


def run_together(launches, shared=()) -> None:
    """Run every part of every launch ``(kernel, operands, parts)`` at once, as :func:`run_parts` runs one launch's.

    The launches must write disjoint elements (and each part its own scratch); the first
    launch's part 0 runs on the calling thread. The parts of the ``shared`` launches are
    taken in order by whichever thread has finished the parts it was given: many short
    parts there even out fixed parts of unequal length (a grid gradient beside dx).
    Threads: torch's count, at most one per part.
    """
    tasks = [(kernel, operands, part) for kernel, operands, parts in launches for part in range(parts)]
    fixed = len(tasks)
    tasks += [(kernel, operands, part) for kernel, operands, parts in shared for part in range(parts)]
    team = min(len(tasks), max(1, torch.get_num_threads()))
    if team <= 1:
        for kernel, operands, part in tasks:
            kernel(*operands, part)
        return
    queue = collections.deque(range(fixed, len(tasks)))
    errors = []
    if _team is not None:
        _team.run(tasks, fixed, queue, errors, team)
    else:
        others = [_worker_pool().submit(_run_share, tasks, fixed, queue, errors, thread, team)
                  for thread in range(1, team)]
        try:
            _run_share(tasks, fixed, queue, errors, 0, team)
        finally:
            concurrent.futures.wait(others)
    if errors:  # the earliest task's error
        raise min(errors, key=lambda indexed: indexed[0])[1]


def _run_share(tasks, fixed: int, queue, errors: list, thread: int, team: int) -> None:
    """Thread ``thread`` of ``team``: fixed tasks ``thread``, ``thread + team``, ... below ``fixed``, then queued ones.

    ``queue`` holds the indices of the shared tasks not yet taken (a deque: taking one is
    atomic). Errors are kept as (index, error) in ``errors``.
    """
    def run(index):
        kernel, operands, part = tasks[index]
        try:
            kernel(*operands, part)
        except BaseException as error:  # raised by the caller once every task is done
            errors.append((index, error))

    for index in range(thread, fixed, team):
        run(index)
    while True:
        try:
            index = queue.popleft()
        except IndexError:
            return
        run(index)


def exclusive(method):
    """Run ``method`` (one that launches kernels) alone when the layer cannot take concurrent launches."""
    @functools.wraps(method)
    def run(*args, **kwargs):
        if layer() in _THREAD_SAFE_LAYERS:
            return method(*args, **kwargs)
        with _launch_lock:
            return method(*args, **kwargs)
    return run


def threads() -> int:
    """Set the calling thread's kernel thread count from torch's setting, within Numba's maximum.

    Numba's count is per Python thread, so it is set at every call.
    """
    if layer() is None:
        # Numba re-reads its configuration from the environment when a NUMBA_ variable
        # changed before a compile, which would undo the choice made at import.
        _prefer_fork_safe_layer()
    wanted = torch.get_num_threads()
    count = max(1, min(wanted, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(count)
    if torch.get_num_threads() != wanted:
        # Numba's OpenMP layer (where the user chose it) resets OpenMP's thread count,
        # torch's included, when its pool starts.
        torch.set_num_threads(wanted)
    return count


_load_tbb()
_prefer_fork_safe_layer()
_team = _torch_openmp_team()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_state_in_child)
