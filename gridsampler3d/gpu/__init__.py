"""Triton GPU engine: coordinate rules (coords), forward, backward, and the backend that launches them."""
from .engine import TritonBackend, interpreter_enabled

__all__ = ["TritonBackend", "interpreter_enabled"]
