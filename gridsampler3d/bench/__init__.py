"""The benchmark suite (registry in ``suite``, timing in ``runner``; benchmarks/README.md): the operator's cases,
the shapes users bring, the warp step and tricubic sampling, each timed against PyTorch in the same process."""

from .runner import (
    format_document,
    format_readme_table,
    format_table,
    read_document,
    replace_readme_table,
    run_suite,
    write_json,
    write_plot,
)
from .suite import SUITE, BenchCase, select_cases

__all__ = [
    "SUITE",
    "BenchCase",
    "select_cases",
    "run_suite",
    "format_table",
    "format_document",
    "read_document",
    "format_readme_table",
    "replace_readme_table",
    "write_json",
    "write_plot",
]
