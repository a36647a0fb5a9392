"""The affine forward three ways at MRI size: PyTorch's explicit path, this library's explicit path, and fused.

    python benchmarks/affine_forward.py --threads 1 --repeats 7

``F.affine_grid`` + ``F.grid_sample`` (PyTorch's explicit path), ``F.affine_grid`` +
``gs.grid_sample`` (this library's sampling at a grid built beforehand) and
``gs.affine_warp`` (no grid), on a 1 x 1 x 160 x 192 x 224 float32 volume, bilinear,
border, align_corners False; the three in turn in each repeat, after warm-up. Prints the
median times and the fused call's speed-up over each explicit path.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import gridsampler3d as gs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch's threads (default 1)")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds (default 7)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    volume = torch.rand(1, 1, 160, 192, 224, generator=generator)
    theta = torch.eye(3, 4)[None] + 0.05 * torch.randn(1, 3, 4, generator=generator)
    size = tuple(volume.shape)
    runs = {
        "PyTorch explicit": lambda: F.grid_sample(volume, F.affine_grid(theta, size, False), "bilinear", "border"),
        "gridsampler3d explicit": lambda: gs.grid_sample(
            volume, F.affine_grid(theta, size, False), "bilinear", "border"
        ),
        "gridsampler3d fused": lambda: gs.affine_warp(volume, theta, padding_mode="border"),
    }
    for run in runs.values():
        run()  # warm-up (compiles this library's kernels once)
    times = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"affine forward 1 x 1 x 160 x 192 x 224, float32, {torch.get_num_threads()} thread(s), "
        f"medians of {args.repeats}"
    )
    for name, median in medians.items():
        print(f"  {name}: {median * 1e3:.1f} ms")
    fused = medians["gridsampler3d fused"]
    print(
        f"fused: {medians['PyTorch explicit'] / fused:.2f}x PyTorch's explicit path, "
        f"{medians['gridsampler3d explicit'] / fused:.2f}x this library's explicit path"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
