"""PyTorch integration of the affine field: ``affine_warp``, ``AffineWarp3d``, their custom ops and autograd.

    gridsampler3d::affine_warp3d(volume, theta, displacement?, size, interpolation_mode, padding_mode,
                                 align_corners) -> y
    gridsampler3d::affine_warp3d_backward(grad, volume, theta, displacement?, size, interpolation_mode,
                                          padding_mode, align_corners, output_mask) -> (dvolume, dtheta,
                                                                                        ddisplacement)

NCDHW tensors, displacements (N, 3, Do, Ho, Wo), the aclnn integer codes; an output of the
backward not asked for (or, without a displacement, its gradient) comes back empty. As for
the grid sampler (:mod:`.torch_ops`), eager calls on plain tensors skip the dispatcher, and
second derivatives run through :func:`.composite.sample`. While ``torch.onnx.export``
traces a model, ``affine_warp`` calls :func:`.onnx.affine_warp` instead (AffineGrid and
GridSample).
"""

import typing

import torch
from torch import Tensor

from . import api, composite, onnx
from .layout import from_ncdhw, memory_format_of, to_ncdhw
from .modes import parse_data_format, parse_displacement_format
from .sampling import Field, Outputs, Sampling
from .torch_ops import eager, second_derivatives
from .validate import check_affine

__all__ = ["affine_warp", "AffineWarp3d"]


@torch.library.custom_op("gridsampler3d::affine_warp3d", mutates_args=())
def affine_warp3d_op(
    volume: Tensor,
    theta: Tensor,
    displacement: typing.Optional[Tensor],
    size: typing.List[int],
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
) -> Tensor:
    """volume (N, C, D, H, W) at theta (N, 3, 4) (+ displacement (N, 3, *size)) -> (N, C, *size)."""
    return api.affine_warp3d(volume, theta, tuple(size), displacement, interpolation_mode, padding_mode, align_corners)


@affine_warp3d_op.register_fake
def _affine_warp3d_fake(volume, theta, displacement, size, interpolation_mode, padding_mode, align_corners):
    return torch.empty(
        (volume.shape[0], volume.shape[1], *size),
        dtype=volume.dtype,
        device=volume.device,
        memory_format=memory_format_of(volume),
    )


@torch.library.custom_op("gridsampler3d::affine_warp3d_backward", mutates_args=())
def affine_warp3d_backward_op(
    grad: Tensor,
    volume: Tensor,
    theta: Tensor,
    displacement: typing.Optional[Tensor],
    size: typing.List[int],
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
    output_mask: typing.List[bool],
) -> typing.Tuple[Tensor, Tensor, Tensor]:
    """(dvolume, dtheta, ddisplacement); one not asked for is an empty tensor."""
    dx, dtheta, dfield = api.affine_warp3d_backward(
        grad,
        volume,
        theta,
        tuple(size),
        displacement,
        interpolation_mode,
        padding_mode,
        align_corners,
        output_mask=tuple(output_mask),
    )
    empty = volume.new_empty(0)
    return (empty if dx is None else dx), (empty if dtheta is None else dtheta), (empty if dfield is None else dfield)


@affine_warp3d_backward_op.register_fake
def _affine_warp3d_backward_fake(
    grad, volume, theta, displacement, size, interpolation_mode, padding_mode, align_corners, output_mask
):
    empty = volume.new_empty(0)
    dx = torch.empty_like(volume, memory_format=memory_format_of(volume)) if output_mask[0] else empty
    dtheta = torch.empty_like(theta) if output_mask[1] else empty
    dfield = (
        torch.empty_like(displacement, memory_format=memory_format_of(displacement))
        if output_mask[2] and displacement is not None
        else empty
    )
    return dx, dtheta, dfield


def _setup_context(ctx, inputs, output):
    volume, theta, displacement, size, *attributes = inputs
    ctx.save_for_backward(volume, theta, displacement)
    ctx.size, ctx.attributes = tuple(size), tuple(attributes)


def _backward(ctx, grad_output):
    volume, theta, displacement = ctx.saved_tensors
    output_mask = [
        ctx.needs_input_grad[0],
        ctx.needs_input_grad[1],
        displacement is not None and ctx.needs_input_grad[2],
    ]
    dx, dtheta, dfield = affine_warp3d_backward_op(
        grad_output, volume, theta, displacement, list(ctx.size), *ctx.attributes, output_mask
    )
    return (
        (dx if output_mask[0] else None),
        (dtheta if output_mask[1] else None),
        (dfield if output_mask[2] else None),
        None,
        None,
        None,
        None,
    )


def _setup_backward_context(ctx, inputs, output):
    grad, volume, theta, displacement, size, *attributes, output_mask = inputs
    ctx.save_for_backward(grad, volume, theta, displacement)
    ctx.size, ctx.attributes, ctx.output_mask = tuple(size), tuple(attributes), output_mask


def _double_backward(ctx, grad_dx, grad_dtheta, grad_dfield):
    """Gradients of <grad_dx, dx> + <grad_dtheta, dtheta> + <grad_dfield, dfield> through the composite."""
    sampling, size = Sampling.parse(*ctx.attributes), ctx.size

    def differentiable(volume, theta, displacement):
        return composite.sample(volume, Field.affine(theta, size, displacement), sampling)

    grads = second_derivatives(differentiable, ctx.saved_tensors, ctx.output_mask, (grad_dx, grad_dtheta, grad_dfield))
    return (*grads, None, None, None, None, None)


affine_warp3d_op.register_autograd(_backward, setup_context=_setup_context)
affine_warp3d_backward_op.register_autograd(_double_backward, setup_context=_setup_backward_context)


class _EagerAffine(torch.autograd.Function):
    """``affine_warp``'s autograd without the dispatcher, for plain tensors run eagerly (:func:`.torch_ops.eager`).

    Its backward runs :func:`.api.sample_backward` (the forward checked the operands), or the
    backward custom op when the backward itself is to be differentiated, whose autograd gives
    the second derivatives.
    """

    @staticmethod
    def forward(ctx, volume, theta, displacement, size, interpolation, padding, align_corners):
        ctx.save_for_backward(volume, theta, displacement)
        ctx.size, ctx.attributes = tuple(size), (interpolation, padding, align_corners)
        return api.sample(volume, Field.affine(theta, size, displacement), Sampling.parse(*ctx.attributes))

    @staticmethod
    def backward(ctx, grad_output):
        if torch.is_grad_enabled():
            return _backward(ctx, grad_output)
        volume, theta, displacement = ctx.saved_tensors
        wanted = Outputs(
            ctx.needs_input_grad[0], displacement is not None and ctx.needs_input_grad[2], ctx.needs_input_grad[1]
        )
        dx, dfield, dtheta = api.sample_backward(
            grad_output, volume, Field.affine(theta, ctx.size, displacement), Sampling.parse(*ctx.attributes), wanted
        )
        return dx, dtheta, dfield, None, None, None, None


def affine_warp(
    volume: Tensor,
    theta: Tensor,
    size=None,
    *,
    displacement: Tensor | None = None,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: bool = False,
    data_format: str = "NCDHW",
    displacement_format: str = "N3DHW",
) -> Tensor:
    """Sample ``volume`` at ``F.affine_grid(theta, ...)``, plus an optional displacement, with no grid; differentiable.

    Equal to ``F.grid_sample(volume, F.affine_grid(theta, (N, C, *size), align_corners), mode,
    padding_mode, align_corners)`` without a displacement; with one, each output voxel samples
    at the affine's position plus the displacement in input voxels (:func:`.api.affine_warp3d`,
    docs/semantics.md). Gradients flow to the volume, to theta (summed in float64 in a fixed
    order, never through a stored grid) and to the displacement.

    Args:
        volume: (N, C, D, H, W), or (N, D, H, W, C) with ``data_format="NDHWC"``.
        theta: (N, 3, 4), as ``F.affine_grid`` takes it; the volume's dtype and device.
        size: the output's (Do, Ho, Wo); default the volume's (D, H, W).
        displacement: None, or (N, 3, Do, Ho, Wo) (with ``displacement_format="NDHW3"``,
            (N, Do, Ho, Wo, 3)), components (dz, dy, dx) in input voxels.
        mode: "bilinear", "nearest" or "bicubic" (tricubic).
        padding_mode: "zeros", "border" or "reflection".
        align_corners: as in ``F.affine_grid`` and ``F.grid_sample``.

    Returns:
        (N, C, Do, Ho, Wo), or (N, Do, Ho, Wo, C) for NDHWC. Under ``torch.autocast`` it
        computes in float32, as PyTorch's grid sampler does.
    """
    data_format = parse_data_format(data_format)
    displacement_format = parse_displacement_format(displacement_format)
    sampling = Sampling.parse(mode, padding_mode, align_corners)
    if torch.is_autocast_enabled(volume.device.type):  # checked as the float32 call that runs
        volume, theta = volume.float(), theta.float()
        displacement = None if displacement is None else displacement.float()
    volume, theta, size, displacement = check_affine(
        volume, theta, size, displacement, data_format, displacement_format
    )
    x = to_ncdhw(volume, data_format)
    field = api.affine_field(theta, size, displacement, displacement_format)
    if onnx.exporting():
        return from_ncdhw(onnx.affine_warp(x, field, sampling), data_format)
    if torch.is_autocast_enabled(x.device.type):
        with torch.autocast(x.device.type, enabled=False):
            return from_ncdhw(_sample(x, field, sampling), data_format)
    return from_ncdhw(_sample(x, field, sampling), data_format)


def _sample(x: Tensor, field: Field, sampling: Sampling) -> Tensor:
    """The affine sampling through the custom op, the eager autograd function, or (no gradient asked) the API."""
    attributes = (int(sampling.interpolation), int(sampling.padding), sampling.align_corners)
    tensors = [tensor for tensor in (x, field.theta, field.tensor) if tensor is not None]
    if not eager(*tensors):
        return affine_warp3d_op(x, field.theta, field.tensor, list(field.size or field.out_sizes), *attributes)
    if torch.is_grad_enabled() and any(tensor.requires_grad for tensor in tensors):
        return _EagerAffine.apply(x, field.theta, field.tensor, field.out_sizes, *attributes)
    return api.sample(x, field, sampling)


class AffineWarp3d(torch.nn.Module):
    """:func:`affine_warp` as a module: ``forward(volume, theta, displacement=None)``.

    volume (N, C, D, H, W), theta (N, 3, 4), an optional displacement (N, 3, Do, Ho, Wo) in
    voxels -> (N, C, Do, Ho, Wo), ``size`` (Do, Ho, Wo) fixed at construction (default: the
    volume's). Other layouts through ``data_format`` and ``displacement_format``.
    """

    def __init__(
        self,
        size=None,
        mode: str = "bilinear",
        padding_mode: str = "zeros",
        align_corners: bool = False,
        data_format: str = "NCDHW",
        displacement_format: str = "N3DHW",
    ):
        super().__init__()
        self.size = None if size is None else tuple(size)
        self.mode, self.padding_mode, self.align_corners = mode, padding_mode, align_corners
        self.data_format, self.displacement_format = data_format, displacement_format

    def forward(self, volume: Tensor, theta: Tensor, displacement: Tensor | None = None) -> Tensor:
        return affine_warp(
            volume,
            theta,
            self.size,
            displacement=displacement,
            mode=self.mode,
            padding_mode=self.padding_mode,
            align_corners=self.align_corners,
            data_format=self.data_format,
            displacement_format=self.displacement_format,
        )

    def extra_repr(self) -> str:
        return (
            f"size={self.size}, mode={self.mode!r}, padding_mode={self.padding_mode!r}, "
            f"align_corners={self.align_corners}, data_format={self.data_format!r}, "
            f"displacement_format={self.displacement_format!r}"
        )
