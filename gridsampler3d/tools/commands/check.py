"""The ``check`` command: verify the installed library against PyTorch on this machine.

For every backend that runs on the chosen device, and every combination of interpolation
mode, padding mode, align_corners, dtype and layout, it runs the forward and the backward
on small seeded random inputs and applies the precision rule (``gridsampler3d.precision``)
to y, dx and dgrid against PyTorch's float64 golden and its same-dtype result. (Bicubic,
which PyTorch lacks in 3-D, is judged against the float64 reference and the torch
composite in the same dtype; see ``gridsampler3d.precision``.) The Triton backend is
checked in both backward modes, fast (atomics) and deterministic, as ``triton/fast`` and
``triton/det``.
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

from ... import api, precision
from ...backends import BACKENDS
from ...cpu.compile_report import reporting_compiles
from ...dtypes import DTYPES
from .arguments import CliError, require_device, to_stderr

__all__ = ["add_command", "run_check", "format_row", "HEADER"]

MODES = ("bilinear", "nearest", "bicubic")
PADDINGS = ("zeros", "border", "reflection")
ALIGN_CORNERS = (False, True)
QUICK_DTYPES = ("float32", "float64")
LAYOUTS = ("NCDHW", "NDHWC")
OUTPUTS = ("y", "dx", "dgrid")

# Small odd sizes, a grid reaching past the volume so that every padding rule is exercised.
BATCH, CHANNELS, INPUT_SIZE, OUTPUT_SIZE, GRID_BOUND = 2, 3, (5, 6, 7), (4, 5, 3), 1.2

HEADER = (
    f"{'backend':<11} {'mode':<9} {'padding':<11} {'align':<6} {'dtype':<8} {'layout':<6} "
    f"{'y':>7} {'dx':>7} {'dgrid':>7}  result"
)


def _backend_names(device: torch.device, requested) -> list[str]:
    """The backends to check: those asked for, or every one that runs on ``device``."""
    runs_here = [
        name for name, backend in BACKENDS.items() if backend.unavailable_reason() is None and backend.supports(device)
    ]
    if requested is None:
        if not runs_here:
            raise RuntimeError(f"no backend runs on device {device} here")
        return runs_here
    names = []
    for name in requested:
        if name not in BACKENDS:
            known = ", ".join(BACKENDS)
            raise ValueError(f"unknown backend {name!r}; known: {known}")
        reason = BACKENDS[name].unavailable_reason()
        if reason is not None:
            raise RuntimeError(f"backend {name!r} is not available: {reason}")
        if not BACKENDS[name].supports(device):
            raise RuntimeError(f"backend {name!r} does not run on device {device}")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError("no backend given")
    return names


def _random_case(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 (grad, x, grid): (N, C, Do, Ho, Wo), (N, C, Di, Hi, Wi), (N, Do, Ho, Wo, 3)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn((BATCH, CHANNELS) + INPUT_SIZE, generator=generator, dtype=torch.float64)
    grad = torch.randn((BATCH, CHANNELS) + OUTPUT_SIZE, generator=generator, dtype=torch.float64)
    unit = torch.rand((BATCH,) + OUTPUT_SIZE + (3,), generator=generator, dtype=torch.float64)
    return grad, x, GRID_BOUND * (2 * unit - 1)


def _in_layout(grad, x, grid, dtype, layout):
    """The case rounded to ``dtype``, grad and x in ``layout`` (contiguous)."""
    if layout == "NDHWC":
        grad, x = grad.permute(0, 2, 3, 4, 1).contiguous(), x.permute(0, 2, 3, 4, 1).contiguous()
    return grad.to(dtype), x.to(dtype), grid.to(dtype)


def _expected(grad, x, grid, mode, padding, align_corners, layout) -> dict:
    """Golden and competitor per output (CPU tensors, in ``layout``)."""
    attributes = (mode, padding, align_corners)
    golden_dx, golden_dgrid = precision.golden_backward(grad, x, grid, *attributes, data_format=layout)
    competitor_dx, competitor_dgrid = precision.competitor_backward(grad, x, grid, *attributes, data_format=layout)
    return {
        "y": (
            precision.golden_forward(x, grid, *attributes, layout),
            precision.competitor_forward(x, grid, *attributes, layout),
        ),
        "dx": (golden_dx, competitor_dx),
        "dgrid": (golden_dgrid, competitor_dgrid),
    }


def _variants(names: list[str]) -> list[tuple[str, str, bool | None]]:
    """(label, backend, deterministic) per backend: Triton's backward in both modes, the others as they are."""
    variants = []
    for name in names:
        if name == "triton":
            variants += [("triton/fast", name, False), ("triton/det", name, True)]
        else:
            variants.append((name, name, None))
    return variants


def _ours(backend, device, grad, x, grid, mode, padding, align_corners, layout, deterministic=None) -> dict:
    grad, x, grid = grad.to(device), x.to(device), grid.to(device)
    y = api.grid_sampler3d(x, grid, mode, padding, align_corners, data_format=layout, backend=backend)
    dx, dgrid = api.grid_sampler3d_backward(
        grad, x, grid, mode, padding, align_corners, data_format=layout, backend=backend, deterministic=deterministic
    )
    return {"y": y, "dx": dx, "dgrid": dgrid}


def _judge(ours: dict, expected: dict, dtype: torch.dtype, device: torch.device) -> tuple[dict, list[str]]:
    """Worst ratio per output and the reasons for failing (none when all pass)."""
    worst, failures = {}, []
    for name in OUTPUTS:
        output, (golden, competitor) = ours[name], expected[name]
        if output is None:
            failures.append(f"{name}: not computed")
            continue
        wrong_place = output.device.type != device.type
        if tuple(output.shape) != tuple(golden.shape) or output.dtype != dtype or wrong_place:
            failures.append(
                f"{name}: got {tuple(output.shape)} {output.dtype} on {output.device}, expected "
                f"{tuple(golden.shape)} {dtype} on {device}"
            )
            continue
        report = precision.compare(name, output, golden, competitor, dtype)
        worst[name] = max(report.ratios)
        if not report.passed:
            failures.append(str(report).replace("\n", ";"))
    return worst, failures


def format_row(row: dict) -> str:
    """One line of the table; a failing output's ratio carries a '*'."""
    failed = {failure.split(":", 1)[0] for failure in row["failures"]}
    cells = []
    for name in OUTPUTS:
        ratio = row["worst_ratio"].get(name)
        cell = "-" if ratio is None else f"{ratio:.3f}"
        cells.append(f"{cell + ('*' if name in failed else ''):>7}")
    result = "PASS" if row["passed"] else "FAIL"
    if row["error"]:
        result += f"  {row['error']}"
    return (
        f"{row['backend']:<11} {row['mode']:<9} {row['padding']:<11} {str(row['align_corners']):<6} "
        f"{row['dtype']:<8} {row['layout']:<6} {' '.join(cells)}  {result}"
    )


def run_check(device: str = "cpu", backends=None, quick: bool = False, echo=print) -> list[dict]:
    """Check every (backend, mode, padding, align_corners, dtype, layout) case; print a table.

    Args:
        device: "cpu" or "cuda" (any torch device string); the golden always runs on the CPU.
        backends: names to check; None checks every backend that runs on ``device``.
        quick: float32 and float64 only.
        echo: called with each line of the table and the summary.

    Returns:
        One dict per case: the case's attributes, ``worst_ratio`` ({output: the largest of
        its MARE/MERE/RMSE ratios}), ``failures`` (messages), ``error`` (an exception's
        message, or None) and ``passed``.
    """
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {device}: no CUDA device is available here")
    names = _backend_names(device, backends)
    dtype_names = QUICK_DTYPES if quick else tuple(DTYPES)
    cases = list(itertools.product(MODES, PADDINGS, ALIGN_CORNERS, dtype_names, LAYOUTS))
    start = time.perf_counter()
    grad64, x64, grid64 = _random_case()
    inputs, expected = {}, {}
    for mode, padding, align_corners, dtype_name, layout in cases:
        operands = _in_layout(grad64, x64, grid64, DTYPES[dtype_name], layout)
        inputs[dtype_name, layout] = operands
        expected[mode, padding, align_corners, dtype_name, layout] = _expected(
            *operands, mode, padding, align_corners, layout
        )

    echo(HEADER)
    rows = []
    total = len(cases) * len(_variants(names))

    def compiling(line: str) -> None:  # the compile messages, with how far the check has come
        to_stderr(f"[case {len(rows) + 1}/{total}] {line}")

    with reporting_compiles(compiling) as compiles:
        _check_cases(names, cases, (device, inputs, expected), rows, echo)

    failed = [row for row in rows if not row["passed"]]
    limits = ", ".join(f"{metric} {limit:g}" for metric, limit in zip(("MARE", "MERE", "RMSE"), precision.RATIOS))
    echo(
        f"ratios: ours / PyTorch's error in the same dtype, worst of MARE, MERE, RMSE (limits {limits}); "
        "* marks a failing output"
    )
    for row in failed:
        for failure in row["failures"]:
            echo(
                f"FAIL {row['backend']} {row['mode']} {row['padding']} align_corners={row['align_corners']} "
                f"{row['dtype']} {row['layout']}: {failure}"
            )
    echo(
        f"{'FAILED' if failed else 'PASSED'}: {len(rows) - len(failed)}/{len(rows)} cases passed on {device} "
        f"(backends: {', '.join(names)}; dtypes: {', '.join(dtype_names)}) in {time.perf_counter() - start:.1f} s; "
        f"{compiles.summary()}"
    )
    return rows


def _check_cases(names, cases, data: tuple, rows: list, echo) -> None:
    """Run and judge every case with every backend variant, appending a row per case to ``rows`` and echoing it;
    ``data`` is (device, the inputs by (dtype, layout), the expected outputs by case)."""
    device, inputs, expected = data
    for label, name, deterministic in _variants(names):
        for mode, padding, align_corners, dtype_name, layout in cases:
            row = {
                "backend": label,
                "device": str(device),
                "mode": mode,
                "padding": padding,
                "align_corners": align_corners,
                "dtype": dtype_name,
                "layout": layout,
                "worst_ratio": {},
                "failures": [],
                "error": None,
            }
            try:
                ours = _ours(
                    name, device, *inputs[dtype_name, layout], mode, padding, align_corners, layout, deterministic
                )
                row["worst_ratio"], row["failures"] = _judge(
                    ours, expected[mode, padding, align_corners, dtype_name, layout], DTYPES[dtype_name], device
                )
            except Exception as error:  # a crash fails this case; the others still run
                row["error"] = f"{type(error).__name__}: {error}".splitlines()[0]
            row["passed"] = row["error"] is None and not row["failures"]
            rows.append(row)
            echo(f"{format_row(row)}  {len(rows)}/{len(cases) * len(_variants(names))}")


def add_command(commands) -> None:
    """Add ``check`` to the command line's subcommands."""
    check = commands.add_parser("check", help="verify every backend against PyTorch across the mode matrix")
    check.add_argument("--device", default="cpu", help="cpu or cuda")
    check.add_argument("--backends", help="comma-separated backend names (default: all that run on the device)")
    check.add_argument("--quick", action="store_true", help="float32 and float64 only")
    check.set_defaults(handler=_check)


def _check(args: argparse.Namespace) -> int:
    require_device(args.device)
    names = None if args.backends is None else [name.strip() for name in args.backends.split(",") if name.strip()]
    try:
        rows = run_check(device=args.device, backends=names, quick=args.quick)
    except (ValueError, RuntimeError) as error:
        raise CliError(str(error)) from None
    return 0 if all(row["passed"] for row in rows) else 1
