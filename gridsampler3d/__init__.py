"""gridsampler3d: 3-D grid sampling and its backward (GridSampler3DGrad), exact and fast.

    y = grid_sampler3d(input, grid, ...)
    dx, dgrid = grid_sampler3d_backward(grad, input, grid, ...)
    y = grid_sample(input, grid, mode, padding_mode, align_corners)   # differentiable
"""
from . import requirements  # noqa: F401 - first: refuses a torch older than the custom ops need
from .api import grid_sampler3d, grid_sampler3d_backward
from .backends import available_backends
from .modes import DataFormat, Interpolation, Padding
from .patch import is_patched, patch_torch, patched, unpatch_torch
from .torch_ops import Warp3d, grid_sample

__all__ = ["grid_sampler3d", "grid_sampler3d_backward", "grid_sample", "Warp3d", "patch_torch", "unpatch_torch",
           "patched", "is_patched", "available_backends", "Interpolation", "Padding", "DataFormat", "__version__"]
__version__ = "0.1.0"
