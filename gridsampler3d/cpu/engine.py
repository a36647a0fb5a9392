"""The Numba CPU backend: hands torch tensors to the kernels as flat arrays with strides.

NCDHW, channels-last and sliced tensors are read in place, with one exception: the
backward of many-channel NCDHW data on a smooth grid runs on channels-last copies
(:func:`_copies_pay`, :mod:`.transpose`): the channels-last kernels and the copies
together take less time than the NCDHW kernels, for the same bits. float16 and bfloat16
operands are widened to float64 once (NumPy has no bfloat16), so that every sum that
ends in half precision runs in float64 and is rounded once; float32 computes in float64
and stores in float32; float64 is exact throughout.
Outputs and widened copies come from :func:`.buffers.empty` (blocks of earlier calls,
already mapped).
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ..layout import memory_format_of
from ..modes import Interpolation, Padding
from .backward import backward_kernel
from .forward import forward_kernel
from . import bicubic, buffers, pool, transpose, tuning
from .plan import depth_ranges, looks_coherent, plan_slabs, row_parts
from .rounding import round_once

__all__ = ["NumbaBackend"]

_KERNEL_DTYPES = (torch.float32, torch.float64)
# With one thread, whether a grid is smooth is judged from about this many of its rows.
_SAMPLED_ROWS = 256


def _channel_group(volume: torch.Tensor) -> int:
    """How many channel planes of ``volume`` (N, C, D, H, W) a random grid's pass takes at a time (at least one)."""
    return max(1, tuning.SCATTER_CACHE_BYTES // max(1, math.prod(volume.shape[2:]) * volume.element_size()))


def _groups(channels: int, group: int):
    """(low, high) of each run of ``group`` channels (the last may be shorter)."""
    return [(low, min(low + group, channels)) for low in range(0, channels, group)]


def _flat(tensor: torch.Tensor):
    """(flat 1-D NumPy view from the tensor's first element, element strides) — no copy."""
    array = tensor.detach().numpy()
    span = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    flat = np.lib.stride_tricks.as_strided(array, shape=(span,), strides=(array.itemsize,))
    return flat, tuple(int(stride) for stride in tensor.stride())


def _from_channel(flat, strides, channel: int):
    """(flat, strides) of an operand from :func:`_flat` seen from channel ``channel`` on (strides unchanged)."""
    return flat[channel * strides[1]:], strides


def _kernel_dtype_of(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels compute data of ``dtype`` in: itself for float32 and float64, else float64."""
    return dtype if dtype in _KERNEL_DTYPES else torch.float64


def _kernel_dtype(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself in float32 and float64; float16 and bfloat16 widened to float64 (:func:`.buffers.empty`)."""
    if tensor.dtype in _KERNEL_DTYPES:
        return tensor
    return buffers.empty(tensor.shape, _kernel_dtype_of(tensor.dtype), memory_format_of(tensor)).copy_(tensor)


def _long_rows(out_sizes, threads: int, grid_like, out_like, voxels: bool, random: bool):
    """(out_sizes, grid_like, out_like) with each run of k output rows as one row, where that is safe and pays.

    The kernels walk each output row in blocks of ``tuning.BLOCK`` points: rows shorter
    than that leave blocks part-empty (a 64-wide row fills half of one), and every row
    runs its channel loop again. Where every output-shaped operand steps h by exactly a
    row of w, rows h .. h + k - 1 of an (n, d) plane are one row of k * Wo points, the
    same points in the same order, so results do not change (dx still sums every voxel in
    point order). k divides Ho; it is the one that fills the blocks best (the smallest
    of equals), with rows of at most ``tuning.LONG_ROW_POINTS`` points and at least
    four rows per thread. ``grid_like`` holds the strides of the grid-shaped operands in
    grid order (n, d, h, w, component), ``out_like`` those of the others in NCDHW order
    (n, c, d, h, w); each comes back joined the same way.

    Rows stay as they are for the fused warp (``voxels``: its kernels place each point by
    its row and column), and for a grid judged ``random`` at several threads: a full
    block's scratch with its random gathers' lines outgrew the L1 cache that the core's
    two threads share (rand64 forward at two threads, rows joined: 1.2 times the time).
    """
    depth, height, width = out_sizes
    if voxels or (random and threads > 1) or height == 1 \
            or any(s[2] != width * s[3] for s in grid_like) or any(s[3] != width * s[4] for s in out_like):
        return out_sizes, grid_like, out_like
    k = _rows_per_long_row(depth, height, width, threads)
    return ((depth, height // k, k * width), tuple(s[:2] + (k * s[2],) + s[3:] for s in grid_like),
            tuple(s[:3] + (k * s[3],) + s[4:] for s in out_like))


def _row_step(rows: int) -> int:
    """Every how many rows of ``rows`` a sampled judgement reads one (about ``_SAMPLED_ROWS`` rows)."""
    return max(1, rows // _SAMPLED_ROWS)


def _smooth(field, voxels: bool, depth: int, nearest: bool, align_corners: bool) -> bool:
    """:func:`.plan.looks_coherent` of a grid, or a displacement (``voxels``), from about ``_SAMPLED_ROWS`` of its
    output rows; ``depth`` is the input's."""
    batch, out_depth, out_height = (field.shape[0], *field.shape[2:4]) if voxels else field.shape[:3]
    return looks_coherent(field, voxels, depth, nearest, align_corners, _row_step(batch * out_depth * out_height))


@functools.lru_cache(maxsize=256)
def _rows_per_long_row(depth: int, height: int, width: int, threads: int) -> int:
    """k of :func:`_long_rows`: the divisor of ``height`` whose rows of k * ``width`` points fill blocks best."""
    def filled(k):  # share of the row's blocks that holds points
        return k * width / (-(-k * width // tuning.BLOCK) * tuning.BLOCK)

    rows_per_plane = -(-4 * threads // depth)  # rows of each (n, d) plane to leave, at least
    longest = min(height // max(1, rows_per_plane), tuning.LONG_ROW_POINTS // width)
    return max((k for k in range(1, max(1, longest) + 1) if height % k == 0), key=lambda k: (filled(k), -k))


def _threads(values: int) -> int:
    """Follow torch's thread setting, within what Numba was started with; one thread for a small call.

    ``values`` is the number of output points times channels. The kernels' results do
    not depend on how many parts run them.
    """
    threads = pool.threads()
    return threads if values >= tuning.PARALLEL_VALUES else 1


def _runs(threads: int, rows: int) -> int:
    """How many parts a pass by rows is cut into, for the threads to take in turn (:func:`_launch`'s ``shared``).

    ``tuning.SHARED_RUNS`` per thread, so that a thread that runs slower (or rows that
    cost more) leave the others no more than a short run's wait; one part on one thread.
    """
    return 1 if threads == 1 else max(1, min(rows, tuning.SHARED_RUNS * threads))


def _launch(build, launches, together: bool = False, shared=()) -> None:
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
            prepared = [kernel.launch(*arguments, unresolved)
                        for arguments, unresolved in zip((*launches, *shared), flags)]
            pool.run_together(prepared[:len(launches)], prepared[len(launches):])
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


def _copies_pay(grad, x, field, interpolation, align_corners: bool, voxels: bool, want_dgrid: bool) -> bool:
    """Whether a backward runs faster on channels-last copies of its NCDHW operands (:mod:`.transpose`).

    Bilinear float32 data with at least ``tuning.COPIED_CHANNELS`` channels (half data:
    ``tuning.COPIED_HALF_CHANNELS``), dense NCDHW, on a smooth grid: a random grid's taps
    land all over every channel's plane, which the NCDHW passes take a group of channels
    at a time (and channels-last cannot). float64's grid gradient (PyTorch's exact terms)
    gains nothing channels-last, and half data's dx alone gained nothing either (bf16,
    0.98 to 1.08 of the time).
    """
    half = x.dtype in (torch.float16, torch.bfloat16)
    if (interpolation != Interpolation.BILINEAR or x.dtype == torch.float64 or (half and not want_dgrid)
            or x.shape[1] < (tuning.COPIED_HALF_CHANNELS if half else tuning.COPIED_CHANNELS)
            or not (x.is_contiguous() and grad.is_contiguous()) or x.numel() == 0 or grad.numel() == 0):
        return False
    return _smooth(field, voxels, x.shape[2], False, align_corners)


class NumbaBackend:
    """Parallel Numba kernels for CPU tensors (see ``gridsampler3d.cpu``)."""

    name = "numba"

    def unavailable_reason(self) -> str | None:
        return None

    def supports(self, device: torch.device) -> bool:
        return device.type == "cpu"

    @pool.exclusive
    def forward(self, x, grid, interpolation: Interpolation, padding: Padding, align_corners: bool):
        return self._forward(x, grid, interpolation, padding, align_corners, False)

    @pool.exclusive
    def warp(self, x, displacement, interpolation: Interpolation, padding: Padding, align_corners: bool):
        return self._forward(x, displacement, interpolation, padding, align_corners, True)

    @pool.exclusive
    def backward(self, grad, x, grid, interpolation: Interpolation, padding: Padding, align_corners: bool,
                 output_mask, deterministic: bool):
        # Always deterministic (sums in a fixed order), so ``deterministic`` changes nothing here.
        return self._backward(grad, x, grid, interpolation, padding, align_corners, output_mask, False)

    @pool.exclusive
    def warp_backward(self, grad, x, displacement, interpolation: Interpolation, padding: Padding,
                      align_corners: bool, output_mask, deterministic: bool):
        return self._backward(grad, x, displacement, interpolation, padding, align_corners, output_mask, True)

    @staticmethod
    def _field(field: torch.Tensor, voxels: bool):
        """(flat array, strides in grid order (n, d, h, w, component), output sizes) of a grid or displacement.

        A displacement (N, 3, Do, Ho, Wo) as (dz, dy, dx) is read as a grid whose x is its
        last component: component stride negated, the kernels starting 2 components up.
        """
        flat, strides = _flat(field)
        if voxels:
            return flat, (strides[0], strides[2], strides[3], strides[4], -strides[1]), tuple(field.shape[2:])
        return flat, strides, tuple(field.shape[1:4])

    def _forward(self, x, field, interpolation, padding, align_corners, voxels):
        dtype, layout = x.dtype, memory_format_of(x)
        x, field = _kernel_dtype(x), _kernel_dtype(field)
        batch, channels = x.shape[:2]
        grid_flat, grid_strides, out_sizes = self._field(field, voxels)
        y = buffers.empty((batch, channels) + out_sizes, x.dtype, layout)
        threads = _threads(y.numel())
        x_flat, x_strides = _flat(x)
        y_flat, y_strides = _flat(y)
        shapes = (batch, channels, tuple(x.shape[2:]), out_sizes)
        if interpolation == Interpolation.BICUBIC:
            runs = _runs(threads, batch * out_sizes[0] * out_sizes[1])
            pool.run_together([], [bicubic.forward.launch((x_flat, x_strides), (grid_flat, grid_strides),
                                                          (y_flat, y_strides), shapes,
                                                          (int(padding), bool(align_corners), voxels), runs)])
        else:
            kernel = functools.partial(forward_kernel, int(interpolation), int(padding), bool(align_corners), voxels,
                                       channels_last=layout == torch.channels_last_3d)
            group = _channel_group(x)
            random = layout != torch.channels_last_3d and channels > group and not _smooth(
                field, voxels, x.shape[2], interpolation == Interpolation.NEAREST, align_corners)
            out_sizes, (grid_strides,), (y_strides,) = _long_rows(out_sizes, threads, (grid_strides,), (y_strides,),
                                                                  voxels, random)
            shapes = shapes[:3] + (out_sizes,)
            # Runs of rows that the threads take in turn.
            runs = _runs(threads, batch * out_sizes[0] * out_sizes[1])
            if random:
                # A random grid gathers from all over every channel's plane: a group of
                # channels at a time, as dx (see _backward), the threads taking the first
                # group's runs, then the next group's.
                _launch(kernel, [], shared=[(*_from_channel(x_flat, x_strides, low), grid_flat, grid_strides,
                                             *_from_channel(y_flat, y_strides, low), batch, high - low, *shapes[2:],
                                             runs)
                                            for low, high in _groups(channels, group)])
            else:
                _launch(kernel, [], shared=[(x_flat, x_strides, grid_flat, grid_strides, y_flat, y_strides, *shapes,
                                             runs)])
        return round_once(y, dtype).contiguous(memory_format=layout)

    def _backward(self, grad, x, field, interpolation, padding, align_corners, output_mask, voxels):
        want_dx, want_dgrid = output_mask
        if _copies_pay(grad, x, field, interpolation, align_corners, voxels, want_dgrid):
            # The channels-last kernels on channels-last copies of grad (and x, which only
            # the grid gradient reads), dx copied back: the same bits as the NCDHW kernels.
            grad = transpose.to_channels_last(grad)
            # For dx alone, an unwritten channels-last stand-in in the kernels' dtype.
            x = (transpose.to_channels_last(x) if want_dgrid else
                 buffers.empty(x.shape, _kernel_dtype_of(x.dtype), torch.channels_last_3d))
            dx, dgrid = self._backward(grad, x, field, interpolation, padding, align_corners, output_mask, voxels)
            del grad, x  # before dx's copy: the copies' peak is then three operands' worth, not four
            return (transpose.to_contiguous(dx) if want_dx else None), dgrid
        dtype, layout = grad.dtype, memory_format_of(x)  # grad has x's dtype (validate.check_backward)
        grad, x, field = _kernel_dtype(grad), _kernel_dtype(x), _kernel_dtype(field)
        batch, channels = x.shape[:2]
        grid_flat, grid_strides, out_sizes = self._field(field, voxels)
        sizes = tuple(x.shape[2:])
        threads = _threads(grad.numel())
        grad_flat, grad_strides = _flat(grad)
        x_flat, x_strides = _flat(x)
        # The grid gradient comes out laid out like its grid: contiguous, or like the displacement.
        if not want_dgrid:
            dgrid = torch.empty(0, dtype=field.dtype)
            dgrid_flat, dgrid_strides = dgrid.numpy(), (0, 0, 0, 0, 0)
        else:
            dgrid = buffers.empty(field.shape, field.dtype,
                                  memory_format_of(field) if voxels else torch.contiguous_format)
            dgrid_flat, dgrid_strides, _ = self._field(dgrid, voxels)
        dx = buffers.empty(x.shape, x.dtype, layout) if want_dx else torch.empty(0, dtype=x.dtype)
        dx_flat, dx_strides = _flat(dx) if want_dx else (dx.numpy(), (0, 0, 0, 0, 0))
        if interpolation == Interpolation.BICUBIC:
            geometry, rule = (batch, channels, sizes, out_sizes), (int(padding), bool(align_corners), voxels)
            if want_dx:
                # Equal runs of planes: every slab walks every point, so the work splits evenly.
                bounds = np.linspace(0, batch * sizes[0], threads + 1).round().astype(np.int64)
                bicubic.dx((grad_flat, grad_strides), (grid_flat, grid_strides), (dx_flat, dx_strides), geometry,
                           rule, np.stack([bounds[:-1], bounds[1:]], axis=1))
            if want_dgrid:
                runs = _runs(threads, batch * out_sizes[0] * out_sizes[1])
                pool.run_together([], [bicubic.dgrid.launch((grad_flat, grad_strides), (x_flat, x_strides),
                                                            (grid_flat, grid_strides), (dgrid_flat, dgrid_strides),
                                                            geometry, rule, runs)])
            return self._finish(dx, dgrid, dtype, layout, output_mask)
        if interpolation == Interpolation.NEAREST and want_dgrid:
            dgrid.zero_()  # nearest has a zero grid gradient everywhere: no pass needed
            want_dgrid = False
        # The separable grid gradient (float32 and half) places NaN and infinity as PyTorch
        # does only for a finite grad (0 * inf where no tap is inside, inf - inf where terms
        # of both signs meet); PyTorch's own terms serve float64 and any non-finite grad.
        # A non-finite element makes the sum non-finite; a sum that overflows from finite
        # elements only picks PyTorch's terms needlessly (still exact), and costs no mask.
        exact = dtype == torch.float64 or (want_dgrid and not bool(torch.isfinite(grad.sum())))
        nearest = interpolation == Interpolation.NEAREST
        # A pass a few channels at a time is a candidate where one batch's planes outgrow a
        # core's cache (dx's planes for dx, x's for the grid gradient).
        group = _channel_group(dx) if want_dx else channels
        dgrid_group = _channel_group(x) if want_dgrid else channels
        by_channels = want_dx and layout != torch.channels_last_3d and channels > group
        dgrid_by_channels = want_dgrid and layout != torch.channels_last_3d and channels > dgrid_group
        # Sampled rows judge whether the grid is smooth (its points' taps stay near each
        # other along a row), in torch, with no kernel to compile. Not asked where the
        # answer changes nothing (one thread with many channels splits anyway); then
        # ``smooth`` is False and no choice below reads it.
        verdict_counts = want_dgrid and (threads > 1 or channels < tuning.FUSED_CHANNELS)
        asked = dgrid_by_channels or (want_dx and (verdict_counts or by_channels))
        smooth = asked and _smooth(field, voxels, sizes[0], nearest, align_corners)
        coherent = verdict_counts and smooth
        out_sizes, (grid_strides, dgrid_strides), (grad_strides,) = _long_rows(
            out_sizes, threads, (grid_strides, dgrid_strides), (grad_strides,), voxels, asked and not smooth)
        codes = (int(interpolation), int(padding), bool(align_corners), voxels)
        kernel = functools.partial(backward_kernel, *codes[:3], exact, voxels,  # kernel(exact_remainder)
                                   channels_last=layout == torch.channels_last_3d)

        rows = batch * out_sizes[0] * out_sizes[1]
        planes = batch * sizes[0]
        operands = (grad_flat, grad_strides, x_flat, x_strides, grid_flat, grid_strides, dx_flat, dx_strides,
                    dgrid_flat, dgrid_strides)
        shapes = (batch, channels, sizes, out_sizes)
        no_carry = np.empty(0)  # see backward_kernel: every grid gradient in one pass
        row_first, row_last = np.zeros(rows, np.int64), np.zeros(rows, np.int64)
        whole = np.array([[0, planes, 0, rows]], np.int64)

        def channel_slice(low, high, parts, want_dx_here, want_dgrid_here, carry=no_carry, carry_mode=0):
            """The operands of a launch over channels low .. high - 1 only (each computes every point's taps)."""
            return (*_from_channel(grad_flat, grad_strides, low), *_from_channel(x_flat, x_strides, low), grid_flat,
                    grid_strides, *(_from_channel(dx_flat, dx_strides, low) if want_dx else (dx_flat, dx_strides)),
                    dgrid_flat, dgrid_strides, row_first, row_last, parts, batch, high - low, sizes, out_sizes,
                    want_dx_here, want_dgrid_here, carry, carry_mode)

        def dgrid_pass():
            """The grid gradient's pass by rows: a random grid's a group of channels at a time.

            Each group's pass continues the sums of the groups before it (``carry``), in
            PyTorch's order, over a chunk of rows whose sums fit ``tuning.CARRY_BYTES``; a far
            reflection in any group reruns the chunk's groups exactly.
            """
            if smooth or not dgrid_by_channels:
                _launch(kernel, [], shared=[(*operands, row_first, row_last, row_parts(rows, planes,
                                                                                       _runs(threads, rows)),
                                             *shapes, False, True, no_carry, 0)])
                return
            chunk = max(1, tuning.CARRY_BYTES // (24 * out_sizes[2]))  # rows: 3 float64 sums per point
            carry = np.empty(3 * min(chunk, rows) * out_sizes[2])
            for first in range(0, rows, chunk):
                last = min(first + chunk, rows)
                parts = row_parts(last - first, planes, threads)
                parts[:, 2:] += first
                sums = carry[:3 * (last - first) * out_sizes[2]]
                # The groups in turn; _launch reruns them all exactly when one flags a far reflection.
                _launch(kernel, [channel_slice(low, high, parts, False, True, sums,
                                               3 if high == channels else (1 if low == 0 else 2))
                                 for low, high in _groups(channels, dgrid_group)])

        if not want_dx:
            if want_dgrid:
                dgrid_pass()
            return self._finish(dx, dgrid, dtype, layout, output_mask)

        def slabs(count):
            """``count`` slabs of dx's planes, balanced by the points that reach them.

            One slab owns every plane and skips no row, so it needs no row ranges (rows left
            at (0, 0) are walked); several need every row's depth range.
            """
            if count == 1:
                return whole
            depth_ranges(grid_flat, grid_strides, batch, sizes, out_sizes, *codes, _row_step(rows), True, row_first,
                         row_last, count)
            return plan_slabs(row_first, row_last, batch, sizes[0], sizes[1] * sizes[2], out_sizes[2],
                              1 if nearest else 2, count)

        if threads > 1 and coherent:
            # The grid gradient on some threads while the others add dx: vector gathers on one,
            # the scalar scatter on the other, which share a core's ports better than two
            # copies of the fused pass (docs/cpu.md, "Parallel passes"). The grid gradient
            # comes in short runs of rows that any thread takes up once its dx slab is done,
            # so that both passes end together however unequal they are.
            dx_parts = threads - threads // 2
            _launch(kernel, [(*operands, row_first, row_last, slabs(dx_parts), *shapes, True, False, no_carry, 0)],
                    shared=[(*operands, row_first, row_last, row_parts(rows, planes, _runs(threads, rows)), *shapes,
                             False, True, no_carry, 0)])
            return self._finish(dx, dgrid, dtype, layout, output_mask)
        # One thread walks a smooth grid once for both outputs, below FUSED_CHANNELS; else
        # the grid gradient takes a pass of its own, by rows, before dx.
        fused = coherent and threads == 1 and channels < tuning.FUSED_CHANNELS
        if want_dgrid and not fused:
            dgrid_pass()
        if by_channels and not smooth:
            # A random grid scatters every channel's taps over its whole plane: dx a group of
            # channels at a time keeps the group's planes in the cache while every point adds
            # into them (each launch computes every point's taps again), each free thread
            # taking the next group. Each voxel still sums in point order.
            _launch(kernel, [], shared=[channel_slice(low, high, whole, True, False)
                                        for low, high in _groups(channels, group)])
            return self._finish(dx, dgrid, dtype, layout, output_mask)
        if threads == 2 and layout != torch.channels_last_3d and channels >= 2:
            # dx by two channel groups, each part owning every plane of its channels: the two
            # parts then share the planes they keep in the caches (a core's two hyperthreads
            # here), where two slabs each kept their own (docs/cpu.md, "Parallel passes").
            # Each part computes every point's taps.
            half = channels // 2
            _launch(kernel, [channel_slice(0, half, whole, True, False),
                             channel_slice(half, channels, whole, True, False)], together=True)
            return self._finish(dx, dgrid, dtype, layout, output_mask)
        _launch(kernel, [(*operands, row_first, row_last, slabs(threads), *shapes, True, fused, no_carry, 0)])
        return self._finish(dx, dgrid, dtype, layout, output_mask)

    @staticmethod
    def _finish(dx, dgrid, dtype, layout, output_mask):
        """Round the float32/float64 results into the caller's dtype and layout (dgrid keeps its own);
        None where not asked for."""
        dx = round_once(dx, dtype).contiguous(memory_format=layout) if output_mask[0] else None
        if output_mask[1]:
            dgrid = round_once(dgrid, dtype).contiguous(memory_format=memory_format_of(dgrid))
        return dx, (dgrid if output_mask[1] else None)
