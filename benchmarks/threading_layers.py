"""Times the CPU engine on each of Numba's threading layers: ``python benchmarks/threading_layers.py``.

    python benchmarks/threading_layers.py [--cases reg128,rand64,cl64] [--rounds 3] [--repeats 5]

The layer is fixed once per process, so every (round, layer) runs in a fresh process,
the layers taking turns round after round, so that a machine's changing load falls on
all of them alike. Inside, the thread counts (1 and 2) and cases alternate too. Prints
the median of all runs in milliseconds per layer, case, stage and thread count, as
Markdown.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

LAYERS = ("omp", "tbb", "workqueue")
THREADS = (1, 2)


def _time_layer(cases: list[str], repeats: int) -> dict:
    """In this process (on the layer NUMBA_THREADING_LAYER names): {"case stage threads": [ms, ...]}."""
    import torch

    from gridsampler3d import api
    from gridsampler3d.bench.suite import build_inputs, select_cases
    from gridsampler3d.cpu import pool

    calls = {}
    for case in select_cases(cases):
        (grad, x, grid), _ = build_inputs(case)
        attributes = dict(interpolation_mode=case.mode, padding_mode=case.padding,
                          align_corners=case.align_corners, data_format=case.layout, backend="numba")
        calls[f"{case.name} forward"] = lambda x=x, grid=grid, a=attributes: api.grid_sampler3d(x, grid, **a)
        calls[f"{case.name} backward"] = (lambda grad=grad, x=x, grid=grid, a=attributes:
                                          api.grid_sampler3d_backward(grad, x, grid, **a))
    times = collections.defaultdict(list)
    for repeat in range(repeats + 1):  # the first pass warms up (and compiles)
        for threads in THREADS:
            torch.set_num_threads(threads)
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                if repeat:
                    times[f"{name} {threads}"].append((time.perf_counter() - start) * 1e3)
    return {"layer": pool.layer(), "times": times}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="reg128,rand64,cl64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per process and measurement")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cases = args.cases.split(",")
    if args.child:
        print(json.dumps(_time_layer(cases, args.repeats)))
        return 0
    times = collections.defaultdict(list)
    for _ in range(args.rounds):
        for layer in LAYERS:
            env = dict(os.environ, NUMBA_THREADING_LAYER=layer)
            command = [sys.executable, __file__, "--child", "--cases", args.cases, "--repeats", str(args.repeats)]
            report = json.loads(subprocess.run(command, env=env, check=True, capture_output=True,
                                               text=True).stdout.splitlines()[-1])
            assert report["layer"] == layer, f"asked for {layer}, ran on {report['layer']}"
            for key, values in report["times"].items():
                times[(key, layer)].extend(values)
    print("| case | stage | threads | " + " | ".join(f"{layer} ms" for layer in LAYERS) + " |")
    print("| --- | --- | ---: | " + " | ".join("---:" for _ in LAYERS) + " |")
    for key in sorted({key for key, _ in times}, key=lambda k: (k.split()[0], k.split()[1], int(k.split()[2]))):
        medians = " | ".join(f"{statistics.median(times[(key, layer)]):.1f}" for layer in LAYERS)
        print(f"| {' | '.join(key.split())} | {medians} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
