"""gridsampler3d: 3-D grid sampling and its backward (GridSampler3DGrad), exact and fast.

    y = grid_sampler3d(input, grid, ...)
    dx, dgrid = grid_sampler3d_backward(grad, input, grid, ...)
"""
from .api import grid_sampler3d, grid_sampler3d_backward
from .backends import available_backends
from .modes import DataFormat, Interpolation, Padding

__all__ = ["grid_sampler3d", "grid_sampler3d_backward", "available_backends", "Interpolation", "Padding",
           "DataFormat", "__version__"]
__version__ = "0.1.0"
