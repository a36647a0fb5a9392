"""The Numba CPU backend: describe the call, plan it (:mod:`.planner`), hand the tensors to the executors.

Tensors reach the kernels as :class:`.records.Operand` records (a flat array and its
strides): NCDHW, channels-last and sliced tensors are read in place, with one exception:
a plan with ``copies`` runs the backward of many-channel NCDHW data on channels-last
copies (:mod:`.transpose`), the channels-last kernels and the copies together taking
less time than the NCDHW kernels, for the same bits. float16 and bfloat16
operands are widened to float64 once (NumPy has no bfloat16), so that every sum that
ends in half precision runs in float64 and is rounded once; float32 computes in float64
and stores in float32; float64 is exact throughout.
Outputs and widened copies come from :func:`.buffers.empty` (blocks of earlier calls,
already mapped).
"""

from __future__ import annotations

import dataclasses
import functools
import operator

import numpy as np
import torch

from ..affine import axes as affine_axes
from ..dtypes import CPU_KERNEL_DTYPES, HALF_DTYPES, cpu_kernel_dtype
from ..layout import memory_format_of
from ..rounding import round_once
from ..sampling import POINT_ORDER, Field, Gradients, Outputs, Sampling
from . import buffers, pool, spline, theta, transpose, tuning
from .backward import BackwardOperands
from .executors import BackwardWork, ForwardWork, row_step, run_backward, run_forward
from .planner import Call, GridPass, Plan, Stage, facts_needed, make_plan
from .records import Geometry, Operand
from .rounding import round_in_parts
from .slabs import looks_coherent

__all__ = ["NumbaBackend", "describe_call", "plan_call"]

_ONES = (1,) * 5


def _flat(tensor: torch.Tensor, strides) -> np.ndarray:
    """A flat 1-D NumPy view of a tensor that is not contiguous (of ``strides``), from its first element: no copy.

    The span's sum runs in ``map``, without a Python call per dimension.
    """
    span = 1 + sum(map(operator.mul, map(operator.sub, tensor.shape, _ONES), strides))
    return tensor.detach().as_strided((span,), (1,)).numpy()


def _kernel_dtype(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself in float32 and float64; float16 and bfloat16 widened to float64 (:func:`.buffers.empty`)."""
    if tensor.dtype in CPU_KERNEL_DTYPES:
        return tensor
    return buffers.empty(tensor.shape, cpu_kernel_dtype(tensor.dtype), memory_format_of(tensor)).copy_(tensor)


def operand(tensor: torch.Tensor, rows: int = 1) -> Operand:
    """A tensor as the kernels take it: its flat view and strides; for a volume-shaped output operand (grad, y),
    each run of ``rows`` output rows as one row (a plan's ``rows_joined``)."""
    strides = tensor.stride()
    # numpy(force=True): detach().numpy() in one call, the same memory for a CPU float tensor.
    data = tensor.numpy(force=True).reshape(-1) if tensor.is_contiguous() else _flat(tensor, strides)
    if rows > 1:
        strides = strides[:3] + (rows * strides[3],) + strides[4:]
    return tuple.__new__(Operand, (data, strides))  # Operand(data, strides), without its Python __new__


def field_operand(field: Field, tensor: torch.Tensor | None = None, rows: int = 1) -> Operand:
    """The operand of ``field``'s tensor, or of ``tensor`` shaped like it (its gradient, a widened copy; a
    B-spline's row coefficients or row sums), with strides in the kernels' order: point order (n, d, h, w,
    component), a displacement's component stride negated (the kernels read its x, dx, 2 components above dz);
    each run of ``rows`` output rows as one row."""
    tensor = field.tensor if tensor is None else tensor
    strides = tensor.stride()
    data = tensor.numpy(force=True).reshape(-1) if tensor.is_contiguous() else _flat(tensor, strides)
    strides = _point_strides(field, strides)
    if rows > 1:
        strides = strides[:2] + (rows * strides[2],) + strides[3:]
    return tuple.__new__(Operand, (data, strides))


# What the kernels are handed for a field without constants and a backward without theta's moments: nothing
# reads them.
_NO_MATRIX = np.empty(0)
_NO_MOMENTS = np.zeros(0)


def _field_constants(field: Field, x, sampling: Sampling) -> np.ndarray:
    """The field's constants as the kernels read them, float64: an affine field's voxel matrix (N * 12,
    :func:`.theta.voxel_matrix`), then a B-spline's supports along w and h (:func:`.spline.field_constants`); kept
    in the field's ``derived`` for its backward. ``_NO_MATRIX`` for the other fields."""
    kind = field.kind
    if not (kind.affine or kind.spline):
        return _NO_MATRIX
    key = ("cpu field constants", tuple(x.shape[2:]), sampling.align_corners)
    derived = field.derived
    if key not in derived:
        parts = []
        if kind.affine:
            axes = derived[("axes", *key[1:])] = affine_axes(key[1], field.out_sizes, sampling.align_corners)
            values = field.theta if field.theta.dtype in CPU_KERNEL_DTYPES else field.theta.double()
            parts.append(theta.voxel_matrix(values.numpy(force=True), axes))
        if kind.spline:
            parts.append(spline.field_constants(field, sum(part.size for part in parts)))
        derived[key] = np.concatenate(parts) if len(parts) > 1 else parts[0]
    return derived[key]


def _spline_planes(field: Field) -> torch.Tensor:
    """A B-spline's control points summed along d, with a zero row and column (:func:`.spline.planes`), kept in the
    field's ``derived`` for its backward."""
    derived = field.derived
    if "cpu spline planes" not in derived:
        derived["cpu spline planes"] = spline.planes(field)
    return derived["cpu spline planes"]


@functools.cache
def _empty_operand(dtype: torch.dtype) -> Operand:
    """The operand of an output not asked for: empty, zero strides (one per dtype: nothing writes it)."""
    return Operand(torch.empty(0, dtype=dtype).numpy(), (0, 0, 0, 0, 0))


def _call_operands(field: Field, x: torch.Tensor, rows: int, keep: bool = True) -> tuple:
    """(x's operand, the field tensor's operand) in the kernels' dtype, for a launch that joins ``rows`` rows.

    Where ``keep`` (``x`` is the caller's, not a channels-last copy) and both are the caller's own
    tensors (float32 or float64: a half tensor's widened copy lives in a buffer that a later
    call takes back), they are kept in ``field.derived`` for the call's backward, which takes
    the same tensors (an in-place change in between is autograd's error).
    """
    derived = field.derived
    key = ("cpu operands", id(x), rows)
    if key in derived and derived[key][0] is x:
        return derived[key][1]
    wide_x = x if x.dtype in CPU_KERNEL_DTYPES else _kernel_dtype(x)
    if field.tensor is None:
        operands = operand(wide_x), _empty_operand(wide_x.dtype)
    elif field.kind.spline:
        operands = operand(wide_x), field_operand(field, _spline_planes(field), rows)
    elif field.tensor.dtype not in CPU_KERNEL_DTYPES:
        operands = operand(wide_x), field_operand(field, _kernel_dtype(field.tensor), rows)
    else:
        operands = operand(wide_x), field_operand(field, field.tensor, rows)
    if keep and wide_x is x and (field.tensor is None or field.tensor.dtype in CPU_KERNEL_DTYPES):
        derived[key] = (x, operands)
    return operands


def _point_strides(field: Field, strides) -> tuple:
    """A field's strides as :func:`field_operand` hands them to the kernels (point order, a displacement's component
    stride negated: the kernels read its x, dx, 2 components above dz); a B-spline's row coefficients (N, 3, Do,
    Ho, Kw) alike."""
    if field.kind.displaced or field.kind.spline:
        strides = POINT_ORDER(strides)
        return strides[:4] + (-strides[4],)
    return strides


def _joinable(grid_like, out_like, width: int) -> bool:
    """Whether every output-shaped operand steps h by exactly a row of w: grid-shaped ones (n, d, h, w, component),
    volume-shaped ones (n, c, d, h, w)."""
    return all(s[2] == width * s[3] for s in grid_like) and all(s[3] == width * s[4] for s in out_like)


def _smooth(field: Field, depth: int, sampling: Sampling, matrix) -> bool:
    """:func:`.slabs.looks_coherent` of a field from about ``SAMPLED_ROWS`` of its output rows; ``depth`` is the
    input's, ``matrix`` an affine field's voxel matrix."""
    return looks_coherent(field, depth, sampling, row_step(field.points // field.out_sizes[2]), matrix)


def _finite(grad) -> bool:
    """Whether every element of grad is finite: its sum is, or (a sum that overflowed or met inf or NaN) each
    element is. A non-finite grad needs PyTorch's own grid-gradient terms to place NaN and infinity as PyTorch does.

    Half data is summed in float32 after a float32 copy: bfloat16's own sum, or one in
    float64, took 2 to 6 times as long. Under ``tuning.PARALLEL_VALUES`` values NumPy sums:
    beside a small call's kernels torch's reduction took 16 us to NumPy's 6.
    """
    values = grad.float() if grad.dtype in HALF_DTYPES else grad
    if values.numel() < tuning.PARALLEL_VALUES:
        finite_sum = bool(np.isfinite(np.add.reduce(values.detach().numpy(), axis=None)))
    else:
        finite_sum = bool(torch.isfinite(values.sum()))
    return finite_sum or bool(torch.isfinite(values).all())


def _facts(call: Call, needed, field: Field, grad, matrix) -> tuple:
    """(smooth, grad_finite): the facts about the data named in ``needed`` (:func:`.planner.facts_needed`),
    measured; None where not needed."""
    smooth = _smooth(field, call.sizes[0], call.sampling, matrix) if "smooth" in needed else None
    return smooth, (_finite(grad) if "grad_finite" in needed else None)


def _dense_strides(tensor: torch.Tensor):
    """The strides of ``tensor`` as the kernels will see it (:func:`_kernel_dtype`), without widening it."""
    if tensor.dtype in CPU_KERNEL_DTYPES:
        return tuple(tensor.stride())
    shape = tensor.shape
    if memory_format_of(tensor) == torch.channels_last_3d:
        channels, depth, height, width = shape[1:]
        return (channels * depth * height * width, 1, height * width * channels, width * channels, channels)
    strides, step = [], 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= size
    return tuple(strides)


def describe_call(stage: Stage, x, field: Field, sampling: Sampling, *, grad=None, outputs=Outputs()) -> Call:
    """The planner's description of a call from its NCDHW tensors and records, without the facts about the data
    (``grad`` is given for a backward)."""
    out_sizes = field.out_sizes
    field_strides = [] if field.tensor is None else [_point_strides(field, _dense_strides(field.tensor))]
    # A B-spline's columns are the control grid's along one output row: its rows are never joined.
    joinable = not field.kind.spline and _joinable(
        field_strides, [_dense_strides(grad)] if grad is not None else [], out_sizes[2]
    )
    return Call.describe(
        stage,
        x,
        field,
        sampling,
        outputs,
        channels_last=memory_format_of(x) == torch.channels_last_3d,
        threads=pool.threads(),
        dense_ncdhw=grad is not None and x.is_contiguous() and grad.is_contiguous(),
        rows_joinable=joinable,
    )


# What was planned for calls seen before, by what describe_call() reads of them (shapes,
# strides, dtypes, records, threads) and tuning's values: (the description, the facts its
# plan reads, the plans made so far by those facts). A call like an earlier one then plans
# with two lookups (an 8³ backward, in a loop: 26 us to 7).
_PLANNED: dict = {}
_PLANNED_MOST = 512


def plan_call(stage: Stage, x, field: Field, sampling: Sampling, *, grad=None, outputs=Outputs(), matrix=None) -> Plan:
    """The plan of a call: :func:`describe_call`, the facts its plan reads measured, :func:`.planner.make_plan`;
    ``matrix`` is an affine field's voxel matrix (made here where not given)."""
    tensor = field.theta if field.tensor is None else field.tensor
    key = (
        stage,
        sampling,
        field.kind,
        field.out_sizes,
        outputs,
        pool.threads(),
        x.shape,
        x.stride(),
        x.dtype,
        tensor.shape,
        tensor.stride(),
        tensor.dtype,
        None if grad is None else (grad.stride(), grad.dtype),
        tuning.values(),
    )
    planned = _PLANNED.get(key)
    if planned is None:
        call = describe_call(stage, x, field, sampling, grad=grad, outputs=outputs)
        if len(_PLANNED) >= _PLANNED_MOST:
            _PLANNED.clear()
        planned = _PLANNED[key] = (call, facts_needed(call), {})
    call, needed, plans = planned
    if not needed:
        facts = (None, None)
    else:
        if "smooth" in needed and matrix is None:
            matrix = _field_constants(field, x, sampling)
        facts = _facts(call, needed, field, grad, matrix)
    plan = plans.get(facts)
    if plan is None:
        plan = plans[facts] = make_plan(dataclasses.replace(call, smooth=facts[0], grad_finite=facts[1]))
    return plan


def _rounded(result: torch.Tensor, dtype: torch.dtype, layout) -> torch.Tensor:
    """A result of the kernels, computed in another dtype, in the caller's ``dtype``
    (:func:`.rounding.round_in_parts`) and ``layout``."""
    return round_in_parts(result, dtype).contiguous(memory_format=layout)


class NumbaBackend:
    """Parallel Numba kernels for CPU tensors (see ``gridsampler3d.cpu``); a :class:`.backends.Backend`."""

    name = "numba"

    def unavailable_reason(self) -> str | None:
        return None

    def supports(self, device: torch.device) -> bool:
        return device.type == "cpu"

    def forward(self, x: torch.Tensor, field: Field, sampling: Sampling) -> torch.Tensor:
        matrix = _field_constants(field, x, sampling)
        plan = plan_call(Stage.FORWARD, x, field, sampling, matrix=matrix)
        dtype, layout = x.dtype, memory_format_of(x)
        if dtype not in CPU_KERNEL_DTYPES:
            x = _kernel_dtype(x)
        out_sizes, rows = field.out_sizes, plan.rows_joined
        y = buffers.empty(x.shape[:2] + out_sizes, x.dtype, layout)
        depth, height, width = out_sizes
        geometry = Geometry(x.shape[0], x.shape[1], tuple(x.shape[2:]), (depth, height // rows, rows * width))
        x_operand, values = _call_operands(field, x, rows)
        work = ForwardWork(plan, x_operand, values, matrix, operand(y, rows), geometry, sampling, field.kind)
        run_forward(work)
        return y if y.dtype == dtype else _rounded(y, dtype, layout)

    def backward(
        self,
        grad: torch.Tensor,
        x: torch.Tensor,
        field: Field,
        sampling: Sampling,
        outputs: Outputs,
        deterministic: bool,
    ) -> Gradients:
        """Always deterministic (sums in a fixed order): ``deterministic`` changes nothing here."""
        matrix = _field_constants(field, x, sampling)
        plan = plan_call(Stage.BACKWARD, x, field, sampling, grad=grad, outputs=outputs, matrix=matrix)
        if not plan.copies:
            return _execute_backward(plan, grad, x, field, sampling, outputs, matrix)
        # The channels-last kernels on channels-last copies of grad (and x, which only
        # the grid gradient reads), dx copied back: the same bits as the NCDHW kernels.
        grad = transpose.to_channels_last(grad)
        # For dx alone, an unwritten channels-last stand-in in the kernels' dtype.
        x = (
            transpose.to_channels_last(x)
            if plan.copy_x
            else buffers.empty(x.shape, cpu_kernel_dtype(x.dtype), torch.channels_last_3d)
        )
        dx, dfield, dtheta = _execute_backward(plan, grad, x, field, sampling, outputs, matrix)
        del grad, x  # before dx's copy: the copies' peak is then three operands' worth, not four
        return Gradients(transpose.to_contiguous(dx) if outputs.dx else None, dfield, dtheta)


def _execute_backward(plan: Plan, grad, x, field: Field, sampling: Sampling, outputs: Outputs, matrix) -> Gradients:
    """The backward's kernels on the given operands (as they are, or their channels-last copies)."""
    dtype, layout = grad.dtype, memory_format_of(x)  # grad has x's dtype (validate.check_same)
    if dtype not in CPU_KERNEL_DTYPES:
        grad = _kernel_dtype(grad)
    rows = plan.rows_joined
    x_operand, field_values = _call_operands(field, x, rows, keep=not plan.copies)
    wide_field = x if field.tensor is None else field.tensor
    if wide_field.dtype not in CPU_KERNEL_DTYPES:
        wide_field = _kernel_dtype(wide_field)
    x = _kernel_dtype(x) if x.dtype not in CPU_KERNEL_DTYPES else x
    dfield, dfield_operand = None, _empty_operand(wide_field.dtype)
    if outputs.dfield and field.kind.spline:
        # The plane sums of the gradient with respect to the position, in float64, zeroed: the kernels add into them.
        dfield = torch.zeros(_spline_planes(field).shape, dtype=torch.float64)
        dfield_operand = field_operand(field, dfield)
    elif outputs.dfield:
        dfield = buffers.empty(field.tensor.shape, wide_field.dtype, field.gradient_format())
        dfield_operand = field_operand(field, dfield, rows)
        if plan.grid_pass == GridPass.ZEROS:
            dfield.zero_()  # nearest has a zero grid gradient everywhere: no pass needed
    dx = buffers.empty(x.shape, x.dtype, layout) if outputs.dx else None
    depth, height, width = field.out_sizes
    moments = np.zeros(6 * (x.shape[0] * depth * height)) if outputs.dtheta else _NO_MOMENTS
    operands = BackwardOperands(
        grad=operand(grad, rows),
        x=x_operand,
        grid=field_values,
        dx=operand(dx) if outputs.dx else _empty_operand(x.dtype),
        dgrid=dfield_operand,
        matrix=matrix,
        moments=moments,
    )
    geometry = Geometry(x.shape[0], x.shape[1], tuple(x.shape[2:]), (depth, height // rows, rows * width))
    run_backward(BackwardWork(plan, operands, geometry, sampling, field.kind))
    if outputs.dx and dx.dtype != dtype:
        dx = _rounded(dx, dtype, layout)
    if outputs.dfield and field.kind.spline:  # the zero row and column gathered what the grid leaves out
        dfield = round_once(spline.plane_gradient(dfield, field), field.tensor.dtype)
    elif outputs.dfield and dfield.dtype != dtype:
        dfield = _rounded(dfield, dtype, memory_format_of(dfield))
    dtheta = None
    if outputs.dtheta:
        # dL/dtheta from the kernels' row moments (:func:`.theta.theta_gradient`), in theta's dtype, rounded once.
        in_sizes = tuple(x.shape[2:])
        derived, key = field.derived, ("axes", in_sizes, sampling.align_corners)
        axes = derived[key] if key in derived else affine_axes(in_sizes, field.out_sizes, sampling.align_corners)
        values = theta.theta_gradient(moments, field.theta.shape[0], field.out_sizes, axes)
        dtheta = round_once(torch.from_numpy(values), field.theta.dtype)
    return Gradients(dx, dfield, dtheta)
