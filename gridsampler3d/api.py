"""Public functions: validate, normalise, dispatch, return.

Shapes (NCDHW / NDHWC):

    input, dx   (N, C, Di, Hi, Wi)  /  (N, Di, Hi, Wi, C)
    grad, y     (N, C, Do, Ho, Wo)  /  (N, Do, Ho, Wo, C)
    grid, dgrid (N, Do, Ho, Wo, 3)  (x along W, y along H, z along D, in [-1, 1])

The fused warp samples at identity + a displacement in voxels, with no grid:

    volume, dvolume                (N, C, D, H, W)  /  (N, D, H, W, C)
    displacement, ddisplacement    (N, 3, D, H, W)  /  (N, D, H, W, 3)  ((dz, dy, dx) in voxels)
"""

from __future__ import annotations

import numpy as np
import torch

from .affine import explicit_grid
from .backends import select_backend
from .layout import from_ncdhw, memory_format_of, to_ncdhw
from .modes import DisplacementFormat, parse_data_format, parse_displacement_format, parse_output_mask
from .sampling import Field, FieldKind, Gradients, Outputs, Sampling
from .validate import (
    check_affine,
    check_affine_backward,
    check_backward,
    check_deterministic,
    check_forward,
    check_warp,
    check_warp_backward,
)

__all__ = [
    "affine_warp3d",
    "affine_warp3d_backward",
    "explain",
    "grid_sampler3d",
    "grid_sampler3d_backward",
    "warp3d",
    "warp3d_backward",
]


def _like_caller(tensor, reference_operand):
    """Return ``tensor`` as the same kind (NumPy array or torch tensor) as the caller's operand."""
    if tensor is None or isinstance(reference_operand, torch.Tensor):
        return tensor
    return np.ascontiguousarray(tensor.numpy())


def sample(x: torch.Tensor, field: Field, sampling: Sampling, backend: str = "auto") -> torch.Tensor:
    """The forward of checked operands, for every kind of field: ``x`` (N, C, D, H, W), logical NCDHW, sampled at
    ``field`` by the backend named ``backend`` -> (N, C, Do, Ho, Wo), laid out like ``x``.

    An affine field whose theta is not finite samples at :func:`.affine.explicit_grid` (the
    grid ``F.affine_grid`` builds), so that NaN and infinity land as that path places them.
    """
    engine = select_backend(backend, x.device)
    if x.numel() == 0 or field.points == 0:
        out_shape = tuple(x.shape[:2]) + field.out_sizes
        return torch.empty(out_shape, dtype=x.dtype, device=x.device, memory_format=memory_format_of(x)).zero_()
    if field.kind.affine and not _finite(field.theta):
        return engine.forward(x, _explicit(field, x, sampling), sampling)
    return engine.forward(x, field, sampling)


def sample_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    field: Field,
    sampling: Sampling,
    outputs: Outputs,
    *,
    backend: str = "auto",
    deterministic: bool | None = None,
) -> Gradients:
    """The backward of checked operands, for every kind of field, on logical NCDHW tensors: what
    :func:`grid_sampler3d_backward`, :func:`warp3d_backward` and :func:`affine_warp3d_backward` run after their
    checks.

    Autograd's backward calls it directly: its forward checked the operands, and autograd
    gives grad the output's shape and dtype. Returns :class:`.sampling.Gradients` (dx, the
    field tensor's, theta's) as the engine lays them out (:class:`.backends.Backend`); None
    where ``outputs`` leaves one out or the field has none.
    """
    engine = select_backend(backend, x.device)
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    outputs = Outputs(outputs.dx, outputs.dfield and field.tensor is not None, outputs.dtheta and field.kind.affine)
    if not any(outputs):
        return Gradients()
    if grad.numel() == 0 or x.numel() == 0:
        return Gradients(
            torch.zeros_like(x, memory_format=memory_format_of(x)) if outputs.dx else None,
            torch.zeros_like(field.tensor, memory_format=field.gradient_format()) if outputs.dfield else None,
            torch.zeros_like(field.theta) if outputs.dtheta else None,
        )
    if field.kind.affine and not _finite(field.theta):
        return _explicit_backward(engine, grad, x, field, sampling, outputs, deterministic)
    return engine.backward(grad, x, field, sampling, outputs, deterministic)


def _finite(theta: torch.Tensor) -> bool:
    return bool(torch.isfinite(theta).all())


def _explicit(field: Field, x: torch.Tensor, sampling: Sampling) -> Field:
    """The grid of an affine field (:func:`.affine.explicit_grid`), for a theta that is not finite."""
    return Field.grid(
        explicit_grid(field.theta, field.out_sizes, sampling.align_corners, tuple(x.shape[2:]), field.tensor)
    )


def _explicit_backward(engine, grad, x, field: Field, sampling: Sampling, outputs: Outputs, deterministic: bool):
    """The backward through the explicit grid (for a theta that is not finite): the grid's gradient by the engine,
    then theta's and the displacement's by autograd through :func:`.affine.explicit_grid`."""
    leaves = [field.theta.detach().requires_grad_(outputs.dtheta)]
    if field.tensor is not None:
        leaves.append(field.tensor.detach().requires_grad_(outputs.dfield))
    with torch.enable_grad():
        grid = _explicit(
            Field.affine(leaves[0], field.out_sizes, leaves[1] if len(leaves) > 1 else None), x, sampling
        ).tensor
    dx, dgrid, _ = engine.backward(
        grad,
        x,
        Field.grid(grid.detach()),
        sampling,
        Outputs(outputs.dx, outputs.dtheta or outputs.dfield),
        deterministic,
    )
    wanted = [leaf for leaf in leaves if leaf.requires_grad]
    found = dict(zip(map(id, wanted), torch.autograd.grad(grid, wanted, dgrid))) if wanted else {}
    dfield = found.get(id(leaves[-1])) if field.tensor is not None and outputs.dfield else None
    return Gradients(dx, dfield, found.get(id(leaves[0])))


def grid_sampler3d(
    input,
    grid,
    interpolation_mode="bilinear",
    padding_mode="zeros",
    align_corners=False,
    data_format="NCDHW",
    backend="auto",
):
    """Sample a volume at grid points (``aten::grid_sampler_3d``).

    Args:
        input: (N, C, Di, Hi, Wi), or (N, Di, Hi, Wi, C) with ``data_format="NDHWC"``;
            a torch tensor (any device) or a NumPy array; float16/bfloat16/float32/float64.
        grid: (N, Do, Ho, Wo, 3), same dtype and device; normalised (x, y, z) in [-1, 1].
        interpolation_mode: "bilinear"/0 (trilinear, 8 taps), "nearest"/1 or "bicubic"/2
            (tricubic, 64 taps).
        padding_mode: "zeros"/0, "border"/1 or "reflection"/2.
        align_corners: whether -1 and 1 are the centres (True) or the outer edges (False)
            of the corner voxels.
        data_format: "NCDHW" or "NDHWC" for ``input`` and the output.
        backend: "auto" or a backend name (see ``gridsampler3d.available_backends()``).

    Returns:
        The sampled volume, (N, C, Do, Ho, Wo) or (N, Do, Ho, Wo, C), of the kind, dtype,
        device and layout of ``input``.
    """
    sampling = Sampling.parse(interpolation_mode, padding_mode, align_corners)
    data_format = parse_data_format(data_format)
    caller_input = input
    input, grid = check_forward(input, grid, data_format)
    y = sample(to_ncdhw(input, data_format), Field.grid(grid), sampling, backend)
    return _like_caller(from_ncdhw(y, data_format), caller_input)


def grid_sampler3d_backward(
    grad,
    input,
    grid,
    interpolation_mode="bilinear",
    padding_mode="zeros",
    align_corners=False,
    output_mask=(True, True),
    data_format="NCDHW",
    backend="auto",
    deterministic=None,
):
    """Gradients of grid sampling (``aten::grid_sampler_3d_backward``, aclnn GridSampler3DGrad).

    Args:
        grad: dL/dy, (N, C, Do, Ho, Wo), or (N, Do, Ho, Wo, C) with ``data_format="NDHWC"``.
        input: the sampled volume x, (N, C, Di, Hi, Wi) or (N, Di, Hi, Wi, C).
        grid: (N, Do, Ho, Wo, 3).
        interpolation_mode, padding_mode, align_corners, data_format, backend: as for
            :func:`grid_sampler3d`.
        output_mask: (compute dx, compute dgrid); an output not asked for is ``None`` and
            is not computed.
        deterministic: True for bitwise-reproducible results, False for the fastest
            method, None to follow ``torch.are_deterministic_algorithms_enabled()``. CPU
            backends are always deterministic.

    Returns:
        ``(dx, dgrid)``: dx like ``input`` (shape, dtype, device, layout), dgrid like ``grid``.
        All operands share one dtype and device; torch tensors in, torch tensors out,
        NumPy arrays in, NumPy arrays out.
    """
    sampling = Sampling.parse(interpolation_mode, padding_mode, align_corners)
    outputs = Outputs(*parse_output_mask(output_mask))
    data_format = parse_data_format(data_format)
    deterministic = check_deterministic(deterministic)
    caller_input, caller_grid = input, grid
    grad, input, grid = check_backward(grad, input, grid, data_format)
    dx, dgrid, _ = sample_backward(
        to_ncdhw(grad, data_format),
        to_ncdhw(input, data_format),
        Field.grid(grid),
        sampling,
        outputs,
        backend=backend,
        deterministic=deterministic,
    )
    if dx is not None:
        dx = _like_caller(from_ncdhw(dx, data_format), caller_input)
    return dx, _like_caller(dgrid, caller_grid)


def displacement_field(displacement: torch.Tensor, displacement_format: DisplacementFormat) -> Field:
    """The :class:`.sampling.Field` of a displacement given in ``displacement_format``: a zero-copy logical
    (N, 3, D, H, W) view."""
    if displacement_format == DisplacementFormat.NDHW3:
        displacement = displacement.permute(0, 4, 1, 2, 3)
    return Field.displacement(displacement)


def _displacement_from_n3dhw(tensor: torch.Tensor, displacement_format: DisplacementFormat) -> torch.Tensor:
    """A logical (N, 3, D, H, W) result (laid out like the displacement) back in ``displacement_format``:
    NDHW3 comes back contiguous, free since the engines write it channels-last."""
    if displacement_format == DisplacementFormat.NDHW3:
        return tensor.permute(0, 2, 3, 4, 1).contiguous()
    return tensor


def warp3d(
    volume,
    displacement,
    interpolation_mode="bilinear",
    padding_mode="border",
    align_corners=True,
    data_format="NCDHW",
    displacement_format="N3DHW",
    backend="auto",
):
    """Sample a volume at identity + displacement, with no grid tensor (the registration warp).

    Output voxel (d, h, w) is ``volume`` sampled at voxel position (w + dx, h + dy, d + dz),
    each sum formed in float64; padding and interpolation then follow
    :func:`grid_sampler3d` exactly as for an unnormalised grid coordinate.
    ``align_corners`` does not move the position: it only sets reflection's bounds (0 and
    size - 1 when True, -0.5 and size - 0.5 when False), as in ``F.grid_sample``.

    Args:
        volume: (N, C, D, H, W), or (N, D, H, W, C) with ``data_format="NDHWC"``; a torch
            tensor (any device) or a NumPy array; float16/bfloat16/float32/float64.
        displacement: (N, 3, D, H, W), or (N, D, H, W, 3) with ``displacement_format="NDHW3"``;
            components (dz, dy, dx) in voxels either way; same N, D, H, W, dtype and device as ``volume``.
        interpolation_mode, padding_mode: as for :func:`grid_sampler3d`.
        align_corners: reflection's bounds (see above).
        data_format: "NCDHW" or "NDHWC" for ``volume`` and the output.
        displacement_format: "N3DHW" or "NDHW3".
        backend: "auto" or a backend name.

    Returns:
        The warped volume, shaped, typed and laid out like ``volume``.
    """
    sampling = Sampling.parse(interpolation_mode, padding_mode, align_corners)
    data_format = parse_data_format(data_format)
    displacement_format = parse_displacement_format(displacement_format)
    caller_volume = volume
    volume, displacement = check_warp(volume, displacement, data_format, displacement_format)
    y = sample(to_ncdhw(volume, data_format), displacement_field(displacement, displacement_format), sampling, backend)
    return _like_caller(from_ncdhw(y, data_format), caller_volume)


def warp3d_backward(
    grad,
    volume,
    displacement,
    interpolation_mode="bilinear",
    padding_mode="border",
    align_corners=True,
    output_mask=(True, True),
    data_format="NCDHW",
    displacement_format="N3DHW",
    backend="auto",
    deterministic=None,
):
    """Gradients of the fused warp :func:`warp3d`: (dvolume, ddisplacement).

    Args:
        grad: dL/dy, shaped and laid out like ``volume``.
        volume, displacement, interpolation_mode, padding_mode, align_corners, data_format,
            displacement_format, backend: as for :func:`warp3d`.
        output_mask: (compute dvolume, compute ddisplacement); an output not asked for is
            ``None`` and is not computed.
        deterministic: as for :func:`grid_sampler3d_backward`.

    Returns:
        ``(dvolume, ddisplacement)``: dvolume like ``volume``; ddisplacement like ``displacement``
        (N, 3, D, H, W) or (N, D, H, W, 3) as ``displacement_format`` says, components (dz, dy,
        dx); an NDHW3 result is contiguous, an N3DHW one keeps the displacement's memory format.
        d position / d displacement is 1: ddisplacement is the gradient with respect to the
        voxel position, through padding (nearest: zero).
    """
    sampling = Sampling.parse(interpolation_mode, padding_mode, align_corners)
    outputs = Outputs(*parse_output_mask(output_mask, "dvolume, ddisplacement"))
    data_format = parse_data_format(data_format)
    displacement_format = parse_displacement_format(displacement_format)
    deterministic = check_deterministic(deterministic)
    caller_volume, caller_displacement = volume, displacement
    grad, volume, displacement = check_warp_backward(grad, volume, displacement, data_format, displacement_format)
    dx, dfield, _ = sample_backward(
        to_ncdhw(grad, data_format),
        to_ncdhw(volume, data_format),
        displacement_field(displacement, displacement_format),
        sampling,
        outputs,
        backend=backend,
        deterministic=deterministic,
    )
    if dx is not None:
        dx = _like_caller(from_ncdhw(dx, data_format), caller_volume)
    if dfield is not None:
        dfield = _like_caller(_displacement_from_n3dhw(dfield, displacement_format), caller_displacement)
    return dx, dfield


def affine_field(theta: torch.Tensor, size, displacement, displacement_format: DisplacementFormat) -> Field:
    """The :class:`.sampling.Field` of an affine sampling: theta (N, 3, 4), the output size (Do, Ho, Wo), and a
    displacement (or None) given in ``displacement_format``, as a logical (N, 3, Do, Ho, Wo) view."""
    if displacement is None:
        return Field.affine(theta, size)
    return Field.affine(theta, size, displacement_field(displacement, displacement_format).tensor)


def affine_warp3d(
    volume,
    theta,
    size=None,
    displacement=None,
    interpolation_mode="bilinear",
    padding_mode="zeros",
    align_corners=False,
    data_format="NCDHW",
    displacement_format="N3DHW",
    backend="auto",
):
    """Sample a volume at an affine map of the output's voxels, plus an optional displacement, with no grid tensor.

    Without ``displacement`` this is ``F.grid_sample(volume, F.affine_grid(theta, (N, C,
    *size), align_corners), ...)``; with it, each output voxel samples at the affine's position
    plus the displacement, in input voxels (the identity theta gives :func:`warp3d`). Positions
    are computed in float64 from theta in voxel terms (:mod:`gridsampler3d.affine`);
    docs/semantics.md, "The affine field", has the formulas.

    Args:
        volume: (N, C, D, H, W), or (N, D, H, W, C) with ``data_format="NDHWC"``; a torch
            tensor (any device) or a NumPy array; float16/bfloat16/float32/float64.
        theta: (N, 3, 4), normalised coordinates, rows for x, y, z (``F.affine_grid``'s);
            the volume's dtype and device.
        size: the output's (Do, Ho, Wo); default the volume's (D, H, W).
        displacement: None, or (N, 3, Do, Ho, Wo) ((N, Do, Ho, Wo, 3) with
            ``displacement_format="NDHW3"``), components (dz, dy, dx) in input voxels.
        interpolation_mode, padding_mode, align_corners, data_format, backend: as for
            :func:`grid_sampler3d`; the defaults are ``F.grid_sample``'s and ``F.affine_grid``'s.

    Returns:
        (N, C, Do, Ho, Wo), or (N, Do, Ho, Wo, C) for NDHWC, of the volume's kind, dtype and device.
    """
    sampling = Sampling.parse(interpolation_mode, padding_mode, align_corners)
    data_format = parse_data_format(data_format)
    displacement_format = parse_displacement_format(displacement_format)
    caller_volume = volume
    volume, theta, size, displacement = check_affine(
        volume, theta, size, displacement, data_format, displacement_format
    )
    field = affine_field(theta, size, displacement, displacement_format)
    y = sample(to_ncdhw(volume, data_format), field, sampling, backend)
    return _like_caller(from_ncdhw(y, data_format), caller_volume)


def affine_warp3d_backward(
    grad,
    volume,
    theta,
    size=None,
    displacement=None,
    interpolation_mode="bilinear",
    padding_mode="zeros",
    align_corners=False,
    output_mask=(True, True, True),
    data_format="NCDHW",
    displacement_format="N3DHW",
    backend="auto",
    deterministic=None,
):
    """Gradients of :func:`affine_warp3d`: (dvolume, dtheta, ddisplacement).

    Args:
        grad: dL/dy, (N, C, Do, Ho, Wo) or (N, Do, Ho, Wo, C).
        volume, theta, size, displacement, interpolation_mode, padding_mode, align_corners,
            data_format, displacement_format, backend: as for :func:`affine_warp3d`.
        output_mask: (compute dvolume, compute dtheta, compute ddisplacement); an output not
            asked for (or, without a displacement, ddisplacement) is ``None`` and not computed.
        deterministic: as for :func:`grid_sampler3d_backward`. dtheta is summed in float64 in
            a fixed order in every mode: the same bits for any thread count.

    Returns:
        ``(dvolume, dtheta, ddisplacement)``, shaped and laid out like volume, theta and the displacement.
    """
    sampling = Sampling.parse(interpolation_mode, padding_mode, align_corners)
    want_dx, want_dtheta, want_ddisplacement = parse_output_mask(output_mask, "dvolume, dtheta, ddisplacement")
    data_format = parse_data_format(data_format)
    displacement_format = parse_displacement_format(displacement_format)
    deterministic = check_deterministic(deterministic)
    callers = (volume, theta, displacement)
    grad, volume, theta, size, displacement = check_affine_backward(
        grad, volume, theta, size, displacement, data_format, displacement_format
    )
    field = affine_field(theta, size, displacement, displacement_format)
    dx, dfield, dtheta = sample_backward(
        to_ncdhw(grad, data_format),
        to_ncdhw(volume, data_format),
        field,
        sampling,
        Outputs(want_dx, want_ddisplacement, want_dtheta),
        backend=backend,
        deterministic=deterministic,
    )
    if dx is not None:
        dx = _like_caller(from_ncdhw(dx, data_format), callers[0])
    if dfield is not None:
        dfield = _like_caller(_displacement_from_n3dhw(dfield, displacement_format), callers[2])
    return dx, _like_caller(dtheta, callers[1]), dfield


def explain(
    input,
    field,
    grad=None,
    interpolation_mode="bilinear",
    padding_mode="zeros",
    align_corners=False,
    output_mask=(True, True),
    data_format="NCDHW",
    field_kind="grid",
    device=None,
    deterministic=None,
    size=None,
    displacement=None,
):
    """The plan an engine makes for a call, made as the call would make it, without running any kernel.

    With ``grad`` the plan is the backward's (:func:`grid_sampler3d_backward`), else the
    forward's (:func:`grid_sampler3d`). ``field`` is the grid (N, Do, Ho, Wo, 3); with
    ``field_kind="displacement"``, the fused warp's displacement (N, 3, D, H, W)
    (:func:`warp3d`); with ``field_kind="affine"``, theta (N, 3, 4), with ``size`` and an
    optional ``displacement`` (N, 3, Do, Ho, Wo) (:func:`affine_warp3d`; ``output_mask`` is
    then (dvolume, dtheta, ddisplacement)).

    CPU tensors get the CPU engine's plan (:mod:`gridsampler3d.cpu.planner`): it depends on
    the shapes, layout, dtype, modes, outputs, ``torch.get_num_threads()`` and, where it
    matters, on whether the grid is smooth and grad finite (measured here, in torch).
    CUDA tensors, or any tensors with ``device="cuda"`` (meta tensors too, without a GPU),
    get the GPU engine's plan (:mod:`gridsampler3d.gpu.planner`), made from the shapes,
    strides, dtype, modes, outputs, ``deterministic`` (None: torch's flag) and the GPU's
    compute capability (sm_90 where there is no GPU).

    Args: as for :func:`grid_sampler3d_backward` (or :func:`warp3d_backward`, :func:`affine_warp3d_backward`).

    Returns:
        A frozen plan record; ``str(plan)`` reads as one line.
    """
    sampling = Sampling.parse(interpolation_mode, padding_mode, align_corners)
    data_format = parse_data_format(data_format)
    kind = _parse_field_kind(field_kind)
    grad, x, field, outputs = _explained_call(kind, input, field, grad, output_mask, data_format, size, displacement)
    device = torch.device(device) if device is not None else x.device
    if device.type == "cuda":
        from .gpu.engine import plan_call as plan_gpu_call

        deterministic = torch.are_deterministic_algorithms_enabled() if deterministic is None else deterministic
        return plan_gpu_call(
            x, field, sampling, grad=grad, outputs=outputs, deterministic=bool(deterministic), device=device
        )
    if device.type != "cpu" or x.device.type != "cpu":
        raise ValueError(
            f"explain: plans are made for CPU tensors, or for device='cuda'; got tensors on "
            f"{x.device} and device={device}"
        )
    from .cpu.engine import plan_call
    from .cpu.planner import Stage

    stage = Stage.FORWARD if grad is None else Stage.BACKWARD
    return plan_call(stage, x, field, sampling, grad=grad, outputs=outputs)


def _explained_call(kind: FieldKind, input, field, grad, output_mask, data_format, size, displacement):
    """(grad, x, the :class:`.sampling.Field`, the outputs asked for) of a call :func:`explain` describes, checked as
    the call checks them; grad and x in logical NCDHW order, grad None for a forward."""
    if kind.affine:
        mask = parse_output_mask(
            output_mask if len(tuple(output_mask)) == 3 else (*output_mask, True), "dvolume, dtheta, ddisplacement"
        )
        if grad is None:
            input, field, size, displacement = check_affine(
                input, field, size, displacement, data_format, DisplacementFormat.N3DHW
            )
        else:
            grad, input, field, size, displacement = check_affine_backward(
                grad, input, field, size, displacement, data_format, DisplacementFormat.N3DHW
            )
        outputs, checked = Outputs(mask[0], mask[2], mask[1]), Field.affine(field, size, displacement)
    else:
        outputs = Outputs(*parse_output_mask(output_mask))
        if kind == FieldKind.DISPLACEMENT:
            checked = (
                check_warp(input, field, data_format, DisplacementFormat.N3DHW)
                if grad is None
                else check_warp_backward(grad, input, field, data_format, DisplacementFormat.N3DHW)
            )
        else:
            checked = (
                check_forward(input, field, data_format)
                if grad is None
                else check_backward(grad, input, field, data_format)
            )
        grad, input, field_tensor = (None, *checked) if grad is None else checked
        checked = Field(kind, field_tensor)
    return (None if grad is None else to_ncdhw(grad, data_format)), to_ncdhw(input, data_format), checked, outputs


def _parse_field_kind(value) -> FieldKind:
    """ "grid", "displacement" or "affine" (or a :class:`.sampling.FieldKind`) -> FieldKind ("affine" covers the affine
    field with a displacement too)."""
    if isinstance(value, FieldKind):
        return value
    names = {"grid": FieldKind.GRID, "displacement": FieldKind.DISPLACEMENT, "affine": FieldKind.AFFINE}
    if not isinstance(value, str) or value.strip().lower() not in names:
        raise ValueError(f"field_kind must be one of {', '.join(map(repr, names))}; got {value!r}")
    return names[value.strip().lower()]
