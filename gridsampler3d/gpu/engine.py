"""The Triton backend: plans each call (:mod:`.planner`), then launches the kernels on torch tensors, read in place.

Runs on CUDA tensors, and on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``
set before Triton is imported), which is how the kernels are tested without a GPU.
float16 and bfloat16 accumulate in float32 in the forward and in the fast (atomic) dx, and
in float64, rounded once, in the deterministic dx (docs/semantics.md, "Dtypes"); float32 in
float32; float64 in float64. Indices and weights are computed in float64 throughout.

Every kernel takes its operands as records (:mod:`.records`, built by :mod:`.launch`): a
tensor and its strides as one :class:`.records.Operand`, the sizes as one
:class:`.records.Sizes`, and the constexprs ``RULE`` (:func:`.launch.kernel_rule`), ``TILE``
(:meth:`.planner.Tile.keywords`) and ``OUTPUTS``. A displacement runs the same kernels with
``RULE.field``: they read the displacement in place of a grid (strides handed over in
point order, :meth:`.sampling.Field.point_strides`) and write its gradient through its own
strides. An affine field's kernels compute each point's position from its voxel matrix
(:func:`.launch.field_matrix`); the backward walk reduces theta's gradient to partial row
moments (:class:`.records.RowPartials`), summed here in float64 in a fixed order. A B-spline's
kernels read its row coefficients (:func:`.launch.spline_rows`) and sum each point's
displacement; the walk reduces the control points' gradient to partial row sums, summed here
over the blocks in order, then over the rows (:func:`gridsampler3d.bspline.control_gradient`),
in float64: no (N, 3, Do, Ho, Wo) displacement or gradient is ever stored.
"""

from __future__ import annotations

import contextlib
import importlib.util

import torch

from ..affine import matrix_gradient, theta_gradient
from ..bspline import control_gradient
from ..layout import memory_format_of
from ..modes import Interpolation
from ..problem import Gradient, Stage
from ..rounding import round_once
from ..sampling import Field, Gradients, Outputs, Sampling
from . import autotune
from .gathered import gathered_bicubic_dx, gathered_dx
from .launch import (
    accumulator,
    field_matrix,
    field_operand,
    fusion,
    interpreter_enabled,
    kernel_rule,
    kernels,
    launch_tuned,
    patch_grid,
    row_windows,
    sizes_of,
    store_dtype,
    volume_operand,
)
from .planner import DxMethod, GpuCall, GpuPlan, make_plan
from .records import RowPartials, constexpr_members

__all__ = ["TritonBackend", "describe_call", "plan_call"]


# The compute capability a plan assumes where there is no GPU to ask (a plan made from shapes alone).
ASSUMED_CAPABILITY = (9, 0)


def _capability(device: torch.device) -> tuple[tuple, bool]:
    """(major, minor) of ``device``'s GPU, and whether it was assumed (:data:`ASSUMED_CAPABILITY`: no GPU here)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return tuple(torch.cuda.get_device_capability(device)), False
    return ASSUMED_CAPABILITY, True


def describe_call(
    stage: Stage,
    x,
    field: Field,
    sampling: Sampling,
    *,
    outputs: Outputs = Outputs(),
    deterministic: bool = False,
    device: torch.device | None = None,
) -> GpuCall:
    """The GPU planner's description of a call from its NCDHW tensors (of any device, meta included) and records;
    ``device`` (default x's) is where it runs."""
    device = x.device if device is None else device
    capability, assumed = _capability(device)
    return GpuCall.describe(
        stage,
        x,
        field,
        sampling,
        outputs,
        channels_adjacent=x.shape[1] > 1 and x.stride(1) == 1,
        deterministic=bool(deterministic),
        interpreted=device.type == "cpu" and interpreter_enabled(),
        autotune=autotune.enabled(device),
        capability=capability,
        capability_assumed=assumed,
    )


def plan_call(
    stage: Stage,
    x,
    field: Field,
    sampling: Sampling,
    *,
    outputs: Outputs = Outputs(),
    deterministic: bool = False,
    device: torch.device | None = None,
) -> GpuPlan:
    """The plan of a call: :func:`describe_call`, then :func:`.planner.make_plan`."""
    return make_plan(
        describe_call(stage, x, field, sampling, outputs=outputs, deterministic=deterministic, device=device)
    )


def _on_device(device: torch.device):
    """Launch on ``device``'s GPU (Triton launches on the current one)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class TritonBackend:
    """Triton kernels for CUDA tensors (see ``gridsampler3d.gpu``); fast (atomic) or deterministic backward; a
    :class:`.backends.Backend`."""

    name = "triton"

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "Triton is not installed (pip install triton)"
        if not torch.cuda.is_available() and not interpreter_enabled():
            return "no CUDA device (TRITON_INTERPRET=1 runs the kernels on the CPU through Triton's interpreter)"
        return None

    def supports(self, device: torch.device) -> bool:
        return device.type == "cuda" or (device.type == "cpu" and interpreter_enabled())

    def forward(self, x: torch.Tensor, field: Field, sampling: Sampling) -> torch.Tensor:
        plan = plan_call(Stage.FORWARD, x, field, sampling)
        y = torch.empty(
            tuple(x.shape[:2]) + field.out_sizes,
            dtype=store_dtype(x.dtype),
            device=x.device,
            memory_format=memory_format_of(x),
        )
        with _on_device(x.device):
            operand = field_operand(field, field_matrix(field, x, sampling))
            if plan.interpolation == Interpolation.BICUBIC:
                _bicubic_forward(plan, x, field, sampling, (operand, y))
            else:
                _forward(plan, x, field, sampling, (operand, y))
        return y.to(x.dtype)

    def backward(
        self,
        grad: torch.Tensor,
        x: torch.Tensor,
        field: Field,
        sampling: Sampling,
        outputs: Outputs,
        deterministic: bool | None,
    ) -> Gradients:
        """(dx, dfield, dtheta): dfield laid out as :meth:`.sampling.Field.gradient_format` says."""
        if deterministic is None:
            deterministic = torch.are_deterministic_algorithms_enabled()
        plan = plan_call(Stage.BACKWARD, x, field, sampling, outputs=outputs, deterministic=deterministic)
        dfield = None
        if outputs.dfield and not field.kind.spline:
            dfield = torch.empty_like(
                field.tensor, dtype=store_dtype(field.tensor.dtype), memory_format=field.gradient_format()
            )
            if plan.passes.field == Gradient.ZEROS:
                dfield.zero_()
        dx = None
        if plan.dx == DxMethod.ATOMIC:
            # Atomics add into a zeroed buffer of the sums' dtype (float32 for half types).
            dx = torch.zeros_like(x, dtype=getattr(torch, plan.dx_sums), memory_format=memory_format_of(x))
        partials = None
        with _on_device(x.device):
            matrix = field_matrix(field, x, sampling)
            if plan.walk:
                partials = _backward_walk(plan, (grad, x, field, sampling, matrix), dx, dfield)
            if plan.dx == DxMethod.GATHERED:
                dx = gathered_dx(plan, grad, x, field, sampling, matrix)
            elif plan.dx == DxMethod.SORTED_TAPS:
                dx = gathered_bicubic_dx(plan, grad, x, field, sampling, matrix)
            if field.kind.spline:
                dfield = _control_gradient(plan, partials, field)
            dtheta = _theta_gradient(plan, partials, x, field, sampling)
        if plan.dx == DxMethod.ATOMIC:
            dx = dx.to(x.dtype)
        return Gradients(dx, dfield.to(field.tensor.dtype) if outputs.dfield else None, dtheta)


def _theta_gradient(plan: GpuPlan, partials: RowPartials | None, x, field: Field, sampling: Sampling):
    """theta's gradient (N, 3, 4) in theta's dtype, rounded once: the walk's partial row moments summed over their
    column blocks and then over the rows in float64, in a fixed order (:mod:`gridsampler3d.affine`); zero where
    the plan says so (nearest); None where not asked for."""
    if plan.passes.theta == Gradient.NONE:
        return None
    if plan.passes.theta == Gradient.ZEROS:
        return torch.zeros_like(field.theta)
    row_moments = partials.moments.sum(dim=1)
    matrix_grad = matrix_gradient(row_moments, field.theta.shape[0], field.out_sizes)
    dtheta = theta_gradient(matrix_grad, tuple(x.shape[2:]), field.out_sizes, sampling.align_corners)
    return round_once(dtheta, field.theta.dtype)


def _control_gradient(plan: GpuPlan, partials: RowPartials | None, field: Field):
    """A B-spline's control points' gradient (N, 3, Kd, Kh, Kw) in their dtype, rounded once: the walk's partial
    row sums added over their column blocks in order (each block's window at its first column), then summed over
    the rows in float64 (:func:`gridsampler3d.bspline.control_gradient`); zero where the plan says so (nearest);
    None where not asked for."""
    if plan.passes.field == Gradient.NONE:
        return None
    if plan.passes.field == Gradient.ZEROS:
        return torch.zeros_like(field.tensor, memory_format=torch.contiguous_format)
    batch, _, _, _, count = field.tensor.shape
    out_depth, out_height, _ = field.out_sizes
    sums = torch.zeros(partials.sums.shape[0], 3, count, dtype=torch.float64, device=partials.sums.device)
    # The walk's windows, from the host (no copy back from the device): the plan fixes its shape for row sums.
    firsts, window = row_windows(field, plan.tile.block_w)
    for block, first in enumerate(firsts):
        last = min(first + window, count)
        sums[:, :, first:last] += partials.sums[:, block, :, : last - first]
    row_sums = sums.view(batch, out_depth, out_height, 3, count).permute(0, 3, 1, 2, 4)
    control = control_gradient(row_sums, field.tensor.shape[2:], field.out_sizes, field.parameters)
    return round_once(control, field.tensor.dtype)


def _forward(plan: GpuPlan, x, field: Field, sampling: Sampling, operands: tuple) -> None:
    """y by the trilinear / nearest forward kernel, in the plan's patches; ``operands`` is (the field's
    :class:`.records.FieldOperand`, y)."""
    forward, _, _ = kernels()
    operand, y = operands
    operands = (volume_operand(x), operand, volume_operand(y), sizes_of(x, field))
    constexprs = dict(RULE=kernel_rule(sampling, field.kind), ACC=accumulator(plan.sums), **fusion(x.dtype))

    def launch(tile):
        forward.grid_sampler3d_fwd_kernel[patch_grid(x.shape[0], field.out_sizes, tile)](
            *operands, **constexprs, **tile.keywords()
        )

    launch_tuned("forward", plan, x, launch)


def _bicubic_forward(plan: GpuPlan, x, field: Field, sampling: Sampling, operands: tuple) -> None:
    """y by the tricubic forward kernel, flat over points and channel blocks; ``operands`` as :func:`_forward`'s."""
    _, _, bicubic = kernels()
    operand, y = operands
    points, tile = field.points, plan.tile
    bicubic.bicubic_fwd_kernel[(-(-points // tile.block_w), -(-x.shape[1] // tile.block_c))](
        volume_operand(x),
        operand,
        volume_operand(y),
        points,
        sizes_of(x, field),
        RULE=kernel_rule(sampling, field.kind),
        ACC=accumulator(plan.sums),
        **tile.keywords(),
        **fusion(x.dtype),
    )


def _backward_walk(plan: GpuPlan, call: tuple, dx, dfield) -> RowPartials | None:
    """The backward kernel's walk over the points: the field's gradient (``plan.passes.field``; a B-spline's as
    partial row sums), an affine field's partial row moments (``plan.passes.theta``), both returned as
    :class:`.records.RowPartials`, and, with atomics, dx (``plan.dx``); ``call`` is (grad, x, field, sampling, the
    field's voxel matrix or None). An output not written is handed over as a tensor of its shape that nothing
    writes."""
    _, backward, bicubic = kernels()
    grad, x, field, sampling, matrix = call
    want_dx, want_dfield = plan.dx == DxMethod.ATOMIC, plan.passes.field == Gradient.COMPUTED
    want_moments = plan.passes.theta == Gradient.COMPUTED
    dx_target = dx if want_dx else x
    operands = (
        volume_operand(grad),
        volume_operand(x),
        field_operand(field, matrix),
        volume_operand(dx_target),
        field_operand(field, matrix, dfield if want_dfield else None),
    )
    constexprs = dict(
        RULE=kernel_rule(sampling, field.kind),
        ACC=accumulator(plan.sums),
        OUTPUTS=constexpr_members(Outputs(want_dx, want_dfield, want_moments)),
        **fusion(x.dtype),
    )
    found = []

    def partials_for(tile) -> RowPartials:
        """The row partials' buffers for a launch of ``tile`` (every entry of those written is), stand-ins else."""
        found[:] = [_row_partials(x, field, tile, want_moments, want_dfield and field.kind.spline)]
        return found[0]

    if plan.interpolation == Interpolation.BICUBIC:
        points, tile = field.points, plan.tile
        out_width = field.out_sizes[2]
        # An affine field's and a B-spline's programs take one output row each, so that their partial sums are a row's.
        rows = field.points // out_width
        row_programs = field.kind.affine or field.kind.spline
        launch_grid = (rows, -(-out_width // tile.block_w)) if row_programs else (-(-points // tile.block_w),)
        bicubic.bicubic_bwd_kernel[launch_grid](
            *operands, partials_for(tile), points, sizes_of(x, field), **constexprs, **tile.keywords()
        )
        return found[0]

    def launch(tile):
        if want_dx:
            dx.zero_()  # a timed launch has added into it
        backward.grid_sampler3d_bwd_kernel[patch_grid(x.shape[0], field.out_sizes, tile)](
            *operands, partials_for(tile), sizes_of(x, field), **constexprs, **tile.keywords()
        )

    launch_tuned("backward", plan, x, launch)
    return found[0]


def _row_partials(x, field: Field, tile, moments: bool, sums: bool) -> RowPartials:
    """The :class:`.records.RowPartials` of a walk in programs of ``tile``: float64 buffers for theta's moments
    where ``moments`` and a B-spline's row sums where ``sums``, each entry written by the walk; x stands in for a
    buffer not written."""
    out_width = field.out_sizes[2]
    rows, blocks = field.points // out_width, -(-out_width // tile.block_w)
    wide = dict(dtype=torch.float64, device=x.device)
    moments_buffer = torch.empty((rows, blocks, 6), **wide) if moments else x
    if not sums:
        return RowPartials(moments_buffer, x, x, blocks, 1)
    firsts, window = row_windows(field, tile.block_w)
    firsts = torch.tensor(firsts, dtype=torch.int64, device=x.device)
    return RowPartials(moments_buffer, torch.empty((rows, blocks, 3, window), **wide), firsts, blocks, window)
