"""Test-owned mixed schedules (``Linearize``/``Reverse``) for the compiled loops.

Neither is optimal; both are proven valid by the simulator in the tests.

- :class:`DataLeaves`: Revolve's largest splits, and every segment of at most ``leaf`` steps
  reversed from data (``leaf - 1`` data slots after the ``snapshots`` state slots; with
  ``record_last=False`` the leaf's last step is linearized and reversed too, ``leaf`` data
  slots). A segment left with one state slot is reversed in runs of ``leaf`` steps. Its stream
  runs through the row tables (it has no ``binomial_stores``), its first sweep ending with a run
  of linearized steps.
- :class:`BinomialData`: the same splits and leaves as a :class:`retrograde.loops._machine.Rule`
  (:func:`data_rule`): its forward sweep is ``binomial_stores(N)`` and its reversal the
  machine's, in the graph or read off a table; its ``actions(N)`` are the Python twin's rows
  expanded (``tests/loops/test_machine.py::expand``).
- :class:`DataOnline`: ``Online``'s placement, with a rule making the segments of at most
  ``leaf`` steps between its snapshots ``DATA`` leaves (``while_loop``), in data rows of their
  own (its rule does not pool them; the public ``Online(s, data_size=d)`` does:
  ``tests/loops/test_mixed_while.py``).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from retrograde.loops import _binomial, _tables
from retrograde.loops import _machine as M
from retrograde.schedules import (
    Advance,
    End,
    Free,
    Level,
    Linearize,
    OfflineSchedule,
    Online,
    Record,
    Restore,
    Reverse,
    Store,
    largest_split,
)

from .test_machine import expand


@dataclasses.dataclass(frozen=True)
class DataLeaves(OfflineSchedule):
    snapshots: int
    leaf: int
    record_last: bool = True

    @property
    def levels(self):
        return (Level(self.snapshots + self.leaf - int(self.record_last)),)

    def actions(self, n_steps):
        if n_steps:
            free = list(range(self.snapshots - 1, -1, -1))
            yield from self._reverse(0, n_steps, None, free, True)
        yield End()

    def _leaf(self, a, b):
        """Reverse ``[a, b)`` from data, ``u_a`` at hand."""
        s = self.snapshots
        last = b - 1 if self.record_last else b
        for n in range(a, last):
            yield Linearize(n, s + n - a)
        if self.record_last:
            yield Record(b - 1)
        for n in reversed(range(a, last)):
            yield Reverse(n, s + n - a)
            yield Free(n, s + n - a)

    def _reverse(self, a, b, slot_a, free, at_hand):
        """Reverse ``[a, b)``: ``u_a`` at hand if ``at_hand``, in ``slot_a`` unless ``None``."""
        n, k = b - a, self.leaf
        if n <= k:
            if not at_hand:
                yield Restore(a, slot_a)
            yield from self._leaf(a, b)
            return
        own = slot_a is None
        if own:
            slot_a = free.pop()
            yield Store(a, slot_a)
        if not free:  # one slot: runs of `leaf` steps, last first, each advanced to from u_a
            c, hand = b, at_hand
            while c > a:
                d = max(a, c - k)
                if not hand:
                    yield Restore(a, slot_a)
                if d > a:
                    yield Advance(a, d)
                yield from self._leaf(d, c)
                c, hand = d, False
        else:
            s = len(free) + 1
            m = a + largest_split(n, s) if n > s + 1 else b - k
            if not at_hand:
                yield Restore(a, slot_a)
            yield Advance(a, m)
            if b - m <= k:  # reversed from data at once: u_m is not stored
                yield from self._reverse(m, b, None, free, True)
            else:
                new = free.pop()
                yield Store(m, new)
                yield from self._reverse(m, b, new, free, True)
                yield Free(m, new)
                free.append(new)
            yield from self._reverse(a, m, slot_a, free, False)
        if own:
            yield Free(a, slot_a)
            free.append(slot_a)


@dataclasses.dataclass(frozen=True)
class BinomialData(OfflineSchedule):
    snapshots: int
    leaf: int

    def kind(self, n, s):
        """The rule's leaves (Python): ``DATA`` up to ``leaf`` steps, else Revolve's."""
        return M.DATA if n <= self.leaf else (M.LEAF if n <= s + 1 else -1)

    @property
    def levels(self):
        return (Level(self.snapshots + self.leaf - 1),)

    def binomial_stores(self, n_steps):
        stores: list[int] = []
        a, s = 0, self.snapshots
        while n_steps - a >= 2:
            n, kind = n_steps - a, self.kind(n_steps - a, s)
            stores.append(a)
            if kind == M.DATA or s == 1:
                break
            if kind == M.LEAF:  # every state stored: the trailing leaf
                stores.extend(range(a + 1, n_steps - 1))
                break
            a, s = a + largest_split(n, s), s - 1
        return tuple(stores)

    def actions(self, n_steps):
        yield from twin_actions(_tables.tables_for(self, n_steps))


def data_rule(schedule: BinomialData) -> M.Rule:
    k = schedule.leaf
    return M.Rule(
        leaf=lambda n, s, s_max: jnp.where(n <= k, M.DATA, jnp.where(n <= s + 1, M.LEAF, -1)),
        split=_binomial.largest_split,
        py_leaf=lambda n, s, s_max: schedule.kind(n, s),
        py_split=lambda n, s, s_max: largest_split(n, s),
        state_slots=lambda slots: slots - (k - 1),
        data_rows=lambda n_slots: k - 1,
    )


_tables.register_rule(BinomialData, data_rule)


def leaf_slots(tables, r):
    """The slots of row ``r``'s leaf (as ``_sources.RowSource.leaf_slots``, in Python)."""
    width = tables.n_slots + 1
    if tables.leaves is None:
        return [0] * width
    own, f = (int(v) for v in tables.leaves[min(r, len(tables.leaves) - 1)])
    order = [int(v) for v in tables.free_order]

    def at(i):
        return order[min(max(i, 0), len(order) - 1)]

    return [f + i if own < 0 else own if i == 0 else at(f - i) for i in range(width)]


def twin_actions(tables):
    """The forward sweep of ``tables`` and the machine's reversal (its Python twin's rows) as
    schedule actions."""
    n = tables.length
    if n < 2:
        return [Record(0), End()] if n else [End()]
    forward, at, held = [], 0, {}
    for p, k in zip(tables.store_steps.tolist(), tables.store_slots.tolist()):
        if p > at:
            forward.append(Advance(at, p))
        forward.append(Store(p, k, 0))
        at, held[k] = p, p
    if at < n - 1:
        forward.append(Advance(at, n - 1))
    rows = tables.rows.tolist() + [[M.DONE, -1, 0, 0, 0, -1, 0]]
    idxs = [leaf_slots(tables, r) for r in range(len(rows))]
    return forward + expand(rows, idxs, held, data=tables.n_slots)


@dataclasses.dataclass(frozen=True)
class DataOnline(Online):
    """``Online(snapshots)``'s placement; ``while_loop`` reverses the segments between its
    snapshots by :func:`online_data_rule`: those of at most ``leaf`` steps from data."""

    leaf: int = 3


def online_data_rule(schedule: DataOnline) -> M.Rule:
    k = schedule.leaf
    return M.Rule(
        leaf=lambda n, s, s_max: jnp.where(n <= k, M.DATA, jnp.where(n <= s + 1, M.LEAF, -1)),
        split=_binomial.largest_split,
        py_leaf=lambda n, s, s_max: M.DATA if n <= k else (M.LEAF if n <= s + 1 else -1),
        py_split=lambda n, s, s_max: largest_split(n, s),
        state_slots=lambda slots: slots,
        data_rows=lambda n_slots: k - 1,
    )


_tables.register_rule(DataOnline, online_data_rule)
