"""Triton GPU engine: coordinate rules (coords), kernels (forward, backward, bicubic), the planner, and the backend
that launches what it plans."""

from .engine import TritonBackend
from .launch import interpreter_enabled

__all__ = ["TritonBackend", "interpreter_enabled"]
