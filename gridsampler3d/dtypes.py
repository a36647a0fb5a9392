"""The dtypes the operator takes, and what each engine computes them in: the one home of the dtype rules.

    float16, bfloat16   sums in float32 or better; every sum that ends in half precision rounded once
                        (:func:`.rounding.round_once`); the CPU engine widens them to float64
    float32             computed in float32 (the CPU engine: float64 positions, float32 stores)
    float64             float64 throughout

docs/semantics.md, "Dtypes", says which sums of which engine run in which precision.
"""

from __future__ import annotations

import torch

__all__ = ["DTYPES", "FLOAT_DTYPES", "HALF_DTYPES", "HALF_NAMES", "dtype_name", "cpu_kernel_dtype"]

#: The dtypes the operator takes, by the names the golden kit's files, the commands, the plans and the tables use.
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
FLOAT_DTYPES = tuple(DTYPES.values())
#: The half-precision dtypes: computed in float32 or better, their sums rounded once.
HALF_DTYPES = (torch.float16, torch.bfloat16)
HALF_NAMES = ("float16", "bfloat16")
#: The dtypes the CPU kernels compute in; others are widened to float64 (NumPy has no bfloat16).
CPU_KERNEL_DTYPES = (torch.float32, torch.float64)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``: the name plans, files and tables use."""
    return str(dtype).removeprefix("torch.")


def cpu_kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the CPU kernels compute data of ``dtype`` in: itself for float32 and float64, else float64."""
    return dtype if dtype in CPU_KERNEL_DTYPES else torch.float64
