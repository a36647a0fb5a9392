"""The Numba CPU engine: exactness, determinism, thread counts, every element written, int64 offsets."""

import itertools
import json
import os
import re
import subprocess
import sys

import numba
import numpy as np
import pytest
import torch
from helpers import MATRIX, assert_backward_matches, cancelling_channels_last_case, make_case, matrix_id

import gridsampler3d as gs
from gridsampler3d import precision
from gridsampler3d.cpu import engine
from gridsampler3d.cpu.backward import BackwardOperands, backward_kernel
from gridsampler3d.cpu.forward import forward_kernel
from gridsampler3d.cpu.jit import gathers_in_use, outlined_helper, part_kernel, plain
from gridsampler3d.cpu.planner import _rows_per_long_row
from gridsampler3d.cpu.records import Carry, Geometry, Operand, RowRanges, kernel_rule
from gridsampler3d.cpu.slabs import depth_ranges, looks_coherent, plan_slabs, row_parts
from gridsampler3d.rounding import round_once
from gridsampler3d.sampling import Field, FieldKind, Outputs, Sampling
from gridsampler3d.tools import inputs

# The voxel matrix the engine hands the kernels for a field without theta (empty).
NO_MATRIX = engine._NO_MATRIX

# The engine splits even these small calls into parts on its threads, as it splits a large one.
pytestmark = pytest.mark.usefixtures("split_small_calls")


def _with_nonfinite(grad, x, grid):
    grid.view(-1)[::7] = float("nan")
    grid.view(-1)[3::11] = 1e30
    grid.view(-1)[5::13] = -float("inf")
    x.view(-1)[::13] = float("inf")
    grad.view(-1)[::9] = 1e300
    return grad, x, grid


def _equal(a, b):
    return torch.equal(torch.nan_to_num(a, 1.0, 2.0, 3.0), torch.nan_to_num(b, 1.0, 2.0, 3.0)) and torch.equal(
        torch.isnan(a), torch.isnan(b)
    )


@pytest.mark.parametrize("data_format", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("attributes", MATRIX, ids=matrix_id)
def test_float64_is_bitwise_pytorch(attributes, data_format):
    """Every sum runs in PyTorch's order, so float64 results equal PyTorch's bit for bit."""
    mode, padding, align_corners = attributes
    grad, x, grid = _with_nonfinite(*make_case(2, 5, (5, 6, 7), (4, 5, 3), torch.float64, low=-1.3, high=1.3))
    if data_format == "NDHWC":
        x, grad = x.permute(0, 2, 3, 4, 1).contiguous(), grad.permute(0, 2, 3, 4, 1).contiguous()
    ours = gs.grid_sampler3d_backward(
        grad, x, grid, mode, padding, align_corners, data_format=data_format, backend="numba"
    )
    golden = precision.golden_backward(grad, x, grid, mode, padding, align_corners, data_format=data_format)
    assert _equal(ours[0], golden[0]) and _equal(ours[1], golden[1])
    y = gs.grid_sampler3d(x, grid, mode, padding, align_corners, data_format=data_format, backend="numba")
    assert _equal(y, precision.golden_forward(x, grid, mode, padding, align_corners, data_format))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("smooth", [True, False], ids=["smooth", "random"])
@pytest.mark.parametrize("mode, data_format", [("bilinear", "NCDHW"), ("nearest", "NCDHW"), ("bilinear", "NDHWC")])
def test_results_do_not_depend_on_thread_count(dtype, smooth, mode, data_format, threads):
    """1, 2 and 3 threads give the same bits, over every way the engine splits the work.

    A smooth grid: the fused walk (1 thread), the grid gradient beside dx (1 + 1 and 1 + 2
    parts). A random one: the passes one after the other. dx of NCDHW data at 2 threads: two
    channel groups; otherwise slabs of planes.
    """
    grad, x, grid = make_case(2, 6, (9, 8, 7), (6, 7, 8), dtype, data_format=data_format)
    if smooth:
        grid = inputs.warp_grid(2, (6, 7, 8), magnitude=0.1, dtype=dtype)
    assert looks_coherent(Field.grid(grid), 9, Sampling.parse(mode), 1) == smooth
    results = []
    for count in (1, 2, 3):
        threads(count)
        results.append(
            gs.grid_sampler3d_backward(grad, x, grid, mode, "border", data_format=data_format, backend="numba")
            + (gs.grid_sampler3d(x, grid, mode, "border", data_format=data_format, backend="numba"),)
        )
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_a_far_reflection_in_a_smooth_grid_reruns_every_part_exactly(mode, threads):
    """Side by side, the grid gradient's and dx's parts flag far reflections each; the rerun is exact."""
    grad, x, _ = make_case(2, 3, (5, 4, 6), (3, 4, 5), torch.float64)
    grid = inputs.warp_grid(2, (3, 4, 5), magnitude=0.1, dtype=torch.float64)
    grid[1, 2, 3, 4, 0] = 7.5  # past two spans: libm's remainder
    grid[0, 0, 1, 2, 2] = -float("inf")
    assert looks_coherent(Field.grid(grid), 5, Sampling.parse(mode), 1)
    golden = precision.golden_backward(grad, x, grid, mode, "reflection", False)
    for count in (1, 2, 3):
        threads(count)
        ours = gs.grid_sampler3d_backward(grad, x, grid, mode, "reflection", False, backend="numba")
        assert _equal(ours[0], golden[0]) and _equal(ours[1], golden[1])


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_a_random_grid_runs_a_channel_group_at_a_time(mode, threads, monkeypatch):
    """A random grid's passes, a few channel planes at a time: float64 bitwise PyTorch's at 1, 2 and 3 threads.

    The grid gradient's groups continue each other's sums, chunk of rows by chunk; a far
    reflection (libm's remainder) makes its chunk's groups run again with the exact kernel.
    """
    from gridsampler3d.cpu import pool, tuning

    grad, x, grid = _with_nonfinite(*make_case(2, 5, (6, 7, 8), (4, 5, 9), torch.float64, low=-1.1, high=1.1))
    grid[1, 2, 3, 4, 0] = 7.5  # past two spans
    assert not looks_coherent(Field.grid(grid), 6, Sampling.parse(mode), 1)
    float32_case = [tensor.float() for tensor in make_case(2, 5, (6, 7, 8), (4, 5, 9), torch.float64)]
    in_one_pass = gs.grid_sampler3d_backward(*float32_case, mode, "reflection", False, backend="numba")
    # Groups of two channel planes (the last of one): launches of 2, 2 and 1 channels; the
    # grid gradient's sums carried over chunks of three rows (the last of one).
    monkeypatch.setattr(tuning, "SCATTER_CACHE_BYTES", 2 * 6 * 7 * 8 * 8)
    monkeypatch.setattr(tuning, "CARRY_BYTES", 3 * 24 * 9)
    golden = precision.golden_backward(grad, x, grid, mode, "reflection", False)
    rounds = []
    run_together = pool.run_together

    def counted(launches, shared=()):
        rounds.append(len(launches) + len(shared))
        run_together(launches, shared)

    monkeypatch.setattr(pool, "run_together", counted)
    for count in (1, 2, 3):
        threads(count)
        rounds.clear()
        ours = gs.grid_sampler3d_backward(grad, x, grid, mode, "reflection", False, backend="numba")
        assert _equal(ours[0], golden[0]) and _equal(ours[1], golden[1])
        # The three launches of dx come last, handed out together to the threads as they
        # become free, twice (the far point flags every launch).
        assert rounds[-2:] == [3, 3], rounds
        # The forward too: three launches handed out together; one flags the far point,
        # and all three run again with the exact kernel.
        rounds.clear()
        y = gs.grid_sampler3d(x, grid, mode, "reflection", False, backend="numba")
        assert _equal(y, precision.golden_forward(x, grid, mode, "reflection", False)) and rounds == [3, 3]
    # float32: the separable grid gradient continued across groups gives the one-pass bits.
    in_groups = gs.grid_sampler3d_backward(*float32_case, mode, "reflection", False, backend="numba")
    assert all(torch.equal(a, b) for a, b in zip(in_groups, in_one_pass))


def _short_rows(tensor, w_axis):
    """``tensor`` as a view whose rows sit one element apart more than a row of w: no two of them form one row."""
    shape = list(tensor.shape)
    shape[w_axis] += 1
    view = torch.empty(shape, dtype=tensor.dtype).narrow(w_axis, 0, tensor.shape[w_axis])
    return view.copy_(tensor)


@pytest.mark.parametrize(
    "mode, padding, dtype, data_format, smooth",
    [
        ("bilinear", "zeros", torch.float64, "NCDHW", True),
        ("bilinear", "reflection", torch.float32, "NDHWC", True),
        ("nearest", "border", torch.float32, "NCDHW", True),
        ("bilinear", "reflection", torch.float64, "NCDHW", False),
    ],
    ids=["zeros-fp64", "reflection-fp32-NDHWC", "nearest-fp32", "random-fp64"],
)
def test_long_rows_give_the_bits_of_rows_one_by_one(mode, padding, dtype, data_format, smooth, threads, monkeypatch):
    """Output rows walked k at a time as one row (the plan's rows_joined) give the bits of rows walked one by one.

    The same inputs once contiguous (rows joined: 6, 3 and 2 of the 6 rows of 20 points at
    1, 2 and 3 threads; a random grid's at one thread only) and once as views whose rows
    cannot join, over the engine's ways of splitting the work; the random grid's passes
    run two channel planes at a time.
    """
    from gridsampler3d.cpu import tuning

    grad, x, grid = make_case(
        1, 5, (6, 7, 8), (4, 6, 20), torch.float64, low=-1.1 if smooth else -1.2, high=1.1 if smooth else 1.2
    )
    if smooth:
        grid = inputs.random_affine_grid(1, (4, 6, 20), seed=5, dtype=torch.float64)
    else:
        grad, x, grid = _with_nonfinite(grad, x, grid)
        grid[0, 2, 3, 4, 0] = 7.5  # past two spans: the exact kernel runs too
        monkeypatch.setattr(tuning, "SCATTER_CACHE_BYTES", 2 * 6 * 7 * 8 * 8)
    assert looks_coherent(Field.grid(grid), 6, Sampling.parse(mode), 1) is smooth
    grad, x, grid = grad.to(dtype), x.to(dtype), grid.to(dtype)
    if data_format == "NDHWC":
        grad, x = grad.permute(0, 2, 3, 4, 1).contiguous(), x.permute(0, 2, 3, 4, 1).contiguous()
    short = (_short_rows(grad, 3 if data_format == "NDHWC" else 4), x, _short_rows(grid, 3))
    for count, joined in ((1, 6), (2, 3), (3, 2)):
        threads(count)
        assert _rows_per_long_row(4, 6, 20, count) == joined
        runs = [
            (
                gs.grid_sampler3d(x_, grid_, mode, padding, data_format=data_format, backend="numba"),
                *gs.grid_sampler3d_backward(grad_, x_, grid_, mode, padding, data_format=data_format, backend="numba"),
            )
            for grad_, x_, grid_ in ((grad, x, grid), short)
        ]
        assert all(_equal(a, b) for a, b in zip(*runs)), count


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize(
    "shape", [(1, 1, 2, 3, 5), (2, 3, 3, 5, 7), (3, 17, 4, 5, 6), (1, 16, 8, 8, 8)], ids=["1ch", "3ch", "17ch", "16ch"]
)
def test_channels_last_copies_keep_every_bit(dtype, shape, threads):
    """transpose.to_channels_last / to_contiguous: the same elements (NaN payloads too), in the other layout.

    Shapes with whole and partial steps of points (8 float32 at a time), and channels
    past the last four; the copies' parts split the steps at 2 and 3 threads.
    """
    from gridsampler3d.cpu import transpose

    bits = torch.randint(-(2**15), 2**15, shape, generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    tensor = (
        bits.to(torch.int16).view(dtype)
        if dtype.itemsize == 2
        else (bits.to(torch.int64 if dtype.itemsize == 8 else torch.int32) * 65537).view(dtype)
    )
    integers = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    for count in (1, 2, 3):
        threads(count)
        last = transpose.to_channels_last(tensor)
        assert last.is_contiguous(memory_format=torch.channels_last_3d) and last.shape == tensor.shape
        assert torch.equal(last.view(integers), tensor.view(integers))
        back = transpose.to_contiguous(last)
        assert back.is_contiguous() and torch.equal(back.view(integers), tensor.view(integers))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    "padding, align_corners, channels", [("zeros", False, 16), ("border", True, 17), ("reflection", False, 19)]
)
def test_a_many_channel_backward_on_copies_gives_the_ncdhw_bits(
    dtype, padding, align_corners, channels, threads, monkeypatch
):
    """NCDHW data with many channels on a smooth grid: the channels-last kernels on copies, the same bits.

    Against the NCDHW kernels (``tuning.COPIED_CHANNELS`` and ``COPIED_HALF_CHANNELS`` out
    of reach), for each output mask, the fused warp as well, at 1, 2 and 3 threads; the
    copies are counted, so the test fails if the path is not taken. A random grid, float64
    data and views that are not dense keep the NCDHW kernels.
    """
    from gridsampler3d.cpu import transpose, tuning

    grad, x, _ = make_case(2, channels, (6, 7, 9), (5, 6, 11), torch.float64)
    grid = inputs.warp_grid(2, (5, 6, 11), magnitude=0.2, dtype=torch.float64)
    generator = torch.Generator().manual_seed(2)
    # The warp's output has the volume's sizes; a smooth displacement of a third of a voxel
    displacement = torch.randn(2, 3, 6, 7, 9, generator=generator, dtype=torch.float64) / 3
    warp_grad = torch.randn(2, channels, 6, 7, 9, generator=generator, dtype=torch.float64)
    grad, x, grid, displacement, warp_grad = (t.to(dtype) for t in (grad, x, grid, displacement, warp_grad))
    copies = []
    to_channels_last = transpose.to_channels_last

    def counted(tensor):
        copies.append(tensor.shape)
        return to_channels_last(tensor)

    monkeypatch.setattr(transpose, "to_channels_last", counted)

    def both(copied: bool):
        monkeypatch.setattr(tuning, "COPIED_CHANNELS", 16 if copied else 10**9)
        monkeypatch.setattr(tuning, "COPIED_HALF_CHANNELS", 8 if copied else 10**9)
        copies.clear()
        results = []
        for mask in ((True, True), (True, False), (False, True)):
            results += gs.grid_sampler3d_backward(
                grad, x, grid, "bilinear", padding, align_corners, output_mask=mask, backend="numba"
            )
            results += gs.warp3d_backward(
                warp_grad, x, displacement, "bilinear", padding, align_corners, output_mask=mask, backend="numba"
            )
        return results, len(copies)

    for count in (1, 2, 3):
        threads(count)
        (ncdhw, none), (copied, made) = both(False), both(True)
        # grad and x for both outputs and the grid gradient alone; grad alone for dx (float32 only)
        assert none == 0 and made == 2 * (2 + 2 + (1 if dtype == torch.float32 else 0)), made
        for a, b in zip(ncdhw, copied):
            assert (a is None and b is None) or (_equal(a, b) and a.stride() == b.stride())
    # Half data from 8 channels on (its NCDHW kernels read float64 copies), float32 from 16
    copies.clear()
    gs.grid_sampler3d_backward(
        grad[:, :8].contiguous(), x[:, :8].contiguous(), grid, "bilinear", padding, align_corners, backend="numba"
    )
    assert len(copies) == (0 if dtype == torch.float32 else 2)
    # Not taken: a random grid (every channel's plane at once), float64, a view that is not dense
    copies.clear()
    random_grid = (torch.rand(grid.shape, generator=torch.Generator().manual_seed(3)) * 2.2 - 1.1).to(dtype)
    gs.grid_sampler3d_backward(grad, x, random_grid, "bilinear", padding, align_corners, backend="numba")
    gs.grid_sampler3d_backward(
        grad.double(), x.double(), grid.double(), "bilinear", padding, align_corners, backend="numba"
    )
    gs.grid_sampler3d_backward(grad, x[:, :, :, :, :8], grid, "bilinear", padding, align_corners, backend="numba")
    assert copies == []


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_every_way_of_reading_the_grid_gives_the_same_bits(mode, threads):
    """Phase A reads a grid's components as one interleaved row (a contiguous grid), as three rows (components
    one element apart along x: a displacement, or a grid stored component by component) or element by element
    (other strides): the same values, so the same bits, forward and backward, at 1 and 2 threads."""
    grad, x, grid = make_case(2, 3, (6, 7, 8), (4, 5, 19), torch.float32, low=-1.2, high=1.2)
    grid.view(-1)[::11] = float("nan")
    planes = grid.permute(0, 4, 1, 2, 3).contiguous().permute(0, 2, 3, 4, 1)  # x stride 1
    spaced = torch.empty(2, 4, 5, 19, 6).copy_(torch.cat([grid, grid], -1))[..., :3]  # x stride 6
    displacement = torch.randn(2, 3, 6, 7, 8, generator=torch.Generator().manual_seed(4)) * 2
    warp_grad = torch.randn(2, 3, 6, 7, 8, generator=torch.Generator().manual_seed(5))
    as_rows = displacement.permute(0, 2, 3, 4, 1).contiguous()  # (N, D, H, W, 3): step 3, read element by element
    for count in (1, 2):
        threads(count)
        runs = [
            (
                gs.grid_sampler3d(x, g, mode, "reflection", backend="numba"),
                *gs.grid_sampler3d_backward(grad, x, g, mode, "reflection", backend="numba"),
            )
            for g in (grid, planes, spaced)
        ]
        for other in runs[1:]:
            assert all(_equal(a, b) for a, b in zip(runs[0], other))
        warps = [
            (
                gs.warp3d(x, d, mode, "border", displacement_format=f, backend="numba"),
                *gs.warp3d_backward(warp_grad, x, d, mode, "border", displacement_format=f, backend="numba"),
            )
            for d, f in ((displacement, "N3DHW"), (as_rows, "NDHW3"))
        ]
        (y, dx, ddisplacement), (y_rows, dx_rows, ddisplacement_rows) = warps
        assert _equal(y, y_rows) and _equal(dx, dx_rows)
        assert _equal(ddisplacement, ddisplacement_rows.permute(0, 4, 1, 2, 3))


def _named_tuple_types(kind):
    """The named-tuple types anywhere in a kernel argument's type."""
    if isinstance(kind, numba.types.BaseNamedTuple):
        yield kind
    if isinstance(kind, numba.types.BaseTuple):
        for inner in kind.types:
            yield from _named_tuple_types(inner)


def test_kernels_are_given_their_records_as_plain_tuples(threads, monkeypatch):
    """Serial and parallel launches pass every record to Numba's dispatcher as a plain tuple (records.unnamed): it
    fingerprints a named one in Python at every call, and a named one would compile the kernel again."""
    from conftest import DEFAULT_PARALLEL_VALUES

    from gridsampler3d.cpu import tuning
    from gridsampler3d.cpu.records import unnamed

    operand = Operand(np.zeros(2), (1, 1, 1, 1, 1))
    matrix, moments = np.zeros(12), np.zeros(6)
    arguments = (
        BackwardOperands(*[operand] * 5, matrix, moments),
        Geometry(1, 2, (3, 4, 5), (6, 7, 8)),
        np.zeros(3),
        4,
        (1, 2),
    )
    plain = unnamed(arguments)
    assert [type(argument) for argument in plain] == [tuple, tuple, np.ndarray, int, tuple]
    assert all(type(field) is tuple and field[0] is operand.data for field in plain[0][:5])  # a record in a record
    assert plain[0][5] is matrix and plain[0][6] is moments  # arrays in a record pass as they are
    assert plain[1] == (1, 2, (3, 4, 5), (6, 7, 8)) and plain[2] is arguments[2] and plain[4] is arguments[4]
    grad, x, grid = make_case(2, 3, (6, 7, 8), (5, 6, 9), torch.float32)
    threads(2)
    for parallel_values in (0, DEFAULT_PARALLEL_VALUES):  # every launch parallel; then one walk on this thread
        monkeypatch.setattr(tuning, "PARALLEL_VALUES", parallel_values)
        gs.grid_sampler3d(x, grid, backend="numba")
        gs.grid_sampler3d_backward(grad, x, grid, backend="numba")
    for kernel in (
        forward_kernel(Sampling(), FieldKind.GRID, False, channels_last=False),
        backward_kernel(Sampling(), FieldKind.GRID, False, False, channels_last=False),
    ):
        assert kernel.signatures
        for signature in kernel.signatures:
            assert not [named for kind in signature for named in _named_tuple_types(kind)], signature


def test_small_calls_run_serially_with_the_same_bits(threads, monkeypatch):
    """Below tuning.PARALLEL_VALUES a call runs its one walk on the calling thread, handing nothing to the pool;
    above it, the forward's rows run as tuning.SHARED_RUNS runs per thread (runs of at least tuning.RUN_VALUES
    values). The bits are the same either way."""
    from conftest import DEFAULT_PARALLEL_VALUES

    from gridsampler3d.cpu import pool, tuning

    grad, x, grid = make_case(1, 2, (9, 8, 7), (6, 7, 8), torch.float32)
    threads(2)
    split = (gs.grid_sampler3d(x, grid, backend="numba"), *gs.grid_sampler3d_backward(grad, x, grid, backend="numba"))
    parts = []
    run_together = pool.run_together

    def counted(launches, shared=()):
        parts.append(sum(count for _, _, count in (*launches, *shared)))
        run_together(launches, shared)

    monkeypatch.setattr(pool, "run_together", counted)
    monkeypatch.setattr(tuning, "PARALLEL_VALUES", DEFAULT_PARALLEL_VALUES)
    assert grad.numel() < DEFAULT_PARALLEL_VALUES
    whole = (gs.grid_sampler3d(x, grid, backend="numba"), *gs.grid_sampler3d_backward(grad, x, grid, backend="numba"))
    assert parts == [], parts
    assert all(torch.equal(a, b) for a, b in zip(split, whole))
    monkeypatch.setattr(tuning, "PARALLEL_VALUES", grad.numel())
    parts.clear()
    gs.grid_sampler3d(x, grid, backend="numba")
    assert parts == [2], parts  # runs of at least tuning.RUN_VALUES values: one per thread here
    monkeypatch.setattr(tuning, "RUN_VALUES", 1)
    parts.clear()
    gs.grid_sampler3d(x, grid, backend="numba")
    assert parts == [2 * tuning.SHARED_RUNS]  # of its 42 rows


@pytest.mark.parametrize("data_format", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("attributes", MATRIX, ids=matrix_id)
def test_small_calls_equal_the_golden(attributes, data_format, monkeypatch):
    """The serial route of small calls (one walk for both outputs, scratch kept between calls): float64 bitwise
    PyTorch's, every output mask, far and non-finite coordinates included."""
    from conftest import DEFAULT_PARALLEL_VALUES

    from gridsampler3d.cpu import tuning

    mode, padding, align_corners = attributes
    if mode == "bicubic":
        pytest.skip("the bicubic kernels have their own tests (test_bicubic)")
    monkeypatch.setattr(tuning, "PARALLEL_VALUES", DEFAULT_PARALLEL_VALUES)
    grad, x, grid = _with_nonfinite(*make_case(2, 3, (5, 6, 7), (4, 5, 9), torch.float64, low=-1.3, high=1.3))
    grid[1, 2, 3, 4, 0] = 7.5  # past two spans: the exact kernel runs too
    assert gs.explain(x, grid, grad, mode, padding, align_corners).strategy.value == "serial"
    golden = precision.golden_backward(grad, x, grid, mode, padding, align_corners)
    for mask in ((True, True), (True, False), (False, True)):
        for repeat in range(2):  # the second call runs on the kept scratch
            ours = gs.grid_sampler3d_backward(
                grad, x, grid, mode, padding, align_corners, output_mask=mask, backend="numba"
            )
            for mine, gold, wanted in zip(ours, golden, mask):
                assert (mine is None) if not wanted else _equal(mine, gold), (mask, repeat)
    if data_format == "NDHWC":
        x, grad = x.permute(0, 2, 3, 4, 1).contiguous(), grad.permute(0, 2, 3, 4, 1).contiguous()
    y = gs.grid_sampler3d(x, grid, mode, padding, align_corners, data_format=data_format, backend="numba")
    expected = precision.golden_forward(
        x if data_format == "NCDHW" else x.permute(0, 4, 1, 2, 3), grid, mode, padding, align_corners
    )
    assert _equal(y if data_format == "NCDHW" else y.permute(0, 4, 1, 2, 3), expected)


@pytest.mark.parametrize("slabs", [1, 2, 3, 7])
@pytest.mark.parametrize("attributes", MATRIX, ids=matrix_id)
def test_every_output_element_is_written_and_any_split_is_exact(attributes, slabs):
    """Kernels run on NaN-poisoned outputs, fused and split, with 1 to 7 parts: all equal the golden."""
    mode, padding, align_corners = attributes
    if mode == "bicubic":
        pytest.skip("the bicubic kernels have their own poison tests (test_bicubic)")
    grad, x, grid = make_case(2, 3, (5, 4, 6), (4, 3, 5), torch.float64, low=-1.3, high=1.3)
    x = x.contiguous(memory_format=torch.channels_last_3d)  # a strided layout on purpose
    sampling = Sampling.parse(mode, padding, align_corners)
    grid_operand = engine.operand(grid)
    batch, channels, sizes, out_sizes = 2, 3, tuple(x.shape[2:]), tuple(grid.shape[1:4])
    geometry = Geometry(batch, channels, sizes, out_sizes)
    rows = batch * out_sizes[0] * out_sizes[1]
    row_first, row_last = (np.full(rows, -7, np.int64) for _ in range(2))
    depth_ranges(
        grid_operand,
        NO_MATRIX,
        geometry,
        kernel_rule(sampling, FieldKind.GRID),
        (1, True),
        RowRanges(row_first, row_last),
        slabs,
    )
    assert (row_first != -7).all() and (row_last >= row_first).all()
    # Rows between the sampled ones take their range from their extreme z values (zeros,
    # border): the same range as point by point.
    scanned_first, scanned_last = (np.full(rows, -7, np.int64) for _ in range(2))
    depth_ranges(
        grid_operand,
        NO_MATRIX,
        geometry,
        kernel_rule(sampling, FieldKind.GRID),
        (3, True),
        RowRanges(scanned_first, scanned_last),
        2,
    )
    assert np.array_equal(scanned_first, row_first) and np.array_equal(scanned_last, row_last)
    reach = 1 if mode == "nearest" else 2
    parts = plan_slabs(row_first, row_last, batch, sizes[0], sizes[1] * sizes[2], out_sizes[2], reach, slabs)
    assert parts[0, 0] == 0 and parts[-1, 1] == batch * sizes[0] and np.all(parts[1:, 0] == parts[:-1, 1])
    golden_dx, golden_dgrid = precision.golden_backward(grad, x, grid, mode, padding, align_corners)
    # fused: one part computes both; split: dgrid by rows, then dx by slabs (the engine runs
    # these two side by side for smooth grids, and one after the other for random ones)
    whole = np.array([[0, batch * sizes[0], 0, rows]], np.int64)
    fused_and_split = [
        [(whole, True, True)],
        [(row_parts(rows, batch * sizes[0], slabs), False, True), (parts, True, False)],
    ]
    # Every coordinate lies within two spans of the volume: no part needs the exact remainder.
    for exact, passes in itertools.product((True, False), fused_and_split):
        kernel = backward_kernel(sampling, FieldKind.GRID, exact, False)
        dx = torch.full_like(x, float("nan"))
        dgrid = torch.full_like(grid, float("nan"))
        operands = BackwardOperands(
            engine.operand(grad),
            engine.operand(x),
            grid_operand,
            engine.operand(dx),
            engine.operand(dgrid),
            NO_MATRIX,
            np.zeros(0),  # no moments: not an affine field
        )
        for work, want_dx, want_dgrid in passes:
            unresolved = np.full(len(work), -1, np.int64)  # each part sets its flag
            kernel(
                operands,
                geometry,
                work,
                RowRanges(row_first, row_last),
                Outputs(want_dx, want_dgrid),
                Carry(np.empty(0), 0),
                unresolved,
            )
            assert not unresolved.any()
        if mode == "nearest":
            assert dgrid.isnan().all()  # nearest kernels never touch dgrid: the engine zeroes it
            dgrid.zero_()
        assert _equal(dx, golden_dx)
        if exact:
            assert _equal(dgrid, golden_dgrid)
        else:
            # The separable sums associate differently: equal to the golden to float64 rounding.
            torch.testing.assert_close(dgrid, golden_dgrid, rtol=1e-12, atol=1e-12)
    y = torch.full_like(grad, float("nan"))
    forward_kernel(sampling, FieldKind.GRID)(
        engine.operand(x), grid_operand, NO_MATRIX, engine.operand(y), geometry, slabs, unresolved
    )
    assert not unresolved.any()
    assert _equal(y, precision.golden_forward(x, grid, mode, padding, align_corners))


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_far_reflections_flag_the_fast_kernel_and_take_the_exact_one(mode, threads):
    """Reflection past two spans (or infinite) needs libm's remainder: the fast kernel flags it, NaN it handles.

    The engine then runs the exact kernel: results equal PyTorch's bit for bit, at 1 and 2 threads.
    """
    grad, x, grid = make_case(2, 3, (5, 4, 6), (3, 4, 5), torch.float64, low=-1.9, high=1.9)
    sampling = Sampling.parse(mode, "reflection", False)
    geometry = Geometry(2, 3, tuple(x.shape[2:]), tuple(grid.shape[1:4]))

    def flags(grid):
        y = torch.empty_like(grad)
        unresolved = np.full(2, -1, np.int64)
        forward_kernel(sampling, FieldKind.GRID)(
            engine.operand(x), engine.operand(grid), NO_MATRIX, engine.operand(y), geometry, 2, unresolved
        )
        return unresolved.tolist()

    assert flags(grid) == [0, 0]  # within two spans (|coordinate| < 3 here)
    for value, expected in ((float("nan"), [0, 0]), (7.5, [0, 1]), (-float("inf"), [0, 1])):
        changed = grid.clone()
        changed[1, 2, 3, 4, 0] = value  # a point in the second part's rows
        assert flags(changed) == expected, value
    grid.view(-1)[::5] *= 4.0
    grid.view(-1)[1::17] = float("inf")
    grid.view(-1)[2::19] = float("nan")
    for count in (1, 2):
        threads(count)
        ours = gs.grid_sampler3d_backward(grad, x, grid, mode, "reflection", False, backend="numba")
        golden = precision.golden_backward(grad, x, grid, mode, "reflection", False)
        assert _equal(ours[0], golden[0]) and _equal(ours[1], golden[1])
        y = gs.grid_sampler3d(x, grid, mode, "reflection", False, backend="numba")
        assert _equal(y, precision.golden_forward(x, grid, mode, "reflection", False))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_one_pass_rounding_is_bitwise_the_reference_rounding(dtype):
    """engine.round_in_parts (one Numba pass) gives rounding.round_once's bits, values and layout, dense or not."""
    from gridsampler3d.rounding import round_once as reference_round_once

    generator = torch.Generator().manual_seed(3)
    values = torch.randn(2, 3, 5, 6, 7, generator=generator, dtype=torch.float64)
    values *= torch.logspace(-45, 40, values.numel(), dtype=torch.float64).reshape(values.shape)
    values.view(-1)[::17] = float("nan")
    values.view(-1)[5::23] = float("inf")
    values.view(-1)[7::29] = -1e300
    values.view(-1)[9::31] = 0.0
    # ties of both half types, just above them, and subnormals of float32
    edges = torch.tensor(
        [
            1 + 2**-8,
            1 + 2**-8 + 2**-40,
            1 + 2**-11,
            1 + 2**-11 + 2**-40,
            -(1 + 2**-8 + 2**-45),
            2**-140,
            2**-149 * 1.5,
            -(2**-24) * 1.5,
        ],
        dtype=torch.float64,
    )
    for tensor in (
        values,
        values.contiguous(memory_format=torch.channels_last_3d),
        values[:, :, ::2],
        values.permute(0, 2, 3, 4, 1),
        edges,
    ):
        ours, reference = engine.round_in_parts(tensor, dtype), reference_round_once(tensor, dtype)
        assert ours.dtype == dtype and ours.stride() == reference.stride()
        assert torch.equal(ours.view(torch.int16), reference.view(torch.int16))


def test_smooth_and_random_grids_are_told_apart():
    """A smooth grid fuses dx and dgrid (or runs them side by side); a random one takes a pass each (both verdicts)."""
    verdicts = []
    for grid in (inputs.warp_grid(1, 32), inputs.uniform_grid(1, 32)):
        for row_step in (1, 3):  # every row, and every third
            verdicts.append(looks_coherent(Field.grid(grid), 32, Sampling(), row_step))
    # a smooth and a random displacement in voxels (the fused warp), (N, 3, D, H, W)
    smooth = inputs.smooth_displacement(1, 32, magnitude=0.1).permute(0, 4, 1, 2, 3) * 16
    scattered = 16 * torch.rand(1, 3, 32, 32, 32, generator=torch.Generator().manual_seed(5)) - 8
    verdicts += [
        looks_coherent(Field.displacement(field), 32, Sampling.parse("nearest", "zeros", True), 1)
        for field in (smooth, scattered)
    ]
    assert verdicts == [True, True, False, False, True, False]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("padding", ["zeros", "border"])
def test_half_precision_is_the_golden_rounded_once(dtype, padding):
    """Half dx and y sum in float64 and are rounded once: bitwise the float64 golden rounded to half.

    Many points land on each voxel (a 5³ volume sampled at 20 x 9 x 11 x 13 points), with
    values in [-100, 100]: a float32 accumulator rounded again to half would differ here.
    """
    grad, x, grid = make_case(20, 9, (5, 5, 5), (9, 11, 13), torch.float64, low=-1.1, high=1.1)
    grad, x = ((100 * torch.tanh(t)).to(dtype) for t in (grad, x))
    grid = grid.to(dtype)
    dx, dgrid = gs.grid_sampler3d_backward(grad, x, grid, "bilinear", padding, backend="numba")
    golden_dx, golden_dgrid = precision.golden_backward(grad, x, grid, "bilinear", padding)
    assert torch.equal(dx, round_once(golden_dx, dtype))
    y = gs.grid_sampler3d(x, grid, "bilinear", padding, backend="numba")
    assert torch.equal(y, round_once(precision.golden_forward(x, grid, "bilinear", padding), dtype))
    competitor = precision.competitor_backward(grad, x, grid, "bilinear", padding)
    report = precision.compare("dgrid", dgrid, golden_dgrid, competitor[1], dtype)
    assert report.passed, str(report)


def _data_dtype(signature):
    """The dtype of the first array in a kernel's signature (its data: x, or grad)."""
    first = signature[0]
    while not isinstance(first, numba.types.Array):
        first = first[0]
    return first.dtype


def _vector_code_counts(kernel, dtype=numba.float32) -> tuple[int, int, int]:
    """(packed float64 arithmetic on 256/512-bit registers, hardware gathers, run-time overlap tests) in
    ``kernel``'s fresh code for ``dtype`` data.

    Compiled anew from the Python function without the disk cache, whose code cannot be
    inspected. The overlap tests are LLVM's ``vector.memcheck`` blocks in the optimised IR.
    """
    fresh = part_kernel(kernel.py_func, cache=False)
    # The build of that dtype (other tests may have compiled others of the same kernel first)
    signature = next(signature for signature in kernel.signatures if _data_dtype(signature) == dtype)
    fresh.compile(signature)
    assembly = fresh.inspect_asm(signature)
    packed = len(re.findall(r"\bv(?:add|sub|mul)pd\s+%[yz]mm", assembly))
    overlap_tests = len(re.findall(r"^vector\.memcheck[\w.]*:", fresh.inspect_llvm(signature), re.MULTILINE))
    return packed, len(re.findall(r"\bv(?:p)?gather", assembly)), overlap_tests


@pytest.mark.parametrize(
    "padding, field",
    [("zeros", FieldKind.GRID), ("reflection", FieldKind.GRID), ("border", FieldKind.DISPLACEMENT)],
    ids=["zeros", "reflection", "warp-border"],
)
@pytest.mark.slow
def test_hot_loops_stay_vectorised(padding, field):
    """The block loops compile to SIMD arithmetic with hardware gathers (grid and fused-warp kernels).

    One N-D index or one unsigned cast silently turns such a loop scalar, three to five
    times slower with no error; this catches it.
    """
    grad, x, grid = make_case(1, 2, (6, 6, 6), (5, 5, 9), torch.float32)
    if field == FieldKind.DISPLACEMENT:  # the warp's defaults: align_corners=True
        displacement = torch.randn(1, 3, 6, 6, 6)
        gs.warp3d(x, displacement, "bilinear", padding, True, backend="numba")
        gs.warp3d_backward(torch.randn_like(x), x, displacement, "bilinear", padding, True, backend="numba")
    else:
        gs.grid_sampler3d(x, grid, "bilinear", padding, backend="numba")
        gs.grid_sampler3d_backward(grad, x, grid, "bilinear", padding, backend="numba")
    sampling = Sampling.parse("bilinear", padding, field == FieldKind.DISPLACEMENT)
    # The arguments exactly as the engine passes them (the factories cache on them).
    for kernel in (
        forward_kernel(sampling, field, False, channels_last=False),
        backward_kernel(sampling, field, False, False, channels_last=False),
    ):
        packed, gathers, overlap_tests = _vector_code_counts(kernel)
        # Vectorised, these kernels hold 45 to 80 such operations and 19 to 42 gathers; the
        # backward with its loops turned scalar (an alias in its parallel body) held 12 and 2.
        # Where gathers are slow the taps load lane by lane: none at all (docs/cpu.md, "Gathers").
        assert packed >= 30 and (gathers >= 8 if gathers_in_use() else gathers == 0), (
            kernel.py_func.__qualname__,
            packed,
            gathers,
            gathers_in_use(),
        )
        # With scratch arrays allocated in the kernel, or helpers compiled without
        # noalias, LLVM guarded the loops with 3 to 13 overlap tests, which failed by the
        # chance of the heap layout and ran the loops' scalar copies (docs/cpu.md).
        assert overlap_tests == 0, (kernel.py_func.__qualname__, overlap_tests)


def test_exact_grid_gradient_stays_vectorised():
    """The grid gradient in PyTorch's terms (float64) runs as SIMD arithmetic, with or without hardware gathers.

    With the taps' lane-by-lane loads inside its arithmetic loop, LLVM kept that loop
    scalar on a CPU without fast gathers (59 packed operations in the kernel, 1.2 to 1.4
    times the backward's time); vectorised, the kernel holds about 148 in either build.
    """
    grad, x, grid = make_case(1, 2, (6, 6, 6), (5, 5, 9), torch.float64)
    gs.grid_sampler3d_backward(grad, x, grid, "bilinear", "reflection", backend="numba")
    kernel = backward_kernel(Sampling.parse("bilinear", "reflection"), FieldKind.GRID, True, False, channels_last=False)
    packed, gathers, overlap_tests = _vector_code_counts(kernel, numba.float64)
    assert packed >= 100 and (gathers >= 8 if gathers_in_use() else gathers == 0), (packed, gathers)
    assert overlap_tests == 0, overlap_tests


_OTHER_BUILD = """
import json, sys, numba, torch
import gridsampler3d as gs
from gridsampler3d.cpu.backward import backward_kernel
from gridsampler3d.cpu.forward import forward_kernel
from gridsampler3d.cpu.jit import gathers_in_use
from gridsampler3d.sampling import FieldKind, Sampling

def first_array(kind):  # the first array type in an operand, or in a record of operands, as tuples
    while not isinstance(kind, numba.types.Array):
        kind = kind[0]
    return kind

grad, x, grid = torch.load(sys.argv[1])
y = gs.grid_sampler3d(x, grid, "bilinear", "zeros", backend="numba")
dx, dgrid = gs.grid_sampler3d_backward(grad, x, grid, "bilinear", "zeros", backend="numba")
torch.save((y, dx, dgrid), sys.argv[2])
gathers = []
for kernel in (forward_kernel(Sampling(), FieldKind.GRID, False, channels_last=False),
               backward_kernel(Sampling(), FieldKind.GRID, not bool(torch.isfinite(grad.sum())), False,
                               channels_last=False)):
    # freshly compiled (an empty cache), so the code can be inspected
    signature = next(s for s in kernel.signatures if first_array(s[0]).dtype.name == "float32")
    gathers.append(kernel.part.inspect_asm(signature).count("gather"))
print(json.dumps({"gathers_in_use": gathers_in_use(), "gathers": gathers}))
"""


@pytest.mark.slow
def test_gather_and_scalar_load_builds_agree(tmp_path):
    """The kernels built the other way than this CPU's (gathers or lane-by-lane loads) give bitwise the same results.

    A second process compiles for another CPU name with this machine's features: a Zen
    name gives the build without gathers, an Intel name the build with them.
    """
    case = _with_nonfinite(*make_case(1, 3, (7, 9, 11), (5, 6, 37), torch.float64, low=-1.2, high=1.2))
    grad, x, grid = (tensor.float() for tensor in case)
    torch.save((grad, x, grid), tmp_path / "case.pt")
    other_cpu = "znver4" if gathers_in_use() else "skylake-avx512"
    environment = {
        **os.environ,
        "NUMBA_CPU_NAME": other_cpu,
        "NUMBA_CPU_FEATURES": numba.core.codegen.get_host_cpu_features(),
        "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
    }
    result = subprocess.run(
        [sys.executable, "-c", _OTHER_BUILD, str(tmp_path / "case.pt"), str(tmp_path / "out.pt")],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["gathers_in_use"] is not gathers_in_use()
    # The build without gathers has none; the one with them gathers in every kernel.
    assert all(count >= 8 for count in report["gathers"]) if report["gathers_in_use"] else report["gathers"] == [0, 0]
    y, dx, dgrid = torch.load(tmp_path / "out.pt")
    ours = (
        gs.grid_sampler3d(x, grid, "bilinear", "zeros", backend="numba"),
        *gs.grid_sampler3d_backward(grad, x, grid, "bilinear", "zeros", backend="numba"),
    )
    for theirs, mine in zip((y, dx, dgrid), ours):
        assert _equal(theirs, mine)


def test_helpers_compile_once_per_type_not_once_per_mode():
    """Every mode's kernel shares one compiled copy of each helper (the cold compile budget)."""
    from gridsampler3d.cpu import block, coords

    helpers = (block.trilinear_cells, block._point, coords.source_index, coords.reflect_with_grad)
    _, x, grid = make_case(1, 1, (3, 3, 3), (2, 2, 2), torch.float32)

    def compile_forward(padding, align_corners):
        """Compile the mode's forward kernel anew (not from the disk cache, which would type no helper)."""
        gs.grid_sampler3d(x, grid, "bilinear", padding, align_corners, backend="numba")
        kernel = forward_kernel(
            Sampling.parse("bilinear", padding, align_corners), FieldKind.GRID, False, channels_last=False
        )
        signature = next(signature for signature in kernel.signatures if _data_dtype(signature) == numba.float32)
        part_kernel(kernel.py_func, cache=False).compile(signature)

    compile_forward("reflection", False)
    counts = [len(helper.signatures) for helper in helpers]
    # Other values of both modes (each fresh compile costs about a second)
    for padding, align_corners in (("zeros", True), ("border", False)):
        compile_forward(padding, align_corners)
    # A literal-typed helper would gain a signature per padding and align_corners value.
    assert [len(helper.signatures) for helper in helpers] == counts


def test_grid_gradient_cancels_as_pytorch_does():
    """The separable sums take differences first, so constant data cancels exactly, as in PyTorch."""
    grad, x, grid = cancelling_channels_last_case()
    assert_backward_matches(
        grad,
        x,
        grid,
        "bilinear",
        "reflection",
        True,
        data_format="NDHWC",
        backend="numba",
        label="channels-last cancellation",
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("channels", [4, 9, 16])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_channels_last_grid_gradient_is_the_ncdhw_one_bit_for_bit(dtype, channels, padding):
    """The channels-last grid gradient (each tap's channels as one vector) sums as the NCDHW pass, in its order.

    Taps outside the volume, infinite data and a grad spanning many orders of magnitude
    included, so that a changed order or a mishandled outside tap would show.
    """
    grad, x, grid = make_case(2, channels, (5, 6, 7), (4, 5, 9), dtype, low=-1.2, high=1.2, seed=channels)
    x.view(-1)[::29] = float("inf")
    grad.view(-1)[::7] *= 1e4
    last = [tensor.contiguous(memory_format=torch.channels_last_3d) for tensor in (grad, x)]
    ncdhw = gs.grid_sampler3d_backward(grad, x, grid, "bilinear", padding, backend="numba")
    channels_last = gs.grid_sampler3d_backward(*last, grid, "bilinear", padding, backend="numba")
    assert _equal(channels_last[1], ncdhw[1]) and _equal(channels_last[0], ncdhw[0])


def test_channels_last_grid_gradient_stays_vectorised():
    """The channels-last grid gradient's loop over the channels compiles to SIMD arithmetic."""
    from gridsampler3d.cpu.backward import _grid_gradient_channels_inner
    from gridsampler3d.cpu.jit import outlined_helper

    row = numba.types.Array(numba.float64, 1, "C")
    data = numba.types.Array(numba.float32, 1, "C")
    integers = numba.types.Array(numba.int64, 1, "C")
    i64 = numba.int64
    fresh = outlined_helper(_grid_gradient_channels_inner.py_func, cache=False)
    signature = (i64, data, i64, i64, data, i64, i64, integers, integers, row, row, numba.types.UniTuple(row, 3))
    fresh.compile(signature)
    assembly = fresh.inspect_asm(signature)
    # Vectorised it holds about 40 such operations; its scalar form none.
    assert len(re.findall(r"\bv(?:add|sub|mul)pd\s+%[yz]mm", assembly)) >= 20


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.float32])
@pytest.mark.parametrize("parts, entries", [(1, 1), (2, 16), (3, 48), (4, 2), (2, 0), (5, 1024)])
def test_each_parts_scratch_row_has_cache_lines_of_its_own(parts, entries, dtype):
    """No two parts' scratch rows share a 64-byte line (threads storing into them would fight over it)."""
    from gridsampler3d.cpu.jit import part_rows

    rows = part_rows(parts, entries, dtype)
    assert rows.dtype == dtype and rows.shape[0] == parts and rows.shape[1] >= entries and rows.flags.c_contiguous
    for part in range(parts if entries else 0):  # an empty row holds nothing to share
        start = rows[part].ctypes.data
        assert start % 64 == 0 and (rows.shape[1] * rows.itemsize) % 64 == 0, (part, start, rows.shape)


@pytest.mark.slow
def test_offsets_beyond_int32(tmp_path):
    """A volume of more than 2^31 voxels: gathers and scatters at its far corner land exactly."""
    depth, height, width = 1024, 1024, 2049
    assert depth * height * width > 2**31
    # A sparse memory-mapped file: only the pages touched become resident.
    x_array = np.lib.format.open_memmap(
        tmp_path / "x.npy", mode="w+", dtype=np.float32, shape=(1, 1, depth, height, width)
    )
    x_array[0, 0, -1, -1, -1] = 3.0
    x = torch.from_numpy(x_array)
    grid = torch.ones(1, 2, 2, 2, 3)  # every point at the far corner (align_corners: exactly voxel S - 1)
    y = gs.grid_sampler3d(x, grid, "bilinear", "zeros", align_corners=True, backend="numba")
    assert torch.equal(y, torch.full_like(y, 3.0))
    grad = torch.arange(1.0, 9.0).reshape(1, 1, 2, 2, 2)
    dx, dgrid = gs.grid_sampler3d_backward(grad, x, grid, "nearest", "zeros", align_corners=True, backend="numba")
    assert dx[0, 0, -1, -1, -1] == grad.sum()
    assert float(dx.sum()) == float(grad.sum())  # nothing landed anywhere else
    assert not dgrid.any()


def test_a_kernels_disk_cache_entry_is_keyed_by_every_engine_source(monkeypatch):
    """Editing a helper's file (not the kernel's) must not load a kernel compiled with the old helper."""
    from gridsampler3d.cpu import jit

    _, x, grid = make_case(1, 1, (3, 3, 3), (2, 2, 2), torch.float32)
    gs.grid_sampler3d(x, grid, backend="numba")  # bilinear, zeros, align_corners False: compiled or loaded
    kernel = forward_kernel(Sampling(), FieldKind.GRID, False, channels_last=False).part
    signature = kernel.signatures[0]
    codegen = kernel.targetctx.codegen()
    key = kernel._cache._index_key(signature, codegen)
    assert jit._engine_sources() in key
    # Another source text gives another key.
    jit._engine_sources.cache_clear()
    monkeypatch.setattr(jit.pathlib.Path, "read_bytes", lambda path: b"edited " + path.name.encode())
    try:
        assert kernel._cache._index_key(signature, codegen) != key
    finally:
        monkeypatch.undo()
        jit._engine_sources.cache_clear()
    assert kernel._cache._index_key(signature, codegen) == key


@pytest.mark.skipif(plain(), reason="the plain path compiles helpers as Numba does")
def test_helpers_leave_no_machine_code_of_their_own():
    """A helper's code is linked into the kernels that call it; Numba emits none for the helper (cold compile time)."""
    from gridsampler3d.cpu import block

    _, x, grid = make_case(1, 1, (3, 3, 3), (2, 2, 2), torch.float32)
    gs.grid_sampler3d(x, grid, "bilinear", "zeros", backend="numba")
    kernel = forward_kernel(Sampling(), FieldKind.GRID, False, channels_last=False)
    kernel_signature = next(signature for signature in kernel.signatures if _data_dtype(signature) == numba.float32)
    part_kernel(kernel.py_func, cache=False).compile(kernel_signature)  # types the helpers it calls
    signature = next(iter(block.trilinear_cells.overloads))
    fresh = outlined_helper(block.trilinear_cells.py_func, cache=False)
    fresh.compile(signature)
    compiled = fresh.overloads[signature]
    assert compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name) == 0
    assert compiled.library.get_function(compiled.fndesc.llvm_func_name) is not None  # its IR, for linking
