"""The ``compare`` command: the verdict on another implementation's dx and dgrid for one case.

Each output given is shaped like x (dx, in the case's data format) or like the grid (dgrid),
in the case's dtype. The precision rule of :mod:`gridsampler3d.precision` judges it: its
MARE, MERE and RMSE against the float64 golden may be at most (2, 1.2, 1.2) times the
competitor's (or the dtype's floor, if larger), and its non-finite entries must sit exactly
where the golden rounded to the dtype has them.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

from ... import precision
from ...dtypes import DTYPES, HALF_DTYPES
from .. import golden_kit
from ..golden_kit import Case, dtype_name
from .arguments import CliError, add_attributes, mode_value

__all__ = ["OUTPUTS", "add_command", "judge", "passed", "format_report", "read_output", "to_json"]

OUTPUTS = ("dx", "dgrid")
METRICS = ("mare", "mere", "rmse")
HEADER = ("output", "metric", "theirs", "competitor", "limit", "verdict")


def judge(case: Case, *, dx: torch.Tensor | None = None, dgrid: torch.Tensor | None = None):
    """The precision rule's report per output given: ``{"dx": Report, "dgrid": Report}``.

    ``dx`` is shaped like ``case.input`` and ``dgrid`` like ``case.grid``, both in
    ``case.dtype``; either may be None (not judged), not both.
    """
    given = {"dx": dx, "dgrid": dgrid}
    output_mask = (dx is not None, dgrid is not None)
    if not any(output_mask):
        raise ValueError("nothing to judge: give dx, dgrid or both")
    operands = (case.grad, case.input, case.grid)
    golden = precision.golden_backward(*operands, output_mask=output_mask, **case.attributes())
    competitor = precision.competitor_backward(*operands, output_mask=output_mask, **case.attributes())
    return {
        name: precision.compare(name, given[name], gold, theirs, case.dtype)
        for name, gold, theirs in zip(OUTPUTS, golden, competitor)
        if given[name] is not None
    }


def passed(reports: dict) -> bool:
    """Whether every output judged passes."""
    return all(report.passed for report in reports.values())


def _rows(reports: dict) -> list[tuple[str, ...]]:
    """The table's rows: per output, MARE, MERE, RMSE and the count of misplaced non-finite entries."""
    rows = []
    for name, report in reports.items():
        for metric, within, limit in zip(METRICS, report.within, report.limits):
            rows.append(
                (
                    name,
                    metric.upper(),
                    f"{getattr(report.ours, metric):.4g}",
                    f"{getattr(report.competitor, metric):.4g}",
                    f"{limit:.4g}",
                    "pass" if within else "FAIL",
                )
            )
        misplaced, competitor_misplaced = report.ours.nonfinite_mismatches, report.competitor.nonfinite_mismatches
        rows.append(
            (
                name,
                "non-finite",
                f"{misplaced} misplaced",
                f"{competitor_misplaced} misplaced",
                "0 misplaced",
                "pass" if misplaced == 0 else "FAIL",
            )
        )
    return rows


def _sources(case: Case) -> str:
    """What the golden and the competitor are for this case."""
    name = dtype_name(case.dtype)
    if case.interpolation_mode == "bicubic":
        golden = "this library's float64 reference (PyTorch has no 3-D bicubic)"
        competitor = "the differentiable torch composite"
    else:
        golden, competitor = "PyTorch CPU in float64 on the upcast inputs", "PyTorch CPU"
    if case.dtype in HALF_DTYPES:
        competitor += f" in float32 on the upcast inputs, rounded to {name}"
    else:
        competitor += f" in {name}"
    return f"golden: {golden}; competitor: {competitor}"


def format_report(case: Case, reports: dict) -> str:
    """The case, one table (output, metric, theirs, competitor, limit, verdict) and the verdict."""
    floor = precision.FLOORS[case.dtype]
    lines = [
        f"case: {dtype_name(case.dtype)} {case.data_format} interpolation_mode={case.interpolation_mode} "
        f"padding_mode={case.padding_mode} align_corners={case.align_corners}; x {tuple(case.input.shape)}, "
        f"grid {tuple(case.grid.shape)}",
        _sources(case),
    ]
    rows = [HEADER, *_rows(reports)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(HEADER))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    ratios = ", ".join(f"{metric.upper()} {ratio:g}" for metric, ratio in zip(METRICS, precision.RATIOS))
    lines.append(
        f"limit: ({ratios}) times max(the competitor's, the {dtype_name(case.dtype)} floor {floor:g}); "
        f"non-finite entries must sit where the golden rounded to {dtype_name(case.dtype)} has them"
    )
    failed = [f"{row[0]} {row[1]}" for row in rows[1:] if row[5] == "FAIL"]
    lines.append("verdict: PASS" if not failed else f"verdict: FAIL ({', '.join(failed)})")
    return "\n".join(lines)


def _metrics(metrics: precision.Metrics) -> dict:
    return {
        "mare": metrics.mare,
        "mere": metrics.mere,
        "rmse": metrics.rmse,
        "nonfinite_mismatches": metrics.nonfinite_mismatches,
    }


def to_json(reports: dict) -> dict:
    """``{"verdict": "pass" | "fail", "outputs": {name: its metrics, the competitor's, the limits, "pass"}}``."""
    outputs = {}
    for name, report in reports.items():
        limits = dict(zip(METRICS, report.limits), nonfinite_mismatches=0)
        outputs[name] = {
            **_metrics(report.ours),
            "competitor": _metrics(report.competitor),
            "limits": limits,
            "pass": report.passed,
        }
    return {"verdict": "pass" if passed(reports) else "fail", "outputs": outputs}


def add_command(commands) -> None:
    """Add ``compare`` to the command line's subcommands."""
    compare = commands.add_parser(
        "compare",
        help="judge another implementation's dx and dgrid by the precision rule: exit 0 pass, 1 fail, 2 unusable input",
        description=(
            "Judge dx and dgrid against the float64 golden: MARE, MERE and RMSE at most 2, 1.2 and "
            "1.2 times the competitor's (PyTorch CPU in the same dtype; for bicubic, this library's torch "
            "composite) or the dtype's floor, and non-finite values where the golden's are. The case comes "
            "from --case, or from --grad, --input and --grid (.npy) with the attribute flags. "
            "Exit 0: every output given passes; 1: one fails; 2: unusable input."
        ),
    )
    compare.add_argument(
        "--case", metavar="DIR", help="a case folder written by `gridsampler3d cases` (inputs, attributes, dtype)"
    )
    compare.add_argument("--grad", help="instead of --case: dL/dy, .npy (N, C, Do, Ho, Wo) or (N, Do, Ho, Wo, C)")
    compare.add_argument("--input", help="instead of --case: x, .npy (N, C, Di, Hi, Wi) or (N, Di, Hi, Wi, C)")
    compare.add_argument("--grid", help="instead of --case: the grid, .npy (N, Do, Ho, Wo, 3)")
    add_attributes(compare, defaults=False, backend=False)
    compare.add_argument(
        "--dtype",
        metavar="DTYPE",
        help="without --case: float16, bfloat16, float32 or float64 (default: the "
        "--input file's); .npy inputs of another dtype must hold its values exactly",
    )
    compare.add_argument(
        "--dx",
        metavar="FILE",
        help="dx to judge, shaped like x: .npy in the case's dtype or a wider float (rounded to it), or raw "
        "little-endian .bin in the case's dtype",
    )
    compare.add_argument("--dgrid", metavar="FILE", help="dgrid to judge, shaped like the grid: .npy or .bin, as --dx")
    compare.add_argument("--json", metavar="PATH", help="also write the verdict and the metrics here as JSON")
    compare.set_defaults(handler=_compare)


def _compare_case(args: argparse.Namespace):
    """The case to judge: a case folder, or three .npy files with the attribute flags."""
    inputs = {"--grad": args.grad, "--input": args.input, "--grid": args.grid}
    attributes = {
        "--interpolation-mode": args.interpolation_mode,
        "--padding-mode": args.padding_mode,
        "--align-corners": args.align_corners,
        "--data-format": args.data_format,
        "--dtype": args.dtype,
    }
    if args.case is not None:
        clashing = [flag for flag, value in {**inputs, **attributes}.items() if value is not None]
        if clashing:
            raise CliError(f"--case gives the inputs, the attributes and the dtype; drop {', '.join(clashing)}")
        return golden_kit.read_case(args.case)
    missing = [flag for flag, path in inputs.items() if path is None]
    if missing:
        raise CliError(f"give --case, or --grad, --input and --grid; missing {', '.join(missing)}")
    if args.dtype is not None and args.dtype not in DTYPES:
        raise CliError(f"--dtype must be one of {', '.join(DTYPES)}; got {args.dtype!r}")
    return golden_kit.case_from_npy(
        args.grad,
        args.input,
        args.grid,
        dtype=DTYPES.get(args.dtype),
        interpolation_mode=mode_value(args.interpolation_mode or "bilinear"),
        padding_mode=mode_value(args.padding_mode or "zeros"),
        align_corners=bool(args.align_corners),
        data_format=args.data_format or "NCDHW",
    )


def read_output(path: str, name: str, case: Case) -> tuple[torch.Tensor, str | None]:
    """The output ``name`` (dx or dgrid) to judge from ``path``, in ``case.dtype``, and a note where it was rounded.

    A ``.npy`` file may hold a wider float than the case (float64 or float32 for a 16-bit
    case, float64 for float32: the case's own golden, an implementation that keeps a wider
    result): it is rounded to the case's dtype, to nearest even, before it is judged.
    """
    label, like = f"--{name}", {"dx": case.input, "dgrid": case.grid}[name]
    if Path(path).suffix == ".bin":
        return golden_kit.read_array(path, label=label, dtype=case.dtype, shape=like.shape), None
    tensor = golden_kit.read_array(path, label=label, shape=like.shape)
    if tensor.dtype == case.dtype:
        return tensor, None
    given, wanted = dtype_name(tensor.dtype), dtype_name(case.dtype)
    if torch.finfo(tensor.dtype).bits <= torch.finfo(case.dtype).bits:
        hint = "; .npy cannot hold bfloat16: write float32, or raw little-endian .bin" if wanted == "bfloat16" else ""
        wider = "" if case.dtype == torch.float64 else " or a wider float"
        raise CliError(f"{label}: {path} holds {given}; expected {wanted}{wider}{hint}")
    return tensor.to(case.dtype), f"{label}: {path} holds {given}, rounded to {wanted} (the case's dtype) to be judged"


def _compare(args: argparse.Namespace) -> int:
    if args.dx is None and args.dgrid is None:
        raise CliError("nothing to judge: give --dx, --dgrid or both")
    try:
        case = _compare_case(args)
        outputs, notes = {}, []
        for name, path in (("dx", args.dx), ("dgrid", args.dgrid)):
            if path is not None:
                outputs[name], note = read_output(path, name, case)
                notes += [note] if note else []
        reports = judge(case, **outputs)
    except (TypeError, ValueError, RuntimeError) as error:
        # The library's hint names its keyword; here it is a flag.
        raise CliError(re.sub(r"data_format='(\w+)'", r"--data-format \1", str(error))) from None
    print("\n".join(notes + [format_report(case, reports)]))
    if args.json:
        try:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(to_json(reports), indent=2) + "\n")
        except OSError as error:
            raise CliError(f"--json: cannot write {args.json} ({error})") from None
    return 0 if passed(reports) else 1
