"""The ``bench`` command: the benchmark suite (:mod:`gridsampler3d.tools.bench`) against PyTorch, as tables and files
(JSON, a plot). ``benchmarks/publish.py`` writes the project's BENCHMARKS.md and README table from a run."""

from __future__ import annotations

import argparse

from ...cpu.compile_report import reporting_compiles
from .arguments import CliError, at_least, positive_float, require_device, to_stderr

__all__ = ["add_command", "thread_counts"]


def add_command(commands) -> None:
    """Add ``bench`` to the command line's subcommands."""
    bench = commands.add_parser("bench", help="time forward and backward against PyTorch (the benchmark suite)")
    bench.add_argument("--cases", help="comma-separated case names (default: all)")
    bench.add_argument(
        "--threads", help="threads for both libraries, or several counts in turn (1,2); default: torch's setting"
    )
    bench.add_argument("--repeats", type=at_least(1), default=7, help="timed runs per measurement (median; default 7)")
    bench.add_argument("--device", default="cpu", help="cpu or cuda")
    bench.add_argument("--backend", default="auto", help="our backend to time (default auto)")
    bench.add_argument("--scale", type=positive_float, default=1.0, help="multiply every case's edge sizes by this")
    bench.add_argument("--json", help="write the machine-readable report here")
    bench.add_argument("--plot", help="write a PNG bar chart of the ratios here")
    bench.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    bench.add_argument(
        "--explain",
        action="store_true",
        help="print each case's plan (the CPU engine's strategy and its parameters) under its times",
    )
    bench.set_defaults(handler=_bench)


def thread_counts(value: str | None) -> list:
    """``--threads``: None (torch's setting), or one count or several ("1,2"), each at least 1."""
    if value is None:
        return [None]
    try:
        counts = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise CliError(f"--threads takes a count or counts separated by commas (1,2); got {value!r}") from None
    if not counts or min(counts) < 1:
        raise CliError(f"--threads must be at least 1; got {value!r}")
    return counts


def _bench(args: argparse.Namespace) -> int:
    from .. import bench

    counts = thread_counts(args.threads)
    require_device(args.device)
    reports = []
    with reporting_compiles(to_stderr) as compiles:
        for threads in counts:
            try:
                reports.append(
                    bench.run_suite(
                        args.cases,
                        device=args.device,
                        backend=args.backend,
                        repeats=args.repeats,
                        threads=threads,
                        scale=args.scale,
                        explain=args.explain,
                    )
                )
            except (ValueError, RuntimeError) as error:
                raise CliError(str(error)) from None
    print(f"{compiles.summary()}: in the warm-up calls, which no time above includes")
    if args.json:
        bench.write_json(reports[0] if len(reports) == 1 else {"reports": reports}, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        bench.write_plot(reports[-1], args.plot)
        print(f"wrote {args.plot}")
    if args.markdown:
        for report in reports:
            print()
            print(bench.format_table(report))
    return 0
