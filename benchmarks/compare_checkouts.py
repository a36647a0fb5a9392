"""Time this checkout's CPU engine against another checkout's, in one process, in alternating pairs.

    git worktree add /tmp/before HEAD~1
    python benchmarks/compare_checkouts.py /tmp/before --cases near64,fp64 --threads 1 --stage backward
    python benchmarks/compare_checkouts.py . --other-plain --stage forward   # this engine against its plain path
    python benchmarks/compare_checkouts.py /tmp/before --cases warp128 --stage step   # an autograd step
    python benchmarks/compare_checkouts.py /tmp/before --cases affreg128 --stage backward   # the affine field

On a shared, noisy machine, separate runs of ``gridsampler3d bench`` can differ by more
than a kernel change does. Here both versions load into one process (the other checkout's
package under another name) and each timed call of one is followed by the same call of the
other, so that a disturbance hits both; the line per case gives each version's median and
the median of the per-pair ratios (this checkout / the other). ``--stage step`` times an
autograd step through the differentiable functions (``grid_sample``; ``warp`` for warp128,
``affine_warp`` for the affine cases, theta their field): the forward, then the backward of
a sum of squares, input and field both requiring their gradients. Calls under a few
milliseconds are not comparable here: Numba's dispatcher types a record argument by its
layout, so the kernels of whichever package is called second match through a slow path,
about 0.4 ms a call. Both compile into the Numba
cache as usual; set ``NUMBA_CACHE_DIR`` to a fresh directory when helpers changed. With
``--other-plain`` the other package is imported on the plain Numba path
(``GRIDSAMPLER3D_PLAIN_NUMBA=1``, docs/runtime.md), which compiles without the disk cache.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import gridsampler3d
from gridsampler3d.tools.bench.suite import build_inputs, select_cases


def load_other(checkout: Path, plain: bool = False):
    """The ``gridsampler3d`` package of another checkout, imported as ``gridsampler3d_other`` (on the plain path)."""
    if plain:
        os.environ["GRIDSAMPLER3D_PLAIN_NUMBA"] = "1"  # read when the package's jit module is imported
    package = checkout / "gridsampler3d"
    spec = importlib.util.spec_from_file_location(
        "gridsampler3d_other", package / "__init__.py", submodule_search_locations=[str(package)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["gridsampler3d_other"] = module
    spec.loader.exec_module(module)
    os.environ.pop("GRIDSAMPLER3D_PLAIN_NUMBA", None)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="root of the other checkout (holding its gridsampler3d/)")
    parser.add_argument(
        "--cases", default="reg128,feat48", help="comma-separated benchmark case names (warp128 runs the fused warp)"
    )
    parser.add_argument("--threads", type=int, default=1, help="threads for both versions (default 1)")
    parser.add_argument("--stage", choices=["forward", "backward", "step"], default="backward")
    parser.add_argument("--pairs", type=int, default=21, help="timed pairs per case (median)")
    parser.add_argument("--other-plain", action="store_true", help="import the other package on the plain path")
    args = parser.parse_args()
    other = load_other(args.other.resolve(), args.other_plain)
    torch.set_num_threads(args.threads)
    print(
        f"this checkout: {Path(gridsampler3d.__file__).parent.parent}; other: {args.other}; "
        f"{args.threads} thread(s), {args.stage}, {args.pairs} pairs"
    )
    for case in select_cases(args.cases.split(",")):
        (_, x, grid), (grad, x_ncdhw) = build_inputs(case)
        attributes = (case.mode, case.padding, case.align_corners)

        warp = case.grid_kind == "displacement"  # warp128: the fused warp, its "grid" the displacement
        affine = case.grid_kind.startswith("theta")  # the affine cases: the "grid" is theta
        size = tuple(grad.shape[2:])

        def step(library):
            volume = x_ncdhw.detach().requires_grad_(True)
            field = grid.detach().requires_grad_(True)
            if warp:
                output = library.warp(volume, field, *attributes)
            elif affine:
                output = library.affine_warp(volume, field, size, mode=case.mode, padding_mode=case.padding)
            else:
                output = library.grid_sample(volume, field, *attributes)
            output.square().sum().backward()
            return volume.grad, field.grad

        def run(library):
            if args.stage == "step":
                return step(library)
            if affine:
                forward = functools.partial(library.affine_warp3d, x_ncdhw, grid, size, None, *attributes)
                backward = functools.partial(
                    library.affine_warp3d_backward, grad, x_ncdhw, grid, size, None, *attributes
                )
                return (forward if args.stage == "forward" else backward)(backend="numba")
            forward = library.warp3d if warp else library.grid_sampler3d
            backward = library.warp3d_backward if warp else library.grid_sampler3d_backward
            if args.stage == "forward":
                return forward(x_ncdhw, grid, *attributes, backend="numba")
            return backward(grad, x_ncdhw, grid, *attributes, backend="numba")

        for library in (other, gridsampler3d, other, gridsampler3d):  # compile, then warm
            run(library)
        theirs, ours, ratios = [], [], []
        for _ in range(args.pairs):
            start = time.perf_counter()
            run(other)
            middle = time.perf_counter()
            run(gridsampler3d)
            end = time.perf_counter()
            theirs.append(middle - start)
            ours.append(end - middle)
            ratios.append((end - middle) / (middle - start))
        print(
            f"{case.name:8s} other {statistics.median(theirs) * 1e3:7.1f} ms  "
            f"this {statistics.median(ours) * 1e3:7.1f} ms  "
            f"this / other (median of pairs) {statistics.median(ratios):.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
