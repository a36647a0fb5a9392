"""What the commands share: the error they report, the attribute flags, reading arrays, checking a device."""

from __future__ import annotations

import argparse
import sys

import numpy as np

__all__ = [
    "CliError",
    "add_attributes",
    "at_least",
    "choices",
    "load_array",
    "mode_value",
    "positive_float",
    "require_device",
]


class CliError(Exception):
    """A user error reported as one line on stderr with exit code 2."""


def add_attributes(parser: argparse.ArgumentParser, *, defaults: bool = True, backend: bool = True) -> None:
    """The backward's attribute flags. Without ``defaults`` a flag not given reads None, so that
    ``compare`` can tell it from a case folder's; it fills in the same defaults itself."""

    def default(value):
        return value if defaults else None

    parser.add_argument(
        "--interpolation-mode",
        default=default("bilinear"),
        help="bilinear (0), nearest (1) or bicubic (2, tricubic); default bilinear",
    )
    parser.add_argument("--padding-mode", default=default("zeros"), help="zeros (0), border (1) or reflection (2)")
    parser.add_argument(
        "--align-corners", action="store_true", default=default(False), help="treat -1/1 as corner voxel centres"
    )
    parser.add_argument("--data-format", default=default("NCDHW"), help="NCDHW or NDHWC for grad, input and dx")
    if backend:
        parser.add_argument("--backend", default="auto", help="auto, reference, ... (see `gridsampler3d backends`)")


def at_least(minimum: int):
    """An argparse type: an integer of at least ``minimum``."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer; got {value!r}") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}; got {number}")
        return number

    return parse


def positive_float(value: str) -> float:
    """An argparse type: a finite number above zero."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number; got {value!r}") from None
    if not 0 < number < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0; got {value}")
    return number


def choices(allowed):
    """An argparse type: one or more of ``allowed``, separated by commas (case-insensitive), as a list."""
    by_lower = {value.lower(): value for value in allowed}

    def parse(value: str) -> list:
        picked = [part.strip().lower() for part in value.split(",") if part.strip()]
        unknown = [part for part in picked if part not in by_lower]
        if not picked or unknown:
            raise argparse.ArgumentTypeError(f"must be among {', '.join(allowed)} (comma-separated); got {value!r}")
        return [by_lower[part] for part in dict.fromkeys(picked)]

    return parse


def mode_value(value: str):
    """Accept an integer code given on the command line as a string ("1")."""
    return int(value) if value.strip().lstrip("-").isdigit() else value


def load_array(path: str, name: str) -> np.ndarray:
    """The array in the .npy file ``path`` given as ``--name``, or a :class:`CliError` that says why not."""
    try:
        array = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise CliError(f"--{name}: no such file: {path}") from None
    except (OSError, ValueError) as error:
        raise CliError(f"--{name}: {path} is not a readable .npy array ({error})") from None
    if not isinstance(array, np.ndarray):
        raise CliError(f"--{name}: {path} holds an archive, not a single .npy array")
    return array


def require_device(device: str) -> None:
    """A :class:`CliError` unless ``device`` names the CPU or an available CUDA device."""
    import torch

    try:
        device_type = torch.device(device).type
    except RuntimeError:
        device_type = None
    if device_type not in ("cpu", "cuda"):
        raise CliError(f"--device must be cpu or cuda (cuda:N); got {device!r}")
    if device_type == "cuda" and not torch.cuda.is_available():
        raise CliError(f"--device {device}: no CUDA device is available here")


def to_stderr(line: str) -> None:
    """Print a progress line to standard error at once (the results go to standard output)."""
    print(line, file=sys.stderr, flush=True)
