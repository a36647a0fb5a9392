"""The GPU engine's deterministic dx: contributions sorted by where they land, then gathered per voxel in order.

Trilinear and nearest (:func:`gathered_dx`): every point gets the key of its lowest corner,
a stable sort groups points by key in point order, each point's record is written once in
that order, and each voxel sums the (up to eight) buckets whose cells touch it, taps in
PyTorch's order, points ascending within a bucket; a bucket longer than the plan's chunk is
summed as partial sums of a chunk each, in chunk order. Tricubic
(:func:`gathered_bicubic_dx`): padding can send several taps of one point, and taps of
far-away points, to the same voxel, so every (point, tap) entry is keyed by its voxel and
sorted, a chunk of points at a time. Nothing depends on timing: the same bits on every run.
"""

from __future__ import annotations

import torch

from ..layout import memory_format_of
from ..modes import Interpolation
from ..rounding import round_once
from ..sampling import Field, Sampling
from .launch import (
    accumulator,
    field_operand,
    fusion,
    kernel_rule,
    kernels,
    launch_tuned,
    sizes_of,
    store_dtype,
    volume_operand,
)
from .planner import GpuPlan, Tile
from .records import SortedRecords, VolumeStrides

__all__ = ["gathered_bicubic_dx", "gathered_dx"]


def _index_dtype(count: int) -> torch.dtype:
    """int32 for indices below ``count`` where they fit: a sort of int32 keys takes half the radix passes."""
    return torch.int32 if count <= 2**31 else torch.int64


def _bucket_starts(keys: torch.Tensor, buckets: int, entries: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts, counts): starts[k] .. starts[k + 1] is where key k's run lies in the stably
    sorted keys (``buckets + 1`` values), counts[k] its length.

    Counted, not searched: a histogram of the keys (integer counts: the same on every run,
    and allowed under torch.use_deterministic_algorithms) and its running sum, instead of
    a binary search per bucket.
    """
    counts = torch.bincount(keys, minlength=buckets)
    starts = torch.zeros(buckets + 1, dtype=_index_dtype(entries + 1), device=keys.device)
    torch.cumsum(counts, dim=0, out=starts[1:])
    return starts, counts


def chunks(starts: torch.Tensor, counts: torch.Tensor, buckets: int, chunk: int):
    """Buckets longer than ``chunk`` entries cut into chunks of ``chunk``: (chunk_starts, first, count) or None.

    chunk_starts[k] .. chunk_starts[k + 1] are bucket k's chunks (none for a short bucket);
    first[j] and count[j] are where chunk j begins in the sorted order and how long it is.
    """
    per_bucket = torch.where(counts[:buckets] > chunk, (counts[:buckets] + chunk - 1) // chunk, 0)
    chunk_starts = torch.zeros(buckets + 1, dtype=starts.dtype, device=starts.device)
    torch.cumsum(per_bucket, dim=0, out=chunk_starts[1:])
    total = int(chunk_starts[-1])
    if total == 0:
        return None
    bucket = torch.repeat_interleave(torch.arange(buckets, device=starts.device), per_bucket)
    first = (
        starts[bucket].to(torch.int64)
        + (torch.arange(total, device=starts.device) - chunk_starts[bucket].to(torch.int64)) * chunk
    )
    count = torch.clamp(starts[bucket + 1].to(torch.int64) - first, max=chunk).to(torch.int32)
    return chunk_starts, first, count


def _exact_store_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a float64 sum meant for ``dtype`` is written in: the kernels' store dtype, but float64 where that
    would be float32 (rounding to it first would round twice)."""
    return torch.float64 if store_dtype(dtype) != dtype else dtype


def _sorted_records(plan: GpuPlan, grad, x, field: Field, sampling: Sampling, matrix):
    """(starts, counts, sorted points): points keyed by their lowest corner and stably sorted; each point's record
    (its source indices, trilinear) and where its grad lies, written once in sorted order
    (:class:`.records.SortedRecords`). ``matrix``: an affine field's (:func:`.launch.field_matrix`)."""
    _, backward, _ = kernels()
    batch, _, depth, height, width = x.shape
    points, rule, sizes = field.points, kernel_rule(sampling, field.kind), sizes_of(x, field)
    buckets = batch * (depth + 1) * (height + 1) * (width + 1)
    keys = torch.empty(points, dtype=_index_dtype(buckets + 1), device=x.device)
    tile = Tile(block_w=256)
    backward.bucket_keys_kernel[(-(-points // tile.block_w),)](
        field_operand(field, matrix), keys, points, sizes, RULE=rule, **tile.keywords()
    )
    order = torch.sort(keys, stable=True).indices
    starts, counts = _bucket_starts(keys, buckets + 1, points)
    trilinear = plan.interpolation != Interpolation.NEAREST
    sorted_points = SortedRecords(
        torch.empty(3 * points if trilinear else 1, dtype=torch.float64, device=x.device),
        torch.empty(points, dtype=torch.int64, device=x.device),
        points,
    )
    backward.sorted_records_kernel[(-(-points // tile.block_w),)](
        field_operand(field, matrix),
        order,
        sorted_points,
        sizes,
        VolumeStrides(*grad.stride()),
        RULE=rule,
        **tile.keywords(),
    )
    return starts, counts, sorted_points


def gathered_dx(plan: GpuPlan, grad, x, field: Field, sampling: Sampling, matrix=None) -> torch.Tensor:
    """The deterministic trilinear / nearest dx: bucket points by their lowest corner, then gather per voxel (half
    types: in float64, rounded once). ``matrix``: an affine field's (:func:`.launch.field_matrix`)."""
    _, backward, _ = kernels()
    batch, channels, depth, height, width = x.shape
    starts, counts, sorted_points = _sorted_records(plan, grad, x, field, sampling, matrix)
    buckets = batch * (depth + 1) * (height + 1) * (width + 1)
    acc, block_c = accumulator(plan.dx_sums), plan.gather_tile.block_c
    chunked = chunks(starts, counts, buckets, plan.chunk)
    if chunked is None:
        chunk_starts = partials = starts  # not read
    else:
        chunk_starts, first, count = chunked
        taps = 1 if plan.interpolation == Interpolation.NEAREST else 8
        # In the accumulation dtype: float32 for float32, float64 otherwise.
        partials = torch.empty(
            first.numel(),
            taps,
            channels,
            device=x.device,
            dtype=torch.float32 if x.dtype == torch.float32 else torch.float64,
        )
        partials_tile = Tile(block_w=64, block_c=block_c)  # block_w: chunks
        backward.bucket_partials_kernel[(-(-first.numel() // partials_tile.block_w), taps, -(-channels // block_c))](
            volume_operand(grad),
            sorted_points,
            partials,
            first,
            count,
            first.numel(),
            channels,
            INTERPOLATION=int(plan.interpolation),
            ACC=acc,
            CHUNK=plan.chunk,
            **partials_tile.keywords(),
            **fusion(x.dtype),
        )
    dx = torch.empty_like(x, dtype=_exact_store_dtype(x.dtype), memory_format=memory_format_of(x))
    voxels = batch * depth * height * width
    operands = (
        volume_operand(grad),
        sorted_points,
        volume_operand(dx),
        starts,
        chunk_starts,
        partials,
        voxels,
        sizes_of(x, field),
    )

    def launch(tile):
        backward.dx_gather_kernel[(-(-voxels // tile.block_w), -(-channels // tile.block_c))](
            *operands,
            INTERPOLATION=int(plan.interpolation),
            ACC=acc,
            SPLIT=chunked is not None,
            **tile.keywords(),
            **fusion(x.dtype),
        )

    launch_tuned("dx_gather", plan, x, launch, gather=True)
    return round_once(dx, x.dtype)


def gathered_bicubic_dx(plan: GpuPlan, grad, x, field: Field, sampling: Sampling, matrix=None) -> torch.Tensor:
    """The deterministic tricubic dx: per chunk of points, sort (point, tap) entries by voxel, then gather.

    Chunks add onto one buffer, so half types sum in a float64 buffer, rounded once at the end.
    ``matrix``: an affine field's (:func:`.launch.field_matrix`)."""
    _, _, bicubic = kernels()
    batch, channels, depth, height, width = x.shape
    points, rule, sizes = field.points, kernel_rule(sampling, field.kind), sizes_of(x, field)
    voxel_count = batch * depth * height * width
    dx = torch.empty_like(
        x, dtype=torch.float32 if x.dtype == torch.float32 else torch.float64, memory_format=memory_format_of(x)
    )
    keys_tile, tile = Tile(block_w=64), plan.gather_tile
    operands = (volume_operand(grad), field_operand(field, matrix), volume_operand(dx))
    for first_point in range(0, points, plan.chunk):
        count = min(plan.chunk, points - first_point)
        keys = torch.empty(count * 64, dtype=_index_dtype(voxel_count + 1), device=x.device)
        bicubic.bicubic_tap_keys_kernel[(-(-count // keys_tile.block_w),)](
            operands[1],
            keys,
            first_point,
            first_point + count,
            voxel_count,
            sizes,
            RULE=rule,
            **keys_tile.keywords(),
        )
        order = torch.sort(keys, stable=True).indices
        starts, _ = _bucket_starts(keys, voxel_count + 1, count * 64)
        bicubic.bicubic_dx_gather_kernel[(-(-voxel_count // tile.block_w), -(-channels // tile.block_c))](
            *operands,
            order,
            starts,
            first_point,
            voxel_count,
            sizes,
            RULE=rule,
            ACC=accumulator(plan.dx_sums),
            FIRST_CHUNK=first_point == 0,
            **tile.keywords(),
            **fusion(x.dtype),
        )
    return round_once(dx, x.dtype)
