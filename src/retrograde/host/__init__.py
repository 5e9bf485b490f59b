"""Checkpointed reverse mode for time loops driven from Python (``import retrograde.host``).

Each step runs on its own, outside one compiled program: a JAX function ``step(n, state, params)``
(jitted once; VJP and JVP from JAX) or a :class:`Step` with a hand-written adjoint for NumPy or
SciPy code. The schedules of :mod:`retrograde.schedules` decide what is stored, where
(:class:`Memory`, :class:`Disk`) and what is recomputed.

Example:
    >>> import numpy as np
    >>> import retrograde.host as rh
    >>> from retrograde.schedules import Revolve
    >>> step = rh.Step(forward=lambda n, u, a: u + 0.01 * a * np.sin(u),
    ...                vjp=lambda n, u, a, b: (b * (1 + 0.01 * a * np.cos(u)),
    ...                                        0.01 * np.sum(b * np.sin(u))))
    >>> loss = rh.Final(lambda n, u, a: 0.5 * np.sum(u**2), grad=lambda n, u, a: (u, 0.0))
    >>> J, g = rh.value_and_grad(step, loss, np.ones(4), 1.5, 1000, schedule=Revolve(10))
    >>> round(float(J), 3)                 # u_N is close to pi: J = 2 u_N**2
    19.739
"""

from .._store import Disk, Memory, SnapshotError, StaleDir, Storage, remove_stale
from ._api import HessianProduct, Tangents, forward, hvp, jvp, value_and_grad
from ._driver import PROGRESS_THRESHOLD, Counts, ForwardPass, Grads
from ._step import Final, Running, Step

__all__ = [
    "Step",
    "Running",
    "Final",
    "Memory",
    "Disk",
    "Storage",
    "SnapshotError",
    "remove_stale",
    "StaleDir",
    "forward",
    "value_and_grad",
    "hvp",
    "jvp",
    "ForwardPass",
    "Grads",
    "Counts",
    "HessianProduct",
    "Tangents",
    "PROGRESS_THRESHOLD",
]
