"""The mixed schedules (``Linearize``/``Reverse`` actions) the drivers are tested with:
:func:`mixed_schedules` is the one place the drivers' mixed tests take them from.

They are ``schedules.Mixed(s, d)`` for several budgets and data sizes, and two of the tests' own
for what ``Mixed`` never does:

- :class:`LinearizeAll`: store ``u_0``, linearize *every* step (the last one too) each into its
  own slot, reverse them all from their data: a stream with no ``Record`` at all, whose first
  sweep ends at ``u_N`` (``Mixed`` always records the last step of a leaf);
- :class:`SplitLeaves`: states at ``0`` and ``N // 2``, each half a leaf reversed from data on a
  *second level*, here on disk (``Mixed`` has one level: its data slots follow its state slots).

Every test checks its schedules with ``simulate`` first (``test_schedules_are_valid``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from fractions import Fraction

from retrograde.schedules import (
    Action,
    Advance,
    End,
    Free,
    Level,
    Linearize,
    Mixed,
    OfflineSchedule,
    Record,
    Restore,
    Reverse,
    Simulator,
    Store,
)

__all__ = [
    "LinearizeAll",
    "OverBudget",
    "SplitLeaves",
    "mixed_schedules",
    "sweep_counts",
    "SweepCounts",
]


@dataclasses.dataclass(frozen=True)
class LinearizeAll(OfflineSchedule):
    """``Store(0)``, ``Linearize(k)`` into slot ``k + 1`` for every step, ``Reverse`` them all:
    no recomputation and no ``Record``."""

    def actions(self, n_steps: int) -> Iterator[Action]:
        if n_steps:
            yield Store(0, 0)
            for k in range(n_steps):
                yield Linearize(k, k + 1)
            for k in reversed(range(n_steps)):
                yield Reverse(k, k + 1)
                yield Free(k, k + 1)
            yield Free(0, 0)
        yield End()


class OverBudget(LinearizeAll):
    """:class:`LinearizeAll` with data of 2 states and a budget of 3 states: its second
    ``Linearize`` holds ``1 + 2 * 2 = 5`` states (the simulator of ``for_schedule`` refuses it)."""

    data_size = Fraction(2)
    memory_budget = Fraction(3)


@dataclasses.dataclass(frozen=True)
class SplitLeaves(OfflineSchedule):
    """States ``u_0`` and ``u_h`` (``h = N // 2``) in slots 0 and 1 of level 0; the first sweep
    advances to ``u_{N-1}`` and records it; then each segment between them is reversed as a leaf
    (restore its first state, ``Linearize`` its steps into slots of level 1, ``Reverse`` them).
    Level 1 is on ``data_storage`` (in ``directory`` for a disk)."""

    data_storage: str = "disk"
    directory: str | None = None

    @property
    def levels(self) -> tuple[Level, ...]:
        data = Level(None, name="data", storage=self.data_storage, directory=self.directory)
        return (Level(None, name="memory"), data)

    def actions(self, n_steps: int) -> Iterator[Action]:
        N = n_steps
        if N == 0:
            yield End()
            return
        h = N // 2
        starts = [0] + ([h] if 0 < h < N - 1 else [])
        segments = [(b, (starts + [N - 1])[i + 1]) for i, b in enumerate(starts)]
        for i, (b, e) in enumerate(segments):  # the first sweep
            yield Store(b, i)
            if e > b:
                yield Advance(b, e)
        yield Record(N - 1)
        for i in reversed(range(len(segments))):
            b, e = segments[i]
            if e > b:
                yield Restore(b, i)
            for k in range(b, e):
                yield Linearize(k, k - b, 1)
            for k in reversed(range(b, e)):
                yield Reverse(k, k - b, 1)
                yield Free(k, k - b, 1)
            yield Free(b, i)
        yield End()


def mixed_schedules(directory: str | None = None) -> list[tuple[str, OfflineSchedule]]:
    """The mixed schedules the drivers are tested with, as ``(id, schedule)``: ``Mixed`` with
    data of one state (``Mixed(1)``: leaves of two steps; ``Mixed(20)``: one leaf, every step but
    the last reversed from data), of half a state and of two (dynamic program), then the tests'
    own (:class:`LinearizeAll`, and :class:`SplitLeaves` last, writing its data level in
    ``directory``; ``None``: the system's temporary directory)."""
    return [
        ("Mixed1", Mixed(1)),
        ("Mixed3", Mixed(3)),
        ("Mixed20", Mixed(20)),
        ("Mixed3-half", Mixed(3, 0.5)),
        ("Mixed5-2", Mixed(5, 2)),
        ("LinearizeAll", LinearizeAll()),
        ("SplitLeavesDataOnDisk", SplitLeaves(directory=directory)),
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
    sim = Simulator.for_schedule(schedule, n_steps)
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
