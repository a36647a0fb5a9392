"""A cubic B-spline free-form deformation against what its users run today: SimpleITK, deepali, the explicit path.

    python benchmarks/bspline.py --threads 1 [--size 160,192,224] [--mesh 4] [--stride 5] [--repeats 5] [--memory]

Forward (``--mesh`` intervals per axis, 7 control points by default, trilinear): this
library's ``bspline_warp`` on the grid of SimpleITK's ``BSplineTransformInitializer``
(:func:`gridsampler3d.bspline.simpleitk_grid`) against

- SimpleITK's resampler with the same transform and parameters (what TorchIO's
  ``RandomElasticDeformation`` runs, per channel), when SimpleITK is installed;
- the explicit path in torch: the dense field from the control points by three matrix
  products with the basis matrices (the fastest way found here), then ``F.grid_sample``
  (:class:`gridsampler3d.tools.bench.dense.DenseBSpline`, the ``gridsampler3d bench``
  cases' baseline).

An FFD registration step (control points every ``--stride`` voxels, requiring grad, the
moving image warped, MSE to a fixed image, backward): deepali's ``FreeFormDeformation``
and ``ImageTransformer`` (when hf-deepali is installed) against this library on the same
control grid (:func:`gridsampler3d.bspline.deepali_grid`, border padding and
align_corners as deepali samples), and the explicit path.

Each repeat times every method once, in turn, on the same inputs after warm-up; the
medians and the ratios to this library's time are printed. ``--memory`` also runs one
step of each in a process of its own and prints its peak resident memory above what the
process held before the step (sampled every millisecond).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F

import gridsampler3d as gs
from gridsampler3d import bspline
from gridsampler3d.tools.bench.dense import DenseBSpline


def _medians(methods: dict, repeats: int, warmup: int = 1) -> dict:
    for function in methods.values():
        for _ in range(warmup):
            function()
    times = {name: [] for name in methods}
    for _ in range(repeats):
        for name, function in methods.items():
            start = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def _report(title: str, medians: dict, ours: str) -> None:
    print(title)
    for name, seconds in medians.items():
        ratio = "" if name == ours else f"  {seconds / medians[ours]:6.2f}x this library's time"
        print(f"  {name:<28} {seconds * 1e3:9.1f} ms{ratio}")


def forward_methods(sizes, mesh: int, seed: int = 0) -> dict:
    """The forward's methods on one volume and one transform (SimpleITK's grid)."""
    generator = torch.Generator().manual_seed(seed)
    volume = torch.rand(1, 1, *sizes, generator=generator)
    spacing, origin = bspline.simpleitk_grid(sizes, (mesh,) * 3)
    control_sizes = (mesh + 3,) * 3
    parameters = np.random.default_rng(seed).uniform(-4, 4, 3 * (mesh + 3) ** 3)
    control_points = torch.from_numpy(bspline.simpleitk_control_points(parameters, control_sizes)).float()[None]
    methods = {"gridsampler3d": lambda: gs.bspline_warp(volume, control_points, spacing=spacing, origin=origin)}
    explicit = DenseBSpline(sizes, control_sizes, spacing, origin)
    methods["explicit (dense field)"] = lambda: explicit(volume, control_points)
    try:
        import SimpleITK as sitk
    except ImportError:
        print("SimpleITK is not installed: its resampler is left out (pip install simpleitk)")
        return methods
    sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(torch.get_num_threads())
    image = sitk.GetImageFromArray(volume[0, 0].numpy())
    transform = sitk.BSplineTransformInitializer(image, (mesh,) * 3)
    transform.SetParameters(parameters.tolist())
    methods["SimpleITK resampler"] = lambda: sitk.Resample(image, transform, sitk.sitkLinear, 0.0)
    return methods


def step_methods(sizes, stride: int, seed: int = 0) -> dict:
    """An FFD registration step's methods on one moving and fixed image, control points every ``stride`` voxels."""
    generator = torch.Generator().manual_seed(seed)
    moving, fixed = torch.rand(2, 1, 1, *sizes, generator=generator)
    control_sizes, spacing, origin = bspline.deepali_grid(sizes, stride)
    start = 0.01 * torch.randn(1, 3, *control_sizes, generator=generator)  # deepali's normalised units
    control_points = bspline.deepali_control_points(start, sizes).requires_grad_()

    def ours():
        control_points.grad = None
        warped = gs.bspline_warp(
            moving, control_points, spacing=spacing, origin=origin, padding_mode="border", align_corners=True
        )
        F.mse_loss(warped, fixed).backward()

    explicit = DenseBSpline(sizes, control_sizes, spacing, origin, padding_mode="border", align_corners=True)

    def explicit_step():
        control_points.grad = None
        F.mse_loss(explicit(moving, control_points), fixed).backward()

    methods = {"gridsampler3d": ours, "explicit (dense field)": explicit_step}
    try:
        from deepali.core import Grid
        from deepali.spatial import FreeFormDeformation, ImageTransformer
    except ImportError:
        print("deepali is not installed: its step is left out (pip install hf-deepali)")
        return methods
    ffd = FreeFormDeformation(Grid(shape=sizes), stride=stride)
    with torch.no_grad():
        ffd.params.copy_(start)
    transformer = ImageTransformer(ffd)

    def deepali_step():
        ffd.params.grad = None
        F.mse_loss(transformer(moving), fixed).backward()

    methods["deepali FreeFormDeformation"] = deepali_step
    return methods


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_above(function) -> int:
    """The peak resident memory while ``function`` runs, above what the process held before, in bytes."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed blocks back to the system, so that they count again
    except OSError:
        pass
    before = peak = _resident_bytes()
    running = True

    def sample():
        nonlocal peak
        while running:
            peak = max(peak, _resident_bytes())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        function()
    finally:
        running = False
        sampler.join()
    return max(peak, _resident_bytes()) - before


def _memory_of(kind: str, name: str, args) -> float:
    """One method's peak memory in MB, measured in a fresh process (``--child``)."""
    command = [sys.executable, __file__, "--child", kind, name, "--size", args.size, "--mesh", str(args.mesh)]
    command += ["--stride", str(args.stride), "--threads", str(torch.get_num_threads())]
    environment = {**os.environ, "GRIDSAMPLER3D_CPU_CACHE_MB": "0"}  # no resident buffers kept between calls
    result = subprocess.run(command, capture_output=True, text=True, env=environment, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])["megabytes"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="160,192,224", help="the volume's D,H,W (default 160,192,224)")
    parser.add_argument("--mesh", type=int, default=4, help="forward: mesh intervals per axis (default 4: 7 points)")
    parser.add_argument("--stride", type=int, default=5, help="step: control point stride in voxels (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="threads for every method (default 1)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--memory", action="store_true", help="also each step's peak memory, in fresh processes")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "NAME"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = tuple(int(size) for size in args.size.split(","))
    if args.child:
        kind, name = args.child
        methods = forward_methods(sizes, args.mesh) if kind == "forward" else step_methods(sizes, args.stride)
        methods[name]()  # warm-up: kernels compiled, autograd's graph made once
        print(json.dumps({"megabytes": peak_above(methods[name]) / 2**20}))
        return 0
    print(f"{torch.__version__}, {args.threads} thread(s), volume {sizes}")
    _report(
        f"forward, {args.mesh + 3}^3 control points (SimpleITK's grid), trilinear:",
        _medians(forward_methods(sizes, args.mesh), args.repeats),
        "gridsampler3d",
    )
    steps = step_methods(sizes, args.stride)
    _report(
        f"registration step, control points every {args.stride} voxels (deepali's grid), MSE, backward:",
        _medians(steps, args.repeats),
        "gridsampler3d",
    )
    if args.memory:
        print("peak memory of one step above the inputs (a fresh process each):")
        for name in steps:
            print(f"  {name:<28} {_memory_of('step', name, args):9.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
