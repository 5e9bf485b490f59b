"""Online checkpointing: ``Online(snapshots)`` for loops whose step count is unknown in advance.

The forward sweep cannot know ``N``, so it keeps a set of at most ``s`` snapshots that is good for
*every* ``N`` at once, dropping and replacing snapshots as the loop runs; once the loop stops the
reversal knows ``N`` and reverses each segment between held snapshots optimally (Revolve).

The forward placement rule (:func:`online_store_slot`) is a pure function of the step number, the
slot count and the step numbers held in the slots, in integer arithmetic, so that it can be
re-expressed in ``jax.numpy`` for a ``lax.while_loop``. It combines two ideas:

* Targets (Griewank's binomial structure; cf. Stumm & Walther, SISC 32(2) 2010, and Wang, Moin &
  Iaccarino, SISC 31(4) 2009, for online schedules built on it): while ``N`` lies in the epoch
  ``beta(s, r-1) < N <= beta(s, r)``, the unique optimal offline snapshot set at the epoch's end
  ``N = beta(s, r)`` is ``E_r = {beta(s, r) - beta(s - i, r) : i = 0 .. s-1}``. Every member of
  ``E_r`` lies inside the epoch, so the forward sweep stores each of them when it passes it and
  never drops one while the epoch lasts: at ``N = beta(s, r)`` the held set is optimal.
* Greedy repair: at any other step, the state at hand replaces the unprotected snapshot whose
  removal gives the cheapest reversal for ``N = n + 1`` (the reversal cost of a held set is
  ``sum_i t(L_i, s - i)`` over its segments ``L_i``, with ``t`` the Revolve optimum), and only if
  that beats keeping the held set as it is.

Measured against the offline optimum (``benchmarks/schedules.py``; figures in
``docs/choosing-a-schedule.md``): at ``N = beta(s, r)`` the held set is the optimal offline one, so
the total exceeds ``t(N, s) + N`` by the ``r + 1`` evaluations of its last segment. No online
schedule can be close for tiny ``N``: the loop takes its last step before it knows it is the last
and must then restore ``u_{N-1}``.

The reversal keeps every held snapshot (dropping one rarely helps, and then very little).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Sequence
from fractions import Fraction

from ._actions import Action, End, Free, Restore, Store, relabel
from ._base import (
    Level,
    MemorySlots,
    OnlineRun,
    OnlineSchedule,
    check_snapshots,
    check_steps,
    exact_size,
)
from ._mixed import Mixed
from ._optimum import optimum, repetition
from ._revolve import reverse_held

__all__ = [
    "Online",
    "online_decisions",
    "online_store_slot",
    "online_targets",
    "online_totals",
    "reverse_held_mixed",
    "reverse_segments",
    "segment_cost",
    "thinning_slot",
    "thinning_spacing",
]


def online_targets(n: int, snapshots: int) -> tuple[int, ...]:
    """The protected step numbers while ``u_n`` is at hand (``N = n + 1`` steps so far).

    With ``r`` the repetition number of ``n + 1`` steps and ``B = beta(s, r)``, returns
    ``(B - beta(s - i, r) for i = 0 .. s-1)``, increasing, starting with ``0``: the unique optimal
    offline snapshot set for ``B`` steps. Costs ``O(s + r)`` integer operations.

    Example:
        >>> online_targets(40, 4)   # 35 < 41 <= 70 = beta(4, 4)
        (0, 35, 55, 65)
    """
    s = snapshots
    r, b = repetition(n + 1, s)
    out = []
    c = b  # beta(s - i, r), from i = 0
    for i in range(s):
        out.append(b - c)
        # beta(s - i - 1, r) = beta(s - i, r) * (s - i) / (s - i + r)
        c = c * (s - i) // (s - i + r)
    return tuple(out)


def segment_cost(held: Sequence[int], n_steps: int, snapshots: int) -> int:
    """Plain evaluations to reverse ``n_steps`` steps from the held snapshots, ``u_N`` at hand.

    ``held`` are the step numbers held (any order; ``-1`` marks an empty slot; ``0`` must be
    held). The segments between consecutive held steps ``h_0 < h_1 < ... < h_{k-1} < N`` are
    reversed last to first, segment ``i`` with ``s - i`` slots (its own and the free ones), at the
    Revolve optimum: ``sum_i t(h_{i+1} - h_i, s - i)`` with ``h_k = N``. The forward sweep's ``N``
    plain evaluations and the ``N`` recorded ones are not included.

    Example:
        >>> segment_cost([0, 35, 55, 65], 70, 4)   # t(35, 4) + t(20, 3) + t(10, 2) + t(5, 1)
        159
    """
    h = sorted(p for p in held if p >= 0)
    h.append(n_steps)
    return sum(optimum(h[i + 1] - h[i], snapshots - i) for i in range(len(h) - 1))


def online_store_slot(n: int, held: Sequence[int], snapshots: int) -> int:
    """The forward placement rule of :class:`Online`: where to store ``u_n``, or ``-1``.

    Args:
        n: the step number of the state at hand (``u_n``), before step ``n`` is taken.
        held: length ``snapshots``; ``held[k]`` is the step number in slot ``k``, ``-1`` if empty.
            As produced by this rule from all-empty slots: distinct steps below ``n``, ``u_0`` in
            slot 0 once ``n >= 1`` (not checked, for speed).
        snapshots: the slot count ``s >= 1``.

    Returns:
        The slot into which ``u_n`` goes (its previous content, if any, is dropped first), or
        ``-1`` to store nothing. Rule, with ``N = n + 1``:

        1. an empty slot, the lowest, if there is one;
        2. else, if ``s >= 2``: among the slots not holding ``0`` or a member of
           :func:`online_targets` ``(n, s)``, the one whose replacement by ``n`` minimises
           :func:`segment_cost` for ``N`` steps (ties: the earliest step); it is returned if
           ``n`` is itself a target or if that cost is below the cost of storing nothing;
        3. else ``-1``.

    Pure and deterministic; integer arithmetic only; ``O(s log s)`` comparisons plus ``O(s)``
    evaluations of ``t`` (each ``O(r)``), independent of ``N`` otherwise. In ``jax.numpy``: sort
    the held steps (``argsort``), evaluate the ``s - 1`` candidate costs as vectors, mask the
    targets, take the ``argmin``.

    Example:
        >>> held = [-1] * 4
        >>> for n in range(6):
        ...     k = online_store_slot(n, held, 4)
        ...     if k >= 0:
        ...         held[k] = n
        >>> held
        [0, 5, 2, 3]
    """
    s = snapshots
    for k in range(s):
        if held[k] < 0:
            return k
    if s == 1:
        return -1
    order = sorted(range(s), key=held.__getitem__)
    h = [held[k] for k in order]  # h[0] == 0 < h[1] < ... < h[s-1] < n
    h.append(n)
    targets = online_targets(n, s)
    # a[i], b[i]: cost of segment i = [h[i], h[i+1]) at its own index, and one index earlier.
    a = [optimum(h[i + 1] - h[i], s - i) for i in range(s)]
    b_suffix = [0] * (s + 1)
    for i in range(s - 1, 0, -1):
        b_suffix[i] = b_suffix[i + 1] + optimum(h[i + 1] - h[i], s - i + 1)
    prefix = 0  # sum(a[:j-1])
    best, best_j = -1, -1
    for j in range(1, s):
        if j >= 2:
            prefix += a[j - 2]
        if h[j] in targets:
            continue
        # drop h[j]: segments j-1 and j merge (s - j + 1 slots); later ones gain a slot; [n, N)
        # costs nothing.
        cost = prefix + optimum(h[j + 1] - h[j - 1], s - j + 1) + b_suffix[j + 1]
        if best_j < 0 or cost < best:
            best, best_j = cost, j
    if best_j < 0:
        return -1
    if n not in targets:
        keep = sum(a[: s - 1]) + optimum(n + 1 - h[s - 1], 1)
        if best >= keep:
            return -1
    return order[best_j]


class _Placement:
    """The rule of :func:`online_store_slot`, incrementally: the held steps are kept sorted and
    the candidate costs that do not depend on ``n`` are cached until the held set or the epoch
    changes, so a step without a store costs ``O(1)`` evaluations of ``t`` (a store, ``O(s)``).
    Makes exactly the decisions of :func:`online_store_slot` (tested)."""

    def __init__(self, snapshots: int):
        self.s = snapshots
        self.h: list[int] = []  # held steps, increasing
        self.slot: list[int] = []  # slot of each held step
        self.held = [-1] * snapshots  # step held in each slot
        self.epoch_end = 0
        self.targets: frozenset[int] = frozenset()
        self.fresh = False  # the cached costs below match self.h
        self.picked = False  # self.j_min matches self.h and self.targets

    def _refresh(self) -> None:
        s, h = self.s, self.h
        a = [optimum(h[i + 1] - h[i], s - i) for i in range(s - 1)]
        self.head = sum(a)  # segments but the last, at their own index
        self.head_but_one = self.head - a[s - 2] if s >= 2 else 0
        # C[j] (1 <= j <= s-2): cost of dropping h[j], without the last segment's t(n - h[-1], 2)
        tail = 0  # sum of t(h[i+1] - h[i], s - i + 1) for i = j+1 .. s-2
        prefix = self.head_but_one  # sum(a[: j - 1]) for j = s - 2, walking down
        c = [0] * (s - 1)
        for j in range(s - 2, 0, -1):
            prefix -= a[j - 1]
            c[j] = prefix + optimum(h[j + 1] - h[j - 1], s - j + 1) + tail
            tail += optimum(h[j + 1] - h[j], s - j + 1)
        self.c = c
        self.fresh = True
        self.picked = False

    def decide(self, n: int) -> tuple[int, int] | None:
        """``(slot, dropped step or -1)`` where ``u_n`` goes, or ``None``."""
        s, h = self.s, self.h
        if len(h) < s:
            k = len(h)  # slots fill in order and are not emptied while the loop runs
            self._store(k, len(h), n)
            return k, -1
        if s == 1:
            return None
        if n + 1 > self.epoch_end:
            self.epoch_end = repetition(n + 1, s)[1]
            self.targets = frozenset(online_targets(n, s))
            self.picked = False
        if not self.fresh:
            self._refresh()
        targets = self.targets
        if not self.picked:
            self.j_min, self.c_min = -1, 0
            for j in range(1, s - 1):
                if h[j] not in targets and (self.j_min < 0 or self.c[j] < self.c_min):
                    self.j_min, self.c_min = j, self.c[j]
            self.picked = True
        best_j, best = self.j_min, self.c_min + optimum(n - h[s - 1], 2)
        if h[s - 1] not in targets:
            cost = self.head_but_one + optimum(n - h[s - 2], 2)
            if best_j < 0 or cost < best:
                best_j, best = s - 1, cost
        if best_j < 0:
            return None
        if n not in targets and best >= self.head + optimum(n + 1 - h[s - 1], 1):
            return None
        k, old = self.slot[best_j], h[best_j]
        del h[best_j], self.slot[best_j]
        self._store(k, len(h), n)
        return k, old

    def _store(self, k: int, at: int, n: int) -> None:
        self.h.insert(at, n)
        self.slot.insert(at, k)
        self.held[k] = n
        self.fresh = False

    def reversal_cost(self, n_steps: int) -> int:
        """:func:`segment_cost` of the held set for ``n_steps`` (at least one step taken)."""
        s, h = self.s, self.h
        if len(h) < s:
            return segment_cost(h, n_steps, s)
        if not self.fresh:
            self._refresh()
        return self.head + optimum(n_steps - h[-1], 1)


@functools.lru_cache(maxsize=32)
def online_decisions(snapshots: int, n_steps: int) -> tuple[int, ...]:
    """The slot :func:`online_store_slot` gives ``u_n`` (or ``-1``) for ``n = 0 .. n_steps - 1``.

    The rule reads only step numbers, never the loop's data, so its decisions are the same in
    every run: a compiled loop reads them off this table instead of evaluating the rule per step.
    Costs ``O(n_steps + s * stores)`` (:class:`_Placement`); cached.

    Example:
        >>> online_decisions(4, 6)   # as in online_store_slot's example
        (0, 1, 2, 3, -1, 1)
    """
    placement, out = _Placement(check_snapshots(snapshots)), []
    for n in range(check_steps(n_steps)):
        decision = placement.decide(n)
        out.append(-1 if decision is None else decision[0])
    return tuple(out)


class _OnlineRun(OnlineRun):
    level = 0  # the level the placement rule stores on

    def __init__(self, snapshots: int):
        self._placement = _Placement(snapshots)
        self._next = 0
        self._reversed = False

    def on_step(self, n: int) -> Sequence[Action]:
        if self._reversed:
            raise ValueError(f"on_step({n}) after reverse(): start a new run with start().")
        if n != self._next:
            raise ValueError(
                f"on_step(n={n}): steps must be reported in order 0, 1, 2, ...; expected "
                f"n={self._next}."
            )
        self._next += 1
        decision = self._decide(n)
        if decision is None:
            return ()
        k, old = decision
        if old < 0:
            return (Store(n, k, self.level),)
        return (Free(old, k, self.level), Store(n, k, self.level))

    def reverse(self, n_steps: int) -> Iterator[Action]:
        n_steps = check_steps(n_steps)
        if self._reversed:
            raise ValueError("reverse() was already called for this run; use start() again.")
        if n_steps != self._next:
            raise ValueError(
                f"reverse(n_steps={n_steps}): on_step was called for {self._next} steps, so "
                f"n_steps must be {self._next}."
            )
        self._reversed = True
        return self._reversal(tuple(self._placement.held), n_steps)

    def _decide(self, n):
        return self._placement.decide(n)

    def _reversal(self, held, n_steps):
        return reverse_held(held, n_steps)


def thinning_spacing(n: int, slots: int) -> int:
    """``Delta(n)``: the smallest power of two such that the multiples of it in ``0 .. n`` fit in
    ``slots`` slots (``n // Delta <= slots - 1``).

    Example:
        >>> [thinning_spacing(n, 4) for n in (0, 3, 4, 7, 8, 16)]
        [1, 1, 2, 2, 4, 8]
    """
    d = 1
    while n // d > slots - 1:
        d *= 2
    return d


def thinning_slot(n: int, held: Sequence[int], slots: int) -> int:
    """The placement rule of ``Online(s, slow=Level(h))`` on its slow level: where ``u_n`` goes,
    or ``-1``.

    ``u_n`` is stored if ``n`` is a multiple of :func:`thinning_spacing` ``(n, h)``; it goes to
    the first empty slot, else it overwrites the earliest held step that is not a multiple of
    the spacing (one always exists: fewer than ``h`` multiples lie below ``n``). So the held
    snapshots include every multiple of the spacing below ``n``: segments of at most
    ``Delta(n) <= 2 (n + 1) / h`` steps (the spacing doubles when the slots fill up: "thinning").
    ``O(h)`` comparisons per stored step, ``O(log n)`` otherwise.

    Example:
        >>> held = [-1] * 3
        >>> for n in range(7):
        ...     k = thinning_slot(n, held, 3)
        ...     if k >= 0:
        ...         held[k] = n
        >>> held
        [0, 4, 2]
    """
    d = thinning_spacing(n, slots)
    if n % d:
        return -1
    best = -1
    for k in range(slots):
        if held[k] < 0:
            return k
        if held[k] % d and (best < 0 or held[k] < held[best]):
            best = k
    return best


class _TwoLevelRun(_OnlineRun):
    """``Online(s, slow=...)``: the thinning rule places on the slow level (1); each segment is
    reversed with the ``s`` slots of level 0."""

    level = 1

    def __init__(self, snapshots: int, slow_slots: int):
        super().__init__(slow_slots)
        self._fast = snapshots
        self._held = [-1] * slow_slots

    def _decide(self, n):
        k = thinning_slot(n, self._held, len(self._held))
        if k < 0:
            return None
        old, self._held[k] = self._held[k], n
        return k, old

    def _reversal(self, held, n_steps):
        return reverse_segments(tuple(self._held), n_steps, self._fast)


def reverse_segments(held: Sequence[int], n_steps: int, fast: int) -> Iterator[Action]:
    """Reverse ``n_steps`` steps from the snapshots ``held`` on level 1 (per slot, ``-1`` empty),
    last segment first: restore the segment's start from level 1, store it in slot 0 of level 0
    and reverse the segment with Revolve and the ``fast`` slots of level 0.

    Example:
        >>> from retrograde.schedules import Level, execute
        >>> acts = list(reverse_segments([0, 3], 5, 2))
        >>> acts[:3]
        [Restore(step=3, slot=1, level=1), Store(step=3, slot=0, level=0), Restore(step=3, slot=0, level=0)]
    """  # noqa: E501 - a doctest's expected output is one line
    end = n_steps
    for start, slot in sorted(((p, k) for k, p in enumerate(held) if p >= 0), reverse=True):
        yield Restore(start, slot, 1)
        yield Store(start, 0, 0)
        for action in reverse_held((start,) + (-1,) * (fast - 1), end):
            if type(action) is not End:
                yield action
        yield Free(start, slot, 1)
        end = start
    yield End()


class _MixedRun(_OnlineRun):
    """``Online(s, data_size=d)``: ``Online``'s placement; each segment reversed by ``Mixed``'s
    tree (:func:`reverse_held_mixed`)."""

    def __init__(self, snapshots: int, tree: Mixed):
        super().__init__(snapshots)
        self._tree = tree

    def _reversal(self, held, n_steps):
        if self._tree.leaf_size(0) == 1:  # no step's data fits: Online's own reversal
            return reverse_held(held, n_steps)
        return reverse_held_mixed(held, n_steps, self._tree)


def reverse_held_mixed(held: Sequence[int], n_steps: int, tree: Mixed) -> Iterator[Action]:
    """Reverse ``n_steps`` steps from the snapshots ``held`` (per slot, ``-1`` empty), last
    segment first, segment ``i`` (``i`` snapshots held below it) by ``tree``'s reversal at level
    ``i`` (:meth:`Mixed.reverse_stored`) with its own slot and every slot not held by an earlier
    snapshot, lowest first; data in slots ``len(held), len(held) + 1, ...``. ``tree``: a
    ``Mixed`` whose state slots are ``len(held)``. Evaluations: ``sum_i (L_i + A(L_i, i))``
    over the segments' lengths ``L_i`` (``A``: the tree's advances at level ``i``), at most
    Revolve's ``sum_i (t(L_i, s - i) + L_i)`` (:func:`reverse_held`).

    Example:
        >>> from retrograde.schedules import Mixed
        >>> [type(a).__name__ for a in reverse_held_mixed([0, 3, -1], 5, Mixed(3))][:6]
        ['Restore', 'Free', 'Linearize', 'Record', 'Reverse', 'Free']
    """
    s = len(held)
    if tree.state_slots != s:
        raise ValueError(
            f"reverse_held_mixed: tree={tree!r} has {tree.state_slots} state slots, but "
            f"{s} slots are held; use Mixed({s}, data_size)."
        )
    by_step = sorted((p, k) for k, p in enumerate(held) if p >= 0)
    data = [(0, s + j) for j in range(tree.data_slots)]
    end = n_steps
    for i in range(len(by_step) - 1, -1, -1):
        start, slot = by_step[i]
        below = [k for _, k in by_step[:i]]
        free = [k for k in range(s) if k != slot and k not in below]
        slot_of = [(0, k) for k in [*below, slot, *free]] + data
        yield from relabel(tree.reverse_stored(end - start, i), start, slot_of)
        end = start
    yield End()


@dataclasses.dataclass(frozen=True, repr=False)
class Online(MemorySlots, OnlineSchedule):
    """Checkpointing for a loop whose step count is unknown until it stops, ``s`` slots.

    The forward sweep keeps at most ``snapshots`` states (``u_0``'s slot included) chosen by
    :func:`online_store_slot`; the reversal reverses the segments between them with Revolve.
    Cost: ``N`` plain evaluations forward, :func:`segment_cost` of the held set to reverse, ``N``
    recorded (against the offline optimum ``t(N, s) + N``: see the module docstring). Peak
    slots: ``min(s, N)``. Memory to generate the actions: ``O(s)``. ``on_step`` costs ``O(1)``
    evaluations of ``t`` when it stores nothing and ``O(s)`` when it stores (the held set's costs
    are cached); the decisions are exactly those of :func:`online_store_slot`.

    **Mixed reversal** (``data_size=d``, in states: what one step's adjoint data weighs, as for
    :class:`Mixed`): the same placement, and each segment between held snapshots, last first,
    is reversed by ``Mixed(snapshots, d)``'s optimal tree at its level (segment ``i`` has ``i``
    snapshots held below it and the other slots free, :func:`reverse_held_mixed`): short
    segments from their steps' data, which share the budget (at any time ``states + d * data
    <= snapshots``; the simulator checks it). Cost: ``N`` plain forward, then ``sum_i (L_i +
    A_d(L_i, i))`` over the segments' lengths ``L_i``, with ``A_d(n, i)`` the tree's advances at
    level ``i`` (``Mixed(snapshots - i, d).evaluations(n) - n``), at most ``Online``'s ``sum_i
    (t(L_i, s - i) + L_i)`` for every ``N``, and equal to it when no step's data fits (``d >
    snapshots``). ``data_size=None`` (the default): Revolve's reversal, as above.

    **Two levels** (``slow=Level(h, ...)``, e.g. host RAM or disk for a compiled loop): up to
    ``h`` snapshots are placed on the slow level (level 1) by thinning (:func:`thinning_slot`:
    the multiples of a power-of-two spacing that doubles when the slots fill up, so segments
    stay within a factor two of ``N / h``); the reversal restores each segment's start from
    there into slot 0 of level 0 and reverses the segment with Revolve and the ``snapshots``
    slots of level 0 (:func:`reverse_segments`). Cost: ``N`` plain forward, ``sum_i t(L_i,
    snapshots)`` plain to reverse (``L_i`` the segments between held snapshots) and ``N``
    recorded; on the slow level one write per placement (at most ``h (1 + log2(N / h) / 2)``)
    and one read per segment; on level 0 one write per segment plus Revolve's. How close this
    comes to the best equal split of ``N`` into ``h`` segments (the optimum of this two-level
    structure): ``docs/offload.md``.

    Args:
        snapshots: slots for snapshots, the one holding the initial state included (``>= 1``);
            with ``slow``, the level-0 slots that reverse each segment.
        slow: an optional second, slower level with a slot count, holding the placed snapshots.
        data_size: ``None``, or the size of one step's adjoint data in states (``> 0``): reverse
            the segments by mixed checkpointing (not with ``slow``).

    Example:
        >>> from retrograde.schedules import Online, simulate, revolve_optimum
        >>> stats = simulate(Online(16), 1000)
        >>> stats.peak_slots, stats.evaluations, revolve_optimum(1000, 16) + 1000
        ((16,), 3866, 3860)
        >>> two = Online(4, slow=Level(32, write_cost=1, read_cost=1, storage="host"))
        >>> simulate(two, 1000).peak_slots
        (4, 32)
        >>> simulate(Online(16, data_size=1), 1000).evaluations   # Mixed(16): 3015
        3035
    """

    slow: Level | None = None
    data_size: float | Fraction | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.slow is not None:
            if not isinstance(self.slow, Level):
                raise TypeError(f"Online(slow=...) must be a Level, got {self.slow!r}.")
            if self.slow.slots is None:
                raise ValueError(
                    "Online(slow=Level(None, ...)): the slow level needs a slot count, e.g. "
                    "Level(64, storage='host'); the online rule fills every slot it has."
                )
        if self.data_size is not None:
            exact_size(self.data_size, "Online(data_size=...)")
            if self.slow is not None:
                raise ValueError(
                    f"Online(snapshots={self.snapshots}, slow=..., data_size="
                    f"{self.data_size!r}): a mixed reversal runs on one level; drop slow= (or "
                    "data_size=)."
                )

    def __repr__(self):
        slow = "" if self.slow is None else f", slow={self.slow!r}"
        data = "" if self.data_size is None else f", data_size={self.data_size!r}"
        return f"Online(snapshots={self.snapshots}{slow}{data})"

    @property
    def mixed(self) -> Mixed | None:
        """``Mixed(snapshots, data_size)``, whose tree reverses each segment; ``None`` without
        ``data_size``."""
        if self.data_size is None:
            return None
        return Mixed(self.snapshots, self.data_size)

    @property
    def memory_budget(self) -> Fraction | None:  # type: ignore[override]
        """With ``data_size``, the budget in states (``snapshots``; data weighed as
        ``data_size``); else ``None``."""
        return None if self.data_size is None else Fraction(self.snapshots)

    @property
    def levels(self) -> tuple[Level, ...]:
        tree = self.mixed
        if tree is not None:
            return (Level(self.snapshots + tree.data_slots, name="memory"),)
        if self.slow is None:
            return super().levels
        return (Level(self.snapshots, name="device"), self.slow)

    def start(self) -> OnlineRun:
        tree = self.mixed
        if tree is not None:
            return _MixedRun(self.snapshots, tree)
        if self.slow is None:
            return _OnlineRun(self.snapshots)
        return _TwoLevelRun(self.snapshots, self.slow.slots)


def online_totals(snapshots: int, n_max: int) -> list[int]:
    """Total evaluations (plain + recorded) of ``Online(snapshots)`` for every ``N`` in
    ``0 .. n_max``, from one forward sweep: ``2 N + segment_cost(held after N steps, N)``.

    Example:
        >>> from retrograde.schedules import Online, simulate
        >>> online_totals(4, 50)[50] == simulate(Online(4), 50).evaluations
        True
    """
    placement = _Placement(snapshots)
    out = [0]
    for n in range(n_max):
        placement.decide(n)
        out.append(2 * (n + 1) + placement.reversal_cost(n + 1))
    return out
