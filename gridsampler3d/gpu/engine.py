"""The Triton backend: launches the GPU kernels on torch tensors, read in place through their strides.

Runs on CUDA tensors, and on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``
set before Triton is imported), which is how the kernels are tested without a GPU.
float16 and bfloat16 accumulate in float32 in the forward and in the fast (atomic) dx, and
in float64, rounded once, in the deterministic dx (docs/semantics.md, "Dtypes"); float32 in float32;
float64 in float64. Indices and weights are computed in float64 throughout.

The fused warp runs the same kernels with ``VOXELS``: they read the displacement in place
of a grid (strides handed over in grid order, :func:`_field`) and write d(displacement)
through its own strides, laid out like the displacement.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os

import torch

from ..layout import memory_format_of
from ..rounding import HALF_DTYPES, round_once
from ..modes import Interpolation, Padding
from . import tuning

__all__ = ["TritonBackend", "interpreter_enabled"]


def interpreter_enabled() -> bool:
    """Whether Triton runs kernels through its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _kernels():
    # Imported on first use: Triton takes a while to import and is optional.
    from . import backward, bicubic, forward

    return forward, backward, bicubic


# Points per partial sum of a long bucket in the deterministic trilinear dx (a bucket longer
# than this is summed in chunks of it, one lane each, then chunk by chunk).
_BUCKET_CHUNK = 256
# Entries (point, tap) per chunk of the deterministic bicubic dx: bounds its sort's memory.
_BICUBIC_CHUNK_ENTRIES = 1 << 26


def _accumulator(dtype: torch.dtype, exact_half: bool = False):
    """Triton dtype of sums for data of ``dtype``: float64 for float64, and for half types
    where ``exact_half`` (a sum rounded to half precision once: docs/semantics.md, "Dtypes"); else float32."""
    import triton.language as tl

    return tl.float64 if dtype == torch.float64 or (exact_half and dtype in HALF_DTYPES) else tl.float32


def _store_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype kernels write an output of ``dtype`` in.

    The dtype itself, except bfloat16 under the interpreter, whose float32 -> bfloat16
    conversion truncates (a GPU rounds to nearest even): there the kernels write float32
    and torch rounds.
    """
    return torch.float32 if dtype == torch.bfloat16 and interpreter_enabled() else dtype


def _exact_store_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a float64 sum meant for ``dtype`` is written in: :func:`_store_dtype`, but
    float64 where that would be float32 (rounding to it first would round twice)."""
    return torch.float64 if _store_dtype(dtype) != dtype else dtype


def _fusion(dtype: torch.dtype) -> dict:
    """Launch option: float64 keeps multiplies and adds unfused, so that its sums follow the
    reference's (and PyTorch's) rounding; other dtypes let the compiler fuse them."""
    return {"enable_fp_fusion": dtype != torch.float64}


def _channel_block(x: torch.Tensor, widest: int = 16) -> int:
    """Channels per program step: 1 unless x's channels are adjacent in memory (channels-last),
    where one load reads a tap's channel vector (up to ``widest``)."""
    import triton

    return min(triton.next_power_of_2(x.shape[1]), widest) if x.shape[1] > 1 and x.stride(1) == 1 else 1


def _field(field: torch.Tensor, voxels: bool) -> tuple[tuple[int, int, int], tuple[int, ...]]:
    """(output sizes (Do, Ho, Wo), strides in grid order (n, d, h, w, component)) of a grid
    (N, Do, Ho, Wo, 3) or, with ``voxels``, of a displacement (N, 3, Do, Ho, Wo)."""
    if voxels:
        stride_n, stride_component, stride_d, stride_h, stride_w = field.stride()
        return tuple(field.shape[2:]), (stride_n, stride_d, stride_h, stride_w, stride_component)
    return tuple(field.shape[1:4]), tuple(field.stride())


def _patch_tile(x: torch.Tensor, out_sizes, elements: int, num_warps: int | None = None) -> dict:
    """Launch shape of the trilinear / nearest kernels: BLOCK_D x BLOCK_H x BLOCK_W output points per program.

    NCDHW: one channel per step, lanes along points, ``elements`` points per program.
    Channels-last: a channel vector per step, about ``elements`` elements per program.
    Either way few enough that no thread spills (docs/gpu.md, registers). BLOCK_W follows
    the output's width (idle lanes cost as much as busy ones); BLOCK_H, then BLOCK_D, fill
    the rest of the patch. Under the interpreter, whose cost is per program and per
    operation rather than per lane, patches are 8x larger. ``num_warps`` overrides the
    warps that follow from the patch's size.
    """
    import triton

    block_c = _channel_block(x)
    points = max(16, elements // block_c) * (8 if interpreter_enabled() else 1)
    out_depth, out_height, out_width = out_sizes
    block_w = min(triton.next_power_of_2(out_width), points)
    block_h = min(triton.next_power_of_2(out_height), points // block_w)
    block_d = min(triton.next_power_of_2(out_depth), points // (block_w * block_h))
    warps = num_warps or max(1, min(4, block_d * block_h * block_w * block_c // 32))
    return {"BLOCK_D": block_d, "BLOCK_H": block_h, "BLOCK_W": block_w, "BLOCK_C": block_c, "num_warps": warps}


def _tile_candidates(x: torch.Tensor, out_sizes, elements: int) -> list[dict]:
    """The default patch (first) and those the tuner may try: half and twice the points, twice the warps."""
    default = _patch_tile(x, out_sizes, elements)
    return [default, _patch_tile(x, out_sizes, elements // 2), _patch_tile(x, out_sizes, elements * 2),
            _patch_tile(x, out_sizes, elements, num_warps=min(8, 2 * default["num_warps"]))]


def _launch_tuned(kernel: str, interpolation, x: torch.Tensor, candidates: list, launch, tune: bool = True) -> None:
    """Launch with the candidate shape :mod:`.tuning` chose for (kernel, interpolation, dtype, layout,
    channels, device); ``candidates[0]`` is the default, repeats are timed once.

    ``tune`` False (a launch whose results would depend on the shape) launches the default.
    """
    import triton

    candidates = [shape for index, shape in enumerate(candidates) if shape not in candidates[:index]]
    layout = "NDHWC" if memory_format_of(x) == torch.channels_last_3d else "NCDHW"
    # The device too: a process may drive GPUs of different kinds.
    key = (f"{kernel} {Interpolation(interpolation).name.lower()}", str(x.dtype).removeprefix("torch."), layout,
           triton.next_power_of_2(x.shape[1]), str(x.device))
    launch(tuning.TUNER.choose(key, candidates, launch, tune and tuning.enabled(x.device)))


def _patch_grid(batch: int, out_sizes, tile: dict) -> tuple[int, int]:
    """The launch grid of :func:`_patch_tile`'s patches (``coords.tile_points``)."""
    import triton

    out_depth, out_height, out_width = out_sizes
    return (batch * triton.cdiv(out_depth, tile["BLOCK_D"]) * triton.cdiv(out_height, tile["BLOCK_H"]),
            triton.cdiv(out_width, tile["BLOCK_W"]))


def _blocks(x: torch.Tensor, tile: int = 1024) -> tuple[int, int]:
    """(voxels or points, channels) per program of the flat kernels: about ``tile`` elements
    (8x more under the interpreter, as :func:`_patch_tile`)."""
    block_c = _channel_block(x)
    scale = 8 if interpreter_enabled() else 1
    return max(16, min(256 * scale, tile * scale // block_c)), block_c


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


def _chunks(starts: torch.Tensor, counts: torch.Tensor, buckets: int, chunk: int):
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
    first = starts[bucket].to(torch.int64) + (torch.arange(total, device=starts.device)
                                              - chunk_starts[bucket].to(torch.int64)) * chunk
    count = torch.clamp(starts[bucket + 1].to(torch.int64) - first, max=chunk).to(torch.int32)
    return chunk_starts, first, count


def _on_device(device: torch.device):
    """Launch on ``device``'s GPU (Triton launches on the current one)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class TritonBackend:
    """Triton kernels for CUDA tensors (see ``gridsampler3d.gpu``); fast (atomic) or deterministic backward."""

    name = "triton"

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "Triton is not installed (pip install triton)"
        if not torch.cuda.is_available() and not interpreter_enabled():
            return "no CUDA device (TRITON_INTERPRET=1 runs the kernels on the CPU through Triton's interpreter)"
        return None

    def supports(self, device: torch.device) -> bool:
        return device.type == "cuda" or (device.type == "cpu" and interpreter_enabled())

    def forward(self, x, grid, interpolation: Interpolation, padding: Padding, align_corners: bool):
        return self._forward(x, grid, interpolation, padding, align_corners, voxels=False)

    def warp(self, x, displacement, interpolation: Interpolation, padding: Padding, align_corners: bool):
        return self._forward(x, displacement, interpolation, padding, align_corners, voxels=True)

    def backward(self, grad, x, grid, interpolation: Interpolation, padding: Padding, align_corners: bool,
                 output_mask, deterministic: bool):
        return self._backward(grad, x, grid, interpolation, padding, align_corners, output_mask, deterministic,
                              voxels=False)

    def warp_backward(self, grad, x, displacement, interpolation: Interpolation, padding: Padding,
                      align_corners: bool, output_mask, deterministic: bool):
        return self._backward(grad, x, displacement, interpolation, padding, align_corners, output_mask,
                              deterministic, voxels=True)

    @staticmethod
    def _forward(x, field, interpolation, padding, align_corners, voxels):
        """y sampled at ``field``: a grid, or with ``voxels`` a displacement (N, 3, Do, Ho, Wo)."""
        import triton

        forward, _, bicubic = _kernels()
        batch, channels = x.shape[:2]
        out_sizes, field_strides = _field(field, voxels)
        y = torch.empty((batch, channels) + out_sizes, dtype=_store_dtype(x.dtype), device=x.device,
                        memory_format=memory_format_of(x))
        modes = dict(PADDING=int(padding), ALIGN_CORNERS=align_corners, VOXELS=voxels, ACC=_accumulator(x.dtype),
                     **_fusion(x.dtype))
        sizes = (*x.shape[2:], *out_sizes)
        strides = (*x.stride(), *field_strides, *y.stride())
        with _on_device(x.device):
            if interpolation == Interpolation.BICUBIC:
                points = batch * out_sizes[0] * out_sizes[1] * out_sizes[2]
                block_p, block_c = _blocks(x, tile=128)  # 128 points or 16 x 16 (point, channel): no spills
                bicubic.bicubic_fwd_kernel[(triton.cdiv(points, block_p), triton.cdiv(channels, block_c))](
                    x, field, y, points, channels, *sizes, *strides, **modes, BLOCK_P=block_p, BLOCK_C=block_c)
            else:
                def launch(tile):
                    forward.grid_sampler3d_fwd_kernel[_patch_grid(batch, out_sizes, tile)](
                        x, field, y, channels, *sizes, *strides, **modes, INTERPOLATION=int(interpolation), **tile)

                # Each output element is one lane's sum over its taps: no shape changes a result.
                elements = 128 if _channel_block(x) == 1 else 512
                _launch_tuned("forward", interpolation, x, _tile_candidates(x, out_sizes, elements), launch)
        return y.to(x.dtype)

    def _backward(self, grad, x, field, interpolation, padding, align_corners, output_mask, deterministic, voxels):
        """(dx, dfield) of sampling at ``field`` (see :meth:`_forward`); dfield is laid out like a grid's
        gradient (contiguous) or, with ``voxels``, like the displacement."""
        import triton

        _, backward, bicubic = _kernels()
        want_dx, want_dfield = output_mask
        batch, channels = x.shape[:2]
        out_sizes, field_strides = _field(field, voxels)
        points = batch * out_sizes[0] * out_sizes[1] * out_sizes[2]
        layout = memory_format_of(x)
        is_bicubic = interpolation == Interpolation.BICUBIC
        modes = dict(PADDING=int(padding), ALIGN_CORNERS=align_corners, VOXELS=voxels)
        if not is_bicubic:
            modes["INTERPOLATION"] = int(interpolation)
        acc = _accumulator(x.dtype)
        dfield = None
        if want_dfield:
            dfield = torch.empty_like(field, dtype=_store_dtype(field.dtype),
                                      memory_format=memory_format_of(field) if voxels else torch.contiguous_format)
        kernel_dfield = want_dfield
        if want_dfield and interpolation == Interpolation.NEAREST:
            dfield.zero_()  # nearest has a zero grid gradient everywhere: no pass needed
            kernel_dfield = False
        atomic_dx = want_dx and not deterministic
        dx = None
        if atomic_dx:
            # Atomics add into a zeroed buffer of the accumulation dtype (float32 for half types).
            acc_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
            dx = torch.zeros_like(x, dtype=acc_dtype, memory_format=layout)
        with _on_device(x.device):
            if atomic_dx or kernel_dfield:
                target = dx if atomic_dx else x
                dfield_target = dfield if kernel_dfield else field
                operands = (grad, x, field, target, dfield_target)
                sizes_and_strides = (*x.shape[2:], *out_sizes, *grad.stride(), *x.stride(), *field_strides,
                                     *target.stride(), *_field(dfield_target, voxels)[1])
                flags = dict(modes, ACC=acc, WANT_DX=atomic_dx, WANT_DGRID=kernel_dfield, **_fusion(x.dtype))
                if is_bicubic:
                    block_p, block_c = _blocks(x, tile=128)
                    if x.dtype == torch.float64:
                        block_c = 1  # the grid gradient summed channel by channel: the reference's order, bit for bit
                    bicubic.bicubic_bwd_kernel[(triton.cdiv(points, block_p),)](
                        *operands, points, channels, *sizes_and_strides, **flags, BLOCK_P=block_p, BLOCK_C=block_c)
                else:
                    candidates = _tile_candidates(x, out_sizes, 128 if _channel_block(x) == 1 else 256)
                    if x.dtype == torch.float64:
                        for tile in candidates:
                            tile["BLOCK_C"] = 1  # the grid gradient summed channel by channel: PyTorch's order

                    def launch(tile):
                        if atomic_dx:
                            dx.zero_()  # a timed launch has added into it
                        backward.grid_sampler3d_bwd_kernel[_patch_grid(batch, out_sizes, tile)](
                            *operands, channels, *sizes_and_strides, **flags, **tile)

                    # Tuned in the fast mode only, and there only where no reduction runs across
                    # the lanes of a channel vector (whose order a shape could change): the grid
                    # gradient stays the same in both modes and from run to run.
                    tune = atomic_dx and (not kernel_dfield or candidates[0]["BLOCK_C"] == 1)
                    _launch_tuned("backward", interpolation, x, candidates, launch, tune)
            if atomic_dx:
                dx = dx.to(x.dtype)
            elif want_dx and is_bicubic:
                dx = self._gathered_bicubic_dx(bicubic, grad, x, field, points, modes)
            elif want_dx:
                dx = self._gathered_dx(backward, grad, x, field, points, modes)
        return dx, (dfield.to(field.dtype) if want_dfield else None)

    @staticmethod
    def _gathered_dx(backward, grad, x, field, points, modes):
        """The deterministic dx: bucket points by their lowest corner, then gather per voxel (half types: in float64)."""
        import triton

        batch, channels, depth, height, width = x.shape
        out_sizes, field_strides = _field(field, modes["VOXELS"])
        buckets = batch * (depth + 1) * (height + 1) * (width + 1)
        keys = torch.empty(points, dtype=_index_dtype(buckets + 1), device=x.device)
        block_p = 256
        backward.bucket_keys_kernel[(triton.cdiv(points, block_p),)](
            field, keys, points, depth, height, width, *out_sizes, *field_strides, **modes, BLOCK_P=block_p)
        order = torch.sort(keys, stable=True).indices
        starts, counts = _bucket_starts(keys, buckets + 1, points)
        trilinear = modes["INTERPOLATION"] != int(Interpolation.NEAREST)
        # Each point's record, once, in sorted order: where its grad lies and (trilinear) its indices.
        grad_offsets = torch.empty(points, dtype=torch.int64, device=x.device)
        records = torch.empty(3 * points if trilinear else 1, dtype=torch.float64, device=x.device)
        backward.sorted_records_kernel[(triton.cdiv(points, block_p),)](
            field, order, records, grad_offsets, points, depth, height, width, *out_sizes, grad.stride(0),
            *grad.stride()[2:], *field_strides, **modes, BLOCK_P=block_p)
        del order
        acc = _accumulator(x.dtype, exact_half=True)
        chunked = _chunks(starts, counts, buckets, _BUCKET_CHUNK)
        block_v, block_c = _blocks(x, tile=128 if _channel_block(x) == 1 else 1024)  # 128 voxels NCDHW: no spills
        if chunked is None:
            chunk_starts = partials = starts  # not read
        else:
            chunk_starts, first, count = chunked
            taps = 8 if trilinear else 1
            # In the accumulation dtype: float32 for float32, float64 otherwise.
            partials = torch.empty(first.numel(), taps, channels, device=x.device,
                                   dtype=torch.float32 if x.dtype == torch.float32 else torch.float64)
            block_k = 64
            backward.bucket_partials_kernel[(triton.cdiv(first.numel(), block_k), taps, triton.cdiv(channels, block_c))](
                grad, records, grad_offsets, partials, first, count, points, first.numel(), channels, grad.stride(1),
                INTERPOLATION=modes["INTERPOLATION"], ACC=acc, CHUNK=_BUCKET_CHUNK, BLOCK_K=block_k, BLOCK_C=block_c,
                **_fusion(x.dtype))
        dx = torch.empty_like(x, dtype=_exact_store_dtype(x.dtype), memory_format=memory_format_of(x))
        voxels = batch * depth * height * width

        def launch(shape):
            block_v, num_warps = shape
            backward.dx_gather_kernel[(triton.cdiv(voxels, block_v), triton.cdiv(channels, block_c))](
                grad, records, grad_offsets, dx, starts, chunk_starts, partials, points, voxels, channels, depth,
                height, width, grad.stride(1), *dx.stride(), INTERPOLATION=modes["INTERPOLATION"], ACC=acc,
                SPLIT=chunked is not None, BLOCK_V=block_v, BLOCK_C=block_c, num_warps=num_warps,
                **_fusion(x.dtype))

        # Each (voxel, channel) lane sums its own bucket in order: no shape changes a result.
        warps = 4
        candidates = [(block_v, warps), (max(16, block_v // 2), warps), (2 * block_v, warps), (block_v, 2 * warps)]
        _launch_tuned("dx_gather", modes["INTERPOLATION"], x, candidates, launch)
        return round_once(dx, x.dtype)

    @staticmethod
    def _gathered_bicubic_dx(bicubic, grad, x, field, points, modes):
        """The deterministic bicubic dx: per chunk of points, sort (point, tap) entries by voxel, then gather.

        Chunks add onto one buffer, so half types sum in a float64 buffer, rounded once at the end."""
        import triton

        batch, channels, depth, height, width = x.shape
        out_sizes, field_strides = _field(field, modes["VOXELS"])
        voxels = batch * depth * height * width
        acc = _accumulator(x.dtype, exact_half=True)
        dx = torch.empty_like(x, dtype=torch.float32 if x.dtype == torch.float32 else torch.float64,
                              memory_format=memory_format_of(x))
        chunk = max(1, _BICUBIC_CHUNK_ENTRIES // 64)
        block_p = 64
        block_v, block_c = _blocks(x)
        for first_point in range(0, points, chunk):
            count = min(chunk, points - first_point)
            keys = torch.empty(count * 64, dtype=_index_dtype(voxels + 1), device=x.device)
            bicubic.bicubic_tap_keys_kernel[(triton.cdiv(count, block_p),)](
                field, keys, first_point, first_point + count, voxels, depth, height, width, *out_sizes,
                *field_strides, **modes, BLOCK_P=block_p)
            order = torch.sort(keys, stable=True).indices
            starts, _ = _bucket_starts(keys, voxels + 1, count * 64)
            bicubic.bicubic_dx_gather_kernel[(triton.cdiv(voxels, block_v), triton.cdiv(channels, block_c))](
                grad, field, dx, order, starts, first_point, voxels, channels, depth, height, width, *out_sizes,
                *grad.stride(), *field_strides, *dx.stride(), ALIGN_CORNERS=modes["ALIGN_CORNERS"],
                VOXELS=modes["VOXELS"], ACC=acc, FIRST_CHUNK=first_point == 0, BLOCK_V=block_v, BLOCK_C=block_c,
                **_fusion(x.dtype))
        return round_once(dx, x.dtype)
