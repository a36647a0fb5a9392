"""PyTorch integration: custom ops, autograd, the ``F.grid_sample`` drop-in and ``Warp3d``.

    gridsampler3d::grid_sampler3d(input, grid, interpolation_mode, padding_mode, align_corners) -> y
    gridsampler3d::grid_sampler3d_backward(grad, input, grid, interpolation_mode, padding_mode,
                                           align_corners, output_mask) -> (dx, dgrid)

Both take NCDHW tensors (a channels-last tensor is accepted as is) and the aclnn integer
codes. An output of the backward that ``output_mask`` does not ask for comes back as an
empty tensor (custom ops cannot return None); the autograd layer turns it into None.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import api, composite
from .layout import from_ncdhw, memory_format_of, to_ncdhw
from .modes import DataFormat, parse_align_corners, parse_data_format, parse_interpolation, parse_padding

__all__ = ["grid_sample", "Warp3d"]


@torch.library.custom_op("gridsampler3d::grid_sampler3d", mutates_args=())
def grid_sampler3d_op(input: Tensor, grid: Tensor, interpolation_mode: int, padding_mode: int,
                      align_corners: bool) -> Tensor:
    """Forward: input (N, C, Di, Hi, Wi), grid (N, Do, Ho, Wo, 3) -> (N, C, Do, Ho, Wo)."""
    return api.grid_sampler3d(input, grid, interpolation_mode, padding_mode, align_corners)


@grid_sampler3d_op.register_fake
def _grid_sampler3d_fake(input, grid, interpolation_mode, padding_mode, align_corners):
    shape = (input.shape[0], input.shape[1], grid.shape[1], grid.shape[2], grid.shape[3])
    return torch.empty(shape, dtype=input.dtype, device=input.device, memory_format=memory_format_of(input))


@torch.library.custom_op("gridsampler3d::grid_sampler3d_backward", mutates_args=())
def grid_sampler3d_backward_op(grad: Tensor, input: Tensor, grid: Tensor, interpolation_mode: int,
                               padding_mode: int, align_corners: bool,
                               output_mask: list[bool]) -> tuple[Tensor, Tensor]:
    """Backward: (dx like input, dgrid like grid); an output not asked for is an empty tensor."""
    dx, dgrid = api.grid_sampler3d_backward(grad, input, grid, interpolation_mode, padding_mode, align_corners,
                                            output_mask=tuple(output_mask))
    return (input.new_empty(0) if dx is None else dx), (grid.new_empty(0) if dgrid is None else dgrid)


@grid_sampler3d_backward_op.register_fake
def _grid_sampler3d_backward_fake(grad, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    dx = torch.empty_like(input, memory_format=memory_format_of(input)) if output_mask[0] else input.new_empty(0)
    dgrid = torch.empty_like(grid, memory_format=torch.contiguous_format) if output_mask[1] else grid.new_empty(0)
    return dx, dgrid


def _setup_context(ctx, inputs, output):
    input, grid, interpolation_mode, padding_mode, align_corners = inputs
    ctx.save_for_backward(input, grid)
    ctx.attributes = (interpolation_mode, padding_mode, align_corners)


def _backward(ctx, grad_output):
    input, grid = ctx.saved_tensors
    output_mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1]]
    dx, dgrid = grid_sampler3d_backward_op(grad_output, input, grid, *ctx.attributes, output_mask)
    return (dx if output_mask[0] else None), (dgrid if output_mask[1] else None), None, None, None


grid_sampler3d_op.register_autograd(_backward, setup_context=_setup_context)


def _setup_backward_context(ctx, inputs, output):
    grad, input, grid, interpolation_mode, padding_mode, align_corners, output_mask = inputs
    ctx.save_for_backward(grad, input, grid)
    ctx.attributes = (interpolation_mode, padding_mode, align_corners)
    ctx.output_mask = output_mask


def _double_backward(ctx, grad_dx, grad_dgrid):
    """Gradients of <grad_dx, dx> + <grad_dgrid, dgrid> through the differentiable composite."""
    saved = ctx.saved_tensors
    with torch.enable_grad():
        grad, input, grid = (tensor.detach().requires_grad_() for tensor in saved)
        output = composite.sample(input, grid, *ctx.attributes)
        dx, dgrid = torch.autograd.grad(output, (input, grid), grad, create_graph=True, allow_unused=True,
                                        materialize_grads=True)
        total = output.new_zeros(())
        if ctx.output_mask[0] and grad_dx is not None and grad_dx.numel():
            total = total + (dx * grad_dx).sum()
        if ctx.output_mask[1] and grad_dgrid is not None and grad_dgrid.numel():
            total = total + (dgrid * grad_dgrid).sum()
        if not total.requires_grad:
            return None, None, None, None, None, None, None
        grads = torch.autograd.grad(total, (grad, input, grid), allow_unused=True, materialize_grads=True)
    return (*grads, None, None, None, None)


grid_sampler3d_backward_op.register_autograd(_double_backward, setup_context=_setup_backward_context)


def grid_sample(input: Tensor, grid: Tensor, mode: str = "bilinear", padding_mode: str = "zeros",
                align_corners: bool = False, data_format: str = "NCDHW") -> Tensor:
    """``torch.nn.functional.grid_sample`` for 5-D input, on this library's kernels; differentiable.

    Args:
        input: (N, C, Di, Hi, Wi), or (N, Di, Hi, Wi, C) with ``data_format="NDHWC"``.
        grid: (N, Do, Ho, Wo, 3), (x, y, z) normalised to [-1, 1].
        mode: "bilinear", "nearest" or "bicubic" (tricubic on 5-D input; or the integer codes).
        padding_mode: "zeros", "border" or "reflection" (or 0, 1, 2).
        align_corners: as in ``F.grid_sample``.
        data_format: "NCDHW" or "NDHWC" for ``input`` and the output.

    Returns:
        (N, C, Do, Ho, Wo), or (N, Do, Ho, Wo, C) for NDHWC. 4-D input is passed on to
        ``F.grid_sample`` unchanged. Under ``torch.autocast`` it computes in float32, as
        PyTorch's grid sampler does.
    """
    data_format = parse_data_format(data_format)
    interpolation = parse_interpolation(mode)
    padding = parse_padding(padding_mode)
    align_corners = parse_align_corners(align_corners)
    if input.dim() == 4 and data_format == DataFormat.NCDHW:
        return F.grid_sample(input, grid, interpolation.name.lower(), padding.name.lower(), align_corners)
    if input.dim() == 5:  # anything else reaches the op's own shape check, which names it
        input = to_ncdhw(input, data_format)
    device_type = input.device.type
    if torch.is_autocast_enabled(device_type):
        with torch.autocast(device_type, enabled=False):
            output = grid_sampler3d_op(input.float(), grid.float(), int(interpolation), int(padding), align_corners)
    else:
        output = grid_sampler3d_op(input, grid, int(interpolation), int(padding), align_corners)
    return from_ncdhw(output, data_format)


class Warp3d(torch.nn.Module):
    """Warp a volume by a dense displacement field given in voxels (the registration layer).

    ``forward(volume, displacement)``: volume (N, C, D, H, W), displacement (N, 3, D, H, W)
    with channels (dz, dy, dx) in voxels -> the volume sampled at identity + displacement,
    (N, C, D, H, W). The grid is normalised with ``align_corners``.
    """

    def __init__(self, mode: str = "bilinear", padding_mode: str = "border", align_corners: bool = True):
        super().__init__()
        self.mode, self.padding_mode, self.align_corners = mode, padding_mode, align_corners

    def forward(self, volume: Tensor, displacement: Tensor) -> Tensor:
        if displacement.dim() != 5 or displacement.shape[1] != 3:
            raise ValueError(f"displacement must be (N, 3, D, H, W); got shape {tuple(displacement.shape)}")
        if displacement.shape[2:] != volume.shape[2:] or displacement.shape[0] != volume.shape[0]:
            raise ValueError(f"displacement's N, D, H, W must equal volume's {tuple(volume.shape[:1] + volume.shape[2:])}"
                             f"; got {tuple(displacement.shape[:1] + displacement.shape[2:])}")
        sizes = volume.shape[2:]
        axes = [torch.arange(size, device=volume.device, dtype=displacement.dtype) for size in sizes]
        identity = torch.stack(torch.meshgrid(*axes, indexing="ij"))  # (3, D, H, W) as (z, y, x)
        position = identity.unsqueeze(0) + displacement
        normalised = []
        for axis, size in enumerate(sizes):
            coordinate = position[:, axis]
            if self.align_corners:
                normalised.append(2 * coordinate / max(size - 1, 1) - 1)
            else:
                normalised.append((2 * coordinate + 1) / size - 1)
        grid = torch.stack(normalised[::-1], dim=-1)  # (N, D, H, W, 3) as (x, y, z)
        return grid_sample(volume, grid.to(volume.dtype), self.mode, self.padding_mode, self.align_corners)
