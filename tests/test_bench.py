"""The benchmark runner's summary statistics (the timed suite itself runs through `gridsampler3d bench`)."""
import math

import pytest

from gridsampler3d.bench.runner import _geomean


def test_geometric_mean_of_ratios():
    assert _geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert _geomean(iter([0.5, 2.0, 1.0])) == pytest.approx(1.0)  # a generator, as the runner passes
    assert math.isnan(_geomean([]))


def test_warp_step_case_runs_and_reports_memory():
    """warp128 at a tiny scale: forward, backward and step timed against PyTorch's plumbing, peak memory read."""
    from gridsampler3d.bench.runner import format_step, format_table, run_suite

    lines = []
    report = run_suite("warp128", repeats=1, scale=0.1, echo=lines.append)
    (result,) = report["results"]
    for stage in ("forward", "backward", "step"):
        assert result[stage]["ratio"] > 0 and result[stage]["ours"]["median_s"] > 0
    assert set(result["step"]["peak_bytes"]) == {"torch", "ours"}
    assert any(line.startswith("warp128 step") for line in lines) and format_step(result) in lines
    assert "| warp128 |" in format_table(report) and math.isnan(report["summary"]["backward"]["geomean_ratio"])


def test_explain_prints_each_cases_plans_under_its_times():
    """``bench --explain``: each case's forward and backward plan, as gridsampler3d.explain gives it."""
    from gridsampler3d.bench.runner import run_suite

    lines = []
    report = run_suite("odd,down4cl,warp128", repeats=1, scale=0.2, echo=lines.append, explain=True)
    for result in report["results"]:
        plans = result["plan"]
        assert plans["forward"].startswith("forward ") and plans["backward"].startswith("backward ")
        assert f"    forward plan: {plans['forward']}" in lines and f"    backward plan: {plans['backward']}" in lines
    assert [result["case"]["name"] for result in report["results"]] == ["odd", "down4cl", "warp128"]
