"""Checks of the CPU engine across processes and threads, each run as its own program.

    python tests/process_checks.py CHECK [--without-tbb]

CHECK is one of fork, spawn, threads, thread-count. Each prints "ok" and exits 0 when
every result equals the parent's bit for bit, and fails loudly otherwise. With
--without-tbb, Numba's TBB layer is made unavailable first, as on a machine without the
tbb package, so that the engine's fallback is what runs. tests/test_processes.py runs
these under a timeout, so that a hang fails instead of stalling the suite.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import multiprocessing
import os
import sys
import threading

import torch

CASES = 4  # samples per check


def _block_tbb() -> None:
    """Make Numba's TBB layer fail to load, as it does where libtbb cannot be found."""
    from numba.np.ufunc import parallel

    def unavailable():
        raise ImportError("TBB made unavailable for this check")

    parallel._check_tbb_version_compatible = unavailable


def _inputs(index: int):
    """(grad, x, grid) of case ``index``: float64, a random grid, odd sizes."""
    generator = torch.Generator().manual_seed(index)
    x = torch.randn(2, 3, 7, 6, 5, generator=generator, dtype=torch.float64)
    grid = torch.rand(2, 5, 4, 6, 3, generator=generator, dtype=torch.float64) * 2.4 - 1.2
    grad = torch.randn(2, 3, 5, 4, 6, generator=generator, dtype=torch.float64)
    return grad, x, grid


def sample(index: int):
    """Forward and backward of case ``index`` through the library: (y, dx, dgrid)."""
    import gridsampler3d as gs
    from gridsampler3d.cpu import tuning

    tuning.PARALLEL_VALUES = 0  # these cases are small: split them anyway, as a large call is
    grad, x, grid = _inputs(index)
    y = gs.grid_sampler3d(x, grid, "bilinear", "border", backend="numba")
    dx, dgrid = gs.grid_sampler3d_backward(grad, x, grid, "bilinear", "border", backend="numba")
    return y, dx, dgrid


def _assert_equal(ours, expected, label: str) -> None:
    assert len(ours) == len(expected), label
    for name, one, other in zip(("y", "dx", "dgrid"), ours, expected):
        assert torch.equal(one, other), f"{label}: {name} differs from the parent's"


def _layer() -> str:
    from gridsampler3d.cpu import pool

    return pool.layer()


class _Samples(torch.utils.data.Dataset):
    """Each worker computes its cases on one thread (DataLoader's setting) and on two."""

    def __len__(self):
        return CASES

    def __getitem__(self, index):
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(sample(index))
        return results, _layer(), os.getpid()


def check_fork(parent_results) -> None:
    """DataLoader workers forked after the parent ran forward and backward, on one thread and on two.

    The parent's two-thread run starts torch's OpenMP team, which a forked child cannot use.
    """
    _assert_equal(sample(0), parent_results[0], "parent, 2 threads")
    loader = torch.utils.data.DataLoader(_Samples(), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    workers = set()
    for index, (results, layer, pid) in enumerate(loader):
        assert layer == _layer(), f"worker runs {layer}, parent {_layer()}"
        workers.add(pid)
        for threads, result in zip((1, 2), results):
            _assert_equal(result, parent_results[index], f"fork worker, case {index}, {threads} thread(s)")
    assert os.getpid() not in workers and len(workers) == 2, f"workers {workers}"


def _spawned(index: int):
    return sample(index), _layer()


def check_spawn(parent_results, without_tbb: bool) -> None:
    context = multiprocessing.get_context("spawn")
    initializer = _block_tbb if without_tbb else None
    with context.Pool(2, initializer=initializer) as workers:
        for index, (result, layer) in enumerate(workers.map(_spawned, range(CASES))):
            assert layer == _layer(), f"spawned process runs {layer}, parent {_layer()}"
            _assert_equal(result, parent_results[index], f"spawned process, case {index}")


def check_threads(parent_results) -> None:
    """4 Python threads call the backward at once, 3 times each."""
    import gridsampler3d as gs

    start = threading.Barrier(4)
    failures = []

    def work(thread: int):
        try:
            for round_ in range(3):
                index = (thread + round_) % CASES
                grad, x, grid = _inputs(index)
                start.wait(timeout=60)
                ours = gs.grid_sampler3d_backward(grad, x, grid, "bilinear", "border", backend="numba")
                _assert_equal(ours, parent_results[index][1:], f"thread {thread}, case {index}")
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
    import numba

    for threads in (2, 1, 2):
        torch.set_num_threads(threads)
        _assert_equal(sample(0), parent_results[0], f"{threads} thread(s)")
        assert torch.get_num_threads() == threads, f"torch now has {torch.get_num_threads()} threads, not {threads}"
        assert numba.get_num_threads() == min(threads, numba.config.NUMBA_NUM_THREADS)


def _expected_layer(without_tbb: bool) -> str:
    chosen = os.environ.get("NUMBA_THREADING_LAYER")
    if chosen:
        return chosen
    try:
        importlib.metadata.distribution("tbb")
        has_tbb = not without_tbb
    except importlib.metadata.PackageNotFoundError:
        has_tbb = False
    return "tbb" if has_tbb else "workqueue"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=["fork", "spawn", "threads", "thread-count"])
    parser.add_argument("--without-tbb", action="store_true")
    args = parser.parse_args(argv)
    if args.without_tbb:
        _block_tbb()
    # One thread first: the pool's start must not change torch's setting (checked below).
    torch.set_num_threads(1)
    parent_results = [sample(index) for index in range(CASES)]
    assert torch.get_num_threads() == 1, f"the engine changed torch's thread count to {torch.get_num_threads()}"
    expected = _expected_layer(args.without_tbb)
    assert _layer() == expected, f"threading layer {_layer()}, expected {expected}"
    torch.set_num_threads(2)
    if args.check == "fork":
        check_fork(parent_results)
    elif args.check == "spawn":
        check_spawn(parent_results, args.without_tbb)
    elif args.check == "threads":
        check_threads(parent_results)
    else:
        check_thread_count(parent_results)
    print(f"ok: {args.check} on the {_layer()} layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
