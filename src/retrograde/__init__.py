"""retrograde: checkpointed differentiation of long time-stepping loops.

- :mod:`retrograde.schedules`: checkpointing schedules in pure Python (no JAX).
- :func:`retrograde.scan`, :func:`retrograde.fori_loop`: ``jax.lax`` loops whose every derivative
  runs in memory bounded by a schedule.
- :mod:`retrograde.host`: the same schedules for Python-level loops (NumPy/SciPy or JAX steps).

JAX-dependent parts are imported on first use, so ``import retrograde.schedules`` stays light.
"""

from __future__ import annotations

import importlib

from . import schedules

__version__ = "0.1.0"

_LAZY = {
    "scan": ("retrograde.loops", "scan"),
    "fori_loop": ("retrograde.loops", "fori_loop"),
    "while_loop": ("retrograde.loops", "while_loop"),
    "default_schedule": ("retrograde.loops", "default_schedule"),
    "loops": ("retrograde.loops", None),
    "host": ("retrograde.host", None),
    "diffrax": ("retrograde.diffrax", None),
}

__all__ = ["schedules", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        module_name, attr = _LAZY[name]
        module = importlib.import_module(module_name)
        value = module if attr is None else getattr(module, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'retrograde' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])
