"""How much one line, or the fused warp, speeds up an existing MONAI registration step on the CPU.

    python benchmarks/monai_speedup.py --threads 2 --repeats 9 [--size 128] [--channels 1]

The step is MONAI's own code, unchanged: ``monai.networks.blocks.Warp`` moves an image by a
smooth dense displacement field (DDF), an MSE loss compares it with the fixed image, and
the gradient flows back to the DDF (as when a network predicts it). The one line is

    gridsampler3d.patch_torch()        # or: with gridsampler3d.patched(): ...

The same step is also timed with ``gridsampler3d.Warp3d`` (the fused warp, which takes
MONAI's DDF layout as is and builds no grid) in place of MONAI's ``Warp``.

Each repeat times one step on PyTorch's kernels, one patched and one fused, back to back,
after warm-up (which also compiles this library's kernels once), on the same inputs. It
prints the median time of each and the median of the per-repeat ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

import gridsampler3d


def _step(warp, moving, fixed, ddf):
    """One registration step: warp, loss, gradient with respect to the DDF."""
    ddf.grad = None
    loss = F.mse_loss(warp(moving, ddf), fixed)
    loss.backward()
    return loss


def _timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=128, help="edge of the cubic volume (default 128)")
    parser.add_argument("--channels", type=int, default=1, help="image channels (default 1)")
    parser.add_argument("--threads", type=int, default=None, help="threads for both (default: torch's setting)")
    parser.add_argument("--repeats", type=int, default=9, help="timed pairs of steps (default 9)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps of each first (default 2)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    from monai.networks.blocks import Warp

    warnings.filterwarnings("ignore", message="monai.networks.blocks.Warp")
    warnings.filterwarnings("ignore", message="Warning only once for all operators")
    generator = torch.Generator().manual_seed(0)
    shape = (1, args.channels) + (args.size,) * 3
    fixed = torch.rand(shape, generator=generator)
    moving = torch.rand(shape, generator=generator)
    # A smooth DDF, as a registration network predicts: a coarse random field (one control
    # point per 16 voxels) upsampled trilinearly, up to a few voxels.
    coarse = torch.randn((1, 3) + (max(2, args.size // 16),) * 3, generator=generator)
    ddf = 3.0 * F.interpolate(coarse, size=(args.size,) * 3, mode="trilinear", align_corners=True)
    ddf.requires_grad_(True)
    warp = Warp(mode="bilinear", padding_mode="border")  # MONAI's defaults
    step = lambda: _step(warp, moving, fixed, ddf)  # noqa: E731
    fused = gridsampler3d.Warp3d(mode="bilinear", padding_mode="border", align_corners=True)  # the same warp
    fused_step = lambda: _step(fused, moving, fixed, ddf)  # noqa: E731

    losses = {}
    for patched in (False, True):
        with gridsampler3d.patched() if patched else contextlib.nullcontext():
            for _ in range(args.warmup):
                losses[patched] = float(step().detach())
    for _ in range(args.warmup):
        losses["fused"] = float(fused_step().detach())
    torch_times, ours_times, fused_times = [], [], []
    for _ in range(args.repeats):
        torch_times.append(_timed(step))
        with gridsampler3d.patched():
            ours_times.append(_timed(step))
        fused_times.append(_timed(fused_step))
    ratios = [theirs / ours for theirs, ours in zip(torch_times, ours_times)]
    fused_ratios = [theirs / ours for theirs, ours in zip(torch_times, fused_times)]

    print(
        f"MONAI {__import__('monai').__version__} Warp (bilinear, border) + MSE + backward to the DDF; "
        f"volume {args.size}^3 x {args.channels} channel(s), float32, {torch.get_num_threads()} thread(s), "
        f"torch {torch.__version__}, {args.repeats} repeats"
    )
    print(f"loss PyTorch {losses[False]:.6g}, patched {losses[True]:.6g}, fused {losses['fused']:.6g}")
    print(
        f"step time, median: PyTorch {statistics.median(torch_times) * 1e3:.1f} ms, "
        f"gridsampler3d.patched() {statistics.median(ours_times) * 1e3:.1f} ms, "
        f"gridsampler3d.Warp3d {statistics.median(fused_times) * 1e3:.1f} ms"
    )
    print(
        f"median ratio (PyTorch / patched): {statistics.median(ratios):.2f}x "
        f"(per-repeat range {min(ratios):.2f}x to {max(ratios):.2f}x)"
    )
    print(
        f"median ratio (PyTorch / fused Warp3d): {statistics.median(fused_ratios):.2f}x "
        f"(per-repeat range {min(fused_ratios):.2f}x to {max(fused_ratios):.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
