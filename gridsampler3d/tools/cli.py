"""The ``gridsampler3d`` command line.

gridsampler3d run [--grad g.npy --input x.npy --grid grid.npy] [attributes] --out DIR
gridsampler3d cases --out DIR [--count K] [--seed S] [--dtypes float16,bfloat16,float32,float64]
gridsampler3d compare (--case DIR | --grad g.npy --input x.npy --grid grid.npy [attributes] [--dtype D])
    [--dx FILE] [--dgrid FILE] [--json PATH]
gridsampler3d demo [--size S] [--steps N] [--device cpu|cuda] [--seed K] [--out DIR]
gridsampler3d check [--device cpu|cuda] [--backends a,b] [--quick]
gridsampler3d bench [--cases ...] [--threads N[,M]] [--explain] [--json FILE] [--plot FILE] [--out FILE.md]
gridsampler3d backends
"""

from __future__ import annotations

import argparse
import sys

from .commands import COMMANDS
from .commands.arguments import CliError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser: one subcommand per module of :mod:`gridsampler3d.commands`."""
    parser = argparse.ArgumentParser(prog="gridsampler3d", description="3-D grid sampling and its backward.")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_command(commands)
    return parser


def main(argv=None) -> int:
    """Entry point of the ``gridsampler3d`` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.command_line = " ".join(["gridsampler3d", *argv])  # as the user wrote it, for generated files
    try:
        return args.handler(args)
    except CliError as error:
        print(f"gridsampler3d {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
