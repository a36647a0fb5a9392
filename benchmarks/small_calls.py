"""Small calls against PyTorch: backward, forward and an autograd step, medians in one process.

    python benchmarks/small_calls.py              # torch's thread count
    python benchmarks/small_calls.py --threads 2
    python benchmarks/small_calls.py --threads 1 --other /tmp/before   # against another checkout, not PyTorch

With ``--other`` each call is timed against the same call of another checkout's package
(loaded under another name, as ``compare_checkouts.py`` does), in alternating pairs, the
two taking turns to go first; the cells are then that checkout's time / this one's.

Float32, bilinear, zeros, align_corners=False, a slightly perturbed affine grid. The
backward and forward are the op-level calls (``aten::grid_sampler_3d{,_backward}`` against
``gs.grid_sampler3d{,_backward}``); the step is ``grid_sample(x, grid).sum().backward()``
with both leaves requiring grad (``F.grid_sample`` against ``gs.grid_sample``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from compare_checkouts import load_other

import gridsampler3d as gs

SHAPES = [(1, 2, 8), (1, 2, 16), (8, 2, 16), (4, 4, 24)]  # (N, C, edge): output points N * edge^3


def _medians_us(theirs, ours, runs: int) -> tuple:
    """Medians of ``runs`` timed calls of each, in alternating pairs: a disturbance of the shared machine then
    falls on both."""
    for _ in range(5):
        theirs(), ours()
    times = ([], [])
    for _ in range(runs):
        for call, kept in ((theirs, times[0]), (ours, times[1])):
            start = time.perf_counter()
            call()
            kept.append(time.perf_counter() - start)
    return tuple(statistics.median(kept) * 1e6 for kept in times)


def _other_calls(other, x, grid, grad, leaves) -> list:
    """The other checkout's op-level backward and forward, and its autograd step, as (theirs) callables."""
    return [
        lambda: other.grid_sampler3d_backward(grad, x, grid),
        lambda: other.grid_sampler3d(x, grid),
        lambda: other.grid_sample(*leaves, align_corners=False).sum().backward(),
    ]


def _alternating(theirs, ours, runs: int) -> tuple:
    """:func:`_medians_us`, with the two taking turns to go first: half the pairs each way round."""
    half = max(1, runs // 2)
    first = _medians_us(theirs, ours, half)
    second = _medians_us(ours, theirs, half)
    return (first[0] + second[1]) / 2, (first[1] + second[0]) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--runs", type=int, default=41, help="timed calls per measurement (median)")
    parser.add_argument("--other", type=Path, help="time against this checkout's package instead of PyTorch")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    other = load_other(args.other) if args.other else None
    against = f"the checkout at {args.other}" if other else "PyTorch"
    print(
        f"{torch.get_num_threads()} thread(s), medians of {args.runs} calls in alternating pairs, us ({against} / ours)"
    )
    print("| call | output points | backward | forward | autograd step |")
    print("| --- | --- | --- | --- | --- |")
    for batch, channels, edge in SHAPES:
        x = torch.randn(batch, channels, edge, edge, edge)
        theta = torch.eye(3, 4).expand(batch, 3, 4) + 0.05 * torch.randn(batch, 3, 4)
        grid = F.affine_grid(theta, (batch, 1, edge, edge, edge), align_corners=False)
        grad = torch.randn(batch, channels, edge, edge, edge)
        leaves = x.clone().requires_grad_(), grid.clone().requires_grad_()
        pairs = [
            (
                lambda: torch.ops.aten.grid_sampler_3d_backward(grad, x, grid, 0, 0, False, [True, True]),
                lambda: gs.grid_sampler3d_backward(grad, x, grid),
            ),
            (lambda: torch.ops.aten.grid_sampler_3d(x, grid, 0, 0, False), lambda: gs.grid_sampler3d(x, grid)),
            (
                lambda: F.grid_sample(*leaves, align_corners=False).sum().backward(),
                lambda: gs.grid_sample(*leaves, align_corners=False).sum().backward(),
            ),
        ]
        if other is not None:
            other_leaves = x.clone().requires_grad_(), grid.clone().requires_grad_()
            pairs = [
                (theirs, ours) for theirs, (_, ours) in zip(_other_calls(other, x, grid, grad, other_leaves), pairs)
            ]
            times = [_alternating(theirs, ours, args.runs) for theirs, ours in pairs]
            cells = ["{:.0f} / {:.0f} ({:.2f}x)".format(theirs, ours, theirs / ours) for theirs, ours in times]
        else:
            cells = ["{:.0f} / {:.0f}".format(*_medians_us(theirs, ours, args.runs)) for theirs, ours in pairs]
        print(f"| N={batch}, C={channels}, {edge}³ | {batch * edge**3:,} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
