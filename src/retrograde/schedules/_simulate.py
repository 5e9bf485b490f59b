"""A symbolic machine that executes a schedule's actions, proves them valid, and counts cost."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ._actions import Advance, End, Free, Record, Restore, Store
from ._base import Level, OfflineSchedule, OnlineSchedule, Schedule, check_steps

__all__ = ["Stats", "ScheduleError", "simulate", "execute"]


class ScheduleError(RuntimeError):
    """A schedule asked for something impossible (restore of an empty slot, a recorded step
    without its state at hand, too many slots, ...).

    Example:
        >>> from retrograde.schedules import Level, Record, ScheduleError, execute
        >>> try:
        ...     execute([Record(0)], 2, (Level(None),))
        ... except ScheduleError as e:
        ...     print(e)
        Record(step=0): the next step to record is 1.
    """


@dataclasses.dataclass(frozen=True)
class Stats:
    """What a schedule costs for one step count.

    Attributes:
        n_steps: number of steps ``N``.
        plain: plain step evaluations (first sweep and recomputations).
        recorded: recorded evaluations (step plus adjoint); always ``N``.
        writes, reads: ``Store``/``Restore`` counts per storage level.
        peak_slots: the most slots held at once, per level.
        levels: the storage levels (for the cost model).
        cost: ``plain * forward_cost + recorded * adjoint_cost + sum(writes * write_cost +
            reads * read_cost)`` with unit forward and adjoint costs.

    Example:
        >>> from retrograde.schedules import Revolve, simulate
        >>> st = simulate(Revolve(10), 1000); (st.evaluations, st.cost)
        (4636, 4636.0)
    """

    n_steps: int
    plain: int
    recorded: int
    writes: tuple[int, ...]
    reads: tuple[int, ...]
    peak_slots: tuple[int, ...]
    levels: tuple[Level, ...]

    @property
    def evaluations(self) -> int:
        """Plain plus recorded evaluations."""
        return self.plain + self.recorded

    def total_cost(self, forward_cost: float = 1.0, adjoint_cost: float = 1.0) -> float:
        """Cost under the levels' write/read costs and the given per-step costs."""
        transfer = sum(
            w * lvl.write_cost + r * lvl.read_cost
            for w, r, lvl in zip(self.writes, self.reads, self.levels)
        )
        return self.plain * forward_cost + self.recorded * adjoint_cost + transfer

    @property
    def cost(self) -> float:
        return self.total_cost()


class _Machine:
    def __init__(self, n_steps: int, levels: tuple[Level, ...]):
        self.n = n_steps
        self.levels = levels
        self.slots: list[dict[int, int]] = [dict() for _ in levels]
        self.current: int | None = 0
        self.next_record = n_steps - 1
        self.plain = 0
        self.recorded = 0
        self.writes = [0] * len(levels)
        self.reads = [0] * len(levels)
        self.peak = [0] * len(levels)
        self.ended = False

    def _level(self, action, level: int) -> dict[int, int]:
        if not 0 <= level < len(self.levels):
            raise ScheduleError(f"{action}: no storage level {level}.")
        return self.slots[level]

    def run(self, action) -> None:
        if self.ended:
            raise ScheduleError(f"{action} after End().")
        kind = type(action)
        if kind is Advance:
            a, b = action
            if self.current != a:
                raise ScheduleError(f"{action}: the state at hand is {self.current}, not {a}.")
            if not a < b <= self.n:
                raise ScheduleError(f"{action}: must satisfy start < stop <= {self.n}.")
            self.plain += b - a
            self.current = b
        elif kind is Store:
            n, slot, level = action
            held = self._level(action, level)
            if self.current != n:
                raise ScheduleError(f"{action}: the state at hand is {self.current}, not {n}.")
            if slot in held:
                raise ScheduleError(f"{action}: slot {slot} still holds state {held[slot]}.")
            cap = self.levels[level].slots
            if slot < 0 or (cap is not None and slot >= cap):
                raise ScheduleError(f"{action}: level {level} has slots 0..{cap - 1}.")
            held[slot] = n
            self.writes[level] += 1
            self.peak[level] = max(self.peak[level], len(held))
        elif kind is Restore:
            n, slot, level = action
            held = self._level(action, level)
            if held.get(slot) != n:
                raise ScheduleError(
                    f"{action}: slot {slot} of level {level} holds {held.get(slot)}, not {n}."
                )
            self.reads[level] += 1
            self.current = n
        elif kind is Free:
            n, slot, level = action
            held = self._level(action, level)
            if held.get(slot) != n:
                raise ScheduleError(
                    f"{action}: slot {slot} of level {level} holds {held.get(slot)}, not {n}."
                )
            del held[slot]
        elif kind is Record:
            (n,) = action
            if n != self.next_record:
                raise ScheduleError(f"{action}: the next step to record is {self.next_record}.")
            if self.current != n:
                raise ScheduleError(f"{action}: the state at hand is {self.current}, not {n}.")
            self.recorded += 1
            self.next_record -= 1
            self.current = None
        elif kind is End:
            if self.next_record != -1:
                raise ScheduleError(f"End() before step {self.next_record} was recorded.")
            self.ended = True
        else:
            raise ScheduleError(f"Unknown action {action!r}.")

    def stats(self) -> Stats:
        if not self.ended:
            raise ScheduleError("The schedule stopped without End().")
        return Stats(
            n_steps=self.n,
            plain=self.plain,
            recorded=self.recorded,
            writes=tuple(self.writes),
            reads=tuple(self.reads),
            peak_slots=tuple(self.peak),
            levels=self.levels,
        )


def execute(actions: Iterable, n_steps: int, levels: tuple[Level, ...]) -> Stats:
    """Run an explicit action stream on the symbolic machine (``u_0`` at hand at the start).

    Example:
        >>> from retrograde.schedules import Advance, End, Level, Record, Restore, Store, execute
        >>> acts = [Store(0, 0), Advance(0, 1), Record(1), Restore(0, 0), Record(0), End()]
        >>> execute(acts, 2, (Level(1),)).plain
        1
    """
    m = _Machine(check_steps(n_steps), tuple(levels))
    for action in actions:
        m.run(action)
    return m.stats()


def simulate(schedule: Schedule, n_steps: int) -> Stats:
    """Execute ``schedule`` for ``n_steps`` steps on a symbolic machine.

    Raises :class:`ScheduleError` if the schedule is invalid: a recorded step without its state at
    hand or out of order, a restore of an unwritten or freed slot, a store into an occupied slot or
    beyond a level's slot count, or a missing ``End``. Returns the counts as :class:`Stats`.

    Online schedules are driven through their protocol (``start``, ``on_step`` for every step,
    ``reverse`` once the ``n_steps`` steps were taken); only ``Store``/``Free`` are accepted from
    ``on_step``.

    Example:
        >>> from retrograde.schedules import Revolve, simulate
        >>> s = simulate(Revolve(10), 1000); (s.plain, s.recorded, s.peak_slots)
        (3636, 1000, (10,))
    """
    if not isinstance(schedule, (OfflineSchedule, OnlineSchedule)):
        raise TypeError(
            f"simulate(schedule=...) expects a Schedule such as Revolve(10), got {schedule!r}."
        )
    n_steps = check_steps(n_steps)
    levels = schedule.levels
    if isinstance(schedule, OnlineSchedule):
        m = _Machine(n_steps, levels)
        run = schedule.start()
        for n in range(n_steps):
            for action in run.on_step(n):
                if type(action) not in (Store, Free):
                    raise ScheduleError(f"on_step({n}) returned {action}; only Store/Free allowed.")
                m.run(action)
            m.run(Advance(n, n + 1))
        for action in run.reverse(n_steps):
            m.run(action)
        return m.stats()
    return execute(schedule.actions(n_steps), n_steps, levels)
