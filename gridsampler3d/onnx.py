"""ONNX export: what ``grid_sample``, ``warp``, ``Warp3d``, ``integrate_velocity``, ``affine_warp``,
``AffineWarp3d``, ``bspline_warp`` and ``BSplineWarp3d`` become in a graph.

``torch.onnx.export(model, args, path, opset_version=20)`` works unchanged for a model built
on this library, with the default (dynamo) exporter and with ``dynamo=False``. No ONNX
runtime knows this library's custom ops, so while an ONNX export traces the model the
differentiable functions (:func:`.autograd.sample`) call the composites below instead, made of
``torch.nn.functional.grid_sample``, which both exporters translate to the standard ONNX
GridSample (opset 20, the first whose GridSample takes 5-D input):

    grid_sample(input, grid)      ->  GridSample(input, grid)
    warp(volume, displacement)    ->  GridSample(volume, normalised(identity + displacement))
    affine_warp(volume, theta)    ->  GridSample(volume, AffineGrid(theta, size) [+ normalised displacement])
    bspline_warp(volume, control) ->  GridSample(volume, normalised(identity or AffineGrid + dense field))

The identity grid is built from the traced sizes, so a model exported with dynamic batch
and spatial sizes runs on other sizes. What ONNX cannot express is refused while the
export traces, with ``torch.onnx.OnnxExporterError``: tricubic sampling, and an opset below 20.

Outside an export the whole cost is :func:`exporting`'s first test, two flag reads.
torch has no public way to tell the traced model that torch.export's strict capture is
working for ``torch.onnx.export``, nor which opset the export writes: those reads of the
exporters' own state live in :mod:`.torch_hooks`, each with a fallback.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import torch_hooks
from .affine import explicit_grid_steps
from .bspline import dense_displacement
from .modes import Interpolation, Padding
from .sampling import Field, FieldKind, Sampling

__all__ = ["MIN_OPSET", "affine_warp", "bspline_warp", "exporting", "grid_sample", "sample", "warp"]

MIN_OPSET = 20
"""The lowest opset the export takes: GridSample before opset 20 samples 4-D input only."""

# Set while torch.export traces, strict or not (absent from older torch).
_torch_exporting = getattr(torch.compiler, "is_exporting", None)


def exporting() -> bool:
    """Whether ``torch.onnx.export`` is tracing the caller (either exporter; torch.export strict or not)."""
    if _torch_exporting is None:
        return torch.onnx.is_in_onnx_export()
    # The dynamo exporter traces with torch.export, the TorchScript one with the JIT tracer;
    # torch.compile sees both flags as False.
    if not (_torch_exporting() or torch.jit.is_tracing()):
        return False
    return torch_hooks.onnx_export_in_progress()


def _refuse_what_onnx_cannot_express(interpolation: Interpolation, what: str) -> None:
    if interpolation == Interpolation.BICUBIC:
        raise torch.onnx.OnnxExporterError(
            f"gridsampler3d: {what} with mode='bicubic' (tricubic, 5-D) cannot be exported to ONNX: ONNX "
            f"runtimes do not implement GridSample's cubic mode on 5-D input. Export the model with "
            f"mode='bilinear' or mode='nearest', or keep the tricubic sampling outside the exported graph."
        )
    if torch.compiler.is_dynamo_compiling():
        # Only reached once the dynamo exporter's first, non-strict capture has failed; its error
        # is the one reported. Strict capture cannot read the opset asked for.
        raise torch.onnx.OnnxExporterError(
            f"gridsampler3d: {what} is exported to ONNX from torch.export's non-strict capture only, "
            f"which torch.onnx.export tries first; see the error that capture raised."
        )
    opset = torch_hooks.requested_opset()
    if opset is not None and opset < MIN_OPSET:
        raise torch.onnx.OnnxExporterError(
            f"gridsampler3d: {what} on 5-D input needs ONNX opset {MIN_OPSET} or later (GridSample before "
            f"opset {MIN_OPSET} samples 4-D input only); got opset_version={opset}. Export with "
            f"opset_version={MIN_OPSET}."
        )


def sample(volume: Tensor, field: Field, sampling: Sampling) -> Tensor:
    """volume (N, C, D, H, W) sampled at ``field`` -> (N, C, Do, Ho, Wo), as the composite of the field's kind."""
    if field.kind == FieldKind.GRID:
        return grid_sample(volume, field.tensor, sampling)
    if field.kind == FieldKind.DISPLACEMENT:
        return warp(volume, field.tensor, sampling)
    if field.kind.spline:
        return bspline_warp(volume, field, sampling)
    return affine_warp(volume, field, sampling)


def grid_sample(input: Tensor, grid: Tensor, sampling: Sampling) -> Tensor:
    """input (N, C, Di, Hi, Wi), grid (N, Do, Ho, Wo, 3) -> (N, C, Do, Ho, Wo), as one ONNX GridSample."""
    _refuse_what_onnx_cannot_express(sampling.interpolation, "grid_sample")
    return F.grid_sample(
        input, grid, sampling.interpolation.name.lower(), sampling.padding.name.lower(), sampling.align_corners
    )


def warp(volume: Tensor, displacement: Tensor, sampling: Sampling) -> Tensor:
    """volume (N, C, D, H, W) at identity + displacement (N, 3, D, H, W; (dz, dy, dx) in voxels) -> (N, C, D, H, W).

    Along an axis of S voxels the position p = index + displacement becomes the grid value
    that GridSample unnormalises back to p. The fused warp's ``align_corners`` only sets
    reflection's bounds, so zeros and border padding, and reflection about the outer edges,
    take GridSample's align_corners=False and ``g = (2 p + 1) / S - 1``, exact for S = 1
    too; reflection about the end voxels' centres takes align_corners=True and
    ``g = 2 p / (S - 1) - 1``, where for S = 1 (index 0, whatever p) the divisor is 1.
    """
    _refuse_what_onnx_cannot_express(sampling.interpolation, "warp")
    return _displaced(volume, displacement, sampling)


def _displaced(volume: Tensor, displacement: Tensor, sampling: Sampling) -> Tensor:
    """volume (N, C, D, H, W) at each output voxel's own index plus ``displacement`` (N, 3, Do, Ho, Wo), positions
    normalised by the volume's sizes (see :func:`warp`)."""
    about_centres = sampling.padding == Padding.REFLECTION and sampling.align_corners
    coordinates = []  # z, y, x
    for axis in range(3):
        options = {"dtype": displacement.dtype, "device": displacement.device}
        index = torch.arange(displacement.shape[2 + axis], **options)
        position = displacement[:, axis] + index.reshape((-1,) + (1,) * (2 - axis))
        size = volume.shape[2 + axis]
        if about_centres:
            # S - 1 as the last index (a traced value, so that it follows a dynamic size), at least 1.
            last = torch.arange(size, **options)[-1:].clamp(min=1).reshape(())
            coordinates.append(2 * position / last - 1)
        else:
            coordinates.append((2 * position + 1) / size - 1)
    grid = torch.stack(coordinates[::-1], dim=-1)  # (N, D, H, W, 3): (x, y, z)
    return F.grid_sample(
        volume, grid, sampling.interpolation.name.lower(), sampling.padding.name.lower(), about_centres
    )


def affine_warp(volume: Tensor, field: Field, sampling: Sampling) -> Tensor:
    """volume (N, C, D, H, W) at an affine field (theta, and a displacement (N, 3, Do, Ho, Wo) or none) ->
    (N, C, Do, Ho, Wo), as AffineGrid then GridSample, the displacement (in input voxels) added to the grid in
    normalised units between them (:func:`.affine.explicit_grid`)."""
    _refuse_what_onnx_cannot_express(sampling.interpolation, "affine_warp")
    grid = _affine_grid(volume, field, sampling.align_corners)
    if field.tensor is not None:
        grid = grid + explicit_grid_steps(field.tensor, tuple(volume.shape[2:]), sampling.align_corners)
    return F.grid_sample(
        volume, grid, sampling.interpolation.name.lower(), sampling.padding.name.lower(), sampling.align_corners
    )


def bspline_warp(volume: Tensor, field: Field, sampling: Sampling) -> Tensor:
    """volume (N, C, D, H, W) at a B-spline field -> (N, C, Do, Ho, Wo): the dense field from the control points by
    Gather, Mul and Where over the support tables of the traced sizes (:func:`.bspline.dense_displacement`), then
    as :func:`warp` (own positions, normalised by the volume's sizes) or :func:`affine_warp` (with theta). The
    tables are the traced output's and control grid's: the exported model keeps those sizes."""
    _refuse_what_onnx_cannot_express(sampling.interpolation, "bspline_warp")
    displacement = dense_displacement(field.tensor, field.out_sizes, field.parameters)
    if field.theta is None:
        return _displaced(volume, displacement, sampling)
    return affine_warp(
        volume, Field(FieldKind.AFFINE_DISPLACEMENT, displacement, field.theta, field.out_sizes), sampling
    )


def _affine_grid(volume: Tensor, field: Field, align_corners: bool) -> Tensor:
    """F.affine_grid's grid (N, Do, Ho, Wo, 3) of the field's theta, as one ONNX AffineGrid.

    The TorchScript exporter translates ``F.affine_grid`` to AffineGrid; the dynamo exporter
    would write its decomposition instead (a base grid, a constant for static sizes, times
    theta), so there the node is written as it is (``torch.onnx.ops.symbolic``), its size
    input (N, 1, Do, Ho, Wo) read from the traced shapes where they are dynamic: the
    displacement's, or, for the default output size, the volume's.
    """
    theta, out_sizes = field.theta, field.out_sizes
    if not _torch_exporting or torch.jit.is_tracing() or not _torch_exporting():
        return F.affine_grid(theta, (theta.shape[0], 1, *out_sizes), align_corners=align_corners)
    shaped = volume if field.tensor is None else field.tensor
    shape = torch.onnx.ops.symbolic("Shape", (shaped,), {}, dtype=torch.int64, shape=(5,), version=MIN_OPSET)
    if all(isinstance(size, int) for size in out_sizes):
        size = shape * torch.tensor([1, 0, 0, 0, 0]) + torch.tensor([0, 1, *out_sizes])
    else:
        size = shape * torch.tensor([1, 0, 1, 1, 1]) + torch.tensor([0, 1, 0, 0, 0])
    return torch.onnx.ops.symbolic(
        "AffineGrid",
        (theta, size),
        {"align_corners": int(align_corners)},
        dtype=theta.dtype,
        shape=(theta.shape[0], *out_sizes, 3),
        version=MIN_OPSET,
    )
