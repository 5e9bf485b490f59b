"""The host side of offloaded snapshots (:mod:`._offload`): where a compiled loop's slots live
(:class:`Layout`), each run's stores, and the transfer statistics.

A *run* is one forward sweep's set of host stores (one per offloaded level), opened by the
``open_p`` callback, written and read by ``put_p``/``get_p`` and released by ``close_p`` or when
its handle is garbage collected. Every transfer is counted in :class:`OffloadStats`.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
import weakref
from typing import Any

import numpy as np

from .._store import Snapshot, SnapshotError, Store, level_storage
from ..schedules import Level

__all__ = [
    "Layout",
    "OffloadStats",
    "Run",
    "RUNS",
    "close_run",
    "count_device_access",
    "get_snapshot",
    "offload_stats",
    "offloaded",
    "open_run",
    "put_snapshot",
    "release_offloaded",
    "release_with",
    "run_of",
    "two_level",
]


# ----------------------------------------------------------------------------- layout


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the slots of a compiled loop live.

    Slot ``k`` (as numbered in a :class:`~._tables.Tables`) is slot ``slot[k]`` of the
    schedule's level ``level[k]``; slots ``0 .. n_device - 1`` are in device memory, the others
    (the *offloaded* slots, ``j = k - n_device``) in host stores.
    """

    levels: tuple[Level, ...]
    level: tuple[int, ...]
    slot: tuple[int, ...]
    n_device: int

    @property
    def n_offloaded(self) -> int:
        return len(self.level) - self.n_device

    def describe(self, j: int) -> str:
        """``"slot 3 of level 1 (disk)"`` for offloaded slot ``j``."""
        k = self.n_device + j
        lvl = self.levels[self.level[k]]
        label = lvl.name or lvl.storage
        return f"slot {self.slot[k]} of level {self.level[k]} ({label})"


def offloaded(level: Level) -> bool:
    """Whether the compiled loops keep this level outside device memory."""
    return level.storage != "device"


def two_level(schedule: Any) -> Layout | None:
    """The layout of ``Online(snapshots, slow=...)``: ``snapshots`` device slots (level 0) and
    the slow level's slots, offloaded (level 1); ``None`` for a one-level ``Online``."""
    slow = getattr(schedule, "slow", None)
    if slow is None:
        return None
    d, h = schedule.snapshots, slow.slots
    return Layout(tuple(schedule.levels), (0,) * d + (1,) * h, tuple(range(d)) + tuple(range(h)), d)


# ----------------------------------------------------------------------------- statistics


@dataclasses.dataclass
class OffloadStats:
    """Transfers to and from host stores since the last reset, per schedule level index.

    Attributes:
        writes, reads: snapshots stored and restored (one per snapshot, whatever the batch).
        bytes_written, bytes_read: their bytes.
        write_seconds, read_seconds: time spent in the transfers (copying, hashing, file I/O).
        open_stores: stores open now (runs whose snapshots await their reverse sweep).
        held_bytes: bytes the open stores hold now (in RAM or in their files).
        device_writes, device_reads: device-slot stores and restores, counted only while
            counting is switched on (``count_device=True``; for tests).

    Example: ``retrograde.loops.offload_stats(reset=True)`` before a gradient, then
    ``offload_stats().writes`` is ``{1: 12, 2: 3}`` for 12 host and 3 disk writes.
    """

    writes: dict = dataclasses.field(default_factory=dict)
    reads: dict = dataclasses.field(default_factory=dict)
    bytes_written: dict = dataclasses.field(default_factory=dict)
    bytes_read: dict = dataclasses.field(default_factory=dict)
    write_seconds: dict = dataclasses.field(default_factory=dict)
    read_seconds: dict = dataclasses.field(default_factory=dict)
    device_writes: dict = dataclasses.field(default_factory=dict)
    device_reads: dict = dataclasses.field(default_factory=dict)
    open_stores: int = 0
    held_bytes: int = 0


_LOCK = threading.RLock()
_STATS = OffloadStats()
RUNS: dict[int, Run] = {}
_IDS = itertools.count(1)


def _add(table: dict, level: int, value) -> None:
    table[level] = table.get(level, 0) + value


def offload_stats(reset: bool = False) -> OffloadStats:
    """A copy of the transfer counters (see :class:`OffloadStats`); ``reset`` zeroes them after.

    Example:
        >>> import retrograde
        >>> retrograde.loops.offload_stats(reset=True).open_stores
        0
    """
    with _LOCK:
        copies: dict[str, Any] = {
            f.name: dict(getattr(_STATS, f.name))
            for f in dataclasses.fields(_STATS)
            if f.type == "dict"
        }
        out = dataclasses.replace(_STATS, **copies)
        out.open_stores = len(RUNS)
        out.held_bytes = sum(run.nbytes for run in RUNS.values())
        if reset:
            for f in dataclasses.fields(_STATS):
                if f.type == "dict":
                    getattr(_STATS, f.name).clear()
    return out


def release_with(handle: Any) -> None:
    """Release the store behind ``handle`` (a concrete int32 array) when that array is garbage
    collected, unless the reverse sweep that reads it released it first."""
    weakref.finalize(handle, close_run, int(np.asarray(handle)))


def release_offloaded() -> int:
    """Release every open store (their RAM and temporary files); returns how many were open.

    Stores are released by the reverse sweeps that read them. Call this after a compiled program
    was aborted by an exception (its stores stay open otherwise, until the process exits): a
    reverse sweep that still needed one of them then raises :class:`SnapshotError`.
    """
    with _LOCK:
        runs = list(RUNS.values())
        RUNS.clear()
    for run in runs:
        run.close()
    return len(runs)


# ----------------------------------------------------------------------------- stores


class Run:
    """The stores of one run of a forward sweep, one per offloaded level (a store of
    :mod:`retrograde._store`, as the host driver's), and the snapshot held in each slot."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self.stores: dict[int, Store] = {}
        self.held: dict[tuple[int, int], Snapshot] = {}  # (level, slot) -> its snapshot

    def level(self, j: int) -> tuple[int, int, Store]:
        """``(level, slot, store)`` of offloaded slot ``j``."""
        k = self.layout.n_device + j
        lvl = self.layout.level[k]
        store = self.stores.get(lvl)
        if store is None:
            spec = self.layout.levels[lvl]
            label = f"level {lvl} ({spec.name or spec.storage})"
            store = self.stores[lvl] = level_storage(spec, unnamed=True).open(label)
        return lvl, self.layout.slot[k], store

    def write(self, j: int, step: int, arrays: list) -> int:
        """Store ``arrays`` (the state ``u_step``) in offloaded slot ``j``; its level. The slot
        reads as empty until the write completes."""
        lvl, slot, store = self.level(j)
        old = self.held.pop((lvl, slot), None)
        if old is not None:
            store.free(old)
        self.held[(lvl, slot)] = store.put(step, arrays)
        return lvl

    def read(self, j: int) -> tuple[int, int | None, Any]:
        """``(level, step, arrays)`` held in offloaded slot ``j`` (``step`` ``None``: empty); the
        arrays are read-only (they are copied to the device)."""
        lvl, slot, store = self.level(j)
        snap = self.held.get((lvl, slot))
        if snap is None:
            return lvl, None, None
        return lvl, snap.step, store.get(snap, copy=False)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.stores.values())

    def close(self) -> None:
        stores = list(self.stores.values())
        self.stores.clear()
        self.held.clear()
        for store in stores:
            store.close()


def run_of(handle: Any, what: str) -> Run:
    with _LOCK:
        run = RUNS.get(int(handle))
    if run is None:
        raise SnapshotError(
            f"retrograde: cannot {what}: the host snapshots of this loop's forward sweep were "
            "released, because the reverse sweep that reads them already ran (a function "
            "returned by jax.vjp or jax.linearize, when its loop keeps snapshots on the host or "
            "on disk, reverses once; call jax.vjp again), or by release_offloaded()."
        )
    return run


def open_run(layout: Layout) -> int:
    global _IDS
    run = Run(layout)
    with _LOCK:
        handle = next(_IDS)
        if handle >= 2**31 - 1:  # int32 handles: start over (older stores are long released)
            _IDS = itertools.count(1)
            handle = next(_IDS)
        RUNS[handle] = run
    return handle


def close_run(handle: int) -> None:
    with _LOCK:
        run = RUNS.pop(int(handle), None)
    if run is not None:
        run.close()


def put_snapshot(handle: Any, j: Any, step: Any, arrays: Any) -> None:
    run = run_of(handle, f"store the snapshot of step {int(step)}")
    start = time.perf_counter()
    try:
        lvl = run.write(int(j), int(step), arrays)
    except BaseException:
        close_run(handle)  # the run cannot go on: release what it holds now
        raise
    seconds = time.perf_counter() - start
    with _LOCK:
        _add(_STATS.writes, lvl, 1)
        _add(_STATS.bytes_written, lvl, sum(a.nbytes for a in arrays))
        _add(_STATS.write_seconds, lvl, seconds)


def get_snapshot(handle: Any, j: Any, step: Any, avals: Any) -> tuple:
    step = int(step)
    run = run_of(handle, f"restore the snapshot of step {step}")
    start = time.perf_counter()
    try:
        lvl, held, arrays = run.read(int(j))
    except BaseException:
        close_run(handle)
        raise
    if held != step:
        close_run(handle)
        where = run.layout.describe(int(j))
        raise SnapshotError(
            f"retrograde: the snapshot of step {step} is missing from {where}: "
            + ("the slot is empty." if held is None else f"it holds step {held}.")
        )
    for i, (a, aval) in enumerate(zip(arrays, avals)):
        if a.shape != aval.shape or a.dtype != aval.dtype:
            close_run(handle)
            raise SnapshotError(
                f"retrograde: the snapshot of step {step} in {run.layout.describe(int(j))} has "
                f"leaf {i} of {a.dtype}{list(a.shape)}, but the reverse sweep expects "
                f"{aval.dtype}{list(aval.shape)}."
            )
    seconds = time.perf_counter() - start
    with _LOCK:
        _add(_STATS.reads, lvl, 1)
        _add(_STATS.bytes_read, lvl, sum(a.nbytes for a in arrays))
        _add(_STATS.read_seconds, lvl, seconds)
    return tuple(arrays)


def count_device_access(kind: str, layout: Layout, k: Any) -> None:
    table = _STATS.device_writes if kind == "write" else _STATS.device_reads
    with _LOCK:
        _add(table, layout.level[int(k)], 1)
