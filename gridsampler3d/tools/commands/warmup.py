"""The ``warmup`` command: compile the CPU engine's kernels into the disk cache ahead of time.

A mode's first call compiles its kernels (seconds each). ``gridsampler3d warmup`` runs a
small forward and backward of each combination asked for (dtype, interpolation, padding,
``align_corners``, layout, kind of field), once as a small call plans it and once as a
large one does (parts, channel groups, carried sums, channels-last copies), and a
reflection far outside the volume (whose exact remainder is a kernel of its own): later
processes then load every kernel they need from the cache. For a container image or a
shared install, run it where the cache is kept (``NUMBA_CACHE_DIR``, docs/runtime.md).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import time
from pathlib import Path

from ...cpu.compile_report import reporting_compiles
from .arguments import CliError, choices, to_stderr

__all__ = ["add_command", "cache_folders", "cached_size", "clear_cache"]

DTYPES = ("float16", "bfloat16", "float32", "float64")
MODES = ("bilinear", "nearest", "bicubic")
PADDINGS = ("zeros", "border", "reflection")
LAYOUTS = ("NCDHW", "NDHWC")
FIELDS = ("grid", "displacement", "affine", "bspline")
# The tuning constants lowered so that small volumes take the plans of large ones (as tests/conftest.py does).
_LARGE_PLANS = {
    "PARALLEL_VALUES": 0,
    "SERIAL_ITEM_BYTES": 0,
    "SCATTER_CACHE_BYTES": 2048,
    "CARRY_BYTES": 4096,
    "COPIED_CHANNELS": 4,
    "COPIED_HALF_CHANNELS": 4,
}


def add_command(commands) -> None:
    """Add ``warmup`` to the command line's subcommands."""
    text = "compile the CPU engine's kernels into the disk cache ahead of time (defaults: the common modes)"
    warmup = commands.add_parser("warmup", help=text, description=text + ". " + __doc__.split("\n\n")[1])
    warmup.add_argument("--dtypes", type=choices(DTYPES), default="float32", help="default float32")
    warmup.add_argument("--modes", type=choices(MODES), default="bilinear", help="interpolation; default bilinear")
    warmup.add_argument("--paddings", type=choices(PADDINGS), default="zeros,border,reflection", help="default all")
    warmup.add_argument("--align-corners", type=choices(("false", "true")), default="false,true", help="default both")
    warmup.add_argument("--layouts", type=choices(LAYOUTS), default="NCDHW", help="default NCDHW")
    warmup.add_argument("--fields", type=choices(FIELDS), default="grid,displacement", help="default grid,displacement")
    instead = warmup.add_mutually_exclusive_group()
    instead.add_argument("--where", action="store_true", help="print where the kernels are cached, and stop")
    instead.add_argument("--clear", action="store_true", help="remove this package's cached kernels, and stop")
    warmup.set_defaults(handler=_warmup)


def cache_folders() -> dict[Path, bool]:
    """The folders Numba's disk cache keeps this package's kernels in, each with whether new kernels are written
    there (False: the folder beside the package, read only). Empty where the kernels compile in memory."""
    from ...cpu import forward, jit, theta  # noqa: F401 (theta: its kernels and affine.py's helpers, declared)
    from ...sampling import FieldKind, Sampling

    if jit.plain():
        return {}
    from ...cpu import numba_hooks

    forward.forward_kernel(Sampling(), FieldKind.GRID)
    return {Path(folder): writable for folder, writable in sorted(numba_hooks.cache_folders().items())}


def _cached_files(folder: Path) -> list[Path]:
    """This package's index and code files in ``folder`` (Numba names them after the module of the function)."""
    from ... import cpu

    stems = {path.stem for path in Path(cpu.__file__).parent.glob("*.py")} | {"affine"}
    return [path for path in folder.glob("*.nb[ic]") if path.name.split(".", 1)[0] in stems]


def cached_size(folder: Path) -> tuple[int, int]:
    """This package's cached kernels in ``folder``: (files, bytes)."""
    files = _cached_files(folder)
    return len(files), sum(path.stat().st_size for path in files)


def clear_cache() -> tuple[int, int]:
    """Remove this package's cached kernels from the folders of :func:`cache_folders` this user may write to:
    (files removed, bytes)."""
    removed = size = 0
    for folder in cache_folders():
        if not os.access(folder, os.W_OK):
            continue
        for path in _cached_files(folder):
            size += path.stat().st_size
            path.unlink()
            removed += 1
    return removed, size


def _describe(folders: dict[Path, bool]) -> str:
    """One line per folder: where, written or read only, and what it holds."""
    lines = []
    for folder, writable in folders.items():
        files, size = cached_size(folder)
        if writable:
            role = "written and read"
        elif any(folders.values()):
            role = "also read (kernels cached beside the package)"
        else:
            role = "read only: kernels not cached here compile in memory"
        lines.append(f"{folder}: {role}; {files} files, {size / 1e6:.1f} MB")
    return "\n".join(lines)


@contextlib.contextmanager
def _large_plans():
    from ...cpu import tuning

    kept = {name: getattr(tuning, name) for name in _LARGE_PLANS}
    try:
        for name, value in _LARGE_PLANS.items():
            setattr(tuning, name, value)
        yield
    finally:
        for name, value in kept.items():
            setattr(tuning, name, value)


def _calls(dtype: str, mode: str, padding: str, align_corners: bool, layout: str, field: str):
    """The forward and backward calls that compile one combination's kernels."""
    import torch

    from ... import api

    generator = torch.Generator().manual_seed(0)
    dtype = getattr(torch, dtype)
    channels, sizes, out_sizes = 6, (4, 5, 6), (3, 4, 5)
    x = torch.randn(1, channels, *sizes, generator=generator).to(dtype)
    common = dict(interpolation_mode=mode, padding_mode=padding, align_corners=align_corners, data_format=layout)
    # Far outside the volume too: reflection's exact remainder is a kernel of its own.
    spread = 6.0 if padding == "reflection" else 1.2
    if layout == "NDHWC":
        x = x.permute(0, 2, 3, 4, 1).contiguous()
    if field == "grid":
        grid = ((torch.rand(1, *out_sizes, 3, generator=generator) * 2 - 1) * spread).to(dtype)
        grad = torch.randn(1, *out_sizes, channels, generator=generator).to(dtype)
        grad = grad if layout == "NDHWC" else grad.permute(0, 4, 1, 2, 3).contiguous()
        return lambda: (api.grid_sampler3d(x, grid, **common), api.grid_sampler3d_backward(grad, x, grid, **common))
    if field == "displacement":
        displacement = (torch.randn(1, 3, *sizes, generator=generator) * spread * 2).to(dtype)
        return lambda: (
            api.warp3d(x, displacement, **common),
            api.warp3d_backward(torch.ones_like(x), x, displacement, **common),
        )
    grad = torch.randn(1, *out_sizes, channels, generator=generator).to(dtype)
    grad = grad if layout == "NDHWC" else grad.permute(0, 4, 1, 2, 3).contiguous()
    if field == "bspline":
        control_points = (torch.randn(1, 3, 4, 5, 4, generator=generator) * spread * 2).to(dtype)
        return lambda: (
            api.bspline_warp3d(x, control_points, out_sizes, **common),
            api.bspline_warp3d_backward(grad, x, control_points, out_sizes, **common),
        )
    theta = (torch.eye(3, 4) * spread + 0.1 * torch.randn(1, 3, 4, generator=generator)).to(dtype)
    return lambda: (
        api.affine_warp3d(x, theta, out_sizes, **common),
        api.affine_warp3d_backward(grad, x, theta, out_sizes, **common),
    )


def _warmup(args: argparse.Namespace) -> int:
    if args.where or args.clear:
        folders = cache_folders()
        if not folders:
            print("no disk cache: the kernels compile in memory in each process (docs/runtime.md)")
        elif args.clear:
            removed, size = clear_cache()
            print(f"removed {removed} cached kernel files ({size / 1e6:.1f} MB)")
            print(_describe(folders))
        else:
            print(_describe(folders))
        return 0
    combinations = list(
        itertools.product(
            args.dtypes,
            args.modes,
            args.paddings,
            [value == "true" for value in args.align_corners],
            args.layouts,
            args.fields,
        )
    )
    start = time.perf_counter()
    with reporting_compiles(to_stderr) as report:  # one count over the whole warm-up
        for index, (dtype, mode, padding, align_corners, layout, field) in enumerate(combinations, start=1):
            name = f"{mode} {padding}{' align_corners' if align_corners else ''} {layout} {dtype} {field}"
            done = "#" * (20 * index // len(combinations))
            to_stderr(f"[{done:<20}] {index}/{len(combinations)} {name}")
            try:
                call = _calls(dtype, mode, padding, align_corners, layout, field)
            except ValueError as error:
                raise CliError(str(error)) from None
            call()
            with _large_plans():
                call()
    folders = cache_folders()
    print(
        f"warmed {len(combinations)} combinations: compiled {len(report.names)} kernels in "
        f"{time.perf_counter() - start:.1f} s"
    )
    print(_describe(folders) if folders else "kept nowhere: no cache folder here (docs/runtime.md, The kernel cache)")
    return 0
