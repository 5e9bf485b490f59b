"""Snapshot storage for host-driven loops: RAM (:class:`Memory`) and files (:class:`Disk`).

A snapshot is a *copy* of the whole state pytree at one step: every leaf is converted to a
C-contiguous NumPy array and copied when stored, and copied again when restored, so a step that
updates its input arrays in place can corrupt neither a snapshot nor the adjoint.

Leaf sharing rule: when a snapshot is stored, each leaf is compared with the leaf at the same
position of the most recent snapshot still held on the same store. If both have the same shape,
dtype and bytes, the new snapshot references the stored leaf instead of copying it again (in RAM
one array, on disk one file region, written once). RAM compares the bytes directly (a few sampled
elements first, so changing leaves are rejected cheaply); disk compares the leaves' blake2b
digests, which it computes anyway for the checksum. A shared leaf lives until the last snapshot
that references it is freed.

``Memory`` and ``Disk`` are specifications: each run of the driver opens private live stores from
them and closes them at the end (or when its handle is closed), so one specification can be
reused for many runs.

Disk directories are removed on close, on exceptions, at exit, and on SIGTERM/SIGHUP (handlers
installed only while a directory exists, chained to the previous ones). Each directory records
its owner (host, process id, process start time) in a file ``owner``, so that
:func:`remove_stale` (``retrograde clean``) can find directories whose process was killed.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = ["Memory", "Disk", "SnapshotError", "Storage", "remove_stale", "StaleDir"]

#: How long a snapshot directory's name starts (``retrograde-[r<rank>-]p<pid>-...``).
DIR_PREFIX = "retrograde-"
#: The file in each snapshot directory that names its owner process.
OWNER_FILE = "owner"


class SnapshotError(RuntimeError):
    """A snapshot is missing, was freed, or failed its checksum. Names the step concerned.

    Example: a snapshot file changed on disk between its write and its read raises
    ``SnapshotError("snapshot of step 37 on disk failed its checksum: ...")``.
    """


def _to_host(x) -> np.ndarray:
    """A NumPy view (or, for device arrays, a host copy) of one leaf."""
    return np.asarray(x)


def _same_bytes(new: np.ndarray, old: np.ndarray) -> bool:
    """Exact byte equality of two arrays of equal shape and dtype, cheap to reject."""
    if new.shape != old.shape or new.dtype != old.dtype:
        return False
    if new.size == 0:
        return True
    a = new.reshape(-1)
    b = old.reshape(-1)
    stride = max(1, a.size // 16)
    try:
        sa = np.ascontiguousarray(a[::stride]).view(np.uint8)
        sb = np.ascontiguousarray(b[::stride]).view(np.uint8)
        if not np.array_equal(sa, sb) or a[-1:].tobytes() != b[-1:].tobytes():
            return False
        a8 = np.ascontiguousarray(a).view(np.uint8)
        b8 = np.ascontiguousarray(b).view(np.uint8)
    except (TypeError, ValueError):  # object arrays and the like: never shared
        return False
    block = 1 << 20  # compare in blocks: no temporary the size of the state
    return all(np.array_equal(a8[i:i + block], b8[i:i + block]) for i in range(0, a8.size, block))


def _digest(arr: np.ndarray) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    if arr.size:
        h.update(memoryview(np.ascontiguousarray(arr.reshape(-1)).view(np.uint8)))
    return h.digest()


class _Snapshot:
    """A stored state: its step, its pytree structure and its leaf records."""

    __slots__ = ("step", "treedef", "leaves", "store", "alive", "taken", "__weakref__")

    def __init__(self, step, treedef, leaves, store):
        self.step = step
        self.treedef = treedef
        self.leaves = leaves
        self.store = store
        self.alive = True
        self.taken = False  # its arrays were handed over on its last read


class _LiveStore:
    """An open store. ``put`` copies a state in, ``get`` copies it out (or, on the snapshot's last
    read, ``take=True``, may hand its arrays over), ``free`` releases it."""

    kind = "memory"

    def __init__(self, label: str):
        self.label = label
        self.writes = 0
        self.reads = 0
        self.nbytes = 0  # bytes held now (shared leaves counted once)
        self.peak_nbytes = 0
        self.shared_leaves = 0  # leaves stored by reference instead of copied
        self._last: _Snapshot | None = None
        self._held: set[_Snapshot] = set()
        self.closed = False

    # -- interface used by the driver --
    def put(self, step: int, leaves: Sequence[Any], treedef) -> _Snapshot:
        if self.closed:
            raise SnapshotError(f"cannot store the snapshot of step {step}: the {self.label} store "
                                "is closed.")
        arrays = [_to_host(x) for x in leaves]
        prev = self._last.leaves if (self._last is not None and self._last.alive) else None
        records = self._write(step, arrays, prev)
        snap = _Snapshot(step, treedef, records, self)
        self._held.add(snap)
        self._last = snap
        self.writes += 1
        self.peak_nbytes = max(self.peak_nbytes, self.nbytes)
        return snap

    def get(self, snap: _Snapshot, take: bool = False) -> list[np.ndarray]:
        """The snapshot's leaves as new arrays of the caller's own. ``take``: this is its last
        read (it is freed next), so a RAM store may hand over its arrays instead of copying."""
        if not snap.alive or snap.taken:
            raise SnapshotError(
                f"snapshot of step {snap.step} in {self.label} was already "
                f"{'freed' if not snap.alive else 'handed over on its last read'}; a freed "
                "snapshot is never replaced by a live value."
            )
        self.reads += 1
        out = self._read(snap, take)
        if take:
            snap.taken = True
        return out

    def free(self, snap: _Snapshot) -> None:
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
    def _write(self, step, arrays, prev):
        raise NotImplementedError

    def _read(self, snap, take):
        raise NotImplementedError

    def _release(self, snap):
        raise NotImplementedError


class _RamLeaf:
    __slots__ = ("array", "refs")

    def __init__(self, array):
        self.array = array
        self.refs = 1


class _MemoryStore(_LiveStore):
    kind = "memory"

    def _write(self, step, arrays, prev):
        records = []
        for i, a in enumerate(arrays):
            old = prev[i] if prev is not None and i < len(prev) else None
            if old is not None and old.array is not None and _same_bytes(a, old.array):
                old.refs += 1
                self.shared_leaves += 1
                records.append(old)
            else:
                copy = np.array(a, copy=True, order="C")
                self.nbytes += copy.nbytes
                records.append(_RamLeaf(copy))
        return records

    def _read(self, snap, take):
        out = []
        for r in snap.leaves:
            if take and r.refs == 1:  # nothing else refers to it: hand it over
                out.append(r.array)
                self.nbytes -= r.array.nbytes
                r.array = None
            else:
                out.append(np.array(r.array, copy=True))
        return out

    def _release(self, snap):
        for r in snap.leaves:
            r.refs -= 1
            if r.refs == 0 and r.array is not None:
                self.nbytes -= r.array.nbytes
                r.array = None
        snap.leaves = ()


class _DiskLeaf:
    __slots__ = ("file", "offset", "dtype", "shape", "nbytes", "digest")

    def __init__(self, file, offset, dtype, shape, nbytes, digest):
        self.file = file
        self.offset = offset
        self.dtype = dtype
        self.shape = shape
        self.nbytes = nbytes
        self.digest = digest


class _DiskStore(_LiveStore):
    kind = "disk"

    def __init__(self, label: str, directory: str | None, rank: int | None):
        super().__init__(label)
        if directory is not None:
            try:
                os.makedirs(directory, exist_ok=True)
            except OSError as e:
                raise OSError(e.errno, f"{e.strerror}: cannot create the snapshot directory's "
                              f"parent for the {label} store", directory) from e
        self.rank = rank
        self.pid = os.getpid()  # a forked child must not remove the files
        tag = f"r{rank}-" if rank is not None else ""
        self.path = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{tag}p{os.getpid()}-", dir=directory)
        self._finalizer = weakref.finalize(self, _remove_dir, self.path, os.getpid())
        _SIGNALS.add(self.path)
        try:
            with open(os.path.join(self.path, OWNER_FILE), "w") as fh:
                json.dump(_owner(), fh)
        except BaseException:
            self._finalizer()
            raise
        self._ids = itertools.count()
        self._file_refs: dict[str, int] = {}
        self._file_size: dict[str, int] = {}

    def _file_name(self, step: int) -> str:
        tag = f"r{self.rank}-" if self.rank is not None else ""
        return os.path.join(self.path, f"{tag}step{step}-{next(self._ids)}.snap")

    def _write(self, step, arrays, prev):
        path = self._file_name(step)
        tmp = path + ".tmp"
        records = []
        offset = 0
        try:
            with open(tmp, "wb") as fh:
                for i, a in enumerate(arrays):
                    if not a.flags.c_contiguous:  # (np.ascontiguousarray would make 0-d 1-d)
                        a = a.copy(order="C")
                    if a.dtype.hasobject:
                        raise TypeError(
                            f"state leaf {i} at step {step} has dtype object; only numeric "
                            "arrays can be written to disk."
                        )
                    digest = _digest(a)
                    old = prev[i] if prev is not None and i < len(prev) else None
                    if (old is not None and old.digest == digest and old.dtype == a.dtype
                            and old.shape == a.shape):
                        self._file_refs[old.file] += 1
                        self.shared_leaves += 1
                        records.append(old)
                        continue
                    _write_bytes(fh, a)
                    records.append(_DiskLeaf(path, offset, a.dtype, a.shape, a.nbytes, digest))
                    offset += a.nbytes
            os.replace(tmp, path)  # atomic: a snapshot file is complete or absent
        except BaseException as e:
            for r in records:
                if r.file != path:
                    self._file_refs[r.file] -= 1
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(e, OSError) and e.errno is not None:
                hint = (" (the disk is full: free space there, or give Disk(directory=...) on a "
                        "larger file system)" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "")
                raise OSError(e.errno, f"{e.strerror}: cannot write the snapshot of step {step} "
                              f"of the {self.label} store{hint}", tmp) from e
            raise
        # the snapshot's own file counts one reference per leaf stored in it
        own = sum(1 for r in records if r.file == path)
        self._file_refs[path] = own
        self._file_size[path] = offset
        self.nbytes += offset
        if own == 0:
            self._drop_file(path)
        return records

    def _read(self, snap, take):  # a fresh buffer per read, whether taken or not
        out = []
        handles: dict[str, Any] = {}
        try:
            for i, r in enumerate(snap.leaves):
                buf = np.empty(r.shape, dtype=r.dtype)
                if r.nbytes:
                    fh = handles.get(r.file)
                    if fh is None:
                        try:
                            fh = handles[r.file] = open(r.file, "rb")
                        except FileNotFoundError:
                            raise SnapshotError(
                                f"snapshot of step {snap.step} on disk is missing: file {r.file} "
                                "does not exist (was it deleted by someone else?)."
                            ) from None
                    fh.seek(r.offset)
                    got = fh.readinto(memoryview(buf.reshape(-1).view(np.uint8)))
                    if got != r.nbytes:
                        raise SnapshotError(
                            f"snapshot of step {snap.step} on disk is truncated: leaf {i} in "
                            f"{r.file} has {got} of {r.nbytes} bytes."
                        )
                if _digest(buf) != r.digest:
                    raise SnapshotError(
                        f"snapshot of step {snap.step} on disk failed its checksum: leaf {i} in "
                        f"{r.file} does not match the blake2b digest written with it (the file "
                        "was modified or the disk is failing)."
                    )
                out.append(buf)
        finally:
            for fh in handles.values():
                fh.close()
        return out

    def _drop_file(self, path):
        self._file_refs.pop(path, None)
        self.nbytes -= self._file_size.pop(path, 0)
        if os.getpid() != self.pid:
            return
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def _release(self, snap):
        for r in snap.leaves:
            self._file_refs[r.file] -= 1
            if self._file_refs[r.file] == 0:
                self._drop_file(r.file)
        snap.leaves = ()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._finalizer()  # removes the directory, whatever happened


def _write_bytes(fh, a: np.ndarray) -> None:
    if a.size:
        fh.write(memoryview(a.reshape(-1).view(np.uint8)))


def _remove_dir(path: str, pid: int) -> None:
    """Remove a snapshot directory, in the process that made it only (not in a forked child
    that exits or is terminated)."""
    _SIGNALS.discard(path)
    if os.getpid() == pid:
        shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# Signals: remove the live snapshot directories on SIGTERM/SIGHUP.


class _SignalGuard:
    """While snapshot directories exist, SIGTERM and SIGHUP (how batch schedulers stop jobs)
    remove them before the signal takes its usual effect.

    Handlers are installed (from the main thread only) when the first directory is made, and the
    previous ones restored when the last is removed. On a signal whose previous handler is the
    default action, the directories are removed, the default restored and the signal raised again
    (the process ends as it would have). A previous Python handler is called instead: if it
    raises (``sys.exit``), unwinding closes the runs, which remove their directories; if it
    returns, the run goes on with its snapshots. Ignored signals, and handlers not installed
    from Python, are left alone.
    """

    NAMES = ("SIGTERM", "SIGHUP")

    def __init__(self):
        self.dirs: dict[str, int] = {}  # path -> the process that made it
        self.previous: dict[int, Any] = {}
        self.lock = threading.RLock()

    def add(self, path: str) -> None:
        with self.lock:
            self.dirs[path] = os.getpid()
            if len(self.dirs) == 1:
                self._install()

    def discard(self, path: str) -> None:
        with self.lock:
            self.dirs.pop(path, None)
            if not self.dirs:
                self._restore()

    def _install(self):
        if threading.current_thread() is not threading.main_thread():
            return
        for name in self.NAMES:
            sig = getattr(signal, name, None)
            if sig is None or sig in self.previous:
                continue
            prev = signal.getsignal(sig)
            if prev is None or prev == signal.SIG_IGN:
                continue
            try:
                signal.signal(sig, _on_signal)
            except (ValueError, OSError):  # pragma: no cover - not the main interpreter
                continue
            self.previous[sig] = prev

    def _restore(self):
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, prev in list(self.previous.items()):
            if signal.getsignal(sig) is _on_signal:  # not replaced by someone else since
                signal.signal(sig, prev)
            del self.previous[sig]

    def remove_all(self) -> None:
        for path, pid in list(self.dirs.items()):
            if pid == os.getpid():
                shutil.rmtree(path, ignore_errors=True)


_SIGNALS = _SignalGuard()


def _on_signal(signum, frame):
    prev = _SIGNALS.previous.get(signum, signal.SIG_DFL)
    if callable(prev):
        return prev(signum, frame)
    _SIGNALS.remove_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


# ----------------------------------------------------------------------------------------------
# Owners of snapshot directories, and directories left by processes that were killed.


def _start_time(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux), or ``None``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _owner() -> dict:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _start_time(pid)}


def _alive(pid: int, start: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    now = _start_time(pid)
    return start is None or now is None or now == start  # a different start: the id was reused


class StaleDir(NamedTuple):
    """One snapshot directory seen by :func:`remove_stale`: its ``path``, owner ``host`` and
    ``pid`` (``None`` when unknown), and ``action``: "removed", "stale" (``dry_run``), or why it
    was kept ("running", "other host", "no owner record").

    Example: ``StaleDir('/tmp/retrograde-p4242-x1', 'node7', 4242, 'removed')``.
    """

    path: str
    host: str | None
    pid: int | None
    action: str


def remove_stale(directory: str | os.PathLike | None = None, *,
                 dry_run: bool = False) -> list[StaleDir]:
    """Remove snapshot directories whose process died without cleaning up (SIGKILL, abort,
    power loss).

    Looks at the ``retrograde-*`` directories directly in ``directory`` (default: the system's
    temporary directory, where ``Disk()`` puts them) and removes those whose owner process, on
    this host, no longer runs (a process id that was reused counts as gone, where the start time
    is known). Directories of running processes, of other hosts (run this there) and without
    an owner record are kept. Also available as ``retrograde clean [DIRECTORY] [--dry-run]``.

    Returns:
        One :class:`StaleDir` per directory seen.

    Example:
        >>> import retrograde.host as rh
        >>> stale = rh.remove_stale("/scratch/me")  # doctest: +SKIP
        >>> [d.path for d in stale if d.action == "removed"]  # doctest: +SKIP
        ['/scratch/me/retrograde-p31337-3kq9x_a1']
    """
    directory = tempfile.gettempdir() if directory is None else os.fspath(directory)
    host = socket.gethostname()
    seen = []
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    for entry in entries:
        if not entry.name.startswith(DIR_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            with open(os.path.join(entry.path, OWNER_FILE)) as fh:
                owner = json.load(fh)
            pid, owner_host, start = int(owner["pid"]), str(owner["host"]), owner.get("start")
        except (OSError, ValueError, KeyError, TypeError):
            seen.append(StaleDir(entry.path, None, None, "no owner record"))
            continue
        if owner_host != host:
            action = "other host"
        elif _alive(pid, start):
            action = "running"
        elif dry_run:
            action = "stale"
        else:
            shutil.rmtree(entry.path, ignore_errors=True)
            action = "removed" if not os.path.exists(entry.path) else "could not be removed"
        seen.append(StaleDir(entry.path, owner_host, pid, action))
    return seen


class Storage:
    """Base class of storage specifications (:class:`Memory`, :class:`Disk`).

    Example: ``storage={"memory": rh.Memory(), "disk": rh.Disk("/scratch/run1")}`` maps
    the levels of a ``MultiLevel`` schedule to stores; ``storage=rh.Disk()`` puts every level on
    disk.
    """

    def open(self, label: str) -> _LiveStore:  # pragma: no cover - abstract
        raise NotImplementedError


class Memory(Storage):
    """Snapshots held in host RAM as private NumPy copies.

    Example:
        >>> import retrograde.host as rh
        >>> storage = rh.Memory()
    """

    def open(self, label: str = "memory") -> _LiveStore:
        return _MemoryStore(label)

    def __repr__(self):
        return "Memory()"


class Disk(Storage):
    """Snapshots written to files in a private temporary directory.

    Each run creates ``tempfile.mkdtemp(prefix="retrograde-[r<rank>-]p<pid>-", dir=directory)``
    with a file ``owner`` (host, process id, start time); every snapshot is one file there,
    written atomically (a ``.tmp`` file then ``os.replace``), with a blake2b digest per leaf
    kept in memory and verified on every read; a file is deleted when its snapshot (and every
    snapshot sharing a leaf with it) is freed, and the directory is removed when the run ends,
    its handle is closed or garbage collected, on an exception, at exit, and on SIGTERM or SIGHUP
    (then the signal takes its usual effect). A directory left by a killed process (SIGKILL) is
    removed by :func:`remove_stale` (``retrograde clean``). A failed write (disk full) raises
    ``OSError`` naming the step and the file.

    Args:
        directory: where to create the private directory (created if missing); ``None`` for the
            system temporary directory.
        rank: the MPI rank, put into directory and file names so that ranks sharing a file system
            never collide. ``None``: taken from ``comm`` if given, else from the MPI launcher's
            environment (``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``, ``PMIX_RANK``) if present.
        comm: an ``mpi4py`` communicator to read the rank from (optional).

    Example:
        >>> import retrograde.host as rh
        >>> storage = rh.Disk("/scratch/me")    # doctest: +SKIP
    """

    def __init__(self, directory: str | os.PathLike | None = None, *, rank: int | None = None,
                 comm: Any = None):
        if directory is not None and not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"Disk(directory=...) must be a path or None, got {directory!r}.")
        self.directory = None if directory is None else os.fspath(directory)
        if self.directory is not None:
            _check_directory(self.directory)
        if rank is None and comm is not None:
            rank = int(comm.Get_rank())
        if rank is None:
            for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
                if os.environ.get(var, "").isdigit():
                    rank = int(os.environ[var])
                    break
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise ValueError(f"Disk(rank={rank!r}) must be a non-negative int or None.")
        self.rank = rank

    def open(self, label: str = "disk") -> _LiveStore:
        return _DiskStore(label, self.directory, self.rank)

    def __repr__(self):
        return f"Disk({self.directory!r}, rank={self.rank!r})"


def _check_directory(directory: str) -> None:
    """``directory`` is, or can be made, a writable directory."""
    probe = os.path.abspath(directory)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise NotADirectoryError(
            f"Disk(directory={directory!r}): {probe} is a file, not a directory; give a "
            "directory for the snapshot files (it is created if missing)."
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise PermissionError(
            f"Disk(directory={directory!r}): {probe} is not writable; give a directory you "
            "can write to."
        )


def resolve_storage(storage, levels) -> list[Storage]:
    """One storage specification per schedule level.

    ``storage`` may be ``None`` (by level name: a level whose name contains "disk" goes to
    :class:`Disk`, every other to :class:`Memory`), one :class:`Storage` for every level, the
    strings ``"memory"``/``"disk"``, a sequence with one entry per level, or a mapping from level
    index or level name to a storage.
    """
    n = len(levels)

    def one(s, where):
        if isinstance(s, Storage):
            return s
        if isinstance(s, str):
            key = s.lower()
            if key in ("memory", "ram", "host"):
                return Memory()
            if key == "disk":
                return Disk()
        raise TypeError(
            f"storage{where} must be retrograde.host.Memory(), retrograde.host.Disk(directory), "
            f"'memory' or 'disk'; got {s!r}."
        )

    if storage is None:
        return [Disk() if "disk" in (lvl.name or "").lower() else Memory() for lvl in levels]
    if isinstance(storage, (Storage, str)):
        return [one(storage, "") for _ in levels]
    if isinstance(storage, Mapping):
        out = []
        names = [lvl.name for lvl in levels]
        for key in storage:
            if not (key in range(n) or key in names):
                raise ValueError(
                    f"storage has the key {key!r}, but the schedule's levels are "
                    f"{list(range(n))} named {names}; key the mapping by level index or name."
                )
        for i, lvl in enumerate(levels):
            if i in storage:
                out.append(one(storage[i], f"[{i}]"))
            elif lvl.name in storage:
                out.append(one(storage[lvl.name], f"[{lvl.name!r}]"))
            else:
                raise ValueError(
                    f"storage gives no store for level {i} ({lvl.name!r}) of the schedule; add "
                    f"storage[{i}] = Memory() or Disk(...)."
                )
        return out
    if isinstance(storage, Sequence):
        if len(storage) != n:
            raise ValueError(
                f"storage has {len(storage)} entries but the schedule has {n} levels; give one "
                "store per level."
            )
        return [one(s, f"[{i}]") for i, s in enumerate(storage)]
    raise TypeError(
        f"storage must be None, Memory(), Disk(...), a list with one per level, or a mapping "
        f"level -> store; got {storage!r}."
    )
