"""Every check of a call's operands (docs/semantics.md, "Errors"): :func:`.call.parse_call` runs them, once.

Each check raises one ``TypeError`` or ``ValueError`` (``NotImplementedError`` for a tensor
on a device where no kernel runs) whose message names the argument, the expected value and
the actual one. Operands may be torch tensors or, for the operators, NumPy arrays, which
:func:`as_tensor` views as tensors without a copy. Nothing here writes to an operand. The
attributes' names and codes are parsed in :mod:`.modes`.
"""

from __future__ import annotations

import numpy as np
import torch

from .dtypes import FLOAT_DTYPES
from .modes import DataFormat, DisplacementFormat
from .sampling import FieldKind

__all__ = [
    "as_tensor",
    "check_backend",
    "check_bspline_grid",
    "check_control_points",
    "check_deterministic",
    "check_displacement",
    "check_grad",
    "check_grid",
    "check_runnable",
    "check_same",
    "check_size",
    "check_steps",
    "check_theta",
    "check_velocity",
    "check_volume",
    "check_device",
    "check_field_kind",
    "check_plan_device",
]

_NUMPY_FLOATS = (np.float16, np.float32, np.float64)


def as_tensor(value, name: str, arrays: bool = True) -> torch.Tensor:
    """A torch tensor as is, or (where ``arrays``) a NumPy float array as a tensor sharing its memory."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray) and arrays:
        if value.dtype.type not in _NUMPY_FLOATS:
            raise TypeError(
                f"{name} must have a floating dtype (float16, float32 or float64 for NumPy arrays); got {value.dtype}"
            )
        try:
            return torch.from_numpy(value)
        except ValueError:
            # torch cannot view negative strides: take a copy instead.
            return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, np.ndarray):
        raise TypeError(
            f"{name} must be a torch.Tensor (the differentiable functions take tensors; the operators "
            f"grid_sampler3d, warp3d and affine_warp3d take NumPy arrays too); got numpy.ndarray"
        )
    expected = "a torch.Tensor or a numpy.ndarray" if arrays else "a torch.Tensor"
    raise TypeError(f"{name} must be {expected}; got {type(value).__name__}")


def check_same(tensors: dict) -> None:
    """Each tensor of ``tensors`` (name: tensor) has a float dtype of the operator's, all share the first one's dtype
    and device."""
    first_name = first = None
    for name, tensor in tensors.items():
        if first is None:
            first_name, first = name, tensor
        if tensor.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must have dtype float16, bfloat16, float32 or float64; got {tensor.dtype}")
        if tensor.dtype != first.dtype:
            raise TypeError(f"{name} must have the same dtype as {first_name} ({first.dtype}); got {tensor.dtype}")
        if tensor.device != first.device:
            raise ValueError(f"{name} must be on the same device as {first_name} ({first.device}); got {tensor.device}")


def check_runnable(tensor: torch.Tensor, name: str, where: str) -> None:
    """A kernel can read ``tensor``: it is not a meta tensor (shapes without values)."""
    if tensor.device.type == "meta":
        raise NotImplementedError(
            f"{where}: {name} is a meta tensor, which holds no values for a kernel to read; call the "
            f"differentiable functions (grid_sample, warp, affine_warp) to get the output's shape, or "
            f"gridsampler3d.explain for the plan"
        )


def _check_5d(tensor: torch.Tensor, name: str, layout: str) -> None:
    if tensor.ndim != 5:
        raise ValueError(f"{name} must be 5-D {layout}; got {tensor.ndim}-D with shape {tuple(tensor.shape)}")


def _volume_layout(data_format: DataFormat) -> str:
    return "(N, C, D, H, W)" if data_format == DataFormat.NCDHW else "(N, D, H, W, C)"


def check_volume(volume: torch.Tensor, name: str, data_format: DataFormat) -> tuple:
    """The sampled volume is 5-D in ``data_format`` with non-zero spatial sizes; returns (N, C, (D, H, W))."""
    if volume.ndim != 5:
        _check_5d(volume, name, _volume_layout(data_format))
    shape = volume.shape
    if data_format == DataFormat.NCDHW:
        batch, channels, spatial = shape[0], shape[1], tuple(shape[2:])
    else:
        batch, channels, spatial = shape[0], shape[4], tuple(shape[1:4])
    if 0 in spatial:
        raise ValueError(f"{name}'s spatial sizes (D, H, W) must be non-zero; got {spatial}")
    return batch, channels, spatial


def check_grid(grid: torch.Tensor, batch: int, volume_name: str) -> None:
    """A grid is (N, Do, Ho, Wo, 3) with the volume's N."""
    if grid.ndim != 5:
        _check_5d(grid, "grid", "(N, Do, Ho, Wo, 3)")
    if grid.shape[-1] != 3:
        raise ValueError(f"grid's last dimension must be 3 (x, y, z); got shape {tuple(grid.shape)}")
    if grid.shape[0] != batch:
        raise ValueError(f"grid's batch size N must equal {volume_name}'s ({batch}); got {grid.shape[0]}")


def check_displacement(
    displacement: torch.Tensor, displacement_format: DisplacementFormat, batch: int, out_sizes: tuple, origin: str
) -> None:
    """A displacement is (N, 3, Do, Ho, Wo) or (N, Do, Ho, Wo, 3) as ``displacement_format`` says, with the
    volume's N and the output's sizes; ``origin`` says where those sizes come from, for the message."""
    shape = tuple(displacement.shape)
    n3dhw = displacement_format == DisplacementFormat.N3DHW
    if displacement.ndim != 5:
        _check_5d(displacement, "displacement", "(N, 3, D, H, W)" if n3dhw else "(N, D, H, W, 3)")
    if n3dhw:
        components, spatial, where = shape[1], shape[2:], "dimension 1"
    else:
        components, spatial, where = shape[4], shape[1:4], "last dimension"
    if components != 3:
        raise ValueError(
            f"displacement's {where} must be 3 (dz, dy, dx) for displacement_format "
            f"{displacement_format.value!r}; got shape {shape}"
        )
    if shape[0] != batch:
        raise ValueError(f"displacement's batch size N must equal volume's ({batch}); got {shape[0]}")
    if tuple(spatial) != tuple(out_sizes):
        raise ValueError(
            f"displacement's spatial sizes (D, H, W) must equal {origin} {tuple(out_sizes)} "
            f"(it displaces each voxel of the output); got {tuple(spatial)}"
        )


def check_control_points(control_points: torch.Tensor, batch: int) -> None:
    """A B-spline's control points are (N, 3, Kd, Kh, Kw), (dz, dy, dx), with the volume's N and at least
    :data:`.bspline.MIN_CONTROL_POINTS` points along each axis."""
    from .bspline import MIN_CONTROL_POINTS

    shape = tuple(control_points.shape)
    if control_points.ndim != 5:
        _check_5d(control_points, "control_points", "(N, 3, Kd, Kh, Kw)")
    if shape[1] != 3:
        raise ValueError(f"control_points' dimension 1 must be 3 (dz, dy, dx); got shape {shape}")
    if shape[0] != batch:
        raise ValueError(f"control_points' batch size N must equal volume's ({batch}); got {shape[0]}")
    if min(shape[2:]) < MIN_CONTROL_POINTS:
        raise ValueError(
            f"control_points need at least {MIN_CONTROL_POINTS} points along each axis (Kd, Kh, Kw) for a cubic "
            f"B-spline; got {shape[2:]}"
        )


def check_bspline_grid(spacing, origin) -> None:
    """A B-spline's ``spacing`` and ``origin`` are each None, a real number, or three (d, h, w); the spacing
    positive and finite, the origin finite (in output voxels)."""
    for name, value in (("spacing", spacing), ("origin", origin)):
        if value is None:
            continue
        values = [value] if _is_real(value) else value
        if not _is_real(value) and (
            not isinstance(value, (list, tuple)) or len(value) != 3 or not all(map(_is_real, value))
        ):
            raise TypeError(f"{name} must be a number or three (d, h, w), in output voxels; got {value!r}")
        floats = [float(entry) for entry in values]
        if not all(np.isfinite(floats)):
            raise ValueError(f"{name} must be finite; got {value!r}")
        if name == "spacing" and min(floats) <= 0:
            raise ValueError(f"spacing must be positive; got {value!r}")


def _is_real(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def check_theta(theta: torch.Tensor, batch: int) -> None:
    """theta is (N, 3, 4) with the volume's N, as ``F.affine_grid`` takes it."""
    if tuple(theta.shape) != (batch, 3, 4):
        raise ValueError(
            f"theta must be (N, 3, 4) with volume's N ({batch}), as F.affine_grid takes it; "
            f"got shape {tuple(theta.shape)}"
        )


def check_size(size, default) -> tuple:
    """The output size (Do, Ho, Wo): ``size`` as three positive ints, or ``default`` where None (a shape's sizes as
    they are: symbolic while torch.export traces dynamic sizes)."""
    if size is None:
        return tuple(default)
    try:
        values = tuple(size)
    except TypeError:
        raise TypeError(f"size must be (Do, Ho, Wo), three ints; got {type(size).__name__} {size!r}") from None
    if len(values) != 3 or not all(
        isinstance(value, (int, np.integer, torch.SymInt)) and not isinstance(value, bool) for value in values
    ):
        raise TypeError(f"size must be (Do, Ho, Wo), three ints; got {size!r}")
    if any(isinstance(value, (int, np.integer)) and value < 1 for value in values):
        raise ValueError(f"size (Do, Ho, Wo) must be positive; got {tuple(int(value) for value in values)}")
    return tuple(value if isinstance(value, torch.SymInt) else int(value) for value in values)


def check_grad(
    grad: torch.Tensor, data_format: DataFormat, expected: tuple, volume_name: str, origin: str, volume_shape=None
) -> None:
    """grad is the output's shape in ``data_format``: ``expected`` = (N, C, (Do, Ho, Wo)), N and C the volume's
    (named ``volume_name``, shaped ``volume_shape`` as given, for the hint), the sizes from ``origin`` (for the
    message)."""
    if grad.ndim != 5:
        _check_5d(grad, "grad", "(N, C, Do, Ho, Wo)" if data_format == DataFormat.NCDHW else "(N, Do, Ho, Wo, C)")
    batch, channels, out_sizes = expected
    shape = grad.shape
    if data_format == DataFormat.NCDHW:
        grad_channels, grad_spatial = shape[1], tuple(shape[2:])
    else:
        grad_channels, grad_spatial = shape[4], tuple(shape[1:4])
    if shape[0] != batch:
        raise ValueError(f"grad's batch size N must equal {volume_name}'s ({batch}); got {shape[0]}")
    hint = _layout_hint(shape, data_format, expected, volume_shape)
    if grad_channels != channels:
        raise ValueError(f"grad's channel count C must equal {volume_name}'s ({channels}); got {grad_channels}{hint}")
    if grad_spatial != out_sizes:
        raise ValueError(
            f"grad's spatial sizes (Do, Ho, Wo) must equal {origin} {tuple(out_sizes)}; got {grad_spatial}{hint}"
        )


def _layout_hint(shape, data_format: DataFormat, expected: tuple, volume_shape=None) -> str:
    """A hint where ``shape`` fits in the other layout: grad alone (the expected shape in it), or grad and the
    volume together (both read in it, their channels agree); the likely mistake is ``data_format``."""
    batch, channels, out_sizes = expected
    other = DataFormat.NDHWC if data_format == DataFormat.NCDHW else DataFormat.NCDHW

    def in_other(channel_count):
        return (batch, *out_sizes, channel_count) if other == DataFormat.NDHWC else (batch, channel_count, *out_sizes)

    fits = tuple(shape) == in_other(channels)
    if not fits and volume_shape is not None and len(volume_shape) == 5:
        fits = tuple(shape) == in_other(volume_shape[4] if other == DataFormat.NDHWC else volume_shape[1])
        if fits:
            return f" (grad and the volume both fit as {other.value}: pass data_format={other.value!r})"
    if not fits:
        return ""
    return f" (grad has the output's shape in {other.value}: pass data_format={other.value!r})"


def check_deterministic(value) -> bool | None:
    """``deterministic`` is None (follow torch's flag) or a bool."""
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(f"deterministic must be None or a bool; got {type(value).__name__} {value!r}")


def check_backend(name, known) -> str:
    """``backend`` is "auto" or one of ``known`` (the registry's names)."""
    if type(name) is str and name == "auto":
        return name
    if not isinstance(name, str):
        raise TypeError(f"backend must be a str; got {type(name).__name__} {name!r}")
    if name != "auto" and name not in known:
        names = ", ".join(repr(key) for key in ("auto", *known))
        raise ValueError(f"backend must be one of {names}; got {name!r}")
    return name


def check_device(device) -> torch.device:
    """A device, or a name torch knows (``"cpu"``, ``"cuda"``, ``"cuda:1"``) -> ``torch.device``."""
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"device must be a str or a torch.device; got {type(device).__name__} {device!r}")
    try:
        return torch.device(device)
    except RuntimeError:
        raise ValueError(f"device must name a device torch knows ('cpu', 'cuda', 'cuda:1'); got {device!r}") from None


def check_velocity(velocity, displacement_format: DisplacementFormat) -> torch.Tensor:
    """``integrate_velocity``'s velocity: a float torch tensor (N, 3, D, H, W) or (N, D, H, W, 3) as
    ``displacement_format`` says, with non-zero spatial sizes."""
    velocity = as_tensor(velocity, "velocity", arrays=False)
    check_same({"velocity": velocity})
    n3dhw = displacement_format == DisplacementFormat.N3DHW
    layout = "(N, 3, D, H, W)" if n3dhw else "(N, D, H, W, 3)"
    if velocity.ndim != 5:
        _check_5d(velocity, "velocity", layout)
    shape = tuple(velocity.shape)
    components, spatial = (shape[1], shape[2:]) if n3dhw else (shape[4], shape[1:4])
    if components != 3:
        raise ValueError(f"velocity must be {layout}, components (dz, dy, dx); got shape {shape}")
    if 0 in spatial:
        raise ValueError(f"velocity's spatial sizes (D, H, W) must be non-zero; got {spatial}")
    return velocity


_FIELD_KINDS = {
    "grid": FieldKind.GRID,
    "displacement": FieldKind.DISPLACEMENT,
    "affine": FieldKind.AFFINE,
    "bspline": FieldKind.BSPLINE,
}


def check_field_kind(value) -> FieldKind:
    """``explain``'s ``field_kind``: "grid", "displacement", "affine" or "bspline" (or a
    :class:`.sampling.FieldKind`) -> FieldKind ("affine" covers the affine field with a displacement too, "bspline"
    the B-spline with a theta)."""
    if isinstance(value, FieldKind):
        if value.spline:
            return FieldKind.BSPLINE
        return FieldKind.AFFINE if value.affine else value
    if not isinstance(value, str) or value.strip().lower() not in _FIELD_KINDS:
        raise ValueError(f"field_kind must be one of {', '.join(map(repr, _FIELD_KINDS))}; got {value!r}")
    return _FIELD_KINDS[value.strip().lower()]


def check_plan_device(device: torch.device, tensors_device: torch.device) -> None:
    """``explain`` plans CPU tensors on the CPU engine (``device`` cpu), and any tensors for ``device="cuda"``."""
    if device.type != "cpu" or tensors_device.type != "cpu":
        raise ValueError(
            f"explain: plans are made for CPU tensors, or for device='cuda'; got tensors on "
            f"{tensors_device} and device={device}"
        )


def check_steps(steps) -> int:
    """``integrate_velocity``'s steps: an int >= 0."""
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"steps must be an int >= 0; got {steps!r}")
    return int(steps)
