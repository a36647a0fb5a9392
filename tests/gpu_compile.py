"""Compile every Triton kernel for an sm_90 GPU without one (run by tests/test_gpu.py in a subprocess).

Triton's interpreter runs kernels as Python and so misses what only the compiler checks
(globals that are not constexpr, integer arguments equal to 1 arriving as constexpr, type
rules) and what only the generated code shows (32-bit integer arithmetic, how a float
remainder is computed). This compiles each kernel in its main configurations through
Triton's real pipeline, down to a cubin, with the sizes and unit strides Triton
specialises as 1, and reports per kernel what its Triton IR holds:

    python tests/gpu_compile.py [--json FILE] [--registers]

``--json`` writes one record per compiled configuration (name, constants, the int32
multiplies left in its TTIR, whether a float remainder is an exact fmod, the PTX
conversions it uses, and with
``--registers`` the registers and spill bytes that ``ptxas -v`` reports for sm_90a).
``--registers`` also prints them as a Markdown table (docs/gpu.md):

    TRITON_DEFAULT_FP_FUSION=1 python tests/gpu_compile.py --registers
 Exit status: the
number of kernels that failed to compile.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("run without TRITON_INTERPRET: the interpreter replaces the compiler")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from gridsampler3d.gpu import backward, bicubic, forward  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
F32, F64 = tl.float32, tl.float64
# Integer arguments a launch passes as 1 (Triton makes them constexpr): the unit strides of
# each layout and of the grid and its gradient. The "sizes of 1" configuration also has
# one-voxel sizes. The fused warp ("warp" layouts) reads an NCDHW volume and a displacement
# (N, 3, D, H, W) whose unit stride is along w, or (N, D, H, W, 3) whose unit stride is the component's.
UNIT_STRIDES = {"NCDHW": ("x_stride_w", "y_stride_w", "dx_stride_w", "grad_stride_w", "grid_stride_k",
                          "dgrid_stride_k"),
                "NDHWC": ("x_stride_c", "y_stride_c", "dx_stride_c", "grad_stride_c", "grid_stride_k",
                          "dgrid_stride_k"),
                "NCDHW warp N3DHW": ("x_stride_w", "y_stride_w", "dx_stride_w", "grad_stride_w", "grid_stride_w",
                                     "dgrid_stride_w"),
                "NDHWC warp NDHW3": ("x_stride_c", "y_stride_c", "dx_stride_c", "grad_stride_c", "grid_stride_k",
                                     "dgrid_stride_k")}
SIZES_OF_ONE = ("depth", "channels", "x_stride_w", "y_stride_w", "dx_stride_w", "grad_stride_w", "out_width")
# Integer arguments not divisible by 16 in a 128^3, C = 16 launch (Triton marks the others
# as multiples of 16, as it marks every 16-byte aligned pointer).
NOT_DIVISIBLE = ("grid_stride_w", "first_point", "last_point")


def compile_kernel(kernel, pointers, constants, ones=SIZES_OF_ONE, num_warps=4):
    """The compiled kernel, specialised as a launch specialises it: integer arguments in ``ones``
    are the constexpr 1, the others i32 (a launch with sizes below 2**31 passes them so),
    and pointers and multiples of 16 carry Triton's divisibility hint."""
    signature, constexprs, attrs = {}, {}, {}
    for index, name in enumerate(kernel.arg_names):
        if name in constants or name in ones:
            signature[name] = "constexpr"
            constexprs[name] = constants.get(name, 1)
            continue
        signature[name] = "*" + pointers[name] if name in pointers else "i32"
        if name in pointers or (name not in NOT_DIVISIBLE and ones is not SIZES_OF_ONE):
            attrs[(index,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=TARGET, options={"num_warps": num_warps})


def data(dtype, *names, **others):
    return {**{name: dtype for name in names}, **others}


def case(label, kernel, pointers, constants, layout=None, num_warps=4):
    """A configuration the engine launches (``layout`` given: realistic specialisation) or, without
    a layout, one with sizes of 1, which only checks that the kernel compiles with them. A layout
    with "warp" in its name is the fused warp's (``VOXELS``); the others sample at a grid."""
    constants = {**constants, "VOXELS": layout is not None and "warp" in layout}
    return {"label": label, "kernel": kernel, "pointers": pointers, "constants": constants,
            "ones": UNIT_STRIDES[layout] if layout else SIZES_OF_ONE, "num_warps": num_warps}


def _row_kernels():
    """The trilinear / nearest forward and backward as the engine launches them on a GPU
    (engine._patch_tile for a 128-wide output): float32 and half, both layouts."""
    cases = []
    for mode, interpolation in (("bilinear", 0), ("nearest", 1)):
        for dtype in ("fp32", "bf16", "fp16"):
            for layout, (fwd_w, bwd_w, block_c) in (("NCDHW", (128, 128, 1)), ("NDHWC", (32, 16, 16))):
                patch = dict(BLOCK_D=1, BLOCK_H=1, BLOCK_C=block_c)
                cases.append(case(f"forward {mode} {dtype} {layout}", forward.grid_sampler3d_fwd_kernel,
                                  data(dtype, "x_ptr", "grid_ptr", "y_ptr"),
                                  dict(INTERPOLATION=interpolation, PADDING=1, ALIGN_CORNERS=False, ACC=F32,
                                       BLOCK_W=fwd_w, **patch), layout))
                dx = "fp32"  # the fast mode's atomics add into a float32 buffer
                cases.append(case(f"backward {mode} {dtype} {layout}", backward.grid_sampler3d_bwd_kernel,
                                  data(dtype, "grad_ptr", "x_ptr", "grid_ptr", "dgrid_ptr", dx_ptr=dx),
                                  dict(INTERPOLATION=interpolation, PADDING=0, ALIGN_CORNERS=False, ACC=F32,
                                       WANT_DX=True, WANT_DGRID=interpolation == 0, BLOCK_W=bwd_w, **patch), layout))
    return cases


def _warp_kernels():
    """The fused warp's configurations: each kernel once with ``VOXELS``, float32, in both displacement layouts."""
    flat = data("fp32", "grad_ptr", "dx_ptr", records_ptr="fp64", grad_offsets_ptr="i64", starts_ptr="i32",
                chunk_starts_ptr="i32", partials_ptr="fp32")
    return [
        case("warp forward bilinear fp32 N3DHW, reflection", forward.grid_sampler3d_fwd_kernel,
             data("fp32", "x_ptr", "grid_ptr", "y_ptr"),
             dict(INTERPOLATION=0, PADDING=2, ALIGN_CORNERS=True, ACC=F32, BLOCK_D=1, BLOCK_H=1, BLOCK_W=128,
                  BLOCK_C=1), "NCDHW warp N3DHW"),
        case("warp backward bilinear fp32 NDHW3", backward.grid_sampler3d_bwd_kernel,
             data("fp32", "grad_ptr", "x_ptr", "grid_ptr", "dx_ptr", "dgrid_ptr"),
             dict(INTERPOLATION=0, PADDING=1, ALIGN_CORNERS=True, ACC=F32, WANT_DX=True, WANT_DGRID=True, BLOCK_D=1,
                  BLOCK_H=1, BLOCK_W=16, BLOCK_C=16), "NDHWC warp NDHW3"),
        case("warp bucket keys N3DHW", backward.bucket_keys_kernel, data("fp32", "grid_ptr", keys_ptr="i32"),
             dict(INTERPOLATION=0, PADDING=1, ALIGN_CORNERS=True, BLOCK_P=256), "NCDHW warp N3DHW"),
        case("warp sorted records N3DHW", backward.sorted_records_kernel,
             data("fp32", "grid_ptr", order_ptr="i64", records_ptr="fp64", grad_offsets_ptr="i64"),
             dict(INTERPOLATION=0, PADDING=1, ALIGN_CORNERS=True, BLOCK_P=256), "NCDHW warp N3DHW"),
        case("warp dx gather bilinear fp32 N3DHW", backward.dx_gather_kernel, flat,
             dict(INTERPOLATION=0, ACC=F32, SPLIT=True, BLOCK_V=128, BLOCK_C=1),
             "NCDHW warp N3DHW"),
        case("warp bicubic backward fp32 N3DHW", bicubic.bicubic_bwd_kernel,
             data("fp32", "grad_ptr", "x_ptr", "grid_ptr", "dx_ptr", "dgrid_ptr"),
             dict(PADDING=1, ALIGN_CORNERS=True, ACC=F32, WANT_DX=True, WANT_DGRID=True, BLOCK_P=128, BLOCK_C=1),
             "NCDHW warp N3DHW"),
    ]


CASES = [
    *_row_kernels(),
    case("forward bilinear fp32, reflection, sizes of 1", forward.grid_sampler3d_fwd_kernel,
         data("fp32", "x_ptr", "grid_ptr", "y_ptr"),
         dict(INTERPOLATION=0, PADDING=2, ALIGN_CORNERS=True, ACC=F32, BLOCK_D=2, BLOCK_H=4, BLOCK_W=16, BLOCK_C=1)),
    case("backward bilinear fp64 dgrid, reflection", backward.grid_sampler3d_bwd_kernel,
         data("fp64", "grad_ptr", "x_ptr", "grid_ptr", "dx_ptr", "dgrid_ptr"),
         dict(INTERPOLATION=0, PADDING=2, ALIGN_CORNERS=True, ACC=F64, WANT_DX=False, WANT_DGRID=True, BLOCK_D=1,
              BLOCK_H=1, BLOCK_W=128, BLOCK_C=1), "NCDHW"),
    case("bucket keys, reflection", backward.bucket_keys_kernel, data("fp32", "grid_ptr", keys_ptr="i32"),
         dict(INTERPOLATION=0, PADDING=2, ALIGN_CORNERS=False, BLOCK_P=256), "NCDHW"),
    case("sorted records, reflection", backward.sorted_records_kernel,
         data("fp32", "grid_ptr", order_ptr="i64", records_ptr="fp64", grad_offsets_ptr="i64"),
         dict(INTERPOLATION=0, PADDING=2, ALIGN_CORNERS=False, BLOCK_P=256), "NCDHW"),
    case("sorted records nearest NDHWC", backward.sorted_records_kernel,
         data("bf16", "grid_ptr", order_ptr="i64", records_ptr="fp64", grad_offsets_ptr="i64"),
         dict(INTERPOLATION=1, PADDING=0, ALIGN_CORNERS=False, BLOCK_P=256), "NDHWC"),
    case("dx gather bilinear bf16 NDHWC", backward.dx_gather_kernel,
         data("bf16", "grad_ptr", "dx_ptr", records_ptr="fp64", grad_offsets_ptr="i64", starts_ptr="i32",
              chunk_starts_ptr="i32", partials_ptr="fp64"),
         dict(INTERPOLATION=0, ACC=F64, SPLIT=True, BLOCK_V=64, BLOCK_C=16), "NDHWC"),
    case("dx gather bilinear fp16 NCDHW", backward.dx_gather_kernel,
         data("fp16", "grad_ptr", "dx_ptr", records_ptr="fp64", grad_offsets_ptr="i64", starts_ptr="i32",
              chunk_starts_ptr="i32", partials_ptr="fp64"),
         dict(INTERPOLATION=0, ACC=F64, SPLIT=False, BLOCK_V=128, BLOCK_C=1), "NCDHW"),
    case("dx gather bilinear fp32 NCDHW", backward.dx_gather_kernel,
         data("fp32", "grad_ptr", "dx_ptr", "partials_ptr", records_ptr="fp64", grad_offsets_ptr="i64",
              starts_ptr="i32", chunk_starts_ptr="i32"),
         dict(INTERPOLATION=0, ACC=F32, SPLIT=True, BLOCK_V=128, BLOCK_C=1), "NCDHW"),
    case("bucket partials bilinear fp32 NCDHW", backward.bucket_partials_kernel,
         data("fp32", "grad_ptr", "partials_ptr", records_ptr="fp64", grad_offsets_ptr="i64", chunk_first_ptr="i64",
              chunk_count_ptr="i32"),
         dict(INTERPOLATION=0, ACC=F32, CHUNK=256, BLOCK_K=64, BLOCK_C=1), "NCDHW"),
    case("bucket partials nearest bf16 NDHWC", backward.bucket_partials_kernel,
         data("bf16", "grad_ptr", records_ptr="fp64", grad_offsets_ptr="i64", chunk_first_ptr="i64",
              chunk_count_ptr="i32", partials_ptr="fp64"),
         dict(INTERPOLATION=1, ACC=F64, CHUNK=256, BLOCK_K=64, BLOCK_C=16), "NDHWC"),
    case("dx gather nearest fp64, sizes of 1", backward.dx_gather_kernel,
         data("fp64", "grad_ptr", "dx_ptr", "partials_ptr", records_ptr="fp64", grad_offsets_ptr="i64",
              starts_ptr="i64", chunk_starts_ptr="i64"),
         dict(INTERPOLATION=1, ACC=F64, SPLIT=True, BLOCK_V=64, BLOCK_C=16)),
    case("bicubic forward bf16 NCDHW, reflection", bicubic.bicubic_fwd_kernel,
         data("bf16", "x_ptr", "grid_ptr", "y_ptr"),
         dict(PADDING=2, ALIGN_CORNERS=False, ACC=F32, BLOCK_P=128, BLOCK_C=1), "NCDHW"),
    case("bicubic forward fp32 NDHWC", bicubic.bicubic_fwd_kernel, data("fp32", "x_ptr", "grid_ptr", "y_ptr"),
         dict(PADDING=1, ALIGN_CORNERS=False, ACC=F32, BLOCK_P=16, BLOCK_C=16), "NDHWC"),
    case("bicubic backward fp32 NCDHW", bicubic.bicubic_bwd_kernel,
         data("fp32", "grad_ptr", "x_ptr", "grid_ptr", "dgrid_ptr", dx_ptr="fp32"),
         dict(PADDING=1, ALIGN_CORNERS=True, ACC=F32, WANT_DX=True, WANT_DGRID=True, BLOCK_P=128, BLOCK_C=1), "NCDHW"),
    case("bicubic backward fp64, sizes of 1", bicubic.bicubic_bwd_kernel,
         data("fp64", "grad_ptr", "x_ptr", "grid_ptr", "dx_ptr", "dgrid_ptr"),
         dict(PADDING=1, ALIGN_CORNERS=True, ACC=F64, WANT_DX=True, WANT_DGRID=True, BLOCK_P=64, BLOCK_C=1)),
    case("bicubic tap keys, reflection", bicubic.bicubic_tap_keys_kernel, data("fp32", "grid_ptr", keys_ptr="i32"),
         dict(PADDING=2, ALIGN_CORNERS=False, BLOCK_P=64), "NCDHW"),
    case("bicubic dx gather fp32 NDHWC", bicubic.bicubic_dx_gather_kernel,
         data("fp32", "grad_ptr", "grid_ptr", "dx_ptr", order_ptr="i64", starts_ptr="i32"),
         dict(ALIGN_CORNERS=False, ACC=F32, FIRST_CHUNK=False, BLOCK_V=64, BLOCK_C=16), "NDHWC"),
    *_warp_kernels(),
]

# An integer multiply on 32-bit values (scalar or tensor) in the Triton IR.
INT32_MULTIPLY = re.compile(r"arith\.muli .*: (i32|tensor<[0-9x]*xi32>)\s")


def int32_multiplies(ttir: str) -> list[str]:
    """The TTIR lines that multiply 32-bit integers: each could wrap for a size past 2**31."""
    return [line.split(" loc(")[0].strip() for line in ttir.splitlines() if INT32_MULTIPLY.search(line + " ")]


def float_remainders(ttir: str) -> dict:
    """How the TTIR takes float remainders: ``remf`` (Triton's ``%``: truncated quotient) and libdevice fmod calls."""
    return {"remf": sum("arith.remf" in line for line in ttir.splitlines()),
            "fmod": sum('"__nv_fmod' in line for line in ttir.splitlines())}


def ptxas_command(fused: bool) -> list[str]:
    """The ptxas Triton itself runs for sm_90 (its bundled CUDA 13 one), with Triton's options and -v."""
    from triton.backends.nvidia.compiler import get_ptxas

    return [get_ptxas(TARGET.arch).path, "-lineinfo", *([] if fused else ["--fmad=false"]), "-v",
            "--regAllocOptLevel=2", "--gpu-name=sm_90a"]


def registers(ptx: str, fused: bool) -> dict:
    """Registers and spill bytes per thread that ptxas reports for the kernel's PTX."""
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        result = subprocess.run([*ptxas_command(fused), str(source), "-o", str(Path(folder) / "kernel.cubin")],
                                capture_output=True, text=True, check=True)
    text = result.stderr + result.stdout
    used = re.search(r"Used (\d+) registers", text)
    stores = re.search(r"(\d+) bytes spill stores", text)
    loads = re.search(r"(\d+) bytes spill loads", text)
    return {"registers": int(used.group(1)), "spill_stores": int(stores.group(1)), "spill_loads": int(loads.group(1))}


def describe(constants: dict) -> str:
    return " ".join(f"{key}={getattr(value, 'name', value)}" for key, value in constants.items())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the per-kernel findings here")
    parser.add_argument("--registers", action="store_true", help="run ptxas -v on each kernel (sm_90a)")
    args = parser.parse_args(argv)
    failures, records = 0, []
    for entry in CASES:
        kernel, constants = entry["kernel"], entry["constants"]
        name = kernel.fn.__name__
        try:
            compiled = compile_kernel(kernel, entry["pointers"], constants, entry["ones"], entry["num_warps"])
        except Exception as error:  # report every kernel, not just the first failure
            failures += 1
            print(f"FAILED {name} ({entry['label']}) {describe(constants)}: {error}", flush=True)
            continue
        ttir = compiled.asm["ttir"]
        record = {"label": entry["label"], "kernel": name, "pointers": entry["pointers"],
                  "constants": describe(constants), "num_warps": entry["num_warps"],
                  "int32_multiplies": int32_multiplies(ttir), "float_remainders": float_remainders(ttir),
                  "conversions": sorted(set(re.findall(r"\bcvt(?:\.[a-z0-9]+)+", compiled.asm["ptx"])))}
        if args.registers:
            record.update(registers(compiled.asm["ptx"], compiled.metadata.enable_fp_fusion))
        records.append(record)
        print(f"compiled {name} ({entry['label']}) {describe(constants)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    if args.registers:
        print("\n| kernel | launch | registers | spill stores / loads (bytes) |\n| --- | --- | ---: | ---: |")
        for record in records:
            blocks = " ".join(part for part in record["constants"].split() if part.startswith("BLOCK_"))
            print(f"| {record['label']} | {blocks} num_warps={record['num_warps']} | {record['registers']} | "
                  f"{record['spill_stores']} / {record['spill_loads']} |")
    return failures


if __name__ == "__main__":
    sys.exit(main())
