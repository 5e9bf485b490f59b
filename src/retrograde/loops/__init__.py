"""Checkpointed JAX loops built on primitives that every JAX transformation understands."""

from . import _adj_jvp_p, _adj_p, _fwd_p, _tan_p  # noqa: F401 (the primitives and their rules)
from ._offload_runs import OffloadStats, offload_stats, release_offloaded
from ._scan import default_schedule, fori_loop, scan
from ._while import while_loop

__all__ = [
    "scan",
    "fori_loop",
    "while_loop",
    "default_schedule",
    "offload_stats",
    "release_offloaded",
    "OffloadStats",
]
