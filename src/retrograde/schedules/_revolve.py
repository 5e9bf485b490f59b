"""Offline binomial checkpointing: ``Revolve`` (Griewank & Walther, ACM TOMS 26(1), 2000)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from ._actions import Action, Advance, End, Free, Record, Restore, Store, relabel
from ._base import MemorySlots, OfflineSchedule, check_steps
from ._optimum import beta, repetition

__all__ = [
    "Revolve",
    "revolve_split",
    "largest_split",
    "reverse_segment",
    "reverse_held",
    "binomial_reversal",
]


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
    r, b = repetition(n, s) if r_hint is None else (max(r_hint, 0), beta(s, max(r_hint, 0)))
    while b < n:  # hint too small
        r += 1
        b = b * (s + r) // r
    while r > 0 and b * r // (s + r) >= n:  # hint too large
        b = b * r // (s + r)
        r -= 1
    q = max(0, r - 1)
    beta_prev = beta(s, q - 1) if q else 0
    beta_q = beta(s, q)
    beta_right = beta(s - 1, q + 1)
    while True:
        lo = max(1, beta_prev, n - beta_right)
        if lo <= min(n - 1, beta_q - 1):
            return lo, q
        q += 1
        beta_prev, beta_q = beta_q, beta_q * (s + q) // q
        beta_right = beta_right * (s + q) // (q + 1)


def largest_split(n_steps: int, snapshots: int) -> int:
    """The largest optimal first split: the largest ``j`` minimising ``j + t(n - j, s - 1) +
    t(j, s)`` for ``n = n_steps > s + 1`` and ``s = snapshots >= 2`` (:func:`revolve_split`
    returns the smallest). The cost's increment ``1 + r(j + 1, s) - r(n - j, s - 1)`` first
    turns positive at ``j = max(1, beta(s, q - 1), n - beta(s - 1, q))`` for ``q = r(n, s) - 1``
    when that lies below ``min(n, beta(s, q))``, else for ``q = r(n, s)``.

    Example:
        >>> revolve_split(100, 5)[0], largest_split(100, 5)
        (30, 56)
    """
    n, s = n_steps, snapshots
    r, _ = repetition(n, s)
    for q in (max(r - 1, 0), r):
        j = max(1, beta(s, q - 1) if q else 0, n - beta(s - 1, q))
        if j <= min(n - 1, beta(s, q) - 1):
            return j
    raise AssertionError((n, s))  # unreachable: q = r always qualifies


@dataclasses.dataclass(frozen=True)
class Revolve(MemorySlots, OfflineSchedule):
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

    def actions(self, n_steps: int) -> Iterator[Action]:
        n_steps = check_steps(n_steps)
        if n_steps:
            yield Store(0, 0, 0)
            yield from reverse_segment(n_steps, self.snapshots)
            yield Free(0, 0, 0)
        yield End()

    def binomial_stores(self, n_steps: int) -> tuple[int, ...]:
        """A forward sweep of optimal splits (the largest, :func:`largest_split`, as the JAX
        loops' reversal machine takes them): each split of the right part stores its state,
        until the right part has one slot or is reversed by storing every state."""
        n_steps = check_steps(n_steps)
        stores: list[int] = []
        a, s = 0, self.snapshots
        while n_steps - a >= 2:
            n = n_steps - a
            stores.append(a)
            if s == 1:
                break
            if n <= s + 1:  # r = 1: every state of the segment but the last is stored
                stores.extend(range(a + 1, n_steps - 1))
                break
            j = largest_split(n, s)
            if a + j == n_steps - 1:
                break
            a, s = a + j, s - 1
        return tuple(stores)


def reverse_segment(n_steps: int, snapshots: int) -> Iterator[Action]:
    """Reverse steps ``0 .. n_steps-1`` with ``u_0`` at hand and held in slot 0 (of level 0), by
    Revolve with ``snapshots`` slots ``0 .. snapshots-1``; the stream has no ``End``.

    One generator frame with an explicit stack of at most ``2 * snapshots`` pending tasks: a
    segment is split, its right part (one slot fewer) is processed at once, and "free the new
    snapshot, then reverse the left part" is pushed for later.
    """
    free = list(range(snapshots - 1, 0, -1))
    stack: list[tuple] = [(0, n_steps, snapshots, 0, True, repetition(n_steps, snapshots)[0])]
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


def reverse_held(held: Sequence[int], n_steps: int) -> Iterator[Action]:
    """Reverse ``n_steps`` steps from the snapshots ``held`` (per slot, ``-1`` empty), last
    segment first, each with Revolve and every slot not held by an earlier snapshot."""
    s = len(held)
    by_step = sorted((p, k) for k, p in enumerate(held) if p >= 0)
    end = n_steps
    for i in range(len(by_step) - 1, -1, -1):
        start, slot = by_step[i]
        busy = {k for _, k in by_step[:i]}
        free = [k for k in range(s) if k != slot and k not in busy]
        slot_of = [(0, k) for k in [slot] + free]
        yield Restore(start, slot)
        yield from relabel(reverse_segment(end - start, len(slot_of)), start, slot_of)
        yield Free(start, slot)
        end = start
    yield End()


def binomial_reversal(stores: Sequence[int], n_steps: int, slots: int) -> Iterator[Action]:
    """The actions of a forward sweep that stores ``u_p`` for ``p`` in ``stores`` (increasing,
    below ``n_steps - 1``) in slots ``0, 1, ...`` of ``slots``, then the binomial reversal of
    :meth:`OfflineSchedule.binomial_stores`: ``u_{N-1}`` recorded at once, then the segments
    between the stored states, last first (:func:`reverse_held`).

    Example:
        >>> from retrograde.schedules import Revolve, execute, simulate
        >>> stores = Revolve(5).binomial_stores(100)
        >>> acts = binomial_reversal(stores, 100, 5)
        >>> execute(acts, 100, Revolve(5).levels).plain == simulate(Revolve(5), 100).plain
        True
    """
    n_steps = check_steps(n_steps)
    if len(stores) > slots or any(p >= n_steps - 1 for p in stores):
        raise ValueError(
            f"binomial_reversal: {len(stores)} stores below step {n_steps - 1} need that many "
            f"of the {slots} slots, got {list(stores)}."
        )
    at = 0
    for k, p in enumerate(stores):
        if p > at:
            yield Advance(at, p)
        yield Store(p, k, 0)
        at = p
    if n_steps:
        if n_steps - 1 > at:
            yield Advance(at, n_steps - 1)
        yield Record(n_steps - 1)
    held = list(stores) + [-1] * (slots - len(stores))
    yield from reverse_held(held, n_steps - 1 if n_steps else 0)
