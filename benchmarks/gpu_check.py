"""The device check of the Triton engine: speed against PyTorch CUDA first, then what the GPU says.

    python benchmarks/gpu_check.py [--out out/gpu] [--budget 420] [--scale 1] [--cases reg256,...]

Phases, in this order, each writing ``gpu_check.json`` and ``gpu_check.md`` under ``--out``
as soon as it has a result, so that a run cut short still returns everything before:

1. machine: GPU, versions, clocks, copy bandwidth;
2. speed: the GPU suite (below) against PyTorch CUDA in this process, medians of
   ``triton.testing.do_bench`` after a first (cold: compiling and tuning) call timed apart:
   forward, fast and deterministic backward, and each ``output_mask`` (dx only, dgrid
   only); bytes moved against the copy bandwidth;
3. registers: registers and spills of every kernel compiled so far, from the driver, and
   the launch shapes the tuner chose (``gridsampler3d.gpu.autotune``) with each candidate's time;
4. correctness: the mode matrix (bicubic included) x layouts, float32 first, then the half
   types and float64, both backward modes, by the precision rule, until the budget
   is spent (``check_done`` says how far it got);
5. determinism: the deterministic mode three times on the heaviest case, bitwise.

Speed cases start while a quarter of ``--budget`` is left, correctness cases while a
tenth is; the determinism phase always runs (one case, six calls).
``--device cpu`` with ``TRITON_INTERPRET=1`` and a small ``--scale`` is a dry run of the
script through Triton's interpreter (tests/test_gpu.py runs it); its times mean nothing.
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
from gridsampler3d.dtypes import DTYPES  # noqa: E402
from gridsampler3d.modes import parse_interpolation, parse_padding  # noqa: E402
from gridsampler3d.tools.bench.runner import machine_info, plumbed_warp  # noqa: E402
from gridsampler3d.tools.bench.suite import BenchCase, build_inputs  # noqa: E402
from gridsampler3d.tools.commands import check  # noqa: E402

# GPU sizes: the operator's eight benchmark cases scaled up so that one launch runs well past launch
# overhead, and the cases a GPU needs besides (half types, wide channels-last, a large
# volume, heavy buckets, bicubic).
GPU_SUITE = (
    BenchCase("reg256", 1, 1, 256, 256, "warp", "bilinear", "zeros", False, "float32", "NCDHW"),
    BenchCase("vol256c16", 1, 16, 256, 256, "affine", "bilinear", "zeros", False, "float32", "NCDHW"),
    BenchCase("cl128", 1, 16, 128, 128, "affine", "bilinear", "zeros", False, "float32", "NDHWC"),
    BenchCase("cl128c32", 1, 32, 128, 128, "affine", "bilinear", "zeros", False, "float32", "NDHWC"),
    BenchCase("bf16", 1, 16, 128, 128, "affine", "bilinear", "zeros", False, "bfloat16", "NCDHW"),
    BenchCase("fp16", 1, 16, 128, 128, "affine", "bilinear", "zeros", False, "float16", "NCDHW"),
    BenchCase("up2x", 1, 4, 128, 256, "identity", "bilinear", "border", True, "float32", "NCDHW"),
    BenchCase("border3", 1, 4, 128, 128, "wide", "bilinear", "border", False, "float32", "NCDHW"),
    BenchCase("feat96", 2, 32, 96, 96, "affine", "bilinear", "border", False, "float32", "NCDHW"),
    BenchCase("near128", 1, 16, 128, 128, "affine", "nearest", "reflection", False, "float32", "NCDHW"),
    BenchCase("fp64", 1, 8, 128, 128, "affine", "bilinear", "reflection", False, "float64", "NCDHW"),
    BenchCase("cubic128", 1, 4, 128, 128, "warp", "bicubic", "zeros", False, "float32", "NCDHW", "bilinear"),
    BenchCase("cubiccl", 1, 16, 96, 96, "affine", "bicubic", "border", True, "float32", "NDHWC", "bilinear"),
    # The fused warp against PyTorch's registration step (grid plumbing + grid_sample, autograd);
    # the dx / dgrid columns are d(volume) / d(displacement).
    BenchCase("warp256", 1, 1, 256, 256, "displacement", "bilinear", "border", True, "float32", "NCDHW", "plumbing"),
)
MASKS = {"dx": (True, False), "dgrid": (False, True)}
DEVICE = "cuda"


def log(*parts):
    print(*parts, flush=True)


class Run:
    """The report being built, written out after every step; the time left of the budget."""

    def __init__(self, out: Path, budget: float):
        self.out, self.deadline, self.started = out, time.perf_counter() + budget, time.perf_counter()
        self.report = {"machine": machine_info(DEVICE), "budget_s": budget, "phases_done": []}
        out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def save(self, phase: str | None = None) -> None:
        if phase:
            self.report["phases_done"].append(phase)
        self.report["elapsed_s"] = time.perf_counter() - self.started
        (self.out / "gpu_check.json").write_text(json.dumps(self.report, indent=1, default=str) + "\n")
        (self.out / "gpu_check.md").write_text(markdown(self.report) + "\n")


def synchronize():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def cold_ms(function) -> float:
    """One call, first of its kind: compiles included."""
    synchronize()
    start = time.perf_counter()
    function()
    synchronize()
    return (time.perf_counter() - start) * 1e3


def median_ms(function) -> float:
    if DEVICE == "cpu":
        times = sorted(cold_ms(function) for _ in range(3))
        return times[1]
    from triton.testing import do_bench

    return float(do_bench(function, warmup=10, rep=40, return_mode="median"))


def phase_machine(run: Run) -> None:
    machine = run.report["machine"]
    if DEVICE == "cuda":
        properties = torch.cuda.get_device_properties(0)
        machine.update(
            gpu_memory_gib=properties.total_memory / 2**30,
            multiprocessors=properties.multi_processor_count,
            capability=f"{properties.major}.{properties.minor}",
            cuda=torch.version.cuda,
        )
        try:
            import triton

            machine["versions"]["triton"] = triton.__version__
            machine["clock_mhz"] = torch.cuda.clock_rate()
        except (ImportError, RuntimeError, AttributeError):
            pass
    run.report["copy_bandwidth_gbs"] = copy_bandwidth_gbs()
    bandwidth = run.report["copy_bandwidth_gbs"]
    log(f"gpu_check on {machine.get('gpu')}, torch {torch.__version__}, copy {bandwidth:.0f} GB/s")
    run.save("machine")


def copy_bandwidth_gbs() -> float:
    """The device's copy bandwidth (bytes read plus written per second, in GB/s), from a 512 MiB copy."""
    source = torch.empty(2**29 if DEVICE == "cuda" else 2**20, dtype=torch.uint8, device=DEVICE)
    target = torch.empty_like(source)
    return 2 * source.numel() / (median_ms(lambda: target.copy_(source)) * 1e-3) / 1e9


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def time_case(
    case: BenchCase, ours_forward, torch_forward, ours_backward, torch_backward, tensors, bandwidth: float
) -> dict:
    """One speed row: cold and median times of the forward and of each backward (both outputs, then each
    alone; ours fast and deterministic, PyTorch's), their ratios, and the fraction of copy bandwidth.

    ``ours_backward(mask, deterministic)`` and ``torch_backward(mask)`` run one backward;
    ``tensors`` is (grad, x, grid or displacement), for the bytes moved.
    """
    calls = {"fwd_ours": ours_forward, "fwd_torch": torch_forward}
    for name, mask in {"": (True, True), **MASKS}.items():
        suffix = f"_{name}" if name else ""
        calls[f"bwd_torch{suffix}"] = lambda mask=mask: torch_backward(mask)
        calls[f"bwd_fast{suffix}"] = lambda mask=mask: ours_backward(mask, False)
        if name != "dgrid":  # dgrid is the same pass in both modes
            calls[f"bwd_det{suffix}"] = lambda mask=mask: ours_backward(mask, True)
    cold = {name: cold_ms(calls[name]) for name in ("fwd_ours", "bwd_fast", "bwd_det")}
    times = {name: median_ms(call) for name, call in calls.items()}
    grad, x, grid = tensors
    forward_bytes = nbytes(x, grid) + nbytes(grad)  # y is grad-sized
    backward_bytes = 2 * nbytes(grad, x, grid) - nbytes(grad)  # read grad, x, grid; write dx, dgrid
    row = {
        "case": case.name,
        "describe": case.describe(),
        "in": tuple(x.shape),
        "grid": tuple(grid.shape),
        "cold_ms": cold,
        "times_ms": times,
        "forward_ratio": times["fwd_torch"] / times["fwd_ours"],
        "backward_ratio": times["bwd_torch"] / times["bwd_fast"],
        "deterministic_ratio": times["bwd_torch"] / times["bwd_det"],
        "deterministic_over_fast": times["bwd_det"] / times["bwd_fast"],
        "forward_bandwidth_fraction": forward_bytes / (times["fwd_ours"] * 1e-3) / (bandwidth * 1e9),
        "backward_bandwidth_fraction": backward_bytes / (times["bwd_fast"] * 1e-3) / (bandwidth * 1e9),
    }
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return row


def bench_warp_case(case: BenchCase, scale: float, bandwidth: float) -> dict:
    """The fused warp (``gs.warp3d``) against PyTorch's plumbed step; dx / dgrid are d volume / d displacement."""
    (grad, volume, displacement), _ = build_inputs(case, DEVICE, scale)
    ours = dict(
        interpolation_mode=case.mode, padding_mode=case.padding, align_corners=case.align_corners, backend="triton"
    )
    leaves = (volume.clone().requires_grad_(), displacement.clone().requires_grad_())
    output = plumbed_warp(*leaves, case.mode, case.padding, case.align_corners)  # one graph, backward repeated

    def torch_forward():
        with torch.no_grad():
            return plumbed_warp(volume, displacement, case.mode, case.padding, case.align_corners)

    def torch_backward(mask):
        wanted = [leaf for leaf, want in zip(leaves, mask) if want]
        return torch.autograd.grad(output, wanted, grad, retain_graph=True)

    row = time_case(
        case,
        lambda: gs.warp3d(volume, displacement, **ours),
        torch_forward,
        lambda mask, deterministic: gs.warp3d_backward(
            grad, volume, displacement, output_mask=mask, deterministic=deterministic, **ours
        ),
        torch_backward,
        (grad, volume, displacement),
        bandwidth,
    )
    times = row["times_ms"]
    row["step_ratio"] = (times["fwd_torch"] + times["bwd_torch"]) / (times["fwd_ours"] + times["bwd_fast"])
    return row


def bench_case(case: BenchCase, scale: float, bandwidth: float) -> dict:
    if case.baseline == "plumbing":
        return bench_warp_case(case, scale, bandwidth)
    (grad, x, grid), (grad_ncdhw, x_ncdhw) = build_inputs(case, DEVICE, scale)
    ours = dict(
        interpolation_mode=case.mode,
        padding_mode=case.padding,
        align_corners=case.align_corners,
        data_format=case.layout,
        backend="triton",
    )
    if case.baseline == "bilinear":  # PyTorch has no 3-D bicubic: against our bilinear
        theirs = dict(ours, interpolation_mode="bilinear")

        def torch_forward():
            return gs.grid_sampler3d(x, grid, **theirs)

        def torch_backward(mask):
            return gs.grid_sampler3d_backward(grad, x, grid, output_mask=mask, deterministic=False, **theirs)
    else:
        codes = (int(parse_interpolation(case.mode)), int(parse_padding(case.padding)), case.align_corners)

        def torch_forward():
            return torch.ops.aten.grid_sampler_3d(x_ncdhw, grid, *codes)

        def torch_backward(mask):
            return torch.ops.aten.grid_sampler_3d_backward(grad_ncdhw, x_ncdhw, grid, *codes, list(mask))

    return time_case(
        case,
        lambda: gs.grid_sampler3d(x, grid, **ours),
        torch_forward,
        lambda mask, deterministic: gs.grid_sampler3d_backward(
            grad, x, grid, output_mask=mask, deterministic=deterministic, **ours
        ),
        torch_backward,
        (grad, x, grid),
        bandwidth,
    )


def phase_speed(run: Run, suite, scale: float, reserve: float) -> None:
    """Each case in turn while more than ``reserve`` seconds are left (for the later phases)."""
    rows = run.report.setdefault("speed", [])
    for case in suite:
        if run.left() < reserve:
            log(f"speed: budget spent before {case.name}")
            break
        try:
            row = bench_case(case, scale, run.report["copy_bandwidth_gbs"])
        except Exception as error:  # one case failing (memory, a bug) must not cost the others
            row = {"case": case.name, "error": f"{type(error).__name__}: {error}".splitlines()[0]}
            log(f"{case.name}: {row['error']}")
        else:
            t = row["times_ms"]
            log(
                f"{case.name:<10} fwd {t['fwd_torch']:.3f}/{t['fwd_ours']:.3f} ms {row['forward_ratio']:.2f}x | bwd "
                f"{t['bwd_torch']:.3f}/{t['bwd_fast']:.3f} ms {row['backward_ratio']:.2f}x | det {t['bwd_det']:.3f} ms "
                f"({row['deterministic_over_fast']:.2f}x fast) | cold {row['cold_ms']['bwd_fast']:.0f} ms"
            )
        rows.append(row)
        run.save()
    timed = [row for row in rows if "error" not in row and row["describe"]["baseline"] == "torch"]
    if timed:
        run.report["summary"] = {
            key: geomean(row[key] for row in timed)
            for key in ("forward_ratio", "backward_ratio", "deterministic_ratio", "deterministic_over_fast")
        }
    run.save("speed")


def phase_registers(run: Run) -> None:
    """Registers and spills per compiled kernel, as the driver loaded them."""
    from gridsampler3d.gpu import autotune, backward, bicubic, forward

    kernels = []
    for module in (forward, backward, bicubic):
        for name, function in sorted(vars(module).items()):
            caches = getattr(function, "device_caches", None) if name.endswith("_kernel") else None
            for device_cache in (caches or {}).values():
                for compiled in device_cache[0].values():
                    kernels.append(
                        {
                            "kernel": name,
                            "registers": getattr(compiled, "n_regs", None),
                            "spills": getattr(compiled, "n_spills", None),
                            "num_warps": compiled.metadata.num_warps,
                        }
                    )
    run.report["registers"] = kernels
    run.report["tuning"] = autotune.TUNER.report()
    run.save("registers")


def phase_correctness(run: Run, reserve: float) -> None:
    """The check's matrix, float32 first, both modes, until ``reserve`` seconds are left."""
    result = run.report.setdefault("correctness", {"checked": 0, "failures": [], "cases": 0})
    grad64, x64, grid64 = check._random_case()
    order = ("float32", "bfloat16", "float16", "float64")
    cases = list(itertools.product(order, check.MODES, check.PADDINGS, check.ALIGN_CORNERS, check.LAYOUTS))
    for dtype_name, mode, padding, align_corners, layout in cases:
        if run.left() < reserve:
            log(f"correctness: budget spent after {result['cases']}/{len(cases)} cases")
            break
        operands = check._in_layout(grad64, x64, grid64, DTYPES[dtype_name], layout)
        expected = check._expected(*operands, mode, padding, align_corners, layout)
        for deterministic in (False, True):
            label = f"{mode}/{padding}/ac={align_corners} {dtype_name} {layout} {'det' if deterministic else 'fast'}"
            try:
                ours = check._ours("triton", DEVICE, *operands, mode, padding, align_corners, layout, deterministic)
                _, failures = check._judge(ours, expected, DTYPES[dtype_name], torch.device(DEVICE))
            except Exception as error:
                failures = [f"{type(error).__name__}: {error}".splitlines()[0]]
            result["checked"] += 1
            result["failures"] += [f"{label}: {failure}" for failure in failures]
        result["cases"] += 1
    result["check_done"] = f"{result['cases']}/{len(cases)}"
    log(
        f"correctness: {result['checked'] - len(result['failures'])}/{result['checked']} runs pass "
        f"({result['check_done']} cases)"
    )
    for failure in result["failures"][:20]:
        log("  " + failure)
    run.save("correctness")


def phase_determinism(run: Run, scale: float) -> None:
    case = next(case for case in GPU_SUITE if case.name == "border3")  # points pile into a few cells
    (grad, x, grid), _ = build_inputs(case, DEVICE, scale)
    kwargs = dict(padding_mode=case.padding, align_corners=case.align_corners, backend="triton", deterministic=True)
    runs = [gs.grid_sampler3d_backward(grad, x, grid, **kwargs) for _ in range(3)]
    same = all(torch.equal(a, b) for other in runs[1:] for a, b in zip(runs[0], other))
    fast = [gs.grid_sampler3d_backward(grad, x, grid, **dict(kwargs, deterministic=False))[0] for _ in range(3)]
    run.report["determinism"] = {
        "case": case.name,
        "deterministic_bitwise": same,
        "fast_bitwise": all(torch.equal(fast[0], other) for other in fast[1:]),
    }
    log(
        f"determinism ({case.name}): deterministic bitwise over 3 runs: {same}; "
        f"fast: {run.report['determinism']['fast_bitwise']}"
    )
    run.save("determinism")


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def markdown(report: dict) -> str:
    machine = report["machine"]
    lines = [
        f"GPU: {machine.get('gpu')}, torch {machine['versions']['torch']}, "
        f"copy bandwidth {report.get('copy_bandwidth_gbs', float('nan')):.0f} GB/s, "
        f"phases done: {', '.join(report['phases_done'])}",
        "",
    ]
    if report.get("speed"):
        lines += [
            "| case | fwd PyTorch | fwd ours | ratio | bwd PyTorch | bwd fast | ratio | bwd det | det/fast "
            "| dx only PyTorch / fast / det | dgrid only PyTorch / ours | cold bwd | bandwidth fwd / bwd |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in report["speed"]:
            if "error" in row:
                lines.append(f"| {row['case']} | {row['error']} |")
                continue
            t = row["times_ms"]
            lines.append(
                f"| {row['case']} | {t['fwd_torch']:.3f} | {t['fwd_ours']:.3f} | {row['forward_ratio']:.2f}x | "
                f"{t['bwd_torch']:.3f} | {t['bwd_fast']:.3f} | {row['backward_ratio']:.2f}x | {t['bwd_det']:.3f} | "
                f"{row['deterministic_over_fast']:.2f} | {t['bwd_torch_dx']:.3f} / {t['bwd_fast_dx']:.3f} / "
                f"{t['bwd_det_dx']:.3f} | {t['bwd_torch_dgrid']:.3f} / {t['bwd_fast_dgrid']:.3f} | "
                f"{row['cold_ms']['bwd_fast']:.0f} | {row['forward_bandwidth_fraction']:.0%} / "
                f"{row['backward_bandwidth_fraction']:.0%} |"
            )
        if "summary" in report:
            summary = report["summary"]
            lines.append(
                f"| geometric mean (against PyTorch) | | | {summary['forward_ratio']:.2f}x | | | "
                f"{summary['backward_ratio']:.2f}x | | {summary['deterministic_over_fast']:.2f} | | | | |"
            )
        lines.append(
            "times in ms (medians); bicubic rows time our bilinear in the PyTorch columns; warp rows time "
            "gs.warp3d against PyTorch's grid plumbing + grid_sample (dx / dgrid: d volume / d displacement)"
        )
    if "correctness" in report:
        result = report["correctness"]
        lines += [
            "",
            f"correctness: {result['checked'] - len(result['failures'])}/{result['checked']} runs pass "
            f"({result.get('check_done', 'running')} cases)",
        ]
    if "determinism" in report:
        lines += ["", f"determinism: {report['determinism']}"]
    if report.get("registers"):
        lines += ["", "| kernel | num_warps | registers | spills |", "| --- | ---: | ---: | ---: |"]
        lines += [
            f"| {k['kernel']} | {k['num_warps']} | {k['registers']} | {k['spills']} |" for k in report["registers"]
        ]
    if report.get("tuning"):
        lines += [
            "",
            "| tuned launch (kernel, dtype, layout, channels) | chosen | candidates (ms) |",
            "| --- | --- | --- |",
        ]
        for tuned in report["tuning"]:
            times = "; ".join(f"{candidate['shape']}: {candidate['ms']}" for candidate in tuned["candidates"])
            lines.append(f"| {', '.join(tuned['key'])} | {tuned['chosen']} | {times} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/gpu")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every case's edge sizes by this")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds after which no new work starts")
    parser.add_argument("--cases", help="comma-separated names of the speed cases to run (default: all)")
    parser.add_argument("--device", default="cuda", help="cuda; cpu only for a dry run under TRITON_INTERPRET=1")
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        log("gpu_check: no CUDA device here; nothing to check")
        return 2
    run = Run(Path(args.out), args.budget)
    phase_machine(run)
    names = [name.strip() for name in args.cases.split(",")] if args.cases else [case.name for case in GPU_SUITE]
    unknown = set(names) - {case.name for case in GPU_SUITE}
    if unknown:
        parser.error(f"unknown case(s) {', '.join(sorted(unknown))}; known: {', '.join(c.name for c in GPU_SUITE)}")
    # Speed leaves a quarter of the budget to the rest; correctness leaves the determinism phase its time.
    phase_speed(run, [case for case in GPU_SUITE if case.name in names], args.scale, reserve=args.budget / 4)
    phase_registers(run)
    phase_correctness(run, reserve=min(20.0, args.budget / 10))
    phase_determinism(run, args.scale)
    run.save()
    log(markdown(run.report))
    log(f"gpu_check finished in {time.perf_counter() - run.started:.0f} s")
    failed = (
        bool(run.report["correctness"]["failures"])
        or not run.report.get("determinism", {}).get("deterministic_bitwise", True)
        or any("error" in row for row in run.report.get("speed", []))
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
