"""The device check of the Triton engine: correctness, determinism, speed against PyTorch CUDA.

    python benchmarks/gpu_check.py [--out out/gpu] [--scale 2] [--quick]

(``--device cpu`` with ``TRITON_INTERPRET=1`` and a small ``--scale`` is a dry run of the
script itself through Triton's interpreter; its times mean nothing.)

1. Correctness: the mode matrix x dtypes x layouts at small sizes, fast and deterministic
   backward and the forward, each against the float64 golden by the SPEC section 5 rule.
2. Determinism: deterministic mode run three times, bitwise equal.
3. Speed: the SPEC section 8 suite at GPU sizes (``--scale 2``: reg 256^3, up2x 128^3 ->
   256^3) against PyTorch CUDA in this process, medians of ``triton.testing.do_bench``,
   with the bytes each case must move and the bandwidth achieved against this card's
   measured copy bandwidth.
Writes ``gpu_check.json`` and ``gpu_check.md`` under ``--out`` and prints the tables.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gridsampler3d as gs  # noqa: E402
from gridsampler3d import precision  # noqa: E402
from gridsampler3d.bench.runner import machine_info  # noqa: E402
from gridsampler3d.bench.suite import SUITE, build_inputs  # noqa: E402
from gridsampler3d.modes import parse_interpolation, parse_padding  # noqa: E402

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DEVICE = "cuda"
MATRIX = list(itertools.product(("bilinear", "nearest"), ("zeros", "border", "reflection"), (False, True)))


def log(*parts):
    print(*parts, flush=True)


def small_case(dtype, data_format, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 16, 9, 10, 11, generator=generator, dtype=torch.float64)
    grad = torch.randn(2, 16, 12, 8, 9, generator=generator, dtype=torch.float64)
    grid = torch.rand(2, 12, 8, 9, 3, generator=generator, dtype=torch.float64) * 2.4 - 1.2
    if data_format == "NDHWC":
        x, grad = x.permute(0, 2, 3, 4, 1).contiguous(), grad.permute(0, 2, 3, 4, 1).contiguous()
    return tuple(t.to(DEVICE, dtype) for t in (grad, x, grid))


def check_correctness() -> dict:
    failures, checked = [], 0
    for (mode, padding, align), dtype, data_format in itertools.product(MATRIX, DTYPES, ("NCDHW", "NDHWC")):
        grad, x, grid = small_case(dtype, data_format, seed=checked)
        args = (mode, padding, align)
        golden = precision.golden_backward(grad, x, grid, *args, (True, True), data_format)
        theirs = precision.competitor_backward(grad, x, grid, *args, (True, True), data_format)
        for deterministic in (False, True):
            ours = gs.grid_sampler3d_backward(grad, x, grid, *args, data_format=data_format, backend="triton",
                                              deterministic=deterministic)
            for name, a, b, c in zip(("dx", "dgrid"), ours, golden, theirs):
                label = f"{mode}/{padding}/ac={align} {dtype} {data_format} {'det' if deterministic else 'fast'} {name}"
                report = precision.compare(label, a, b, c, dtype)
                checked += 1
                if not report.passed:
                    failures.append(str(report))
        y = gs.grid_sampler3d(x, grid, *args, data_format=data_format, backend="triton")
        report = precision.compare(f"{mode}/{padding}/ac={align} {dtype} {data_format} y", y,
                                   precision.golden_forward(x, grid, *args, data_format),
                                   precision.competitor_forward(x, grid, *args, data_format), dtype)
        checked += 1
        if not report.passed:
            failures.append(str(report))
    log(f"correctness: {checked - len(failures)}/{checked} outputs pass the SPEC section 5 rule")
    for failure in failures:
        log("  " + failure.replace("\n", "\n  "))
    return {"checked": checked, "failures": failures}


def check_determinism() -> dict:
    result = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        case = SUITE[-1]  # up2x: eight points per voxel, many collisions
        (grad, x, grid), _ = build_inputs(case, DEVICE, 0.25 if DEVICE == "cpu" else 1.0)
        grad, x, grid = grad.to(dtype), x.to(dtype), grid.to(dtype)
        kwargs = dict(padding_mode=case.padding, align_corners=case.align_corners, backend="triton")
        runs = [gs.grid_sampler3d_backward(grad, x, grid, deterministic=True, **kwargs) for _ in range(3)]
        same = all(torch.equal(a, b) for run in runs[1:] for a, b in zip(runs[0], run))
        fast = [gs.grid_sampler3d_backward(grad, x, grid, deterministic=False, **kwargs)[0] for _ in range(3)]
        result[str(dtype)] = {"deterministic_bitwise": same,
                              "fast_bitwise": all(torch.equal(fast[0], other) for other in fast[1:])}
        log(f"determinism {dtype}: deterministic mode bitwise equal over 3 runs: {same}; "
            f"fast mode: {result[str(dtype)]['fast_bitwise']}")
    return result


def median_ms(function) -> float:
    if DEVICE == "cpu":
        times = []
        for _ in range(3):
            start = time.perf_counter()
            function()
            times.append((time.perf_counter() - start) * 1e3)
        return sorted(times)[1]
    from triton.testing import do_bench

    return float(do_bench(function, warmup=25, rep=100, return_mode="median"))


def copy_bandwidth() -> float:
    source = torch.empty(2**29 if DEVICE == "cuda" else 2**20, dtype=torch.uint8, device=DEVICE)  # 512 MiB
    target = torch.empty_like(source)
    milliseconds = median_ms(lambda: target.copy_(source))
    return 2 * source.numel() / (milliseconds * 1e-3)


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def bench_suite(scale: float, bandwidth: float) -> list:
    rows = []
    for case in SUITE:
        (grad, x, grid), (grad_ncdhw, x_ncdhw) = build_inputs(case, DEVICE, scale)
        codes = (int(parse_interpolation(case.mode)), int(parse_padding(case.padding)), case.align_corners)
        kwargs = dict(interpolation_mode=case.mode, padding_mode=case.padding, align_corners=case.align_corners,
                      data_format=case.layout, backend="triton")
        times = {
            "fwd_torch": median_ms(lambda: torch.ops.aten.grid_sampler_3d(x_ncdhw, grid, *codes)),
            "fwd_ours": median_ms(lambda: gs.grid_sampler3d(x, grid, **kwargs)),
            "bwd_torch": median_ms(lambda: torch.ops.aten.grid_sampler_3d_backward(grad_ncdhw, x_ncdhw, grid, *codes,
                                                                                   [True, True])),
            "bwd_fast": median_ms(lambda: gs.grid_sampler3d_backward(grad, x, grid, deterministic=False, **kwargs)),
            "bwd_det": median_ms(lambda: gs.grid_sampler3d_backward(grad, x, grid, deterministic=True, **kwargs)),
        }
        # Compulsory traffic: every operand read once, every output written once.
        forward_bytes = nbytes(x, grid) + nbytes(grad)
        backward_bytes = nbytes(grad, x, grid) + nbytes(x, grid)
        row = {"case": case.name, "in": x.shape[2] if case.layout == "NCDHW" else x.shape[1],
               "out": grid.shape[1], "times_ms": times,
               "forward_ratio": times["fwd_torch"] / times["fwd_ours"],
               "backward_ratio": times["bwd_torch"] / times["bwd_fast"],
               "deterministic_ratio": times["bwd_torch"] / times["bwd_det"],
               "deterministic_over_fast": times["bwd_det"] / times["bwd_fast"],
               "forward_bytes": forward_bytes, "backward_bytes": backward_bytes,
               "forward_bandwidth_fraction": forward_bytes / (times["fwd_ours"] * 1e-3) / bandwidth,
               "backward_bandwidth_fraction": backward_bytes / (times["bwd_fast"] * 1e-3) / bandwidth}
        rows.append(row)
        log(f"{case.name:<7} {row['in']:>4}->{row['out']:<4} fwd {times['fwd_torch']:.3f}/{times['fwd_ours']:.3f} ms "
            f"{row['forward_ratio']:.2f}x | bwd {times['bwd_torch']:.3f}/{times['bwd_fast']:.3f} ms "
            f"{row['backward_ratio']:.2f}x | det {times['bwd_det']:.3f} ms ({row['deterministic_over_fast']:.2f}x fast) "
            f"| bw fwd {row['forward_bandwidth_fraction']:.0%} bwd {row['backward_bandwidth_fraction']:.0%}")
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return rows


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def markdown(report: dict) -> str:
    lines = [f"GPU: {report['machine'].get('gpu')}, torch {torch.__version__}, scale {report['scale']}, "
             f"copy bandwidth {report['copy_bandwidth_gbs']:.0f} GB/s",
             "", "| case | in→out | fwd PyTorch | fwd ours | ratio | bwd PyTorch | bwd fast | ratio | bwd deterministic "
             "| det/fast | bandwidth fwd / bwd |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in report["suite"]:
        t = row["times_ms"]
        lines.append(f"| {row['case']} | {row['in']}³→{row['out']}³ | {t['fwd_torch']:.3f} ms | {t['fwd_ours']:.3f} ms | "
                     f"{row['forward_ratio']:.2f}x | {t['bwd_torch']:.3f} ms | {t['bwd_fast']:.3f} ms | "
                     f"{row['backward_ratio']:.2f}x | {t['bwd_det']:.3f} ms | {row['deterministic_over_fast']:.2f} | "
                     f"{row['forward_bandwidth_fraction']:.0%} / {row['backward_bandwidth_fraction']:.0%} |")
    summary = report["summary"]
    lines.append(f"| geometric mean | | | | {summary['forward']:.2f}x | | | {summary['backward']:.2f}x | | "
                 f"{summary['deterministic_over_fast']:.2f} | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/gpu")
    parser.add_argument("--scale", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="skip the correctness matrix")
    parser.add_argument("--device", default="cuda", help="cuda; cpu only for a dry run under TRITON_INTERPRET=1")
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        log("gpu_check: no CUDA device here; nothing to check")
        return 2
    started = time.perf_counter()
    report = {"machine": machine_info(DEVICE), "scale": args.scale, "date": time.strftime("%Y-%m-%d")}
    log(f"gpu_check on {report['machine'].get('gpu')}, torch {torch.__version__}")
    if not args.quick:
        report["correctness"] = check_correctness()
    report["determinism"] = check_determinism()
    bandwidth = copy_bandwidth()
    report["copy_bandwidth_gbs"] = bandwidth / 1e9
    log(f"copy bandwidth: {bandwidth / 1e9:.0f} GB/s")
    report["suite"] = bench_suite(args.scale, bandwidth)
    report["summary"] = {"forward": geomean(r["forward_ratio"] for r in report["suite"]),
                         "backward": geomean(r["backward_ratio"] for r in report["suite"]),
                         "deterministic": geomean(r["deterministic_ratio"] for r in report["suite"]),
                         "deterministic_over_fast": geomean(r["deterministic_over_fast"] for r in report["suite"])}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    (out / "gpu_check.md").write_text(table + "\n")
    log(table)
    log(f"gpu_check finished in {time.perf_counter() - started:.0f} s")
    failed = bool(report.get("correctness", {}).get("failures")) or not all(
        r["deterministic_bitwise"] for r in report["determinism"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
