"""Time the first forward and backward in this process (docs/cpu.md, "Compilation").

NUMBA_CACHE_DIR=$(mktemp -d) python benchmarks/first_call.py   # cold: kernels compile
python benchmarks/first_call.py                                 # warm: kernels load from the cache
python benchmarks/first_call.py --warp                          # the fused warp instead
"""

import sys
import time

start = time.perf_counter()
import torch  # noqa: E402

import gridsampler3d as gs  # noqa: E402
from gridsampler3d.tools import inputs  # noqa: E402

imported = time.perf_counter()
x = torch.randn(1, 2, 16, 16, 16)
if "--warp" in sys.argv[1:]:
    displacement = 2 * torch.randn(1, 3, 16, 16, 16)
    y = gs.warp3d(x, displacement, backend="numba")
    forward = time.perf_counter()
    gs.warp3d_backward(torch.ones_like(y), x, displacement, backend="numba")
else:
    grid = inputs.warp_grid(1, 16)
    y = gs.grid_sampler3d(x, grid, backend="numba")
    forward = time.perf_counter()
    gs.grid_sampler3d_backward(torch.ones_like(y), x, grid, backend="numba")
backward = time.perf_counter()
print(
    f"import {imported - start:.2f} s, first forward {forward - imported:.2f} s, "
    f"first backward {backward - forward:.2f} s, together {backward - imported:.2f} s"
)
