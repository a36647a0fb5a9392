"""The front door: a public call's arguments parsed and checked once, into the records every layer below takes.

    options = parse_options(interpolation_mode, padding_mode, align_corners, data_format=..., backend=...)
    call = parse_call(FieldKind.GRID, options, input, grid=grid, grad=grad, output_mask=output_mask)
    gradients = backends.backward(call.engine, call.grad, call.x, call.field, options.sampling, call.outputs, ...)
    return restore_gradients(call, gradients)

Every public name goes through :func:`parse_options` (the attributes: names or aclnn
codes, layouts, the backend, determinism) and :func:`parse_call` (the operands: NumPy
arrays viewed as tensors, every check of :mod:`.validate`, the logical NCDHW views, the
:class:`.sampling.Field` and :class:`.sampling.Outputs`): the operators of :mod:`.api`,
the differentiable functions of :mod:`.nn` (whose modules parse their options once, when
they are made), :func:`.api.explain` and the patch. Nothing below parses, checks or
rebuilds a record: the autograd layer, the backend registry, the planners and the kernels
take these as they are.

What differs between kinds of field at this door is data: :data:`KINDS` names each kind's
operands and the order of its backward's outputs, and one parser per kind makes its
:class:`.sampling.Field` (a new kind is a new entry, not a new path).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import torch

from . import backends, validate
from .bspline import grid_of
from .layout import from_ncdhw, to_ncdhw
from .modes import (
    DataFormat,
    DisplacementFormat,
    parse_data_format,
    parse_displacement_format,
    parse_output_mask,
)
from .sampling import Field, FieldKind, Gradients, Outputs, Sampling

__all__ = [
    "Call",
    "KINDS",
    "Kind",
    "Options",
    "AUTOCAST_DEVICE_TYPES",
    "parse_call",
    "parse_options",
    "restore_gradients",
    "restore_output",
]


#: The device types ``torch.autocast`` knows (``torch.is_autocast_enabled`` raises for others, meta among them).
AUTOCAST_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps", "hpu")


class Options(NamedTuple):
    """A call's attributes, parsed: the sampling rule, the layouts, the backend's name and determinism."""

    sampling: Sampling
    data_format: DataFormat = DataFormat.NCDHW
    displacement_format: DisplacementFormat = DisplacementFormat.N3DHW
    backend: str = "auto"
    deterministic: bool | None = None


def parse_options(
    interpolation_mode="bilinear",
    padding_mode="zeros",
    align_corners=False,
    *,
    data_format="NCDHW",
    displacement_format="N3DHW",
    backend="auto",
    deterministic=None,
) -> Options:
    """The :class:`Options` of a call's attributes; a ``TypeError`` or ``ValueError`` naming a bad one.

    The same attributes (values and types: ``1`` is not ``True`` here) give the same record
    from a table of those parsed before, without parsing them again.
    """
    arguments = (interpolation_mode, padding_mode, align_corners, data_format, displacement_format, backend)
    key = (*arguments, deterministic, *map(type, arguments), type(deterministic))
    try:
        if key in _PARSED:
            return _PARSED[key]
    except TypeError:  # an unhashable attribute: parsed below, to say what is wrong with it
        key = None
    options = Options(
        Sampling.parse(interpolation_mode, padding_mode, align_corners),
        parse_data_format(data_format),
        parse_displacement_format(displacement_format),
        validate.check_backend(backend, backends.BACKENDS),
        validate.check_deterministic(deterministic),
    )
    if key is not None:
        if len(_PARSED) >= _PARSED_MOST:
            _PARSED.clear()
        _PARSED[key] = options
    return options


# The Options of attributes parsed before, by their values and types (see parse_options).
_PARSED: dict = {}
_PARSED_MOST = 256


class Call(NamedTuple):
    """One checked call, as every layer below the door takes it.

    ``x`` (N, C, D, H, W) and ``grad`` (N, C, Do, Ho, Wo; a backward's) are logical NCDHW
    views of the caller's tensors (nothing copied); ``field`` the positions; ``outputs``
    the gradients a backward computes (only those the field has); ``engine`` the backend
    that runs it (None where nothing will run: :func:`.api.explain`); ``arrays``: the
    operands the caller gave as NumPy arrays, by name, whose gradients go back as arrays.
    """

    x: torch.Tensor
    field: Field
    options: Options
    grad: torch.Tensor | None = None
    outputs: Outputs = Outputs()
    engine: object = None
    arrays: tuple = ()


class Kind(NamedTuple):
    """What the public names call a kind of field's operands, and how its field is made.

    ``volume``: the sampled tensor's name ("input" or "volume"). ``gradients``: the
    :class:`.sampling.Gradients` members in the order the kind's backward operator returns
    them, which its ``output_mask`` (whose names are ``mask``) follows too. ``field``:
    ``field(volume, batch, spatial, options, operands)`` -> its :class:`.sampling.Field`,
    from the kind's checked operands (name: tensor); ``origin``: where its output's sizes
    come from, for messages; ``required``: the field's operands a call must give.
    """

    volume: str
    gradients: tuple
    mask: str
    field: Callable
    origin: str
    required: tuple


def _grid_field(volume, batch: int, spatial, options: Options, operands: dict) -> Field:
    grid = operands["grid"]
    validate.check_grid(grid, batch, "input")
    return Field(FieldKind.GRID, grid, None, tuple(grid.shape[1:4]))


def _displacement_field(volume, batch: int, spatial, options: Options, operands: dict) -> Field:
    displacement = operands["displacement"]
    validate.check_displacement(displacement, options.displacement_format, batch, spatial, "volume's")
    if options.displacement_format == DisplacementFormat.NDHW3:
        displacement = displacement.permute(0, 4, 1, 2, 3)  # the logical (N, 3, D, H, W) view
    return Field(FieldKind.DISPLACEMENT, displacement, None, spatial)


def _affine_field(volume, batch: int, spatial, options: Options, operands: dict) -> Field:
    theta = operands["theta"]
    validate.check_theta(theta, batch)
    size = spatial if operands["size"] is None else validate.check_size(operands["size"], spatial)
    if "displacement" not in operands:
        return Field(FieldKind.AFFINE, None, theta, size)
    displacement = operands["displacement"]
    validate.check_displacement(displacement, options.displacement_format, batch, size, "the output size")
    if options.displacement_format == DisplacementFormat.NDHW3:
        displacement = displacement.permute(0, 4, 1, 2, 3)  # the logical (N, 3, Do, Ho, Wo) view
    return Field(FieldKind.AFFINE_DISPLACEMENT, displacement, theta, size)


def _bspline_field(volume, batch: int, spatial, options: Options, operands: dict) -> Field:
    control_points, theta = operands["control_points"], operands.get("theta")
    validate.check_control_points(control_points, batch)
    if theta is not None:
        validate.check_theta(theta, batch)
    size = spatial if operands["size"] is None else validate.check_size(operands["size"], spatial)
    validate.check_bspline_grid(operands["spacing"], operands["origin"])
    parameters = grid_of(size, control_points.shape[2:], operands["spacing"], operands["origin"])
    return Field.bspline(control_points, size, parameters, theta)


_DISPLACEMENT = Kind(
    "volume", ("dx", "dfield"), "dvolume, ddisplacement", _displacement_field, "the volume's", ("displacement",)
)
_AFFINE = Kind(
    "volume", ("dx", "dtheta", "dfield"), "dvolume, dtheta, ddisplacement", _affine_field, "the output size", ("theta",)
)
_BSPLINE = Kind(
    "volume",
    ("dx", "dfield", "dtheta"),
    "dvolume, dcontrol_points, dtheta",
    _bspline_field,
    "the output size",
    ("control_points",),
)
#: Each kind of field as the public names take it (an affine field's two kinds share one operator, and a
#: B-spline's two).
KINDS = {
    FieldKind.GRID: Kind("input", ("dx", "dfield"), "dx, dgrid", _grid_field, "grid's", ("grid",)),
    FieldKind.DISPLACEMENT: _DISPLACEMENT,
    FieldKind.AFFINE: _AFFINE,
    FieldKind.AFFINE_DISPLACEMENT: _AFFINE,
    FieldKind.BSPLINE: _BSPLINE,
    FieldKind.BSPLINE_AFFINE: _BSPLINE,
}
#: The name of each kind's field tensor in the public names (its gradient's operand).
_FIELD_OPERANDS = {
    FieldKind.GRID: "grid",
    FieldKind.BSPLINE: "control_points",
    FieldKind.BSPLINE_AFFINE: "control_points",
}


def parse_call(
    kind: FieldKind,
    options: Options,
    volume,
    *,
    grid=None,
    displacement=None,
    control_points=None,
    theta=None,
    size=None,
    spacing=None,
    origin=None,
    grad=None,
    output_mask=None,
    backward: bool = False,
    arrays: bool = True,
    runs: bool = True,
    autocast: bool = False,
    where: str = "gridsampler3d",
) -> Call:
    """The checked :class:`Call` of a public call: ``volume`` and the operands of a field of ``kind`` (a grid, a
    displacement, theta with a size and an optional displacement, or a B-spline's control points with a size, the
    grid's spacing and origin, and an optional theta), and for a ``backward`` (or, with ``grad``
    given, a plan of one) ``grad`` and ``output_mask`` (in the kind's order, :data:`KINDS`; None asks for every
    output).

    ``arrays``: NumPy arrays are taken (the operators) or refused (the differentiable
    functions). ``runs``: a kernel will run here, so meta tensors are refused with
    ``NotImplementedError`` (the differentiable functions hand them to the custom ops' fake
    kernels; ``explain`` plans for them). The backend is chosen for tensors with data.
    ``autocast``: under ``torch.autocast`` the operands are taken in float32, as PyTorch's
    grid sampler takes them. ``where`` names the public function in the errors it raises.
    """
    spec = KINDS[kind]
    tensors = {spec.volume: volume}
    backward = backward or grad is not None
    operands = (("grid", grid), ("displacement", displacement), ("control_points", control_points), ("theta", theta))
    for name, value in (*operands, ("grad", grad)):
        if value is not None or name in spec.required or (name == "grad" and backward):
            tensors[name] = value
    given_arrays = ()
    for name, value in tensors.items():
        if type(value) is not torch.Tensor:  # a plain tensor is taken as it is, without a call
            tensors[name] = validate.as_tensor(value, name, arrays)
            if tensors[name] is not value and not isinstance(value, torch.Tensor):
                given_arrays += (name,)
    volume = tensors[spec.volume]
    device_type = volume.device.type
    if autocast and device_type in AUTOCAST_DEVICE_TYPES and torch.is_autocast_enabled(device_type):
        tensors = {name: tensor.float() for name, tensor in tensors.items()}
        volume = tensors[spec.volume]
    validate.check_same(tensors)
    if runs:
        validate.check_runnable(volume, spec.volume, where)
    batch, channels, spatial = validate.check_volume(volume, spec.volume, options.data_format)
    if kind.affine or kind.spline:
        tensors["size"] = size
    if kind.spline:
        tensors["spacing"], tensors["origin"] = spacing, origin
    field = spec.field(volume, batch, spatial, options, tensors)
    outputs, grad_view = Outputs(), None
    if backward:
        grad = tensors["grad"]
        expected = (batch, channels, field.out_sizes)
        validate.check_grad(grad, options.data_format, expected, spec.volume, spec.origin, tensors[spec.volume].shape)
        grad_view = to_ncdhw(grad, options.data_format)
        outputs = _outputs(spec, field, output_mask)
    engine = None if volume.device.type == "meta" else backends.select_backend(options.backend, volume.device)
    return Call(to_ncdhw(volume, options.data_format), field, options, grad_view, outputs, engine, given_arrays)


def _outputs(spec: Kind, field: Field, output_mask) -> Outputs:
    """The :class:`.sampling.Outputs` of a backward's ``output_mask`` (None: every output), given in the kind's
    order, keeping only the gradients the field has."""
    wanted = (True,) * len(spec.gradients) if output_mask is None else parse_output_mask(output_mask, spec.mask)
    asked = dict(zip(spec.gradients, wanted))
    return Outputs(
        asked["dx"],
        asked.get("dfield", False) and field.tensor is not None,
        asked.get("dtheta", False) and field.theta is not None,
    )


def _as_caller(tensor, operand: str, call: Call):
    """``tensor`` as the caller gave ``operand``: a (C-contiguous) NumPy array where that was one."""
    if tensor is None or operand not in call.arrays:
        return tensor
    return np.ascontiguousarray(tensor.numpy())


def restore_output(call: Call, y: torch.Tensor):
    """A forward's logical (N, C, Do, Ho, Wo) output in the caller's layout and kind (tensor or array)."""
    return _as_caller(from_ncdhw(y, call.options.data_format), KINDS[call.field.kind].volume, call)


def restore_gradients(call: Call, gradients: Gradients) -> tuple:
    """A backward's :class:`.sampling.Gradients`, each in its operand's layout and kind, in the kind's order
    (:data:`KINDS`): the one place where the order of a public backward's outputs is made."""
    dx, dfield, dtheta = gradients
    if dx is not None:
        dx = from_ncdhw(dx, call.options.data_format)
    if dfield is not None and call.field.kind.displaced:
        if call.options.displacement_format == DisplacementFormat.NDHW3:
            dfield = dfield.permute(0, 2, 3, 4, 1).contiguous()
    spec = KINDS[call.field.kind]
    restored = {
        "dx": (dx, spec.volume),
        "dfield": (dfield, _FIELD_OPERANDS.get(call.field.kind, "displacement")),
        "dtheta": (dtheta, "theta"),
    }
    return tuple(_as_caller(*restored[name], call) for name in spec.gradients)
