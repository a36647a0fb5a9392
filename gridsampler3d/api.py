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

from .backends import select_backend
from .layout import from_ncdhw, memory_format_of, to_ncdhw
from .modes import (DisplacementFormat, parse_align_corners, parse_data_format, parse_displacement_format,
                    parse_interpolation, parse_output_mask, parse_padding)
from .validate import check_backward, check_deterministic, check_forward, check_warp, check_warp_backward

__all__ = ["explain", "grid_sampler3d", "grid_sampler3d_backward", "warp3d", "warp3d_backward"]


def _like_caller(tensor, reference_operand):
    """Return ``tensor`` as the same kind (NumPy array or torch tensor) as the caller's operand."""
    if tensor is None or isinstance(reference_operand, torch.Tensor):
        return tensor
    return np.ascontiguousarray(tensor.numpy())


def grid_sampler3d(input, grid, interpolation_mode="bilinear", padding_mode="zeros",
                   align_corners=False, data_format="NCDHW", backend="auto"):
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
    interpolation = parse_interpolation(interpolation_mode)
    padding = parse_padding(padding_mode)
    align_corners = parse_align_corners(align_corners)
    data_format = parse_data_format(data_format)
    caller_input = input
    input, grid = check_forward(input, grid, data_format)
    x = to_ncdhw(input, data_format)
    engine = select_backend(backend, x.device)
    batch, channels = x.shape[:2]
    out_shape = (batch, channels) + tuple(grid.shape[1:4])
    if x.numel() == 0 or grid.numel() == 0:
        y = torch.empty(out_shape, dtype=x.dtype, device=x.device, memory_format=memory_format_of(x)).zero_()
    else:
        y = engine.forward(x, grid, interpolation, padding, align_corners)
    return _like_caller(from_ncdhw(y, data_format), caller_input)


def grid_sampler3d_backward(grad, input, grid, interpolation_mode="bilinear", padding_mode="zeros",
                            align_corners=False, output_mask=(True, True), data_format="NCDHW",
                            backend="auto", deterministic=None):
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
    interpolation = parse_interpolation(interpolation_mode)
    padding = parse_padding(padding_mode)
    align_corners = parse_align_corners(align_corners)
    output_mask = parse_output_mask(output_mask)
    data_format = parse_data_format(data_format)
    deterministic = check_deterministic(deterministic)
    caller_input, caller_grid = input, grid
    grad, input, grid = check_backward(grad, input, grid, data_format)
    grad, x = to_ncdhw(grad, data_format), to_ncdhw(input, data_format)
    dx, dgrid = checked_backward(grad, x, grid, interpolation, padding, align_corners, output_mask,
                                 backend=backend, deterministic=deterministic)
    if dx is not None:
        dx = _like_caller(from_ncdhw(dx, data_format), caller_input)
    return dx, _like_caller(dgrid, caller_grid)


def checked_backward(grad, x, field, interpolation, padding, align_corners, output_mask, *, warp=False,
                     backend="auto", deterministic=None):
    """The backward of operands already checked: what :func:`grid_sampler3d_backward` (or, with ``warp``,
    :func:`warp3d_backward`) runs after its checks, on NCDHW tensors, the displacement as (N, 3, D, H, W).

    ``interpolation``, ``padding``, ``align_corners`` and ``output_mask`` as the parse
    functions of :mod:`.modes` return them. Autograd's backward calls it directly: its
    forward checked the operands, and autograd gives grad the output's shape and dtype.
    Returns ``(dx, dfield)`` in the engine's layouts; None where not asked for.
    """
    engine = select_backend(backend, x.device)
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    if not any(output_mask):
        return None, None
    if grad.numel() == 0 or x.numel() == 0:
        dx = torch.zeros_like(x, memory_format=memory_format_of(x)) if output_mask[0] else None
        layout = torch.preserve_format if warp else torch.contiguous_format  # a grid gradient is contiguous
        return dx, (torch.zeros_like(field, memory_format=layout) if output_mask[1] else None)
    run = engine.warp_backward if warp else engine.backward
    return run(grad, x, field, interpolation, padding, align_corners, output_mask, deterministic)


def _displacement_to_n3dhw(displacement: torch.Tensor, displacement_format: DisplacementFormat) -> torch.Tensor:
    """A zero-copy logical (N, 3, D, H, W) view of a displacement given in ``displacement_format``."""
    return displacement.permute(0, 4, 1, 2, 3) if displacement_format == DisplacementFormat.NDHW3 else displacement


def _displacement_from_n3dhw(tensor: torch.Tensor, displacement_format: DisplacementFormat) -> torch.Tensor:
    """A logical (N, 3, D, H, W) result (laid out like the displacement) back in ``displacement_format``:
    NDHW3 comes back contiguous, free since the engines write it channels-last."""
    if displacement_format == DisplacementFormat.NDHW3:
        return tensor.permute(0, 2, 3, 4, 1).contiguous()
    return tensor


def warp3d(volume, displacement, interpolation_mode="bilinear", padding_mode="border", align_corners=True,
           data_format="NCDHW", displacement_format="N3DHW", backend="auto"):
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
    interpolation = parse_interpolation(interpolation_mode)
    padding = parse_padding(padding_mode)
    align_corners = parse_align_corners(align_corners)
    data_format = parse_data_format(data_format)
    displacement_format = parse_displacement_format(displacement_format)
    caller_volume = volume
    volume, displacement = check_warp(volume, displacement, data_format, displacement_format)
    x = to_ncdhw(volume, data_format)
    field = _displacement_to_n3dhw(displacement, displacement_format)
    engine = select_backend(backend, x.device)
    if x.numel() == 0:
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=memory_format_of(x)).zero_()
    else:
        y = engine.warp(x, field, interpolation, padding, align_corners)
    return _like_caller(from_ncdhw(y, data_format), caller_volume)


def warp3d_backward(grad, volume, displacement, interpolation_mode="bilinear", padding_mode="border",
                    align_corners=True, output_mask=(True, True), data_format="NCDHW", displacement_format="N3DHW",
                    backend="auto", deterministic=None):
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
    interpolation = parse_interpolation(interpolation_mode)
    padding = parse_padding(padding_mode)
    align_corners = parse_align_corners(align_corners)
    output_mask = parse_output_mask(output_mask, "dvolume, ddisplacement")
    data_format = parse_data_format(data_format)
    displacement_format = parse_displacement_format(displacement_format)
    deterministic = check_deterministic(deterministic)
    caller_volume, caller_displacement = volume, displacement
    grad, volume, displacement = check_warp_backward(grad, volume, displacement, data_format, displacement_format)
    grad, x = to_ncdhw(grad, data_format), to_ncdhw(volume, data_format)
    field = _displacement_to_n3dhw(displacement, displacement_format)
    dx, dfield = checked_backward(grad, x, field, interpolation, padding, align_corners, output_mask, warp=True,
                                  backend=backend, deterministic=deterministic)
    if dx is not None:
        dx = _like_caller(from_ncdhw(dx, data_format), caller_volume)
    if dfield is not None:
        dfield = _like_caller(_displacement_from_n3dhw(dfield, displacement_format), caller_displacement)
    return dx, dfield


def explain(input, grid, grad=None, interpolation_mode="bilinear", padding_mode="zeros", align_corners=False,
            output_mask=(True, True), data_format="NCDHW", warp=False):
    """The CPU engine's plan for a call, made as the call would make it, without running any kernel.

    With ``grad`` the plan is the backward's (:func:`grid_sampler3d_backward`), else the
    forward's (:func:`grid_sampler3d`). With ``warp`` the call is the fused warp
    (:func:`warp3d`): ``grid`` is then the displacement (N, 3, D, H, W). The plan depends
    on the shapes, layout, dtype, modes, outputs, ``torch.get_num_threads()`` and, where
    it matters, on whether the grid is smooth and grad finite (measured here, in torch).

    Args: as for :func:`grid_sampler3d_backward` (or :func:`warp3d_backward`); CPU tensors.

    Returns:
        ``gridsampler3d.cpu.planner.Plan``: a frozen record of the strategy and its
        parameters; ``str(plan)`` reads as one line.
    """
    from .cpu.engine import plan_call
    from .cpu.planner import Stage

    interpolation, padding = parse_interpolation(interpolation_mode), parse_padding(padding_mode)
    align_corners = parse_align_corners(align_corners)
    data_format = parse_data_format(data_format)
    output_mask = parse_output_mask(output_mask)
    if warp:
        checked = check_warp(input, grid, data_format, DisplacementFormat.N3DHW) if grad is None else \
            check_warp_backward(grad, input, grid, data_format, DisplacementFormat.N3DHW)
    else:
        checked = check_forward(input, grid, data_format) if grad is None else \
            check_backward(grad, input, grid, data_format)
    grad, input, grid = (None, *checked) if grad is None else checked
    if input.device.type != "cpu":
        raise ValueError(f"explain: plans are made by the CPU engine; the tensors are on {input.device}")
    x = to_ncdhw(input, data_format)
    stage = Stage.FORWARD if grad is None else Stage.BACKWARD
    return plan_call(stage, x, grid, interpolation, padding, align_corners, voxels=warp,
                     grad=None if grad is None else to_ncdhw(grad, data_format), output_mask=output_mask)
