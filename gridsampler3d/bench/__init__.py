"""The benchmark suite (registry in ``suite``, timing in ``runner``; benchmarks/README.md)."""
from .runner import format_table, run_suite, write_json, write_plot
from .suite import SUITE, BenchCase, select_cases

__all__ = ["SUITE", "BenchCase", "select_cases", "run_suite", "format_table", "write_json", "write_plot"]
