"""The ``gridsampler3d`` command line.

gridsampler3d run [--grad g.npy --input x.npy --grid grid.npy] [attributes] --out DIR
gridsampler3d cases --out DIR [--count K] [--seed S] [--dtypes float16,bfloat16,float32,float64]
gridsampler3d compare (--case DIR | --grad g.npy --input x.npy --grid grid.npy [attributes] [--dtype D])
    [--dx FILE] [--dgrid FILE] [--json PATH]
gridsampler3d demo [--size S] [--steps N] [--device cpu|cuda] [--seed K] [--out DIR]
gridsampler3d check [--device cpu|cuda] [--backends a,b] [--quick]
gridsampler3d bench [--cases ...] [--threads N[,M]] [--explain] [--json FILE] [--plot FILE]
gridsampler3d warmup [--dtypes ...] [--modes ...] [--paddings ...] [--layouts ...] [--fields ...] [--where | --clear]
gridsampler3d backends
gridsampler3d --version
"""

from __future__ import annotations

import argparse
import sys

from .commands import COMMANDS
from .commands.arguments import CliError

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line (``gridsampler3d run: error: ...``) and exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser: one subcommand per module of :mod:`gridsampler3d.tools.commands`."""
    from .. import __version__

    parser = _Parser(prog="gridsampler3d", description="3-D grid sampling and its backward.")
    parser.add_argument("--version", action="version", version=f"gridsampler3d {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command in COMMANDS:
        command.add_command(commands)
        added = list(commands.choices.values())[-1]
        if not added.description:  # the help screen says what the command does: its module's first paragraph
            added.description = " ".join(command.__doc__.split("\n\n")[0].split())
    return parser


def main(argv=None) -> int:
    """Entry point of the ``gridsampler3d`` console script: the exit code (0 done or passed, 1 failed a check,
    2 a usage error, said in one ``error:`` line on stderr)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # said by the command's own parser, which knows its flags
            parser._subparsers._group_actions[0].choices[args.command].error(
                f"unrecognized arguments: {' '.join(unknown)}"
            )
    except SystemExit as stop:  # argparse's exit: --help, --version (0) or a usage error (2), already printed
        return stop.code if isinstance(stop.code, int) else 2
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
