"""Checkpointed JAX loops built on primitives that every JAX transformation understands."""

from ._scan import default_schedule, fori_loop, scan

__all__ = ["scan", "fori_loop", "default_schedule"]
