"""Compile every Triton kernel for an sm_90 GPU without one (run by tests/test_gpu.py in a subprocess).

Triton's interpreter runs kernels as Python and so misses what only the compiler checks
(globals that are not constexpr, integer arguments equal to 1 arriving as constexpr, type
rules) and what only the generated code shows (32-bit integer arithmetic, how a float
remainder is computed). This compiles each kernel in its main configurations through
Triton's real pipeline, down to a cubin, specialised exactly as a launch specialises it:
the arguments are the records the engine builds (gridsampler3d/gpu/launch.py) from tensors
of realistic shapes (meta tensors, so only their strides: a 128^3 volume with 16 channels,
NCDHW or channels-last, a grid or a displacement in either layout, an affine field, a B-spline's
row coefficients), with a mock tensor of
the operand's dtype as each pointer, and Triton's own launcher code binds them: an integer
equal to 1 becomes a constant, pointers and multiples of 16 carry the divisibility hint,
and float64 compiles without FP fusion where the engine launches it so. It also watches
Triton instantiate the ``@triton.jit`` helpers: one instance serving records of different
fields (gridsampler3d/gpu/records.py) compiles, reads the wrong members, and counts as a
failure. It reports per kernel what its Triton IR holds:

    python tests/gpu_compile.py [--json FILE] [--registers]

``--json`` writes one record per compiled configuration (name, the dtype of each operand,
the constexprs, the integers specialised as 1, the helpers given mixed records, the int32
multiplies left in its TTIR, whether a float remainder is an exact fmod, the PTX
conversions it uses, and with ``--registers`` the registers and spill bytes that ``ptxas
-v`` reports for sm_90a). ``--registers`` also prints them as a Markdown table
(docs/gpu.md):

    TRITON_DEFAULT_FP_FUSION=1 python tests/gpu_compile.py --registers

Exit status: the number of kernels that failed to compile or mixed records in a helper.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("run without TRITON_INTERPRET: the interpreter replaces the compiler")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, code_generator, make_backend  # noqa: E402
from triton.runtime.jit import MockTensor, create_function_from_signature  # noqa: E402

from gridsampler3d.bspline import grid_of  # noqa: E402
from gridsampler3d.gpu import backward, bicubic, forward  # noqa: E402
from gridsampler3d.gpu.launch import (
    field_operand,
    fusion,
    kernel_rule,
    row_windows,
    sizes_of,  # noqa: E402
    volume_operand,
)
from gridsampler3d.gpu.planner import Tile  # noqa: E402
from gridsampler3d.gpu.records import RowPartials, SortedRecords, VolumeStrides, constexpr_members  # noqa: E402
from gridsampler3d.layout import memory_format_of  # noqa: E402
from gridsampler3d.modes import Interpolation, Padding  # noqa: E402
from gridsampler3d.sampling import Field, Outputs, Sampling  # noqa: E402

# Every kernel through the front end, never from Triton's cache: the helpers are watched as it generates them.
triton.knobs.compilation.always_compile = True
TARGET = GPUTarget("cuda", 90, 32)
BACKEND = make_backend(TARGET)
F32, F64 = tl.float32, tl.float64
DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp64": torch.float64,
    "i32": torch.int32,
    "i64": torch.int64,
}
BILINEAR, NEAREST, BICUBIC = Interpolation.BILINEAR, Interpolation.NEAREST, Interpolation.BICUBIC
ZEROS, BORDER, REFLECTION = Padding.ZEROS, Padding.BORDER, Padding.REFLECTION
# The deterministic tricubic dx works through the points a chunk at a time (planner.TRICUBIC_CHUNK_ENTRIES / 64):
# a 128^3 volume's second chunk.
SECOND_CHUNK = (1 << 20, 1 << 21)
# Chunks of long buckets in a deterministic trilinear dx (border padding piles points into corner cells).
LONG_BUCKET_CHUNKS = 4096
# A B-spline's control grid on a 128^3 output: a control point every 6.5 voxels, from one spacing before voxel 0.
CONTROL_SIZES = (23, 23, 23)


class Call(NamedTuple):
    """The tensors of one call as meta tensors (shapes and strides, no data): x (N, C, D, H, W) and its field."""

    x: torch.Tensor
    field: Field

    def y(self) -> torch.Tensor:
        """The output (and so grad): (N, C, Do, Ho, Wo), laid out as x (the engine's forward allocates it so)."""
        return torch.empty(
            tuple(self.x.shape[:2]) + self.field.out_sizes, device="meta", memory_format=memory_format_of(self.x)
        )

    def field_gradient(self) -> torch.Tensor:
        """The field's gradient as the engine's backward allocates it (:meth:`.sampling.Field.gradient_format`)."""
        return torch.empty_like(self.field.tensor, memory_format=self.field.gradient_format())

    def voxels(self) -> int:
        batch, _, depth, height, width = self.x.shape
        return batch * depth * height * width


def make_call(layout: str | None) -> Call:
    """A 128^3 volume with 16 channels sampled at a 128^3 grid, x in ``layout`` ("NCDHW" or "NDHWC"; with
    " warp N3DHW" or " warp NDHW3": the fused warp, at a displacement in that layout; with " affine": an affine field,
    " affine N3DHW" with a displacement; with " bspline": a B-spline, " bspline affine" with a theta); or,
    ``layout`` None, one with sizes of 1 (one channel, one voxel deep, a one-point-wide output)."""
    if layout is None:
        x = torch.empty(2, 1, 1, 5, 7, device="meta")
        return Call(x, Field.grid(torch.empty(2, 3, 6, 1, 3, device="meta")))
    batch, channels, side = 1, 16, 128
    memory_format = torch.channels_last_3d if layout.startswith("NDHWC") else torch.contiguous_format
    x = torch.empty(batch, channels, side, side, side, device="meta", memory_format=memory_format)
    if " bspline" in layout:
        control_points = torch.empty(batch, 3, *CONTROL_SIZES, device="meta")
        theta = torch.empty(batch, 3, 4, device="meta") if layout.endswith("affine") else None
        out_sizes = (side, side, side)
        return Call(x, Field.bspline(control_points, out_sizes, grid_of(out_sizes, CONTROL_SIZES), theta))
    if " affine" in layout:
        theta = torch.empty(batch, 3, 4, device="meta")
        displacement = torch.empty(batch, 3, side, side, side, device="meta") if layout.endswith("N3DHW") else None
        return Call(x, Field.affine(theta, (side, side, side), displacement))
    if layout.endswith("N3DHW"):
        return Call(x, Field.displacement(torch.empty(batch, 3, side, side, side, device="meta")))
    if layout.endswith("NDHW3"):
        displacement = torch.empty(batch, side, side, side, 3, device="meta").permute(0, 4, 1, 2, 3)
        return Call(x, Field.displacement(displacement))
    return Call(x, Field.grid(torch.empty(batch, side, side, side, 3, device="meta")))


def pointer(dtype: str) -> MockTensor:
    """A tensor of ``dtype`` as Triton's launcher sees it: its address (0: a multiple of 16) and its dtype."""
    return MockTensor(DTYPES[dtype])


def volume(tensor, dtype: str):
    """``launch.volume_operand`` of a meta tensor, with a pointer of ``dtype``."""
    return volume_operand(tensor)._replace(data=pointer(dtype))


def points(field: Field, dtype: str, tensor=None):
    """``launch.field_operand`` of a meta field (or of ``tensor``, its gradient), with a pointer of ``dtype`` (of
    float64 for an affine field's matrix, and its data where the field has no tensor; for a B-spline's row
    coefficients and control grid)."""
    if field.kind.spline:
        matrix = torch.empty(1, 12, device="meta") if field.kind.affine else None
        wide = pointer("fp64")
        return field_operand(field, matrix)._replace(data=wide, matrix=wide, columns=wide)
    if not field.kind.affine:
        stand_in = pointer(dtype)
        return field_operand(field, None, tensor)._replace(data=stand_in, matrix=stand_in, columns=stand_in)
    data = pointer("fp64") if field.tensor is None else pointer(dtype)
    wide = pointer("fp64")
    return field_operand(field, torch.empty(1, 12, device="meta"), tensor)._replace(
        data=data, matrix=wide, columns=wide
    )


def case(label, kernel, args, constexprs, tile: Tile, fused: str | None = None):
    """A configuration as the engine launches it: ``args`` (records of meta strides and mock pointers),
    ``constexprs``, the launch shape ``tile``, and ``launch.fusion`` of the dtype ``fused`` where the engine
    passes that option."""
    options = {**tile.keywords(), **(fusion(DTYPES[fused]) if fused else {})}
    return {"label": label, "kernel": kernel, "args": args, "kwargs": {**constexprs, **options}}


def patch_forward(label, layout, dtype, sampling: Sampling, tile: Tile):
    """The trilinear / nearest forward (engine._forward)."""
    call = make_call(layout)
    args = (volume(call.x, dtype), points(call.field, dtype), volume(call.y(), dtype), sizes_of(call.x, call.field))
    constexprs = dict(RULE=kernel_rule(sampling, call.field.kind), ACC=F64 if dtype == "fp64" else F32)
    return case(label, forward.grid_sampler3d_fwd_kernel, args, constexprs, tile, dtype)


def walk_args(call: Call, dtype, outputs: Outputs, dx_dtype):
    """The backward walk's operands (engine._backward_walk): an output not written is handed over as x or the field
    (a B-spline's gradient is written as row partials)."""
    dx = volume(call.x, dx_dtype) if outputs.dx else volume(call.x, dtype)
    written = outputs.dfield and not call.field.kind.spline
    dfield = points(call.field, dtype, call.field_gradient()) if written else points(call.field, dtype)
    return volume(call.y(), dtype), volume(call.x, dtype), points(call.field, dtype), dx, dfield


def partials(call: Call, outputs: Outputs, dtype: str, tile: Tile) -> RowPartials:
    """The walk's :class:`RowPartials` (engine._row_partials): float64 partials of an affine field's theta gradient
    and of a B-spline's row sums where written, x as a stand-in else."""
    blocks = -(-call.field.out_sizes[2] // tile.block_w)
    moments = pointer("fp64") if outputs.dtheta else pointer(dtype)
    if not (outputs.dfield and call.field.kind.spline):
        return RowPartials(moments, pointer(dtype), pointer(dtype), blocks, 1)
    return RowPartials(moments, pointer("fp64"), pointer("i64"), blocks, row_windows(call.field, tile.block_w)[1])


def patch_backward(label, layout, dtype, sampling: Sampling, tile: Tile, outputs: Outputs, dx_dtype="fp32"):
    """The trilinear / nearest backward walk; the fast mode's dx adds into a buffer of the sums' dtype."""
    call = make_call(layout)
    args = (
        *walk_args(call, dtype, outputs, dx_dtype),
        partials(call, outputs, dtype, tile),
        sizes_of(call.x, call.field),
    )
    constexprs = dict(
        RULE=kernel_rule(sampling, call.field.kind),
        ACC=F64 if dtype == "fp64" else F32,
        OUTPUTS=constexpr_members(outputs),
    )
    return case(label, backward.grid_sampler3d_bwd_kernel, args, constexprs, tile, dtype)


def sorted_points(call: Call) -> SortedRecords:
    return SortedRecords(pointer("fp64"), pointer("i64"), call.field.points)


def bucket_keys(label, layout, dtype, sampling: Sampling):
    """gathered._sorted_records's first kernel."""
    call = make_call(layout)
    args = (points(call.field, dtype), pointer("i32"), call.field.points, sizes_of(call.x, call.field))
    return case(
        label, backward.bucket_keys_kernel, args, dict(RULE=kernel_rule(sampling, call.field.kind)), Tile(block_w=256)
    )


def sorted_records(label, layout, dtype, sampling: Sampling):
    """gathered._sorted_records's second kernel."""
    call = make_call(layout)
    args = (
        points(call.field, dtype),
        pointer("i64"),
        sorted_points(call),
        sizes_of(call.x, call.field),
        VolumeStrides(*call.y().stride()),
    )
    return case(
        label,
        backward.sorted_records_kernel,
        args,
        dict(RULE=kernel_rule(sampling, call.field.kind)),
        Tile(block_w=256),
    )


def dx_gather(label, layout, dtype, interpolation, acc, split, tile: Tile, starts="i32", partials="fp64"):
    """gathered.gathered_dx's gather: dx in the data's dtype (half types rounded once from float64 sums)."""
    call = make_call(layout)
    args = (
        volume(call.y(), dtype),
        sorted_points(call),
        volume(call.x, dtype),
        pointer(starts),
        pointer(starts),
        pointer(partials),
        call.voxels(),
        sizes_of(call.x, call.field),
    )
    constexprs = dict(INTERPOLATION=int(interpolation), ACC=acc, SPLIT=split)
    return case(label, backward.dx_gather_kernel, args, constexprs, tile, dtype)


def bucket_partials(label, layout, dtype, interpolation, acc, block_c, partials):
    """gathered.gathered_dx's partial sums of long buckets."""
    call = make_call(layout)
    args = (
        volume(call.y(), dtype),
        sorted_points(call),
        pointer(partials),
        pointer("i64"),
        pointer("i32"),
        LONG_BUCKET_CHUNKS,
        call.x.shape[1],
    )
    constexprs = dict(INTERPOLATION=int(interpolation), ACC=acc, CHUNK=256)
    return case(label, backward.bucket_partials_kernel, args, constexprs, Tile(block_w=64, block_c=block_c), dtype)


def tricubic_forward(label, layout, dtype, sampling: Sampling, tile: Tile):
    call = make_call(layout)
    args = (
        volume(call.x, dtype),
        points(call.field, dtype),
        volume(call.y(), dtype),
        call.field.points,
        sizes_of(call.x, call.field),
    )
    return case(
        label, bicubic.bicubic_fwd_kernel, args, dict(RULE=kernel_rule(sampling, call.field.kind), ACC=F32), tile, dtype
    )


def tricubic_backward(
    label, layout, dtype, sampling: Sampling, tile: Tile, acc, outputs: Outputs = Outputs(True, True)
):
    """The tricubic walk, dx by atomics and dgrid (and an affine field's moments where ``outputs`` says)."""
    call = make_call(layout)
    args = (
        *walk_args(call, dtype, outputs, dtype),
        partials(call, outputs, dtype, tile),
        call.field.points,
        sizes_of(call.x, call.field),
    )
    constexprs = dict(RULE=kernel_rule(sampling, call.field.kind), ACC=acc, OUTPUTS=constexpr_members(outputs))
    return case(label, bicubic.bicubic_bwd_kernel, args, constexprs, tile, dtype)


def tricubic_keys(label, layout, dtype, sampling: Sampling):
    call = make_call(layout)
    args = (points(call.field, dtype), pointer("i32"), *SECOND_CHUNK, call.voxels(), sizes_of(call.x, call.field))
    return case(
        label,
        bicubic.bicubic_tap_keys_kernel,
        args,
        dict(RULE=kernel_rule(sampling, call.field.kind)),
        Tile(block_w=64),
    )


def tricubic_gather(label, layout, dtype, sampling: Sampling, tile: Tile):
    """A later chunk's gather (FIRST_CHUNK false: it adds onto what dx holds)."""
    call = make_call(layout)
    args = (
        volume(call.y(), dtype),
        points(call.field, dtype),
        volume(call.x, dtype),
        pointer("i64"),
        pointer("i32"),
        SECOND_CHUNK[0],
        call.voxels(),
        sizes_of(call.x, call.field),
    )
    constexprs = dict(RULE=kernel_rule(sampling, call.field.kind), ACC=F32, FIRST_CHUNK=False)
    return case(label, bicubic.bicubic_dx_gather_kernel, args, constexprs, tile, dtype)


def _row_kernels():
    """The trilinear / nearest forward and backward as the engine launches them on a GPU
    (planner.patch_tile for a 128-wide output): float32 and half, both layouts."""
    cases = []
    for mode, interpolation in (("bilinear", BILINEAR), ("nearest", NEAREST)):
        for dtype in ("fp32", "bf16", "fp16"):
            for layout, (fwd_w, bwd_w, block_c) in (("NCDHW", (128, 128, 1)), ("NDHWC", (32, 16, 16))):
                cases.append(
                    patch_forward(
                        f"forward {mode} {dtype} {layout}",
                        layout,
                        dtype,
                        Sampling(interpolation, BORDER, False),
                        Tile(fwd_w, block_c),
                    )
                )
                # The fast mode's atomics add into a float32 buffer; nearest's dgrid is zero without a pass.
                cases.append(
                    patch_backward(
                        f"backward {mode} {dtype} {layout}",
                        layout,
                        dtype,
                        Sampling(interpolation, ZEROS, False),
                        Tile(bwd_w, block_c),
                        Outputs(True, interpolation == BILINEAR),
                    )
                )
    return cases


def _warp_kernels():
    """The fused warp's configurations: each kernel once on a displacement, float32, in both its layouts."""
    return [
        patch_forward(
            "warp forward bilinear fp32 N3DHW, reflection",
            "NCDHW warp N3DHW",
            "fp32",
            Sampling(BILINEAR, REFLECTION, True),
            Tile(128),
        ),
        patch_backward(
            "warp backward bilinear fp32 NDHW3",
            "NDHWC warp NDHW3",
            "fp32",
            Sampling(BILINEAR, BORDER, True),
            Tile(16, 16),
            Outputs(True, True),
        ),
        bucket_keys("warp bucket keys N3DHW", "NCDHW warp N3DHW", "fp32", Sampling(BILINEAR, BORDER, True)),
        sorted_records("warp sorted records N3DHW", "NCDHW warp N3DHW", "fp32", Sampling(BILINEAR, BORDER, True)),
        dx_gather(
            "warp dx gather bilinear fp32 N3DHW",
            "NCDHW warp N3DHW",
            "fp32",
            BILINEAR,
            F32,
            True,
            Tile(128),
            partials="fp32",
        ),
        tricubic_backward(
            "warp bicubic backward fp32 N3DHW",
            "NCDHW warp N3DHW",
            "fp32",
            Sampling(BICUBIC, BORDER, True),
            Tile(128),
            F32,
        ),
    ]


def _affine_kernels():
    """The affine field's configurations: alone and with a displacement, every kernel that reads positions once."""
    alone, displaced = "NCDHW affine", "NDHWC affine N3DHW"
    trilinear = Sampling(BILINEAR, BORDER, False)
    return [
        patch_forward("affine forward bilinear fp32", alone, "fp32", trilinear, Tile(128)),
        patch_backward("affine backward dtheta fp32", alone, "fp32", trilinear, Tile(128), Outputs(True, False, True)),
        patch_backward(
            "affine+displacement backward fp32 NDHWC",
            displaced,
            "fp32",
            Sampling(BILINEAR, REFLECTION, True),
            Tile(16, 16),
            Outputs(True, True, True),
        ),
        bucket_keys("affine bucket keys", alone, "fp32", trilinear),
        sorted_records("affine sorted records", alone, "fp32", trilinear),
        tricubic_forward("affine bicubic forward fp32", alone, "fp32", Sampling(BICUBIC, ZEROS, False), Tile(128)),
        tricubic_backward(
            "affine bicubic backward dtheta fp64",
            alone,
            "fp64",
            Sampling(BICUBIC, ZEROS, False),
            Tile(128),
            F64,
            Outputs(True, False, True),
        ),
        tricubic_keys("affine+displacement bicubic tap keys", displaced, "fp32", Sampling(BICUBIC, BORDER, False)),
    ]


def _bspline_kernels():
    """The B-spline's configurations, alone and with a theta: every kernel that reads positions, the walks writing
    row sums (and theta's moments) in both layouts and in float64."""
    alone, affine = "NCDHW bspline", "NDHWC bspline affine"
    trilinear = Sampling(BILINEAR, BORDER, False)
    tricubic = Sampling(BICUBIC, ZEROS, False)
    return [
        patch_forward(
            "bspline forward bilinear fp32, reflection", alone, "fp32", Sampling(BILINEAR, REFLECTION, True), Tile(128)
        ),
        patch_forward(
            "bspline+affine forward nearest bf16 NDHWC", affine, "bf16", Sampling(NEAREST, ZEROS, False), Tile(32, 16)
        ),
        patch_backward("bspline backward fp32", alone, "fp32", trilinear, Tile(128), Outputs(True, True)),
        patch_backward(
            "bspline+affine backward fp16 NDHWC", affine, "fp16", trilinear, Tile(16, 16), Outputs(True, True, True)
        ),
        patch_backward(
            "bspline backward fp64 dcontrol, reflection",
            alone,
            "fp64",
            Sampling(BILINEAR, REFLECTION, True),
            Tile(128),
            Outputs(False, True),
        ),
        patch_backward(
            "bspline backward nearest fp32",
            alone,
            "fp32",
            Sampling(NEAREST, BORDER, False),
            Tile(128),
            Outputs(True, False),
        ),
        bucket_keys("bspline bucket keys", alone, "fp32", trilinear),
        sorted_records("bspline+affine sorted records", affine, "fp32", trilinear),
        tricubic_forward("bspline bicubic forward fp32", alone, "fp32", tricubic, Tile(128)),
        tricubic_backward(
            "bspline+affine bicubic backward fp32 NDHWC",
            affine,
            "fp32",
            tricubic,
            Tile(16, 16),
            F32,
            Outputs(True, True, True),
        ),
        tricubic_keys("bspline bicubic tap keys", alone, "fp32", Sampling(BICUBIC, BORDER, False)),
        tricubic_gather("bspline bicubic dx gather fp32", alone, "fp32", tricubic, Tile(128)),
    ]


CASES = [
    *_row_kernels(),
    patch_forward(
        "forward bilinear fp32, reflection, sizes of 1",
        None,
        "fp32",
        Sampling(BILINEAR, REFLECTION, True),
        Tile(16, 1, 4, 2),
    ),
    patch_backward(
        "backward bilinear fp64 dgrid, reflection",
        "NCDHW",
        "fp64",
        Sampling(BILINEAR, REFLECTION, True),
        Tile(128),
        Outputs(False, True),
    ),
    bucket_keys("bucket keys, reflection", "NCDHW", "fp32", Sampling(BILINEAR, REFLECTION, False)),
    sorted_records("sorted records, reflection", "NCDHW", "fp32", Sampling(BILINEAR, REFLECTION, False)),
    sorted_records("sorted records nearest NDHWC", "NDHWC", "bf16", Sampling(NEAREST, ZEROS, False)),
    dx_gather("dx gather bilinear bf16 NDHWC", "NDHWC", "bf16", BILINEAR, F64, True, Tile(64, 16)),
    dx_gather("dx gather bilinear fp16 NCDHW", "NCDHW", "fp16", BILINEAR, F64, False, Tile(128)),
    dx_gather("dx gather bilinear fp32 NCDHW", "NCDHW", "fp32", BILINEAR, F32, True, Tile(128), partials="fp32"),
    bucket_partials("bucket partials bilinear fp32 NCDHW", "NCDHW", "fp32", BILINEAR, F32, 1, "fp32"),
    bucket_partials("bucket partials nearest bf16 NDHWC", "NDHWC", "bf16", NEAREST, F64, 16, "fp64"),
    dx_gather("dx gather nearest fp64, sizes of 1", None, "fp64", NEAREST, F64, True, Tile(64, 16), starts="i64"),
    tricubic_forward(
        "bicubic forward bf16 NCDHW, reflection", "NCDHW", "bf16", Sampling(BICUBIC, REFLECTION, False), Tile(128)
    ),
    tricubic_forward("bicubic forward fp32 NDHWC", "NDHWC", "fp32", Sampling(BICUBIC, BORDER, False), Tile(16, 16)),
    tricubic_backward("bicubic backward fp32 NCDHW", "NCDHW", "fp32", Sampling(BICUBIC, BORDER, True), Tile(128), F32),
    tricubic_backward(
        "bicubic backward fp64, sizes of 1", None, "fp64", Sampling(BICUBIC, BORDER, True), Tile(64), F64
    ),
    tricubic_keys("bicubic tap keys, reflection", "NCDHW", "fp32", Sampling(BICUBIC, REFLECTION, False)),
    tricubic_gather("bicubic dx gather fp32 NDHWC", "NDHWC", "fp32", Sampling(BICUBIC, ZEROS, False), Tile(64, 16)),
    *_warp_kernels(),
    *_affine_kernels(),
    *_bspline_kernels(),
]


def compile_kernel(kernel, args, kwargs):
    """(compiled kernel, its signature): bound and specialised by Triton's launcher code, then compiled as
    ``JITFunction.run`` compiles a launch's kernel."""
    binder = create_function_from_signature(kernel.signature, kernel.params, BACKEND)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(BACKEND, kwargs, bound, specialization, options)
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=TARGET, options=options.__dict__), signature


def field_names(kind):
    """The field names of a Triton argument type, records walked into (None for a value that is no record)."""
    if isinstance(kind, tl.tuple_type):
        return kind.fields, tuple(field_names(member) for member in kind.types)
    return None


class HelperInstances:
    """While compiling, the ``@triton.jit`` helpers that one instance served for records of different fields.

    Triton names a helper's instance by its argument types, and a record's type leaves out
    its field names: a second call with records of other fields (a PointStrides where the
    instance was made for a VolumeStrides) reuses the instance and reads the wrong members
    (gridsampler3d/gpu/records.py). ``collisions`` lists such helpers.
    """

    def __enter__(self):
        self.collisions, names, mangle = [], {}, code_generator.mangle_fn
        self._mangle = mangle

        def watched(name, arg_types, *rest):  # Triton 3.5 passes the constants before the caller's context
            mangled = mangle(name, arg_types, *rest)
            fields = tuple(field_names(kind) for kind in arg_types)
            if names.setdefault(mangled, fields) != fields and name not in self.collisions:
                self.collisions.append(name)
            return mangled

        code_generator.mangle_fn = watched
        return self

    def __exit__(self, *_):
        code_generator.mangle_fn = self._mangle


def leaves(value, name: str):
    """(dotted name, leaf) of a signature entry, records walked into: ``x.data``, ``x.strides.w``, ``keys``."""
    if isinstance(value, tuple):
        for field, member in zip(getattr(value, "_fields", range(len(value))), value):
            yield from leaves(member, f"{name}.{field}")
    else:
        yield name, value


def pointers(signature: dict) -> dict:
    """The dtype of each pointer: an operand by its name (``x``, ``keys``), a record's other pointers by their path
    (``sorted_points.indices``)."""
    return {
        name.removesuffix(".data"): kind[1:]
        for key, entry in signature.items()
        for name, kind in leaves(entry, key)
        if kind.startswith("*")
    }


def ones(signature: dict) -> list[str]:
    """The integer arguments the launch specialised as the constant 1 (``x.strides.w``)."""
    return [
        name
        for key, entry in signature.items()
        if entry != "constexpr"
        for name, kind in leaves(entry, key)
        if kind == "constexpr"
    ]


def _printed(member) -> str:
    """A constexpr record's member as the report prints it: an enum's name, a ``tl.constexpr``'s value."""
    return str(getattr(member, "name", getattr(member, "value", member)))


def describe(kernel, kwargs: dict) -> str:
    """The kernel's constexpr arguments, a record's fields each as ``NAME.field=value``."""
    words = []
    for param in kernel.params:
        if param.is_constexpr and param.name in kwargs:
            value = kwargs[param.name]
            fields = value._asdict().items() if hasattr(value, "_asdict") else [(None, value)]
            words += [f"{param.name}{'.' + field if field else ''}={_printed(member)}" for field, member in fields]
    return " ".join(words)


# An integer multiply on 32-bit values (scalar or tensor) in the Triton IR.
INT32_MULTIPLY = re.compile(r"arith\.muli .*: (i32|tensor<[0-9x]*xi32>)\s")


def int32_multiplies(ttir: str) -> list[str]:
    """The TTIR lines that multiply 32-bit integers: each could wrap for a size past 2**31."""
    return [line.split(" loc(")[0].strip() for line in ttir.splitlines() if INT32_MULTIPLY.search(line + " ")]


def float_remainders(ttir: str) -> dict:
    """How the TTIR takes float remainders: ``remf`` (Triton's ``%``: truncated quotient) and libdevice fmod calls."""
    return {
        "remf": sum("arith.remf" in line for line in ttir.splitlines()),
        "fmod": sum('"__nv_fmod' in line for line in ttir.splitlines()),
    }


def ptxas_command(fused: bool) -> list[str]:
    """The ptxas Triton itself runs for sm_90 (its bundled CUDA 13 one), with Triton's options and -v."""
    from triton.backends.nvidia.compiler import get_ptxas

    return [
        get_ptxas(TARGET.arch).path,
        "-lineinfo",
        *([] if fused else ["--fmad=false"]),
        "-v",
        "--regAllocOptLevel=2",
        "--gpu-name=sm_90a",
    ]


def registers(ptx: str, fused: bool) -> dict:
    """Registers and spill bytes per thread that ptxas reports for the kernel's PTX."""
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        result = subprocess.run(
            [*ptxas_command(fused), str(source), "-o", str(Path(folder) / "kernel.cubin")],
            capture_output=True,
            text=True,
            check=True,
        )
    text = result.stderr + result.stdout
    used = re.search(r"Used (\d+) registers", text)
    stores = re.search(r"(\d+) bytes spill stores", text)
    loads = re.search(r"(\d+) bytes spill loads", text)
    return {"registers": int(used.group(1)), "spill_stores": int(stores.group(1)), "spill_loads": int(loads.group(1))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the per-kernel findings here")
    parser.add_argument("--registers", action="store_true", help="run ptxas -v on each kernel (sm_90a)")
    args = parser.parse_args(argv)
    failures, records = 0, []
    for entry in CASES:
        kernel, kwargs = entry["kernel"], entry["kwargs"]
        name, constants = kernel.fn.__name__, describe(kernel, kwargs)
        try:
            with HelperInstances() as helpers:
                compiled, signature = compile_kernel(kernel, entry["args"], kwargs)
        except Exception as error:  # report every kernel, not just the first failure
            failures += 1
            print(f"FAILED {name} ({entry['label']}) {constants}: {error}", flush=True)
            continue
        ttir = compiled.asm["ttir"]
        record = {
            "label": entry["label"],
            "kernel": name,
            "pointers": pointers(signature),
            "constants": constants,
            "ones": ones(signature),
            "num_warps": compiled.metadata.num_warps,
            "enable_fp_fusion": compiled.metadata.enable_fp_fusion,
            "mixed_records": helpers.collisions,
            "int32_multiplies": int32_multiplies(ttir),
            "float_remainders": float_remainders(ttir),
            "conversions": sorted(set(re.findall(r"\bcvt(?:\.[a-z0-9]+)+", compiled.asm["ptx"]))),
        }
        if args.registers:
            record.update(registers(compiled.asm["ptx"], compiled.metadata.enable_fp_fusion))
        records.append(record)
        if helpers.collisions:  # compiled, but wrong: it reads some record through another's field names
            failures += 1
            print(
                f"FAILED {name} ({entry['label']}): records of different fields given to "
                f"{', '.join(helpers.collisions)}",
                flush=True,
            )
        else:
            print(f"compiled {name} ({entry['label']}) {constants}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    if args.registers:
        print("\n| kernel | launch | registers | spill stores / loads (bytes) |\n| --- | --- | ---: | ---: |")
        for record in records:
            tile = " ".join(
                part.removeprefix("TILE.") for part in record["constants"].split() if part.startswith("TILE.")
            )
            print(
                f"| {record['label']} | {tile} num_warps={record['num_warps']} | {record['registers']} | "
                f"{record['spill_stores']} / {record['spill_loads']} |"
            )
    return failures


if __name__ == "__main__":
    sys.exit(main())
