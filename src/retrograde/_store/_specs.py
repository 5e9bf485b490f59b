"""Storage specifications (:class:`Memory`, :class:`Disk`) and what a schedule level asks for
(:func:`level_storage`). A specification opens a new live store per run, so one specification
serves many runs."""

from __future__ import annotations

import os
from typing import Any

from ..schedules import Level
from ._base import Store
from ._files import FileStore
from ._memory import MemoryStore

__all__ = ["Storage", "Memory", "Disk", "level_storage"]


class Storage:
    """Base class of storage specifications (:class:`Memory`, :class:`Disk`).

    Example: ``storage={"memory": rh.Memory(), "disk": rh.Disk("/scratch/run1")}`` maps
    the levels of a ``MultiLevel`` schedule to stores; ``storage=rh.Disk()`` puts every level on
    disk.
    """

    def open(self, label: str) -> Store:  # pragma: no cover - abstract
        raise NotImplementedError


class Memory(Storage):
    """Snapshots held in host RAM as private NumPy copies.

    Example:
        >>> import retrograde.host as rh
        >>> storage = rh.Memory()
    """

    def open(self, label: str = "memory") -> Store:
        return MemoryStore(label)

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
        unnamed: ``True`` keeps each run's snapshots in one unnamed temporary file in
            ``directory`` instead (what the compiled loops' disk levels use): nothing to clean up
            whatever ends the process, nothing to inspect either; the space of a freed snapshot is
            reused by later ones, and returned when the run ends.

    Example (the temporary directory stands for a scratch directory such as ``/scratch/me``;
    nothing is written there before a run opens the store):
        >>> import tempfile
        >>> import retrograde.host as rh
        >>> storage = rh.Disk(tempfile.gettempdir())
        >>> storage.directory == tempfile.gettempdir(), storage.unnamed
        (True, False)
    """

    def __init__(
        self,
        directory: str | os.PathLike | None = None,
        *,
        rank: int | None = None,
        comm: Any = None,
        unnamed: bool = False,
    ):
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
        self.unnamed = bool(unnamed)

    def open(self, label: str = "disk") -> Store:
        return FileStore(label, self.directory, self.rank, unnamed=self.unnamed)

    def __repr__(self):
        unnamed = ", unnamed=True" if self.unnamed else ""
        return f"Disk({self.directory!r}, rank={self.rank!r}{unnamed})"


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


def level_storage(level: Level, *, unnamed: bool = False) -> Storage:
    """Where a schedule level's snapshots go outside a compiled program, from
    :attr:`Level.storage` alone (the level's name is only a label): ``"disk"`` on
    ``Disk(level.directory)``, ``"host"`` in :class:`Memory`. Both drivers ask this: the compiled
    loops for their ``"host"`` and ``"disk"`` levels (``unnamed=True``: a disk level's file has
    no name), the host driver for every level when given no ``storage=`` (it has no compiled
    program, so it keeps ``"device"`` levels, the default, in :class:`Memory` too).

    Example:
        >>> from retrograde.schedules import Level
        >>> level_storage(Level(8, storage="disk")), level_storage(Level(8))
        (Disk(None, rank=None), Memory())
    """
    if level.storage == "disk":
        return Disk(level.directory, unnamed=unnamed)
    return Memory()
