"""Time the suite against PyTorch in the same process; write a table, JSON and a plot."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from ... import __version__, affine, api
from ...modes import parse_interpolation, parse_padding
from ...nn import Warp3d, affine_warp, bspline_warp
from .dense import DenseBSpline
from .suite import BenchCase, bspline_grid, build_inputs, select_cases

__all__ = [
    "run_suite",
    "machine_info",
    "write_plot",
    "format_table",
    "write_json",
]


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _run_seconds(function, device: str) -> float:
    """Seconds one call of ``function`` takes: wall time on the CPU; on a GPU, CUDA events on
    its stream around the call (the work it queued, not the Python around it), then a sync."""
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3
    begin = time.perf_counter()
    function()
    return time.perf_counter() - begin


def time_call(function, device="cpu", warmup=2, repeats=7, min_seconds=0.0) -> dict:
    """Median time of ``function()`` after ``warmup`` calls, over at least ``repeats`` runs (see _run_seconds)."""
    for _ in range(warmup):
        function()
    _synchronize(device)
    times = []
    started = time.perf_counter()
    while len(times) < repeats or time.perf_counter() - started < min_seconds:
        times.append(_run_seconds(function, device))
    times.sort()
    return {"median_s": statistics.median(times), "min_s": times[0], "max_s": times[-1], "runs": len(times)}


def _read_status(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _release_free_memory() -> None:
    """Hand freed memory back to the OS (the CPU engine's cached outputs, then glibc's heap), so that a new
    allocation shows in the peak."""
    from ...cpu import buffers

    buffers.release()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_memory(function) -> int | None:
    """Bytes by which one call of ``function`` raises the process's resident peak (Linux), or None."""
    _release_free_memory()
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # reset the peak resident set size to the current one
    except OSError:
        return None
    baseline = _read_status("VmRSS")
    function()
    peak = _read_status("VmHWM")
    if baseline is None or peak is None:
        return None
    return max(0, peak - baseline)


def machine_info(device: str = "cpu") -> dict:
    """Where and with what the numbers were taken."""
    import numba
    import numpy

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": device,
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "numba": numba.__version__,
            "numpy": numpy.__version__,
            "gridsampler3d": __version__,
        },
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def plumbed_grid(displacement, align_corners: bool):
    """The grid registration code builds from a displacement (N, 3, D, H, W), (dz, dy, dx) in voxels:
    identity + displacement, normalised per axis, stacked as (x, y, z): (N, D, H, W, 3)."""
    sizes = displacement.shape[2:]
    axes = [torch.arange(size, device=displacement.device, dtype=displacement.dtype) for size in sizes]
    position = torch.stack(torch.meshgrid(*axes, indexing="ij")).unsqueeze(0) + displacement
    normalised = [
        2 * position[:, axis] / max(size - 1, 1) - 1 if align_corners else (2 * position[:, axis] + 1) / size - 1
        for axis, size in enumerate(sizes)
    ]
    return torch.stack(normalised[::-1], dim=-1)


def plumbed_warp(volume, displacement, mode: str, padding: str, align_corners: bool):
    """PyTorch's registration step as VoxelMorph and MONAI write it: :func:`plumbed_grid`, then ``F.grid_sample``."""
    return torch.nn.functional.grid_sample(
        volume, plumbed_grid(displacement, align_corners), mode, padding, align_corners
    )


def _bench_warp_case(case: BenchCase, device: str, repeats: int, scale: float) -> dict:
    """The registration step: forward, backward (to both inputs) and the whole step, ours (Warp3d) and PyTorch's."""
    (grad, volume, displacement), _ = build_inputs(case, device, scale)
    warp = Warp3d(case.mode, case.padding, case.align_corners)

    def plumbed(v, d):
        return plumbed_warp(v, d, case.mode, case.padding, case.align_corners)

    leaves = (volume.clone().requires_grad_(), displacement.clone().requires_grad_())

    def step(function):
        def run():
            output = function(*leaves)
            return torch.autograd.grad(output, leaves, grad)

        return run

    def forward(function):
        def run():
            with torch.no_grad():
                return function(volume, displacement)

        return run

    def backward(function):
        output = function(*leaves)  # one graph, its backward timed again and again

        def run():
            return torch.autograd.grad(output, leaves, grad, retain_graph=True)

        return run

    result = {"case": case.describe(), "in_size": volume.shape[2]}
    for stage, make in (("forward", forward), ("backward", backward), ("step", step)):
        torch_time = time_call(make(plumbed), device, repeats=repeats)
        our_time = time_call(make(warp), device, repeats=repeats)
        result[stage] = {"torch": torch_time, "ours": our_time, "ratio": torch_time["median_s"] / our_time["median_s"]}
    if device == "cpu":
        result["step"]["peak_bytes"] = {"torch": peak_memory(step(plumbed)), "ours": peak_memory(step(warp))}
        result["backward"]["peak_bytes"] = result["step"]["peak_bytes"]
    return result


def _bench_affine_case(case: BenchCase, device: str, repeats: int, scale: float) -> dict:
    """The affine field against ``F.affine_grid`` + ``F.grid_sample``: the forward (no gradient), and a registration
    step: the MSE to a fixed image, its gradient to theta (and to the displacement, where the case has one)."""
    (grad, volume, theta), _ = build_inputs(case, device, scale)
    theta = theta.to(volume.dtype)
    size = tuple(grad.shape[2:])
    displacement = None
    if case.grid_kind == "theta+displacement":
        displacement = build_inputs(dataclasses.replace(case, grid_kind="displacement"), device, scale)[0][2]

    def explicit(v, t, d):
        grid = affine.explicit_grid(t, size, case.align_corners, tuple(v.shape[2:]), d)
        return torch.nn.functional.grid_sample(v, grid, case.mode, case.padding, case.align_corners)

    def fused(v, t, d):
        return affine_warp(
            v, t, size, displacement=d, mode=case.mode, padding_mode=case.padding, align_corners=case.align_corners
        )

    theta_leaf = theta.clone().requires_grad_()
    displacement_leaf = None if displacement is None else displacement.clone().requires_grad_()
    return _time_field(
        case, device, repeats, (explicit, fused), volume, (theta, displacement), (theta_leaf, displacement_leaf), grad
    )


def _time_field(case, device, repeats, methods, volume, fields, leaves, fixed) -> dict:
    """A fused field against its explicit path, ``methods`` (explicit, fused), each called as ``method(volume,
    *field)``: the forward on ``fields`` (no gradient), and a registration step on ``leaves``: the MSE to the
    fixed image ``fixed``, its gradient to each leaf that is not None; the step's peak memory on the CPU."""
    wanted = [leaf for leaf in leaves if leaf is not None]

    def step(function):
        def run():
            return torch.autograd.grad(torch.nn.functional.mse_loss(function(volume, *leaves), fixed), wanted)

        return run

    def forward(function):
        def run():
            with torch.no_grad():
                return function(volume, *fields)

        return run

    explicit, fused = methods
    result = {"case": case.describe(), "in_size": volume.shape[2]}
    for stage, make in (("forward", forward), ("step", step)):
        torch_time = time_call(make(explicit), device, repeats=repeats)
        our_time = time_call(make(fused), device, repeats=repeats)
        result[stage] = {"torch": torch_time, "ours": our_time, "ratio": torch_time["median_s"] / our_time["median_s"]}
    result["backward"] = result["step"]
    if device == "cpu":
        result["step"]["peak_bytes"] = {"torch": peak_memory(step(explicit)), "ours": peak_memory(step(fused))}
    return result


def _bench_bspline_case(case: BenchCase, device: str, repeats: int, scale: float) -> dict:
    """The B-spline field against its dense field in torch then ``F.grid_sample`` (:class:`.dense.DenseBSpline`): the
    forward (no gradient), and a registration step: the MSE to a fixed image, its gradient to the control points."""
    (grad, volume, control_points), _ = build_inputs(case, device, scale)
    size = tuple(grad.shape[2:])
    control_sizes, spacing, origin = bspline_grid(case, size)
    sampling = dict(mode=case.mode, padding_mode=case.padding, align_corners=case.align_corners)
    dense = DenseBSpline(size, control_sizes, spacing, origin, dtype=volume.dtype, **sampling)
    if device != "cpu":
        dense.bases = [basis.to(device) for basis in dense.bases]
        dense.identity, dense.scale, dense.shift = (t.to(device) for t in (dense.identity, dense.scale, dense.shift))

    def fused(v, c):
        return bspline_warp(v, c, size, spacing=spacing, origin=origin, **sampling)

    leaf = control_points.clone().requires_grad_()
    return _time_field(case, device, repeats, (dense, fused), volume, (control_points,), (leaf,), grad)


def _plans(case: BenchCase, device: str, scale: float) -> dict:
    """The engine's plan for the case's forward and backward on ``device`` (:func:`gridsampler3d.explain`), as text."""
    (grad, x, field), _ = build_inputs(case, device, scale)
    extra = {}
    if case.baseline == "affine":
        field, kind = field.to(x.dtype), "affine"
    elif case.baseline == "dense":
        field, kind = field.to(x.dtype), "bspline"
        _, spacing, origin = bspline_grid(case, tuple(grad.shape[2:]))
        # the step's backward: the control points' gradient alone
        extra = dict(size=tuple(grad.shape[2:]), spacing=spacing, origin=origin, output_mask=(False, True, False))
    else:
        kind = "displacement" if case.baseline == "plumbing" else "grid"
    attributes = dict(
        interpolation_mode=case.mode,
        padding_mode=case.padding,
        align_corners=case.align_corners,
        data_format=case.layout,
        field_kind=kind,
        **extra,
    )
    return {
        "forward": str(api.explain(x, field, **attributes)),
        "backward": str(api.explain(x, field, grad, **attributes)),
    }


def _bench_case(case: BenchCase, device: str, backend: str, repeats: int, scale: float) -> dict:
    if case.baseline == "plumbing":
        return _bench_warp_case(case, device, repeats, scale)
    if case.baseline == "affine":
        return _bench_affine_case(case, device, repeats, scale)
    if case.baseline == "dense":
        return _bench_bspline_case(case, device, repeats, scale)
    (grad, x, grid), (grad_ncdhw, x_ncdhw) = build_inputs(case, device, scale)
    codes = (int(parse_interpolation(case.mode)), int(parse_padding(case.padding)), case.align_corners)
    attributes = dict(
        interpolation_mode=case.mode,
        padding_mode=case.padding,
        align_corners=case.align_corners,
        data_format=case.layout,
        backend=backend,
    )
    if case.baseline == "bilinear":
        baseline = dict(attributes, interpolation_mode="bilinear")
        theirs_forward = lambda: api.grid_sampler3d(x, grid, **baseline)  # noqa: E731
        theirs_backward = lambda: api.grid_sampler3d_backward(grad, x, grid, **baseline)  # noqa: E731
    else:
        theirs_forward = lambda: torch.ops.aten.grid_sampler_3d(x_ncdhw, grid, *codes)  # noqa: E731
        theirs_backward = lambda: torch.ops.aten.grid_sampler_3d_backward(  # noqa: E731
            grad_ncdhw, x_ncdhw, grid, *codes, [True, True]
        )
    calls = {
        "forward": (theirs_forward, lambda: api.grid_sampler3d(x, grid, **attributes)),
        "backward": (theirs_backward, lambda: api.grid_sampler3d_backward(grad, x, grid, **attributes)),
    }
    result = {"case": case.describe(), "in_size": x.shape[2] if case.layout == "NCDHW" else x.shape[1]}
    for stage, (theirs, ours) in calls.items():
        torch_time = time_call(theirs, device, repeats=repeats)
        our_time = time_call(ours, device, repeats=repeats)
        result[stage] = {"torch": torch_time, "ours": our_time, "ratio": torch_time["median_s"] / our_time["median_s"]}
        if device == "cpu":
            result[stage]["peak_bytes"] = {"torch": peak_memory(theirs), "ours": peak_memory(ours)}
    return result


def _geomean(values) -> float:
    """The geometric mean of the ratios; NaN for none (a run of bicubic cases only)."""
    values = list(values)
    return statistics.geometric_mean(values) if values else float("nan")


def run_suite(
    names=None, device="cpu", backend="auto", repeats=7, threads=None, scale=1.0, echo=print, explain=False
) -> dict:
    """Run the cases (all by default); returns the report (machine, results, summary).

    With ``explain`` each result holds, and the echo prints under its row, the CPU
    engine's plan for its forward and backward (:func:`gridsampler3d.explain`).
    """
    if threads is not None:
        torch.set_num_threads(threads)
    selected = select_cases(names)
    echo(
        f"gridsampler3d bench: {len(selected)} case(s) on {device}, {torch.get_num_threads()} thread(s), "
        f"backend {backend}, median of {repeats} after warm-up"
    )
    echo(format_header())
    results = []
    for case in selected:
        result = _bench_case(case, device, backend, repeats, scale)
        results.append(result)
        echo(format_row(result))
        if explain:
            result["plan"] = _plans(case, device, scale)
            for stage, plan in result["plan"].items():
                echo(f"    {stage} plan: {plan}")
    against_torch = [r for r in results if r["case"]["baseline"] == "torch"]
    summary = {
        stage: {
            "geomean_ratio": _geomean(r[stage]["ratio"] for r in against_torch),
            "min_ratio": min((r[stage]["ratio"] for r in against_torch), default=float("nan")),
        }
        for stage in ("forward", "backward")
    }
    if against_torch:
        echo(
            f"geometric mean ratio against PyTorch: forward {summary['forward']['geomean_ratio']:.2f}x, "
            f"backward {summary['backward']['geomean_ratio']:.2f}x "
            f"(lowest: {summary['forward']['min_ratio']:.2f}x / {summary['backward']['min_ratio']:.2f}x)"
        )
    for result in results:
        if result["case"]["baseline"] in ("plumbing", "affine", "dense"):
            echo(format_step(result))
    if any(r["case"]["baseline"] == "bilinear" for r in results):
        echo(
            "bicubic rows: the 'torch' columns time this library's bilinear on the same inputs; "
            "ratio = bilinear time / bicubic time"
        )
    return {
        "machine": machine_info(device),
        "backend": backend,
        "repeats": repeats,
        "scale": scale,
        "results": results,
        "summary": summary,
    }


def format_header() -> str:
    return (
        f"{'case':<8} {'fwd torch':>10} {'fwd ours':>9} {'ratio':>6}  {'bwd torch':>10} {'bwd ours':>9} "
        f"{'ratio':>6}  {'bwd peak MB torch/ours':>22}"
    )


def format_step(result: dict) -> str:
    """A step's line (the warp's: forward + backward to both inputs; the affine field's: the MSE's gradient to theta
    and any displacement), and its peak memory, PyTorch's against ours."""
    step = result["step"]
    peaks = step.get("peak_bytes", {})
    baseline = result["case"]["baseline"]
    if baseline == "plumbing":
        what = "Warp3d against PyTorch's grid plumbing + F.grid_sample, forward + backward to volume and displacement"
    elif baseline == "dense":
        what = (
            "bspline_warp against the dense field + F.grid_sample, MSE to a fixed image, gradient to the control points"
        )
    else:
        what = "affine_warp against F.affine_grid + F.grid_sample, MSE to a fixed image, gradient to theta" + (
            " and displacement" if "displacement" in result["case"]["grid_kind"] else ""
        )
    return (
        f"{result['case']['name']} step ({what}): {step['torch']['median_s'] * 1e3:.1f} ms / "
        f"{step['ours']['median_s'] * 1e3:.1f} ms = {step['ratio']:.2f}x; peak memory "
        f"{_megabytes(peaks.get('torch'))} MB / {_megabytes(peaks.get('ours'))} MB"
    )


def _megabytes(value) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def format_row(result: dict) -> str:
    forward, backward = result["forward"], result["backward"]
    peaks = backward.get("peak_bytes", {})
    peak = f"{_megabytes(peaks.get('torch'))}/{_megabytes(peaks.get('ours'))}"
    marker = {
        "torch": "",
        "bilinear": "  (vs our bilinear)",
        "plumbing": "  (Warp3d vs plumbing + grid_sample)",
        "affine": "  (affine_warp vs affine_grid + grid_sample; backward: the step)",
        "dense": "  (bspline_warp vs dense field + grid_sample; backward: the step)",
    }[result["case"]["baseline"]]
    return (
        f"{result['case']['name']:<8} {forward['torch']['median_s'] * 1e3:8.1f}ms "
        f"{forward['ours']['median_s'] * 1e3:7.1f}ms {forward['ratio']:5.2f}x  "
        f"{backward['torch']['median_s'] * 1e3:8.1f}ms {backward['ours']['median_s'] * 1e3:7.1f}ms "
        f"{backward['ratio']:5.2f}x  {peak:>22}{marker}"
    )


def _markdown_rows(results) -> list[str]:
    rows = []
    for result in results:
        f, b = result["forward"], result["backward"]
        rows.append(
            f"| {result['case']['name']} | {f['torch']['median_s'] * 1e3:.1f} ms | "
            f"{f['ours']['median_s'] * 1e3:.1f} ms | {f['ratio']:.2f}x | {b['torch']['median_s'] * 1e3:.1f} ms"
            f" | {b['ours']['median_s'] * 1e3:.1f} ms | {b['ratio']:.2f}x |"
        )
    return rows


def format_table(report: dict) -> str:
    """The report as Markdown tables (``--markdown``, BENCHMARKS.md): cases against PyTorch, then bicubic against
    bilinear, then the warp step, then the affine field, then the B-spline field."""
    against_torch = [r for r in report["results"] if r["case"]["baseline"] == "torch"]
    bicubic = [r for r in report["results"] if r["case"]["baseline"] == "bilinear"]
    warps = [r for r in report["results"] if r["case"]["baseline"] == "plumbing"]
    lines = []
    if against_torch:
        summary = report["summary"]
        lines += [
            "| case | forward PyTorch | forward ours | ratio | backward PyTorch | backward ours | ratio |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            *_markdown_rows(against_torch),
            f"| geometric mean | | | {summary['forward']['geomean_ratio']:.2f}x | | | "
            f"{summary['backward']['geomean_ratio']:.2f}x |",
        ]
    if bicubic:
        lines += [
            "" if lines else None,
            "| bicubic case | forward bilinear (ours) | forward bicubic | ratio | backward bilinear (ours) "
            "| backward bicubic | ratio |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            *_markdown_rows(bicubic),
        ]
    if warps:
        lines += [
            "" if lines else None,
            "| warp step | forward PyTorch | forward Warp3d | ratio | backward PyTorch | backward Warp3d | ratio "
            "| step PyTorch | step Warp3d | ratio | peak MB PyTorch / Warp3d |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for result, row in zip(warps, _markdown_rows(warps)):
            step = result["step"]
            peaks = step.get("peak_bytes", {})
            lines.append(
                f"{row} {step['torch']['median_s'] * 1e3:.1f} ms | {step['ours']['median_s'] * 1e3:.1f} ms"
                f" | {step['ratio']:.2f}x | {_megabytes(peaks.get('torch'))} / "
                f"{_megabytes(peaks.get('ours'))} |"
            )
    for baseline, header, ours in (
        ("affine", "| affine case | forward affine_grid + grid_sample", "affine_warp"),
        ("dense", "| B-spline case | forward dense field + grid_sample", "bspline_warp"),
    ):
        fields = [r for r in report["results"] if r["case"]["baseline"] == baseline]
        if not fields:
            continue
        lines += [
            "" if lines else None,
            f"{header} | forward {ours} | ratio | step PyTorch | step {ours} | ratio | step peak MB PyTorch / ours |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for result in fields:
            forward, step = result["forward"], result["step"]
            peaks = step.get("peak_bytes", {})
            lines.append(
                f"| {result['case']['name']} | {forward['torch']['median_s'] * 1e3:.1f} ms | "
                f"{forward['ours']['median_s'] * 1e3:.1f} ms | {forward['ratio']:.2f}x | "
                f"{step['torch']['median_s'] * 1e3:.1f} ms | {step['ours']['median_s'] * 1e3:.1f} ms | "
                f"{step['ratio']:.2f}x | {_megabytes(peaks.get('torch'))} / {_megabytes(peaks.get('ours'))} |"
            )
    return "\n".join(line for line in lines if line is not None)


def write_json(report: dict, path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2) + "\n")


def write_plot(report: dict, path) -> None:
    """A bar chart of the PyTorch / ours time ratios per case (against PyTorch), forward and backward."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [result for result in report["results"] if result["case"]["baseline"] == "torch"]
    names = [result["case"]["name"] for result in results]
    positions = range(len(names))
    figure, axes = plt.subplots(figsize=(max(6.0, 1.1 * len(names) + 2), 4.2))
    width = 0.38
    for shift, stage, colour in ((-width / 2, "forward", "#4c72b0"), (width / 2, "backward", "#dd8452")):
        ratios = [result[stage]["ratio"] for result in results]
        bars = axes.bar([p + shift for p in positions], ratios, width, label=stage, color=colour)
        axes.bar_label(bars, labels=[f"{r:.1f}" for r in ratios], fontsize=7, padding=1)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_yscale("log")
    ratio_labels = matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}x")
    axes.yaxis.set_major_formatter(ratio_labels)
    axes.yaxis.set_minor_formatter(ratio_labels)
    axes.set_xticks(list(positions), names)
    axes.set_ylabel("speed-up over PyTorch (time ratio)")
    machine = report["machine"]
    axes.set_title(
        f"gridsampler3d vs PyTorch {machine['versions']['torch']} on {machine['device']}, "
        f"{machine['threads']} thread(s)",
        fontsize=9,
    )
    axes.legend()
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
