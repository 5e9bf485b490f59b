"""Mixed checkpointing: slots that hold a state or the data one step's adjoint needs.

J. R. Maddison, "Step-based checkpointing with high-level algorithmic differentiation", J.
Comput. Sci. 82, 102405 (2024). A slot may hold the data one step's adjoint needs (written by
:class:`Linearize`) instead of a state, and that step is then reversed (:class:`Reverse`) with no
forward evaluation. With ``u_0`` at hand and a budget of ``s`` states, the fewest forward
evaluations (plain, linearized and recorded) that reverse ``n`` steps obey

    M(1, s) = 1,
    M(n, s) = min(1 + M(n - 1, s - d),  min_{1 <= i < n} i + M(i, s) + M(n - i, s - 1))

(the first: linearize step 0 into a slot of ``d`` states; the second: store ``u_0``, advance
``i`` steps, reverse the rest with one slot fewer, restore ``u_0``, free its slot and reverse
the first ``i``). The schedule is a *tree*: a segment with ``u_start`` at hand and ``k`` states
held above it (its *level*) is either a **leaf**, reversed from data (linearize all its steps
but the last, record the last, reverse the others from their data), or **split** by storing
``u_start``. A leaf at level ``k`` has at most ``c_k = leaf_size(k) = floor((s - k) / d) + 1``
steps; the tree's extra advances obey ``A(n, k) = 0`` for ``n <= c_k``, else
``min_j j + A(j, k) + A(n - j, k + 1)``.

``docs/mixed.md`` proves, for leaf sizes that drop by at most one per level (every ``d >= 1``),
that the best tree's optimum is a band formula, and gives a split rule attaining it, both in
``O(S r)`` integer operations per segment (:func:`band_rule_applies`: when its knapsack is
solved greedily, which includes every whole ``d``); for ``d = 1`` the best tree attains ``M``.
Other leaf sizes are planned by a dynamic program (:class:`_Table`), whose optimum attains ``M``
in every case the tests check (not proven).

The one home of the mixed recurrences: :func:`mixed_optimum` and :func:`mixed_split` (``d =
1``), :class:`Mixed` (any data size), both over the band rule here.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Iterator
from fractions import Fraction

import numpy as np

from ._actions import (
    Action,
    Advance,
    End,
    Free,
    Linearize,
    Record,
    Restore,
    Reverse,
    Store,
)
from ._base import Level, OfflineSchedule, check_snapshots, check_steps, exact_size

__all__ = ["Mixed", "mixed_optimum", "mixed_split", "band_rule_applies", "TABLE_LIMIT"]

#: The most ``N^2 * S / 2`` (pairs examined) :class:`Mixed` plans by its dynamic program, for
#: leaf sizes without a band rule; beyond it the schedule raises instead of running for minutes.
TABLE_LIMIT = 2 * 10**10


# ---------------------------------------------------------------------------------------------
# The band rule (docs/mixed.md, "General leaf sizes")
# ---------------------------------------------------------------------------------------------


def _runs(leaves: tuple[int, ...], level: int) -> list[tuple[int, int]]:
    """The runs of equal leaf size from ``level`` down: ``(first, last)`` levels, in order."""
    runs, first = [], level
    for a in range(level, len(leaves)):
        if a == len(leaves) - 1 or leaves[a + 1] != leaves[a]:
            runs.append((first, a))
            first = a + 1
    return runs


@functools.lru_cache(maxsize=256)
def band_rule_applies(leaves: tuple[int, ...]) -> bool:
    """Whether the band rule plans the tree of these leaf sizes ``c_0 >= ... >= c_S >= 1``: each
    drops by at most one from a level to the next, and the segment values ``W`` (a run of
    ``l`` levels of equal size ``v`` after the first run: ``l * v``) do not increase, so that
    the band's knapsack is solved greedily (``docs/mixed.md``). True for every budget with a
    whole data size ``d >= 1`` (runs of ``d`` levels) and for ``d > budget`` (Revolve); a
    fractional ``d > 1`` has runs of two lengths, ``d < 1`` drops of more than one. ``O(S)``.

    Example:
        >>> [band_rule_applies(c) for c in [(3, 2, 1), (5, 3, 1), (4, 3, 2, 2, 1)]]
        [True, False, False]
    """
    if any(not 0 <= a - b <= 1 for a, b in itertools.pairwise(leaves)):
        return False
    values = [(last - first + 1) * leaves[first] for first, last in _runs(leaves, 0)[1:]]
    return all(v >= w for v, w in itertools.pairwise(values))


@dataclasses.dataclass(frozen=True)
class _Band:
    """Where ``n > c_k`` steps at level ``k`` lie: band ``r >= 1`` (``N(r - 1, k) < n <= N(r,
    k)``, ``N(r, k)`` the most steps reversed with at most ``r`` extra advances each), ``base =
    N(r - 1, k)``, ``left = N(r - 2, k)`` (``N(-1, k) = c_k - c_{k+1}``) and ``cost``, the
    extra advances of the full tree of ``N(r - 1, k)`` steps."""

    r: int
    base: int
    left: int
    cost: int


def _band(leaves: tuple[int, ...], n: int, level: int) -> _Band:
    """The band of ``n > c_level`` steps at ``level < S``, by the rows ``N(r, .)`` and the full
    trees' costs ``F(r, .)`` of the levels ``level .. S``: ``N(r, a) = N(r - 1, a) + N(r, a +
    1)``, ``F(r, a) = F(r - 1, a) + N(r - 1, a) + F(r, a + 1)`` (the left part advanced once
    more), ``N(r, S) = c_S``, ``F(r, S) = 0``, from ``N(-1, a) = -F(-1, a) = c_a - c_{a+1}``.
    ``O((S - level) r)``."""
    c = leaves[level:]
    top = len(c) - 1
    size = [c[i] - c[i + 1] for i in range(top)] + [c[top]]
    cost = [-x for x in size[:top]] + [0]
    left, r = size[0], 0
    while True:
        new_size, new_cost = size[:], cost[:]
        new_size[top], new_cost[top] = c[top], 0
        for i in range(top - 1, -1, -1):
            new_size[i] = size[i] + new_size[i + 1]
            new_cost[i] = cost[i] + size[i] + new_cost[i + 1]
        if new_size[0] >= n:
            return _Band(r, size[0], left, cost[0])
        left, size, cost, r = size[0], new_size, new_cost, r + 1


def _chains(r: int, i: int) -> int:
    """Chains of band ``r``'s pool rooted ``i`` levels below the segment: ``C(r - 2 + i, i)``
    (band 1: the one chain from the segment's start)."""
    return math.comb(r - 2 + i, i) if r >= 2 else int(i == 0)


def _greedy(leaves: tuple[int, ...], band: _Band, level: int, o: int) -> tuple[int, int]:
    """``(K(o), o1)``: the fewest paid openings of band ``band.r``'s pool that hold ``o`` steps
    beyond its base (``docs/mixed.md``: free openings first, then the runs' segments in order,
    as many as the chains reaching them allow), and the steps ``o1`` of them in the left part's
    pool (band ``r - 1`` at ``level``), filled first. ``O(S)``."""
    r, top = band.r, len(leaves) - 1
    runs = _runs(leaves, level)
    chains = [_chains(r, a - level) for a in range(level, top)]
    left = [_chains(r - 1, a - level) if r >= 2 else 0 for a in range(level, top)]

    def free(count: list[int]) -> int:  # the free openings' steps: a chain's run, to its end
        return sum(
            count[a - level] * (last - a) * leaves[a]
            for f, last in runs
            for a in range(f, last + 1)
            if a < top
        )

    free_all, free_left = free(chains), free(left)
    need, paid = o - free_all, 0
    rest = o - min(o, free_left)
    o1 = min(o, free_left)
    rest -= min(rest, free_all - free_left)
    reach = reach_left = 0
    for (first, last), (pf, pl) in zip(runs[1:], runs):
        value = (last - first + 1) * leaves[first]
        fresh = sum(chains[a - level] for a in range(pf, pl + 1))
        fresh_left = sum(left[a - level] for a in range(pf, pl + 1))
        take = min(fresh + reach, -(-need // value)) if need > 0 else 0
        take_left = min(take, fresh_left + reach_left)
        need, paid, reach, reach_left = need - take * value, paid + take, take, take_left
        step = min(rest, take_left * value)
        o1, rest = o1 + step, rest - step
        rest -= min(rest, (take - take_left) * value)
    return paid, o1


def _band_advances(leaves: tuple[int, ...], n: int, level: int) -> int:
    """``A(n, level)`` by the band rule: ``F(r - 1) + r (n - N(r - 1)) + K``."""
    if n <= leaves[level]:
        return 0
    band = _band(leaves, n, level)
    o = n - band.base
    return band.cost + band.r * o + _greedy(leaves, band, level, o)[0]


def _band_split(leaves: tuple[int, ...], n: int, level: int) -> int:
    """An optimal split by the band rule: band 1, the start's leaf holds ``c_k - c_{k+1}`` and
    as many of the rest as the next level's leaf leaves over; else ``N(r - 2) + o1``. At level
    ``S - 1`` the only optimal split, ``n - c_S`` (the right part is a leaf of the last level;
    there the band ``r`` grows as ``n / c_S``)."""
    if n <= leaves[level]:
        return 0
    if level == len(leaves) - 2:
        return n - leaves[-1]
    band = _band(leaves, n, level)
    o = n - band.base
    if band.r == 1:
        return band.left + min(o, leaves[level + 1])
    return band.left + _greedy(leaves, band, level, o)[1]


def _unit_leaves(s: int) -> tuple[int, ...]:
    return tuple(range(s + 1, 0, -1))


def mixed_optimum(n_steps: int, snapshots: int) -> int:
    """The fewest forward evaluations (plain, linearized and recorded) that reverse ``n_steps``
    steps with ``snapshots`` slots, each holding a state or one step's data of the same size
    (``d = 1``; the slot of ``u_0`` counts). ``M(n, s) = n`` for ``n <= s + 1``; beyond, with
    ``r`` such that ``beta(s, r - 1) < n <= beta(s, r)``,

        M(n, s) = r n - C(s + r - 1, s + 1) - C(s + r - 2, s - 1) + k(n, s)

    where ``k`` is the fewest leaves of band ``r`` opened to hold ``n - beta(s, r - 1)`` steps
    (``C(a + r - 2, a)`` of them hold ``s - a`` each, ``a = 0 .. s - 1``; taken largest first);
    at the band ends ``n = C(s + r, s)`` it is ``r n - C(s + r - 1, s + 1)``. Computed by the
    band rule for leaf sizes ``s + 1, s, ..., 1``, ``O(s r)``; proof in ``docs/mixed.md``.

    Example:
        >>> mixed_optimum(1000, 10), mixed_optimum(1000, 40), mixed_optimum(10_000, 10)
        (3921, 2142, 60960)
    """
    n, s = check_steps(n_steps), check_snapshots(snapshots, "mixed_optimum(snapshots=...)")
    return n + _band_advances(_unit_leaves(s), n, 0) if n else 0


def mixed_split(n_steps: int, snapshots: int) -> int:
    """For a segment of ``n = n_steps`` steps with ``u_start`` at hand and a budget of ``s =
    snapshots`` unit slots (``d = 1``): ``0`` if it is a leaf (``n <= s + 1``: linearize its
    first ``n - 1`` steps into data slots, record the last, reverse the others), else ``j``:
    store ``u_start``, advance ``j`` steps, reverse the right part ``n - j`` with ``s - 1``,
    restore ``u_start``, free its slot, reverse the left part ``j`` with ``s``. The split is
    optimal for mixed checkpointing and for Revolve alike: ``j = beta(s, r - 2) + o1`` (band
    ``r`` of ``n``, ``o1`` what the left part's leaves hold of :func:`mixed_optimum`'s
    openings, filled first), so the left part lies in band ``r - 1`` of ``s`` and the right
    part in band ``r`` of ``s - 1``. The band rule's split, ``O(s r)``.

    Example:
        >>> mixed_split(5, 4), mixed_split(6, 4), mixed_split(1000, 10)
        (0, 2, 286)
    """
    n, s = check_steps(n_steps), check_snapshots(snapshots, "mixed_split(snapshots=...)")
    return _band_split(_unit_leaves(s), n, 0) if n else 0


class _Table:
    """The optimum of the tree for any leaf sizes ``c_0 >= c_1 >= ... >= c_S``, by dynamic
    programming: ``A(n, k)`` (advances reversing ``n`` steps at level ``k``) is ``0`` for ``n <=
    c_k`` and ``min_j j + A(j, k) + A(n - j, k + 1)`` otherwise (levels ``k < S``), with the
    largest optimal ``j``. ``O(N^2 S)`` operations (NumPy rows) and ``O(N S)`` memory for all
    ``n <= N``, extended by the new columns when a longer ``N`` is asked for."""

    def __init__(self, leaves: tuple[int, ...]):
        self.leaves = leaves
        self.n_max = 0
        self.advances = np.zeros((len(leaves), 1), dtype=np.int64)
        self.splits = np.zeros((len(leaves), 1), dtype=np.int64)

    def grow(self, n_max: int) -> None:
        """Extend the table to every ``n <= n_max`` (only the new columns are computed)."""
        done = self.n_max
        if n_max <= done:
            return
        levels = len(self.leaves)
        infinite = np.int64(1) << 40
        advances = np.full((levels, n_max + 1), infinite, dtype=np.int64)
        splits = np.zeros((levels, n_max + 1), dtype=np.int64)
        advances[:, : done + 1] = self.advances
        splits[:, : done + 1] = self.splits
        for k in range(levels - 1, -1, -1):
            leaf = min(self.leaves[k], n_max)
            advances[k, 1 : leaf + 1] = 0
            if k == levels - 1:
                continue
            left = np.arange(n_max + 1, dtype=np.int64) + advances[k]  # j + A(j, k), as filled
            right = advances[k + 1]
            for n in range(max(leaf, done) + 1, n_max + 1):
                cost = left[1:n] + right[n - 1 : 0 : -1]  # j = 1 .. n - 1
                last = int(np.argmin(cost[::-1]))  # the largest optimal j is n - 1 - last
                advances[k, n] = cost[n - 2 - last]
                splits[k, n] = n - 1 - last
                left[n] = n + advances[k, n]
        self.advances, self.splits, self.n_max = advances, splits, n_max


@functools.lru_cache(maxsize=8)
def _table(leaves: tuple[int, ...]) -> _Table:
    return _Table(leaves)


@dataclasses.dataclass(frozen=True)
class Mixed(OfflineSchedule):
    """Optimal mixed checkpointing (Maddison 2024): a memory budget of ``snapshots`` states, in
    which a slot holds a state (weight 1) or the data one step's adjoint needs (weight
    ``data_size``), so that some steps are reversed from their data with no forward evaluation.

    The schedule is a tree of stored states whose leaves are reversed from data: a segment with
    ``u_start`` at hand and ``k`` states held (its level) is a leaf if it has at most
    :meth:`leaf_size` ``(k)`` steps (``Linearize`` all but the last into data slots, ``Record``
    the last, ``Reverse`` the others last first, freeing each), else it is split where
    :meth:`split` says (``Store`` ``u_start`` in slot ``k``, ``Advance``, the right part at
    level ``k + 1``, ``Restore``, the left part at level ``k``, whose leaf ``Free`` s the slot).
    Its forward evaluations are the optimum ``M(N, s)`` of the mixed recurrence
    (:meth:`evaluations`; proven for ``data_size = 1``, checked against the recurrence for other
    sizes; never more than Revolve's ``t(N, s) + N``, and equal to it when ``data_size >
    snapshots``). State slots are ``0 .. state_slots - 1`` (slot ``k`` holds the
    state stored at level ``k``), data slots ``state_slots .. state_slots + data_slots - 1``;
    at any time ``states + data_size * data <= snapshots`` (the simulator checks it).

    The split rule: when :func:`band_rule_applies` to the leaf sizes (every whole ``data_size
    >= 1``, and ``data_size > snapshots``), the band rule of ``docs/mixed.md``: the optimum of
    the tree and an optimal split in ``O(S r)`` integer operations per segment, no table (for
    ``data_size = 1`` it is :func:`mixed_split` and :func:`mixed_optimum`). Otherwise (a
    fractional ``data_size``) a dynamic program over the tree, ``O(N^2 S)`` operations and ``O(N
    S)`` memory for ``N`` steps, computed once per budget and data size (up to
    :data:`TABLE_LIMIT`).

    Args:
        snapshots: the memory budget, in states (``>= 1``: an int, or a float or ``Fraction``
            for a budget that is not a whole number of states); the slot of ``u_0`` counts.
        data_size: the size of one step's adjoint data (in JAX, the residuals ``jax.vjp``
            keeps), in states: ``> 0``, below or above 1. :meth:`from_bytes` takes bytes.

    Example:
        >>> from retrograde.schedules import Mixed, Revolve, simulate
        >>> st = simulate(Mixed(20), 1000)
        >>> st.evaluations, simulate(Revolve(20), 1000).evaluations
        (2823, 3747)
        >>> st.plain + st.linearized + st.recorded, st.recorded + st.reversed
        (2823, 1000)
        >>> Mixed(10, data_size=2).evaluations(1000), Mixed(10, data_size=11).evaluations(1000)
        (4366, 4636)
    """

    snapshots: int | float | Fraction
    data_size: float | Fraction = 1.0
    _leaves: tuple[int, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        budget = exact_size(self.snapshots, "Mixed(snapshots=...)")
        if budget < 1:
            raise ValueError(
                f"Mixed(snapshots={self.snapshots!r}): the budget must hold at least one state "
                "(the initial state's slot); use Mixed(1, ...) for the least memory."
            )
        data = exact_size(self.data_size, "Mixed(data_size=...)")
        states = math.floor(budget)
        leaves = tuple(math.floor((budget - k) / data) + 1 for k in range(states + 1))
        object.__setattr__(self, "_leaves", leaves)

    @classmethod
    def from_bytes(cls, budget: int, state_bytes: int, data_bytes: int) -> Mixed:
        """The schedule for a memory budget of ``budget`` bytes, states of ``state_bytes`` and
        one step's adjoint data of ``data_bytes`` (exact ratios: ``snapshots = budget /
        state_bytes``, ``data_size = data_bytes / state_bytes``).

        Example:
            >>> m = Mixed.from_bytes(10 * 2**20, 2**20, 3 * 2**19)
            >>> m.state_slots, m.data_slots, m.leaf_size(4)
            (10, 6, 5)
        """
        sizes = {"budget": budget, "state_bytes": state_bytes, "data_bytes": data_bytes}
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"Mixed.from_bytes({name}={value!r}) must be a whole number of bytes >= 1."
                )
        if budget < state_bytes:
            raise ValueError(
                f"Mixed.from_bytes(budget={budget}) holds no state of state_bytes={state_bytes}: "
                "at least the initial state's slot is needed; raise the budget."
            )
        return cls(Fraction(budget, state_bytes), Fraction(data_bytes, state_bytes))

    # ------------------------------------------------------------------ the structure
    @property
    def memory_budget(self) -> Fraction:  # type: ignore[override]
        """The budget in states, exactly (what the simulator checks the weighted memory
        against)."""
        return exact_size(self.snapshots, "Mixed(snapshots=...)")

    @property
    def state_slots(self) -> int:
        """``S = floor(snapshots)``: the most states held at once (slots ``0 .. S - 1``)."""
        return len(self._leaves) - 1

    @property
    def data_slots(self) -> int:
        """The most step data held at once: ``leaf_size(0) - 1`` (slots ``S .. S + it - 1``)."""
        return self._leaves[0] - 1

    @property
    def levels(self) -> tuple[Level, ...]:
        return (Level(self.state_slots + self.data_slots, name="memory"),)

    def leaf_size(self, level: int) -> int:
        """The most steps a leaf at ``level`` (``level`` states held, ``0 <= level <= S``)
        reverses from data: ``floor((snapshots - level) / data_size) + 1`` (its first
        ``leaf_size - 1`` steps linearized into data slots, its last one recorded).

        Example:
            >>> Mixed(10).leaf_size(0), Mixed(10).leaf_size(10), Mixed(10, 0.5).leaf_size(8)
            (11, 1, 5)
        """
        if isinstance(level, bool) or not isinstance(level, int):
            raise TypeError(f"Mixed.leaf_size(level=...) must be an int, got {level!r}.")
        if not 0 <= level < len(self._leaves):
            raise ValueError(
                f"Mixed.leaf_size(level={level}): a level is the number of states held, "
                f"0 .. {self.state_slots} for this budget."
            )
        return self._leaves[level]

    @property
    def _banded(self) -> bool:
        return band_rule_applies(self._leaves)

    def _table_for(self, n_steps: int) -> _Table:
        work = n_steps * n_steps * self.state_slots // 2
        if work > TABLE_LIMIT:
            raise ValueError(
                f"{self!r} plans n_steps={n_steps} by a dynamic program of about N^2 * S / 2 = "
                f"{work:.2g} operations, over TABLE_LIMIT = {TABLE_LIMIT:.0e}. Use fewer steps "
                "per schedule, or a data size with a band rule: a whole number of states "
                "(data_size=1, 2, ...; rounding data_size up reserves more memory per data slot)."
            )
        table = _table(self._leaves)
        table.grow(n_steps)
        return table

    def split(self, n_steps: int, level: int = 0) -> int:
        """For a segment of ``n_steps`` steps with ``u_start`` at hand and ``level`` states held:
        ``0`` if it is a leaf (``n_steps <= leaf_size(level)``), else an optimal split ``j``
        (store ``u_start`` in slot ``level``, advance ``j`` steps, ...; see the class).

        Example:
            >>> Mixed(10).split(11), Mixed(10).split(1000), Mixed(10, 2.0).split(20, 3)
            (0, 286, 4)
        """
        n = check_steps(n_steps)
        leaf = self.leaf_size(level)
        if n <= leaf:
            return 0
        if level == self.state_slots:
            raise ValueError(
                f"{self!r}: a segment of {n} steps at level {level} holds every state the budget "
                f"allows and more steps than a leaf ({leaf}); no schedule reverses it."
            )
        if self._banded:
            return _band_split(self._leaves, n, level)
        return int(self._table_for(n).splits[level, n])

    def evaluations(self, n_steps: int) -> int:
        """Forward evaluations (plain, linearized and recorded) of :meth:`actions` for
        ``n_steps`` steps: the optimum ``M(N, s)`` of the mixed recurrence.

        Example:
            >>> Mixed(40).evaluations(1000), Mixed(5, data_size=0.5).evaluations(100)
            (2142, 301)
        """
        n = check_steps(n_steps)
        if n == 0:
            return 0
        if self._banded:
            return n + _band_advances(self._leaves, n, 0)
        return n + int(self._table_for(n).advances[0, n])

    def binomial_stores(self, n_steps: int) -> tuple[int, ...]:
        """The starts stored along the tree's rightmost path, in slots ``0, 1, ...`` (one per
        level): a compiled loop's forward sweep stores these, and its reversal is the tree's
        (``retrograde.loops``). The last one starts the rightmost leaf (unless that leaf is one
        step), whose steps a gradient's forward sweep linearizes, keeping their data, as the
        first sweep of :meth:`actions` does (a reversal from states only, as an HVP's, linearizes
        them again from that start).

        Example:
            >>> Mixed(3).binomial_stores(20), Mixed(3).binomial_stores(4)
            ((0, 10, 16), (0,))
        """
        n = check_steps(n_steps)
        stores: list[int] = []
        a, level = 0, 0
        while n - a >= 2:
            stores.append(a)
            j = self.split(n - a, level)
            if j == 0:
                break
            a, level = a + j, level + 1
        return tuple(stores)

    def actions(self, n_steps: int) -> Iterator[Action]:
        """The tree of the class docstring, depth first, right part first; one generator frame
        with an explicit stack of at most ``S`` pending left parts."""
        n_steps = check_steps(n_steps)
        if n_steps:
            yield from self._tree(n_steps, 0, False)
        yield End()

    def reverse_stored(self, n_steps: int, level: int = 0) -> Iterator[Action]:
        """Reverse steps ``0 .. n_steps - 1`` from ``u_0`` held in slot ``level`` (not at hand)
        by the tree at ``level`` (``level`` states held below it, in slots ``0 .. level - 1``,
        untouched): ``Restore`` ``u_0``, the tree, whose leftmost leaf ``Free`` s slot
        ``level``; states in slots ``level ..``, data in slots ``state_slots ..``; no ``End``.
        Evaluations: ``n_steps`` plus the tree's advances at ``level``, those of
        ``Mixed(snapshots - level, data_size)`` at level 0 (its leaf sizes are this tree's from
        ``level`` on). The segments between ``Online(s, data_size=...)``'s snapshots are
        reversed by it.

        Example:
            >>> from retrograde.schedules import Mixed
            >>> [type(a).__name__ for a in Mixed(3).reverse_stored(2, level=1)]
            ['Restore', 'Free', 'Linearize', 'Record', 'Reverse', 'Free']
        """
        n = check_steps(n_steps)
        if n:
            self.leaf_size(level)  # checks the level
            yield from self._tree(n, level, True)

    def _tree(self, n_steps: int, level: int, stored: bool) -> Iterator[Action]:
        """The tree reversing ``n_steps >= 1`` steps at ``level``, from ``u_0`` at hand or
        (``stored``) in slot ``level``."""
        if not self._banded:
            self._table_for(n_steps)  # the table once, and its limit before any action
        first_data = self.state_slots
        # A task: (start, n, level, stored): reverse steps start .. start + n - 1 with u_start at
        # hand (after a Restore when stored, in which case u_start is in slot `level`).
        stack: list[tuple[int, int, int, bool]] = []
        task: tuple[int, int, int, bool] | None = (0, n_steps, level, stored)
        while task is not None:
            start, n, level, stored = task
            if stored:
                yield Restore(start, level)
            while True:
                j = self.split(n, level)
                if j == 0:
                    break
                if not stored:
                    yield Store(start, level)
                yield Advance(start, start + j)
                stack.append((start, j, level, True))
                start, n, level, stored = start + j, n - j, level + 1, False
            if stored:
                yield Free(start, level)
            for i in range(n - 1):
                yield Linearize(start + i, first_data + i)
            yield Record(start + n - 1)
            for i in range(n - 2, -1, -1):
                yield Reverse(start + i, first_data + i)
                yield Free(start + i, first_data + i)
            task = stack.pop() if stack else None
