"""The executors of the CPU engine: one short function per strategy of :mod:`.planner`, each launching kernels.

An executor receives the plan and the call's operands as records (:class:`ForwardWork`,
:class:`BackwardWork`) and runs the kernel launches the plan names; :func:`launch` runs
them, again with the exact-remainder kernels where a part flags a far reflection.
"""

from __future__ import annotations

import dataclasses
import functools
import threading

import numpy as np

from ..modes import Interpolation
from ..sampling import FieldKind, Outputs, Sampling
from . import bicubic, pool
from .backward import BackwardOperands, backward_kernel
from .forward import forward_kernel
from .planner import DxPass, GridPass, Plan, Strategy
from .records import Carry, CarryMode, Geometry, Operand, RowRanges, kernel_rule, unnamed
from .slabs import depth_ranges, plan_slabs, row_parts
from .spline import coefficient_entries, plane_entries

__all__ = ["BackwardWork", "ForwardWork", "launch", "run_backward", "run_forward"]

# With one thread, whether a grid is smooth is judged from about this many of its rows.
SAMPLED_ROWS = 256
_NO_CARRY = Carry(np.empty(0), int(CarryMode.WHOLE))
# No row ranges: a part that owns every plane walks every row.
_EVERY_ROW = RowRanges(np.empty(0, np.int64), np.empty(0, np.int64))


@dataclasses.dataclass(frozen=True)
class ForwardWork:
    """A forward's plan and operands: x (N, C, D, H, W), the field (its operand in grid order, see
    :func:`.engine.field_operand`, and an affine field's voxel matrix (N * 12), else empty), y (N, C, Do, Ho, Wo);
    the call's sampling rule and kind of field."""

    plan: Plan
    x: Operand
    grid: Operand
    matrix: np.ndarray
    y: Operand
    geometry: Geometry
    sampling: Sampling
    field: FieldKind


@dataclasses.dataclass(frozen=True)
class BackwardWork:
    """A backward's plan and operands (:class:`.backward.BackwardOperands`); the records as for :class:`ForwardWork`."""

    plan: Plan
    operands: BackwardOperands
    geometry: Geometry
    sampling: Sampling
    field: FieldKind

    @property
    def rows(self) -> int:
        return self.geometry.batch * self.geometry.out_sizes[0] * self.geometry.out_sizes[1]

    @property
    def planes(self) -> int:
        return self.geometry.batch * self.geometry.sizes[0]

    def kernel(self, exact_remainder: bool):
        return backward_kernel(
            self.sampling, self.field, self.plan.pytorch_terms, exact_remainder, channels_last=self.plan.channels_last
        )


def launch(build, launches=(), together: bool = False, shared=()) -> None:
    """Run ``build(False)(*arguments, unresolved)`` for each launch in turn, ``unresolved`` one flag per part.

    With ``together`` the launches run at once instead (:func:`.pool.run_together`), each
    with flags of its own, and so do the ``shared`` launches, whose parts go to whichever
    thread is free; all must write disjoint elements. If a launch flags a part (a
    reflection coordinate beyond the fast kernel's exact range, see
    :func:`.forward.forward_kernel`), every launch runs again with ``build(True)``, the
    kernel that takes libm's remainder, compiled only when first needed.
    """
    for exact_remainder in (False, True):
        kernel = build(exact_remainder)
        if together or shared:
            flags = [np.zeros(kernel.part_count(*arguments), np.int64) for arguments in (*launches, *shared)]
            prepared = [
                kernel.launch(*arguments, unresolved) for arguments, unresolved in zip((*launches, *shared), flags)
            ]
            pool.run_together(prepared[: len(launches)], prepared[len(launches) :])
            if not any(unresolved.any() for unresolved in flags):
                return
            continue
        for arguments in launches:
            unresolved = np.zeros(kernel.part_count(*arguments), np.int64)
            kernel(*arguments, unresolved)
            if unresolved.any():
                break
        else:
            return


def from_channel(operand: Operand, channel: int) -> Operand:
    """``operand`` seen from channel ``channel`` on (strides unchanged)."""
    return Operand(operand.data[channel * operand.strides[1] :], operand.strides)


def channel_groups(channels: int, group: int):
    """(low, high) of each run of ``group`` channels (the last may be shorter)."""
    return [(low, min(low + group, channels)) for low in range(0, channels, group)]


def row_step(rows: int) -> int:
    """Every how many rows of ``rows`` a sampled judgement reads one (about ``SAMPLED_ROWS`` rows)."""
    return max(1, rows // SAMPLED_ROWS)


# A small call: one part on the calling thread, with the scratch of the thread's last small call of the kernel

_kept = threading.local()


def _kept_scratch(kernel, arguments, channels: int, spline) -> tuple:
    """One part's scratch for ``kernel``, kept for the calling thread and made anew where a call needs more than it
    holds: more channels or, for a B-spline field (``spline``, its constants; else None), more row or plane entries
    (:func:`.spline.coefficient_entries`, :func:`.spline.plane_entries`).

    A small call runs one launch at a time on its own thread, so that the arrays are never
    in use twice at once; allocating them anew (18 arrays) cost more than a small kernel.
    """
    try:
        kept = _kept.scratch
    except AttributeError:
        kept = _kept.scratch = {}
    sizes = (channels, 0, 0) if spline is None else (channels, coefficient_entries(spline), plane_entries(spline))
    held = kept[kernel.part] if kernel.part in kept else None
    if held is None or held[0][0] < sizes[0] or held[0][1] < sizes[1] or held[0][2] < sizes[2]:
        held = kept[kernel.part] = (sizes, unnamed(kernel.scratch(1, *arguments)))
    return held[1]


def run_serial(build, arguments, channels: int, spline=None) -> None:
    """``build(False)``'s one part with ``arguments`` on the calling thread (``build(True)``'s where it flags); its
    scratch sized for ``channels`` and, for a B-spline field, its constants ``spline`` (:func:`_kept_scratch`)."""
    try:
        unresolved = _kept.unresolved
    except AttributeError:
        unresolved = _kept.unresolved = np.zeros(1, np.int64)
    plain = unnamed(arguments)  # as :meth:`.jit.Parallel.launch` passes them
    for exact_remainder in (False, True):
        kernel = build(exact_remainder)
        kernel.part(*plain, unresolved, *_kept_scratch(kernel, arguments, channels, spline), 0)
        if not unresolved[0]:
            return


# The forward


def run_forward(work: ForwardWork) -> None:
    """Fill y as ``work.plan`` says."""
    _FORWARD[work.plan.strategy](work)


def _forward_kernel(work: ForwardWork):
    return functools.partial(forward_kernel, work.sampling, work.field, channels_last=work.plan.channels_last)


def _forward_rows(work: ForwardWork) -> None:
    """Runs of rows that the threads take in turn."""
    launch(_forward_kernel(work), shared=[(work.x, work.grid, work.matrix, work.y, work.geometry, work.plan.runs)])


def _forward_channel_groups(work: ForwardWork) -> None:
    """A random grid gathers from all over every channel's plane: a group of channels at a time, the threads taking
    the first group's runs of rows, then the next group's."""
    geometry = work.geometry
    launch(
        _forward_kernel(work),
        shared=[
            (
                from_channel(work.x, low),
                work.grid,
                work.matrix,
                from_channel(work.y, low),
                geometry._replace(channels=high - low),
                work.plan.runs,
            )
            for low, high in channel_groups(geometry.channels, work.plan.channel_group)
        ],
    )


def _forward_bicubic(work: ForwardWork) -> None:
    rule = kernel_rule(work.sampling, work.field, forward=True)
    # Runs of rows that the threads take in turn, as for the trilinear passes by rows.
    pool.run_together(
        [], [bicubic.forward.launch(work.x, work.grid, work.matrix, work.y, work.geometry, rule, work.plan.runs)]
    )


def _forward_serial(work: ForwardWork) -> None:
    run_serial(
        _forward_kernel(work),
        (work.x, work.grid, work.matrix, work.y, work.geometry, 1),
        work.geometry.channels,
        work.matrix if work.field.spline else None,
    )


_FORWARD = {
    Strategy.SERIAL: _forward_serial,
    Strategy.ROWS: _forward_rows,
    Strategy.CHANNEL_GROUPS: _forward_channel_groups,
    Strategy.BICUBIC: _forward_bicubic,
}


# The backward


def run_backward(work: BackwardWork) -> None:
    """Fill the outputs the plan asks for (dx, dgrid) as ``work.plan`` says."""
    _BACKWARD[work.plan.strategy](work)


def _whole(work: BackwardWork) -> np.ndarray:
    """One part that owns every plane and walks every row."""
    return np.array([[0, work.planes, 0, work.rows]], np.int64)


def _slabs(work: BackwardWork, count: int):
    """(parts, row ranges): ``count`` slabs of dx's planes, balanced by the points that reach them.

    One slab owns every plane and skips no row, so it needs no row ranges; several need
    every row's depth range (:func:`.slabs.depth_ranges`).
    """
    if count == 1:
        return _whole(work), _EVERY_ROW
    ranges = RowRanges(np.zeros(work.rows, np.int64), np.zeros(work.rows, np.int64))
    geometry = work.geometry
    depth_ranges(
        work.operands.grid,
        work.operands.matrix,
        geometry,
        kernel_rule(work.sampling, work.field),
        (row_step(work.rows), True),
        ranges,
        count,
    )
    nearest = work.sampling.interpolation == Interpolation.NEAREST
    return plan_slabs(
        ranges.first,
        ranges.last,
        geometry.batch,
        geometry.sizes[0],
        geometry.sizes[1] * geometry.sizes[2],
        geometry.out_sizes[2],
        1 if nearest else 2,
        count,
    ), ranges


def _row_unit(work: BackwardWork) -> int:
    """The runs of rows that stay in one part of a grid gradient's pass: a B-spline's (n, d) planes (Ho rows), whose
    rows add their sums into the plane's in order (:mod:`.spline`); else single rows."""
    return work.geometry.out_sizes[1] if work.field.spline else 1


def _grid_rows_launch(work: BackwardWork):
    """The grid gradient's launch by runs of rows, every channel at once."""
    return (
        work.operands,
        work.geometry,
        row_parts(work.rows, work.planes, work.plan.runs, _row_unit(work)),
        _EVERY_ROW,
        Outputs(False, True),
        _NO_CARRY,
    )


def _backward_fused(work: BackwardWork) -> None:
    """One thread walks a smooth grid once for both outputs."""
    launch(work.kernel, [(work.operands, work.geometry, _whole(work), _EVERY_ROW, Outputs(True, True), _NO_CARRY)])


def _backward_beside(work: BackwardWork) -> None:
    """The grid gradient on some threads while the others add dx.

    Vector gathers on one, the scalar scatter on the other, which share a core's ports
    better than two copies of the fused pass (docs/cpu.md). The grid gradient comes in
    short runs of rows that any thread takes up once its dx slab is done, so that both
    passes end together however unequal they are.
    """
    parts, ranges = _slabs(work, work.plan.dx_parts)
    launch(
        work.kernel,
        [(work.operands, work.geometry, parts, ranges, Outputs(True, False), _NO_CARRY)],
        shared=[_grid_rows_launch(work)],
    )


def _backward_passes(work: BackwardWork) -> None:
    """The grid gradient's pass, then dx's."""
    _GRID_PASSES[work.plan.grid_pass](work)
    _DX_PASSES[work.plan.dx_pass](work)


def _no_pass(work: BackwardWork) -> None:
    """No pass: the output is not asked for, or (nearest's grid gradient) zeroed by the engine."""


def _grid_by_rows(work: BackwardWork) -> None:
    launch(work.kernel, shared=[_grid_rows_launch(work)])


def _channel_slice(work: BackwardWork, low: int, high: int) -> BackwardOperands:
    """The operands of a launch over channels low .. high - 1 only (grad, x and dx; an empty dx stays empty)."""
    operands = work.operands
    return operands._replace(
        grad=from_channel(operands.grad, low), x=from_channel(operands.x, low), dx=from_channel(operands.dx, low)
    )


def _grid_by_channel_groups(work: BackwardWork) -> None:
    """A random grid's grid gradient a group of channels at a time.

    Each group's pass continues the sums of the groups before it (the carry), in
    PyTorch's order, over a chunk of rows whose sums fit ``tuning.CARRY_BYTES``; a far
    reflection in any group reruns the chunk's groups exactly.
    """
    unit = _row_unit(work)
    chunk, rows, width = -(-work.plan.carry_rows // unit) * unit, work.rows, work.geometry.out_sizes[2]
    groups = channel_groups(work.geometry.channels, work.plan.grid_channel_group)
    sums = np.empty(3 * min(chunk, rows) * width)
    for first in range(0, rows, chunk):
        last = min(first + chunk, rows)
        parts = row_parts(last - first, work.planes, work.plan.threads, unit)
        parts[:, 2:] += first
        carried = sums[: 3 * (last - first) * width]
        launch(
            work.kernel,
            [
                (
                    _channel_slice(work, low, high),
                    work.geometry._replace(channels=high - low),
                    parts,
                    _EVERY_ROW,
                    Outputs(False, True),
                    Carry(carried, int(_carry_mode(low, high, groups))),
                )
                for low, high in groups
            ],
        )


def _carry_mode(low: int, high: int, groups) -> CarryMode:
    if len(groups) == 1:
        return CarryMode.WHOLE
    return CarryMode.FIRST if low == 0 else (CarryMode.LAST if high == groups[-1][1] else CarryMode.MIDDLE)


def _dx_in_slabs(work: BackwardWork) -> None:
    parts, ranges = _slabs(work, work.plan.dx_parts)
    launch(work.kernel, [(work.operands, work.geometry, parts, ranges, Outputs(True, False), _NO_CARRY)])


def _dx_channel_launch(work: BackwardWork, low: int, high: int):
    return (
        _channel_slice(work, low, high),
        work.geometry._replace(channels=high - low),
        _whole(work),
        _EVERY_ROW,
        Outputs(True, False),
        _NO_CARRY,
    )


def _dx_by_channel_groups(work: BackwardWork) -> None:
    """A random grid scatters every channel's taps over its whole plane: dx a group of channels at a time keeps the
    group's planes in the cache while every point adds into them (each launch computes every point's taps again),
    each free thread taking the next group. Each voxel still sums in point order."""
    launch(
        work.kernel,
        shared=[
            _dx_channel_launch(work, low, high)
            for low, high in channel_groups(work.geometry.channels, work.plan.channel_group)
        ],
    )


def _dx_by_channel_halves(work: BackwardWork) -> None:
    """dx by two channel groups, each part owning every plane of its channels: the two parts then share the planes
    they keep in the caches (a core's two hyperthreads), where two slabs each kept their own (docs/cpu.md). Each part
    computes every point's taps."""
    half = work.geometry.channels // 2
    launch(
        work.kernel,
        [_dx_channel_launch(work, 0, half), _dx_channel_launch(work, half, work.geometry.channels)],
        together=True,
    )


def _backward_bicubic(work: BackwardWork) -> None:
    ops, rule = work.operands, kernel_rule(work.sampling, work.field)
    if work.plan.dx_pass != DxPass.NONE:
        # Equal runs of planes: every slab walks every point, so the work splits evenly.
        bounds = np.linspace(0, work.planes, work.plan.dx_parts + 1).round().astype(np.int64)
        bicubic.dx(
            ops.grad,
            ops.grid,
            ops.matrix,
            ops.dx,
            work.geometry,
            rule,
            np.stack([bounds[:-1], bounds[1:]], axis=1),
        )
    if work.plan.grid_pass != GridPass.NONE:
        pool.run_together(
            [],
            [
                bicubic.dgrid.launch(
                    ops.grad,
                    ops.x,
                    ops.grid,
                    ops.matrix,
                    ops.dgrid,
                    ops.moments,
                    work.geometry,
                    rule,
                    work.plan.runs,
                )
            ],
        )


_GRID_PASSES = {
    GridPass.NONE: _no_pass,
    GridPass.ZEROS: _no_pass,
    GridPass.ROWS: _grid_by_rows,
    GridPass.CHANNEL_GROUPS: _grid_by_channel_groups,
}
_DX_PASSES = {
    DxPass.NONE: _no_pass,
    DxPass.SLABS: _dx_in_slabs,
    DxPass.CHANNEL_GROUPS: _dx_by_channel_groups,
    DxPass.CHANNEL_HALVES: _dx_by_channel_halves,
}


def _backward_serial(work: BackwardWork) -> None:
    """Every output asked for in one walk over the points, on the calling thread."""
    outputs = Outputs(work.plan.dx_pass != DxPass.NONE, work.plan.grid_pass == GridPass.ROWS)
    run_serial(
        work.kernel,
        (work.operands, work.geometry, _whole(work), _EVERY_ROW, outputs, _NO_CARRY),
        work.geometry.channels,
        work.operands.matrix if work.field.spline else None,
    )


_BACKWARD = {
    Strategy.SERIAL: _backward_serial,
    Strategy.FUSED: _backward_fused,
    Strategy.BESIDE: _backward_beside,
    Strategy.PASSES: _backward_passes,
    Strategy.BICUBIC: _backward_bicubic,
}
