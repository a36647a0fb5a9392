"""The ``cases`` command: write the golden kit's case folders (:mod:`gridsampler3d.golden_kit`)."""

from __future__ import annotations

import argparse

from .arguments import CliError, at_least

__all__ = ["add_command"]


def add_command(commands) -> None:
    """Add ``cases`` to the command line's subcommands."""
    cases = commands.add_parser(
        "cases",
        help="write case folders (inputs and float64 golden dx, dgrid) to run on another implementation "
        "and judge with `compare`",
        description="Write case folders: case.json (dtype, data_format, modes, align_corners, file names, "
        "shapes), the inputs grad, input and grid in the case's dtype and data format (.npy; "
        "bfloat16 as raw little-endian .bin), and the float64 golden dx_golden.npy and "
        "dgrid_golden.npy. The set covers every mode, padding, align_corners, dtype and data format, "
        "odd sizes, grids far out of range and non-finite grid values.",
    )
    cases.add_argument("--out", required=True, metavar="DIR", help="folder to hold the case folders")
    cases.add_argument(
        "--count",
        type=at_least(1),
        metavar="K",
        help="the first K cases of the fixed order (default: all 24; every dtype from K = 4 on)",
    )
    cases.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the values (default 0)")
    cases.add_argument(
        "--dtypes",
        default="float16,bfloat16,float32,float64",
        metavar="LIST",
        help="comma-separated dtypes, taking turns along the cases (default: all four)",
    )
    cases.set_defaults(handler=_cases)


def _cases(args: argparse.Namespace) -> int:
    from .. import golden_kit

    dtypes = [name.strip() for name in args.dtypes.split(",") if name.strip()]
    try:
        folders = golden_kit.write_cases(
            args.out,
            count=args.count,
            seed=args.seed,
            dtypes=dtypes,
            echo=lambda folder: print(f"  {folder}", flush=True),
        )
    except OSError as error:
        raise CliError(f"--out: cannot write to {args.out} ({error})") from None
    except ValueError as error:
        raise CliError(str(error)) from None
    print(
        f"wrote {len(folders)} cases to {args.out} "
        f"(dtypes {', '.join(dict.fromkeys(dtype for _, dtype in golden_kit.case_set(args.count, dtypes)))}; "
        f"seed {args.seed}). "
        "Run your backward on each case's inputs, then judge its outputs with "
        "`gridsampler3d compare --case FOLDER --dx FILE --dgrid FILE`."
    )
    return 0
