"""The benchmark suite (registry in ``suite``, timing in ``runner``; benchmarks/README.md): the operator's cases,
the shapes users bring, the warp step and tricubic sampling, each timed against PyTorch in the same process.
``benchmarks/publish.py`` writes BENCHMARKS.md and the README's speed table from a run."""

from .runner import format_table, run_suite, write_json, write_plot
from .suite import SUITE, BenchCase, select_cases

__all__ = [
    "SUITE",
    "BenchCase",
    "select_cases",
    "run_suite",
    "format_table",
    "write_json",
    "write_plot",
]
