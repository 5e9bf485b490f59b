"""Where the snapshots of a taped loop live: one store per storage level of the schedule.

A snapshot of boundary ``n`` maps each block variable of ``u_n`` to an entry of one store; an
entry holds the variable's value (its pyadjoint checkpoint) and, in tangent sweeps, its tangent.
Entries are added one by one, since the taping sweep learns what ``u_n`` holds only as later
steps read it.

- :class:`MemoryStore` (``Level(storage="device")`` or ``"host"``): the entry *is* the value, held
  by reference. Sound because the manager never lets a block write into a held object: a step's
  outputs are cleared before it is recomputed, and a checkpoint that delegates to another
  variable (Firedrake's ``DelegatedFunctionCheckpoint``) is materialised before it is held.
- :class:`DiskStore` (``"disk"``, no package disk checkpointing on the tape): retrograde's own
  checksummed files (:class:`retrograde.host.Disk`), through ``_ad_to_list`` and
  ``_ad_assign_numpy``.
- :class:`PackageDiskStore` (``"disk"``, the tape carries package data such as Firedrake's
  ``enable_disk_checkpointing()``): the package writes its own checkpoints; the manager resumes
  its disk checkpointing around each entry (``continue_checkpointing``) and pauses it
  otherwise (``pause_checkpointing``).

Cost per entry: memory none; disk one write of the value (and tangent), one read per restore.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pyadjoint.block_variable import BlockVariable
from pyadjoint.tape import stop_annotating

from .._store import Disk, level_storage
from ..schedules import Level

__all__ = [
    "Snapshot",
    "MemoryStore",
    "DiskStore",
    "PackageDiskStore",
    "open_store",
    "is_delegated",
    "materialise",
    "as_checkpoint",
]


class Snapshot:
    """The entries of one stored state, or with ``data`` of one step's data: ``step``, the
    level's ``store``, ``entries`` (block variable -> entry)."""

    __slots__ = ("step", "store", "entries", "level", "data")

    def __init__(self, step: int, level: int, store, data: bool = False):
        self.step = step
        self.level = level
        self.store = store
        self.data = data
        self.entries: dict = {}

    def release(self) -> None:
        for entry in self.entries.values():
            self.store.free(entry)
        self.entries = {}


def is_delegated(value) -> bool:
    """Whether a checkpoint delegates to another block variable (``value.other``, Firedrake's
    ``DelegatedFunctionCheckpoint``) instead of holding its value."""
    return isinstance(getattr(value, "other", None), BlockVariable)


def materialise(bv: BlockVariable, value: Any) -> Any:
    """``value`` (``bv``'s checkpoint) as a self-contained object: a checkpoint that delegates to
    another block variable (``value.other``, Firedrake's ``DelegatedFunctionCheckpoint``) is
    copied out of it."""
    if is_delegated(value):
        with stop_annotating():
            return bv.output._ad_restore_at_checkpoint(value)._ad_create_checkpoint()
    return value


def as_checkpoint(bv: BlockVariable, obj: Any) -> Any:
    """An overloaded object holding ``bv``'s value, as ``bv``'s checkpoint: itself where it has
    the output's type (``AdjFloat``, Firedrake's ``Function``), else a checkpoint made of it."""
    if isinstance(obj, type(bv.output)):
        return obj
    with stop_annotating():
        return obj._ad_create_checkpoint()


class MemoryStore:
    """Entries held by reference in this process's memory."""

    def put(self, step: int, bv: BlockVariable, value: Any, tangent: Any) -> Any:
        return (value, tangent)

    def get(self, bv: BlockVariable, entry: Any) -> tuple[Any, Any]:
        return entry

    def free(self, entry: Any) -> None:
        pass

    def close(self) -> None:
        pass


class DiskStore:
    """Entries written to retrograde's checksummed snapshot files (one file per entry)."""

    def __init__(self, spec: Disk, label: str):
        self._store = spec.open(label)

    def put(self, step: int, bv: BlockVariable, value: Any, tangent: Any) -> Any:
        cls = type(bv.output)
        with stop_annotating():
            leaves = [np.asarray(cls._ad_to_list(bv.output._ad_restore_at_checkpoint(value)))]
            if tangent is not None:
                leaves.append(np.asarray(cls._ad_to_list(tangent)))
        return self._store.put(step, leaves, None)

    def get(self, bv: BlockVariable, entry: Any) -> tuple[Any, Any]:
        arrays = self._store.get(entry)
        cls = type(bv.output)
        with stop_annotating():
            out = []
            for a in arrays:
                dst, _ = cls._ad_assign_numpy(bv.output._ad_copy(), a.reshape(-1), 0)
                out.append(dst)
        value = as_checkpoint(bv, out[0])
        return value, (out[1] if len(out) > 1 else None)

    def free(self, entry: Any) -> None:
        self._store.free(entry)

    def close(self) -> None:
        self._store.close()


class PackageDiskStore:
    """Entries written by the tape's packages' own disk checkpointing (Firedrake's)."""

    def __init__(self, packages):
        self._packages = list(packages)

    def put(self, step: int, bv: BlockVariable, value: Any, tangent: Any) -> Any:
        with stop_annotating():
            for p in self._packages:
                p.continue_checkpointing()
            try:
                saved = bv.output._ad_restore_at_checkpoint(value)._ad_create_checkpoint()
                saved_t = None if tangent is None else tangent._ad_create_checkpoint()
            finally:
                for p in self._packages:
                    p.pause_checkpointing()
        return (saved, saved_t)

    def get(self, bv: BlockVariable, entry: Any) -> tuple[Any, Any]:
        saved, saved_t = entry
        with stop_annotating():
            value = as_checkpoint(bv, bv.output._ad_restore_at_checkpoint(saved))
            tangent = None if saved_t is None else bv.output._ad_restore_at_checkpoint(saved_t)
        return value, tangent

    def free(self, entry: Any) -> None:
        pass

    def close(self) -> None:
        pass


def open_store(level: Level, tape) -> MemoryStore | DiskStore | PackageDiskStore:
    """The store for one level of the schedule, from ``Level.storage`` as every driver reads it
    (:func:`retrograde._store.level_storage`); see the module docstring."""
    spec = level_storage(level)
    if not isinstance(spec, Disk):
        return MemoryStore()
    packages = list(tape._package_data.values())
    return PackageDiskStore(packages) if packages else DiskStore(spec, level.name or "disk")
