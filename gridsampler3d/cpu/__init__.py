"""CPU engine: Numba kernels (coordinate rules, forward, backward) and their backend adapter."""

from .engine import NumbaBackend

__all__ = ["NumbaBackend"]
