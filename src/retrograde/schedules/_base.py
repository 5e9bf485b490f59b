"""Schedules, storage levels, and the protocol for schedules whose step count is unknown."""

from __future__ import annotations

import abc
import dataclasses
import math
import operator
import os
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction

from ._actions import Action, Advance, Free, ScheduleError, Store

#: Where a level's snapshots live in the compiled JAX loops (:attr:`Level.storage`).
STORAGES = ("device", "host", "disk")

__all__ = [
    "Level",
    "Schedule",
    "OfflineSchedule",
    "OnlineSchedule",
    "OnlineRun",
    "check_steps",
    "check_snapshots",
    "exact_size",
    "schedule_stream",
]


@dataclasses.dataclass(frozen=True)
class Level:
    """One storage level for snapshots.

    Args:
        slots: number of snapshot slots on this level, or ``None`` for unlimited (only the last
            level of a ``MultiLevel`` schedule may be unlimited).
        write_cost: cost of one ``Store`` on this level, in units of one step evaluation.
        read_cost: cost of one ``Restore`` on this level, in units of one step evaluation.
        name: a label ("device", "host", "disk") used in tables and pictures.
        storage: where this level's snapshots are kept: ``"device"`` (the default: in the
            compiled program's memory), ``"host"`` (host RAM, outside the compiled program) or
            ``"disk"`` (files, checksummed). The compiled JAX loops (``retrograde.scan``,
            ``fori_loop``, ``while_loop``) reach host and disk levels by host callbacks that copy
            one state (``docs/offload.md``); ``retrograde.host`` reads it the same way unless
            its ``storage=`` argument says otherwise (it has no compiled program: "device"
            levels are in host RAM there). Schedules and the simulator only read the costs; the
            ``name`` is a label, never a storage.
        directory: for ``storage="disk"``, where the temporary file goes (``None``: the system's
            temporary directory).

    Example:
        >>> from retrograde.schedules import Level
        >>> disk = Level(None, write_cost=2.0, read_cost=2.0, name="disk", storage="disk")
        >>> host = Level(64, write_cost=0.5, read_cost=0.5, name="host", storage="host")
    """

    slots: int | None
    write_cost: float = 0.0
    read_cost: float = 0.0
    name: str = ""
    storage: str = "device"
    directory: str | None = None

    def __post_init__(self):
        if self.storage not in STORAGES:
            raise ValueError(
                f"Level(storage={self.storage!r}) must be one of {', '.join(map(repr, STORAGES))}."
            )
        if self.directory is not None:
            if self.storage != "disk":
                raise ValueError(
                    f"Level(directory={self.directory!r}) is only for storage='disk' (this level's "
                    f"storage is {self.storage!r})."
                )
            if not isinstance(self.directory, (str, os.PathLike)):
                raise TypeError(
                    f"Level(directory=...) must be a path or None, got {self.directory!r}."
                )
            object.__setattr__(self, "directory", os.fspath(self.directory))
        if self.slots is not None:
            if isinstance(self.slots, bool) or not isinstance(self.slots, int):
                raise TypeError(f"Level(slots=...) must be an int or None, got {self.slots!r}.")
            if self.slots < 1:
                raise ValueError(
                    f"Level(slots={self.slots}): a storage level needs at least one slot "
                    "(use slots=None for an unlimited level, or drop the level)."
                )
        for name in ("write_cost", "read_cost"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0 or math.isnan(value):
                raise ValueError(f"Level({name}={value!r}) must be a non-negative number.")


def check_steps(n_steps: int, name: str = "n_steps") -> int:
    """Validate a step count: a non-negative int (NumPy integers too); ``name`` is the argument
    named in the error.

    Example:
        >>> check_steps(10), check_steps(10, "length")
        (10, 10)
    """
    if isinstance(n_steps, bool) or not isinstance(n_steps, int):
        try:
            n_steps = operator.index(n_steps)
        except TypeError:
            raise TypeError(f"{name} must be an int, got {n_steps!r}.") from None
    if n_steps < 0:
        raise ValueError(f"{name}={n_steps} is negative; a loop has zero or more steps.")
    return int(n_steps)


def exact_size(value: int | float | Fraction, name: str) -> Fraction:
    """``value`` (a positive finite size, in states) as an exact fraction: an int or a
    ``Fraction`` as it is, a float as the decimal it prints as (``0.1`` is ``1/10``), so that
    budgets and weights compare exactly; ``name`` is the argument named in the error.

    Example:
        >>> exact_size(0.1, "data_size") * 100 == 10
        True
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)):
        raise TypeError(f"{name} must be a number, got {value!r}.")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{name}={value!r} must be finite.")
        value = Fraction(repr(value))
    if value <= 0:
        raise ValueError(f"{name}={value!r} must be positive.")
    return Fraction(value)


def check_snapshots(snapshots: int, name: str = "snapshots") -> int:
    """Validate a snapshot count: an int >= 1 (the slot holding the initial state counts);
    ``name`` is the argument named in the error.

    Example:
        >>> check_snapshots(4, "Revolve(snapshots=...)")
        4
    """
    if isinstance(snapshots, bool) or not isinstance(snapshots, int):
        raise TypeError(f"{name} must be an int >= 1, got {snapshots!r}.")
    if snapshots < 1:
        raise ValueError(
            f"{name}={snapshots}: at least one snapshot slot is needed (the one that holds the "
            "initial state). Use snapshots=1 for recompute-everything."
        )
    return snapshots


class Schedule(abc.ABC):  # noqa: B024 - abstract through OfflineSchedule and OnlineSchedule
    """Base class of every checkpointing schedule.

    A schedule is an immutable description; executing it is the business of an executor (the
    simulator, the JAX loops, the host loop driver) that consumes its actions.

    Example:
        >>> from retrograde.schedules import Level, MultiLevel, Revolve
        >>> Revolve(4).online, Revolve(4).max_slots(100)
        (False, (4,))
        >>> ram, disk = Level(2, name="ram"), Level(None, write_cost=0.5, read_cost=0.5)
        >>> len(MultiLevel([ram, disk]).levels)
        2
    """

    #: True for schedules that work without knowing the step count in advance.
    online: bool = False
    #: What a slot holding one step's adjoint data (written by ``Linearize``) weighs, in states:
    #: the simulator's weighted memory counts a state slot as 1 and a data slot as this
    #: (``None``: the schedule keeps no step data, as ``Online(s)``).
    data_size: float | Fraction | None = 1.0
    #: The most weighted memory (states, see :attr:`data_size`) the schedule holds on level 0
    #: at once, when that bound is tighter than the level's slot count (``Mixed``); ``None``:
    #: the slot counts are the bound. The simulator raises if a stream exceeds it.
    memory_budget: Fraction | None = None

    @property
    def levels(self) -> tuple[Level, ...]:
        """The storage levels this schedule uses (level 0 first). Default: one unlimited level."""
        return (Level(None, name="memory"),)

    def max_slots(self, n_steps: int) -> tuple[int, ...]:
        """Upper bound on the slots used on each level for ``n_steps`` steps."""
        return tuple(
            (lvl.slots if lvl.slots is not None else max(n_steps, 1)) for lvl in self.levels
        )


@dataclasses.dataclass(frozen=True)
class MemorySlots:
    """Mixin of a schedule with ``snapshots`` slots in one memory level (the slot holding the
    initial state included): the field, its check and the level."""

    snapshots: int

    def __post_init__(self):
        check_snapshots(self.snapshots, f"{type(self).__name__}(snapshots=...)")

    @property
    def levels(self) -> tuple[Level, ...]:
        return (Level(self.snapshots, name="memory"),)


class OfflineSchedule(Schedule):
    """A schedule that is planned for a step count known before the loop runs.

    Subclasses implement :meth:`actions`. Example, a schedule that stores every state (like
    :class:`StoreAll`), checked by the simulator:

        >>> from retrograde.schedules import (Advance, End, Record, Restore, Store,
        ...                                   simulate)
        >>> class Everything(OfflineSchedule):
        ...     def actions(self, n_steps):
        ...         for n in range(n_steps - 1):
        ...             yield Store(n, n)
        ...             yield Advance(n, n + 1)
        ...         for n in reversed(range(n_steps)):
        ...             if n < n_steps - 1:
        ...                 yield Restore(n, n)
        ...             yield Record(n)
        ...         yield End()
        >>> stats = simulate(Everything(), 5)
        >>> stats.plain, stats.recorded, stats.peak_slots
        (4, 5, (4,))
    """

    @abc.abstractmethod
    def actions(self, n_steps: int) -> Iterator[Action]:
        """Stream the actions that reverse ``n_steps`` steps, starting with ``u_0`` at hand.

        Memory used to generate the stream is independent of ``n_steps``.
        """

    def binomial_stores(self, n_steps: int) -> tuple[int, ...] | None:
        """The steps whose states this schedule's forward sweep stores, if the rest of it is the
        binomial reversal of the segments between them; ``None`` (the default) otherwise.

        The binomial reversal (:func:`retrograde.schedules.binomial_reversal`): the forward sweep
        stores ``u_p`` for each returned ``p`` (all below ``N - 1``) and advances to ``u_{N-1}``,
        which is recorded at once; then the segments ``[p_i, p_{i+1})`` (the last one ending at
        ``N - 1``) are reversed last first, each by :class:`Revolve` with its own slot and every
        slot of ``max_slots(n_steps)[0]`` not held by an earlier snapshot. A schedule that
        returns its stores can be executed from ``O(len(stores))`` data, without its action
        stream (the JAX loops do so); it must make exactly the evaluations of that reversal.
        """
        return None


class OnlineRun(abc.ABC):
    """One execution of an online schedule.

    Protocol: for ``n = 0, 1, 2, ...`` while the loop continues, with ``u_n`` at hand, call
    :meth:`on_step` and execute the ``Store``/``Free`` actions it returns, then advance one step
    (a plain evaluation). When the loop stops with ``u_N`` at hand, call :meth:`reverse` with ``N``
    and execute the actions it streams (which end with ``End``).

    Example:
        >>> from retrograde.schedules import Online
        >>> run = Online(2).start()
        >>> for n in range(4):  # the loop takes 4 steps, then stops
        ...     print(n, run.on_step(n))
        0 (Store(step=0, slot=0, level=0),)
        1 (Store(step=1, slot=1, level=0),)
        2 ()
        3 (Free(step=1, slot=1, level=0), Store(step=3, slot=1, level=0))
        >>> next(iter(run.reverse(4)))
        Restore(step=3, slot=1, level=0)
    """

    @abc.abstractmethod
    def on_step(self, n: int) -> Sequence[Action]:
        """Actions (``Store``/``Free`` only) to execute with ``u_n`` at hand, before step ``n``."""

    @abc.abstractmethod
    def reverse(self, n_steps: int) -> Iterator[Action]:
        """Actions that reverse the ``n_steps`` steps taken; ``u_{n_steps}`` is at hand."""

    def forward(self, more: Callable[[int], bool]) -> Iterator[Action]:
        """The forward sweep as actions: for ``n = 0, 1, ...`` while ``more(n)``, the actions of
        :meth:`on_step` ``(n)`` and then ``Advance(n, n + 1)``. The stream is lazy: ``more(n)`` is
        asked once the actions before it were executed, with ``u_n`` at hand, so it may read the
        state (a loop that stops on a condition). The step count is the number of advances.

        Raises :class:`ScheduleError` if ``on_step`` returns anything but ``Store``/``Free``.

        Example:
            >>> from retrograde.schedules import Online
            >>> list(Online(3).start().forward(lambda n: n < 1))
            [Store(step=0, slot=0, level=0), Advance(start=0, stop=1)]
        """
        n = 0
        while more(n):
            for action in self.on_step(n):
                if type(action) not in (Store, Free):
                    raise ScheduleError(f"on_step({n}) returned {action}; only Store/Free allowed.")
                yield action
            yield Advance(n, n + 1)
            n += 1


class OnlineSchedule(Schedule):
    """A schedule for loops whose step count is unknown until the forward sweep ends.

    Subclasses implement :meth:`start`, which returns an :class:`OnlineRun`. Example:

        >>> from retrograde.schedules import Online, simulate
        >>> Online(4).online, simulate(Online(4), 100).recorded
        (True, 100)
    """

    online = True

    @abc.abstractmethod
    def start(self) -> OnlineRun:
        """Begin one execution."""

    def actions(self, n_steps: int) -> Iterator[Action]:  # pragma: no cover - error path
        raise ValueError(
            f"{type(self).__name__} is an online schedule: it is for loops whose step count is "
            f"unknown in advance, and cannot be asked for a fixed n_steps={n_steps!r}. Use "
            "schedule.start() (the online protocol), or an offline schedule such as "
            "Revolve(snapshots) when the step count is known."
        )


def schedule_stream(schedule: Schedule, n_steps: int) -> Iterator[Action]:
    """Every action of ``schedule`` reversing ``n_steps`` steps, offline or online: an online
    schedule plays its protocol (:meth:`OnlineRun.forward` for ``n_steps`` steps, then
    :meth:`OnlineRun.reverse`).

    Example:
        >>> from retrograde.schedules import Revolve
        >>> list(schedule_stream(Revolve(3), 10)) == list(Revolve(3).actions(10))
        True
    """
    if not isinstance(schedule, (OfflineSchedule, OnlineSchedule)):
        raise TypeError(f"schedule must be a Schedule such as Revolve(10), got {schedule!r}.")
    n_steps = check_steps(n_steps)
    if isinstance(schedule, OfflineSchedule):
        return schedule.actions(n_steps)
    return _online_stream(schedule.start(), n_steps)


def _online_stream(run: OnlineRun, n_steps: int) -> Iterator[Action]:
    yield from run.forward(lambda n: n < n_steps)
    yield from run.reverse(n_steps)
