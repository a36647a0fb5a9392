"""PyTorch integration: custom ops, autograd, the ``F.grid_sample`` drop-in and the fused warp.

    gridsampler3d::grid_sampler3d(input, grid, interpolation_mode, padding_mode, align_corners) -> y
    gridsampler3d::grid_sampler3d_backward(grad, input, grid, interpolation_mode, padding_mode,
                                           align_corners, output_mask) -> (dx, dgrid)
    gridsampler3d::warp3d(volume, displacement, interpolation_mode, padding_mode, align_corners) -> y
    gridsampler3d::warp3d_backward(grad, volume, displacement, interpolation_mode, padding_mode,
                                   align_corners, output_mask) -> (dvolume, ddisplacement)

All take NCDHW tensors (displacements (N, 3, D, H, W)) (a channels-last tensor is accepted as is) and the aclnn integer
codes. An output of the backward that ``output_mask`` does not ask for comes back as an
empty tensor (custom ops cannot return None); the autograd layer turns it into None.

While ``torch.onnx.export`` traces a model, ``grid_sample`` and ``warp`` (so ``Warp3d`` and
``integrate_velocity`` too) call the composites of ``onnx.py`` instead of the custom ops,
which no ONNX runtime knows.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from . import api, composite, onnx, torch_hooks
from .layout import from_ncdhw, memory_format_of, to_ncdhw
from .modes import DataFormat, DisplacementFormat, parse_data_format, parse_displacement_format
from .sampling import Field, FieldKind, Outputs, Sampling
from .validate import check_warp

__all__ = ["grid_sample", "warp", "Warp3d", "integrate_velocity"]


@torch.library.custom_op("gridsampler3d::grid_sampler3d", mutates_args=())
def grid_sampler3d_op(
    input: Tensor, grid: Tensor, interpolation_mode: int, padding_mode: int, align_corners: bool
) -> Tensor:
    """Forward: input (N, C, Di, Hi, Wi), grid (N, Do, Ho, Wo, 3) -> (N, C, Do, Ho, Wo)."""
    return api.grid_sampler3d(input, grid, interpolation_mode, padding_mode, align_corners)


@grid_sampler3d_op.register_fake
def _grid_sampler3d_fake(input, grid, interpolation_mode, padding_mode, align_corners):
    shape = (input.shape[0], input.shape[1], grid.shape[1], grid.shape[2], grid.shape[3])
    return torch.empty(shape, dtype=input.dtype, device=input.device, memory_format=memory_format_of(input))


@torch.library.custom_op("gridsampler3d::grid_sampler3d_backward", mutates_args=())
def grid_sampler3d_backward_op(
    grad: Tensor,
    input: Tensor,
    grid: Tensor,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
    output_mask: list[bool],
) -> tuple[Tensor, Tensor]:
    """Backward: (dx like input, dgrid like grid); an output not asked for is an empty tensor."""
    dx, dgrid = api.grid_sampler3d_backward(
        grad, input, grid, interpolation_mode, padding_mode, align_corners, output_mask=tuple(output_mask)
    )
    return (input.new_empty(0) if dx is None else dx), (grid.new_empty(0) if dgrid is None else dgrid)


@grid_sampler3d_backward_op.register_fake
def _grid_sampler3d_backward_fake(grad, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    dx = torch.empty_like(input, memory_format=memory_format_of(input)) if output_mask[0] else input.new_empty(0)
    dgrid = torch.empty_like(grid, memory_format=torch.contiguous_format) if output_mask[1] else grid.new_empty(0)
    return dx, dgrid


def second_derivatives(differentiable, saved, output_mask, grad_firsts) -> tuple:
    """The gradients, with respect to grad and each tensor ``differentiable`` takes, of the sum of
    <grad_firsts[k], d sum(grad * output) / d tensors[k]> over the first derivatives ``output_mask`` asked for:
    what a backward op's own backward returns. ``saved`` is (grad, *tensors); None tensors stay None."""
    with torch.enable_grad():
        grad, *tensors = (None if tensor is None else tensor.detach().requires_grad_() for tensor in saved)
        present = [tensor for tensor in tensors if tensor is not None]
        output = differentiable(*tensors)
        firsts = iter(
            torch.autograd.grad(output, present, grad, create_graph=True, allow_unused=True, materialize_grads=True)
        )
        total = output.new_zeros(())
        for tensor, wanted, grad_first in zip(tensors, output_mask, grad_firsts):
            first = None if tensor is None else next(firsts)
            if wanted and first is not None and grad_first is not None and grad_first.numel():
                total = total + (first * grad_first).sum()
        if not total.requires_grad:
            return (None,) * (1 + len(tensors))
        found = iter(torch.autograd.grad(total, [grad, *present], allow_unused=True, materialize_grads=True))
        return (next(found), *(None if tensor is None else next(found) for tensor in tensors))


def _register_autograd(forward_op, backward_op, kind: FieldKind) -> None:
    """Autograd for a sampling op pair: ``forward_op(input, field, *attributes)`` (field: of ``kind``) and
    ``backward_op(grad, input, field, *attributes, output_mask)``; second derivatives through
    :func:`.composite.sample`, the same rules in differentiable torch operations."""

    def setup_context(ctx, inputs, output):
        input, field, *attributes = inputs
        ctx.save_for_backward(input, field)
        ctx.attributes = tuple(attributes)

    def backward(ctx, grad_output):
        input, field = ctx.saved_tensors
        output_mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1]]
        dx, dfield = backward_op(grad_output, input, field, *ctx.attributes, output_mask)
        return (dx if output_mask[0] else None), (dfield if output_mask[1] else None), None, None, None

    def setup_backward_context(ctx, inputs, output):
        grad, input, field, *attributes, output_mask = inputs
        ctx.save_for_backward(grad, input, field)
        ctx.attributes = tuple(attributes)
        ctx.output_mask = output_mask

    def double_backward(ctx, grad_dx, grad_dfield):
        """Gradients of <grad_dx, dx> + <grad_dfield, dfield> through the differentiable composite."""
        sampling = Sampling.parse(*ctx.attributes)
        grads = second_derivatives(
            lambda input, field: composite.sample(input, Field(kind, field), sampling),
            ctx.saved_tensors,
            ctx.output_mask,
            (grad_dx, grad_dfield),
        )
        return (*grads, None, None, None, None)

    forward_op.register_autograd(backward, setup_context=setup_context)
    backward_op.register_autograd(double_backward, setup_context=setup_backward_context)


_register_autograd(grid_sampler3d_op, grid_sampler3d_backward_op, FieldKind.GRID)


def eager(*tensors: Tensor) -> bool:
    """Whether a call on ``tensors`` may skip the custom ops: plain tensors with data, run eagerly.

    The custom ops are what ``torch.compile``, ``torch.export``, fake and meta tensors, vmap
    and dispatch modes see; through PyTorch's dispatcher, with autograd, a forward and
    backward step of 512 points took 398 us against 308 us here (its kernels take 30 us).
    """
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or torch_hooks.dispatch_mode_active():
        return False
    return all(
        type(tensor) in _PLAIN_TENSORS
        and tensor.device.type in ("cpu", "cuda")
        and not torch_hooks.functorch_wrapped(tensor)
        for tensor in tensors
    )


_PLAIN_TENSORS = (Tensor, torch.nn.Parameter)


def _eager_function(forward_name: str, kind: FieldKind, backward_op):
    """An autograd.Function over the :mod:`.api` function ``forward_name``, which samples a field of ``kind``
    (see :func:`eager`).

    Its backward runs :func:`.api.sample_backward` (the forward checked the operands), or
    the backward custom op when the backward itself is to be differentiated
    (``create_graph=True``), whose autograd gives the second derivatives
    (:func:`_register_autograd`).
    """

    class EagerSample(torch.autograd.Function):
        @staticmethod
        def without_autograd(*arguments):
            return getattr(api, forward_name)(*arguments)

        @staticmethod
        def forward(ctx, input, field, interpolation, padding, align_corners):
            ctx.save_for_backward(input, field)
            ctx.attributes = (interpolation, padding, align_corners)
            return EagerSample.without_autograd(input, field, interpolation, padding, align_corners)

        @staticmethod
        def backward(ctx, grad_output):
            input, field = ctx.saved_tensors
            output_mask = (ctx.needs_input_grad[0], ctx.needs_input_grad[1])
            if torch.is_grad_enabled():
                dx, dfield = backward_op(grad_output, input, field, *ctx.attributes, list(output_mask))
            else:
                dx, dfield, _ = api.sample_backward(
                    grad_output, input, Field(kind, field), Sampling.parse(*ctx.attributes), Outputs(*output_mask)
                )
            return (dx if output_mask[0] else None), (dfield if output_mask[1] else None), None, None, None

    return EagerSample


def _sample(function, op, input: Tensor, field: Tensor, sampling: Sampling) -> Tensor:
    """``op(input, field, *attributes)`` with ``sampling``'s attributes as the ops take them (aclnn codes), through
    ``function`` (or without autograd) where :func:`eager` allows; under ``torch.autocast``, in float32 (as
    PyTorch's grid sampler)."""
    device_type = input.device.type
    if torch.is_autocast_enabled(device_type):
        with torch.autocast(device_type, enabled=False):
            return _sample(function, op, input.float(), field.float(), sampling)
    attributes = (int(sampling.interpolation), int(sampling.padding), sampling.align_corners)
    if not eager(input, field):
        return op(input, field, *attributes)
    if torch.is_grad_enabled() and (input.requires_grad or field.requires_grad):
        return function.apply(input, field, *attributes)
    return function.without_autograd(input, field, *attributes)


_EagerGridSample = _eager_function("grid_sampler3d", FieldKind.GRID, grid_sampler3d_backward_op)


def grid_sample(
    input: Tensor,
    grid: Tensor,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: bool = False,
    data_format: str = "NCDHW",
) -> Tensor:
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
    sampling = Sampling.parse(mode, padding_mode, align_corners)
    if input.dim() == 4 and data_format == DataFormat.NCDHW:
        return F.grid_sample(
            input, grid, sampling.interpolation.name.lower(), sampling.padding.name.lower(), sampling.align_corners
        )
    if input.dim() == 5:  # anything else reaches the op's own shape check, which names it
        input = to_ncdhw(input, data_format)
    if onnx.exporting():
        return from_ncdhw(onnx.grid_sample(input, grid, sampling), data_format)
    return from_ncdhw(_sample(_EagerGridSample, grid_sampler3d_op, input, grid, sampling), data_format)


@torch.library.custom_op("gridsampler3d::warp3d", mutates_args=())
def warp3d_op(
    volume: Tensor, displacement: Tensor, interpolation_mode: int, padding_mode: int, align_corners: bool
) -> Tensor:
    """Fused warp: volume (N, C, D, H, W) at identity + displacement (N, 3, D, H, W) -> (N, C, D, H, W)."""
    return api.warp3d(volume, displacement, interpolation_mode, padding_mode, align_corners)


@warp3d_op.register_fake
def _warp3d_fake(volume, displacement, interpolation_mode, padding_mode, align_corners):
    return torch.empty_like(volume, memory_format=memory_format_of(volume))


@torch.library.custom_op("gridsampler3d::warp3d_backward", mutates_args=())
def warp3d_backward_op(
    grad: Tensor,
    volume: Tensor,
    displacement: Tensor,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
    output_mask: list[bool],
) -> tuple[Tensor, Tensor]:
    """Fused warp backward: (dvolume like volume, ddisplacement (N, 3, D, H, W)); one not asked for is empty."""
    dx, dfield = api.warp3d_backward(
        grad, volume, displacement, interpolation_mode, padding_mode, align_corners, output_mask=tuple(output_mask)
    )
    return (volume.new_empty(0) if dx is None else dx), (displacement.new_empty(0) if dfield is None else dfield)


@warp3d_backward_op.register_fake
def _warp3d_backward_fake(grad, volume, displacement, interpolation_mode, padding_mode, align_corners, output_mask):
    dx = torch.empty_like(volume, memory_format=memory_format_of(volume)) if output_mask[0] else volume.new_empty(0)
    dfield = (
        torch.empty_like(displacement, memory_format=memory_format_of(displacement))
        if output_mask[1]
        else displacement.new_empty(0)
    )
    return dx, dfield


_register_autograd(warp3d_op, warp3d_backward_op, FieldKind.DISPLACEMENT)
_EagerWarp = _eager_function("warp3d", FieldKind.DISPLACEMENT, warp3d_backward_op)


def warp(
    volume: Tensor,
    displacement: Tensor,
    mode: str = "bilinear",
    padding_mode: str = "border",
    align_corners: bool = True,
    data_format: str = "NCDHW",
    displacement_format: str = "N3DHW",
) -> Tensor:
    """Warp ``volume`` by a dense displacement field in voxels, with no grid tensor; differentiable.

    Output voxel (d, h, w) is ``volume`` sampled at voxel position (w + dx, h + dy, d + dz):
    the registration layer of VoxelMorph and MONAI's ``Warp``, fused. Neither the forward
    nor the backward builds an (N, D, H, W, 3) grid; the backward returns d(volume) and
    d(displacement) directly. ``warp(flow, flow)`` (a field warping itself) is supported.

    Args:
        volume: (N, C, D, H, W), or (N, D, H, W, C) with ``data_format="NDHWC"``.
        displacement: (N, 3, D, H, W) with channels (dz, dy, dx) in voxels, or
            (N, D, H, W, 3) (same component order) with ``displacement_format="NDHW3"``;
            same N, D, H, W, dtype and device as ``volume``.
        mode: "bilinear", "nearest" or "bicubic".
        padding_mode: "zeros", "border" or "reflection".
        align_corners: does not move the sampling position; it sets reflection's bounds
            (0 and size - 1 when True, -0.5 and size - 0.5 when False), as for a grid
            normalised with the same setting (docs/semantics.md).
        data_format: "NCDHW" or "NDHWC" for ``volume`` and the output.
        displacement_format: "N3DHW" or "NDHW3".

    Returns:
        The warped volume, shaped and laid out like ``volume``. Under ``torch.autocast``
        it computes in float32, as :func:`grid_sample` does.
    """
    data_format = parse_data_format(data_format)
    displacement_format = parse_displacement_format(displacement_format)
    sampling = Sampling.parse(mode, padding_mode, align_corners)
    if not isinstance(volume, Tensor) or not isinstance(displacement, Tensor):
        raise TypeError(
            f"warp takes torch tensors (for NumPy arrays use gridsampler3d.warp3d); got "
            f"{type(volume).__name__} and {type(displacement).__name__}"
        )
    if torch.is_autocast_enabled(volume.device.type):  # checked as the float32 call that runs
        volume, displacement = volume.float(), displacement.float()
    check_warp(volume, displacement, data_format, displacement_format)
    x = to_ncdhw(volume, data_format)
    field = api.displacement_field(displacement, displacement_format).tensor
    if onnx.exporting():
        return from_ncdhw(onnx.warp(x, field, sampling), data_format)
    return from_ncdhw(_sample(_EagerWarp, warp3d_op, x, field, sampling), data_format)


class Warp3d(torch.nn.Module):
    """Warp a volume by a dense displacement field given in voxels (the registration layer): :func:`warp` as a module.

    ``forward(volume, displacement)``: volume (N, C, D, H, W), displacement (N, 3, D, H, W)
    with channels (dz, dy, dx) in voxels -> the volume sampled at identity + displacement,
    (N, C, D, H, W). Other layouts through ``data_format`` and ``displacement_format``.
    """

    def __init__(
        self,
        mode: str = "bilinear",
        padding_mode: str = "border",
        align_corners: bool = True,
        data_format: str = "NCDHW",
        displacement_format: str = "N3DHW",
    ):
        super().__init__()
        self.mode, self.padding_mode, self.align_corners = mode, padding_mode, align_corners
        self.data_format, self.displacement_format = data_format, displacement_format

    def forward(self, volume: Tensor, displacement: Tensor) -> Tensor:
        return warp(
            volume,
            displacement,
            self.mode,
            self.padding_mode,
            self.align_corners,
            self.data_format,
            self.displacement_format,
        )

    def extra_repr(self) -> str:
        return (
            f"mode={self.mode!r}, padding_mode={self.padding_mode!r}, align_corners={self.align_corners}, "
            f"data_format={self.data_format!r}, displacement_format={self.displacement_format!r}"
        )


def integrate_velocity(
    velocity: Tensor,
    steps: int = 7,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: bool = True,
    displacement_format: str = "N3DHW",
) -> Tensor:
    """Displacement of the flow of a stationary velocity field, by scaling and squaring; differentiable.

    ``u = velocity / 2**steps``, then ``steps`` times ``u = u + warp(u, u)``: the
    integration of MONAI's ``DVF2DDF`` and VoxelMorph's ``VecInt`` (whose defaults, zeros
    padding and align_corners=True, are these), each step one fused self-warp.

    Args:
        velocity: (N, 3, D, H, W), (dz, dy, dx) in voxels, or (N, D, H, W, 3) with
            ``displacement_format="NDHW3"``.
        steps: the number of squarings (>= 0); 0 returns ``velocity`` unchanged.
        mode, padding_mode, align_corners: of each warp (see :func:`warp`).

    Returns:
        The displacement, shaped like ``velocity``.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an int >= 0; got {steps!r}")
    displacement_format = parse_displacement_format(displacement_format)
    data_format = "NDHWC" if displacement_format == DisplacementFormat.NDHW3 else "NCDHW"
    displacement = velocity / (2.0**steps)
    for _ in range(steps):
        displacement = displacement + warp(
            displacement, displacement, mode, padding_mode, align_corners, data_format, displacement_format
        )
    return displacement
