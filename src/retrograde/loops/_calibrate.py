"""The cost of the offloaded levels on this machine: ``python -m retrograde calibrate``.

Each level is timed with the primitives the loops use (:mod:`._offload`): one compiled program
writes ``R`` states to a fresh store and returns its handle, a second reads them back, last
first, and releases it (as a forward sweep and its reverse sweep do). A write costs the first
program's wall-clock time over ``R``, a read the second's, the best of a few runs after a
warm-up: both include the copy between the compiled program and the store (a device-to-host
transfer on an accelerator), checksums and file I/O, and the small arithmetic around them.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp

from ..schedules import Level
from ._offload import Offload
from ._offload_runs import Layout

__all__ = ["Transfer", "calibrate"]


@dataclasses.dataclass(frozen=True)
class Transfer:
    """Seconds to write one state to a level (``storage``: "host" or "disk") and to read it back.

    Example: ``Transfer('host', write_seconds=0.021, read_seconds=0.018)``.
    """

    storage: str
    write_seconds: float
    read_seconds: float


def _programs(layout: Layout, repeats: int):
    """``write(u) -> handle``: a new store with ``repeats`` states; ``read(handle, u)``: read them
    back, last first, and release the store."""

    def write(u):
        off = Offload.open(layout, n_device=0)
        for k in range(repeats):
            off.keep(jnp.int32(k), [u + k], jnp.int32(k))
        return off.handle

    def read(handle, u):
        off = Offload(layout, handle, n_device=0)
        acc = jnp.zeros_like(u)
        for k in reversed(range(repeats)):
            _, (v,) = off.fetch(jnp.int32(k), [u], jnp.int32(k))
            acc = acc + v
        off.close()
        return acc

    return jax.jit(write), jax.jit(read)


def calibrate(
    state_bytes: int, repeats: int = 4, directory: str | None = None, runs: int = 3
) -> list[Transfer]:
    """Time writes and reads of one state of ``state_bytes`` bytes (float64 when x64 is on) to
    host RAM and to disk (a temporary file in ``directory``), ``repeats`` of each per level; the
    best of ``runs`` runs after a warm-up.

    Costs ``O(runs * repeats)`` transfers per level and two compilations; needs ``repeats``
    states of host RAM and of disk.

    Example:
        >>> from retrograde.loops._calibrate import calibrate
        >>> [t.storage for t in calibrate(2**16, repeats=2, runs=1)]
        ['host', 'disk']
    """
    # jax.config's flags are attributes JAX's type information does not declare
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32  # type: ignore[attr-defined]
    u = jnp.ones((max(1, state_bytes // jnp.dtype(dtype).itemsize),), dtype)
    out = []
    for storage in ("host", "disk"):
        level = Level(
            repeats,
            name=storage,
            storage=storage,
            directory=directory if storage == "disk" else None,
        )
        layout = Layout((level,), (0,) * repeats, tuple(range(repeats)), 0)
        write, read = _programs(layout, repeats)
        jax.block_until_ready(read(write(u), u))  # compile both
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            handle = jax.block_until_ready(write(u))
            middle = time.perf_counter()
            jax.block_until_ready(read(handle, u))
            times.append((middle - start, time.perf_counter() - middle))
        out.append(
            Transfer(
                storage, min(t[0] for t in times) / repeats, min(t[1] for t in times) / repeats
            )
        )
    return out
