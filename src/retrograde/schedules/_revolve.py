"""Offline binomial checkpointing: ``Revolve`` (Griewank & Walther, ACM TOMS 26(1), 2000)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from math import comb

from ._actions import Action, Advance, End, Free, Record, Restore, Store
from ._base import Level, OfflineSchedule, check_snapshots, check_steps
from ._optimum import repetition_number

__all__ = ["Revolve", "revolve_split"]


def revolve_split(n_steps: int, snapshots: int, r_hint: int | None = None) -> tuple[int, int]:
    """Optimal distance from the start of a segment to its first new snapshot.

    For a segment of ``n = n_steps >= 2`` steps reversed with ``s = snapshots >= 2`` slots (one of
    them holding the segment's start), returns ``(j, q)``: the smallest ``j`` minimising
    ``j + t(n - j, s - 1) + t(j, s)``, and ``q = r(j + 1, s)``. The cost is convex in ``j`` with
    increment ``1 + r(j + 1, s) - r(n - j, s - 1)``, so the optimum is the first ``j`` with
    ``n - j <= beta(s - 1, q + 1)``. Such a ``j`` exists only for ``q >= r(n, s) - 1``, so the scan
    starts there. ``r_hint`` (any guess of ``r(n, s)``) makes finding ``r(n, s)`` O(1) when close.
    Afterwards ``r(n - j, s - 1) <= q + 1`` and ``r(j, s) <= q``.
    """
    n, s = n_steps, snapshots
    r = repetition_number(n, s) if r_hint is None else max(r_hint, 0)
    b = comb(s + r, s)
    while b < n:  # hint too small
        r += 1
        b = b * (s + r) // r
    while r > 0 and b * r // (s + r) >= n:  # hint too large
        b = b * r // (s + r)
        r -= 1
    q = max(0, r - 1)
    beta_prev = comb(s + q - 1, s) if q else 0  # beta(s, q - 1)
    beta_q = comb(s + q, s)  # beta(s, q)
    beta_right = comb(s + q, s - 1)  # beta(s - 1, q + 1)
    while True:
        lo = max(1, beta_prev, n - beta_right)
        if lo <= min(n - 1, beta_q - 1):
            return lo, q
        q += 1
        beta_prev, beta_q = beta_q, beta_q * (s + q) // q
        beta_right = beta_right * (s + q) // (q + 1)


@dataclasses.dataclass(frozen=True)
class Revolve(OfflineSchedule):
    """Optimal offline binomial checkpointing with ``snapshots`` slots in one storage level.

    Plain evaluations equal the proven optimum ``t(N, s) = r*N - C(s+r, s+1)``
    (:func:`revolve_optimum`); recorded evaluations are ``N``. Peak slots: ``min(s, N - 1)``
    (``1`` for ``N = 1``): a state recorded right after it is computed is never stored.
    Generating the actions needs ``O(s)`` memory and ``O(N)`` time.

    Args:
        snapshots: slots for snapshots, the one holding the initial state included (``>= 1``).

    Example:
        >>> from retrograde.schedules import Revolve, simulate
        >>> simulate(Revolve(5), 100).plain
        316
    """

    snapshots: int

    def __post_init__(self):
        check_snapshots(self.snapshots, "Revolve(snapshots=...)")

    @property
    def levels(self) -> tuple[Level, ...]:
        return (Level(self.snapshots, name="memory"),)

    def actions(self, n_steps: int) -> Iterator[Action]:
        n_steps = check_steps(n_steps)
        if n_steps:
            yield Store(0, 0, 0)
            yield from _reverse(n_steps, self.snapshots)
            yield Free(0, 0, 0)
        yield End()


def _reverse(n_steps: int, snapshots: int) -> Iterator[Action]:
    """Reverse steps ``0 .. n_steps-1`` with ``u_0`` at hand and held in slot 0.

    One generator frame with an explicit stack of at most ``2 * snapshots`` pending tasks: a
    segment is split, its right part (one slot fewer) is processed at once, and "free the new
    snapshot, then reverse the left part" is pushed for later.
    """
    free = list(range(snapshots - 1, 0, -1))
    stack: list[tuple] = [(0, n_steps, snapshots, 0, True, repetition_number(n_steps, snapshots))]
    while stack:
        task = stack.pop()
        if len(task) == 2:  # the right part is done: release its snapshot
            m, slot_m = task
            yield Free(m, slot_m, 0)
            free.append(slot_m)
            continue
        a, b, s, slot_a, at_hand, r = task
        while True:
            n = b - a
            if n == 1:
                if not at_hand:
                    yield Restore(a, slot_a, 0)
                yield Record(a)
                break
            if s == 1:
                for k in range(b - 1, a - 1, -1):
                    if not at_hand:
                        yield Restore(a, slot_a, 0)
                    if k > a:
                        yield Advance(a, k)
                    yield Record(k)
                    at_hand = False
                break
            if not at_hand:
                yield Restore(a, slot_a, 0)
            j, q = revolve_split(n, s, r)
            m = a + j
            yield Advance(a, m)
            if m == b - 1:  # the right part is one step: record it, no snapshot needed
                yield Record(m)
                b, at_hand, r = m, False, q
                continue
            slot_m = free.pop()
            yield Store(m, slot_m, 0)
            stack.append((a, m, s, slot_a, False, q))
            stack.append((m, slot_m))
            a, s, slot_a, at_hand, r = m, s - 1, slot_m, True, q + 1
