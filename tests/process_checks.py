"""Checks of the CPU engine across processes and threads, each run as its own program.

    python tests/process_checks.py CHECK

CHECK is one of fork, spawn, threads, thread-count. Each prints "ok" and exits 0 when
every result equals the parent's bit for bit, and fails loudly otherwise.
tests/test_processes.py runs these under a timeout, so that a hang fails instead of
stalling the suite.

Every check runs the trilinear kernels, the tricubic ones and the half-precision
rounding pass, and checks that none of them started a Numba threading layer: the
engine runs its parts on its own threads (or torch's OpenMP team), never on Numba's.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import threading

import torch

CASES = 4  # samples per check
# (mode, padding, dtype): bilinear as most calls are, bicubic, and bfloat16 for the rounding pass
SAMPLED = (
    ("bilinear", "border", torch.float64),
    ("bicubic", "reflection", torch.float64),
    ("bilinear", "zeros", torch.bfloat16),
)


def _inputs(index: int, dtype=torch.float64):
    """(grad, x, grid) of case ``index``: a random grid, odd sizes."""
    generator = torch.Generator().manual_seed(index)
    x = torch.randn(2, 3, 7, 6, 5, generator=generator, dtype=torch.float64)
    grid = torch.rand(2, 5, 4, 6, 3, generator=generator, dtype=torch.float64) * 2.4 - 1.2
    grad = torch.randn(2, 3, 5, 4, 6, generator=generator, dtype=torch.float64)
    return grad.to(dtype), x.to(dtype), grid.to(dtype)


def sample(index: int):
    """Forward and backward of case ``index`` through the library in each of :data:`SAMPLED`: (y, dx, dgrid) each."""
    import gridsampler3d as gs
    from gridsampler3d.cpu import tuning

    tuning.PARALLEL_VALUES = 0  # these cases are small: split them anyway, as a large call is
    tuning.SERIAL_ITEM_BYTES = 0  # and plan them on one thread as a large volume is
    results = []
    for mode, padding, dtype in SAMPLED:
        grad, x, grid = _inputs(index, dtype)
        y = gs.grid_sampler3d(x, grid, mode, padding, backend="numba")
        results += [y, *gs.grid_sampler3d_backward(grad, x, grid, mode, padding, backend="numba")]
    return results


def _assert_equal(ours, expected, label: str) -> None:
    assert len(ours) == len(expected), label
    for index, (one, other) in enumerate(zip(ours, expected)):
        mode, padding, dtype = SAMPLED[index // 3]
        name = f"{('y', 'dx', 'dgrid')[index % 3]} ({mode}, {padding}, {dtype})"
        assert torch.equal(one, other), f"{label}: {name} differs from the parent's"


def _numba_layer() -> str | None:
    """The Numba threading layer this process started, or None (the engine must never start one)."""
    import numba

    try:
        return numba.threading_layer()
    except ValueError:
        return None


def _route() -> str:
    from gridsampler3d.cpu import pool

    return pool.route()


class _Samples(torch.utils.data.Dataset):
    """Each worker computes its cases on one thread (DataLoader's setting) and on two."""

    def __len__(self):
        return CASES

    def __getitem__(self, index):
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(sample(index))
        return results, _route(), _numba_layer(), os.getpid()


def check_fork(parent_results) -> None:
    """DataLoader workers forked after the parent ran forward and backward, on one thread and on two.

    The parent's two-thread run starts torch's OpenMP team, which a forked child cannot use:
    the children run on the engine's worker threads.
    """
    _assert_equal(sample(0), parent_results[0], "parent, 2 threads")
    loader = torch.utils.data.DataLoader(_Samples(), batch_size=None, num_workers=2, multiprocessing_context="fork")
    workers = set()
    for index, (results, route, layer, pid) in enumerate(loader):
        assert route == "workers", f"a forked worker runs its parts on {route}"
        assert layer is None, f"a forked worker started Numba's {layer} layer"
        workers.add(pid)
        for threads, result in zip((1, 2), results):
            _assert_equal(result, parent_results[index], f"fork worker, case {index}, {threads} thread(s)")
    assert os.getpid() not in workers and len(workers) == 2, f"workers {workers}"


def _spawned(index: int):
    return sample(index), _numba_layer()


def check_spawn(parent_results) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as workers:
        for index, (result, layer) in enumerate(workers.map(_spawned, range(CASES))):
            assert layer is None, f"a spawned process started Numba's {layer} layer"
            _assert_equal(result, parent_results[index], f"spawned process, case {index}")


def check_threads(parent_results) -> None:
    """4 Python threads call forward and backward at once, 3 times each."""
    start = threading.Barrier(4)
    failures = []

    def work(thread: int):
        try:
            for round_ in range(3):
                index = (thread + round_) % CASES
                start.wait(timeout=60)
                _assert_equal(sample(index), parent_results[index], f"thread {thread}, case {index}")
        except BaseException as error:  # reported by the main thread
            failures.append(repr(error))
            start.abort()

    workers = [threading.Thread(target=work, args=(thread,)) for thread in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not failures, failures


def check_thread_count(parent_results) -> None:
    """torch.set_num_threads between calls takes effect, survives the calls, and changes no bit."""
    from gridsampler3d.cpu import pool

    for threads in (2, 1, 3, 2):
        torch.set_num_threads(threads)
        _assert_equal(sample(0), parent_results[0], f"{threads} thread(s)")
        assert torch.get_num_threads() == threads, f"torch now has {torch.get_num_threads()} threads, not {threads}"
        assert pool.threads() == threads


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=["fork", "spawn", "threads", "thread-count"])
    args = parser.parse_args(argv)
    # One thread first: the engine must not change torch's setting (checked below).
    torch.set_num_threads(1)
    parent_results = [sample(index) for index in range(CASES)]
    assert torch.get_num_threads() == 1, f"the engine changed torch's thread count to {torch.get_num_threads()}"
    torch.set_num_threads(2)
    if args.check == "fork":
        check_fork(parent_results)
    elif args.check == "spawn":
        check_spawn(parent_results)
    elif args.check == "threads":
        check_threads(parent_results)
    else:
        check_thread_count(parent_results)
    assert _numba_layer() is None, f"the engine started Numba's {_numba_layer()} layer"
    print(f"ok: {args.check}, parts on {_route()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
