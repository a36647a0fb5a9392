"""The records the Triton kernels take their operands in, as the CPU engine's kernels take theirs
(:mod:`gridsampler3d.cpu.records`).

A kernel never takes a tensor and its strides as loose arguments: an :class:`Operand`
carries both (at launch a torch tensor, inside the kernel a pointer), :class:`Sizes`
carries every size, and the compile-time choices travel as constexpr records: the call's
:class:`Rule` (made by :func:`.launch.kernel_rule` only), the launch's :class:`Blocks`
(:meth:`.planner.Tile.keywords`) and the outputs asked for
(:class:`~gridsampler3d.sampling.Outputs`). Triton flattens a record into its members:
an integer member equal to 1 is specialised as a constant and a multiple of 16 gets the
divisibility hint, as a plain integer argument does, so the compiled code is the same.

A ``@triton.jit`` helper takes records of one class only. Triton instantiates a helper
once per kernel for each list of argument types, and a record's type is its members'
types without their names: a helper given a :class:`VolumeStrides` and then, in the same
kernel, a :class:`PointStrides` whose members have the same types would read the second
through the first's names (a volume's ``d`` is member 2, a field's member 1), which the
interpreter does not do. Hence ``coords.volume_offset`` and ``coords.point_offset``, one
sum twice; ``tests/gpu_compile.py`` reports any helper instantiated for two classes.

Nothing here imports Triton until :func:`constexpr_members` is called: the planner and the launch
code build these records.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "Blocks",
    "FieldOperand",
    "Operand",
    "PointStrides",
    "RowPartials",
    "Rule",
    "Sizes",
    "SortedRecords",
    "VolumeStrides",
    "constexpr_members",
]


class VolumeStrides(NamedTuple):
    """Element strides of an (N, C, D, H, W) tensor (x, y, grad, dx), in that logical order."""

    n: int
    c: int
    d: int
    h: int
    w: int


class PointStrides(NamedTuple):
    """Element strides of a field in point order: a grid (N, Do, Ho, Wo, 3), or a displacement (N, 3, Do, Ho, Wo)
    whose strides are handed over in the same order (:meth:`.sampling.Field.point_strides`); ``k`` steps from one
    component to the next."""

    n: int
    d: int
    h: int
    w: int
    k: int


class Operand(NamedTuple):
    """A tensor as a kernel reads or writes it: ``data`` (a torch tensor at launch, a pointer to its first element
    inside the kernel) and its ``strides`` (:class:`VolumeStrides` or :class:`PointStrides`)."""

    data: Any
    strides: Any


class FieldOperand(NamedTuple):
    """A field as the kernels read it, or its gradient as they write it: ``data`` (the grid or displacement, a torch
    tensor at launch, a pointer inside the kernel) with its :class:`PointStrides`; ``matrix``, an affine
    field's voxel matrix (N, 12), float64 (:func:`gridsampler3d.affine.voxel_matrix`); and ``columns``, a
    B-spline's control grid along the output's columns, (spacing, origin, count) float64. A B-spline hands over its
    row coefficients (N, 3, Do, Ho, Kw) as ``data`` (:func:`.launch.spline_rows`), strides in point order (n, d,
    h, control column, component). A field without a tensor (an affine alone) hands over the matrix as ``data``
    with zero strides, and a field without a matrix or columns its tensor (or matrix) in their place: the kernels
    read only what ``RULE`` says the field has."""

    data: Any
    strides: Any
    matrix: Any
    columns: Any


class RowPartials(NamedTuple):
    """Where a backward walk writes its partial sums per output row and block of ``block_w`` columns (rows numbered
    (n * Do + d) * Ho + h, ``blocks`` blocks a row), each summed over the block's points in a fixed order; the
    engine sums them over the blocks in order. ``g`` is the loss's gradient with respect to a point's position.

    ``moments`` (rows, blocks, 6) float64, an affine field's: ``sum g_i`` and ``sum g_i * w`` (i = x, y, z)
    (:func:`gridsampler3d.affine.matrix_gradient` takes their sums over the blocks). ``sums`` (rows, blocks, 3,
    ``window``) float64, a B-spline's row sums (:mod:`gridsampler3d.bspline`'s R, components (dz, dy, dx)) over the
    block's points: entry j of block b is control column ``firsts[b] + j`` (``firsts`` (blocks,) int64, the lowest
    column the block's supports hold inside the grid, :func:`.launch.row_windows`). A member not written is a
    stand-in tensor."""

    moments: Any
    sums: Any
    firsts: Any
    blocks: int
    window: int


class Sizes(NamedTuple):
    """The sizes of one call: channels C, the input's (D, H, W) and the output's (Do, Ho, Wo)."""

    channels: int
    depth: int
    height: int
    width: int
    out_depth: int
    out_height: int
    out_width: int


class SortedRecords(NamedTuple):
    """The deterministic dx's sorted points (``backward.sorted_records_kernel``): for sorted point j,
    ``grad_offsets[j]`` (int64) is where its grad starts, and for trilinear ``indices[j]``, ``indices[entries + j]``
    and ``indices[2 * entries + j]`` (float64) are its source indices ix, iy, iz; ``entries`` points in all."""

    indices: Any
    grad_offsets: Any
    entries: int


class Rule(NamedTuple):
    """A call's :class:`~gridsampler3d.sampling.Sampling` and field kind as the kernels read them, a constexpr:
    the codes of the interpolation, the padding and the field kind (:class:`~gridsampler3d.sampling.FieldKind`),
    ``align_corners``, and the kind's facts ``affine`` (it has a theta) and ``spline`` (its tensor is a
    B-spline's control points, read as row coefficients)."""

    interpolation: int
    padding: int
    align_corners: bool
    field: int
    affine: bool
    spline: bool


class Blocks(NamedTuple):
    """A launch's block sizes, a constexpr (the planner's :class:`.planner.Tile` without its warps): ``block_d`` x
    ``block_h`` x ``block_w`` output points (the patch kernels; the flat kernels use ``block_w`` alone, as points,
    voxels or chunks) times ``block_c`` channels a program."""

    block_w: int
    block_c: int = 1
    block_h: int = 1
    block_d: int = 1


def constexpr_members(record):
    """``record`` with each member a ``tl.constexpr``, as a constexpr record is handed to a kernel: Triton before 3.8
    reads a constexpr record's plain members as Python values, which it cannot use as block shapes."""
    import triton.language as tl

    return type(record)(*(tl.constexpr(member) for member in record))
