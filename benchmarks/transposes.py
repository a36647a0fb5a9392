"""Time the engine's layout copies (cpu/transpose.py) against torch's ``contiguous(memory_format=...)``, one process.

    python benchmarks/transposes.py --threads 2 --rounds 21
    python benchmarks/transposes.py --threads 2 --rounds 11 --backward

On feat48's grad (2 x 32 x 48^3 float32; bf16's copies move the two-byte elements): each
round times both ways of each direction, in alternating order, after an untimed call of
each. The line per direction gives the medians and the median of the rounds' ratios
(engine / torch). Both give the same bits (checked first). With ``--backward``, feat48's
whole backward instead, its copy into channels-last made either way. docs/runtime.md
quotes it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import gridsampler3d as gs
from gridsampler3d.cpu import buffers, transpose
from gridsampler3d.tools.bench.suite import build_inputs, select_cases


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _alternating(calls: dict, rounds: int) -> dict:
    """{name: [seconds]} of each call, alternating in order round by round, each after an untimed call."""
    times = {name: [] for name in calls}
    for round_ in range(rounds):
        order = list(calls.items())
        for name, call in order if round_ % 2 else order[::-1]:
            call()
            times[name].append(_timed(call))
    return times


def _backward(rounds: int) -> None:
    """feat48's backward with its channels-last copies made by the engine's copy and by torch's."""
    case = select_cases(["feat48"])[0]
    (_, x, grid), (grad, x_ncdhw) = build_inputs(case)
    attributes = (case.mode, case.padding, case.align_corners)
    engine_copy = transpose.to_channels_last

    def torch_copy(tensor):
        return tensor.contiguous(memory_format=torch.channels_last_3d)

    def backward_with(copy):
        def call():
            transpose.to_channels_last = copy
            try:
                gs.grid_sampler3d_backward(grad, x_ncdhw, grid, *attributes, backend="numba")
            finally:
                transpose.to_channels_last = engine_copy

        return call

    times = _alternating({"engine": backward_with(engine_copy), "torch": backward_with(torch_copy)}, rounds)
    ratios = [ours / theirs for ours, theirs in zip(times["engine"], times["torch"])]
    print(
        f"feat48 backward: engine copies {statistics.median(times['engine']) * 1e3:6.1f} ms, torch's "
        f"{statistics.median(times['torch']) * 1e3:6.1f} ms, engine / torch {statistics.median(ratios):.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=21, help="timed rounds per direction (median)")
    parser.add_argument("--backward", action="store_true", help="time feat48's backward instead")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.backward:
        _backward(args.rounds)
        return
    print(f"{args.threads} thread(s), {args.rounds} rounds: engine copy / torch contiguous(memory_format=...)")
    for dtype in (torch.float32, torch.bfloat16):
        ncdhw = torch.randn(2, 32, 48, 48, 48).to(dtype)
        last = ncdhw.contiguous(memory_format=torch.channels_last_3d)
        directions = {
            "to channels-last": (
                lambda: transpose.to_channels_last(ncdhw),
                lambda: ncdhw.contiguous(memory_format=torch.channels_last_3d),
            ),
            "to NCDHW": (lambda: transpose.to_contiguous(last), lambda: last.contiguous()),
        }
        for direction, (engine, pytorch) in directions.items():
            assert torch.equal(engine(), pytorch()) and engine().stride() == pytorch().stride(), direction
            times = _alternating({"engine": engine, "torch": pytorch}, args.rounds)
            ratios = [ours / theirs for ours, theirs in zip(times["engine"], times["torch"])]
            print(
                f"{str(dtype):15s} {direction:16s} engine {statistics.median(times['engine']) * 1e3:6.2f} ms, "
                f"torch {statistics.median(times['torch']) * 1e3:6.2f} ms, engine / torch "
                f"{statistics.median(ratios):.2f}",
                flush=True,
            )
            buffers.release()


if __name__ == "__main__":
    main()
