"""gridsampler3d: 3-D grid sampling and its backward (GridSampler3DGrad), exact and fast.

```python
y = grid_sampler3d(input, grid, ...)
dx, dgrid = grid_sampler3d_backward(grad, input, grid, ...)
y = grid_sample(input, grid, mode, padding_mode, align_corners)   # differentiable
y = warp(volume, displacement)                                    # fused: identity + displacement
y = affine_warp(volume, theta, size, displacement=None)           # fused: F.affine_grid's theta (+ displacement)
y = bspline_warp(volume, control_points, size, theta=None)        # fused: a cubic B-spline deformation
```

The names below are the package's public API. The other pages of this reference:

- `gridsampler3d.precision`: the precision rule (MARE, MERE, RMSE against the float64 golden);
- `gridsampler3d.cpu.planner`: the CPU engine's plan of a call, as `explain` returns it;
- `gridsampler3d.bspline`: the B-spline field's basis, control grid and the grids of SimpleITK and deepali;
- `gridsampler3d.monai`: drop-ins for MONAI's `Affine`, `RandAffine`, `Affined` and `RandAffined` on the fused
  affine field (it imports MONAI);
- `gridsampler3d.onnx`: export as ONNX's standard GridSample;
- `gridsampler3d.tools.golden_kit`: cases with their float64 golden, and the verdict on another
  implementation's outputs.
"""

from . import requirements  # noqa: F401 - first: refuses a torch older than the custom ops need
from .api import (
    affine_warp3d,
    affine_warp3d_backward,
    bspline_warp3d,
    bspline_warp3d_backward,
    explain,
    grid_sampler3d,
    grid_sampler3d_backward,
    warp3d,
    warp3d_backward,
)
from .backends import available_backends
from .modes import DataFormat, DisplacementFormat, Interpolation, Padding
from .nn import AffineWarp3d, BSplineWarp3d, Warp3d, affine_warp, bspline_warp, grid_sample, integrate_velocity, warp
from .patch import is_patched, patch_torch, patched, unpatch_torch

__all__ = [
    "grid_sampler3d",
    "grid_sampler3d_backward",
    "grid_sample",
    "warp",
    "warp3d",
    "warp3d_backward",
    "Warp3d",
    "affine_warp",
    "affine_warp3d",
    "affine_warp3d_backward",
    "AffineWarp3d",
    "bspline_warp",
    "bspline_warp3d",
    "bspline_warp3d_backward",
    "BSplineWarp3d",
    "integrate_velocity",
    "explain",
    "patch_torch",
    "unpatch_torch",
    "patched",
    "is_patched",
    "available_backends",
    "Interpolation",
    "Padding",
    "DataFormat",
    "DisplacementFormat",
    "__version__",
]
__version__ = "0.1.0"
"""The package's version (PEP 440); the build takes it from here."""
