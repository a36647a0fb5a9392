"""The operators (aclnn style: a forward and a backward per kind of field, NumPy arrays or tensors) and ``explain``.

Shapes (NCDHW / NDHWC):

    input, dx   (N, C, Di, Hi, Wi)  /  (N, Di, Hi, Wi, C)
    grad, y     (N, C, Do, Ho, Wo)  /  (N, Do, Ho, Wo, C)
    grid, dgrid (N, Do, Ho, Wo, 3)  (x along W, y along H, z along D, in [-1, 1])

The fused warp samples at identity + a displacement in voxels, with no grid:

    volume, dvolume                (N, C, D, H, W)  /  (N, D, H, W, C)
    displacement, ddisplacement    (N, 3, D, H, W)  /  (N, D, H, W, 3)  ((dz, dy, dx) in voxels)

The affine field takes theta (N, 3, 4) and an output size; the B-spline field its control
points (N, 3, Kd, Kh, Kw), (dz, dy, dx) in voxels, evaluated in the kernels.

Each operator is three steps: :func:`.call.parse_options` and :func:`.call.parse_call` (every
parse and check, once), :func:`.backends.forward` or :func:`.backends.backward` (the engine),
and :func:`.call.restore_output` or :func:`.call.restore_gradients` (the caller's layouts,
NumPy arrays for NumPy operands, the operator's order of outputs).
"""

from __future__ import annotations

import torch

from . import backends, validate
from .call import parse_call, parse_options, restore_gradients, restore_output
from .problem import Stage
from .sampling import FieldKind

__all__ = [
    "affine_warp3d",
    "affine_warp3d_backward",
    "bspline_warp3d",
    "bspline_warp3d_backward",
    "explain",
    "grid_sampler3d",
    "grid_sampler3d_backward",
    "warp3d",
    "warp3d_backward",
]


def _forward(call):
    return restore_output(call, backends.forward(call.engine, call.x, call.field, call.options.sampling))


def _backward(call):
    options = call.options
    gradients = backends.backward(
        call.engine, call.grad, call.x, call.field, options.sampling, call.outputs, options.deterministic
    )
    return restore_gradients(call, gradients)


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
    options = parse_options(interpolation_mode, padding_mode, align_corners, data_format=data_format, backend=backend)
    return _forward(parse_call(FieldKind.GRID, options, input, grid=grid, where="grid_sampler3d"))


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
    options = parse_options(
        interpolation_mode,
        padding_mode,
        align_corners,
        data_format=data_format,
        backend=backend,
        deterministic=deterministic,
    )
    call = parse_call(
        FieldKind.GRID,
        options,
        input,
        grid=grid,
        grad=grad,
        output_mask=output_mask,
        backward=True,
        where="grid_sampler3d_backward",
    )
    return _backward(call)


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
    options = parse_options(
        interpolation_mode,
        padding_mode,
        align_corners,
        data_format=data_format,
        displacement_format=displacement_format,
        backend=backend,
    )
    return _forward(parse_call(FieldKind.DISPLACEMENT, options, volume, displacement=displacement, where="warp3d"))


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
    options = parse_options(
        interpolation_mode,
        padding_mode,
        align_corners,
        data_format=data_format,
        displacement_format=displacement_format,
        backend=backend,
        deterministic=deterministic,
    )
    call = parse_call(
        FieldKind.DISPLACEMENT,
        options,
        volume,
        displacement=displacement,
        grad=grad,
        output_mask=output_mask,
        backward=True,
        where="warp3d_backward",
    )
    return _backward(call)


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
    options = parse_options(
        interpolation_mode,
        padding_mode,
        align_corners,
        data_format=data_format,
        displacement_format=displacement_format,
        backend=backend,
    )
    call = parse_call(
        FieldKind.AFFINE, options, volume, theta=theta, size=size, displacement=displacement, where="affine_warp3d"
    )
    return _forward(call)


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
    options = parse_options(
        interpolation_mode,
        padding_mode,
        align_corners,
        data_format=data_format,
        displacement_format=displacement_format,
        backend=backend,
        deterministic=deterministic,
    )
    call = parse_call(
        FieldKind.AFFINE,
        options,
        volume,
        theta=theta,
        size=size,
        displacement=displacement,
        grad=grad,
        output_mask=output_mask,
        backward=True,
        where="affine_warp3d_backward",
    )
    return _backward(call)


def bspline_warp3d(
    volume,
    control_points,
    size=None,
    spacing=None,
    origin=None,
    theta=None,
    interpolation_mode="bilinear",
    padding_mode="zeros",
    align_corners=False,
    data_format="NCDHW",
    backend="auto",
):
    """Sample a volume at a cubic B-spline free-form deformation of the output's voxels, with no dense field.

    Output voxel p = (d, h, w) samples at ``p + u(p)``, or with ``theta`` at ``M p + u(p)``
    (``M`` theta in voxel terms, as :func:`affine_warp3d` composes its displacement), where
    ``u`` is the cubic B-spline of the control points (:mod:`gridsampler3d.bspline`;
    docs/semantics.md, "The B-spline field", has the formulas). The engines evaluate ``u``
    per point, in float64.

    Args:
        volume: (N, C, D, H, W), or (N, D, H, W, C) with ``data_format="NDHWC"``; a torch
            tensor (any device) or a NumPy array; float16/bfloat16/float32/float64.
        control_points: (N, 3, Kd, Kh, Kw), K >= 4 per axis, (dz, dy, dx) in input voxels;
            the volume's dtype and device.
        size: the output's (Do, Ho, Wo); default the volume's (D, H, W).
        spacing, origin: the control grid in output voxels, each one number or (d, h, w);
            default spacing ``(S - 1) / (K - 3)`` per axis and origin ``-spacing``.
        theta: None, or (N, 3, 4) as ``F.affine_grid`` takes it.
        interpolation_mode, padding_mode, align_corners, data_format, backend: as for
            :func:`grid_sampler3d`.

    Returns:
        (N, C, Do, Ho, Wo), or (N, Do, Ho, Wo, C) for NDHWC, of the volume's kind, dtype and device.
    """
    options = parse_options(interpolation_mode, padding_mode, align_corners, data_format=data_format, backend=backend)
    call = parse_call(
        FieldKind.BSPLINE,
        options,
        volume,
        control_points=control_points,
        theta=theta,
        size=size,
        spacing=spacing,
        origin=origin,
        where="bspline_warp3d",
    )
    return _forward(call)


def bspline_warp3d_backward(
    grad,
    volume,
    control_points,
    size=None,
    spacing=None,
    origin=None,
    theta=None,
    interpolation_mode="bilinear",
    padding_mode="zeros",
    align_corners=False,
    output_mask=(True, True, True),
    data_format="NCDHW",
    backend="auto",
    deterministic=None,
):
    """Gradients of :func:`bspline_warp3d`: (dvolume, dcontrol_points, dtheta).

    Args:
        grad: dL/dy, (N, C, Do, Ho, Wo) or (N, Do, Ho, Wo, C).
        volume, control_points, size, spacing, origin, theta, interpolation_mode, padding_mode,
            align_corners, data_format, backend: as for :func:`bspline_warp3d`.
        output_mask: (compute dvolume, compute dcontrol_points, compute dtheta); an output not
            asked for (or, without theta, dtheta) is ``None`` and not computed.
        deterministic: as for :func:`grid_sampler3d_backward`. dcontrol_points and dtheta are
            summed in float64 in a fixed order in every mode (the same bits for any thread
            count) and rounded once; no (N, 3, Do, Ho, Wo) gradient is stored on the way.

    Returns:
        ``(dvolume, dcontrol_points, dtheta)``, shaped and laid out like volume, the control points and theta.
    """
    options = parse_options(
        interpolation_mode,
        padding_mode,
        align_corners,
        data_format=data_format,
        backend=backend,
        deterministic=deterministic,
    )
    call = parse_call(
        FieldKind.BSPLINE,
        options,
        volume,
        control_points=control_points,
        theta=theta,
        size=size,
        spacing=spacing,
        origin=origin,
        grad=grad,
        output_mask=output_mask,
        backward=True,
        where="bspline_warp3d_backward",
    )
    return _backward(call)


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
    spacing=None,
    origin=None,
    theta=None,
):
    """The plan an engine makes for a call, made as the call would make it, without running any kernel.

    With ``grad`` the plan is the backward's (:func:`grid_sampler3d_backward`), else the
    forward's (:func:`grid_sampler3d`). ``field`` is the grid (N, Do, Ho, Wo, 3); with
    ``field_kind="displacement"``, the fused warp's displacement (N, 3, D, H, W)
    (:func:`warp3d`); with ``field_kind="affine"``, theta (N, 3, 4), with ``size`` and an
    optional ``displacement`` (N, 3, Do, Ho, Wo) (:func:`affine_warp3d`; ``output_mask`` is
    then (dvolume, dtheta, ddisplacement), or a pair (dvolume, dtheta) with ddisplacement asked for);
    with ``field_kind="bspline"``, the control points (N, 3, Kd, Kh, Kw), with ``size``,
    ``spacing``, ``origin`` and an optional ``theta`` (:func:`bspline_warp3d`; ``output_mask``
    (dvolume, dcontrol_points, dtheta), or a pair with dtheta asked for).

    CPU tensors get the CPU engine's plan (:mod:`gridsampler3d.cpu.planner`): it depends on
    the shapes, layout, dtype, modes, outputs, ``torch.get_num_threads()`` and, where it
    matters, on whether the grid is smooth and grad finite (measured here, in torch).
    CUDA tensors, or any tensors with ``device="cuda"`` (meta tensors too, without a GPU),
    get the GPU engine's plan (:mod:`gridsampler3d.gpu.planner`), made from the shapes,
    strides, dtype, modes, outputs, ``deterministic`` (None: torch's flag) and the GPU's
    compute capability (where there is no GPU, sm_90, and the plan says it assumed it:
    ``capability_assumed``, and "(assumed: no GPU here)" in its line).

    Args: as for :func:`grid_sampler3d_backward` (or :func:`warp3d_backward`, :func:`affine_warp3d_backward`).

    Returns:
        A frozen plan record; ``str(plan)`` reads as one line.
    """
    kind = validate.check_field_kind(field_kind)
    options = parse_options(
        interpolation_mode, padding_mode, align_corners, data_format=data_format, deterministic=deterministic
    )
    if (kind.affine or kind.spline) and grad is not None and _length(output_mask) == 2:
        output_mask = (*output_mask, True)
    if kind.affine:
        operands = {"theta": field, "size": size, "displacement": displacement}
    elif kind.spline:
        operands = {"control_points": field, "size": size, "spacing": spacing, "origin": origin, "theta": theta}
    else:
        operands = {kind.name.lower(): field}
    call = parse_call(kind, options, input, grad=grad, output_mask=output_mask, runs=False, where="explain", **operands)
    target = call.x.device if device is None else validate.check_device(device)
    stage = Stage.FORWARD if grad is None else Stage.BACKWARD
    if target.type == "cuda":
        from .gpu.engine import plan_call as plan_gpu_call

        deterministic = (
            torch.are_deterministic_algorithms_enabled() if options.deterministic is None else options.deterministic
        )
        return plan_gpu_call(
            stage,
            call.x,
            call.field,
            options.sampling,
            outputs=call.outputs,
            deterministic=deterministic,
            device=target,
        )
    validate.check_plan_device(target, call.x.device)
    from .cpu.engine import plan_call

    return plan_call(stage, call.x, call.field, options.sampling, grad=call.grad, outputs=call.outputs)


def _length(value) -> int | None:
    try:
        return len(value)
    except TypeError:
        return None
