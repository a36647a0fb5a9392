"""How much a second thread adds on this machine, for three kinds of loop the CPU engine runs.

    python benchmarks/core_scaling.py

Each loop runs once on one thread, then twice at once on two threads (each with its own
data); scaling = 2 x one-thread time / two-thread time (2.0: the second core adds a full
core; 1.0: nothing). The loops are Numba functions that release the GIL:

- ``vector arithmetic``: a multiply and an add across an L1-resident float32 array, the
  kind of work phase A and the grid gradient's sums do (bound by the floating-point ports);
- ``gathers``: hardware gathers from an L1-resident table at random indices (bound by
  load latency), as the taps' gathers;
- ``scalar scatter``: read-modify-writes at random indices into an L2-resident array,
  as the dx scatter.

Two virtual cores that share one physical core's ports scale well on latency-bound loops
and poorly on port-bound ones; that bounds what two threads can give the kernels.
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def _arithmetic(values, repeats):
    for _ in range(repeats):
        for i in range(values.size):
            values[i] = values[i] * np.float32(0.999) + np.float32(0.001)


@njit(nogil=True, cache=True)
def _gathers(table, indices, out, repeats):
    for _ in range(repeats):
        for i in range(indices.size):
            out[i] = table[indices[i]] * np.float32(1.5) + out[i]


@njit(nogil=True, cache=True)
def _scatter(target, indices, repeats):
    for _ in range(repeats):
        for i in range(indices.size):
            target[indices[i]] += np.float32(0.5)


def _inputs(kind: str, rng):
    if kind == "vector arithmetic":
        return _arithmetic, (np.ones(512, np.float32), 400_000)
    if kind == "gathers":
        return _gathers, (np.ones(4096, np.float32), rng.integers(0, 4096, 2048), np.zeros(2048, np.float32), 30_000)
    return _scatter, (np.zeros(1 << 18, np.float32), rng.integers(0, 1 << 18, 1 << 16), 300)


def scaling(kind: str, rounds: int) -> float:
    """Median over ``rounds`` of 2 x one-thread time / two-thread time for loop ``kind``."""
    rng = np.random.default_rng(0)
    ratios = []
    for _ in range(rounds):
        function, arguments = _inputs(kind, rng)
        function(*arguments)  # compile or load
        start = time.perf_counter()
        function(*arguments)
        alone = time.perf_counter() - start
        threads = [threading.Thread(target=function, args=_inputs(kind, rng)[1]) for _ in range(2)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        ratios.append(2 * alone / (time.perf_counter() - start))
    return statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="measurements per loop (median)")
    args = parser.parse_args()
    for kind in ("vector arithmetic", "gathers", "scalar scatter"):
        print(f"{kind:18s} two-thread scaling {scaling(kind, args.rounds):.2f}x (median of {args.rounds})",
              flush=True)


if __name__ == "__main__":
    main()
