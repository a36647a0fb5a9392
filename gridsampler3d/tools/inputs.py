"""Deterministic built-in inputs: a 3-D phantom, sampling grids, and the default ``run`` case.

Shared by the command line, the benchmarks and the tests, so that they all see the same data.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "phantom",
    "identity_grid",
    "smooth_displacement",
    "warp_grid",
    "random_affine_grid",
    "uniform_grid",
    "default_case",
]

# Ellipsoids of the phantom: centre (z, y, x) and radii as fractions of the volume, intensity, label.
_STRUCTURES = (
    ((0.50, 0.50, 0.50), (0.42, 0.38, 0.33), 0.35, 1),  # body
    ((0.50, 0.42, 0.50), (0.30, 0.24, 0.24), 0.65, 2),  # organ
    ((0.45, 0.40, 0.40), (0.12, 0.07, 0.05), 0.15, 3),  # left cavity
    ((0.45, 0.40, 0.60), (0.12, 0.07, 0.05), 0.15, 3),  # right cavity
    ((0.62, 0.62, 0.50), (0.08, 0.08, 0.08), 1.00, 4),  # dense nodule
    ((0.35, 0.68, 0.42), (0.05, 0.09, 0.06), 0.85, 5),  # small structure
)


def phantom(size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """A deterministic anatomical-style phantom: ``(volume, labels)``, each (size, size, size).

    Nested ellipsoids with distinct intensities (float32 in [0, 1]) plus a gentle smooth
    texture; ``labels`` (int64) numbers the structures, 0 being background.
    """
    axis = (np.arange(size) + 0.5) / size
    z, y, x = np.meshgrid(axis, axis, axis, indexing="ij")
    volume = np.zeros((size, size, size), dtype=np.float64)
    labels = np.zeros((size, size, size), dtype=np.int64)
    for (cz, cy, cx), (rz, ry, rx), intensity, label in _STRUCTURES:
        inside = ((z - cz) / rz) ** 2 + ((y - cy) / ry) ** 2 + ((x - cx) / rx) ** 2 <= 1.0
        volume[inside] = intensity
        labels[inside] = label
    texture = 0.05 * np.sin(6.0 * np.pi * x) * np.cos(4.0 * np.pi * y) * np.sin(5.0 * np.pi * z)
    volume = np.where(labels > 0, volume + texture, volume)
    return volume.astype(np.float32), labels


def identity_grid(batch: int, size, align_corners: bool = False, dtype=torch.float32) -> torch.Tensor:
    """The grid that samples every voxel centre of a volume of ``size`` (D, H, W): (N, D, H, W, 3)."""
    depth, height, width = (size,) * 3 if isinstance(size, int) else size
    eye = torch.eye(3, 4, dtype=torch.float64).expand(batch, 3, 4)
    grid = F.affine_grid(eye, [batch, 1, depth, height, width], align_corners=align_corners)
    return grid.to(dtype)


def smooth_displacement(
    batch: int, size, magnitude: float = 0.08, coarse: int = 5, seed: int = 0, dtype=torch.float32
) -> torch.Tensor:
    """A smooth random displacement in normalised units: (N, D, H, W, 3), |d| ≲ ``magnitude``.

    Random values on a ``coarse``³ lattice, upsampled trilinearly: low-frequency, as a
    registration warp is.
    """
    depth, height, width = (size,) * 3 if isinstance(size, int) else size
    generator = torch.Generator().manual_seed(seed)
    lattice = torch.randn(batch, 3, coarse, coarse, coarse, generator=generator, dtype=torch.float64)
    field = F.interpolate(lattice, size=(depth, height, width), mode="trilinear", align_corners=True)
    return (magnitude * field).permute(0, 2, 3, 4, 1).contiguous().to(dtype)


def warp_grid(
    batch: int, size, magnitude: float = 0.08, seed: int = 0, align_corners: bool = False, dtype=torch.float32
) -> torch.Tensor:
    """Identity plus a smooth random displacement: (N, D, H, W, 3)."""
    grid = identity_grid(batch, size, align_corners, torch.float64)
    grid = grid + smooth_displacement(batch, size, magnitude, seed=seed, dtype=torch.float64)
    return grid.to(dtype)


def random_affine_grid(
    batch: int, size, seed: int = 0, strength: float = 0.15, dtype=torch.float32, align_corners: bool = False
) -> torch.Tensor:
    """The grid of a random near-identity affine map (rotation, scale, shear, shift): (N, D, H, W, 3)."""
    depth, height, width = (size,) * 3 if isinstance(size, int) else size
    generator = torch.Generator().manual_seed(seed)
    perturbation = strength * (2 * torch.rand(batch, 3, 4, generator=generator, dtype=torch.float64) - 1)
    theta = torch.eye(3, 4, dtype=torch.float64) + perturbation
    grid = F.affine_grid(theta, [batch, 1, depth, height, width], align_corners=align_corners)
    return grid.to(dtype)


def uniform_grid(
    batch: int, size, low: float = -1.1, high: float = 1.1, seed: int = 0, dtype=torch.float32
) -> torch.Tensor:
    """Independent uniform coordinates in [low, high]: (N, D, H, W, 3)."""
    depth, height, width = (size,) * 3 if isinstance(size, int) else size
    generator = torch.Generator().manual_seed(seed)
    grid = torch.rand(batch, depth, height, width, 3, generator=generator, dtype=torch.float64)
    return (low + (high - low) * grid).to(dtype)


def default_case(size: int = 64, dtype=np.float32) -> dict[str, np.ndarray]:
    """The built-in ``run`` case: a phantom warped by a smooth random grid.

    Returns NumPy arrays ``input`` (1, 1, S, S, S), ``grid`` (1, S, S, S, 3) and ``grad``
    (1, 1, S, S, S), where ``grad`` is the gradient of 0.5 * ||warped - phantom||² with
    respect to the warped volume, so the case is what one registration step computes.
    """
    from ..api import grid_sampler3d

    volume, _ = phantom(size)
    volume = volume[None, None].astype(dtype)
    grid = warp_grid(1, size, seed=1).numpy().astype(dtype)
    warped = grid_sampler3d(volume, grid)
    grad = (warped.astype(np.float64) - volume).astype(dtype)
    return {"input": volume, "grid": grid, "grad": grad}
