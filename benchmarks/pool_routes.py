"""Time the CPU engine with its parts on torch's OpenMP team and on its own worker threads, in one process.

    python benchmarks/pool_routes.py --threads 2 --rounds 11

Each round times one call on each route (``pool.use``), in alternating order, each after
a PyTorch ``grid_sample`` of the same inputs (which leaves torch's OpenMP threads
spinning, as any parallel torch operation does) and an untimed call on the same route,
as ``gridsampler3d bench`` interleaves them. The line per case gives the medians and the
median of the rounds' ratios (team / workers). docs/runtime.md quotes it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import gridsampler3d as gs
from gridsampler3d.cpu import pool
from gridsampler3d.tools.bench.suite import build_inputs, select_cases


def _stages(case):
    """{"forward": call, "backward": call} of a suite case, and the PyTorch call that precedes each."""
    (_, x, grid), (grad, x_ncdhw) = build_inputs(case)
    attributes = (case.mode, case.padding, case.align_corners)
    warp = case.grid_kind == "displacement"
    forward, backward = (gs.warp3d, gs.warp3d_backward) if warp else (gs.grid_sampler3d, gs.grid_sampler3d_backward)
    sample = torch.zeros(1, 1, 1, 1, 3) if warp else grid
    torch_mode = "bilinear" if case.mode == "bicubic" else case.mode  # PyTorch has no 3-D bicubic

    def pytorch():
        torch.nn.functional.grid_sample(x_ncdhw, sample, torch_mode, case.padding, case.align_corners)

    return {
        "forward": lambda: forward(x_ncdhw, grid, *attributes, backend="numba"),
        "backward": lambda: backward(grad, x_ncdhw, grid, *attributes, backend="numba"),
    }, pytorch


def _rounds(call, pytorch, rounds: int):
    """{route: [seconds]} and the rounds' ratios (team / workers)."""
    times = {route: [] for route in pool.ROUTES}
    ratios = []
    for round_ in range(rounds):
        for route in pool.ROUTES if round_ % 2 else pool.ROUTES[::-1]:
            pool.use(route)
            pytorch()
            call()
            start = time.perf_counter()
            call()
            times[route].append(time.perf_counter() - start)
        ratios.append(times["team"][-1] / times["workers"][-1])
    return times, ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases",
        default="reg128,feat48,rand64,cl64,near64,bf16,fp64,up2x,warp128,cubic64,cubiccl",
        help="comma-separated suite case names (warp128 runs the fused warp)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=11, help="timed rounds per stage (median)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pool.use("team")  # ValueError where torch's threads are no OpenMP team
    print(f"{args.threads} thread(s), {args.rounds} rounds: torch's OpenMP team against the worker threads")
    for case in select_cases(args.cases.split(",")):
        stages, pytorch = _stages(case)
        line = [f"{case.name:8s}"]
        for stage, call in stages.items():
            call()  # compile
            times, ratios = _rounds(call, pytorch, args.rounds)
            line.append(
                f"{stage} team {statistics.median(times['team']) * 1e3:7.1f} ms, workers "
                f"{statistics.median(times['workers']) * 1e3:7.1f} ms, team / workers "
                f"{statistics.median(ratios):.2f}"
            )
        print("  ".join(line), flush=True)
    pool.use(None)


if __name__ == "__main__":
    main()
