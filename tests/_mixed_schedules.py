"""Mixed schedules (``Linearize``/``Reverse`` actions) owned by the tests, until
``schedules.Mixed(snapshots, data_size)`` is merged: :func:`mixed_schedules` is the one place
the drivers' mixed tests take their schedules from, so that ``Mixed(s, d)`` replaces them here.

- :class:`LinearizeAll`: store ``u_0``; keep the data of every step (the last one recorded, or
  also linearized) each in its own slot; reverse the others from their data.
- :class:`SplitLeaves`: states at ``0`` and ``N // 2``; each half is a *leaf* reversed from data
  (restore its first state, linearize its steps, reverse them); the last half is linearized in the
  first sweep (``forward_leaf``) or recorded step ``N - 1`` first, as Revolve does. Data on the
  states' level or on a second level.

Every test checks its schedules with ``simulate`` first (``test_schedules_are_valid``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from retrograde.schedules import (
    Action,
    Advance,
    End,
    Free,
    Level,
    Linearize,
    OfflineSchedule,
    Record,
    Restore,
    Reverse,
    Simulator,
    Store,
)

__all__ = ["LinearizeAll", "SplitLeaves", "mixed_schedules", "sweep_counts", "SweepCounts"]


@dataclasses.dataclass(frozen=True)
class LinearizeAll(OfflineSchedule):
    """``Store(0)``, ``Linearize(k)`` into slot ``k + 1`` for every step (but the last when
    ``record_last``, which is then recorded), ``Reverse`` the rest: no recomputation at all."""

    record_last: bool = True

    def actions(self, n_steps: int) -> Iterator[Action]:
        if n_steps:
            yield Store(0, 0)
            last = n_steps - 1 if self.record_last else n_steps
            for k in range(last):
                yield Linearize(k, k + 1)
            if self.record_last:
                yield Record(n_steps - 1)
            for k in reversed(range(last)):
                yield Reverse(k, k + 1)
                yield Free(k, k + 1)
            yield Free(0, 0)
        yield End()


@dataclasses.dataclass(frozen=True)
class SplitLeaves(OfflineSchedule):
    """States ``u_0`` and ``u_h`` (``h = N // 2``) in slots 0 and 1 of level 0; each segment
    between them reversed as a leaf: restore its first state, ``Linearize`` its steps, ``Reverse``
    them. ``forward_leaf``: the first sweep linearizes the last segment ``[h, N)`` (ending at
    ``u_N``, no ``Record``); else it advances to ``u_{N-1}``, records it, and the leaves follow.
    ``data_level``: the level of the data slots (1: a second level)."""

    forward_leaf: bool = False
    data_level: int = 0
    data_storage: str = "device"
    directory: str | None = None

    @property
    def levels(self) -> tuple[Level, ...]:
        states = Level(None, name="memory")
        if self.data_level == 0:
            return (states,)
        data = Level(None, name="data", storage=self.data_storage, directory=self.directory)
        return (states, data)

    def actions(self, n_steps: int) -> Iterator[Action]:
        N = n_steps
        if N == 0:
            yield End()
            return
        h = N // 2
        starts = [0] + ([h] if 0 < h < N - 1 else [])
        lvl = self.data_level
        first = 2 if lvl == 0 else 0  # the first data slot
        # first sweep
        last = N if self.forward_leaf else N - 1  # the end of the last leaf
        for i, b in enumerate(starts):
            yield Store(b, i)
            stop = starts[i + 1] if i + 1 < len(starts) else last
            if i + 1 < len(starts) or not self.forward_leaf:
                if stop > b:
                    yield Advance(b, stop)
        segments = [
            (b, starts[i + 1] if i + 1 < len(starts) else last) for i, b in enumerate(starts)
        ]
        if self.forward_leaf:
            b, e = segments[-1]
            for k in range(b, e):
                yield Linearize(k, first + k - b, lvl)
        else:
            yield Record(N - 1)
        for i in reversed(range(len(segments))):
            b, e = segments[i]
            if not (self.forward_leaf and i == len(segments) - 1):
                if e > b:
                    yield Restore(b, i)
                for k in range(b, e):
                    yield Linearize(k, first + k - b, lvl)
            for k in reversed(range(b, e)):
                yield Reverse(k, first + k - b, lvl)
                yield Free(k, first + k - b, lvl)
            yield Free(b, i)
        yield End()


def mixed_schedules(directory: str | None = None) -> list[tuple[str, OfflineSchedule]]:
    """The mixed schedules the drivers are tested with, as ``(id, schedule)``; ``directory``:
    where a schedule whose data level is on disk writes (``None``: the system's temporary
    directory). When ``schedules.Mixed`` is merged, its instances go here."""
    return [
        ("LinearizeAll", LinearizeAll()),
        ("LinearizeAllSteps", LinearizeAll(record_last=False)),
        ("SplitLeaves", SplitLeaves()),
        ("SplitLeavesForward", SplitLeaves(forward_leaf=True)),
        (
            "SplitLeavesDataOnDisk",
            SplitLeaves(data_level=1, data_storage="disk", directory=directory),
        ),
    ]


@dataclasses.dataclass(frozen=True)
class SweepCounts:
    """Evaluations of one part of a schedule: ``plain`` (advanced steps), ``linearized``,
    ``recorded``, ``reversed``; ``hand``: the step at hand where the part ends."""

    plain: int
    linearized: int
    recorded: int
    reversed: int
    hand: int | None


def sweep_counts(schedule: OfflineSchedule, n_steps: int) -> tuple[SweepCounts, SweepCounts]:
    """The counts of the first sweep (the actions before the first ``Record``, ``Reverse`` or
    ``End``) and of the reverse part (the rest), each executed by the simulator."""
    sim = Simulator(schedule.levels, n_steps)
    parts: list[SweepCounts] = []
    before = (0, 0, 0, 0)
    first = True
    for a in schedule.actions(n_steps):
        if first and type(a) in (Record, Reverse, End):
            now = (sim.plain, sim.linearized, sim.recorded, sim.reversed)
            parts.append(SweepCounts(*now, sim.current))
            before, first = now, False
        sim.execute(a)
    now = (sim.plain, sim.linearized, sim.recorded, sim.reversed)
    parts.append(SweepCounts(*(x - y for x, y in zip(now, before)), sim.current))
    return parts[0], parts[1]
