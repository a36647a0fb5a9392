"""Python calls in one eager forward and backward, per differentiable function, counted by cProfile.

    python benchmarks/call_counts.py              # a 16³ case, two channels, float32
    python benchmarks/call_counts.py --by-module  # where the calls go

Each function runs a few times first (compiles, plans, scratch), then once under cProfile:
``f(...).sum().backward()`` with every tensor requiring its gradient, as a training step
calls it. cProfile counts Python functions and the built-in functions they call (not
operators such as ``a * b``, nor calls made from C), so the count is the Python a call pays
for, in this library, in torch's autograd and in NumPy, whatever the machine's speed.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats

import torch

import gridsampler3d as gs


def _cases(edge: int, channels: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, channels, edge, edge, edge, generator=generator).requires_grad_()
    theta = (torch.eye(3, 4) + 0.05 * torch.randn(3, 4, generator=generator))[None].requires_grad_()
    grid = torch.nn.functional.affine_grid(theta.detach(), (1, 1, edge, edge, edge), align_corners=False)
    grid.requires_grad_()
    displacement = (0.5 * torch.randn(1, 3, edge, edge, edge, generator=generator)).requires_grad_()
    return {
        "grid_sample": lambda: gs.grid_sample(x, grid),
        "warp": lambda: gs.warp(x, displacement),
        "affine_warp": lambda: gs.affine_warp(x, theta),
        "affine_warp with a displacement": lambda: gs.affine_warp(x, theta, displacement=displacement),
    }


def count(step) -> pstats.Stats:
    """The profile of one ``step().sum().backward()``, after three warm-up runs."""
    for _ in range(3):
        step().sum().backward()
    profile = cProfile.Profile()
    profile.enable()
    step().sum().backward()
    profile.disable()
    return pstats.Stats(profile)


def _by_module(stats: pstats.Stats) -> collections.Counter:
    counts = collections.Counter()
    for (filename, _, _), (_, calls, _, _, _) in stats.stats.items():
        if "gridsampler3d" in filename and "site-packages" not in filename:
            where = "gridsampler3d/" + filename.split("gridsampler3d/")[-1]
        elif filename == "~":
            where = "built-in functions"
        else:
            where = "torch" if "torch" in filename else "numpy" if "numpy" in filename else "other"
        counts[where] += calls
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edge", type=int, default=16)
    parser.add_argument("--channels", type=int, default=2)
    parser.add_argument("--by-module", action="store_true", help="also list where each function's calls go")
    args = parser.parse_args()
    totals = {}
    for name, step in _cases(args.edge, args.channels).items():
        stats = count(step)
        totals[name] = stats.total_calls
        print(f"{name}: {stats.total_calls} calls")
        if args.by_module:
            for where, calls in _by_module(stats).most_common():
                print(f"    {calls:5d}  {where}")
    print(f"most / least: {max(totals.values()) / min(totals.values()):.3f}")


if __name__ == "__main__":
    main()
