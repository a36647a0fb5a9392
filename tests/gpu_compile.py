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
``--registers`` also prints them as a Markdown table (docs/gpu.md). Exit status: the
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
# Integer arguments a call may pass as 1 (Triton then makes them constexpr).
ONES = ("depth", "channels", "x_stride_w", "y_stride_w", "dx_stride_w", "grad_stride_w", "out_width")
F32, F64 = tl.float32, tl.float64


def compile_kernel(kernel, pointers, constants):
    """The compiled kernel; every integer argument not made constexpr is i32, as a launch with small sizes passes it."""
    signature, constexprs = {}, {}
    for name in kernel.arg_names:
        if name in constants or name in ONES:
            signature[name] = "constexpr"
            constexprs[name] = constants.get(name, 1)
        elif name in pointers:
            signature[name] = "*" + pointers[name]
        else:
            signature[name] = "i32"
    return triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs), target=TARGET)


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
     dict(INTERPOLATION=0, PADDING=1, ALIGN_CORNERS=True, ACC=F64, BLOCK_V=64, BLOCK_C=16)),
    (backward.dx_gather_kernel, data("fp16", "grad_ptr", "grid_ptr", "dx_ptr", order_ptr="i64", starts_ptr="i32"),
     dict(INTERPOLATION=0, PADDING=2, ALIGN_CORNERS=False, ACC=F64, BLOCK_V=64, BLOCK_C=16)),
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
    for kernel, pointers, constants in CASES:
        name = kernel.fn.__name__
        try:
            compiled = compile_kernel(kernel, pointers, constants)
        except Exception as error:  # report every kernel, not just the first failure
            failures += 1
            print(f"FAILED {name} {describe(constants)}: {error}", flush=True)
            continue
        ttir = compiled.asm["ttir"]
        record = {"kernel": name, "pointers": pointers, "constants": describe(constants),
                  "int32_multiplies": int32_multiplies(ttir), "float_remainders": float_remainders(ttir),
                  "conversions": sorted(set(re.findall(r"\bcvt(?:\.[a-z0-9]+)+", compiled.asm["ptx"])))}
        if args.registers:
            record.update(registers(compiled.asm["ptx"], compiled.metadata.enable_fp_fusion))
        records.append(record)
        print(f"compiled {name} {describe(constants)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    if args.registers:
        print("\n| kernel | configuration | registers | spill stores / loads (bytes) |\n| --- | --- | ---: | ---: |")
        for record in records:
            print(f"| {record['kernel']} | {record['constants']} | {record['registers']} | "
                  f"{record['spill_stores']} / {record['spill_loads']} |")
    return failures


if __name__ == "__main__":
    sys.exit(main())
