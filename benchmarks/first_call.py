"""Time the first forward and backward in this process (docs/cpu.md, "Compilation").

    NUMBA_CACHE_DIR=$(mktemp -d) python benchmarks/first_call.py   # cold: kernels compile
    python benchmarks/first_call.py                                 # warm: kernels load from the cache
"""
import time

start = time.perf_counter()
import torch  # noqa: E402

import gridsampler3d as gs  # noqa: E402
from gridsampler3d import cases  # noqa: E402

imported = time.perf_counter()
x = torch.randn(1, 2, 16, 16, 16)
grid = cases.warp_grid(1, 16)
y = gs.grid_sampler3d(x, grid, backend="numba")
forward = time.perf_counter()
gs.grid_sampler3d_backward(torch.ones_like(y), x, grid, backend="numba")
backward = time.perf_counter()
print(f"import {imported - start:.2f} s, first forward {forward - imported:.2f} s, "
      f"first backward {backward - forward:.2f} s, together {backward - imported:.2f} s")
