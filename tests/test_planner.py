"""The CPU engine's planner: its decisions on descriptions of calls alone (no kernel runs), and the plan the engine
runs being the one :func:`gridsampler3d.explain` shows."""

import dataclasses
import math

import pytest
import torch

import gridsampler3d as gs
from gridsampler3d.cpu import executors, tuning
from gridsampler3d.cpu.planner import Call, DxPass, GridPass, Stage, Strategy, facts_needed, make_plan
from gridsampler3d.sampling import FieldKind, Outputs, Sampling
from gridsampler3d.tools import inputs
from gridsampler3d.tools.bench.suite import SUITE, WARP_SUITE, build_inputs

# Enough output values to run on several threads (tuning.PARALLEL_VALUES), and planes that outgrow the cache on
# one thread (tuning.SERIAL_ITEM_BYTES), even with one channel.
LARGE = (64, 64, 64)


def backward(**fields) -> Call:
    fields = {
        "batch": 1,
        "channels": 4,
        "sizes": LARGE,
        "out_sizes": LARGE,
        "smooth": True,
        "grad_finite": True,
        **fields,
    }
    return Call(stage=Stage.BACKWARD, **fields)


def forward(**fields) -> Call:
    fields = {"batch": 1, "channels": 4, "sizes": LARGE, "out_sizes": LARGE, "smooth": True, **fields}
    return Call(stage=Stage.FORWARD, **fields)


def test_a_small_call_runs_on_the_calling_thread():
    small = backward(sizes=(8, 8, 8), out_sizes=(8, 8, 8), channels=2, threads=2)
    assert small.points * small.channels < tuning.PARALLEL_VALUES
    assert make_plan(small).threads == 1
    assert make_plan(backward(threads=2)).threads == 2


def test_one_thread_walks_a_smooth_grid_once_for_both_outputs():
    plan = make_plan(backward(threads=1, channels=1))
    assert plan.strategy == Strategy.FUSED and plan.dx_parts == 1
    # Many channels: a pass per output (one walk over every channel's taps outgrows the caches)
    many = make_plan(backward(threads=1, channels=tuning.FUSED_CHANNELS))
    assert many.strategy == Strategy.PASSES and (many.grid_pass, many.dx_pass) == (GridPass.ROWS, DxPass.SLABS)


def test_one_thread_walks_a_batch_of_volumes_that_fit_the_cache_once():
    """On one thread, a call whose every batch item's planes (x's and dx's) fit tuning.SERIAL_ITEM_BYTES takes the
    one walk at any size, reading no fact about the data; larger items, or several threads, are planned."""
    crops = backward(batch=64, channels=2, sizes=(16, 16, 16), out_sizes=(16, 16, 16), threads=1, smooth=None)
    assert crops.points * crops.channels >= tuning.PARALLEL_VALUES  # not small by its values
    assert make_plan(crops).strategy == Strategy.SERIAL and facts_needed(crops) == frozenset({"grad_finite"})
    assert make_plan(dataclasses.replace(crops, threads=2, smooth=True)).strategy == Strategy.BESIDE
    # 32³ float32 planes of x and dx: 1 MiB for four channels, more for five; float64 fits half the channels
    edge = backward(batch=4, channels=4, sizes=(32, 32, 32), threads=1)
    assert 2 * 4 * 32**3 * 4 == tuning.SERIAL_ITEM_BYTES
    assert make_plan(edge).strategy == Strategy.SERIAL
    assert make_plan(dataclasses.replace(edge, channels=5)).strategy != Strategy.SERIAL
    assert make_plan(dataclasses.replace(edge, channels=2, dtype="float64")).strategy == Strategy.SERIAL
    assert make_plan(dataclasses.replace(edge, channels=3, dtype="float64")).strategy != Strategy.SERIAL
    forward_crops = forward(batch=64, channels=2, sizes=(16, 16, 16), out_sizes=(16, 16, 16), threads=1)
    assert make_plan(forward_crops).strategy == Strategy.SERIAL
    assert make_plan(backward(threads=1, channels=1)).strategy == Strategy.FUSED  # 64³: 2 MiB an item


def test_several_threads_put_dx_beside_the_grid_gradient():
    for threads in (2, 3, 4):
        plan = make_plan(backward(threads=threads))
        assert plan.strategy == Strategy.BESIDE and plan.dx_parts == threads - threads // 2
        # runs of at least RUN_VALUES output values, one per thread at least
        assert plan.runs == max(threads, min(tuning.SHARED_RUNS * threads, math.prod(LARGE) * 4 // tuning.RUN_VALUES))


def test_a_random_grid_with_many_channels_runs_channel_groups():
    # 64³ float32 planes of 1 MiB: a group is SCATTER_CACHE_BYTES of them
    call = backward(sizes=(64, 64, 64), channels=16, smooth=False, threads=2)
    plan = make_plan(call)
    group = tuning.SCATTER_CACHE_BYTES // (64**3 * 4)
    assert plan.strategy == Strategy.PASSES and plan.grid_pass == GridPass.CHANNEL_GROUPS
    assert plan.dx_pass == DxPass.CHANNEL_GROUPS and plan.channel_group == plan.grid_channel_group == group
    assert plan.carry_rows * 24 * 32 <= tuning.CARRY_BYTES
    # float64 planes are twice the bytes: half the channels a group
    assert make_plan(dataclasses.replace(call, dtype="float64")).channel_group == group // 2
    # channels-last data cannot take channel groups
    last = make_plan(dataclasses.replace(call, channels_last=True))
    assert (last.grid_pass, last.dx_pass) == (GridPass.ROWS, DxPass.SLABS)
    forward_plan = make_plan(forward(sizes=(64, 64, 64), channels=16, smooth=False, threads=2))
    assert forward_plan.strategy == Strategy.CHANNEL_GROUPS and forward_plan.channel_group == group
    assert make_plan(forward(sizes=(64, 64, 64), channels=16, smooth=True, threads=2)).strategy == Strategy.ROWS


def test_dx_alone_on_two_threads_takes_channel_halves():
    plan = make_plan(backward(threads=2, outputs=Outputs(dx=True, dfield=False)))
    assert (plan.strategy, plan.grid_pass, plan.dx_pass, plan.dx_parts) == (
        Strategy.PASSES,
        GridPass.NONE,
        DxPass.CHANNEL_HALVES,
        2,
    )
    one_channel = make_plan(backward(threads=2, outputs=Outputs(dx=True, dfield=False), channels=1))
    assert one_channel.dx_pass == DxPass.SLABS and one_channel.dx_parts == 2


def test_nearest_has_no_grid_gradient_pass():
    plan = make_plan(backward(sampling=Sampling.parse("nearest", "reflection"), threads=2))
    assert plan.grid_pass == GridPass.ZEROS and plan.dx_pass != DxPass.NONE
    assert "grad_finite" not in facts_needed(backward(sampling=Sampling.parse("nearest")))


def test_the_grid_gradient_sums_pytorchs_terms_for_float64_and_non_finite_grad():
    assert make_plan(backward(dtype="float64", grad_finite=None)).pytorch_terms
    assert make_plan(backward(grad_finite=False)).pytorch_terms
    assert not make_plan(backward(grad_finite=True)).pytorch_terms
    assert "grad_finite" not in facts_needed(backward(dtype="float64"))
    assert "grad_finite" not in facts_needed(backward(outputs=Outputs(dx=True, dfield=False)))


@pytest.mark.parametrize(
    "dtype, channels, copies",
    [
        ("float32", tuning.COPIED_CHANNELS, True),
        ("float32", tuning.COPIED_CHANNELS - 1, False),
        ("bfloat16", tuning.COPIED_HALF_CHANNELS, True),
        ("float64", 64, False),
    ],
)
def test_many_channel_ncdhw_backwards_run_on_channels_last_copies(dtype, channels, copies):
    plan = make_plan(backward(dtype=dtype, channels=channels, threads=2))
    assert plan.copies is copies and plan.channels_last is copies
    # never for a random grid, a strided operand, or half data's dx alone
    assert not make_plan(backward(dtype=dtype, channels=channels, threads=2, smooth=False)).copies
    assert not make_plan(backward(dtype=dtype, channels=channels, threads=2, dense_ncdhw=False)).copies
    assert not make_plan(backward(dtype="float16", channels=64, outputs=Outputs(dx=True, dfield=False))).copies


def test_short_rows_are_walked_several_at_a_time():
    call = forward(batch=60, out_sizes=(4, 6, 20), threads=1)  # enough values for two threads
    assert make_plan(call).rows_joined == 6
    assert make_plan(dataclasses.replace(call, threads=2)).rows_joined == 3
    assert make_plan(dataclasses.replace(call, rows_joinable=False)).rows_joined == 1
    assert make_plan(dataclasses.replace(call, field=FieldKind.DISPLACEMENT)).rows_joined == 1


def test_the_verdict_is_needed_only_where_the_plan_reads_it():
    assert facts_needed(forward(channels_last=True, channels=64)) == frozenset()
    assert facts_needed(forward(channels=1)) == frozenset()  # one plane fits: no channel groups
    assert "smooth" in facts_needed(forward(sizes=(64, 64, 64), channels=16))
    assert "smooth" in facts_needed(backward(threads=2))
    assert facts_needed(backward(sampling=Sampling.parse("bicubic"))) == frozenset()
    with pytest.raises(ValueError, match="smooth"):
        make_plan(backward(threads=2, smooth=None))


def test_bicubic_runs_its_own_kernels():
    plan = make_plan(backward(sampling=Sampling.parse("bicubic"), threads=2, outputs=Outputs(dx=True, dfield=False)))
    assert plan.strategy == Strategy.BICUBIC and plan.dx_pass == DxPass.SLABS and plan.grid_pass == GridPass.NONE


def test_a_plan_reads_as_one_line_and_is_a_value():
    plan = make_plan(backward(threads=2))
    text = str(plan)
    assert text.startswith("backward beside, 2 threads") and "\n" not in text
    assert plan == make_plan(backward(threads=2)) and hash(plan) == hash(make_plan(backward(threads=2)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.threads = 3


def _captured(monkeypatch):
    """The plans the engine runs, in order."""
    plans = []
    for name in ("run_forward", "run_backward"):
        original = getattr(executors, name)

        def spy(work, original=original):
            plans.append(work.plan)
            return original(work)

        monkeypatch.setattr(f"gridsampler3d.cpu.engine.{name}", spy)
    return plans


@pytest.mark.parametrize("case", [*SUITE, *WARP_SUITE], ids=lambda case: case.name)
def test_explain_shows_the_plan_the_engine_runs(case, monkeypatch, threads):
    """For each bench case's shape (scaled down), explain's plan is the one the call then executes."""
    threads(2)
    scale = 0.25
    (grad, x, field), _ = build_inputs(case, "cpu", scale)
    attributes = dict(
        interpolation_mode=case.mode,
        padding_mode=case.padding,
        align_corners=case.align_corners,
        data_format=case.layout,
    )
    warp = case.baseline == "plumbing"
    kind = "displacement" if warp else "grid"
    explained = [
        gs.explain(x, field, field_kind=kind, **attributes),
        gs.explain(x, field, grad, field_kind=kind, **attributes),
    ]
    plans = _captured(monkeypatch)
    if warp:
        gs.warp3d(x, field, case.mode, case.padding, case.align_corners, backend="numba")
        gs.warp3d_backward(grad, x, field, case.mode, case.padding, case.align_corners, backend="numba")
    else:
        gs.grid_sampler3d(x, field, backend="numba", **attributes)
        gs.grid_sampler3d_backward(grad, x, field, backend="numba", **attributes)
    assert plans == explained


def test_explain_refuses_what_it_cannot_plan():
    x, grid = torch.zeros(1, 1, 4, 4, 4), inputs.warp_grid(1, 4)
    with pytest.raises(ValueError, match="grid"):
        gs.explain(x, grid[..., :2])
    with pytest.raises(ValueError, match="mode"):
        gs.explain(x, grid, interpolation_mode="cubic-ish")


# The huge grad below overflows NumPy's sum on purpose, and NumPy says so; guarding every call's sum
# with np.errstate against such a grad would cost more than the sum (3 us against 2 at 8^3).
@pytest.mark.filterwarnings("ignore:overflow encountered in reduce:RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("size", [8, 48], ids=["numpy-sum", "torch-sum"])
def test_grad_is_finite_exactly_when_every_element_is(dtype, size):
    """The fact is about the elements, whichever way the sum is taken (NumPy below PARALLEL_VALUES values, torch
    above): a finite grad whose sum overflows is finite; one inf or NaN anywhere is not."""
    from gridsampler3d.cpu.engine import _finite

    grad = torch.ones(1, 1, size, size, size, dtype=dtype)
    assert (grad.numel() < tuning.PARALLEL_VALUES) == (size == 8)
    assert _finite(grad)
    huge = torch.full_like(grad, torch.finfo(dtype).max)
    assert _finite(huge) and not torch.isfinite(huge.float().sum())  # the sum overflows; every element is finite
    for bad in (float("inf"), float("-inf"), float("nan")):
        spoilt = grad.clone()
        spoilt[0, 0, -2, -1, 0] = bad  # in the strided view below too
        assert not _finite(spoilt)
        assert not _finite(spoilt[:, :, ::2])  # a strided view, read in place


def test_a_plan_kept_for_a_call_follows_a_change_of_tuning(monkeypatch):
    """The engine keeps each call's plan for the next like it; a changed tuning constant plans afresh."""
    x, grid = torch.zeros(1, 2, 8, 8, 8), inputs.warp_grid(1, 8)
    grad = torch.zeros(1, 2, 8, 8, 8)
    assert gs.explain(x, grid, grad).strategy == Strategy.SERIAL
    monkeypatch.setattr(tuning, "PARALLEL_VALUES", 1)
    assert gs.explain(x, grid, grad).strategy != Strategy.SERIAL
