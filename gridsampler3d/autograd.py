"""Autograd for every kind of field: one custom-op pair, one eager ``autograd.Function``, one double backward.

    gridsampler3d::sample(input, field?, theta?, kind, size, parameters, interpolation_mode, padding_mode,
                          align_corners) -> y
    gridsampler3d::sample_backward(grad, input, field?, theta?, kind, size, parameters, interpolation_mode,
                                   padding_mode, align_corners, output_mask) -> (dinput, dfield, dtheta)

The ops take a :class:`.sampling.Field` spread over arguments: its tensor (a grid
(N, Do, Ho, Wo, 3), a displacement (N, 3, Do, Ho, Wo) or a B-spline's control points
(N, 3, Kd, Kh, Kw)) and theta (N, 3, 4), each or both present as the kind has them, the
kind's code, the output's sizes (Do, Ho, Wo: an affine or B-spline field's; empty for the
kinds whose tensor gives them) and the kind's parameters (a B-spline's spacing and origin;
None for the kinds without); the volume and grad are NCDHW (any
strides); the attributes are the aclnn codes. The backward's outputs come in the records'
one order, (dx, dfield, dtheta), an output not asked for (or that the field lacks) as an
empty tensor (custom ops cannot return None).

:func:`sample` is what the differentiable functions (:mod:`.nn`) run on a checked call
(:func:`.call.parse_call`): the ONNX composites while ``torch.onnx.export`` traces, the
custom ops where ``torch.compile``, ``torch.export``, fake or meta tensors, vmap or a
dispatch mode must see an operator (:func:`eager`), and otherwise :class:`Sample`, the
same autograd without the dispatcher. Second derivatives run through
:func:`.composite.sample`, the same rules in differentiable torch operations.
"""

from __future__ import annotations

import typing

import torch
from torch import Tensor

from . import backends, composite, onnx, torch_hooks
from .call import AUTOCAST_DEVICE_TYPES
from .layout import memory_format_of
from .modes import Interpolation, Padding
from .sampling import Field, FieldKind, Outputs, Sampling

__all__ = ["Sample", "eager", "sample", "sample_backward_op", "sample_op"]


def _field(kind: int, tensor, theta, size, parameters) -> Field:
    """The record of the ops' arguments. The output's sizes are a grid's or a displacement's own (so that a traced
    graph follows the tensors), ``size`` an affine field's."""
    kind = FieldKind(kind)
    if kind == FieldKind.GRID:
        size = tensor.shape[1:4]
    elif kind == FieldKind.DISPLACEMENT:
        size = tensor.shape[2:]
    return Field(kind, tensor, theta, tuple(size), () if parameters is None else tuple(parameters))


def _size(record: Field) -> list:
    """The output's sizes as the ops take them: an affine or B-spline field's (as ints while torch.jit.trace records
    them); none for the kinds whose tensors give them."""
    if record.kind in (FieldKind.GRID, FieldKind.DISPLACEMENT):
        return []
    return [int(size) for size in record.out_sizes] if torch.jit.is_tracing() else list(record.out_sizes)


def _parameters(record: Field):
    """A kind's parameters as the ops take them: None for none (torch.jit.trace cannot record an empty float
    list)."""
    return list(record.parameters) if record.parameters else None


def _sampling(interpolation_mode: int, padding_mode: int, align_corners: bool) -> Sampling:
    return Sampling(Interpolation(interpolation_mode), Padding(padding_mode), align_corners)


@torch.library.custom_op("gridsampler3d::sample", mutates_args=())
def sample_op(
    input: Tensor,
    field: typing.Optional[Tensor],
    theta: typing.Optional[Tensor],
    kind: int,
    size: typing.List[int],
    parameters: typing.Optional[typing.List[float]],
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
) -> Tensor:
    """input (N, C, Di, Hi, Wi) sampled at the field -> (N, C, *size), laid out like input."""
    engine = backends.select_backend("auto", input.device)
    field_record = _field(kind, field, theta, size, parameters)
    return backends.forward(engine, input, field_record, _sampling(interpolation_mode, padding_mode, align_corners))


@sample_op.register_fake
def _sample_fake(input, field, theta, kind, size, parameters, interpolation_mode, padding_mode, align_corners):
    shape = (input.shape[0], input.shape[1], *_field(kind, field, theta, size, parameters).out_sizes)
    return torch.empty(shape, dtype=input.dtype, device=input.device, memory_format=memory_format_of(input))


@torch.library.custom_op("gridsampler3d::sample_backward", mutates_args=())
def sample_backward_op(
    grad: Tensor,
    input: Tensor,
    field: typing.Optional[Tensor],
    theta: typing.Optional[Tensor],
    kind: int,
    size: typing.List[int],
    parameters: typing.Optional[typing.List[float]],
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
    output_mask: typing.List[bool],
) -> typing.Tuple[Tensor, Tensor, Tensor]:
    """(dinput like input, dfield like the field's tensor, dtheta like theta); one not asked for is empty."""
    engine = backends.select_backend("auto", input.device)
    field_record = _field(kind, field, theta, size, parameters)
    sampling = _sampling(interpolation_mode, padding_mode, align_corners)
    outputs = Outputs(output_mask[0], output_mask[1] and field is not None, output_mask[2] and theta is not None)
    gradients = backends.backward(engine, grad, input, field_record, sampling, outputs)
    return tuple(input.new_empty(0) if gradient is None else gradient for gradient in gradients)


@sample_backward_op.register_fake
def _sample_backward_fake(
    grad, input, field, theta, kind, size, parameters, interpolation_mode, padding_mode, align_corners, output_mask
):
    dx = torch.empty_like(input, memory_format=memory_format_of(input)) if output_mask[0] else input.new_empty(0)
    dfield = input.new_empty(0)
    if output_mask[1] and field is not None:
        dfield = torch.empty_like(field, memory_format=_field(kind, field, theta, size, parameters).gradient_format())
    dtheta = torch.empty_like(theta) if output_mask[2] and theta is not None else input.new_empty(0)
    return dx, dfield, dtheta


def _setup_context(ctx, inputs, output):
    input, field, theta, *attributes = inputs
    ctx.save_for_backward(input, field, theta)
    ctx.attributes = tuple(attributes)


def _backward(ctx, grad_output):
    """First derivatives of the op: the backward op, for the inputs that need them."""
    input, field, theta = ctx.saved_tensors
    output_mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]]
    gradients = sample_backward_op(grad_output, input, field, theta, *ctx.attributes, output_mask)
    return (*(gradient if wanted else None for gradient, wanted in zip(gradients, output_mask)),) + (None,) * 6


def _setup_backward_context(ctx, inputs, output):
    grad, input, field, theta, *attributes, output_mask = inputs
    ctx.save_for_backward(grad, input, field, theta)
    ctx.attributes, ctx.output_mask = tuple(attributes), output_mask


def _double_backward(ctx, grad_dx, grad_dfield, grad_dtheta):
    """Gradients of <grad_dx, dx> + <grad_dfield, dfield> + <grad_dtheta, dtheta> through the composite."""
    kind, size, parameters, *modes = ctx.attributes
    sampling = _sampling(*modes)

    def differentiable(input, field, theta):
        return composite.sample(input, _field(kind, field, theta, size, parameters), sampling)

    grads = second_derivatives(differentiable, ctx.saved_tensors, ctx.output_mask, (grad_dx, grad_dfield, grad_dtheta))
    return (*grads,) + (None,) * 7


sample_op.register_autograd(_backward, setup_context=_setup_context)
sample_backward_op.register_autograd(_double_backward, setup_context=_setup_backward_context)


def second_derivatives(differentiable, saved, output_mask, grad_firsts) -> tuple:
    """The gradients, with respect to grad and each tensor ``differentiable`` takes, of the sum of
    <grad_firsts[k], d sum(grad * output) / d tensors[k]> over the first derivatives ``output_mask`` asked for:
    what the backward op's own backward returns. ``saved`` is (grad, *tensors); None tensors stay None."""
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


def eager(*tensors) -> bool:
    """Whether a call on ``tensors`` (None ones aside) may skip the custom ops: plain tensors with data, run eagerly.

    The custom ops are what ``torch.compile``, ``torch.export``, fake and meta tensors, vmap
    and dispatch modes see; through PyTorch's dispatcher, with autograd, a forward and
    backward step of 512 points took 398 us against 308 us here (its kernels take 30 us).
    """
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or torch_hooks.dispatch_mode_active():
        return False
    for tensor in tensors:
        if tensor is not None and (type(tensor) not in _PLAIN_TENSORS or tensor.device.type not in ("cpu", "cuda")):
            return False
    return not torch_hooks.functorch_wrapped(*tensors)


_PLAIN_TENSORS = (Tensor, torch.nn.Parameter)


class Sample(torch.autograd.Function):
    """The custom ops' autograd without the dispatcher, for plain tensors run eagerly (:func:`eager`).

    ``apply(input, field, theta, call)``: the tensors, each or both of the field's present,
    and the checked :class:`.call.Call` they come from (its field's kind, sizes and parameters,
    the sampling rule and the backend that runs it).
    Its backward runs :func:`.backends.backward` directly, or the backward custom op when
    the backward itself is to be differentiated (``create_graph=True``), whose autograd
    gives the second derivatives.
    """

    @staticmethod
    def forward(ctx, input, field, theta, call):
        ctx.save_for_backward(input, field, theta)
        # The record itself (its tensors are the ones saved), and with it what the forward derived from them.
        ctx.field, ctx.sampling, ctx.engine = call.field, call.options.sampling, call.engine
        return backends.forward(call.engine, input, call.field, ctx.sampling)

    @staticmethod
    def backward(ctx, grad_output):
        input, field, theta = ctx.saved_tensors  # unpacked: an in-place change since the forward is an error here
        needs, record = ctx.needs_input_grad, ctx.field
        if torch.is_grad_enabled():
            sampling = ctx.sampling
            attributes = (int(sampling.interpolation), int(sampling.padding), sampling.align_corners)
            gradients = sample_backward_op(
                grad_output,
                input,
                field,
                theta,
                int(record.kind),
                _size(record),
                _parameters(record),
                *attributes,
                [needs[0], needs[1], needs[2]],
            )
            gradients = [gradient if wanted else None for gradient, wanted in zip(gradients, needs)]
        else:
            outputs = Outputs(needs[0], needs[1], needs[2])
            gradients = backends.backward(ctx.engine, grad_output, input, record, ctx.sampling, outputs)
        return (*gradients, None)


def sample(call) -> Tensor:
    """The differentiable sampling of a checked :class:`.call.Call`: (N, C, Do, Ho, Wo), logical NCDHW.

    Under ``torch.autocast`` it runs with autocast off (the call's operands were taken in
    float32, :func:`.call.parse_call`).
    """
    x, field, sampling = call.x, call.field, call.options.sampling
    if onnx.exporting():
        return onnx.sample(x, field, sampling)
    device_type = x.device.type
    if device_type in AUTOCAST_DEVICE_TYPES and torch.is_autocast_enabled(device_type):
        with torch.autocast(device_type, enabled=False):
            return _sample(call, x, field, sampling)
    return _sample(call, x, field, sampling)


def _sample(call, x, field: Field, sampling: Sampling) -> Tensor:
    tensor, theta = field.tensor, field.theta
    if not eager(x, tensor, theta):
        return sample_op(
            x,
            tensor,
            theta,
            int(field.kind),
            _size(field),
            _parameters(field),
            int(sampling.interpolation),
            int(sampling.padding),
            sampling.align_corners,
        )
    if torch.is_grad_enabled() and (
        x.requires_grad or (tensor is not None and tensor.requires_grad) or (theta is not None and theta.requires_grad)
    ):
        return Sample.apply(x, tensor, theta, call)
    return backends.forward(call.engine, x, field, sampling)
