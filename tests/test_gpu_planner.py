"""The GPU engine's planner: its decisions on descriptions of calls alone (no GPU, no kernel), and the plan
``gridsampler3d.explain`` shows for a CUDA call made from shapes alone."""

import dataclasses

import pytest
import torch

import gridsampler3d as gs
from gridsampler3d.gpu.planner import (
    BUCKET_CHUNK,
    TRICUBIC_CHUNK_ENTRIES,
    DxMethod,
    GpuCall,
    Stage,
    make_plan,
)
from gridsampler3d.modes import Interpolation
from gridsampler3d.problem import Gradient
from gridsampler3d.sampling import FieldKind, Outputs, Sampling

LARGE = (128, 128, 128)


def backward(**fields) -> GpuCall:
    return GpuCall(
        **{"stage": Stage.BACKWARD, "batch": 1, "channels": 16, "sizes": LARGE, "out_sizes": LARGE, **fields}
    )


def forward(**fields) -> GpuCall:
    return GpuCall(**{"stage": Stage.FORWARD, "batch": 1, "channels": 16, "sizes": LARGE, "out_sizes": LARGE, **fields})


def test_the_forward_walks_patches_along_the_output_rows_and_is_tuned():
    plan = make_plan(forward())
    assert (plan.tile.block_d, plan.tile.block_h, plan.tile.block_w, plan.tile.block_c) == (1, 1, 128, 1)
    assert plan.tuned and plan.candidates[0] == plan.tile and len(set(plan.candidates)) == len(plan.candidates) > 1
    # A narrow output stacks rows, so that no lane idles.
    narrow = make_plan(forward(out_sizes=(16, 8, 4)))
    assert narrow.tile.block_w == 4 and narrow.tile.block_h * narrow.tile.block_d > 1


def test_channels_last_reads_a_tap_channel_vector_at_once():
    plan = make_plan(forward(channels_adjacent=True))
    assert plan.tile.block_c == 16 and plan.tile.block_w == 32
    assert make_plan(forward(channels=3, channels_adjacent=True)).tile.block_c == 4  # the power of two above


def test_the_interpreter_takes_larger_programs_and_nothing_is_tuned():
    plan = make_plan(forward(interpreted=True, autotune=False, out_sizes=(4, 4, 2048)))
    assert plan.tile.block_w == 8 * 128 and not plan.tuned
    assert "interpreter" in str(plan)


def test_the_fast_backward_adds_dx_by_atomics_in_the_walk():
    plan = make_plan(backward())
    assert (plan.dx, plan.passes.field, plan.walk) == (DxMethod.ATOMIC, Gradient.COMPUTED, True)
    assert plan.tuned and plan.dx_sums == "float32"
    # A channel vector's field gradient sums across lanes: its shape is not tuned, so that it is the same bits
    # in both modes and from run to run.
    vector = make_plan(backward(channels_adjacent=True))
    assert vector.tile.block_c == 16 and not vector.tuned
    assert make_plan(backward(channels_adjacent=True, outputs=Outputs(dx=True, dfield=False))).tuned


def test_the_deterministic_backward_gathers_dx_per_voxel():
    plan = make_plan(backward(deterministic=True))
    assert (plan.dx, plan.passes.field, plan.chunk) == (DxMethod.GATHERED, Gradient.COMPUTED, BUCKET_CHUNK)
    assert plan.gather_tile.block_w == 128 and plan.gather_tuned and not plan.tuned
    assert plan.gather_candidates[0] == plan.gather_tile
    # dx alone: no walk over the points at all
    alone = make_plan(backward(deterministic=True, outputs=Outputs(dx=True, dfield=False)))
    assert not alone.walk and alone.dx == DxMethod.GATHERED


@pytest.mark.parametrize(
    "dtype, fast, deterministic",
    [
        ("float32", "float32", "float32"),
        ("bfloat16", "float32", "float64"),
        ("float16", "float32", "float64"),
        ("float64", "float64", "float64"),
    ],
)
def test_sums_are_in_the_dtypes_precision_and_half_dx_rounds_once(dtype, fast, deterministic):
    assert make_plan(backward(dtype=dtype)).dx_sums == fast
    assert make_plan(backward(dtype=dtype, deterministic=True)).dx_sums == deterministic


def test_float64_sums_the_field_gradient_channel_by_channel():
    plan = make_plan(backward(dtype="float64", channels_adjacent=True))
    assert all(tile.block_c == 1 for tile in plan.candidates) and plan.sums == "float64"


def test_nearest_has_no_field_gradient_pass():
    plan = make_plan(backward(sampling=Sampling.parse("nearest"), deterministic=True))
    assert plan.passes.field == Gradient.ZEROS and not plan.walk and plan.dx == DxMethod.GATHERED
    assert make_plan(backward(sampling=Sampling.parse("nearest"))).walk  # the fast dx's atomics walk


def test_tricubic_runs_its_flat_kernels_and_sorts_taps_for_deterministic_dx():
    plan = make_plan(backward(sampling=Sampling.parse("bicubic"), deterministic=True))
    assert plan.dx == DxMethod.SORTED_TAPS and plan.chunk == TRICUBIC_CHUNK_ENTRIES // 64
    assert plan.tile.block_w == 128 and not plan.candidates
    assert (
        make_plan(backward(sampling=Sampling.parse("bicubic"), dtype="float64", channels_adjacent=True)).tile.block_c
        == 1
    )


def test_nothing_is_tuned_where_the_device_does_not_allow_it():
    assert not make_plan(forward(autotune=False)).tuned
    assert not make_plan(backward(deterministic=True, autotune=False)).gather_tuned


def test_a_plan_reads_as_one_line_and_is_a_value():
    plan = make_plan(backward(deterministic=True, capability=(8, 6)))
    text = str(plan)
    assert text.startswith("backward on cuda sm_86: trilinear") and "\n" not in text and "deterministic" in text
    assert plan == make_plan(backward(deterministic=True, capability=(8, 6)))
    assert hash(plan) == hash(make_plan(backward(deterministic=True, capability=(8, 6))))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.walk = False
    assumed = str(make_plan(backward(capability=(9, 0), capability_assumed=True)))
    assert assumed.startswith("backward on cuda sm_90 (assumed: no GPU here): trilinear")


def test_explain_plans_a_cuda_call_from_shapes_alone():
    """Meta tensors and device="cuda": the plan the engine would make, without a GPU or a kernel."""
    x = torch.empty(2, 16, 64, 64, 64, device="meta").contiguous(memory_format=torch.channels_last_3d)
    grid = torch.empty(2, 32, 32, 32, 3, device="meta")
    grad = torch.empty(2, 16, 32, 32, 32, device="meta")
    plan = gs.explain(x, grid, grad, "bilinear", "border", device="cuda", deterministic=True)
    expected = make_plan(
        backward(
            batch=2,
            sizes=(64, 64, 64),
            out_sizes=(32, 32, 32),
            channels_adjacent=True,
            sampling=Sampling.parse("bilinear", "border"),
            deterministic=True,
            capability=plan.capability,
            capability_assumed=not torch.cuda.is_available(),
            autotune=plan.gather_tuned,
        )
    )
    assert plan == expected
    assert ("(assumed: no GPU here)" in str(plan)) == (not torch.cuda.is_available())
    displacement = torch.empty(1, 3, 24, 24, 24, device="meta")
    volume = torch.empty(1, 1, 24, 24, 24, device="meta")
    warp = gs.explain(volume, displacement, field_kind="displacement", device="cuda")
    assert warp.stage.value == "forward" and warp.tile.block_w == 32


def test_theta_gradient_walks_one_row_a_program_untuned():
    """theta's row moments are each program's sums over one output row: patches one row high, and a fixed shape
    (the partial sums follow block_w), in both modes; nearest's theta gradient is zero without a pass."""
    for deterministic in (False, True):
        plan = make_plan(
            backward(
                field=FieldKind.AFFINE,
                out_sizes=(16, 8, 4),
                outputs=Outputs(True, False, True),
                deterministic=deterministic,
            )
        )
        assert (plan.passes.theta, plan.passes.field, plan.walk) == (Gradient.COMPUTED, Gradient.NONE, True)
        assert plan.tile.block_h == plan.tile.block_d == 1 and not plan.tuned
        assert "theta gradient from the walk's row moments, summed in float64" in str(plan)
    nearest = make_plan(
        backward(
            field=FieldKind.AFFINE_DISPLACEMENT,
            sampling=Sampling(Interpolation.NEAREST),
            outputs=Outputs(False, True, True),
        )
    )
    assert (nearest.passes.theta, nearest.passes.field, nearest.walk) == (Gradient.ZEROS, Gradient.ZEROS, False)
    # a theta gradient asked of a field without theta is not made
    assert make_plan(backward(outputs=Outputs(True, True, True))).passes.theta == Gradient.NONE


@pytest.mark.parametrize(
    "change",
    [
        dict(out_sizes=(64, 128, 128)),
        dict(sizes=(128, 64, 128)),
        dict(batch=4),
        dict(channels=3),
        dict(dtype="float16"),
        dict(channels_adjacent=True),
        dict(field=FieldKind.DISPLACEMENT),
        dict(outputs=Outputs(True, False)),
        dict(deterministic=True),
        dict(sampling=Sampling.parse("bilinear", "border")),
        dict(stage=Stage.FORWARD),
    ],
    ids=lambda change: ",".join(change),
)
def test_the_tuner_keys_its_choice_by_what_can_change_the_best_shape(change):
    """A shape measured on one call is not reused for a call whose sizes, dtype, layout, kind of field, outputs,
    determinism or modes differ (sizes by power-of-two buckets: a call of about the same sizes shares it)."""
    call = backward()
    assert make_plan(dataclasses.replace(call, **change)).tune_key != make_plan(call).tune_key
    nearby = dataclasses.replace(call, out_sizes=(100, 127, 120), sizes=(120, 100, 128))
    assert make_plan(nearby).tune_key == make_plan(call).tune_key
