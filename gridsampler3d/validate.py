"""Input checks for the public API (docs/semantics.md, "Errors").

Each check raises one ``TypeError`` or ``ValueError`` whose message names the tensor, the
expected value and the actual one. Inputs may be torch tensors or NumPy arrays; the
checks see them through :func:`as_tensor`, which never copies a tensor.
"""

from __future__ import annotations

import numpy as np
import torch

from .modes import DataFormat, DisplacementFormat

__all__ = [
    "as_tensor",
    "check_forward",
    "check_backward",
    "check_warp",
    "check_warp_backward",
    "check_affine",
    "check_affine_backward",
    "check_deterministic",
    "DTYPES",
    "FLOAT_DTYPES",
]

#: The dtypes the operator takes, by the names the golden kit's files, the commands and the tables use.
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
FLOAT_DTYPES = tuple(DTYPES.values())
_NUMPY_FLOATS = (np.float16, np.float32, np.float64)


def as_tensor(value, name: str) -> torch.Tensor:
    """A torch tensor as is, or a NumPy float array as a tensor sharing its memory."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.type not in _NUMPY_FLOATS:
            raise TypeError(
                f"{name} must have a floating dtype (float16, float32 or float64 for NumPy arrays); got {value.dtype}"
            )
        try:
            return torch.from_numpy(value)
        except ValueError:
            # torch cannot view negative strides: take a copy instead.
            return torch.from_numpy(np.ascontiguousarray(value))
    raise TypeError(f"{name} must be a torch.Tensor or a numpy.ndarray; got {type(value).__name__}")


def _check_dtype(tensor: torch.Tensor, name: str) -> None:
    if tensor.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must have dtype float16, bfloat16, float32 or float64; got {tensor.dtype}")


def _check_5d(tensor: torch.Tensor, name: str, layout: str) -> None:
    if tensor.dim() != 5:
        raise ValueError(f"{name} must be 5-D {layout}; got {tensor.dim()}-D with shape {tuple(tensor.shape)}")


def _check_same(tensors: dict[str, torch.Tensor]) -> None:
    names = list(tensors)
    first = tensors[names[0]]
    for name in names[1:]:
        other = tensors[name]
        if other.dtype != first.dtype:
            raise TypeError(f"{name} must have the same dtype as {names[0]} ({first.dtype}); got {other.dtype}")
        if other.device != first.device:
            raise ValueError(f"{name} must be on the same device as {names[0]} ({first.device}); got {other.device}")


def _split_layout(shape, data_format: DataFormat):
    """(N, C, (D, H, W)) of a 5-D shape in the given layout."""
    if data_format == DataFormat.NCDHW:
        return shape[0], shape[1], tuple(shape[2:])
    return shape[0], shape[4], tuple(shape[1:4])


def _check_input_and_grid(input: torch.Tensor, grid: torch.Tensor, data_format: DataFormat) -> None:
    layout = "(N, C, D, H, W)" if data_format == DataFormat.NCDHW else "(N, D, H, W, C)"
    _check_5d(input, "input", layout)
    _check_5d(grid, "grid", "(N, Do, Ho, Wo, 3)")
    if grid.shape[-1] != 3:
        raise ValueError(f"grid's last dimension must be 3 (x, y, z); got shape {tuple(grid.shape)}")
    batch, _, spatial = _split_layout(input.shape, data_format)
    if grid.shape[0] != batch:
        raise ValueError(f"grid's batch size N must equal input's ({batch}); got {grid.shape[0]}")
    if 0 in spatial:
        raise ValueError(f"input's spatial sizes (D, H, W) must be non-zero; got {spatial}")


def check_forward(input, grid, data_format: DataFormat):
    """Validate forward operands; returns them as tensors ``(input, grid)``."""
    input, grid = as_tensor(input, "input"), as_tensor(grid, "grid")
    for tensor, name in ((input, "input"), (grid, "grid")):
        _check_dtype(tensor, name)
    _check_same({"input": input, "grid": grid})
    _check_input_and_grid(input, grid, data_format)
    return input, grid


def check_backward(grad, input, grid, data_format: DataFormat):
    """Validate backward operands; returns them as tensors ``(grad, input, grid)``."""
    grad, input, grid = as_tensor(grad, "grad"), as_tensor(input, "input"), as_tensor(grid, "grid")
    for tensor, name in ((grad, "grad"), (input, "input"), (grid, "grid")):
        _check_dtype(tensor, name)
    _check_same({"input": input, "grad": grad, "grid": grid})
    _check_input_and_grid(input, grid, data_format)
    layout = "(N, C, Do, Ho, Wo)" if data_format == DataFormat.NCDHW else "(N, Do, Ho, Wo, C)"
    _check_5d(grad, "grad", layout)
    grad_batch, grad_channels, grad_spatial = _split_layout(grad.shape, data_format)
    _, channels, _ = _split_layout(input.shape, data_format)
    if grad_batch != input.shape[0]:
        raise ValueError(f"grad's batch size N must equal input's ({input.shape[0]}); got {grad_batch}")
    if grad_channels != channels:
        raise ValueError(f"grad's channel count C must equal input's ({channels}); got {grad_channels}")
    if grad_spatial != tuple(grid.shape[1:4]):
        raise ValueError(
            f"grad's spatial sizes (Do, Ho, Wo) must equal grid's {tuple(grid.shape[1:4])}; got {grad_spatial}"
        )
    return grad, input, grid


def _check_volume_and_displacement(
    volume: torch.Tensor, displacement: torch.Tensor, data_format: DataFormat, displacement_format: DisplacementFormat
) -> None:
    layout = "(N, C, D, H, W)" if data_format == DataFormat.NCDHW else "(N, D, H, W, C)"
    _check_5d(volume, "volume", layout)
    shape = tuple(displacement.shape)
    if displacement_format == DisplacementFormat.N3DHW:
        _check_5d(displacement, "displacement", "(N, 3, D, H, W)")
        components, batch, spatial = shape[1], shape[0], shape[2:]
    else:
        _check_5d(displacement, "displacement", "(N, D, H, W, 3)")
        components, batch, spatial = shape[4], shape[0], shape[1:4]
    if components != 3:
        where = "dimension 1" if displacement_format == DisplacementFormat.N3DHW else "last dimension"
        raise ValueError(
            f"displacement's {where} must be 3 (dz, dy, dx) for displacement_format "
            f"{displacement_format.value!r}; got shape {shape}"
        )
    volume_batch, _, volume_spatial = _split_layout(volume.shape, data_format)
    if batch != volume_batch:
        raise ValueError(f"displacement's batch size N must equal volume's ({volume_batch}); got {batch}")
    if tuple(spatial) != tuple(volume_spatial):
        raise ValueError(
            f"displacement's spatial sizes (D, H, W) must equal volume's {tuple(volume_spatial)} "
            f"(it displaces each voxel of the output); got {tuple(spatial)}"
        )
    if 0 in volume_spatial:
        raise ValueError(f"volume's spatial sizes (D, H, W) must be non-zero; got {tuple(volume_spatial)}")


def check_warp(volume, displacement, data_format: DataFormat, displacement_format: DisplacementFormat):
    """Validate the fused warp's operands; returns them as tensors ``(volume, displacement)``."""
    volume, displacement = as_tensor(volume, "volume"), as_tensor(displacement, "displacement")
    for tensor, name in ((volume, "volume"), (displacement, "displacement")):
        _check_dtype(tensor, name)
    _check_same({"volume": volume, "displacement": displacement})
    _check_volume_and_displacement(volume, displacement, data_format, displacement_format)
    return volume, displacement


def check_warp_backward(grad, volume, displacement, data_format: DataFormat, displacement_format: DisplacementFormat):
    """Validate the fused warp's backward operands; returns them as tensors ``(grad, volume, displacement)``."""
    grad = as_tensor(grad, "grad")
    volume, displacement = check_warp(volume, displacement, data_format, displacement_format)
    _check_dtype(grad, "grad")
    _check_same({"volume": volume, "grad": grad})
    layout = "(N, C, D, H, W)" if data_format == DataFormat.NCDHW else "(N, D, H, W, C)"
    _check_5d(grad, "grad", layout)
    if tuple(grad.shape) != tuple(volume.shape):
        raise ValueError(
            f"grad's shape must equal volume's {tuple(volume.shape)} (the warped output has the "
            f"volume's shape); got {tuple(grad.shape)}"
        )
    return grad, volume, displacement


def check_size(size, default) -> tuple[int, int, int]:
    """The output size (Do, Ho, Wo): ``size`` as three positive ints, or ``default`` where None (a shape's sizes as
    they are: symbolic while torch.export traces dynamic sizes)."""
    if size is None:
        return tuple(default)
    try:
        values = tuple(size)
    except TypeError:
        raise TypeError(f"size must be (Do, Ho, Wo), three ints; got {type(size).__name__} {size!r}") from None
    if len(values) != 3 or not all(
        isinstance(value, (int, np.integer)) and not isinstance(value, bool) for value in values
    ):
        raise TypeError(f"size must be (Do, Ho, Wo), three ints; got {size!r}")
    if min(values) < 1:
        raise ValueError(f"size (Do, Ho, Wo) must be positive; got {tuple(int(value) for value in values)}")
    return tuple(int(value) for value in values)


def check_affine(volume, theta, size, displacement, data_format: DataFormat, displacement_format: DisplacementFormat):
    """Validate an affine sampling's operands; returns ``(volume, theta, size, displacement)`` (tensors, the output
    size (Do, Ho, Wo) (by default the volume's), and the displacement or None)."""
    volume, theta = as_tensor(volume, "volume"), as_tensor(theta, "theta")
    layout = "(N, C, D, H, W)" if data_format == DataFormat.NCDHW else "(N, D, H, W, C)"
    _check_5d(volume, "volume", layout)
    for tensor, name in ((volume, "volume"), (theta, "theta")):
        _check_dtype(tensor, name)
    _check_same({"volume": volume, "theta": theta})
    batch, _, spatial = _split_layout(volume.shape, data_format)
    if 0 in spatial:
        raise ValueError(f"volume's spatial sizes (D, H, W) must be non-zero; got {tuple(spatial)}")
    if tuple(theta.shape) != (batch, 3, 4):
        raise ValueError(
            f"theta must be (N, 3, 4) with volume's N ({batch}), as F.affine_grid takes it; "
            f"got shape {tuple(theta.shape)}"
        )
    size = check_size(size, spatial)
    if displacement is None:
        return volume, theta, size, None
    displacement = as_tensor(displacement, "displacement")
    _check_dtype(displacement, "displacement")
    _check_same({"volume": volume, "displacement": displacement})
    expected = (batch, 3, *size) if displacement_format == DisplacementFormat.N3DHW else (batch, *size, 3)
    if tuple(displacement.shape) != expected:
        raise ValueError(
            f"displacement must be {expected} for displacement_format {displacement_format.value!r} "
            f"(N of the volume, the output size {size}); got shape {tuple(displacement.shape)}"
        )
    return volume, theta, size, displacement


def check_affine_backward(
    grad, volume, theta, size, displacement, data_format: DataFormat, displacement_format: DisplacementFormat
):
    """Validate an affine sampling's backward operands; returns ``(grad, volume, theta, size, displacement)``."""
    volume, theta, size, displacement = check_affine(
        volume, theta, size, displacement, data_format, displacement_format
    )
    grad = as_tensor(grad, "grad")
    _check_dtype(grad, "grad")
    _check_same({"volume": volume, "grad": grad})
    batch, channels, _ = _split_layout(volume.shape, data_format)
    expected = (batch, channels, *size) if data_format == DataFormat.NCDHW else (batch, *size, channels)
    if tuple(grad.shape) != expected:
        raise ValueError(f"grad's shape must be the output's {expected}; got {tuple(grad.shape)}")
    return grad, volume, theta, size, displacement


def check_deterministic(value) -> bool | None:
    """``deterministic`` is None (follow torch's flag) or a bool."""
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(f"deterministic must be None or a bool; got {type(value).__name__} {value!r}")
