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
import json
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["main"]


class CliError(Exception):
    """A user error reported as one line on stderr with exit code 2."""


def _add_attributes(parser: argparse.ArgumentParser, *, defaults: bool = True, backend: bool = True) -> None:
    """The backward's attribute flags. Without ``defaults`` a flag not given reads None, so that
    ``compare`` can tell it from a case folder's; it fills in the same defaults itself."""
    def default(value):
        return value if defaults else None

    parser.add_argument("--interpolation-mode", default=default("bilinear"),
                        help="bilinear (0), nearest (1) or bicubic (2, tricubic); default bilinear")
    parser.add_argument("--padding-mode", default=default("zeros"),
                        help="zeros (0), border (1) or reflection (2)")
    parser.add_argument("--align-corners", action="store_true", default=default(False),
                        help="treat -1/1 as corner voxel centres")
    parser.add_argument("--data-format", default=default("NCDHW"), help="NCDHW or NDHWC for grad, input and dx")
    if backend:
        parser.add_argument("--backend", default="auto", help="auto, reference, ... (see `gridsampler3d backends`)")


def _mode(value: str):
    """Accept an integer code given on the command line as a string ("1")."""
    return int(value) if value.strip().lstrip("-").isdigit() else value


def _load(path: str, name: str) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise CliError(f"--{name}: no such file: {path}") from None
    except (OSError, ValueError) as error:
        raise CliError(f"--{name}: {path} is not a readable .npy array ({error})") from None
    if not isinstance(array, np.ndarray):
        raise CliError(f"--{name}: {path} holds an archive, not a single .npy array")
    return array


def _run(args: argparse.Namespace) -> int:
    from . import api, cases

    given = {name: getattr(args, name) for name in ("grad", "input", "grid")}
    if any(given.values()) and not all(given.values()):
        missing = ", ".join(f"--{name}" for name, path in given.items() if not path)
        raise CliError(f"--grad, --input and --grid go together; missing {missing}")
    if all(given.values()):
        arrays = {name: _load(path, name) for name, path in given.items()}
        source = "files"
    else:
        arrays = cases.default_case(size=args.size)
        source = f"built-in default case: {args.size}³ phantom, smooth random warp, MSE gradient"

    print("computing dx and dgrid (a first run compiles the CPU kernels once and caches them on disk: "
          "under ten seconds)", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        dx, dgrid = api.grid_sampler3d_backward(
            arrays["grad"], arrays["input"], arrays["grid"], interpolation_mode=_mode(args.interpolation_mode),
            padding_mode=_mode(args.padding_mode), align_corners=args.align_corners,
            data_format=args.data_format, backend=args.backend)
    except (TypeError, ValueError, RuntimeError, NotImplementedError) as error:
        raise CliError(str(error)) from None
    elapsed = time.perf_counter() - start

    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        np.save(out / "dx.npy", dx)
        np.save(out / "dgrid.npy", dgrid)
    except OSError as error:
        raise CliError(f"--out: cannot write to {out} ({error})") from None

    print(f"input:  {source}")
    for name in ("grad", "input", "grid"):
        print(f"  {name:<6} {str(arrays[name].shape):<26} {arrays[name].dtype}")
    print(f"attributes: interpolation_mode={args.interpolation_mode} padding_mode={args.padding_mode} "
          f"align_corners={args.align_corners} data_format={args.data_format} backend={args.backend}")
    print(f"backward: {elapsed * 1e3:.1f} ms")
    for name, array in (("dx", dx), ("dgrid", dgrid)):
        values = array.astype(np.float64)
        finite = np.isfinite(values)
        norm = np.linalg.norm(values[finite]) if finite.any() else 0.0
        print(f"  {name:<6} {str(array.shape):<26} {array.dtype}  L2 {norm:.6g}  max|.| "
              f"{np.abs(values[finite]).max() if finite.any() else 0.0:.6g}  non-finite {int((~finite).sum())}"
              f"  -> {out / (name + '.npy')}")
    return 0


def _cases(args: argparse.Namespace) -> int:
    from . import golden_kit

    dtypes = [name.strip() for name in args.dtypes.split(",") if name.strip()]
    try:
        folders = golden_kit.write_cases(args.out, count=args.count, seed=args.seed, dtypes=dtypes,
                                         echo=lambda folder: print(f"  {folder}", flush=True))
    except OSError as error:
        raise CliError(f"--out: cannot write to {args.out} ({error})") from None
    except ValueError as error:
        raise CliError(str(error)) from None
    print(f"wrote {len(folders)} cases to {args.out} (dtypes {', '.join(dict.fromkeys(dtypes))}; seed {args.seed}). "
          "Run your backward on each case's inputs, then judge its outputs with "
          "`gridsampler3d compare --case FOLDER --dx FILE --dgrid FILE`.")
    return 0


def _compare_case(args: argparse.Namespace):
    """The case to judge: a case folder, or three .npy files with the attribute flags."""
    from . import golden_kit

    inputs = {"--grad": args.grad, "--input": args.input, "--grid": args.grid}
    attributes = {"--interpolation-mode": args.interpolation_mode, "--padding-mode": args.padding_mode,
                  "--align-corners": args.align_corners, "--data-format": args.data_format, "--dtype": args.dtype}
    if args.case is not None:
        clashing = [flag for flag, value in {**inputs, **attributes}.items() if value is not None]
        if clashing:
            raise CliError(f"--case gives the inputs, the attributes and the dtype; drop {', '.join(clashing)}")
        return golden_kit.read_case(args.case)
    missing = [flag for flag, path in inputs.items() if path is None]
    if missing:
        raise CliError(f"give --case, or --grad, --input and --grid; missing {', '.join(missing)}")
    if args.dtype is not None and args.dtype not in golden_kit.DTYPES:
        raise CliError(f"--dtype must be one of {', '.join(golden_kit.DTYPES)}; got {args.dtype!r}")
    return golden_kit.case_from_npy(
        args.grad, args.input, args.grid, dtype=golden_kit.DTYPES.get(args.dtype),
        interpolation_mode=_mode(args.interpolation_mode or "bilinear"),
        padding_mode=_mode(args.padding_mode or "zeros"), align_corners=bool(args.align_corners),
        data_format=args.data_format or "NCDHW")


def _compare(args: argparse.Namespace) -> int:
    from . import golden_kit, judge

    if args.dx is None and args.dgrid is None:
        raise CliError("nothing to judge: give --dx, --dgrid or both")
    try:
        case = _compare_case(args)
        likes = {"dx": case.input, "dgrid": case.grid}
        outputs = {name: golden_kit.read_array(path, label=f"--{name}", dtype=case.dtype, shape=likes[name].shape)
                   for name, path in (("dx", args.dx), ("dgrid", args.dgrid)) if path is not None}
        reports = judge.judge(case, **outputs)
    except (TypeError, ValueError, RuntimeError) as error:
        raise CliError(str(error)) from None
    print(judge.format_report(case, reports))
    if args.json:
        try:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(judge.to_json(reports), indent=2) + "\n")
        except OSError as error:
            raise CliError(f"--json: cannot write {args.json} ({error})") from None
    return 0 if judge.passed(reports) else 1


def _require_device(device: str) -> None:
    import torch

    try:
        device_type = torch.device(device).type
    except RuntimeError:
        device_type = None
    if device_type not in ("cpu", "cuda"):
        raise CliError(f"--device must be cpu or cuda (cuda:N); got {device!r}")
    if device_type == "cuda" and not torch.cuda.is_available():
        raise CliError(f"--device {device}: no CUDA device is available here")


def _demo(args: argparse.Namespace) -> int:
    from . import demo

    _require_device(args.device)
    if args.size < 8:
        raise CliError(f"--size must be at least 8; got {args.size}")
    if args.steps < 1:
        raise CliError(f"--steps must be at least 1; got {args.steps}")
    if args.device == "cpu":
        print("a first run compiles the CPU kernels once (cached on disk), about a minute",
              file=sys.stderr, flush=True)
    try:
        demo.run_demo(size=args.size, steps=args.steps, device=args.device, out=args.out, seed=args.seed)
    except OSError as error:
        raise CliError(f"--out: cannot write to {args.out} ({error})") from None
    except (ValueError, RuntimeError) as error:
        raise CliError(str(error)) from None
    return 0


def _check(args: argparse.Namespace) -> int:
    from . import check

    _require_device(args.device)
    names = None if args.backends is None else [name.strip() for name in args.backends.split(",") if name.strip()]
    try:
        rows = check.run_check(device=args.device, backends=names, quick=args.quick)
    except (ValueError, RuntimeError) as error:
        raise CliError(str(error)) from None
    return 0 if all(row["passed"] for row in rows) else 1


def _thread_counts(value: str | None) -> list:
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
    from . import bench

    counts = _thread_counts(args.threads)
    _require_device(args.device)
    reports = []
    for threads in counts:
        try:
            reports.append(bench.run_suite(args.cases, device=args.device, backend=args.backend,
                                           repeats=args.repeats, threads=threads, scale=args.scale,
                                           explain=args.explain))
        except (ValueError, RuntimeError) as error:
            raise CliError(str(error)) from None
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
    if args.out:
        try:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(bench.format_document(reports, args.command_line))
        except OSError as error:
            raise CliError(f"--out: cannot write {args.out} ({error})") from None
        print(f"wrote {args.out}")
    return 0


def _backends(args: argparse.Namespace) -> int:
    from . import backends

    rows = backends.describe_backends()
    width = max(len(row["name"]) for row in rows)
    print(f"{'backend':<{width}}  {'runs here':<9}  {'device types':<12}  why not")
    for row in rows:
        print(f"{row['name']:<{width}}  {'yes' if row['available'] else 'no':<9}  "
              f"{', '.join(row['device_types']) or '-':<12}  {row['reason'] or ''}".rstrip())
    engine = backends.cpu_engine()
    if engine is not None:
        print(f"CPU engine: {engine}")
    print("auto picks: " + ", ".join(f"{kind} tensors -> {name or f'none (no {kind} device here)'}"
                                     for kind, name in backends.auto_choices().items()))
    print("versions: " + ", ".join(f"{package} {version}" for package, version in backends.library_versions().items()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gridsampler3d", description="3-D grid sampling and its backward.")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="compute dx and dgrid from .npy files (or the built-in case)")
    run.add_argument("--grad", help="dL/dy, .npy (N, C, Do, Ho, Wo) or (N, Do, Ho, Wo, C)")
    run.add_argument("--input", help="the volume x, .npy (N, C, Di, Hi, Wi) or (N, Di, Hi, Wi, C)")
    run.add_argument("--grid", help="the sampling grid, .npy (N, Do, Ho, Wo, 3)")
    run.add_argument("--size", type=int, default=64, help="edge of the built-in case's volume (default 64)")
    _add_attributes(run)
    run.add_argument("--out", default="out/run", help="folder for dx.npy and dgrid.npy (default out/run)")
    run.set_defaults(handler=_run)

    cases = commands.add_parser(
        "cases", help="write case folders (inputs and float64 golden dx, dgrid) to run on another implementation "
                      "and judge with `compare`",
        description="Write case folders: case.json (dtype, data_format, modes, align_corners, file names, "
                    "shapes), the inputs grad, input and grid in the case's dtype and data format (.npy; "
                    "bfloat16 as raw little-endian .bin), and the float64 golden dx_golden.npy and "
                    "dgrid_golden.npy. The set covers every mode, padding, align_corners, dtype and data format, "
                    "odd sizes, grids far out of range and non-finite grid values.")
    cases.add_argument("--out", required=True, metavar="DIR", help="folder to hold the case folders")
    cases.add_argument("--count", type=int, metavar="K", help="the first K cases of the fixed order (default: all 24; "
                                                 "every dtype from K = 4 on)")
    cases.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the values (default 0)")
    cases.add_argument("--dtypes", default="float16,bfloat16,float32,float64", metavar="LIST",
                       help="comma-separated dtypes, taking turns along the cases (default: all four)")
    cases.set_defaults(handler=_cases)

    compare = commands.add_parser(
        "compare", help="judge another implementation's dx and dgrid by the precision rule: "
                        "exit 0 pass, 1 fail, 2 unusable input",
        description="Judge dx and dgrid against the float64 golden: MARE, MERE and RMSE at most 2, 1.2 and "
                    "1.2 times the competitor's (PyTorch CPU in the same dtype; for bicubic, this library's torch "
                    "composite) or the dtype's floor, and non-finite values where the golden's are. The case comes from --case, or from --grad, --input and --grid (.npy) with "
                    "the attribute flags. Exit 0: every output given passes; 1: one fails; 2: unusable input.")
    compare.add_argument("--case", metavar="DIR", help="a case folder written by `gridsampler3d cases` (inputs, attributes, dtype)")
    compare.add_argument("--grad", help="instead of --case: dL/dy, .npy (N, C, Do, Ho, Wo) or (N, Do, Ho, Wo, C)")
    compare.add_argument("--input", help="instead of --case: x, .npy (N, C, Di, Hi, Wi) or (N, Di, Hi, Wi, C)")
    compare.add_argument("--grid", help="instead of --case: the grid, .npy (N, Do, Ho, Wo, 3)")
    _add_attributes(compare, defaults=False, backend=False)
    compare.add_argument("--dtype", metavar="DTYPE", help="without --case: float16, bfloat16, float32 or float64 (default: the "
                                         "--input file's); .npy inputs of another dtype must hold its values exactly")
    compare.add_argument("--dx", metavar="FILE", help="dx to judge: .npy, or raw little-endian .bin, in the case's dtype, "
                                      "shaped like x")
    compare.add_argument("--dgrid", metavar="FILE", help="dgrid to judge: .npy or .bin, in the case's dtype, shaped like the grid")
    compare.add_argument("--json", metavar="PATH", help="also write the verdict and the metrics here as JSON")
    compare.set_defaults(handler=_compare)

    demo = commands.add_parser("demo", help="register a warped phantom through this library; figures and Dice")
    demo.add_argument("--size", type=int, default=48, help="edge of the phantom volume (default 48)")
    demo.add_argument("--steps", type=int, default=100, help="Adam steps (default 100)")
    demo.add_argument("--device", default="cpu", help="cpu or cuda")
    demo.add_argument("--seed", type=int, default=0, help="seed of the known random deformation (default 0)")
    demo.add_argument("--out", default="out/demo", help="folder for the PNGs and summary.json (default out/demo)")
    demo.set_defaults(handler=_demo)

    check = commands.add_parser("check", help="verify every backend against PyTorch across the mode matrix")
    check.add_argument("--device", default="cpu", help="cpu or cuda")
    check.add_argument("--backends", help="comma-separated backend names (default: all that run on the device)")
    check.add_argument("--quick", action="store_true", help="float32 and float64 only")
    check.set_defaults(handler=_check)

    bench = commands.add_parser("bench", help="time forward and backward against PyTorch (the benchmark suite)")
    bench.add_argument("--cases", help="comma-separated case names (default: all)")
    bench.add_argument("--threads", help="threads for both libraries, or several counts in turn (1,2); "
                                         "default: torch's setting")
    bench.add_argument("--repeats", type=int, default=7, help="timed runs per measurement (median; default 7)")
    bench.add_argument("--device", default="cpu", help="cpu or cuda")
    bench.add_argument("--backend", default="auto", help="our backend to time (default auto)")
    bench.add_argument("--scale", type=float, default=1.0, help="multiply every case's edge sizes by this")
    bench.add_argument("--json", help="write the machine-readable report here")
    bench.add_argument("--plot", help="write a PNG bar chart of the ratios here")
    bench.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    bench.add_argument("--out", help="write a Markdown document of the run (machine, versions, date, a table per "
                                     "thread count), as BENCHMARKS.md is written")
    bench.add_argument("--explain", action="store_true",
                       help="print each case's plan (the CPU engine's strategy and its parameters) under its times")
    bench.set_defaults(handler=_bench)

    listing = commands.add_parser("backends", help="list the backends: whether each runs here (and why not), its "
                                                   "device types, and the torch, numba and triton versions")
    listing.set_defaults(handler=_backends)
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
