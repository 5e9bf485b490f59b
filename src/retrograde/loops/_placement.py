"""The ``Online`` forward placement rule in ``jax.numpy``, for loops of unknown length.

:func:`store_slot` is a line-by-line twin of :func:`retrograde.schedules.online_store_slot`
(tested to make the same decisions): with ``u_n`` at hand and ``held[k]`` the step held in
slot ``k`` (``-1`` empty), return the slot to overwrite with ``u_n``, or ``-1``. Integer
arithmetic in int32; costs saturate at ``2**30`` (only reached for segments far longer than a
run with that many slots would make).

:func:`online_phases` applies it in a compiled loop: the first :data:`DECISIONS` decisions are
read off a table computed once in Python (the rule reads only step numbers), later steps
evaluate :func:`store_slot`. :func:`place_thinned` places by ``Online(s, slow=...)``'s thinning
rule instead.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..schedules import online_decisions
from ._binomial import optimum, targets
from ._offload import thinning_slot
from ._slots import put_row_if, store

i32 = jnp.int32


def store_slot(n, held, s: int):
    """The slot for ``u_n`` (int32), or ``-1``. ``held``: int32[s]; ``s`` static."""
    n = jnp.asarray(n, i32)
    empty = held < 0
    first_empty = jnp.argmax(empty).astype(i32)
    if s == 1:
        return jnp.where(empty[0], i32(0), i32(-1))

    def full(_):
        h = jnp.sort(held)  # the held steps in order (distinct once every slot is full)
        h_ext = jnp.concatenate([h, n[None]])
        tg = targets(n, s)
        idx = jnp.arange(s, dtype=i32)
        j = jnp.arange(1, s, dtype=i32)
        lengths = h_ext[1:] - h_ext[:-1]  # segment i = [h[i], h[i+1]), i = 0..s-1
        # Every optimum the rule compares, in one evaluation: each segment with its own slots
        # (a) and with one more (b), each pair of segments merged (dropping h[j]), and the last
        # segment extended by u_n with one slot (keeping every snapshot).
        spans = [lengths, lengths, h_ext[j + 1] - h_ext[j - 1], (n + 1 - h[s - 1])[None]]
        # Slot counts are static: optimum reads r(n, s) off a trace-time table.
        idx_np, j_np = np.arange(s), np.arange(1, s)
        slots = [s - idx_np, s - idx_np + 1, s - j_np + 1, np.ones(1, np.int64)]
        costs = optimum(jnp.concatenate(spans), np.concatenate(slots))
        a, b, merged, last = costs[:s], costs[s : 2 * s], costs[2 * s : 3 * s - 1], costs[-1]
        b = jnp.where(idx >= 1, b, 0)
        # b_suffix[i] = sum_{k >= i} b[k]; prefix[j] = sum(a[:j-1]).
        b_suffix = jnp.concatenate([jnp.cumsum(b[::-1], dtype=i32)[::-1], jnp.zeros((1,), i32)])
        a_cum = jnp.concatenate([jnp.zeros((1,), i32), jnp.cumsum(a, dtype=i32)])
        prefix = a_cum[j - 1]
        cost = prefix + merged + b_suffix[j + 1]
        protected = jnp.any(tg[:, None] == h[j][None, :], axis=0)  # reduced along the major axis
        cost = jnp.where(protected, jnp.iinfo(jnp.int32).max, cost)
        best_j = jnp.argmin(cost).astype(i32)
        best = cost[best_j]
        any_candidate = ~jnp.all(protected)
        n_is_target = jnp.any(tg == n)
        keep = a_cum[s - 1] + last
        ok = any_candidate & (n_is_target | (best < keep))
        # The slot holding the dropped step h[best_j + 1] (a sort, not an argsort: much cheaper).
        return jnp.where(ok, jnp.argmax(held == h[best_j + 1]).astype(i32), i32(-1))

    return lax.cond(jnp.any(empty), lambda _: first_empty, full, None)


# The Online rule's decisions are read off a table for this many steps (at most), computed once
# in Python; beyond it the loop evaluates the rule itself.
DECISIONS = 1 << 13


def _decisions(n_slots: int, max_steps):
    """The placement table for the first ``min(max_steps, DECISIONS)`` steps (int32)."""
    n = DECISIONS if max_steps is None else min(max_steps, DECISIONS)
    return jnp.asarray(np.asarray(online_decisions(n_slots, max(n, 1)), np.int32))


def online_phases(n_slots: int, max_steps):
    """Where the ``Online`` rule stores ``u_n``, as phases ``[(place, stop), ...]``: the steps
    ``n < stop`` (``None``: all the rest) take ``place(n, snap, slots, held)``. The first
    ``m`` decisions are read off a table; steps beyond it (only in a loop that may run that
    long) evaluate the rule. Each phase runs as its own loop, so a step of the first tests
    nothing but its table entry."""
    table = _decisions(n_slots, max_steps)
    m = table.shape[0]

    def from_table(n, snap, slots, held):
        return store_at(n, lambda: table[jnp.minimum(n, m - 1)], snap, slots, held)

    def by_rule(n, snap, slots, held):
        return store_at(n, store_slot(n, held, n_slots), snap, slots, held)

    if max_steps is None or max_steps > m:
        return [(from_table, m), (by_rule, None)]
    return [(from_table, None)]


def store_at(n, k, snap, slots, held, off=None):
    """``u_n`` in slot ``k`` (nothing if ``k < 0``) and ``n`` in ``held[k]``; with ``off``, in its
    store. ``k`` may be a function computing the slot (see :func:`._slots.put_row_if`)."""
    if off is not None:
        held = jnp.where(k >= 0, held.at[jnp.maximum(k, 0)].set(n), held)
        return store(slots, k, snap, off, n), held
    row = k() if callable(k) else k
    *slots, held = put_row_if(row >= 0, [*slots, held], [*snap, n], k)
    return slots, held


def place_thinned(n, snap, slots, held, off):
    """Store ``u_n`` where ``Online(s, slow=...)``'s thinning rule puts it, in ``off``'s store."""
    return store_at(n, thinning_slot(n, held), snap, slots, held, off)
