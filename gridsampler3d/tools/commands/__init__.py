"""The command line's commands, one module each, named after the command (``gridsampler3d <command>``).

Each module has ``add_command(subparsers)``, which adds its parser with its handler.
"""

from . import backends, bench, cases, check, compare, demo, run, warmup

__all__ = ["COMMANDS"]

#: The commands in the order ``gridsampler3d --help`` lists them.
COMMANDS = (run, cases, compare, demo, check, bench, warmup, backends)
