"""What a second thread adds on this machine: vector-bound work against latency-bound scalar work.

    python benchmarks/second_thread.py [--repeats 5]

Runs two Numba loops on one thread, then one copy on each of two threads at once, and
prints each loop's throughput at two threads over its throughput at one (2.0: the second
thread doubles it; 1.0: it adds nothing):

- *vector*: a multiply-add over an array held in the L1 cache, vectorised, bound by the
  core's vector ports, as the engine's gathers and phase-A loops are;
- *scalar chain*: a chain of dependent multiply-adds, bound by latency, as PyTorch's
  scalar CPU kernels are.

Where two logical CPUs share a core's vector units the first ratio stays near 1 while the
second is near 2: a vectorised kernel then gains little from a second thread that a
scalar one doubles on (docs/cpu.md, "Threads").
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numba
import numpy as np


@numba.njit(nogil=True, fastmath=True)
def _vector(values, repeats):
    for _ in range(repeats):
        for i in range(values.size):
            values[i] = values[i] * 0.9999999 + 1e-7
    return values[0]


@numba.njit(nogil=True)
def _chain(steps):
    value = 1.0
    for _ in range(steps):
        value = value * 0.9999999 + 1e-9
    return value


def _seconds(function, argument_sets) -> float:
    threads = [threading.Thread(target=function, args=arguments) for arguments in argument_sets]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timings per measurement (median)")
    args = parser.parse_args()
    first, second = np.ones(2048), np.ones(2048)  # 16 KiB each: in L1
    vector_repeats, chain_steps = 100_000, 100_000_000
    _vector(first, 1), _chain(1)  # compiled before timing
    loops = {
        "vector": (_vector, [(first, vector_repeats)], [(first, vector_repeats), (second, vector_repeats)]),
        "scalar chain": (_chain, [(chain_steps,)], [(chain_steps,), (chain_steps,)]),
    }
    print("throughput at two threads over one thread (medians of", args.repeats, "timings)")
    for name, (function, one, two) in loops.items():
        alone = statistics.median(_seconds(function, one) for _ in range(args.repeats))
        together = statistics.median(_seconds(function, two) for _ in range(args.repeats))
        print(
            f"{name:13s} one thread {alone * 1e3:7.1f} ms, two threads (twice the work) {together * 1e3:7.1f} ms: "
            f"{2 * alone / together:.2f}x"
        )


if __name__ == "__main__":
    main()
