"""The ``run`` command: dx and dgrid of .npy files, or of the built-in case, written as .npy with a summary."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from ...cpu.compile_report import reporting_compiles
from .arguments import CliError, add_attributes, at_least, load_array, mode_value, to_stderr

__all__ = ["add_command"]


def add_command(commands) -> None:
    """Add ``run`` to the command line's subcommands."""
    run = commands.add_parser("run", help="compute dx and dgrid from .npy files (or the built-in case)")
    run.add_argument("--grad", help="dL/dy, .npy (N, C, Do, Ho, Wo) or (N, Do, Ho, Wo, C)")
    run.add_argument("--input", help="the volume x, .npy (N, C, Di, Hi, Wi) or (N, Di, Hi, Wi, C)")
    run.add_argument("--grid", help="the sampling grid, .npy (N, Do, Ho, Wo, 3)")
    run.add_argument("--size", type=at_least(4), default=64, help="edge of the built-in case's volume (default 64)")
    add_attributes(run)
    run.add_argument("--out", default="out/run", help="folder for dx.npy and dgrid.npy (default out/run)")
    run.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from ... import api
    from ...call import parse_options
    from .. import inputs

    given = {name: getattr(args, name) for name in ("grad", "input", "grid")}
    if any(given.values()) and not all(given.values()):
        missing = ", ".join(f"--{name}" for name, path in given.items() if not path)
        raise CliError(f"--grad, --input and --grid go together; missing {missing}")
    try:  # the attributes first: a bad one is said before anything is read, built or written
        parse_options(
            mode_value(args.interpolation_mode),
            mode_value(args.padding_mode),
            args.align_corners,
            data_format=args.data_format,
            backend=args.backend,
        )
    except (TypeError, ValueError) as error:
        raise CliError(str(error)) from None
    out = Path(args.out)
    if not _creatable(out):
        raise CliError(f"--out: cannot make the folder {out}")

    # The first calls compile the kernels a mode needs, once (or load them from the disk
    # cache), said as they do; a second backward times the backward itself.
    with reporting_compiles(to_stderr) as compiles:
        if all(given.values()):
            arrays = {name: load_array(path, name) for name, path in given.items()}
            source = "files"
        else:
            to_stderr(f"building the built-in {args.size}³ case")
            arrays = inputs.default_case(size=args.size)
            source = f"built-in default case: {args.size}³ phantom, smooth random warp, MSE gradient"
        to_stderr("computing dx and dgrid")
        first = _timed_backward(api, arrays, args)
    elapsed, (dx, dgrid) = _timed_backward(api, arrays, args)

    try:
        out.mkdir(parents=True, exist_ok=True)
        np.save(out / "dx.npy", dx)
        np.save(out / "dgrid.npy", dgrid)
    except OSError as error:
        raise CliError(f"--out: cannot write to {out} ({error})") from None

    print(f"input:  {source}")
    for name in ("grad", "input", "grid"):
        print(f"  {name:<6} {str(arrays[name].shape):<26} {arrays[name].dtype}")
    print(
        f"attributes: interpolation_mode={args.interpolation_mode} padding_mode={args.padding_mode} "
        f"align_corners={args.align_corners} data_format={args.data_format} backend={args.backend}"
    )
    print(f"first call: {first[0] * 1e3:.1f} ms; {compiles.summary()}")
    print(f"backward: {elapsed * 1e3:.1f} ms (a second call: the backward's own time)")
    for name, array in (("dx", dx), ("dgrid", dgrid)):
        values = array.astype(np.float64)
        finite = np.isfinite(values)
        norm = np.linalg.norm(values[finite]) if finite.any() else 0.0
        print(
            f"  {name:<6} {str(array.shape):<26} {array.dtype}  L2 {norm:.6g}  max|.| "
            f"{np.abs(values[finite]).max() if finite.any() else 0.0:.6g}  non-finite {int((~finite).sum())}"
            f"  -> {out / (name + '.npy')}"
        )
    return 0


def _creatable(folder: Path) -> bool:
    """Whether ``folder`` exists or its nearest existing parent is a folder this user may write to."""
    for parent in (folder, *folder.absolute().parents):
        if parent.exists():
            return parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)
    return False


def _timed_backward(api, arrays: dict, args: argparse.Namespace) -> tuple[float, tuple]:
    """(seconds, (dx, dgrid)) of one backward call on ``arrays`` with the command's attributes."""
    start = time.perf_counter()
    try:
        result = api.grid_sampler3d_backward(
            arrays["grad"],
            arrays["input"],
            arrays["grid"],
            interpolation_mode=mode_value(args.interpolation_mode),
            padding_mode=mode_value(args.padding_mode),
            align_corners=args.align_corners,
            data_format=args.data_format,
            backend=args.backend,
        )
    except (TypeError, ValueError, RuntimeError, NotImplementedError) as error:
        raise CliError(str(error)) from None
    return time.perf_counter() - start, result
