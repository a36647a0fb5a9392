"""Per-phase times of the CPU engine's kernels on one benchmark case (docs/cpu.md).

    python benchmarks/cpu_phases.py --cases reg128,feat48 --threads 1

Times each kernel pass on its own, in milliseconds (median of repeated runs, CPU time
of the process, which a busy machine disturbs less than wall time):

- ``plan``: the depth range of every row (what lets a thread skip rows outside its slab),
  as two or more threads need it: 256 sampled rows point by point, the others from their
  extreme z values where padding allows;
- ``forward``: the whole forward;
- ``dgrid``: the grid-gradient pass alone (coordinates, cells, gathers, sums, stores);
- ``dx``: the dx pass alone (coordinates, cells, in-order scatter, zeroing);
- ``fused``: dx and dgrid in one pass of one part, as the engine runs smooth grids on one thread;
- ``torch forward`` / ``torch backward``: PyTorch's own ops on the same inputs.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import gridsampler3d as gs
from gridsampler3d.bench.suite import build_inputs, select_cases
from gridsampler3d.cpu.backward import backward_kernel
from gridsampler3d.cpu import pool
from gridsampler3d.cpu.engine import _flat
from gridsampler3d.cpu.forward import forward_kernel
from gridsampler3d.cpu.slabs import depth_ranges, plan_slabs, row_parts


def _median_ms(run, repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return 1e3 * statistics.median(times)


def phases(case, repeats: int) -> dict[str, float]:
    """Milliseconds per phase of ``case`` at torch's current thread count."""
    (_, _, grid), (grad, x) = build_inputs(case)
    if x.dtype not in (torch.float32, torch.float64):  # the engine widens half types to float64 once
        grad, x, grid = grad.double(), x.double(), grid.double()
    threads = pool.threads()
    codes = (int(gs.Interpolation[case.mode.upper()]), int(gs.Padding[case.padding.upper()]), case.align_corners)
    batch, channels = x.shape[:2]
    sizes, out_sizes = tuple(x.shape[2:]), tuple(grid.shape[1:4])
    rows = batch * out_sizes[0] * out_sizes[1]
    row_first, row_last = (np.zeros(rows, np.int64) for _ in range(2))
    grid_flat, grid_strides = _flat(grid)
    row_step = max(1, rows // 256)  # as the engine samples
    times = {"plan": _median_ms(lambda: depth_ranges(grid_flat, grid_strides, batch, sizes, out_sizes, *codes, False,
                                                     row_step, True, row_first, row_last, threads),
                                  repeats)}
    reach = 1 if case.mode == "nearest" else 2
    slabs = plan_slabs(row_first, row_last, batch, sizes[0], sizes[1] * sizes[2], out_sizes[2], reach, threads)
    rows_only = row_parts(rows, batch * sizes[0], threads)
    y = torch.empty_like(grad)
    channels_last = case.layout == "NDHWC"  # as the engine builds its kernels
    forward = forward_kernel(*codes, False, False, channels_last=channels_last)
    shapes = (batch, channels, sizes, out_sizes)
    unresolved = np.zeros(threads, np.int64)  # the suite's grids stay within the fast kernels' exact range
    times["forward"] = _median_ms(lambda: forward(*_flat(x), grid_flat, grid_strides, *_flat(y), *shapes, threads,
                                                  unresolved), repeats)
    dx, dgrid = torch.empty_like(x), torch.empty_like(grid)
    backward = backward_kernel(*codes, case.dtype == "float64", False, False, channels_last=channels_last)
    operands = (*_flat(grad), *_flat(x), grid_flat, grid_strides, *_flat(dx), dgrid.numpy().reshape(-1),
                dgrid.stride(), row_first, row_last)
    one_pass = (np.empty(0), 0)  # no carry: each grid gradient in one pass (see backward_kernel)
    if case.mode != "nearest":
        times["dgrid"] = _median_ms(lambda: backward(*operands, rows_only, *shapes, False, True, *one_pass,
                                                     unresolved), repeats)
    times["dx"] = _median_ms(lambda: backward(*operands, slabs, *shapes, True, False, *one_pass, unresolved), repeats)
    if case.mode != "nearest":
        whole = np.array([[0, batch * sizes[0], 0, rows]], np.int64)  # one part, as one thread runs it
        times["fused"] = _median_ms(lambda: backward(*operands, whole, *shapes, True, True, *one_pass,
                                                     unresolved[:1]), repeats)
    mode, padding = codes[0], codes[1]
    times["torch forward"] = _median_ms(lambda: torch.grid_sampler_3d(x, grid, mode, padding, case.align_corners),
                                        repeats)
    times["torch backward"] = _median_ms(lambda: torch.ops.aten.grid_sampler_3d_backward(
        grad, x, grid, mode, padding, case.align_corners, (True, True)), repeats)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="reg128,feat48", help="comma-separated benchmark case names")
    parser.add_argument("--threads", type=int, default=1, help="threads for both libraries (default 1)")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per phase (median)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for case in select_cases(args.cases):
        if case.baseline != "torch":
            print(f"{case.name}: not a grid case against PyTorch; skipped")
            continue
        times = phases(case, args.repeats)
        print(f"{case.name} ({args.threads} thread{'s' if args.threads > 1 else ''}): "
              + ", ".join(f"{name} {value:.1f} ms" for name, value in times.items()), flush=True)


if __name__ == "__main__":
    main()
