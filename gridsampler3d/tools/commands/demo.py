"""The ``demo`` command: deformable registration of a phantom, every step through this library.

A fixed phantom (``inputs.phantom``, lightly smoothed) is warped by a known smooth random
deformation into the moving image. Adam then recovers a displacement field that warps the
moving image back onto the fixed one, minimising

    MSE(warp(moving, u), fixed) + smoothness_weight * mean squared finite differences of u

where ``u`` (1, 3, S, S, S), in voxels, is a coarse control lattice upsampled trilinearly,
and ``warp`` is ``Warp3d``, the fused warp: each step samples at identity + u in this
library's kernels, with no grid tensor, and gets d(loss)/du from them directly. Since
``u`` is linear between control points, its finite differences are taken on the lattice
(per voxel of the image), which spares a dozen full-size operations per step. The labels
of the structures, warped with nearest sampling, give the Dice overlap before and after.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ...cpu.compile_report import reporting_compiles
from ...nn import Warp3d
from .. import inputs
from .arguments import CliError, at_least, require_device, to_stderr

__all__ = ["run_demo", "dice_scores", "normalised_cross_correlation"]

SMOOTHING_SIGMA = 1.0  # voxels, of the Gaussian that softens the phantom's edges
TRUE_LATTICE = 4  # control points per axis of the known random deformation
TRUE_MAX_DISPLACEMENT = 0.15  # largest known displacement, as a fraction of the edge
CONTROL_SPACING = 4  # voxels between the control points being optimised
LEARNING_RATE = 0.25  # voxels per Adam step
SMOOTHNESS_WEIGHT = 0.005


def _gaussian_smooth(volume: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of (N, C, D, H, W), edges replicated; same shape."""
    radius = max(int(3 * sigma), 1)
    offsets = torch.arange(-radius, radius + 1, dtype=volume.dtype, device=volume.device)
    kernel = torch.exp(-(offsets**2) / (2 * sigma**2))
    kernel = kernel / kernel.sum()
    channels = volume.shape[1]
    for axis in range(3):
        shape = [channels, 1, 1, 1, 1]
        shape[2 + axis] = kernel.numel()
        padding = [0] * 6
        padding[2 * (2 - axis)] = padding[2 * (2 - axis) + 1] = radius  # F.pad lists the last axis first
        volume = F.conv3d(F.pad(volume, padding, mode="replicate"), kernel.view(shape), groups=channels)
    return volume


def _upsample(lattice: torch.Tensor, size: int) -> torch.Tensor:
    """Trilinear upsampling of a control lattice (N, 3, K, K, K) to (N, 3, S, S, S)."""
    return F.interpolate(lattice, size=(size,) * 3, mode="trilinear", align_corners=True)


def _known_displacement(size: int, seed: int, device: torch.device) -> torch.Tensor:
    """The seeded smooth random deformation, (1, 3, S, S, S) in voxels, max |u| = 15% of S."""
    generator = torch.Generator().manual_seed(seed)
    lattice = torch.randn(1, 3, TRUE_LATTICE, TRUE_LATTICE, TRUE_LATTICE, generator=generator)
    field = _upsample(lattice, size)
    field = field * (TRUE_MAX_DISPLACEMENT * size / field.norm(dim=1).max())
    return field.to(device)


def _smoothness(lattice: torch.Tensor, spacing: float) -> torch.Tensor:
    """Mean squared forward differences per voxel of a control lattice (N, 3, K, K, K)
    whose points lie ``spacing`` voxels apart, along each axis; a scalar."""
    return sum((lattice.diff(dim=axis) ** 2).mean() for axis in (2, 3, 4)) / spacing**2


def dice_scores(labels: torch.Tensor, reference: torch.Tensor, label_ids) -> list[float]:
    """Dice overlap per label id of two label volumes of one shape (values compared exactly)."""
    scores = []
    for label in label_ids:
        mine, theirs = labels == label, reference == label
        total = int(mine.sum()) + int(theirs.sum())
        scores.append(2.0 * int((mine & theirs).sum()) / total if total else 1.0)
    return scores


def normalised_cross_correlation(volume: torch.Tensor, reference: torch.Tensor) -> float:
    """Global NCC of two volumes of one shape, in [-1, 1] (1: equal up to gain and offset)."""
    a = volume.double().flatten() - volume.double().mean()
    b = reference.double().flatten() - reference.double().mean()
    return float((a @ b) / (a.norm() * b.norm()).clamp_min(1e-300))


def _progress_bar():
    try:
        from tqdm import tqdm
    except ImportError:
        raise RuntimeError(
            "the demo shows its progress with tqdm, which is not installed; pip install 'gridsampler3d[bench]'"
        ) from None
    return tqdm


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError(
            "the demo draws its figures with matplotlib, which is not installed; pip install 'gridsampler3d[bench]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _mid_slices(volume: np.ndarray) -> list[np.ndarray]:
    """Axial (H, W), coronal (D, W) and sagittal (D, H) mid slices of a (D, H, W) volume."""
    depth, height, width = volume.shape
    return [volume[depth // 2], volume[:, height // 2, :], volume[:, :, width // 2]]


def _write_slices(plt, path: Path, rows: dict, fixed_labels: np.ndarray) -> None:
    """A grid of mid slices: one row per entry of ``rows`` ((D, H, W) arrays), three views."""
    views = ("axial", "coronal", "sagittal")
    figure, axes = plt.subplots(len(rows), 3, figsize=(8.5, 2.8 * len(rows)), squeeze=False, layout="constrained")
    contours = _mid_slices(fixed_labels)
    for row, (title, volume) in enumerate(rows.items()):
        is_field = title.startswith("|u|")
        for column, (view, image) in enumerate(zip(views, _mid_slices(volume))):
            axis = axes[row, column]
            if is_field:
                shown = axis.imshow(image, cmap="magma", origin="lower", vmin=0, vmax=float(volume.max()) or 1.0)
            else:
                axis.imshow(image, cmap="gray", origin="lower", vmin=0, vmax=1)
                # Outlines of the fixed image's structures show the misalignment at a glance.
                axis.contour(
                    contours[column], levels=np.arange(0.5, fixed_labels.max() + 1), colors="red", linewidths=0.8
                )
            axis.set_xticks([])
            axis.set_yticks([])
            if row == 0:
                axis.set_title(view)
            if column == 0:
                axis.set_ylabel(title)
        if is_field:
            figure.colorbar(shown, ax=list(axes[row]), label="voxels")
    figure.suptitle("red: outlines of the fixed image's structures", fontsize=9)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _write_loss(plt, path: Path, losses: list[float], similarities: list[float]) -> None:
    figure, axes = plt.subplots(figsize=(6, 3.6))
    steps = np.arange(1, len(losses) + 1)
    axes.semilogy(steps, losses, label="loss (MSE + smoothness)")
    axes.semilogy(steps, similarities, label="MSE term", linestyle="--")
    axes.set_xlabel("Adam step")
    axes.set_ylabel("value")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def run_demo(
    size: int = 48,
    steps: int = 100,
    device: str = "cpu",
    out="out/demo",
    seed: int = 0,
    echo=print,
    progress: bool = True,
) -> dict:
    """Register a warped phantom back onto the original; write figures and a summary.

    Args:
        size: edge S of the (S, S, S) volumes, at least 8.
        steps: Adam steps, at least 1.
        device: "cpu" or "cuda" (any torch device string).
        out: folder for ``slices.png``, ``loss.png`` and ``summary.json`` (created).
        seed: seed of the known random deformation.
        echo: called with each line of the report.
        progress: draw a progress bar on stderr.

    Returns:
        The summary: ``dice_before`` / ``dice_after`` (mean over the structures),
        ``dice_per_label_*``, ``similarity_before`` / ``similarity_after`` (global NCC),
        ``mse_before`` / ``mse_after``, ``losses``, ``seconds`` and ``files``.
    """
    if size < 8:
        raise ValueError(f"size must be at least 8; got {size}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1; got {steps}")
    plt = _pyplot()
    device = torch.device(device)
    start = time.perf_counter()

    volume, labels = inputs.phantom(size)
    fixed = _gaussian_smooth(torch.from_numpy(volume)[None, None], SMOOTHING_SIGMA).to(device)
    fixed_labels = torch.from_numpy(labels).float()[None, None].to(device)
    label_ids = [int(label) for label in np.unique(labels) if label > 0]
    warp, warp_labels = Warp3d(), Warp3d(mode="nearest")
    with torch.no_grad():
        known = _known_displacement(size, seed, device)
        moving = warp(fixed, known)
        moving_labels = warp_labels(fixed_labels, known)

    lattice_size = max(size // CONTROL_SPACING, 2)
    spacing = (size - 1) / (lattice_size - 1)
    lattice = torch.zeros(1, 3, lattice_size, lattice_size, lattice_size, device=device, requires_grad=True)
    optimiser = torch.optim.Adam([lattice], lr=LEARNING_RATE)
    losses, mses = [], []
    progress_bar = _progress_bar()
    with progress_bar(total=steps, desc="registering", unit="step", file=sys.stderr, disable=not progress) as bar:
        for _ in range(steps):
            optimiser.zero_grad(set_to_none=True)
            displacement = _upsample(lattice, size)
            mse = F.mse_loss(warp(moving, displacement), fixed)
            loss = mse + SMOOTHNESS_WEIGHT * _smoothness(lattice, spacing)
            loss.backward()
            optimiser.step()
            losses.append(float(loss.detach()))
            mses.append(float(mse.detach()))
            bar.set_postfix(loss=f"{losses[-1]:.3e}", refresh=False)
            bar.update()

    with torch.no_grad():
        displacement = _upsample(lattice, size)
        warped = warp(moving, displacement)
        warped_labels = warp_labels(moving_labels, displacement)
    per_label_before = dice_scores(moving_labels, fixed_labels, label_ids)
    per_label_after = dice_scores(warped_labels, fixed_labels, label_ids)
    summary = {
        "size": size,
        "steps": steps,
        "device": str(device),
        "seed": seed,
        "dice_before": float(np.mean(per_label_before)),
        "dice_after": float(np.mean(per_label_after)),
        "dice_per_label_before": dict(zip(map(str, label_ids), per_label_before)),
        "dice_per_label_after": dict(zip(map(str, label_ids), per_label_after)),
        "similarity": "global normalised cross-correlation (1 is perfect)",
        "similarity_before": normalised_cross_correlation(moving, fixed),
        "similarity_after": normalised_cross_correlation(warped, fixed),
        "mse_before": float(F.mse_loss(moving, fixed)),
        "mse_after": float(F.mse_loss(warped, fixed)),
        "max_displacement_known": float(known.norm(dim=1).max()),
        "max_displacement_found": float(displacement.norm(dim=1).max()),
        "losses": losses,
    }

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {"slices": out / "slices.png", "loss": out / "loss.png", "summary": out / "summary.json"}
    rows = {"fixed": fixed, "moving": moving, "warped": warped, "|u| found": displacement.norm(dim=1, keepdim=True)}
    _write_slices(plt, files["slices"], {title: tensor[0, 0].cpu().numpy() for title, tensor in rows.items()}, labels)
    _write_loss(plt, files["loss"], losses, mses)
    summary["files"] = {name: str(path) for name, path in files.items()}
    summary["seconds"] = time.perf_counter() - start
    files["summary"].write_text(json.dumps(summary, indent=2) + "\n")

    echo(
        f"phantom {size}³ warped by a known smooth deformation (max {summary['max_displacement_known']:.1f} "
        f"voxels); {steps} Adam steps on {device}"
    )
    echo(f"{'':12} {'before':>8} {'after':>8}")
    echo(f"{'MSE':12} {summary['mse_before']:8.2e} {summary['mse_after']:8.2e}")
    echo(f"{'NCC':12} {summary['similarity_before']:8.4f} {summary['similarity_after']:8.4f}")
    echo(f"{'mean Dice':12} {summary['dice_before']:8.4f} {summary['dice_after']:8.4f}")
    for label, before, after in zip(label_ids, per_label_before, per_label_after):
        echo(f"{f'  label {label}':12} {before:8.4f} {after:8.4f}")
    echo(f"{summary['seconds']:.1f} s; wrote {', '.join(summary['files'].values())}")
    return summary


def add_command(commands) -> None:
    """Add ``demo`` to the command line's subcommands."""
    demo = commands.add_parser("demo", help="register a warped phantom through this library; figures and Dice")
    demo.add_argument("--size", type=at_least(8), default=48, help="edge of the phantom volume (default 48)")
    demo.add_argument("--steps", type=at_least(1), default=100, help="Adam steps (default 100)")
    demo.add_argument("--device", default="cpu", help="cpu or cuda")
    demo.add_argument("--seed", type=int, default=0, help="seed of the known random deformation (default 0)")
    demo.add_argument("--out", default="out/demo", help="folder for the PNGs and summary.json (default out/demo)")
    demo.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    require_device(args.device)
    if args.device == "cpu":
        to_stderr("a first run compiles the CPU kernels once, each named as it compiles")
    try:
        with reporting_compiles(to_stderr) as compiles:
            run_demo(size=args.size, steps=args.steps, device=args.device, out=args.out, seed=args.seed)
    except OSError as error:
        raise CliError(f"--out: cannot write to {args.out} ({error})") from None
    except (ValueError, RuntimeError) as error:
        raise CliError(str(error)) from None
    print(f"of that time: {compiles.summary()}")
    return 0
