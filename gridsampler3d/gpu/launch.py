"""What every launch of the GPU engine shares: the kernel modules, the records the kernels take (:mod:`.records`),
the kernels' constexprs, launch grids, tuning, an affine field's voxel matrix, a B-spline's row coefficients.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import torch

from ..affine import voxel_matrix
from ..bspline import axis_table, row_coefficients
from ..sampling import POINT_ORDER, Field, FieldKind, Sampling
from . import autotune
from .planner import GpuPlan
from .records import FieldOperand, Operand, PointStrides, Rule, Sizes, VolumeStrides, constexpr_members

__all__ = [
    "accumulator",
    "field_operand",
    "field_matrix",
    "fusion",
    "interpreter_enabled",
    "kernel_rule",
    "kernels",
    "launch_tuned",
    "patch_grid",
    "row_windows",
    "sizes_of",
    "spline_rows",
    "store_dtype",
    "volume_operand",
]


def interpreter_enabled() -> bool:
    """Whether Triton runs kernels through its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def kernels():
    """The kernel modules (forward, backward, bicubic), imported on first use: Triton takes a while to import and
    is optional."""
    from . import backward, bicubic, forward

    return forward, backward, bicubic


def accumulator(sums: str):
    """The Triton dtype of a plan's sums ("float32" or "float64")."""
    import triton.language as tl

    return tl.float64 if sums == "float64" else tl.float32


def store_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype kernels write an output of ``dtype`` in.

    The dtype itself, except bfloat16 under the interpreter, whose float32 -> bfloat16
    conversion truncates (a GPU rounds to nearest even): there the kernels write float32
    and torch rounds.
    """
    return torch.float32 if dtype == torch.bfloat16 and interpreter_enabled() else dtype


def fusion(dtype: torch.dtype) -> dict:
    """Launch option: float64 keeps multiplies and adds unfused, so that its sums follow the
    reference's (and PyTorch's) rounding; other dtypes let the compiler fuse them."""
    return {"enable_fp_fusion": dtype != torch.float64}


def kernel_rule(sampling: Sampling, field: FieldKind) -> Rule:
    """The kernels' constexpr ``RULE`` of the call's records (:func:`constexpr_members`)."""
    return constexpr_members(
        Rule(
            int(sampling.interpolation),
            int(sampling.padding),
            bool(sampling.align_corners),
            int(field),
            field.affine,
            field.spline,
        )
    )


def volume_operand(tensor) -> Operand:
    """An (N, C, D, H, W) tensor (x, y, grad, dx) as the kernels take it, read in place through its strides."""
    return Operand(tensor, VolumeStrides(*tensor.stride()))


def field_matrix(field: Field, x, sampling: Sampling):
    """An affine field's voxel matrix (N, 12), float64, on x's device (:func:`gridsampler3d.affine.voxel_matrix` of
    theta for x's sizes and the field's output sizes); None for a field without theta."""
    if not field.kind.affine:
        return None
    theta = field.theta.to(torch.float64)
    return voxel_matrix(theta, tuple(x.shape[2:]), field.out_sizes, sampling.align_corners).reshape(-1, 12).contiguous()


def spline_rows(field: Field) -> tuple:
    """A B-spline's row coefficients V (N, 3, Do, Ho, Kw), float64 (:func:`gridsampler3d.bspline.row_coefficients`,
    torch operations in a fixed order), and its control grid along w, (spacing, origin, Kw) float64, both on the
    control points' device: what the kernels read in place of the control points. Kept in the field's ``derived``
    for its backward."""
    derived = field.derived
    if "gpu spline rows" not in derived:
        control_points = field.tensor.detach().to(torch.float64)
        rows = row_coefficients(control_points, field.out_sizes, field.parameters).contiguous()
        grid = (field.parameters[2], field.parameters[5], float(field.tensor.shape[4]))
        derived["gpu spline rows"] = rows, torch.tensor(grid, dtype=torch.float64, device=rows.device)
    return derived["gpu spline rows"]


def field_operand(field: Field, matrix=None, tensor=None) -> FieldOperand:
    """The field's tensor (or ``tensor``, another of its shape: its gradient) as the kernels take it, strides in
    point order (:meth:`.sampling.Field.point_strides`), with an affine field's ``matrix`` (:func:`field_matrix`).
    A field with no tensor (an affine alone) hands over its matrix in the tensor's place, with zero strides; a
    B-spline its row coefficients and control grid along w (:func:`spline_rows`)."""
    if field.kind.spline:
        rows, columns = spline_rows(field)
        strides = PointStrides(*POINT_ORDER(rows.stride()))
        return FieldOperand(rows, strides, rows if matrix is None else matrix, columns)
    tensor = field.tensor if tensor is None else tensor
    if tensor is None:
        return FieldOperand(matrix, PointStrides(0, 0, 0, 0, 0), matrix, matrix)
    strides = PointStrides(*field.point_strides(tensor.stride()))
    stand_in = tensor if matrix is None else matrix
    return FieldOperand(tensor, strides, stand_in, stand_in)


def row_windows(field: Field, block_w: int) -> tuple[list, int]:
    """(firsts, window) of a B-spline's partial row sums (:class:`.records.RowPartials`) for blocks of ``block_w``
    output columns: each block's lowest control column inside the grid that its points' supports hold (the grid's
    count where none), and the most columns any block's supports span (at least 1), from the table every engine
    reads (:func:`gridsampler3d.bspline.axis_table`; the kernels compute the same supports)."""
    count = field.tensor.shape[4]
    table = axis_table(field.out_sizes[2], count, field.parameters[2], field.parameters[5])
    starts = np.arange(0, field.out_sizes[2], block_w)
    lowest = np.minimum.reduceat(np.where(table.valid, table.index, count).min(axis=1), starts)
    highest = np.maximum.reduceat(np.where(table.valid, table.index, -1).max(axis=1), starts)
    return lowest.tolist(), max(1, int((highest - lowest).max()) + 1)


def sizes_of(x, field: Field) -> Sizes:
    """The call's sizes: x's channels and (D, H, W), the field's (Do, Ho, Wo)."""
    return Sizes(x.shape[1], *x.shape[2:], *field.out_sizes)


def launch_tuned(kernel: str, plan: GpuPlan, x: torch.Tensor, launch, gather: bool = False) -> None:
    """Launch the plan's kernel (or with ``gather`` its gather kernel) with the shape :mod:`.autotune` chose among
    the plan's candidates for (kernel, the plan's ``tune_key``, device), timed once per key where the plan says
    the launch is tuned; else with the plan's shape."""
    tuned, tile, candidates = (
        (plan.gather_tuned, plan.gather_tile, plan.gather_candidates)
        if gather
        else (plan.tuned, plan.tile, plan.candidates)
    )
    if not (tuned and autotune.enabled(x.device)):
        launch(tile)
        return
    # The device too: a process may drive GPUs of different kinds.
    key = (kernel, *plan.tune_key, str(x.device))
    launch(autotune.TUNER.choose(key, list(candidates), launch))


def patch_grid(batch: int, out_sizes, tile) -> tuple[int, int]:
    """The launch grid of a plan's patches (``coords.tile_points``)."""
    out_depth, out_height, out_width = out_sizes
    return (batch * -(-out_depth // tile.block_d) * -(-out_height // tile.block_h), -(-out_width // tile.block_w))
