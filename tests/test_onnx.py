"""ONNX export (gridsampler3d/onnx.py): export with both exporters, run in onnxruntime's CPU provider, compare.

Expected values are the float64 golden (the reference backend, which is PyTorch's float64
result bit for bit) or, where a model is run as a whole, the model itself in PyTorch.
"""

import pytest
import torch
import torch.nn.functional as F
from helpers import MATRIX, make_case, make_warp_case

import gridsampler3d as gs
from gridsampler3d import onnx as gs_onnx

for _module in ("onnx", "onnxruntime", "onnxscript"):
    pytest.importorskip(_module, reason=f"ONNX export needs {_module} (the 'onnx' extra: pip install -e '.[onnx]')")

import onnx  # noqa: E402
import onnxruntime  # noqa: E402

# dynamo=False asks for the TorchScript exporter on purpose, which torch 2.9 and later deprecate.
pytestmark = [
    pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export"),
    pytest.mark.filterwarnings("ignore:The feature will be removed:DeprecationWarning"),
]

EXPORTERS = [pytest.param(True, id="dynamo"), pytest.param(False, id="torchscript")]
# float32 through ONNX against the float64 golden: GridSample unnormalises in float32, and the
# fused warp's positions take a round trip through normalised coordinates.
TOLERANCE = 1e-4
# How close to a half voxel a coordinate must be for nearest to round it either way in float32.
TIE_BAND = 1e-4


class Sampler(torch.nn.Module):
    """The given calls of a gridsampler3d function, one output each: one export covers them all."""

    def __init__(self, function, cases, **options):
        super().__init__()
        self.function, self.cases, self.options = function, list(cases), options

    def forward(self, *inputs):
        return tuple(self.function(*inputs, *case, **self.options) for case in self.cases)


def export(model, inputs, path, dynamo, opset=20, **options):
    """``torch.onnx.export`` as a user calls it, inputs named input0, input1, ..."""
    names = [f"input{index}" for index in range(len(inputs))]
    torch.onnx.export(
        model.eval(),
        tuple(inputs),
        str(path),
        opset_version=opset,
        dynamo=dynamo,
        input_names=names,
        verbose=False,
        **options,
    )
    return onnx.load(str(path))


def assert_standard_graph(model, grid_samples):
    """Standard ONNX operators only, opset 20, and one GridSample per call (``grid_samples``, a count or
    a range: the dynamo exporter's optimiser merges calls that are the same computation)."""
    onnx.checker.check_model(model, full_check=True)
    assert {node.domain for node in model.graph.node} <= {"", "ai.onnx"}
    assert not model.functions
    assert {entry.domain or "ai.onnx": entry.version for entry in model.opset_import}["ai.onnx"] == 20
    count = sum(node.op_type == "GridSample" for node in model.graph.node)
    assert count in (grid_samples if isinstance(grid_samples, range) else (grid_samples,))


def run(path, inputs):
    """Outputs of the ONNX model at ``path`` in onnxruntime's CPU provider, as tensors."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {argument.name: tensor.numpy() for argument, tensor in zip(session.get_inputs(), inputs)}
    return [torch.from_numpy(output) for output in session.run(None, feeds)]


def near_tie(positions):
    """(N, 1, D, H, W) mask of points with a voxel position (N, D, H, W, 3) within TIE_BAND of a half voxel."""
    distance = (positions - positions.floor() - 0.5).abs()
    return (distance < TIE_BAND).any(dim=-1).unsqueeze(1)


def grid_positions(grid, input_size, align_corners):
    """Voxel positions (x, y, z) of a normalised grid, before padding."""
    sizes = torch.tensor(input_size[::-1], dtype=torch.float64)  # W, H, D
    grid = grid.double()
    return (grid + 1) / 2 * (sizes - 1) if align_corners else ((grid + 1) * sizes - 1) / 2


def warp_positions(displacement):
    """Voxel positions (x, y, z) of identity + displacement (N, 3, D, H, W; dz, dy, dx)."""
    depth, height, width = displacement.shape[2:]
    zz, yy, xx = torch.meshgrid(torch.arange(depth), torch.arange(height), torch.arange(width), indexing="ij")
    displacement = displacement.double()
    return torch.stack([xx + displacement[:, 2], yy + displacement[:, 1], zz + displacement[:, 0]], dim=-1)


def assert_matches(label, got, expected, mode="bilinear", ties=None):
    """ONNX output against the expected values; for nearest, outside near-tie points only. Returns the
    number of points where nearest chose the other voxel (all of them near a tie)."""
    assert got.shape == expected.shape and got.dtype == torch.float32, label
    wrong = (got.double() - expected.double()).abs() > TOLERANCE
    if mode == "nearest":
        wrong_points = wrong.any(dim=1, keepdim=True)
        assert not (wrong_points & ~ties).any(), f"{label}: nearest differs away from a tie"
        return int(wrong_points.sum())
    assert not wrong.any(), f"{label}: max error {(got.double() - expected.double()).abs().max():.3g}"
    return 0


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_grid_sample_every_mode(dynamo, tmp_path):
    _, x, grid = make_case(2, 3, (5, 6, 7), (4, 5, 3), torch.float32, seed=1)
    model = export(Sampler(gs.grid_sample, MATRIX), (x, grid), tmp_path / "model.onnx", dynamo)
    assert_standard_graph(model, grid_samples=len(MATRIX))
    outputs = run(tmp_path / "model.onnx", (x, grid))
    for (mode, padding, align_corners), got in zip(MATRIX, outputs):
        expected = gs.grid_sampler3d(x.double(), grid.double(), mode, padding, align_corners, backend="reference")
        ties = near_tie(grid_positions(grid, x.shape[2:], align_corners))
        assert_matches(f"{mode} {padding} {align_corners}", got, expected, mode, ties)


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_warp3d_every_mode(dynamo, tmp_path):
    _, volume, displacement = make_warp_case(2, 2, (5, 6, 7), torch.float32, seed=2)

    def warp3d(volume, displacement, mode, padding, align_corners):
        return gs.Warp3d(mode, padding, align_corners)(volume, displacement)

    model = export(Sampler(warp3d, MATRIX), (volume, displacement), tmp_path / "model.onnx", dynamo)
    # Zeros and border do not depend on align_corners in the warp: the two calls are one computation.
    assert_standard_graph(model, grid_samples=range(len(MATRIX) - 4, len(MATRIX) + 1))
    outputs = run(tmp_path / "model.onnx", (volume, displacement))
    ties = near_tie(warp_positions(displacement))
    for (mode, padding, align_corners), got in zip(MATRIX, outputs):
        expected = gs.warp3d(volume.double(), displacement.double(), mode, padding, align_corners, backend="reference")
        assert_matches(f"{mode} {padding} {align_corners}", got, expected, mode, ties)


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_warp_channels_last_formats(dynamo, tmp_path):
    """gs.warp with an NDHWC volume and an NDHW3 displacement: the permutations travel into the graph."""
    _, volume, displacement = make_warp_case(
        1, 3, (4, 3, 5), torch.float32, data_format="NDHWC", displacement_format="NDHW3", seed=3
    )
    cases = [("bilinear", "zeros", False), ("bilinear", "reflection", True)]
    model = Sampler(gs.warp, cases, data_format="NDHWC", displacement_format="NDHW3")
    assert_standard_graph(export(model, (volume, displacement), tmp_path / "model.onnx", dynamo), len(cases))
    for case, got in zip(cases, run(tmp_path / "model.onnx", (volume, displacement))):
        expected = gs.warp3d(
            volume.double(),
            displacement.double(),
            *case,
            data_format="NDHWC",
            displacement_format="NDHW3",
            backend="reference",
        )
        assert_matches(str(case), got, expected)


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_float64(dynamo, tmp_path):
    _, x, grid = make_case(1, 2, (4, 5, 3), (3, 2, 4), torch.float64, data_format="NDHWC", seed=4)
    cases = [("bilinear", "reflection", True), ("nearest", "zeros", False)]
    model = Sampler(gs.grid_sample, cases, data_format="NDHWC")
    export(model, (x, grid), tmp_path / "model.onnx", dynamo)
    for case, got in zip(cases, run(tmp_path / "model.onnx", (x, grid))):
        expected = gs.grid_sampler3d(x, grid, *case, data_format="NDHWC", backend="reference")
        assert got.dtype == torch.float64
        assert (got - expected).abs().max() < 1e-12, case


class Registration(torch.nn.Module):
    """A grid_sample and a fused warp with a dynamic batch and dynamic spatial sizes."""

    def forward(self, volume, grid, displacement):
        return (
            gs.grid_sample(volume, grid, "bilinear", "border", False),
            gs.warp(volume, displacement, "bilinear", "reflection", True),
        )


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_dynamic_sizes(dynamo, tmp_path):
    _, volume, grid = make_case(2, 2, (5, 6, 7), (4, 3, 2), torch.float32, seed=5)
    displacement = make_warp_case(2, 2, (5, 6, 7), torch.float32, seed=5)[2]
    if dynamo:
        batch, depth, height, width = (torch.export.Dim(name) for name in ("batch", "depth", "height", "width"))
        out_depth, out_height, out_width = (torch.export.Dim(name) for name in ("out_d", "out_h", "out_w"))
        spatial = {0: batch, 2: depth, 3: height, 4: width}
        options = {"dynamic_shapes": (spatial, {0: batch, 1: out_depth, 2: out_height, 3: out_width}, spatial)}
    else:
        spatial = {0: "batch", 2: "depth", 3: "height", 4: "width"}
        options = {
            "dynamic_axes": {
                "input0": spatial,
                "input1": {0: "batch", 1: "out_d", 2: "out_h", 3: "out_w"},
                "input2": spatial,
            }
        }
    model = Registration()
    export(model, (volume, grid, displacement), tmp_path / "model.onnx", dynamo, **options)
    # Another batch and other sizes, an axis of one voxel among them (reflection's divisor).
    for batch_size, size, out_size in [(1, (3, 8, 4), (2, 5, 3)), (3, (1, 4, 6), (3, 1, 2))]:
        _, volume, grid = make_case(batch_size, 2, size, out_size, torch.float32, seed=6)
        displacement = make_warp_case(batch_size, 2, size, torch.float32, seed=6)[2]
        inputs = (volume, grid, displacement)
        for label, got, expected in zip(("grid_sample", "warp"), run(tmp_path / "model.onnx", inputs), model(*inputs)):
            assert_matches(f"{label} {size}", got, expected)


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_integrate_velocity_unrolled(dynamo, tmp_path):
    velocity = 2 * torch.randn(1, 3, 4, 5, 6, generator=torch.Generator().manual_seed(7))
    model = Sampler(gs.integrate_velocity, [()])
    assert_standard_graph(export(model, (velocity,), tmp_path / "model.onnx", dynamo), grid_samples=7)
    (got,) = run(tmp_path / "model.onnx", (velocity,))
    assert_matches("integrate_velocity", got, model(velocity)[0])


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_patched_model_exports(dynamo, tmp_path):
    """Under gs.patched(), F.grid_sample runs here in PyTorch and still exports as PyTorch's GridSample."""
    _, x, grid = make_case(1, 2, (4, 5, 6), (3, 3, 3), torch.float32, seed=8)
    model = Sampler(F.grid_sample, [("bilinear", "zeros", False)])
    with gs.patched():
        assert_standard_graph(export(model, (x, grid), tmp_path / "model.onnx", dynamo), grid_samples=1)
        expected = model(x, grid)[0]
    (got,) = run(tmp_path / "model.onnx", (x, grid))
    assert_matches("patched F.grid_sample", got, expected)


@pytest.mark.parametrize("dynamo", EXPORTERS)
@pytest.mark.parametrize("function", ["grid_sample", "Warp3d", "BSplineWarp3d"])
def test_bicubic_is_refused(function, dynamo, tmp_path):
    _, x, grid = make_case(1, 1, (3, 4, 5), (2, 2, 2), torch.float32)
    if function == "grid_sample":
        model, inputs = Sampler(gs.grid_sample, [("bicubic",)]), (x, grid)
    elif function == "Warp3d":
        model, inputs = gs.Warp3d(mode="bicubic"), (x, torch.zeros(1, 3, 3, 4, 5))
    else:
        model, inputs = gs.BSplineWarp3d(mode="bicubic"), (x, torch.zeros(1, 3, 4, 4, 4))
    with pytest.raises(
        torch.onnx.OnnxExporterError,
        match=r"mode='bicubic'.*cannot be exported to ONNX.*"
        r"Export the model with mode='bilinear'",
    ):
        export(model, inputs, tmp_path / "model.onnx", dynamo)


@pytest.mark.parametrize("dynamo", EXPORTERS)
@pytest.mark.parametrize("opset", [16, 19])
def test_opset_below_20_is_refused(opset, dynamo, tmp_path):
    _, x, grid = make_case(1, 1, (3, 4, 5), (2, 2, 2), torch.float32)
    model, inputs = (
        (Sampler(gs.grid_sample, [()]), (x, grid)) if opset == 16 else (gs.Warp3d(), (x, torch.zeros(1, 3, 3, 4, 5)))
    )
    with pytest.raises(torch.onnx.OnnxExporterError, match=rf"needs ONNX opset 20 .*got opset_version={opset}"):
        export(model, inputs, tmp_path / "model.onnx", dynamo, opset=opset)


def test_nearest_differs_only_at_ties(tmp_path):
    """Half-voxel displacements: every position is a tie, which float32 may round either way."""
    volume = torch.randn(1, 2, 4, 5, 6, generator=torch.Generator().manual_seed(9))
    displacement = torch.tensor([-1.5, 0.5, 2.5]).reshape(1, 3, 1, 1, 1).expand(1, 3, 4, 5, 6).contiguous()
    cases = [case for case in MATRIX if case[0] == "nearest"]
    model = Sampler(gs.warp, cases)
    export(model, (volume, displacement), tmp_path / "model.onnx", dynamo=False)
    ties = near_tie(warp_positions(displacement))
    assert ties.all()
    for case, got in zip(cases, run(tmp_path / "model.onnx", (volume, displacement))):
        assert_matches(str(case), got, gs.warp3d(volume, displacement, *case, backend="reference"), "nearest", ties)


def test_outside_onnx_export_the_custom_ops_run():
    """torch.export and torch.jit.trace for other uses keep this library's ops; so does eager."""
    _, x, grid = make_case(1, 1, (3, 4, 5), (2, 2, 2), torch.float32)
    model = Sampler(gs.grid_sample, [()])
    assert not gs_onnx.exporting()
    program = torch.export.export(model, (x, grid))
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert targets == {"gridsampler3d.sample.default"}
    traced = torch.jit.trace(model, (x, grid))
    assert "gridsampler3d::sample" in str(traced.graph)


class AffineRegistration(torch.nn.Module):
    """The fused affine field, alone (output size given) and with a displacement (output the volume's size)."""

    def forward(self, volume, theta, displacement):
        return (
            gs.affine_warp(volume, theta, (3, 4, 5), mode="bilinear", padding_mode="border", align_corners=False),
            gs.affine_warp(volume, theta, displacement=displacement, padding_mode="zeros", align_corners=True),
        )


def _affine_inputs(batch, size, seed):
    generator = torch.Generator().manual_seed(seed)
    volume = torch.randn(batch, 2, *size, generator=generator)
    theta = torch.eye(3, 4).repeat(batch, 1, 1) + 0.2 * torch.randn(batch, 3, 4, generator=generator)
    displacement = 1.5 * torch.randn(batch, 3, *size, generator=generator)
    return volume, theta, displacement


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_affine_warp_exports_as_affine_grid_and_grid_sample_with_dynamic_sizes(dynamo, tmp_path):
    volume, theta, displacement = _affine_inputs(2, (5, 6, 7), seed=9)
    if dynamo:
        batch, depth, height, width = (torch.export.Dim(name) for name in ("batch", "depth", "height", "width"))
        spatial = {0: batch, 2: depth, 3: height, 4: width}
        options = {"dynamic_shapes": (spatial, {0: batch}, spatial)}
    else:
        spatial = {0: "batch", 2: "depth", 3: "height", 4: "width"}
        options = {"dynamic_axes": {"input0": spatial, "input1": {0: "batch"}, "input2": spatial}}
    model = AffineRegistration()
    exported = export(model, (volume, theta, displacement), tmp_path / "model.onnx", dynamo, **options)
    assert_standard_graph(exported, grid_samples=2)
    assert sum(node.op_type == "AffineGrid" for node in exported.graph.node) == 2
    for batch_size, size in [(2, (5, 6, 7)), (1, (3, 8, 4)), (3, (4, 2, 6))]:
        inputs = _affine_inputs(batch_size, size, seed=10)
        for label, got, expected in zip(
            ("affine", "affine+displacement"), run(tmp_path / "model.onnx", inputs), model(*inputs)
        ):
            assert_matches(f"{label} {size}", got, expected)


class BSplineRegistration(torch.nn.Module):
    """The B-spline field alone (the volume's size, default grid) and with theta (an output size of its own, a
    non-integer spacing and origin)."""

    def forward(self, volume, control_points, theta):
        return (
            gs.bspline_warp(volume, control_points, padding_mode="border", align_corners=False),
            gs.bspline_warp(
                volume,
                control_points,
                (4, 5, 3),
                spacing=(1.3, 1.7, 0.9),
                origin=(-1.1, -2.4, -0.6),
                theta=theta,
                padding_mode="zeros",
                align_corners=True,
            ),
        )


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_bspline_warp_exports_as_a_dense_field_and_grid_sample(dynamo, tmp_path):
    """The field by standard operators (gathers and products over the support), then GridSample-20: onnxruntime
    within TOLERANCE of the model. The support tables are the traced sizes': the model keeps them."""
    generator = torch.Generator().manual_seed(11)
    volume = torch.randn(2, 2, 5, 6, 7, generator=generator)
    control_points = 1.5 * torch.randn(2, 3, 5, 6, 4, generator=generator)
    theta = torch.eye(3, 4).repeat(2, 1, 1) + 0.2 * torch.randn(2, 3, 4, generator=generator)
    model = BSplineRegistration()
    exported = export(model, (volume, control_points, theta), tmp_path / "model.onnx", dynamo)
    assert_standard_graph(exported, grid_samples=2)
    for seed in (12, 13):  # other values through the same graph
        generator = torch.Generator().manual_seed(seed)
        inputs = (
            torch.randn(2, 2, 5, 6, 7, generator=generator),
            1.5 * torch.randn(2, 3, 5, 6, 4, generator=generator),
            torch.eye(3, 4).repeat(2, 1, 1) + 0.2 * torch.randn(2, 3, 4, generator=generator),
        )
        for label, got, expected in zip(
            ("bspline", "bspline+theta"), run(tmp_path / "model.onnx", inputs), model(*inputs)
        ):
            assert_matches(f"{label} seed {seed}", got, expected)
