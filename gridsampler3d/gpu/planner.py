"""How the GPU engine runs a call: a plan made from a description of the call, before any kernel runs.

:func:`make_plan` is a pure function of a :class:`GpuCall` (shapes, dtype, whether x's
channels are adjacent in memory, the call's sampling rule and kind of field, the outputs
asked for, the deterministic flag, the GPU's compute capability, and whether launches run
compiled and may be tuned). It returns a frozen :class:`GpuPlan`: which kernels run, their
launch shapes (and the shapes the tuner may try instead), how dx is summed (atomics, or
the deterministic gather) and in which precision. The engine (:mod:`.engine`) launches
what the plan names; ``gridsampler3d.explain`` prints it without a GPU.

No decision here moves a bit that the plan does not say it moves: every launch shape the
tuner may try gives the same results (docs/gpu.md, "Autotuning"), and the deterministic
mode's sums run in a fixed order.
"""

from __future__ import annotations

import dataclasses
import enum

from ..dtypes import HALF_NAMES
from ..modes import Interpolation
from ..problem import Gradient, Passes, Problem, Stage
from . import records

__all__ = ["DxMethod", "GpuCall", "GpuPlan", "Stage", "Tile", "make_plan"]

# Points per partial sum of a long bucket in the deterministic trilinear dx (a bucket longer
# than this is summed in chunks of it, one lane each, then chunk by chunk).
BUCKET_CHUNK = 256
# Entries (point, tap) per chunk of the deterministic tricubic dx: bounds its sort's memory.
TRICUBIC_CHUNK_ENTRIES = 1 << 26
# Channels a program reads at once where they are adjacent in memory (channels-last).
WIDEST_CHANNEL_BLOCK = 16
# Under Triton's interpreter, whose cost is per program and per operation rather than per
# lane, programs take this many times more points.
INTERPRETED_SCALE = 8


class DxMethod(enum.Enum):
    """How the backward computes dx."""

    NONE = "none"  # not asked for
    ATOMIC = "atomic"  # the fast mode: the backward kernel adds grad * weight into each tap with atomics
    GATHERED = "gathered"  # deterministic: points bucketed by cell, sorted, each voxel gathers its buckets in order
    SORTED_TAPS = "sorted taps"  # deterministic tricubic: (point, tap) entries sorted by voxel, gathered per chunk


@dataclasses.dataclass(frozen=True)
class Tile:
    """A launch shape: ``block_d`` x ``block_h`` x ``block_w`` output points (patch kernels; the flat kernels use
    ``block_w`` alone, as points or voxels) times ``block_c`` channels a program, on ``num_warps`` warps."""

    block_w: int
    block_c: int = 1
    block_h: int = 1
    block_d: int = 1
    num_warps: int = 4

    def __str__(self) -> str:
        points = (
            f"{self.block_d}x{self.block_h}x{self.block_w}" if self.block_d * self.block_h > 1 else f"{self.block_w}"
        )
        return f"{points} x {self.block_c} channel{'s' * (self.block_c > 1)}, {self.num_warps} warps"

    def keywords(self) -> dict:
        """The kernels' launch keywords: the constexpr ``TILE`` (:class:`.records.Blocks`, this shape's block sizes)
        and the launch option ``num_warps``."""
        return {
            "TILE": records.constexpr_members(records.Blocks(self.block_w, self.block_c, self.block_h, self.block_d)),
            "num_warps": self.num_warps,
        }


@dataclasses.dataclass(frozen=True)
class GpuCall(Problem):
    """What the GPU planner knows of a call: the :class:`.problem.Problem` (shapes, dtype, the sampling rule, the
    kind of field, the outputs asked for) and what the GPU engine alone reads.

    ``channels_adjacent``: x's channels are adjacent in memory (channels-last, more than
    one channel), so a program can read a tap's channel vector at once. ``deterministic``:
    the backward's sums run in a fixed order. ``interpreted``: the kernels run through
    Triton's interpreter. ``autotune``: launches on this device may be tuned
    (:func:`.autotune.enabled`). ``capability``: the GPU's (major, minor);
    ``capability_assumed``: there is no GPU here, and the plan assumes ``capability``.
    """

    channels_adjacent: bool = False
    deterministic: bool = False
    interpreted: bool = False
    autotune: bool = True
    capability: tuple = (9, 0)
    capability_assumed: bool = False


@dataclasses.dataclass(frozen=True)
class GpuPlan:
    """What the GPU engine runs for one call; printed, it reads as one line.

    ``tile`` is the launch shape of the call's main kernel (the forward, or the backward's
    walk over the points, which ``walk`` says runs at all); ``candidates`` the shapes (the
    first is ``tile``) whose results are the same, which the tuner may time instead, and
    ``tuned`` whether it does, under ``tune_key`` (:func:`tune_key`). ``dx`` and ``passes`` (:func:`.problem.passes`;
    a gradient computed is computed in the walk) say how the backward's
    outputs are made; the deterministic gather launches with ``gather_tile`` (among ``gather_candidates``,
    timed where ``gather_tuned``), summing buckets longer than
    ``chunk`` points in chunks of that many (:data:`DxMethod.GATHERED`), or sorting ``chunk``
    points' entries at a time (:data:`DxMethod.SORTED_TAPS`). ``sums`` is the precision of
    the main kernel's sums, ``dx_sums`` that of dx's. ``spline``: the field is a B-spline, whose
    kernels read its row coefficients and whose gradient the walk sums per row.
    """

    stage: Stage
    interpolation: Interpolation
    tile: Tile
    candidates: tuple = ()
    tuned: bool = False
    walk: bool = True
    dx: DxMethod = DxMethod.NONE
    passes: Passes = Passes()
    tune_key: tuple = ()
    gather_tile: Tile | None = None
    gather_candidates: tuple = ()
    gather_tuned: bool = False
    chunk: int = 0
    sums: str = "float32"
    dx_sums: str = "float32"
    capability: tuple = (9, 0)
    capability_assumed: bool = False
    interpreted: bool = False
    spline: bool = False

    def __str__(self) -> str:
        where = "Triton's interpreter" if self.interpreted else f"cuda sm_{self.capability[0]}{self.capability[1]}"
        if self.capability_assumed and not self.interpreted:
            where += " (assumed: no GPU here)"
        kernel = {
            Interpolation.BILINEAR: "trilinear",
            Interpolation.NEAREST: "nearest",
            Interpolation.BICUBIC: "tricubic",
        }[self.interpolation]
        words = [f"{self.stage.value} on {where}: {kernel}"]
        if self.walk:
            tuned = f", tuned among {len(self.candidates)} shapes" if self.tuned else ""
            words.append(f"programs of {self.tile}{tuned}, sums in {self.sums}")
        if self.stage == Stage.BACKWARD:
            words.append(
                {
                    Gradient.NONE: "",
                    Gradient.ZEROS: "field gradient zero",
                    Gradient.COMPUTED: (
                        "control points' gradient from the walk's row sums, summed in float64"
                        if self.spline
                        else "field gradient in the walk over points"
                    ),
                }[self.passes.field]
            )
            words.append(
                {
                    Gradient.NONE: "",
                    Gradient.ZEROS: "theta gradient zero",
                    Gradient.COMPUTED: "theta gradient from the walk's row moments, summed in float64",
                }[self.passes.theta]
            )
            words.append(_dx_words(self))
        return ", ".join(word for word in words if word)


def _dx_words(plan: GpuPlan) -> str:
    if plan.dx == DxMethod.ATOMIC:
        return f"dx by atomics in {plan.dx_sums}"
    if plan.dx == DxMethod.NONE:
        return ""
    how = (
        f"points bucketed by cell (long buckets in chunks of {plan.chunk})"
        if plan.dx == DxMethod.GATHERED
        else f"(point, tap) entries of {plan.chunk} points at a time"
    )
    tuned = f", tuned among {len(plan.gather_candidates)} shapes" if plan.gather_tuned else ""
    return (
        f"dx deterministic: {how}, sorted, gathered by programs of {plan.gather_tile}{tuned}, sums in "
        f"{plan.dx_sums} rounded once"
    )


def _power_of_two_above(value: int) -> int:
    """The least power of two >= ``value`` (``triton.next_power_of_2``, without importing Triton)."""
    return 1 << max(0, value - 1).bit_length()


def channel_block(call: GpuCall) -> int:
    """Channels per program step: 1 unless x's channels are adjacent in memory, where one load reads a tap's
    channel vector (up to ``WIDEST_CHANNEL_BLOCK``)."""
    return min(_power_of_two_above(call.channels), WIDEST_CHANNEL_BLOCK) if call.channels_adjacent else 1


def patch_tile(call: GpuCall, elements: int, num_warps: int | None = None) -> Tile:
    """Launch shape of the trilinear / nearest kernels: block_d x block_h x block_w output points per program.

    NCDHW: one channel per step, lanes along points, ``elements`` points per program.
    Channels-last: a channel vector per step, about ``elements`` elements per program.
    Either way few enough that no thread spills (docs/gpu.md, registers). block_w follows
    the output's width (idle lanes cost as much as busy ones); block_h, then block_d, fill
    the rest of the patch. ``num_warps`` overrides the warps that follow from the patch's size.
    """
    block_c = channel_block(call)
    points = max(16, elements // block_c) * (INTERPRETED_SCALE if call.interpreted else 1)
    out_depth, out_height, out_width = call.out_sizes
    block_w = min(_power_of_two_above(out_width), points)
    block_h = min(_power_of_two_above(out_height), points // block_w)
    block_d = min(_power_of_two_above(out_depth), points // (block_w * block_h))
    warps = num_warps or max(1, min(4, block_d * block_h * block_w * block_c // 32))
    return Tile(block_w, block_c, block_h, block_d, warps)


def _patch_candidates(call: GpuCall, elements: int) -> tuple:
    """The default patch (first) and those the tuner may try: half and twice the points, twice the warps."""
    default = patch_tile(call, elements)
    shapes = [
        default,
        patch_tile(call, elements // 2),
        patch_tile(call, elements * 2),
        patch_tile(call, elements, num_warps=min(8, 2 * default.num_warps)),
    ]
    return tuple(shape for index, shape in enumerate(shapes) if shape not in shapes[:index])


def flat_tile(call: GpuCall, elements: int = 1024) -> Tile:
    """(voxels or points) x channels per program of the flat kernels: about ``elements`` elements (scaled under the
    interpreter, as :func:`patch_tile`)."""
    block_c = channel_block(call)
    scale = INTERPRETED_SCALE if call.interpreted else 1
    return Tile(max(16, min(256 * scale, elements * scale // block_c)), block_c)


def _sums(call: GpuCall, exact_half: bool = False) -> str:
    """The precision of sums for the call's dtype: float64 for float64, and for half types where ``exact_half``
    (a sum rounded to half precision once: docs/semantics.md, "Dtypes"); else float32."""
    return "float64" if call.dtype == "float64" or (exact_half and call.dtype in HALF_NAMES) else "float32"


def tune_key(call: GpuCall) -> tuple:
    """What the tuner keys a launch shape it measured on: everything that can change the best shape. The stage, the
    interpolation and padding, the dtype, the layout (adjacent channels), the kind of field, the outputs,
    determinism, and the batch, channels, input sizes and output sizes, each rounded up to a power of two (so that
    calls of similar shapes share one measurement)."""
    bucket = _power_of_two_above
    return (
        call.stage.value,
        call.sampling.interpolation.name.lower(),
        call.sampling.padding.name.lower(),
        call.dtype,
        call.channels_adjacent,
        call.field.name.lower(),
        tuple(call.outputs),
        call.deterministic,
        bucket(call.batch),
        bucket(call.channels),
        tuple(bucket(size) for size in call.sizes),
        tuple(bucket(size) for size in call.out_sizes),
    )


def make_plan(call: GpuCall) -> GpuPlan:
    """The plan for ``call``."""
    if call.stage == Stage.FORWARD:
        return _forward_plan(call)
    return _backward_plan(call)


def _forward_plan(call: GpuCall) -> GpuPlan:
    interpolation = call.sampling.interpolation
    common = dict(
        stage=call.stage,
        interpolation=interpolation,
        sums=_sums(call),
        capability=call.capability,
        capability_assumed=call.capability_assumed,
        interpreted=call.interpreted,
        spline=call.field.spline,
        tune_key=tune_key(call),
    )
    if interpolation == Interpolation.BICUBIC:
        # 128 points, or 16 x 16 (point, channel): no spills
        return GpuPlan(tile=flat_tile(call, 128), **common)
    # Each output element is one lane's sum over its taps: no shape changes a result, so any may be tuned.
    candidates = _patch_candidates(call, 128 if channel_block(call) == 1 else 512)
    return GpuPlan(tile=candidates[0], candidates=candidates, tuned=call.autotune and len(candidates) > 1, **common)


def _backward_plan(call: GpuCall) -> GpuPlan:
    interpolation = call.sampling.interpolation
    bicubic = interpolation == Interpolation.BICUBIC
    passes = call.passes
    in_walk = Gradient.COMPUTED in (passes.field, passes.theta)
    dx = DxMethod.NONE
    if call.outputs.dx:
        dx = DxMethod.ATOMIC if not call.deterministic else (DxMethod.SORTED_TAPS if bicubic else DxMethod.GATHERED)
    common = dict(
        stage=call.stage,
        interpolation=interpolation,
        dx=dx,
        passes=passes,
        sums=_sums(call),
        dx_sums=_sums(call, exact_half=dx != DxMethod.ATOMIC),
        capability=call.capability,
        capability_assumed=call.capability_assumed,
        interpreted=call.interpreted,
        walk=dx == DxMethod.ATOMIC or in_walk,
        spline=call.field.spline,
        tune_key=tune_key(call),
    )
    gather = _gather(call, dx)
    if bicubic:
        tile = flat_tile(call, 128)
        if call.dtype == "float64":
            tile = dataclasses.replace(tile, block_c=1)  # the grid gradient summed channel by channel: bit for bit
        return GpuPlan(tile=tile, **gather, **common)
    candidates = _patch_candidates(call, 128 if channel_block(call) == 1 else 256)
    # theta's row moments and a B-spline's row sums are a program's sums: patches of one row
    # (coords.store_row_moments, coords.store_row_sums)
    row_sums = passes.theta == Gradient.COMPUTED or (call.field.spline and passes.field == Gradient.COMPUTED)
    if row_sums:
        candidates = tuple(dict.fromkeys(dataclasses.replace(tile, block_h=1, block_d=1) for tile in candidates))
    if call.dtype == "float64":
        # the grid gradient summed channel by channel: PyTorch's order, bit for bit
        candidates = tuple(dict.fromkeys(dataclasses.replace(tile, block_c=1) for tile in candidates))
    # Tuned in the fast mode only, and there only where no reduction runs across the lanes
    # of a channel vector (whose order a shape could change): the grid gradient stays the
    # same in both modes and from run to run. Row moments and row sums are summed per block_w
    # columns, so they fix the shape.
    tuned = (
        call.autotune
        and dx == DxMethod.ATOMIC
        and len(candidates) > 1
        and (passes.field != Gradient.COMPUTED or candidates[0].block_c == 1)
        and not row_sums
    )
    return GpuPlan(tile=candidates[0], candidates=candidates, tuned=tuned, **gather, **common)


def _gather(call: GpuCall, dx: DxMethod) -> dict:
    """The deterministic dx's gather launch: its tile and the tuner's candidates (each (voxel, channel) lane sums
    its own bucket in order, so no shape changes a result)."""
    if dx == DxMethod.SORTED_TAPS:
        return {"gather_tile": flat_tile(call), "chunk": max(1, TRICUBIC_CHUNK_ENTRIES // 64)}
    if dx != DxMethod.GATHERED:
        return {}
    tile = flat_tile(call, 128 if channel_block(call) == 1 else 1024)  # 128 voxels NCDHW: no spills
    shapes = [
        tile,
        dataclasses.replace(tile, block_w=max(16, tile.block_w // 2)),
        dataclasses.replace(tile, block_w=2 * tile.block_w),
        dataclasses.replace(tile, num_warps=8),
    ]
    candidates = tuple(dict.fromkeys(shapes))
    return {
        "gather_tile": tile,
        "gather_candidates": candidates,
        "gather_tuned": call.autotune and len(candidates) > 1,
        "chunk": BUCKET_CHUNK,
    }
