"""The verdict on another implementation's dx and dgrid for one case (the ``compare`` command).

Each output given is shaped like x (dx, in the case's data format) or like the grid (dgrid),
in the case's dtype. The precision rule of :mod:`gridsampler3d.precision` judges it: its
MARE, MERE and RMSE against the float64 golden may be at most (2, 1.2, 1.2) times the
competitor's (or the dtype's floor, if larger), and its non-finite entries must sit exactly
where the golden rounded to the dtype has them.
"""
from __future__ import annotations

import torch

from . import precision
from .golden_kit import Case, dtype_name
from .rounding import HALF_DTYPES

__all__ = ["OUTPUTS", "judge", "passed", "format_report", "to_json"]

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
    return {name: precision.compare(name, given[name], gold, theirs, case.dtype)
            for name, gold, theirs in zip(OUTPUTS, golden, competitor) if given[name] is not None}


def passed(reports: dict) -> bool:
    """Whether every output judged passes."""
    return all(report.passed for report in reports.values())


def _rows(reports: dict) -> list[tuple[str, ...]]:
    """The table's rows: per output, MARE, MERE, RMSE and the count of misplaced non-finite entries."""
    rows = []
    for name, report in reports.items():
        for metric, within, limit in zip(METRICS, report.within, report.limits):
            rows.append((name, metric.upper(), f"{getattr(report.ours, metric):.4g}",
                         f"{getattr(report.competitor, metric):.4g}", f"{limit:.4g}", "pass" if within else "FAIL"))
        misplaced, competitor_misplaced = report.ours.nonfinite_mismatches, report.competitor.nonfinite_mismatches
        rows.append((name, "non-finite", f"{misplaced} misplaced", f"{competitor_misplaced} misplaced", "0 misplaced",
                     "pass" if misplaced == 0 else "FAIL"))
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
    lines = [f"case: {dtype_name(case.dtype)} {case.data_format} interpolation_mode={case.interpolation_mode} "
             f"padding_mode={case.padding_mode} align_corners={case.align_corners}; x {tuple(case.input.shape)}, "
             f"grid {tuple(case.grid.shape)}",
             _sources(case)]
    rows = [HEADER, *_rows(reports)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(HEADER))]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    ratios = ", ".join(f"{metric.upper()} {ratio:g}" for metric, ratio in zip(METRICS, precision.RATIOS))
    lines.append(f"limit: ({ratios}) times max(the competitor's, the {dtype_name(case.dtype)} floor {floor:g}); "
                 f"non-finite entries must sit where the golden rounded to {dtype_name(case.dtype)} has them")
    failed = [f"{row[0]} {row[1]}" for row in rows[1:] if row[5] == "FAIL"]
    lines.append("verdict: PASS" if not failed else f"verdict: FAIL ({', '.join(failed)})")
    return "\n".join(lines)


def _metrics(metrics: precision.Metrics) -> dict:
    return {"mare": metrics.mare, "mere": metrics.mere, "rmse": metrics.rmse,
            "nonfinite_mismatches": metrics.nonfinite_mismatches}


def to_json(reports: dict) -> dict:
    """``{"verdict": "pass" | "fail", "outputs": {name: its metrics, the competitor's, the limits, "pass"}}``."""
    outputs = {}
    for name, report in reports.items():
        limits = dict(zip(METRICS, report.limits), nonfinite_mismatches=0)
        outputs[name] = {**_metrics(report.ours), "competitor": _metrics(report.competitor), "limits": limits,
                         "pass": report.passed}
    return {"verdict": "pass" if passed(reports) else "fail", "outputs": outputs}
