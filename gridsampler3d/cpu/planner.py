"""How the CPU engine runs a call: a plan made from a description of the call, before any kernel runs.

:func:`make_plan` is a pure function of a :class:`Call` (shapes, layout, dtype, modes,
outputs asked for, threads, and two facts about the data: whether the grid is smooth
and whether grad is finite). It returns a frozen :class:`Plan` that names the strategy
and its parameters; :mod:`.executors` runs it, one function per strategy. The plan
decides speed only: every strategy sums each element in the same order, so results
never depend on it (docs/cpu.md, "The planner").

The two facts cost a pass over data, so they are measured only where the plan depends
on them: :func:`facts_needed` says which.

    call = Call(stage=Stage.BACKWARD, batch=1, channels=16, sizes=(64, 64, 64), ...)
    if "smooth" in facts_needed(call): call = dataclasses.replace(call, smooth=...)
    print(make_plan(call))
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from typing import TYPE_CHECKING

from ..dtypes import HALF_NAMES
from ..modes import Interpolation
from ..problem import Gradient, Problem, Stage
from . import tuning

if TYPE_CHECKING:  # the names in the inherited fields' annotations, for the API reference
    from ..problem import Outputs  # noqa: F401
    from ..sampling import FieldKind, Sampling  # noqa: F401

__all__ = ["Call", "DxPass", "GridPass", "Plan", "Stage", "Strategy", "facts_needed", "make_plan"]


class Strategy(str, enum.Enum):
    """How a call's work is split into kernel launches."""

    SERIAL = (
        "serial"  # a small call: one walk over the points on the calling thread, no smoothness verdict, no hand-off
    )
    ROWS = "rows"  # forward: runs of output rows, taken by whichever thread is free
    CHANNEL_GROUPS = "channel groups"  # forward of a random grid: a cache's worth of channel planes at a time
    FUSED = "fused"  # backward: one walk over the points computes dx and the grid gradient
    BESIDE = "beside"  # backward: dx slabs on some threads beside the grid gradient's runs of rows
    PASSES = "passes"  # backward: a pass per output, the grid gradient's first
    BICUBIC = "bicubic"  # tricubic kernels: rows for y and the grid gradient, slabs of planes for dx


class GridPass(enum.Enum):
    """How the grid gradient is computed (within :attr:`Strategy.PASSES`)."""

    NONE = "none"  # not asked for
    ZEROS = "zeros"  # nearest: zero everywhere, no pass
    ROWS = "rows"  # runs of rows, every channel at once
    CHANNEL_GROUPS = "channel groups"  # a random grid: groups of channels in turn, sums carried over chunks of rows


class DxPass(enum.Enum):
    """How dx is computed (within :attr:`Strategy.PASSES`)."""

    NONE = "none"  # not asked for
    SLABS = "slabs"  # each part owns a slab of (n, z) planes, walking every row that reaches it
    CHANNEL_GROUPS = "channel groups"  # a random grid: a cache's worth of channel planes at a time
    CHANNEL_HALVES = "channel halves"  # two threads, each owning every plane of half the channels


@dataclasses.dataclass(frozen=True)
class Call(Problem):
    """What the CPU planner knows of a call: the :class:`.problem.Problem` (shapes, dtype, the sampling rule, the
    kind of field, the outputs asked for) and what the CPU engine alone reads.

    ``threads`` is what the caller's torch setting allows; ``channels_last`` is x's layout;
    ``dense_ncdhw`` says grad and x are contiguous NCDHW tensors (copies to channels-last
    are possible); ``rows_joinable`` says every output-shaped operand steps h by exactly a
    row of w (so runs of short rows can be walked as one). ``smooth`` (neighbouring points
    mostly share their depth) and ``grad_finite`` are facts about the data, None until
    measured (:func:`facts_needed`).
    """

    channels_last: bool = False
    threads: int = 1
    dense_ncdhw: bool = True
    rows_joinable: bool = True
    smooth: bool | None = None
    grad_finite: bool | None = None

    @property
    def kernel_itemsize(self) -> int:
        """Bytes per element in the kernels: float32 stays float32, every other dtype computes in float64."""
        return 4 if self.dtype == "float32" else 8

    @property
    def positions_gradient(self) -> bool:
        """Whether a backward computes the gradient with respect to each point's position (for the field's tensor
        or theta): its grid-gradient pass runs, or for nearest its zeros are written."""
        return self.stage == Stage.BACKWARD and self.passes.positions != Gradient.NONE


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the engine runs for one call (see :class:`Strategy`); printed, it reads as one line.

    ``threads`` the threads used; ``rows_joined`` output rows walked as one row;
    ``runs`` the runs of rows of a pass by rows; ``dx_parts`` dx's slabs or channel halves
    (beside the grid gradient: the threads on dx); ``channel_group`` channels per group of
    a pass by channel groups (the forward's, or dx's); ``grid_channel_group`` and
    ``carry_rows`` the grid gradient's groups and its chunks of rows; ``copies`` runs the
    channels-last kernels on channels-last copies of grad and x; ``pytorch_terms``
    sums PyTorch's own terms (float64, or a non-finite grad) instead of the separable form.
    """

    stage: Stage
    strategy: Strategy
    threads: int
    channels_last: bool = False
    grid_pass: GridPass = GridPass.NONE
    dx_pass: DxPass = DxPass.NONE
    dx_parts: int = 0
    channel_group: int = 0
    grid_channel_group: int = 0
    carry_rows: int = 0
    runs: int = 1
    rows_joined: int = 1
    copies: bool = False
    copy_x: bool = False
    pytorch_terms: bool = False

    def __str__(self) -> str:
        words = [f"{self.stage.value} {self.strategy.value}", f"{self.threads} thread{'s' * (self.threads > 1)}"]
        if self.copies:
            words.append("on channels-last copies")
        elif self.channels_last:
            words.append("channels-last")
        if self.strategy == Strategy.ROWS or self.strategy == Strategy.CHANNEL_GROUPS:
            words.append(f"{self.runs} runs of rows")
        if self.strategy == Strategy.CHANNEL_GROUPS:
            words.append(f"{self.channel_group} channels a group")
        if self.strategy == Strategy.BESIDE:
            words.append(f"dx on {self.dx_parts} of them beside the grid gradient in {self.runs} runs of rows")
        if self.strategy == Strategy.SERIAL:
            words.append("one walk on the calling thread")
        if self.strategy == Strategy.PASSES or (self.strategy == Strategy.BICUBIC and self.stage == Stage.BACKWARD):
            words += [_grid_words(self), _dx_words(self)]
        computes_grid = self.strategy in (Strategy.FUSED, Strategy.BESIDE) or self.grid_pass in (
            GridPass.ROWS,
            GridPass.CHANNEL_GROUPS,
        )
        if self.stage == Stage.BACKWARD and self.strategy != Strategy.BICUBIC and computes_grid:
            words.append("PyTorch's grid-gradient terms" if self.pytorch_terms else "separable grid gradient")
        if self.rows_joined > 1:
            words.append(f"rows joined by {self.rows_joined}")
        return ", ".join(word for word in words if word)


def _grid_words(plan: Plan) -> str:
    if plan.grid_pass == GridPass.ROWS:
        return f"grid gradient in {plan.runs} runs of rows"
    if plan.grid_pass == GridPass.CHANNEL_GROUPS:
        return f"grid gradient {plan.grid_channel_group} channels a group over {plan.carry_rows} rows a chunk"
    return "grid gradient zero" if plan.grid_pass == GridPass.ZEROS else ""


def _dx_words(plan: Plan) -> str:
    if plan.dx_pass == DxPass.SLABS:
        return f"then dx in {plan.dx_parts} slab{'s' * (plan.dx_parts > 1)}"
    if plan.dx_pass == DxPass.CHANNEL_GROUPS:
        return f"then dx {plan.channel_group} channels a group"
    return "then dx in two channel halves" if plan.dx_pass == DxPass.CHANNEL_HALVES else ""


def facts_needed(call: Call) -> frozenset:
    """The facts about the data (``"smooth"``, ``"grad_finite"``) that :func:`make_plan` reads for ``call``."""
    needed = set()
    if _smooth_matters(call):
        needed.add("smooth")
    if (
        call.stage == Stage.BACKWARD
        and call.sampling.interpolation == Interpolation.BILINEAR
        and call.positions_gradient
        and call.dtype != "float64"
    ):
        needed.add("grad_finite")
    return frozenset(needed)


def make_plan(call: Call) -> Plan:
    """The plan for ``call``, whose facts :func:`facts_needed` names must be given."""
    missing = [fact for fact in sorted(facts_needed(call)) if getattr(call, fact) is None]
    if missing:
        raise ValueError(f"make_plan needs the call's {' and '.join(missing)} (see facts_needed)")
    if _small(call) and call.sampling.interpolation != Interpolation.BICUBIC:
        return _serial_plan(call)
    if call.sampling.interpolation == Interpolation.BICUBIC:
        threads = _threads(call)
        backward = call.stage == Stage.BACKWARD
        return Plan(
            call.stage,
            Strategy.BICUBIC,
            threads,
            call.channels_last,
            runs=_runs(threads, call.batch * call.out_sizes[0] * call.out_sizes[1], call),
            grid_pass=GridPass.ROWS if backward and call.positions_gradient else GridPass.NONE,
            dx_pass=DxPass.SLABS if backward and call.outputs.dx else DxPass.NONE,
            dx_parts=threads if backward and call.outputs.dx else 0,
        )
    if call.stage == Stage.FORWARD:
        return _forward_plan(call)
    if _copies_pay(call):
        inner = _backward_plan(dataclasses.replace(call, channels_last=True))
        return dataclasses.replace(inner, copies=True, copy_x=call.positions_gradient)
    return _backward_plan(call)


def _small(call: Call) -> bool:
    """Whether a call runs as one walk on the calling thread (:func:`_serial_plan`): too small to win back a
    hand-off to another thread, or on one thread with every batch item's planes in the cache
    (``tuning.SERIAL_ITEM_BYTES``)."""
    if call.points * call.channels < tuning.PARALLEL_VALUES:
        return True
    item_bytes = 2 * call.channels * math.prod(call.sizes) * call.kernel_itemsize  # x's planes and dx's
    return call.threads == 1 and item_bytes <= tuning.SERIAL_ITEM_BYTES


def _serial_plan(call: Call) -> Plan:
    """A small call's plan: one part on the calling thread walks the points once for every output asked for.

    The smoothness verdict is not read (the choices it informs pay only when the planes
    outgrow the caches or several threads share the work); grad's finiteness is, where
    the grid gradient's form depends on it (:func:`facts_needed`). The executor keeps its
    scratch between calls.
    """
    backward = call.stage == Stage.BACKWARD
    nearest = call.sampling.interpolation == Interpolation.NEAREST
    want_dgrid = backward and call.positions_gradient and not nearest
    return Plan(
        call.stage,
        Strategy.SERIAL,
        1,
        call.channels_last,
        grid_pass=GridPass.ZEROS
        if backward and nearest and call.positions_gradient
        else (GridPass.ROWS if want_dgrid else GridPass.NONE),
        dx_pass=DxPass.SLABS if backward and call.outputs.dx else DxPass.NONE,
        dx_parts=int(backward and call.outputs.dx),
        rows_joined=_rows_joined(call, 1, False),
        pytorch_terms=want_dgrid and (call.dtype == "float64" or not call.grad_finite),
    )


def _threads(call: Call) -> int:
    """One thread for a call too small to win back a hand-off; else what the caller allows."""
    values = call.points * call.channels
    return call.threads if values >= tuning.PARALLEL_VALUES else 1


def channel_group(call: Call) -> int:
    """How many channel planes a pass by channel groups takes at a time (at least one)."""
    plane = math.prod(call.sizes) * call.kernel_itemsize
    return max(1, tuning.SCATTER_CACHE_BYTES // max(1, plane))


def _smooth_matters(call: Call) -> bool:
    """Whether the plan of ``call`` depends on the grid's smoothness verdict."""
    if call.sampling.interpolation == Interpolation.BICUBIC or _small(call):
        return False
    if call.stage == Stage.FORWARD:
        return not call.channels_last and call.channels > channel_group(call)
    return _copies_possible(call) or _backward_asks(call)


def _backward_asks(call: Call) -> bool:
    """Whether a backward's split (fused or not, channel groups, rows joined) depends on the verdict."""
    threads, channels = _threads(call), call.channels
    want_dgrid = call.positions_gradient and call.sampling.interpolation != Interpolation.NEAREST
    group = channel_group(call)
    by_channels = call.outputs.dx and not call.channels_last and channels > group
    dgrid_by_channels = want_dgrid and not call.channels_last and channels > group
    verdict_counts = want_dgrid and (threads > 1 or channels < tuning.FUSED_CHANNELS)
    return dgrid_by_channels or (call.outputs.dx and (verdict_counts or by_channels))


def _copies_possible(call: Call) -> bool:
    """Whether a backward may run on channels-last copies, the verdict aside (see :func:`_copies_pay`)."""
    half = call.dtype in HALF_NAMES
    return (
        call.stage == Stage.BACKWARD
        and call.sampling.interpolation == Interpolation.BILINEAR
        and not call.channels_last
        and call.dtype != "float64"
        and not (half and not call.positions_gradient)
        and call.dense_ncdhw
        and call.channels >= (tuning.COPIED_HALF_CHANNELS if half else tuning.COPIED_CHANNELS)
    )


def _copies_pay(call: Call) -> bool:
    """Whether a backward runs faster on channels-last copies of its NCDHW operands (:mod:`.transpose`).

    Bilinear float32 data with at least ``tuning.COPIED_CHANNELS`` channels (half data:
    ``tuning.COPIED_HALF_CHANNELS``), dense NCDHW, on a smooth grid: a random grid's taps
    land all over every channel's plane, which the NCDHW passes take a group of channels
    at a time (and channels-last cannot). float64's grid gradient (PyTorch's exact terms)
    gains nothing channels-last, and half data's dx alone gained nothing either (bf16,
    0.98 to 1.08 of the time).
    """
    return _copies_possible(call) and bool(call.smooth)


def _forward_plan(call: Call) -> Plan:
    threads = _threads(call)
    group = channel_group(call)
    random = not call.channels_last and call.channels > group and not call.smooth
    joined = _rows_joined(call, threads, random)
    rows = call.batch * call.out_sizes[0] * call.out_sizes[1] // joined
    return Plan(
        call.stage,
        Strategy.CHANNEL_GROUPS if random else Strategy.ROWS,
        threads,
        call.channels_last,
        channel_group=group if random else 0,
        runs=_runs(threads, rows, call),
        rows_joined=joined,
    )


def _backward_plan(call: Call) -> Plan:
    threads, channels = _threads(call), call.channels
    nearest = call.sampling.interpolation == Interpolation.NEAREST
    want_dgrid = call.positions_gradient and not nearest
    group = channel_group(call)
    smooth = _backward_asks(call) and bool(call.smooth)
    random = _backward_asks(call) and not smooth
    coherent = want_dgrid and (threads > 1 or channels < tuning.FUSED_CHANNELS) and smooth
    joined = _rows_joined(call, threads, random)
    rows = call.batch * call.out_sizes[0] * call.out_sizes[1] // joined
    common = dict(
        stage=call.stage,
        threads=threads,
        channels_last=call.channels_last,
        rows_joined=joined,
        runs=_runs(threads, rows, call),
        pytorch_terms=want_dgrid and (call.dtype == "float64" or not call.grad_finite),
    )
    if call.outputs.dx and threads > 1 and coherent:
        return Plan(strategy=Strategy.BESIDE, dx_parts=threads - threads // 2, **common)
    if call.outputs.dx and threads == 1 and coherent and channels < tuning.FUSED_CHANNELS:
        return Plan(strategy=Strategy.FUSED, dx_parts=1, **common)
    grid_pass, grid_group, carry_rows = GridPass.NONE, 0, 0
    if nearest and call.positions_gradient:
        grid_pass = GridPass.ZEROS
    elif want_dgrid and (smooth or call.channels_last or channels <= group):
        grid_pass = GridPass.ROWS
    elif want_dgrid:
        grid_pass, grid_group = GridPass.CHANNEL_GROUPS, group
        # rows whose three float64 sums per point fit the carry
        carry_rows = max(1, tuning.CARRY_BYTES // (24 * call.out_sizes[2] * joined))
    dx_pass, dx_parts, dx_group = DxPass.NONE, 0, 0
    if call.outputs.dx and not call.channels_last and channels > group and not smooth:
        dx_pass, dx_group = DxPass.CHANNEL_GROUPS, group
    elif call.outputs.dx and threads == 2 and not call.channels_last and channels >= 2:
        dx_pass, dx_parts = DxPass.CHANNEL_HALVES, 2
    elif call.outputs.dx:
        dx_pass, dx_parts = DxPass.SLABS, threads
    return Plan(
        strategy=Strategy.PASSES,
        grid_pass=grid_pass,
        dx_pass=dx_pass,
        dx_parts=dx_parts,
        channel_group=dx_group,
        grid_channel_group=grid_group,
        carry_rows=carry_rows,
        **common,
    )


def _runs(threads: int, rows: int, call: Call) -> int:
    """How many parts a pass by rows is cut into, for the threads to take in turn.

    ``tuning.SHARED_RUNS`` per thread, so that a thread that runs slower (or rows that
    cost more) leave the others no more than a short run's wait; fewer where runs would
    hold less than ``tuning.RUN_VALUES`` output values each (but one per thread); one
    part on one thread.
    """
    if threads == 1:
        return 1
    worth = max(threads, call.points * call.channels // tuning.RUN_VALUES)
    return max(1, min(rows, tuning.SHARED_RUNS * threads, worth))


def _rows_joined(call: Call, threads: int, random: bool) -> int:
    """How many output rows are walked as one (1: rows as they are).

    The kernels walk each output row in blocks of ``tuning.BLOCK`` points: rows shorter
    than that leave blocks part-empty (a 64-wide row fills half of one), and every row
    runs its channel loop again. Where every output-shaped operand steps h by exactly a
    row of w (``rows_joinable``), rows h .. h + k - 1 of an (n, d) plane are one row of
    k * Wo points, the same points in the same order, so results do not change.

    Rows stay as they are for a field in voxels (a displacement: its kernels place each
    point by its row and column), and for a grid judged ``random`` at several threads: a full
    block's scratch with its random gathers' lines outgrew the L1 cache that the core's
    two threads share (rand64 forward at two threads, rows joined: 1.2 times the time).
    """
    if call.field.in_voxels or (random and threads > 1) or call.out_sizes[1] == 1 or not call.rows_joinable:
        return 1
    return _rows_per_long_row(*call.out_sizes, threads)


@functools.lru_cache(maxsize=256)
def _rows_per_long_row(depth: int, height: int, width: int, threads: int) -> int:
    """The divisor k of ``height`` whose rows of k * ``width`` points fill blocks best (the smallest of equals), with
    rows of at most ``tuning.LONG_ROW_POINTS`` points and at least four rows per thread."""

    def filled(k):  # share of the row's blocks that holds points
        return k * width / (-(-k * width // tuning.BLOCK) * tuning.BLOCK)

    rows_per_plane = -(-4 * threads // depth)  # rows of each (n, d) plane to leave, at least
    longest = min(height // max(1, rows_per_plane), tuning.LONG_ROW_POINTS // width)
    return max((k for k in range(1, max(1, longest) + 1) if height % k == 0), key=lambda k: (filled(k), -k))
