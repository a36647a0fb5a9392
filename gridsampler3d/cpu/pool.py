"""The CPU engine's threads: every kernel runs in parts (:func:`.jit.part_kernel`) on threads of its own choosing.

:func:`run_parts` runs part 0 on the calling thread and the others on the process's
executor, chosen at the engine's first launch (nothing happens at import):

- torch's OpenMP team (:class:`_OpenMPTeam`), where torch runs on an OpenMP runtime with
  GNU's entry points that the process has already loaded (torch's Linux wheels: GNU
  libgomp). An OpenMP thread spins for milliseconds after every parallel torch
  operation, waiting for the next one; beside a spinning thread a part kernel ran at half
  speed and started late. Run on the team, the parts take the spinning threads' places
  instead of competing with them (docs/runtime.md has the measurements);
- else the engine's own worker threads (:class:`_WorkerThreads`).

A forked child never uses the team: GNU libgomp does not survive fork, and a region in
the child of a parent that had used its team waits forever. A process forked after
this module was imported takes the worker threads at its first launch.
``GRIDSAMPLER3D_OPENMP=0`` keeps the worker threads everywhere; :func:`use` picks a route.

No kernel runs on a Numba threading layer, so the engine never starts one: whichever
layer other Numba code in the process chooses, it keeps.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import itertools
import os
import re
import threading
from pathlib import Path
from queue import SimpleQueue

import torch

__all__ = ["ROUTES", "route", "run_parts", "run_together", "threads", "use"]

ROUTES = ("team", "workers")


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


class _WorkerThreads:
    """Runs tasks on the engine's own threads, started as the largest team asked for needs them.

    Thread ``i`` of a team is always worker ``i``, so that no thread's fixed tasks wait
    behind another's (a pool would hand two of them to one thread that finished early).
    """

    name = "workers"

    def __init__(self):
        self._inboxes = []  # one per worker thread: (share, done) items to run
        self._lock = threading.Lock()

    def _workers(self, count: int) -> list:
        with self._lock:
            while len(self._inboxes) < count:
                inbox = SimpleQueue()
                threading.Thread(
                    target=self._serve, args=(inbox,), name=f"gridsampler3d-{len(self._inboxes) + 1}", daemon=True
                ).start()
                self._inboxes.append(inbox)
            return self._inboxes[:count]

    @staticmethod
    def _serve(inbox) -> None:
        while True:
            share, done = inbox.get()
            try:
                share()
            finally:
                done.release()

    def run(self, tasks, fixed: int, queue, errors: list, team: int) -> None:
        """:func:`_run_share` on ``team`` threads, the calling thread among them."""
        done = threading.Semaphore(0)
        inboxes = self._workers(team - 1)
        for thread, inbox in enumerate(inboxes, start=1):
            inbox.put((functools.partial(_run_share, tasks, fixed, queue, errors, thread, team), done))
        try:
            _run_share(tasks, fixed, queue, errors, 0, team)
        finally:
            for _ in inboxes:
                done.acquire()


class _OpenMPTeam:
    """Runs tasks on torch's OpenMP team: one ``GOMP_parallel`` region whose threads take the tasks in turn.

    ``runtime`` is the OpenMP library torch runs on (GNU libgomp, or a runtime with its
    entry points: LLVM's libomp, Intel's libiomp5). Each thread of the region calls back
    into Python, runs its tasks (kernels that release the GIL), then takes shared ones while
    any are left, and keeps their errors.
    """

    name = "team"

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


_OPENMP_RUNTIME = re.compile(r"^lib(gomp|i?omp5?)([-.][^/]*)?\.(so|dylib)([.][^/]*)?$")
# Loaded OpenMP runtimes looked up by name, where torch's folders hold none (a torch built against the system's).
_OPENMP_NAMES = ("libgomp.so.1", "libomp.so", "libiomp5.so")


def _torch_openmp_team() -> _OpenMPTeam | None:
    """The team of torch's OpenMP threads, or None where torch does not run on OpenMP or its runtime is not loaded.

    The runtime is the first OpenMP library in torch's ``lib/`` (or its wheel's
    ``torch.libs/``) that the process has loaded, else one loaded under a usual name. It
    is looked up with ``RTLD_NOLOAD``: a library not loaded yet stays unloaded.
    """
    no_load = getattr(os, "RTLD_NOLOAD", None)
    if no_load is None or "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    home = Path(torch.__file__).resolve().parent
    shipped = sorted(
        str(path)
        for folder in (home / "lib", home.parent / "torch.libs")
        if folder.is_dir()
        for path in folder.iterdir()
        if _OPENMP_RUNTIME.search(path.name)
    )
    for candidate in (*shipped, *_OPENMP_NAMES):
        try:
            return _OpenMPTeam(ctypes.CDLL(candidate, mode=no_load))
        except (OSError, AttributeError):  # not loaded, or without GOMP_parallel
            continue
    return None


# The process that imported this module: a launch in a process with another id is in a forked child.
_IMPORTED_IN = os.getpid()
_chosen = None  # (process id, executor) once a launch chose


def _choose(wanted: str | None):
    """The executor for ``wanted`` ("team", "workers", or None: the team where there is one and this is no fork)."""
    if wanted not in (None, *ROUTES):
        raise ValueError(f"route must be one of {ROUTES} or None; got {wanted!r}")
    allowed = wanted != "workers" and os.getpid() == _IMPORTED_IN and os.environ.get("GRIDSAMPLER3D_OPENMP") != "0"
    team = _torch_openmp_team() if allowed else None
    if wanted == "team" and team is None:
        raise ValueError("torch's threads are not an OpenMP team this process can use")
    return team or _WorkerThreads()


def _executor():
    """The executor of this process: chosen at its first launch (again in a forked child)."""
    global _chosen
    chosen = _chosen
    if chosen is None or chosen[0] != os.getpid():
        # Two threads launching first may both choose; either choice serves.
        chosen = _chosen = (os.getpid(), _choose(None))
    return chosen[1]


def use(wanted: str | None) -> None:
    """Run the parts on ``wanted`` from now on: "team" (ValueError where there is none), "workers", or None
    (chosen again at the next launch, as at the first)."""
    global _chosen
    _chosen = None if wanted is None else (os.getpid(), _choose(wanted))


def route() -> str:
    """Where the parts run: "team" (torch's OpenMP team) or "workers" (the engine's threads); chosen now if not yet."""
    return _executor().name


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
    team = min(len(tasks), threads())
    if team <= 1:
        for kernel, operands, part in tasks:
            kernel(*operands, part)
        return
    queue = collections.deque(range(fixed, len(tasks)))
    errors = []
    _executor().run(tasks, fixed, queue, errors, team)
    if errors:  # the earliest task's error
        raise min(errors, key=lambda indexed: indexed[0])[1]


def threads() -> int:
    """How many threads the kernels run on: torch's setting (``torch.get_num_threads()``, at least 1)."""
    return torch.get_num_threads()
