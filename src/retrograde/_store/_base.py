"""What every snapshot store shares: :class:`SnapshotError`, the checksum (:func:`digest`), the
stored :class:`Snapshot` and the :class:`Store` protocol with its bookkeeping."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["SnapshotError", "Snapshot", "Store", "digest"]


class SnapshotError(RuntimeError):
    """A snapshot is missing, was freed, or failed its checksum. Names the step concerned.

    Example: a snapshot file changed on disk between its write and its read raises
    ``SnapshotError("snapshot of step 37 on disk failed its checksum: ...")``.
    """


def digest(arr: np.ndarray) -> bytes:
    """The checksum of an array's bytes (blake2b, 16 bytes), kept with each leaf written to disk
    and verified on every read."""
    h = hashlib.blake2b(digest_size=16)
    if arr.size:
        h.update(np.ascontiguousarray(arr.reshape(-1)).view(np.uint8).data)
    return h.digest()


class Snapshot:
    """A stored state: its step, its pytree structure (``None`` when the caller keeps it), its
    leaf records (the store's) and the store holding it."""

    __slots__ = ("step", "treedef", "leaves", "store", "alive", "taken", "__weakref__")

    def __init__(self, step: int, treedef: Any, leaves: list, store: Store):
        self.step = step
        self.treedef = treedef
        self.leaves = leaves
        self.store = store
        self.alive = True
        self.taken = False  # its arrays were handed over on its last read


class Store:
    """An open store. ``put`` copies a state in, ``get`` copies it out (or, on the snapshot's last
    read, ``take=True``, may hand its arrays over), ``free`` releases it, ``close`` releases all.

    Leaf sharing: each leaf put is compared with the leaf at the same position of the most recent
    snapshot still held; an equal one (shape, dtype and bytes) is referenced instead of stored
    again, and lives until the last snapshot referencing it is freed.

    Counters: ``writes``, ``reads``, ``nbytes`` (held now, shared leaves once), ``peak_nbytes``,
    ``shared_leaves`` (leaves stored by reference).
    """

    kind = "memory"

    def __init__(self, label: str):
        self.label = label
        self.writes = 0
        self.reads = 0
        self.nbytes = 0
        self.peak_nbytes = 0
        self.shared_leaves = 0
        self._last: Snapshot | None = None
        self._held: set[Snapshot] = set()
        self.closed = False

    def put(self, step: int, leaves: Sequence[Any], treedef: Any = None) -> Snapshot:
        """Store a copy of ``leaves`` (arrays, or anything ``np.asarray`` takes), ``u_step``."""
        if self.closed:
            raise SnapshotError(
                f"cannot store the snapshot of step {step}: the {self.label} store is closed."
            )
        arrays = [np.asarray(x) for x in leaves]
        prev = self._last.leaves if (self._last is not None and self._last.alive) else None
        records = self._write(step, arrays, prev)
        snap = Snapshot(step, treedef, records, self)
        self._held.add(snap)
        self._last = snap
        self.writes += 1
        self.peak_nbytes = max(self.peak_nbytes, self.nbytes)
        return snap

    def get(self, snap: Snapshot, take: bool = False, copy: bool = True) -> list[np.ndarray]:
        """The snapshot's leaves as new arrays of the caller's own. ``take``: this is its last
        read (it is freed next), so a RAM store may hand over its arrays instead of copying.
        ``copy=False``: the caller only reads them before the snapshot is freed (a transfer to a
        device), so a RAM store may return its own arrays, read-only."""
        if not snap.alive or snap.taken:
            raise SnapshotError(
                f"snapshot of step {snap.step} in {self.label} was already "
                f"{'freed' if not snap.alive else 'handed over on its last read'}; a freed "
                "snapshot is never replaced by a live value."
            )
        self.reads += 1
        out = self._read(snap, take, copy)
        if take:
            snap.taken = True
        return out

    def free(self, snap: Snapshot) -> None:
        if not snap.alive:
            return
        snap.alive = False
        self._held.discard(snap)
        if self._last is snap:
            self._last = None
        self._release(snap)

    def close(self) -> None:
        for snap in list(self._held):
            self.free(snap)
        self.closed = True

    # -- backend hooks --
    def _write(self, step: int, arrays: list[np.ndarray], prev: list | None) -> list:
        raise NotImplementedError

    def _read(self, snap: Snapshot, take: bool, copy: bool) -> list[np.ndarray]:
        raise NotImplementedError

    def _release(self, snap: Snapshot) -> None:
        raise NotImplementedError
