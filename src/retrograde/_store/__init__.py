"""Snapshot stores outside a compiled program, shared by both drivers: the host driver
(:mod:`retrograde.host`) and the compiled loops' host and disk levels (:mod:`retrograde.loops`).

It lies below both (it imports only :mod:`retrograde.schedules` and NumPy) and holds:

- :class:`SnapshotError` and the checksum :func:`digest` (:mod:`._base`), with the
  :class:`Store` protocol: ``put`` copies a state in, ``get`` copies it out, ``free`` releases it;
- one RAM store, :class:`MemoryStore` (:mod:`._memory`), and one file store, :class:`FileStore`
  (:mod:`._files`: a private named directory, or one unnamed file);
- the specifications :class:`Memory` and :class:`Disk`, and :func:`level_storage`, the one
  reading of ``Level(storage=...)`` (:mod:`._specs`);
- the clean-up of snapshot directories (:mod:`._cleanup`): owner records, SIGTERM/SIGHUP,
  :func:`remove_stale`.

Snapshots are *copies*: every leaf is converted to a C-contiguous NumPy array and copied when
stored, and copied again when restored, so a step that updates its input arrays in place can
corrupt neither a snapshot nor the adjoint. Unchanged leaves are shared between consecutive
snapshots (RAM compares bytes, files compare the digests they keep anyway).

The public names are re-exported by :mod:`retrograde.host` (``Memory``, ``Disk``,
``SnapshotError``, ``remove_stale``, ``StaleDir``, ``Storage``).
"""

from ._base import Snapshot, SnapshotError, Store, digest
from ._cleanup import DIR_PREFIX, OWNER_FILE, StaleDir, remove_stale
from ._files import FileStore
from ._memory import MemoryStore
from ._specs import Disk, Memory, Storage, level_storage

__all__ = [
    "DIR_PREFIX",
    "OWNER_FILE",
    "Disk",
    "FileStore",
    "Memory",
    "MemoryStore",
    "Snapshot",
    "SnapshotError",
    "StaleDir",
    "Storage",
    "Store",
    "digest",
    "level_storage",
    "remove_stale",
]
