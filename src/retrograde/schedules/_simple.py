"""Simple offline schedules: store everything, recompute everything, periodic snapshots."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from ._actions import Action, Advance, End, Free, Record, Restore, Store
from ._base import Level, OfflineSchedule, OnlineRun, check_steps
from ._revolve import Revolve

__all__ = ["StoreAll", "RecomputeAll", "Periodic"]


@dataclasses.dataclass(frozen=True)
class StoreAll(OfflineSchedule):
    """Store every state during the forward sweep: ``N - 1`` plain evaluations, ``N - 1`` slots.

    The fastest schedule and the most memory-hungry; what ``jax.lax.scan`` does by default.

    Example:
        >>> from retrograde.schedules import StoreAll, simulate
        >>> simulate(StoreAll(), 100).plain
        99
    """

    def actions(self, n_steps: int) -> Iterator[Action]:
        n_steps = check_steps(n_steps)
        for n in range(n_steps - 1):
            yield Store(n, n, 0)
            yield Advance(n, n + 1)
        if n_steps:
            yield Record(n_steps - 1)
        for n in range(n_steps - 2, -1, -1):
            yield Restore(n, n, 0)
            yield Record(n)
            yield Free(n, n, 0)
        yield End()

    def binomial_stores(self, n_steps: int) -> tuple[int, ...]:
        return tuple(range(check_steps(n_steps) - 1))

    def start(self) -> OnlineRun:
        """The same placement for a loop whose step count is unknown (the online protocol of
        :class:`~retrograde.schedules.OnlineRun`): ``u_n`` stored before every step, so ``N``
        slots (one more than :meth:`actions`, since the last step is not known to be the last),
        ``N`` plain evaluations forward and none in the reversal.

        Example:
            >>> run = StoreAll().start()
            >>> [run.on_step(n) for n in range(2)]
            [(Store(step=0, slot=0, level=0),), (Store(step=1, slot=1, level=0),)]
            >>> list(run.reverse(2))[:3]
            [Restore(step=1, slot=1, level=0), Record(step=1), Free(step=1, slot=1, level=0)]
        """
        return _StoreEveryStep()


class _StoreEveryStep(OnlineRun):
    """:meth:`StoreAll.start`: every state stored as the loop runs."""

    def __init__(self):
        self._next = 0

    def on_step(self, n: int) -> tuple[Action, ...]:
        if n != self._next:
            raise ValueError(
                f"on_step(n={n}): steps must be reported in order; expected n={self._next}."
            )
        self._next += 1
        return (Store(n, n, 0),)

    def reverse(self, n_steps: int) -> Iterator[Action]:
        if n_steps != self._next:
            raise ValueError(f"reverse(n_steps={n_steps}): {self._next} steps were taken.")
        for n in range(n_steps - 1, -1, -1):
            yield Restore(n, n, 0)
            yield Record(n)
            yield Free(n, n, 0)
        yield End()


@dataclasses.dataclass(frozen=True)
class RecomputeAll(OfflineSchedule):
    """Keep only the initial state: one slot, ``N(N-1)/2`` plain evaluations.

    Example:
        >>> from retrograde.schedules import RecomputeAll, simulate
        >>> simulate(RecomputeAll(), 100).plain
        4950
    """

    @property
    def levels(self) -> tuple[Level, ...]:
        return (Level(1, name="memory"),)

    def actions(self, n_steps: int) -> Iterator[Action]:
        return Revolve(1).actions(n_steps)

    def binomial_stores(self, n_steps: int) -> tuple[int, ...]:
        return Revolve(1).binomial_stores(n_steps)


@dataclasses.dataclass(frozen=True)
class Periodic(OfflineSchedule):
    """Snapshot every ``every``-th state in the forward sweep; in the reverse sweep recompute
    each segment once, storing each of its states.

    Slots: ``ceil(N / every) + every - 1`` at most. Plain evaluations: about ``2N``.
    With ``every ~ sqrt(N)`` this is the classic "sqrt(N) memory" scheme.

    Example:
        >>> from retrograde.schedules import Periodic, simulate
        >>> s = simulate(Periodic(10), 100); (s.plain, s.peak_slots)
        (180, (18,))
    """

    every: int

    def __post_init__(self):
        if isinstance(self.every, bool) or not isinstance(self.every, int):
            raise TypeError(f"Periodic(every={self.every!r}): every must be an int >= 1.")
        if self.every < 1:
            raise ValueError(
                f"Periodic(every={self.every}): every must be >= 1 (every=1 stores every state)."
            )

    def max_slots(self, n_steps: int) -> tuple[int, ...]:
        return (max(1, -(-n_steps // self.every) + self.every - 1),)

    def actions(self, n_steps: int) -> Iterator[Action]:
        n_steps = check_steps(n_steps)
        k = self.every
        starts = list(range(0, n_steps, k))
        n_coarse = len(starts)
        # Forward sweep: store each segment start; the last segment is reversed straight away.
        for i, a in enumerate(starts):
            yield Store(a, i, 0)
            if i + 1 < n_coarse:
                yield Advance(a, starts[i + 1])
        for i in range(n_coarse - 1, -1, -1):
            a = starts[i]
            b = min(a + k, n_steps)
            if i != n_coarse - 1:
                yield Restore(a, i, 0)
            # Recompute the segment once, storing every state in it (fine slots follow coarse).
            for n in range(a, b - 1):
                if n > a:
                    yield Store(n, n_coarse + (n - a - 1), 0)
                yield Advance(n, n + 1)
            yield Record(b - 1)
            for n in range(b - 2, a - 1, -1):
                if n > a:
                    yield Restore(n, n_coarse + (n - a - 1), 0)
                    yield Record(n)
                    yield Free(n, n_coarse + (n - a - 1), 0)
                else:
                    yield Restore(a, i, 0)
                    yield Record(a)
            yield Free(a, i, 0)
        yield End()

    def binomial_stores(self, n_steps: int) -> tuple[int, ...]:
        """Each segment start, and the states of the last segment, which the forward sweep
        recomputes at once."""
        n_steps = check_steps(n_steps)
        starts = tuple(range(0, n_steps, self.every))
        if not starts or starts[-1] == n_steps - 1:  # a last segment of one step stores nothing
            return starts[:-1]
        return starts + tuple(range(starts[-1] + 1, n_steps - 1))
