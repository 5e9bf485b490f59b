"""Snapshots in files: each leaf's bytes in a region of a file, with its blake2b digest (kept in
memory) verified on every read; unchanged leaves shared (their digests compared).

A put writes the leaves it does not share as one *block*; a block lives until the last snapshot
referencing one of its leaves is freed. Where blocks go is the store's *placement*:

- :class:`_Directory` (``Disk()``, the host driver's default): a private directory
  ``retrograde-[r<rank>-]p<pid>-...`` with an ``owner`` record; each block is one file
  ``[r<rank>-]step<n>-<i>.snap``, written as ``.tmp`` then renamed (a snapshot file is complete or
  absent), deleted when freed. The directory is removed on close, on garbage collection, at exit
  and on SIGTERM/SIGHUP (:mod:`._cleanup`); :func:`~._cleanup.remove_stale` removes those of
  killed processes.
- :class:`_UnnamedFile` (``Disk(unnamed=True)``, the compiled loops' disk levels): one
  ``tempfile.TemporaryFile`` (no name in the file system, so nothing is left behind whatever ends
  the process); each block a region of it, freed regions reused by later blocks. A block is
  registered only once written, so a snapshot being written reads as absent.
"""

from __future__ import annotations

import errno
import itertools
import os
import tempfile
import weakref
from typing import IO

import numpy as np

from ._base import Snapshot, SnapshotError, Store, digest
from ._cleanup import make_private_dir, remove_dir

__all__ = ["FileStore"]


class _Block:
    """Bytes written by one put: ``where`` (a file path, or a description) from ``offset`` on."""

    __slots__ = ("where", "offset", "capacity", "size", "refs")

    def __init__(self, where: str, offset: int, capacity: int, size: int):
        self.where = where
        self.offset = offset
        self.capacity = capacity
        self.size = size
        self.refs = 0


class _FileLeaf:
    __slots__ = ("block", "offset", "dtype", "shape", "nbytes", "digest")

    def __init__(self, block, offset, dtype, shape, nbytes, checksum):
        self.block = block
        self.offset = offset
        self.dtype = dtype
        self.shape = shape
        self.nbytes = nbytes
        self.digest = checksum


def _write_array(fd: int, a: np.ndarray, offset: int) -> None:
    """All of ``a``'s bytes (C-contiguous) to ``fd`` from ``offset``."""
    view = a.reshape(-1).view(np.uint8).data if a.size else memoryview(b"")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def _read_array(fd: int, buf: np.ndarray, offset: int) -> int:
    """Fill ``buf`` from ``fd`` at ``offset``; the number of bytes read (short at end of file)."""
    view = buf.reshape(-1).view(np.uint8).data
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            break
        done += n
    return done


class _Directory:
    """Blocks as files of a private named directory (see the module docstring)."""

    def __init__(self, owner: FileStore, label: str, directory: str | None, rank: int | None):
        if directory is not None:
            try:
                os.makedirs(directory, exist_ok=True)
            except OSError as e:
                raise OSError(
                    e.errno,
                    f"{e.strerror}: cannot create the snapshot directory's "
                    f"parent for the {label} store",
                    directory,
                ) from e
        self.rank = rank
        self.pid = os.getpid()  # a forked child must not remove the files
        self.path = make_private_dir(directory, rank)
        self.finalizer = weakref.finalize(owner, remove_dir, self.path, self.pid)
        self._ids = itertools.count()

    def new(self, step: int, size: int) -> tuple[_Block, int]:
        tag = f"r{self.rank}-" if self.rank is not None else ""
        path = os.path.join(self.path, f"{tag}step{step}-{next(self._ids)}.snap")
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        return _Block(path, 0, size, size), fd

    def written_to(self, block: _Block) -> str:
        return block.where + ".tmp"

    def commit(self, block: _Block, fd: int) -> None:
        os.close(fd)
        os.replace(block.where + ".tmp", block.where)  # atomic: complete or absent

    def abort(self, block: _Block, fd: int) -> None:
        os.close(fd)
        try:
            os.unlink(block.where + ".tmp")
        except OSError:
            pass

    def open(self, block: _Block, step: int) -> int:
        try:
            return os.open(block.where, os.O_RDONLY)
        except FileNotFoundError:
            raise SnapshotError(
                f"snapshot of step {step} on disk is missing: file {block.where} does not exist "
                "(was it deleted by someone else?)."
            ) from None

    def done_reading(self, fd: int) -> None:
        os.close(fd)

    def release(self, block: _Block) -> None:
        if os.getpid() != self.pid:
            return
        try:
            os.unlink(block.where)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self.finalizer()  # removes the directory, whatever happened


class _UnnamedFile:
    """Blocks as regions of one unnamed temporary file (see the module docstring)."""

    def __init__(self, owner: FileStore, label: str, directory: str | None):
        self.directory = directory
        self.where = f"the {label} store's unnamed temporary file in " + (
            directory or tempfile.gettempdir()
        )
        self.file: IO[bytes] | None = None  # made by the first write
        self.end = 0
        self.free: list[tuple[int, int]] = []  # (capacity, offset) of regions no block holds

    def new(self, step: int, size: int) -> tuple[_Block, int]:
        if self.file is None:
            if self.directory is not None:
                os.makedirs(self.directory, exist_ok=True)
            self.file = tempfile.TemporaryFile(prefix="retrograde-", dir=self.directory)
        fits = [r for r in self.free if r[0] >= size]
        if fits:  # the smallest free region that fits (a slot rewritten: its own)
            region = min(fits)
            self.free.remove(region)
            capacity, offset = region
        else:
            capacity, offset = size, self.end
            self.end += size
        return _Block(self.where, offset, capacity, size), self.file.fileno()

    def written_to(self, block: _Block) -> str:
        return self.directory or tempfile.gettempdir()

    def commit(self, block: _Block, fd: int) -> None:
        pass

    def abort(self, block: _Block, fd: int) -> None:
        self.release(block)

    def open(self, block: _Block, step: int) -> int:
        return self.file.fileno()

    def done_reading(self, fd: int) -> None:
        pass

    def release(self, block: _Block) -> None:
        self.free.append((block.capacity, block.offset))

    def close(self) -> None:
        self.free.clear()
        if self.file is not None:
            self.file.close()
            self.file = None


class FileStore(Store):
    """Snapshots in files (see the module docstring): in a private named directory, or
    (``unnamed``) in one unnamed temporary file."""

    kind = "disk"

    def __init__(
        self,
        label: str,
        directory: str | None = None,
        rank: int | None = None,
        *,
        unnamed: bool = False,
    ):
        super().__init__(label)
        self.placement = (
            _UnnamedFile(self, label, directory)
            if unnamed
            else _Directory(self, label, directory, rank)
        )

    @property
    def path(self) -> str | None:
        """The private directory (``None`` for an unnamed file)."""
        return getattr(self.placement, "path", None)

    def _write(self, step, arrays, prev):
        records: list = [None] * len(arrays)
        new, shared = [], 0
        for i, a in enumerate(arrays):
            if not a.flags.c_contiguous:  # (np.ascontiguousarray would make 0-d 1-d)
                a = a.copy(order="C")
            if a.dtype.hasobject:
                raise TypeError(
                    f"state leaf {i} at step {step} has dtype object; only numeric arrays can be "
                    "written to disk."
                )
            checksum = digest(a)
            old = prev[i] if prev is not None and i < len(prev) else None
            if (
                old is not None
                and old.digest == checksum
                and old.dtype == a.dtype
                and old.shape == a.shape
            ):
                records[i] = old
                shared += 1
            else:
                new.append((i, a, checksum))
        if new:
            try:
                block, fd = self.placement.new(step, sum(a.nbytes for _, a, _ in new))
            except OSError as e:
                raise self._write_error(e, step, e.filename) from e
            try:
                at = block.offset
                for i, a, checksum in new:
                    _write_array(fd, a, at)
                    records[i] = _FileLeaf(block, at, a.dtype, a.shape, a.nbytes, checksum)
                    at += a.nbytes
                self.placement.commit(block, fd)
            except BaseException as e:
                where = self.placement.written_to(block)
                self.placement.abort(block, fd)
                if isinstance(e, OSError):
                    raise self._write_error(e, step, where) from e
                raise
            self.nbytes += block.size
        self.shared_leaves += shared
        for r in records:  # a block lives while a leaf of a held snapshot is in it
            r.block.refs += 1
        return records

    def _write_error(self, e: OSError, step: int, where) -> OSError:
        """``e`` naming the step, the store and the file (and what to do if the disk is full)."""
        if e.errno is None:
            return e
        hint = (
            " (the disk is full: free space there, or give a directory on a larger file system)"
            if e.errno in (errno.ENOSPC, errno.EDQUOT)
            else ""
        )
        return OSError(
            e.errno,
            f"{e.strerror}: cannot write the snapshot of step {step} of the "
            f"{self.label} store{hint}",
            where,
        )

    def _read(self, snap: Snapshot, take: bool, copy: bool):  # fresh buffers, always
        out = []
        fds: dict[int, int] = {}
        try:
            for i, r in enumerate(snap.leaves):
                buf = np.empty(r.shape, dtype=r.dtype)
                if r.nbytes:
                    fd = fds.get(id(r.block))
                    if fd is None:
                        fd = fds[id(r.block)] = self.placement.open(r.block, snap.step)
                    got = _read_array(fd, buf, r.offset)
                    if got != r.nbytes:
                        raise SnapshotError(
                            f"snapshot of step {snap.step} on disk is truncated: leaf {i} in "
                            f"{r.block.where} has {got} of {r.nbytes} bytes."
                        )
                if digest(buf) != r.digest:
                    raise SnapshotError(
                        f"snapshot of step {snap.step} on disk failed its checksum: leaf {i} in "
                        f"{r.block.where} does not match the blake2b digest written with it (the "
                        "file was modified or the disk is failing)."
                    )
                out.append(buf)
        finally:
            for fd in fds.values():
                self.placement.done_reading(fd)
        return out

    def _release(self, snap):
        for r in snap.leaves:
            r.block.refs -= 1
            if r.block.refs == 0:
                self.nbytes -= r.block.size
                self.placement.release(r.block)
        snap.leaves = ()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.placement.close()
