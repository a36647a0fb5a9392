"""Compile every Triton kernel for an sm_90 GPU without one (run by tests/test_gpu.py in a subprocess).

Triton's interpreter runs kernels as Python and so misses what only the compiler checks
(globals that are not constexpr, integer arguments equal to 1 arriving as constexpr, type
rules). This compiles each kernel in its main configurations through Triton's real
pipeline, down to a cubin, with the sizes and unit strides Triton specialises as 1.
Exit status: the number of kernels that failed to compile.
"""
import os
import sys

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("run without TRITON_INTERPRET: the interpreter replaces the compiler")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from gridsampler3d.gpu import backward, bicubic, forward  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
# Integer arguments a call may pass as 1 (Triton then makes them constexpr).
ONES = ("depth", "channels", "x_stride_w", "y_stride_w", "dx_stride_w", "grad_stride_w", "out_width")
F32, F64 = tl.float32, tl.float64


def compile_kernel(kernel, pointers, constants):
    signature, constexprs = {}, {}
    for name in kernel.arg_names:
        if name in constants or name in ONES:
            signature[name] = "constexpr"
            constexprs[name] = constants.get(name, 1)
        elif name in pointers:
            signature[name] = "*" + pointers[name]
        else:
            signature[name] = "i32"
    triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs), target=TARGET)


def data(dtype, *names, **others):
    return {**{name: dtype for name in names}, **others}


CASES = [
    (forward.grid_sampler3d_fwd_kernel, data("fp32", "x_ptr", "grid_ptr", "y_ptr"),
     dict(INTERPOLATION=0, PADDING=2, ALIGN_CORNERS=True, ACC=F32, BLOCK_P=128, BLOCK_C=16)),
    (forward.grid_sampler3d_fwd_kernel, data("bf16", "x_ptr", "grid_ptr", "y_ptr"),
     dict(INTERPOLATION=1, PADDING=1, ALIGN_CORNERS=False, ACC=F32, BLOCK_P=128, BLOCK_C=16)),
    (backward.grid_sampler3d_bwd_kernel, data("fp32", "grad_ptr", "x_ptr", "grid_ptr", "dx_ptr", "dgrid_ptr"),
     dict(INTERPOLATION=0, PADDING=1, ALIGN_CORNERS=False, ACC=F32, WANT_DX=True, WANT_DGRID=True, BLOCK_P=64,
          BLOCK_C=16)),
    (backward.grid_sampler3d_bwd_kernel, data("fp64", "grad_ptr", "x_ptr", "grid_ptr", "dx_ptr", "dgrid_ptr"),
     dict(INTERPOLATION=0, PADDING=2, ALIGN_CORNERS=True, ACC=F64, WANT_DX=False, WANT_DGRID=True, BLOCK_P=64,
          BLOCK_C=1)),
    (backward.grid_sampler3d_bwd_kernel, data("fp16", "grad_ptr", "x_ptr", "grid_ptr", "dgrid_ptr", dx_ptr="fp32"),
     dict(INTERPOLATION=1, PADDING=0, ALIGN_CORNERS=False, ACC=F32, WANT_DX=True, WANT_DGRID=False, BLOCK_P=64,
          BLOCK_C=16)),
    (backward.bucket_keys_kernel, data("fp32", "grid_ptr", keys_ptr="i64"),
     dict(INTERPOLATION=0, PADDING=2, ALIGN_CORNERS=False, BLOCK_P=256)),
    (backward.dx_gather_kernel, data("bf16", "grad_ptr", "grid_ptr", "dx_ptr", order_ptr="i64", starts_ptr="i32"),
     dict(INTERPOLATION=0, PADDING=1, ALIGN_CORNERS=True, ACC=F32, BLOCK_V=64, BLOCK_C=16)),
    (backward.dx_gather_kernel, data("fp64", "grad_ptr", "grid_ptr", "dx_ptr", order_ptr="i64", starts_ptr="i64"),
     dict(INTERPOLATION=1, PADDING=0, ALIGN_CORNERS=False, ACC=F64, BLOCK_V=64, BLOCK_C=16)),
    (bicubic.bicubic_fwd_kernel, data("bf16", "x_ptr", "grid_ptr", "y_ptr"),
     dict(PADDING=2, ALIGN_CORNERS=False, ACC=F32, BLOCK_P=128, BLOCK_C=16)),
    (bicubic.bicubic_bwd_kernel, data("fp64", "grad_ptr", "x_ptr", "grid_ptr", "dx_ptr", "dgrid_ptr"),
     dict(PADDING=1, ALIGN_CORNERS=True, ACC=F64, WANT_DX=True, WANT_DGRID=True, BLOCK_P=64, BLOCK_C=1)),
    (bicubic.bicubic_tap_keys_kernel, data("fp32", "grid_ptr", keys_ptr="i64"),
     dict(PADDING=2, ALIGN_CORNERS=False, BLOCK_P=64)),
    (bicubic.bicubic_dx_gather_kernel, data("fp32", "grad_ptr", "grid_ptr", "dx_ptr", order_ptr="i64",
                                            starts_ptr="i32"),
     dict(ALIGN_CORNERS=False, ACC=F32, FIRST_CHUNK=False, BLOCK_V=64, BLOCK_C=16)),
]


def main() -> int:
    failures = 0
    for kernel, pointers, constants in CASES:
        try:
            compile_kernel(kernel, pointers, constants)
            print(f"compiled {kernel.fn.__name__} {constants}", flush=True)
        except Exception as error:  # report every kernel, not just the first failure
            failures += 1
            print(f"FAILED {kernel.fn.__name__} {constants}: {error}", flush=True)
    return failures


if __name__ == "__main__":
    sys.exit(main())
