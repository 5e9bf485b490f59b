"""Private snapshot directories: their owner record, their removal on SIGTERM/SIGHUP, and
:func:`remove_stale` for those whose process was killed.

A named snapshot directory (``Disk()``, :mod:`._files`) is ``retrograde-[r<rank>-]p<pid>-...``
with a file ``owner`` naming its host, process id and process start time. While such a directory
exists, :data:`SIGNALS` removes it on SIGTERM and SIGHUP before the signal takes its usual effect.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import tempfile
import threading
from typing import Any, NamedTuple

__all__ = [
    "DIR_PREFIX",
    "OWNER_FILE",
    "SIGNALS",
    "StaleDir",
    "make_private_dir",
    "on_signal",
    "remove_dir",
    "remove_stale",
]

#: How a snapshot directory's name starts (``retrograde-[r<rank>-]p<pid>-...``).
DIR_PREFIX = "retrograde-"
#: The file in each snapshot directory that names its owner process.
OWNER_FILE = "owner"


def make_private_dir(directory: str | None, rank: int | None) -> str:
    """A new snapshot directory in ``directory`` (``None``: the system's temporary directory)
    with its owner record, registered with :data:`SIGNALS`; :func:`remove_dir` removes it."""
    tag = f"r{rank}-" if rank is not None else ""
    path = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{tag}p{os.getpid()}-", dir=directory)
    SIGNALS.add(path)
    try:
        with open(os.path.join(path, OWNER_FILE), "w") as fh:
            json.dump(_owner(), fh)
    except BaseException:
        remove_dir(path, os.getpid())
        raise
    return path


def remove_dir(path: str, pid: int) -> None:
    """Remove a snapshot directory, in the process that made it only (not in a forked child
    that exits or is terminated)."""
    SIGNALS.discard(path)
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
                signal.signal(sig, on_signal)
            except (ValueError, OSError):  # pragma: no cover - not the main interpreter
                continue
            self.previous[sig] = prev

    def _restore(self):
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, prev in list(self.previous.items()):
            if signal.getsignal(sig) is on_signal:  # not replaced by someone else since
                signal.signal(sig, prev)
            del self.previous[sig]

    def remove_all(self) -> None:
        for path, pid in list(self.dirs.items()):
            if pid == os.getpid():
                shutil.rmtree(path, ignore_errors=True)


#: The live snapshot directories of this process and the signal handlers that remove them.
SIGNALS = _SignalGuard()


def on_signal(signum, frame):
    """The SIGTERM/SIGHUP handler installed while snapshot directories exist."""
    prev = SIGNALS.previous.get(signum, signal.SIG_DFL)
    if callable(prev):
        return prev(signum, frame)
    SIGNALS.remove_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


# ----------------------------------------------------------------------------------------------
# Owners of snapshot directories, and directories left by processes that were killed.


def _start_time(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux), or ``None``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
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


def remove_stale(
    directory: str | os.PathLike | None = None, *, dry_run: bool = False
) -> list[StaleDir]:
    """Remove snapshot directories whose process died without cleaning up (SIGKILL, abort,
    power loss).

    Looks at the ``retrograde-*`` directories directly in ``directory`` (default: the system's
    temporary directory, where ``Disk()`` puts them) and removes those whose owner process, on
    this host, no longer runs (a process id that was reused counts as gone, where the start time
    is known). Directories of running processes, of other hosts (run this there) and without
    an owner record are kept. Also available as ``retrograde clean [DIRECTORY] [--dry-run]``.

    Returns:
        One :class:`StaleDir` per directory seen.

    Example (a fresh directory stands for a scratch directory such as ``/scratch/me``; after a
    killed run, the list would name its ``retrograde-p<pid>-...`` directory):
        >>> import tempfile
        >>> import retrograde.host as rh
        >>> with tempfile.TemporaryDirectory() as scratch:
        ...     [d.path for d in rh.remove_stale(scratch) if d.action == "removed"]
        []
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
