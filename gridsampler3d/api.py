"""Public functions: validate, normalise, dispatch, return.

Shapes (NCDHW / NDHWC):

    input, dx   (N, C, Di, Hi, Wi)  /  (N, Di, Hi, Wi, C)
    grad, y     (N, C, Do, Ho, Wo)  /  (N, Do, Ho, Wo, C)
    grid, dgrid (N, Do, Ho, Wo, 3)  (x along W, y along H, z along D, in [-1, 1])
"""
from __future__ import annotations

import numpy as np
import torch

from .backends import select_backend
from .layout import from_ncdhw, memory_format_of, to_ncdhw
from .modes import parse_align_corners, parse_data_format, parse_interpolation, parse_output_mask, parse_padding
from .validate import check_backward, check_deterministic, check_forward

__all__ = ["grid_sampler3d", "grid_sampler3d_backward"]


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
    engine = select_backend(backend, x.device)
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()

    if not any(output_mask):
        return None, None
    if grad.numel() == 0 or x.numel() == 0:
        dx = torch.zeros_like(x, memory_format=memory_format_of(x)) if output_mask[0] else None
        dgrid = torch.zeros_like(grid, memory_format=torch.contiguous_format) if output_mask[1] else None
    else:
        dx, dgrid = engine.backward(grad, x, grid, interpolation, padding, align_corners, output_mask,
                                    deterministic)
    if dx is not None:
        dx = _like_caller(from_ncdhw(dx, data_format), caller_input)
    return dx, _like_caller(dgrid, caller_grid)
