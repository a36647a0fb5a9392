"""The Triton engine: both backward modes against the golden, determinism, every element written.

Without a GPU the kernels run on CPU tensors through Triton's interpreter (conftest sets
TRITON_INTERPRET=1); the tests marked ``cuda`` need a real GPU and skip cleanly without one.
"""

import dataclasses
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import (
    DTYPE_IDS,
    DTYPES,
    LAYOUTS,
    MATRIX,
    assert_backward_matches,
    assert_forward_matches,
    cancelling_channels_last_case,
    in_rotation,
    make_case,
    matrix_id,
)

import gridsampler3d as gs
from gridsampler3d.backends import BACKENDS
from gridsampler3d.gpu import autotune, gathered, planner
from gridsampler3d.sampling import Gradients

HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
cuda = pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA), reason="needs a CUDA GPU")
DEVICE = "cuda" if HAS_CUDA else "cpu"  # CPU tensors run through the interpreter


def _on(device, *tensors):
    return tuple(t.to(device) for t in tensors)


# The deterministic backward over the attribute x dtype x layout matrix: all of it on a GPU; through the interpreter
# a quarter, in rotation (helpers.in_rotation), another quarter than test_matrix.py's fast mode takes.
DETERMINISTIC_CASES = [
    (attributes, dtype, data_format)
    for attributes in MATRIX
    for dtype in DTYPES
    for data_format in LAYOUTS
    if HAS_CUDA or in_rotation(attributes, dtype, data_format, turn=2)
]


@pytest.mark.parametrize(
    "attributes, dtype, data_format",
    DETERMINISTIC_CASES,
    ids=[f"{matrix_id(a)}-{DTYPE_IDS[d]}-{f}" for a, d, f in DETERMINISTIC_CASES],
)
def test_deterministic_mode_matches_golden(attributes, dtype, data_format):
    mode, padding, align_corners = attributes
    grad, x, grid = _on(DEVICE, *make_case(dtype=dtype, data_format=data_format, seed=MATRIX.index(attributes)))
    label = f"{matrix_id(attributes)} {DTYPE_IDS[dtype]} {data_format} triton deterministic"
    assert_backward_matches(
        grad, x, grid, mode, padding, align_corners, data_format, "triton", label=label, deterministic=True
    )


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
@pytest.mark.parametrize("attributes", MATRIX, ids=matrix_id)
def test_many_points_per_voxel(attributes, deterministic):
    """Output three times finer than the input along each axis: up to 8 * 27 contributions per voxel. One batch item
    (through the interpreter, time goes with the points): test_api.py's odd shapes cover batches."""
    mode, padding, align_corners = attributes
    grad, x, grid = _on(DEVICE, *make_case(1, 5, (3, 4, 3), (9, 11, 10), torch.float32, "NDHWC", seed=7))
    assert_backward_matches(
        grad,
        x,
        grid,
        mode,
        padding,
        align_corners,
        "NDHWC",
        "triton",
        label=f"{matrix_id(attributes)} dense",
        deterministic=deterministic,
    )
    assert_forward_matches(x, grid, mode, padding, align_corners, "NDHWC", "triton", label=matrix_id(attributes))


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
@pytest.mark.parametrize("data_format", ["NCDHW", "NDHWC"])
def test_single_contribution_dx_is_the_golden_rounded_once(data_format, deterministic):
    """Where each voxel receives one product weight * grad, float32 dx is that float64 product rounded once.

    Each point sits in its own cell (cells two voxels apart), so no two points share a tap.
    Rounding the weight to float32 first rounded twice, which moved some of these products
    by an ulp (and a case Hypothesis found, a single grad value of 3.5e16, then failed the
    precision rule against PyTorch).
    """
    generator = torch.Generator().manual_seed(11)
    channels, size = 4, 8
    cells = 2.0 * torch.arange(4, dtype=torch.float64)  # cell corners 0, 2, 4, 6 on each axis
    corner = torch.stack(torch.meshgrid(cells, cells, cells, indexing="ij")[::-1], dim=-1)  # (4, 4, 4, 3) as x, y, z
    index = corner + 0.1 + 0.8 * torch.rand(corner.shape, generator=generator, dtype=torch.float64)
    grid = (2 * index / (size - 1) - 1).unsqueeze(0).float()  # align_corners=True
    x = torch.randn(1, channels, size, size, size, generator=generator).float()
    grad = (1e3 * torch.randn(1, channels, 4, 4, 4, generator=generator, dtype=torch.float64)).float()
    if data_format == "NDHWC":
        x, grad = x.permute(0, 2, 3, 4, 1).contiguous(), grad.permute(0, 2, 3, 4, 1).contiguous()
    dx, _ = gs.grid_sampler3d_backward(
        *_on(DEVICE, grad, x, grid),
        "bilinear",
        "zeros",
        True,
        data_format=data_format,
        backend="triton",
        deterministic=deterministic,
    )
    golden_dx, _ = gs.grid_sampler3d_backward(
        grad.double(),
        x.double(),
        grid.double(),
        "bilinear",
        "zeros",
        True,
        data_format=data_format,
        backend="reference",
    )
    assert torch.equal(dx.cpu(), golden_dx.float())


def _dx_with_tiles(monkeypatch, small, grad, x, grid, deterministic):
    """dx with programs of 4 points or 16 voxels (``small``), or of the engine's usual sizes: another split."""
    if small:
        monkeypatch.setattr(planner, "patch_tile", lambda *_, **__: planner.Tile(block_w=4, num_warps=1))
        monkeypatch.setattr(planner, "flat_tile", lambda *_, **__: planner.Tile(block_w=16))
    try:
        return gs.grid_sampler3d_backward(grad, x, grid, backend="triton", deterministic=deterministic)[0]
    finally:
        monkeypatch.undo()


def test_deterministic_dx_does_not_depend_on_how_work_is_split(monkeypatch):
    """Repeating a run cannot show non-determinism here: the interpreter runs programs (and
    their atomics) in order. Changing how many points each program takes reorders the fast
    mode's additions, as a GPU's scheduling does; the deterministic dx must not move a bit."""
    grad, x, grid = _on(DEVICE, *make_case(1, 2, (3, 3, 3), (4, 5, 6), torch.float32, seed=3))
    fast = [_dx_with_tiles(monkeypatch, small, grad, x, grid, False) for small in (True, False)]
    assert not torch.equal(*fast), "the case must be sensitive to the order of additions"
    exact = [_dx_with_tiles(monkeypatch, small, grad, x, grid, True) for small in (True, False)]
    assert torch.equal(*exact)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
def test_cuda_deterministic_mode_is_bitwise_reproducible(dtype):
    grad, x, grid = _on("cuda", *make_case(1, 6, (4, 5, 6), (12, 10, 11), dtype, seed=3))
    first = gs.grid_sampler3d_backward(grad, x, grid, backend="triton", deterministic=True)
    for _ in range(3):
        again = gs.grid_sampler3d_backward(grad, x, grid, backend="triton", deterministic=True)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("dtype, bits", [(torch.float16, 10), (torch.bfloat16, 7)], ids=["f16", "bf16"])
def test_deterministic_half_dx_is_summed_in_float64_and_rounded_once(dtype, bits):
    """Three points add 1, 2^-(bits+1) (half an ulp of 1) and 2^-24 * 2^-6 into voxel 0.

    The exact sum lies just above the tie between 1 and 1 + 2^-bits, so it rounds up. A
    float32 sum loses the last term (far below float32's ulp of 1) and lands on the tie,
    which rounds to even: 1. So does float64 rounded to float32 first."""
    side = 2  # align_corners: index = (g + 1) / 2
    grid = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [1 - 2.0**-5, -1.0, -1.0]])  # the last: index 1 - 2^-6
    grad = torch.tensor([1.0, 2.0 ** -(bits + 1), 2.0**-24])
    grid, grad = grid.view(1, 1, 1, 3, 3).to(dtype), grad.view(1, 1, 1, 1, 3).to(dtype)
    x = torch.zeros(1, 1, side, side, side, dtype=dtype)
    grad, x, grid = _on(DEVICE, grad, x, grid)
    dx, _ = gs.grid_sampler3d_backward(grad, x, grid, "bilinear", "zeros", True, backend="triton", deterministic=True)
    assert dx[0, 0, 0, 0, 0].item() == 1 + 2.0**-bits


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_deterministic_dx_sums_long_buckets_in_chunks(monkeypatch, mode):
    """Border padding of a grid far outside piles points into the corner cells. Buckets longer
    than the chunk size (4 here) are summed as partial sums of 4 points, then chunk by chunk."""
    monkeypatch.setattr(planner, "BUCKET_CHUNK", 4)
    chunked = []
    chunks = gathered.chunks
    monkeypatch.setattr(gathered, "chunks", lambda *args: chunked.append(chunks(*args)) or chunked[-1])
    grad, x, grid = _on(DEVICE, *make_case(1, 3, (3, 4, 3), (5, 6, 7), torch.float32, seed=9, low=-3.0, high=3.0))
    dx, _ = assert_backward_matches(
        grad, x, grid, mode, "border", False, backend="triton", label="chunked", deterministic=True
    )
    assert chunked[0] is not None and chunked[0][1].numel() > 10
    again, _ = gs.grid_sampler3d_backward(grad, x, grid, mode, "border", backend="triton", deterministic=True)
    assert torch.equal(dx, again)


def test_dgrid_is_the_same_in_both_modes():
    grad, x, grid = _on(DEVICE, *make_case(2, 4, (5, 6, 7), (6, 5, 4), torch.float32, seed=5))
    _, fast = gs.grid_sampler3d_backward(grad, x, grid, backend="triton", deterministic=False)
    _, exact = gs.grid_sampler3d_backward(grad, x, grid, backend="triton", deterministic=True)
    assert torch.equal(fast, exact)


def test_tuner_keeps_the_fastest_shape_per_key():
    seconds = {"a": 3.0, "b": 1.0, "c": 2.0}
    timed = []

    def timer(run, repeats):
        run()
        return seconds[timed[-1]]

    tuner = autotune.Tuner(timer=timer)
    assert tuner.choose("k", ["a", "b", "c"], timed.append) == "b"
    assert timed == ["a", "b", "c"]
    assert tuner.choose("k", ["a", "b", "c"], timed.append) == "b" and len(timed) == 3  # remembered, not re-timed
    assert tuner.choose("other", ["a", "b", "c"], timed.append, tune=False) == "a" and len(timed) == 3
    assert tuner.report()[0]["chosen"] == "b" and [c["ms"] for c in tuner.report()[0]["candidates"]] == [3e3, 1e3, 2e3]
    assert not autotune.enabled(torch.device("cpu"))


def test_tuning_is_off_when_switched_off_or_while_a_cuda_graph_is_captured(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    capturing = []
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: bool(capturing))
    assert autotune.enabled(torch.device("cuda"))
    capturing.append(True)
    assert not autotune.enabled(torch.device("cuda"))
    capturing.clear()
    monkeypatch.setenv(autotune.ENVIRONMENT_VARIABLE, "0")
    assert not autotune.enabled(torch.device("cuda"))


@pytest.mark.parametrize("candidate", [0, 1, 2, 3])
def test_no_tuning_candidate_changes_a_result(monkeypatch, candidate):
    """Every shape the tuner may pick gives the same bits: forward, and dx of the deterministic mode."""
    from gridsampler3d.gpu import engine

    used = []

    def with_candidate(call):
        plan = planner.make_plan(call)
        tile = plan.candidates[min(candidate, len(plan.candidates) - 1)] if plan.candidates else plan.tile
        gather = (
            plan.gather_candidates[min(candidate, len(plan.gather_candidates) - 1)]
            if plan.gather_candidates
            else plan.gather_tile
        )
        used.append((plan.stage, tile == plan.tile, gather == plan.gather_tile))
        return dataclasses.replace(plan, tile=tile, gather_tile=gather)

    outputs = {}
    for data_format in ("NCDHW", "NDHWC"):
        grad, x, grid = _on(
            DEVICE, *make_case(1, 5, (4, 5, 6), (5, 6, 7), torch.float32, data_format, seed=4, low=-1.5, high=1.5)
        )
        for patched in (False, True):
            if patched:
                monkeypatch.setattr(engine, "make_plan", with_candidate)
            y = gs.grid_sampler3d(x, grid, data_format=data_format, backend="triton")
            dx, dgrid = gs.grid_sampler3d_backward(
                grad, x, grid, data_format=data_format, backend="triton", deterministic=True
            )
            outputs[data_format, patched] = (y, dx, dgrid)
            monkeypatch.undo()
        assert all(torch.equal(a, b) for a, b in zip(outputs[data_format, False], outputs[data_format, True]))
    if candidate:  # another shape than the plan's own ran, forward and backward
        assert any(stage == planner.Stage.FORWARD and not same for stage, same, _ in used)
        assert any(stage == planner.Stage.BACKWARD and not same_gather for stage, _, same_gather in used)


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
def test_tuned_launches_give_the_golden(monkeypatch, deterministic):
    """With tuning on, each candidate runs on the real operands before the chosen one: an output
    accumulated into (the fast mode's atomic dx) must start from zero again."""
    monkeypatch.setattr(autotune, "enabled", lambda device: True)
    calls = []

    def timer(run, repeats):
        run()
        calls.append(run)
        return 1.0 / len(calls)  # the last candidate looks fastest

    monkeypatch.setattr(autotune, "TUNER", autotune.Tuner(timer=timer))
    grad, x, grid = _on(DEVICE, *make_case(1, 3, (4, 5, 6), (5, 6, 7), torch.float32, seed=8))
    assert_forward_matches(x, grid, backend="triton", label="tuned")
    assert_backward_matches(grad, x, grid, backend="triton", label="tuned", deterministic=deterministic)
    tuned = {entry["key"][0]: entry for entry in autotune.TUNER.report()}
    assert set(tuned) == ({"forward", "dx_gather"} if deterministic else {"forward", "backward"})
    # keyed by what can change the best shape: the modes, the dtype, the output's sizes (bucketed), ...
    assert all({"bilinear", "zeros", "float32", "(8, 8, 8)"} <= set(entry["key"]) for entry in tuned.values())
    assert all(entry["chosen"] == entry["candidates"][-1]["shape"] for entry in tuned.values())


def test_deterministic_none_follows_torch_flag(monkeypatch):
    from gridsampler3d.gpu import engine

    calls = []
    original = engine.gathered_dx

    def spy(*args, **kwargs):
        calls.append(True)
        return original(*args, **kwargs)

    monkeypatch.setattr(engine, "gathered_dx", spy)
    grad, x, grid = _on(DEVICE, *make_case(1, 2, (4, 4, 4), (3, 3, 3), torch.float32))
    gs.grid_sampler3d_backward(grad, x, grid, backend="triton")
    assert not calls
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        gs.grid_sampler3d_backward(grad, x, grid, backend="triton")
    finally:
        torch.use_deterministic_algorithms(previous)
    assert calls


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_every_output_element_is_written(monkeypatch, mode, deterministic):
    """Outputs are allocated NaN-poisoned; any element a kernel misses shows up against the golden."""
    for name in ("empty", "empty_like"):
        allocate = getattr(torch, name)

        def poisoned(*args, _allocate=allocate, **kwargs):
            tensor = _allocate(*args, **kwargs)
            return tensor.fill_(float("nan")) if tensor.is_floating_point() else tensor

        monkeypatch.setattr(torch, name, poisoned)
    # Points crowd into one corner: most voxels of dx receive nothing and must still be written (zeros).
    grad, x, grid = make_case(2, 3, (6, 5, 7), (4, 3, 5), torch.float32, seed=11, low=-1.0, high=-0.6)
    grad, x, grid = _on(DEVICE, grad, x, grid)
    assert_backward_matches(
        grad, x, grid, mode, "zeros", False, backend="triton", label="poisoned", deterministic=deterministic
    )
    assert_forward_matches(x, grid, mode, "zeros", False, backend="triton", label="poisoned")


def test_unavailable_reason_is_clear_without_gpu_or_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reason = BACKENDS["triton"].unavailable_reason()
    assert reason is not None and "TRITON_INTERPRET" in reason


def _compile_inputs() -> str:
    """A digest of everything the sm_90 compile's findings depend on: the package's sources, the script, the
    versions of Python, PyTorch and Triton, and Triton's settings in the environment."""
    script = Path(__file__).with_name("gpu_compile.py")
    package = Path(gs.__file__).parent
    digest = hashlib.sha256()
    sources = {script.name: script} | {path.relative_to(package).as_posix(): path for path in package.rglob("*.py")}
    for name, path in sorted(sources.items()):
        digest.update(f"{name}\0".encode())
        digest.update(path.read_bytes())
    for distribution in ("torch", "triton"):
        digest.update(f"{distribution} {importlib.metadata.version(distribution)}\0".encode())
    digest.update(sys.version.encode())
    for key in sorted(os.environ):  # Triton's settings, but the interpreter's switch (the compile runs without)
        if key.startswith("TRITON_") and key != "TRITON_INTERPRET":
            digest.update(f"{key}={os.environ[key]}\0".encode())
    return digest.hexdigest()


# Where the findings are kept between runs (pytest's cache, .pytest_cache/; `pytest --cache-clear` empties it).
COMPILE_FINDINGS = "gridsampler3d/gpu-compile"


@pytest.fixture(scope="module")
def compiled(request, tmp_path_factory):
    """What tests/gpu_compile.py finds in each kernel compiled for sm_90 (no GPU needed), in a clean process.

    The interpreter skips the compiler, so what only generated code shows is checked here.
    The compile takes about two minutes on two cores; its findings are kept in pytest's cache
    under a digest of everything they depend on (:func:`_compile_inputs`), and a later run
    reuses them only while that digest is the same: an edited source, script or version
    compiles again, and so does every run on a clean checkout (CI)."""
    inputs = _compile_inputs()
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    kept = cache.get(COMPILE_FINDINGS, None) if cache else None
    if kept and kept.get("inputs") == inputs:
        return kept["records"]
    # Under pytest-xdist the first worker to need a compile runs it
    # and the others wait for its findings, in the run's shared temporary directory
    # (a worker's own is a subdirectory of it; without xdist, the run's own).
    run_directory = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run_directory = run_directory.parent
    findings = run_directory / "gpu-compile-kernels.json"
    with open(run_directory / "gpu-compile.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not findings.exists():
            environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
            environment["TRITON_DEFAULT_FP_FUSION"] = "1"
            script = Path(__file__).with_name("gpu_compile.py")
            partial = findings.with_suffix(".partial")
            result = subprocess.run(
                [sys.executable, str(script), "--json", str(partial)],
                env=environment,
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
            partial.rename(findings)
    records = json.loads(findings.read_text())
    if cache:
        cache.set(COMPILE_FINDINGS, {"inputs": inputs, "records": records})
    return records


def test_compile_findings_are_reused_only_for_the_same_inputs(tmp_path, monkeypatch):
    """The digest the kept findings are filed under changes with any source of the package and with Triton's
    settings, and with nothing else."""
    package = tmp_path / "gridsampler3d"
    shutil.copytree(Path(gs.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    first = _compile_inputs()
    monkeypatch.setattr(gs, "__file__", str(package / "__init__.py"))
    assert _compile_inputs() == first  # the same sources elsewhere
    helper = package / "gpu" / "coords.py"
    helper.write_text(helper.read_text() + "\n")
    edited = _compile_inputs()
    assert edited != first
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))  # a value no other run had
    assert _compile_inputs() != edited


@pytest.mark.slow
def test_every_kernel_compiles_for_a_gpu(compiled):
    from gridsampler3d.gpu import backward, bicubic, forward

    kernels = {name for module in (forward, backward, bicubic) for name in vars(module) if name.endswith("_kernel")}
    assert {record["kernel"] for record in compiled} == kernels


@pytest.mark.slow
def test_size_products_and_offsets_are_int64(compiled):
    """Integer kernel arguments arrive as int32; a product of two (1300^3 voxels) must not wrap."""
    wrapping = {
        f"{record['kernel']} {record['constants']}": record["int32_multiplies"]
        for record in compiled
        if record["int32_multiplies"]
    }
    assert not wrapping


@pytest.mark.slow
def test_reflection_remainder_is_an_exact_fmod(compiled):
    """Compiled, % on floats is x - trunc(x / y) * y: negative just below k * span. libdevice's fmod is exact."""
    reflecting = [record for record in compiled if "RULE.padding=2" in record["constants"]]
    assert reflecting
    for record in compiled:
        assert record["float_remainders"]["remf"] == 0, record["kernel"]
    for record in reflecting:
        assert record["float_remainders"]["fmod"] > 0, record["kernel"]


@pytest.mark.slow
def test_half_deterministic_dx_is_rounded_once_from_float64(compiled):
    """The gather's float64 sum is converted straight to the half type (one rounding), never through float32."""
    gathers = [
        record
        for record in compiled
        if record["kernel"] == "dx_gather_kernel" and record["pointers"]["dx"] in ("fp16", "bf16")
    ]
    assert {record["pointers"]["dx"] for record in gathers} == {"fp16", "bf16"}
    for record in gathers:
        half = "f16" if record["pointers"]["dx"] == "fp16" else "bf16"
        assert f"cvt.rn.{half}.f64" in record["conversions"], record["conversions"]
        assert "cvt.rn.f32.f64" not in record["conversions"], record["conversions"]


def test_check_judges_each_triton_mode_against_the_golden(monkeypatch):
    """`gridsampler3d check` runs Triton's backward fast and deterministic and judges each on its own: both pass
    against the golden, and a fault in the deterministic mode's dx fails that mode's rows alone."""
    from gridsampler3d.tools.commands import check

    for attribute, values in (
        ("MODES", ("bilinear",)),
        ("PADDINGS", ("border",)),
        ("ALIGN_CORNERS", (False,)),
        ("LAYOUTS", ("NCDHW",)),
    ):
        monkeypatch.setattr(check, attribute, values)  # one case per dtype: the interpreter is slow
    rows = check.run_check(DEVICE, backends=["triton"], quick=True, echo=lambda line: None)
    assert sorted(row["backend"] for row in rows) == ["triton/det"] * 2 + ["triton/fast"] * 2
    assert all(row["passed"] for row in rows), [row["failures"] or row["error"] for row in rows]

    triton = BACKENDS["triton"]
    backward = triton.backward

    def deterministic_dx_off_by_a_little(*arguments):
        dx, dgrid, dtheta = backward(*arguments)
        deterministic = arguments[-1]
        return Gradients(dx * 1.01 if deterministic else dx, dgrid, dtheta)

    monkeypatch.setattr(triton, "backward", deterministic_dx_off_by_a_little)
    rows = check.run_check(DEVICE, backends=["triton"], quick=True, echo=lambda line: None)
    assert all(row["passed"] == (row["backend"] == "triton/fast") for row in rows), rows
    assert all(failure.startswith("dx: FAIL") for row in rows for failure in row["failures"])


@pytest.mark.slow
@pytest.mark.skipif(HAS_CUDA, reason="the dry run is for machines without a GPU")
def test_device_check_dry_run_writes_every_phase(tmp_path):
    """benchmarks/gpu_check.py through the interpreter at tiny sizes: every phase runs and is written."""
    script = Path(__file__).parents[1] / "benchmarks" / "gpu_check.py"
    environment = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            "--device",
            "cpu",
            "--scale",
            "0.03",
            "--budget",
            "20",  # the speed phase's two cases, some correctness cases, the determinism phase: about 25 s
            "--cases",
            "reg256,warp256",
            "--out",
            str(tmp_path),
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["phases_done"] == ["machine", "speed", "registers", "correctness", "determinism"]
    assert [row["case"] for row in report["speed"]] == ["reg256", "warp256"]
    for row in report["speed"]:
        assert "error" not in row, row
        assert set(row["times_ms"]) >= {
            "fwd_ours",
            "bwd_fast",
            "bwd_det",
            "bwd_fast_dx",
            "bwd_det_dx",
            "bwd_fast_dgrid",
            "bwd_torch_dgrid",
        }
    assert report["correctness"]["checked"] >= 2 and not report["correctness"]["failures"]
    assert report["determinism"]["deterministic_bitwise"]
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| reg256 |" in table and "| warp256 |" in table


@cuda
def test_auto_uses_triton_on_cuda():
    assert gs.backends.select_backend("auto", torch.device("cuda")).name == "triton"


@cuda
@pytest.mark.parametrize("data_format", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("attributes", MATRIX, ids=matrix_id)
def test_cuda_fast_mode_matches_golden(attributes, dtype, data_format):
    mode, padding, align_corners = attributes
    grad, x, grid = _on("cuda", *make_case(2, 16, (9, 10, 11), (12, 8, 9), dtype, data_format, seed=1))
    label = f"{matrix_id(attributes)} {DTYPE_IDS[dtype]} {data_format} cuda fast"
    assert_backward_matches(
        grad, x, grid, mode, padding, align_corners, data_format, "triton", label=label, deterministic=False
    )
    assert_forward_matches(x, grid, mode, padding, align_corners, data_format, "triton", label=label)


@cuda
def test_cuda_runs_under_deterministic_algorithms():
    grad, x, grid = _on("cuda", *make_case(1, 8, (16, 16, 16), (24, 24, 24), torch.float32, seed=2))
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first = gs.grid_sampler3d_backward(grad, x, grid)
        again = gs.grid_sampler3d_backward(grad, x, grid)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


@cuda
@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
def test_cuda_offsets_beyond_int32(deterministic):
    """A float32 volume of 1300^3 = 2.2e9 voxels (8.8 GB): gathers and scatters at its far corner."""
    side = 1300
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs about 30 GiB of GPU memory")
    x = torch.zeros(1, 1, side, side, side, device="cuda")
    corner = torch.arange(1, 9, dtype=torch.float32, device="cuda").view(2, 2, 2)
    x[0, 0, -2:, -2:, -2:] = corner
    centres = torch.tensor([(2 * index + 1) / side - 1 for index in (side - 2, side - 1)], dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(centres, centres, centres, indexing="ij"), dim=-1).flip(-1)
    grid = grid.to(torch.float32).cuda().unsqueeze(0)  # (1, 2, 2, 2, 3): the last 2x2x2 voxel centres
    y = gs.grid_sampler3d(x, grid)
    # The float32 centres (2i + 1) / 1300 - 1 unnormalise to i plus a few float32 ulps of
    # 1300, so each weight is 1 only to about 1e-4: 1e-3 still tells a right voxel from a wrong one.
    assert torch.allclose(y[0, 0], corner, atol=1e-3)
    dx, dgrid = gs.grid_sampler3d_backward(torch.ones_like(y), x, grid, deterministic=deterministic)
    assert torch.allclose(dx[0, 0, -2:, -2:, -2:], torch.ones_like(corner), atol=1e-3)
    assert dx.sum().item() == pytest.approx(8.0, abs=1e-3)
    assert torch.isfinite(dgrid).all()
    del x, dx


def test_channels_last_grid_gradient_cancels_as_pytorch_does():
    """Constant x: every grid gradient is exactly 0, as PyTorch's channels-outer sums give it, with
    grad channels 14 orders apart. Summing each tap's channel vector first left a residue."""
    grad, x, grid = cancelling_channels_last_case()
    assert_backward_matches(
        grad,
        x,
        grid,
        "bilinear",
        "reflection",
        True,
        data_format="NDHWC",
        backend="triton",
        label="channels-last cancellation",
        deterministic=False,
    )
