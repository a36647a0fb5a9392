"""One digest of the outputs of a few hundred calls, to show that a change of the code moved no bit.

Every interpolation, padding, align_corners, dtype, layout and output mask, the grid sampler,
the fused warp and the affine field (with and without a displacement, one theta in nine not
finite), at one and two threads, each call once as the planner makes it and once with the
tuning constants lowered so that the small volumes here take the plans of large ones (parts,
channel groups, carried sums, channels-last copies). Run it on two
checkouts and compare the last line:

    python benchmarks/results_digest.py                    # this checkout
    PYTHONPATH=<other checkout> python benchmarks/results_digest.py

``--backend triton`` digests the Triton engine (through its interpreter without a GPU:
set ``TRITON_INTERPRET=1``), on a smaller set of calls.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools

import torch

import gridsampler3d as gs
from gridsampler3d.cpu import tuning

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MODES = ("bilinear", "nearest", "bicubic")
PADDINGS = ("zeros", "border", "reflection")
MASKS = ((True, True), (True, False), (False, True))
# Lowered so that small volumes take the large calls' plans (as tests/conftest.py's split_small_calls).
SPLIT = {
    "PARALLEL_VALUES": 0,
    "SERIAL_ITEM_BYTES": 0,
    "SCATTER_CACHE_BYTES": 2048,
    "CARRY_BYTES": 4096,
    "COPIED_CHANNELS": 4,
    "COPIED_HALF_CHANNELS": 4,
}


def _grid(generator, batch, out_sizes, spread):
    grid = (torch.rand(batch, *out_sizes, 3, generator=generator, dtype=torch.float64) * 2 - 1) * spread
    flat = grid.view(-1)
    flat[::97] = float("nan")
    flat[5::101] = 3.5  # far outside
    flat[7::89] = 0.0  # on a voxel centre or edge
    return grid


def _bits(tensor) -> bytes:
    if tensor is None:
        return b"none"
    tensor = tensor.detach().contiguous()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return bytes(str(tuple(tensor.shape)), "ascii") + tensor.numpy().tobytes()


def _sampler_calls(generator, backend, small):
    shapes = (
        [((2, 3, (5, 6, 7)), (4, 5, 6))]
        if small
        else [((2, 3, (5, 6, 7)), (4, 5, 6)), ((1, 18, (9, 8, 10)), (8, 9, 7)), ((3, 1, (1, 4, 3)), (2, 1, 5))]
    )
    for index, (mode, padding, align_corners, dtype, layout) in enumerate(
        itertools.product(MODES, PADDINGS, (False, True), DTYPES, ("NCDHW", "NDHWC"))
    ):
        (batch, channels, sizes), out_sizes = shapes[index % len(shapes)]
        x = torch.randn(batch, channels, *sizes, generator=generator, dtype=torch.float64)
        grid = _grid(generator, batch, out_sizes, 1.3 if index % 2 else 4.0)
        grad = torch.randn(batch, channels, *out_sizes, generator=generator, dtype=torch.float64)
        x, grid, grad = x.to(dtype), grid.to(dtype), grad.to(dtype)
        if layout == "NDHWC":
            x, grad = x.permute(0, 2, 3, 4, 1).contiguous(), grad.permute(0, 2, 3, 4, 1).contiguous()
        y = gs.grid_sampler3d(x, grid, mode, padding, align_corners, data_format=layout, backend=backend)
        mask = MASKS[index % len(MASKS)]
        yield (
            (mode, padding, align_corners, dtype, layout, mask),
            (
                y,
                *gs.grid_sampler3d_backward(
                    grad, x, grid, mode, padding, align_corners, output_mask=mask, data_format=layout, backend=backend
                ),
            ),
        )


def _warp_calls(generator, backend, small):
    sizes_of = [(4, 5, 6)] if small else [(4, 5, 6), (9, 7, 8)]
    for index, (mode, padding, align_corners, dtype, displacement_format) in enumerate(
        itertools.product(MODES, PADDINGS, (False, True), DTYPES, ("N3DHW", "NDHW3"))
    ):
        sizes = sizes_of[index % len(sizes_of)]
        channels = 1 + index % 5
        volume = torch.randn(2, channels, *sizes, generator=generator, dtype=torch.float64).to(dtype)
        displacement = (torch.randn(2, 3, *sizes, generator=generator, dtype=torch.float64) * 2.5).to(dtype)
        if displacement_format == "NDHW3":
            displacement = displacement.permute(0, 2, 3, 4, 1).contiguous()
        grad = torch.randn(2, channels, *sizes, generator=generator, dtype=torch.float64).to(dtype)
        y = gs.warp3d(
            volume, displacement, mode, padding, align_corners, displacement_format=displacement_format, backend=backend
        )
        mask = MASKS[index % len(MASKS)]
        yield (
            (mode, padding, align_corners, dtype, displacement_format, mask),
            (
                y,
                *gs.warp3d_backward(
                    grad,
                    volume,
                    displacement,
                    mode,
                    padding,
                    align_corners,
                    output_mask=mask,
                    displacement_format=displacement_format,
                    backend=backend,
                ),
            ),
        )


def _affine_calls(generator, backend, small):
    """The affine field, with and without a displacement, every mode, padding, align_corners and dtype: theta near the
    identity (positions inside and past the edges), one call in nine with a non-finite theta (the explicit path)."""
    shapes = (
        [((2, 3, (5, 6, 7)), (4, 5, 6))] if small else [((2, 3, (5, 6, 7)), (4, 5, 6)), ((1, 5, (6, 4, 5)), (3, 7, 2))]
    )
    masks = ((True, True, True), (True, False, False), (False, True, False), (False, False, True))
    for index, (mode, padding, align_corners, dtype, displaced) in enumerate(
        itertools.product(MODES, PADDINGS, (False, True), DTYPES, (False, True))
    ):
        (batch, channels, sizes), out_sizes = shapes[index % len(shapes)]
        volume = torch.randn(batch, channels, *sizes, generator=generator, dtype=torch.float64).to(dtype)
        theta = torch.eye(3, 4, dtype=torch.float64) + 0.3 * torch.randn(
            batch, 3, 4, generator=generator, dtype=torch.float64
        )
        if index % 9 == 4:
            theta[0, 1, 2] = float("nan")
        theta = theta.to(dtype)
        displacement = None
        if displaced:
            displacement = (torch.randn(batch, 3, *out_sizes, generator=generator, dtype=torch.float64) * 1.5).to(dtype)
        grad = torch.randn(batch, channels, *out_sizes, generator=generator, dtype=torch.float64).to(dtype)
        common = dict(interpolation_mode=mode, padding_mode=padding, align_corners=align_corners, backend=backend)
        y = gs.affine_warp3d(volume, theta, out_sizes, displacement, **common)
        mask = masks[index % len(masks)]
        yield (
            (mode, padding, align_corners, dtype, displaced, mask),
            (y, *gs.affine_warp3d_backward(grad, volume, theta, out_sizes, displacement, output_mask=mask, **common)),
        )


def digest(backend: str, thread_counts, splits) -> tuple[str, int]:
    total, calls = hashlib.sha256(), 0
    defaults = {name: getattr(tuning, name) for name in SPLIT}
    small = backend != "numba"
    try:
        for threads, split in itertools.product(thread_counts, splits):
            torch.set_num_threads(threads)
            for name, value in (SPLIT if split else defaults).items():
                setattr(tuning, name, value)
            generator = torch.Generator().manual_seed(1234)
            for family in (_sampler_calls, _warp_calls, _affine_calls):
                for label, outputs in family(generator, backend, small):
                    part = hashlib.sha256(b"".join(_bits(output) for output in outputs)).hexdigest()
                    total.update(f"{threads} {split} {label} {part}\n".encode())
                    calls += 1
    finally:
        for name, value in defaults.items():
            setattr(tuning, name, value)
    return total.hexdigest(), calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="numba")
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()
    threads = [int(value) for value in args.threads.split(",")]
    splits = (False, True) if args.backend == "numba" else (False,)
    value, calls = digest(args.backend, threads, splits)
    print(f"{calls} calls (forward and backward each), backend {args.backend}, threads {args.threads}")
    print(value)


if __name__ == "__main__":
    main()
