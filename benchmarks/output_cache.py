"""Time the CPU engine with its cache of released output blocks off and on, in one process (docs/cpu.md).

    python benchmarks/output_cache.py --cases near64,bf16,reg128 --threads 1

Each round times one call with the cache off (``tuning.CACHED_BYTES = 0``: every output
from ``torch.empty``, as PyTorch's own ops get theirs) and one with it on, in alternating
order, each after a PyTorch ``grid_sample`` of the same inputs and an untimed call of the
same setting, as ``gridsampler3d bench`` interleaves them. The line per case gives the
medians and the median of the rounds' ratios (on / off).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import gridsampler3d as gs
from gridsampler3d.cpu import buffers, tuning
from gridsampler3d.tools.bench.suite import build_inputs, select_cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases",
        default="near64,bf16,reg128,warp128",
        help="comma-separated benchmark case names (warp128 runs the fused warp)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=11, help="timed rounds per stage (median)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cached = tuning.CACHED_BYTES
    print(f"{args.threads} thread(s), {args.rounds} rounds, cache of {cached >> 20} MiB against none")
    for case in select_cases(args.cases.split(",")):
        (_, x, grid), (grad, x_ncdhw) = build_inputs(case)
        attributes = (case.mode, case.padding, case.align_corners)
        warp = case.grid_kind == "displacement"
        stages = {
            "forward": lambda: (gs.warp3d if warp else gs.grid_sampler3d)(x_ncdhw, grid, *attributes, backend="numba"),
            "backward": lambda: (gs.warp3d_backward if warp else gs.grid_sampler3d_backward)(
                grad, x_ncdhw, grid, *attributes, backend="numba"
            ),
        }
        sample = grid if not warp else torch.zeros(1, 1, 1, 1, 3)

        def pytorch():
            torch.nn.functional.grid_sample(x_ncdhw, sample, *attributes)

        line = [f"{case.name:8s}"]
        for stage, call in stages.items():
            call()  # compile
            times = {0: [], cached: []}
            ratios = []
            for round_ in range(args.rounds):
                for setting in (cached, 0) if round_ % 2 else (0, cached):
                    tuning.CACHED_BYTES = setting
                    buffers.release()  # off: nothing kept; on: the cache fills again from here
                    pytorch()
                    call()
                    start = time.perf_counter()
                    call()
                    times[setting].append(time.perf_counter() - start)
                ratios.append(times[cached][-1] / times[0][-1])
            line.append(
                f"{stage} off {statistics.median(times[0]) * 1e3:7.1f} ms on "
                f"{statistics.median(times[cached]) * 1e3:7.1f} ms, on / off {statistics.median(ratios):.3f}"
            )
        tuning.CACHED_BYTES = cached
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
