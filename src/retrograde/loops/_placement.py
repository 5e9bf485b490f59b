"""The ``Online`` forward placement rule in ``jax.numpy``, for loops of unknown length.

A line-by-line twin of :func:`retrograde.schedules.online_store_slot` (tested to make the same
decisions): with ``u_n`` at hand and ``held[k]`` the step held in slot ``k`` (``-1`` empty), return
the slot to overwrite with ``u_n``, or ``-1``. Integer arithmetic in int32; costs saturate at
``2**30`` (only reached for segments far longer than a run with that many slots would make).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._machine import _beta_table, _next_beta, _table_depth, repetition

i32 = jnp.int32
COST_CAP = 1 << 30


def optimum(n, s):
    """``t(n, s)``, the Revolve optimum, elementwise for int32 arrays of the same shape
    (saturating).

    When ``s`` is concrete (a NumPy array, as in the placement rule), ``r(n, s)`` is counted off
    a trace-time table of ``beta(s, r)`` for ``r`` up to ``_table_depth(max(s))``: a comparison
    per table entry, no loop and no division. Only if some element needs a larger ``r`` does the
    loop run (over 20000 steps, the placement rule's segments need ``r <= 16`` with 8 slots,
    ``r <= 6`` with 16 or more, and ``r <= 42`` with 4). With ``s`` traced: one loop over the
    repetition number, shared by all elements (as many iterations as the largest ``r(n, s)``,
    each an integer division per element); ``s == 1`` and ``n <= 1`` take no iterations.
    """
    n = jnp.asarray(n, i32)
    if isinstance(s, jax.core.Tracer):
        return _optimum_loop(n, jnp.asarray(s, i32))
    quick, fits = _optimum_table(n, np.asarray(s, np.int64))
    return lax.cond(jnp.all(fits), lambda: quick, lambda: _optimum_loop(n, jnp.asarray(s, i32)))


def _optimum_table(n, s_np):
    """``(t(n, s), fits)`` from the table, for static ``s``; ``t`` is exact where ``fits``."""
    s_max = int(s_np.max(initial=0))
    r_max = _table_depth(s_max)
    # Laid out [r, element], so that the sums over r run along the major axis.
    beta = _beta_table(s_max, r_max)[s_np]
    chosen = _choose(beta, s_np[..., None], np.arange(r_max + 1))  # as the loop computes it
    step = np.diff(chosen, axis=-1, append=chosen[..., -1:])  # chosen[r + 1] - chosen[r]
    beta, step = (jnp.asarray(np.moveaxis(t, -1, 0).astype(np.int32)) for t in (beta, step))
    s = jnp.asarray(s_np, i32)
    # beta(s, r) < n exactly for r < r(n, s): so r(n, s) counts those entries, and
    # C(s + r, s + 1) is the sum of the steps of ``chosen`` below r(n, s) (chosen[0] = 0).
    below = beta < n
    r = jnp.sum(below, axis=0, dtype=i32)
    c = jnp.sum(jnp.where(below, step, 0), axis=0, dtype=i32)
    return _finish(n, s, r, c), (s == 1) | (n <= 1) | (r <= r_max)


def _optimum_loop(n, s):
    easy = (s == 1) | (n <= 1)
    goal = jnp.where(easy, 1, n)

    def cond(st):
        _, b = st
        return jnp.any(b < goal)

    def body(st):
        r, b = st
        go = b < goal
        r = r + go.astype(i32)
        return r, jnp.where(go, _next_beta(b, s, jnp.maximum(r, 1)), b)

    # r(n, s) and beta(s, r) as in ``repetition``, for every element at once.
    r, b = lax.while_loop(cond, body, (jnp.zeros_like(n), jnp.ones_like(n)))
    return _finish(n, s, r, _choose(b, s, r))


def _choose(b, s, r):
    """``C(s + r, s + 1) = beta(s, r) r / (s + 1)`` from ``b = beta(s, r)``, without overflow
    (NumPy or JAX integer arrays)."""
    return (b // (s + 1)) * r + ((b % (s + 1)) * r) // (s + 1)


def _finish(n, s, r, c):
    """``t(n, s)`` from ``r = r(n, s)`` and ``c = C(s + r, s + 1)`` (read only where ``s > 1``
    and ``n > 1``; the other cases have closed forms here)."""
    general = jnp.minimum(r * n - c, COST_CAP)
    # n (n - 1) / 2 with the even factor halved first (no int32 overflow below the cap).
    half = jnp.where(n % 2 == 0, (n // 2) * (n - 1), n * ((n - 1) // 2))
    one = jnp.where(n > 46341, COST_CAP, jnp.minimum(half, COST_CAP))
    return jnp.where(n <= 1, 0, jnp.where(s == 1, one, general)).astype(i32)


def targets(n, s: int):
    """``online_targets(n, s)`` as int32[s]."""
    r, b = repetition(n + 1, i32(s))

    def body(i, st):
        out, c = st
        out = out.at[i].set(b - c)
        c = (c // (s - i + r)) * (s - i) + ((c % (s - i + r)) * (s - i)) // (s - i + r)
        return out, c

    out, _ = lax.fori_loop(0, s, body, (jnp.zeros((s,), i32), b))
    return out


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
        b_suffix = jnp.concatenate([jnp.cumsum(b[::-1])[::-1], jnp.zeros((1,), i32)])
        a_cum = jnp.concatenate([jnp.zeros((1,), i32), jnp.cumsum(a)])
        prefix = a_cum[j - 1]
        cost = prefix + merged + b_suffix[j + 1]
        protected = jnp.any(tg[:, None] == h[j][None, :], axis=0)  # reduced along the major axis
        cost = jnp.where(protected, jnp.iinfo(jnp.int32).max, cost)
        best_j = jnp.argmin(cost)
        best = cost[best_j]
        any_candidate = ~jnp.all(protected)
        n_is_target = jnp.any(tg == n)
        keep = a_cum[s - 1] + last
        ok = any_candidate & (n_is_target | (best < keep))
        # The slot holding the dropped step h[best_j + 1] (a sort, not an argsort: much cheaper).
        return jnp.where(ok, jnp.argmax(held == h[best_j + 1]).astype(i32), i32(-1))

    return lax.cond(jnp.any(empty), lambda _: first_empty, full, None)
