"""The simulator: executes a schedule's actions on step numbers, proves them valid, counts cost."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable
from fractions import Fraction

from ._actions import (
    Advance,
    End,
    Executor,
    Free,
    Linearize,
    Record,
    Restore,
    Reverse,
    ScheduleError,
    Store,
)
from ._base import (
    Level,
    OfflineSchedule,
    OnlineSchedule,
    Schedule,
    check_steps,
    exact_size,
    schedule_stream,
)

__all__ = ["Stats", "ScheduleError", "Simulator", "simulate", "execute"]


@dataclasses.dataclass(frozen=True)
class Stats:
    """What a schedule costs for one step count.

    Attributes:
        n_steps: number of steps ``N``.
        plain: plain step evaluations (first sweep and recomputations).
        recorded: recorded evaluations (step plus adjoint); ``N`` less ``reversed``.
        writes, reads: ``Store``/``Restore`` counts per storage level.
        peak_slots: the most slots held at once (states and data), per level.
        levels: the storage levels (for the cost model).
        linearized: ``Linearize`` evaluations (a forward evaluation keeping the step's data).
        reversed: steps reversed from stored data (``Reverse``); ``recorded + reversed = N``.
        data_writes, data_reads: ``Linearize``/``Reverse`` counts per storage level.
        peak_memory: the most weighted memory held at once, per level, in states: a state slot
            weighs 1 and a data slot the simulator's ``data_size`` (so it equals
            ``peak_slots`` for schedules that hold no data, or data of one state).
        cost: ``(plain + linearized) * forward_cost + recorded * adjoint_cost + sum(writes *
            write_cost + reads * read_cost)`` with unit forward and adjoint costs (the adjoint
            of a step reversed from data is paid by every schedule and not counted).

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
    linearized: int = 0
    reversed: int = 0
    data_writes: tuple[int, ...] = ()
    data_reads: tuple[int, ...] = ()
    peak_memory: tuple[float, ...] = ()

    @property
    def evaluations(self) -> int:
        """Forward evaluations: plain, linearized and recorded."""
        return self.plain + self.linearized + self.recorded

    def total_cost(self, forward_cost: float = 1.0, adjoint_cost: float = 1.0) -> float:
        """Cost under the levels' write/read costs and the given per-step costs."""
        transfer = sum(
            w * lvl.write_cost + r * lvl.read_cost
            for w, r, lvl in zip(self.writes, self.reads, self.levels)
        )
        return (
            (self.plain + self.linearized) * forward_cost + self.recorded * adjoint_cost + transfer
        )

    @property
    def cost(self) -> float:
        return self.total_cost()


class Simulator(Executor):
    """The simulator: executes actions on step numbers instead of states, raises
    :class:`ScheduleError` at the first impossible one, and counts what they cost.

    It holds the step of the state at hand (:attr:`current`, ``None`` after a ``Record``), the
    step held in each slot of each level (a state's, or with ``Linearize`` a step's data: one
    cannot be restored as the other), and the next step to record. ``u_0`` is at hand at the
    start. Anything that executes a schedule (the host loop driver, the picture of a schedule)
    can run its actions through a simulator first, so that each is proven valid before it runs.

    Args:
        levels: the storage levels (slot counts bound the slots).
        n_steps: ``N``; ``None`` while an online schedule's forward sweep runs, until
            :meth:`stopped` gives it.
        data_size: what a slot holding a step's data weighs against a state slot (weight 1),
            for the weighted memory (:attr:`Stats.peak_memory`).
        memory_budget: the most weighted memory level 0 may hold at once (``None``: no bound but
            the slot counts); an action that would exceed it raises. :meth:`for_schedule` takes
            both from the schedule (:attr:`Schedule.data_size`, :attr:`Schedule.memory_budget`).

    Example:
        >>> from retrograde.schedules import Level, Revolve, Simulator
        >>> sim = Simulator((Level(3),), 20).run(Revolve(3).actions(20))
        >>> sim.stats().plain, sim.current
        (45, None)
    """

    def __init__(
        self,
        levels: tuple[Level, ...],
        n_steps: int | None,
        *,
        data_size: float | Fraction = 1,
        memory_budget: float | Fraction | None = None,
    ):
        self.levels = tuple(levels)
        self.data_size = exact_size(data_size, "Simulator(data_size=...)")
        self.memory_budget = (
            None
            if memory_budget is None
            else exact_size(memory_budget, "Simulator(memory_budget=...)")
        )
        self.peak_weight = [Fraction(0)] * len(self.levels)
        self.held: list[dict[int, int]] = [dict() for _ in self.levels]
        self.data: list[dict[int, int]] = [dict() for _ in self.levels]  # slot -> step of its data
        self.linearized = 0
        self.reversed = 0
        self.data_writes = [0] * len(self.levels)
        self.data_reads = [0] * len(self.levels)
        self.current: int | None = 0
        self.n: int | None = None
        self.next_record = -1
        self.plain = 0
        self.recorded = 0
        self.writes = [0] * len(self.levels)
        self.reads = [0] * len(self.levels)
        self.peak = [0] * len(self.levels)
        if n_steps is not None:
            self.stopped(n_steps)

    @classmethod
    def for_schedule(cls, schedule: Schedule, n_steps: int | None) -> Simulator:
        """A simulator for ``schedule``'s levels, data size and memory budget.

        Example:
            >>> from retrograde.schedules import Mixed, Simulator
            >>> sim = Simulator.for_schedule(Mixed(3), 10)
            >>> sim.data_size, sim.memory_budget
            (Fraction(1, 1), Fraction(3, 1))
        """
        return cls(
            schedule.levels,
            n_steps,
            data_size=1 if schedule.data_size is None else schedule.data_size,
            memory_budget=schedule.memory_budget,
        )

    def stopped(self, n_steps: int) -> None:
        """Set the step count ``N`` (for an online schedule: once its loop has stopped)."""
        if self.n is not None or (self.current is not None and self.current > n_steps):
            raise ScheduleError(
                f"the loop cannot stop after {n_steps} steps: "
                + (
                    f"N is {self.n} already."
                    if self.n is not None
                    else f"the state at hand is {self.current}."
                )
            )
        self.n = n_steps
        self.next_record = n_steps - 1

    def copy(self) -> Simulator:
        """An independent copy (``O(slots)``), to execute several continuations of one prefix."""
        other = copy.copy(self)
        other.held = [dict(h) for h in self.held]
        other.data = [dict(h) for h in self.data]
        other.writes, other.reads, other.peak = self.writes[:], self.reads[:], self.peak[:]
        other.peak_weight = self.peak_weight[:]
        other.data_writes, other.data_reads = self.data_writes[:], self.data_reads[:]
        return other

    def not_held(self, action: Restore | Free | Reverse, holds: int | None) -> None:
        """Raise the error for a ``Restore``/``Free``/``Reverse`` whose slot holds ``holds``
        (``None``: nothing) instead of what ``action`` asks for."""
        data = self.data[action.level].get(action.slot)
        if holds is not None:
            what = f"state {holds}"
        elif data is not None:
            what = f"the data of step {data}"
        else:
            what = "nothing"
        wanted = f"the data of step {action.step}" if type(action) is Reverse else action.step
        hint = ""
        if type(action) is Restore and data is not None:
            hint = " (a sweep cannot restart from a step's data)"
        raise ScheduleError(
            f"{action}: slot {action.slot} of level {action.level} holds {what}, "
            f"not {wanted}{hint}."
        )

    # ------------------------------------------------------------------ the actions
    def _slots(self, action, level: int) -> dict[int, int]:
        if not 0 <= level < len(self.levels):
            raise ScheduleError(f"{action}: no storage level {level}.")
        return self.held[level]

    def _not_at_hand(self, action, n: int) -> ScheduleError:
        return ScheduleError(f"{action}: the state at hand is {self.current}, not {n}.")

    def advance(self, action: Advance) -> None:
        a, b = action
        if self.current != a:
            raise self._not_at_hand(action, a)
        if not (a < b and (self.n is None or b <= self.n)):
            bound = "" if self.n is None else f" <= {self.n}"
            raise ScheduleError(f"{action}: must satisfy start < stop{bound}.")
        self.plain += b - a
        self.current = b

    def store(self, action: Store) -> None:
        n, slot, level = action
        held = self._slots(action, level)
        if self.current != n:
            raise self._not_at_hand(action, n)
        self._take(action, level, slot)
        held[slot] = n
        self.writes[level] += 1
        self._peak(level, action)

    def _take(self, action, level: int, slot: int) -> None:
        if slot in self.held[level]:
            raise ScheduleError(
                f"{action}: slot {slot} still holds state {self.held[level][slot]}."
            )
        if slot in self.data[level]:
            raise ScheduleError(
                f"{action}: slot {slot} still holds the data of step {self.data[level][slot]}."
            )
        cap = self.levels[level].slots
        if slot < 0 or (cap is not None and slot >= cap):
            raise ScheduleError(f"{action}: level {level} has slots 0..{cap - 1}.")

    def _peak(self, level: int, action) -> None:
        states, data = len(self.held[level]), len(self.data[level])
        self.peak[level] = max(self.peak[level], states + data)
        weight = states + self.data_size * data
        if weight > self.peak_weight[level]:
            if level == 0 and self.memory_budget is not None and weight > self.memory_budget:
                raise ScheduleError(
                    f"{action}: level 0 would hold {states} states and {data} step data of "
                    f"{self.data_size} states each, {weight} states in all, over the memory "
                    f"budget of {self.memory_budget}."
                )
            self.peak_weight[level] = weight

    def restore(self, action: Restore) -> None:
        n, slot, level = action
        held = self._slots(action, level)
        if held.get(slot) != n:
            self.not_held(action, held.get(slot))
        self.reads[level] += 1
        self.current = n

    def free(self, action: Free) -> None:
        n, slot, level = action
        held = self._slots(action, level)
        if self.data[level].get(slot) == n and slot not in held:
            del self.data[level][slot]
            return
        if held.get(slot) != n:
            self.not_held(action, held.get(slot))
        del held[slot]

    def _next(self, action, n: int) -> None:
        if self.n is None:
            raise ScheduleError(f"{action} before the loop stopped (its step count is unknown).")
        if n != self.next_record:
            raise ScheduleError(f"{action}: the next step to record is {self.next_record}.")

    def record(self, action: Record) -> None:
        (n,) = action
        self._next(action, n)
        if self.current != n:
            raise self._not_at_hand(action, n)
        self.recorded += 1
        self.next_record -= 1
        self.current = None

    def linearize(self, action: Linearize) -> None:
        n, slot, level = action
        self._slots(action, level)
        if self.current != n:
            raise self._not_at_hand(action, n)
        if self.n is not None and n >= self.n:
            raise ScheduleError(f"{action}: the loop has {self.n} steps.")
        self._take(action, level, slot)
        self.data[level][slot] = n
        self.data_writes[level] += 1
        self._peak(level, action)
        self.linearized += 1
        self.current = n + 1

    def reverse(self, action: Reverse) -> None:
        n, slot, level = action
        self._slots(action, level)
        self._next(action, n)
        if self.data[level].get(slot) != n:
            self.not_held(action, self.held[level].get(slot))
        self.data_reads[level] += 1
        self.reversed += 1
        self.next_record -= 1
        self.current = None

    def end(self, action: End) -> None:
        if self.n is None or self.next_record != -1:
            raise ScheduleError(f"End() before step {self.next_record} was recorded.")

    def stats(self) -> Stats:
        """The counts, once ``End`` was executed."""
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
            linearized=self.linearized,
            reversed=self.reversed,
            data_writes=tuple(self.data_writes),
            data_reads=tuple(self.data_reads),
            peak_memory=tuple(float(w) for w in self.peak_weight),
        )


def execute(
    actions: Iterable,
    n_steps: int,
    levels: tuple[Level, ...],
    *,
    data_size: float | Fraction = 1,
    memory_budget: float | Fraction | None = None,
) -> Stats:
    """Run an explicit action stream on the simulator (``u_0`` at hand at the start);
    ``data_size`` and ``memory_budget`` as for :class:`Simulator`.

    Example:
        >>> from retrograde.schedules import Advance, End, Level, Record, Restore, Store, execute
        >>> acts = [Store(0, 0), Advance(0, 1), Record(1), Restore(0, 0), Record(0), End()]
        >>> execute(acts, 2, (Level(1),)).plain
        1
    """
    sim = Simulator(
        tuple(levels), check_steps(n_steps), data_size=data_size, memory_budget=memory_budget
    )
    return sim.run(actions).stats()


def simulate(schedule: Schedule, n_steps: int) -> Stats:
    """Execute ``schedule`` for ``n_steps`` steps on the simulator.

    Raises :class:`ScheduleError` if the schedule is invalid: a recorded step without its state at
    hand or out of order, a restore of an unwritten or freed slot, a store into an occupied slot or
    beyond a level's slot count, or a missing ``End``. Returns the counts as :class:`Stats`.

    Online schedules are driven through their protocol (:func:`schedule_stream`); only
    ``Store``/``Free`` are accepted from ``on_step``.

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
    sim = Simulator.for_schedule(schedule, n_steps)
    return sim.run(schedule_stream(schedule, n_steps)).stats()
