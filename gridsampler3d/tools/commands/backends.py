"""The ``backends`` command: which engines run here (and why not), what "auto" picks, the versions."""

from __future__ import annotations

import argparse

__all__ = ["add_command"]


def add_command(commands) -> None:
    """Add ``backends`` to the command line's subcommands."""
    listing = commands.add_parser(
        "backends",
        help="list the backends: whether each runs here (and why not), its "
        "device types, and the torch, numba and triton versions",
    )
    listing.set_defaults(handler=_backends)


def _backends(args: argparse.Namespace) -> int:
    from ... import backends

    rows = backends.describe_backends()
    width = max(len(row["name"]) for row in rows)
    print(f"{'backend':<{width}}  {'runs here':<9}  {'device types':<12}  why not")
    for row in rows:
        print(
            f"{row['name']:<{width}}  {'yes' if row['available'] else 'no':<9}  "
            f"{', '.join(row['device_types']) or '-':<12}  {row['reason'] or ''}".rstrip()
        )
    engine = backends.cpu_engine()
    if engine is not None:
        print(f"CPU engine: {engine}")
    print(
        "auto picks: "
        + ", ".join(
            f"{kind} tensors -> {name or f'none (no {kind} device here)'}"
            for kind, name in backends.auto_choices().items()
        )
    )
    print("versions: " + ", ".join(f"{package} {version}" for package, version in backends.library_versions().items()))
    return 0
