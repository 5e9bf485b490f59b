"""The ``Online`` forward placement rule in ``jax.numpy``, for loops of unknown length.

A line-by-line twin of :func:`retrograde.schedules.online_store_slot` (tested to make the same
decisions): with ``u_n`` at hand and ``held[k]`` the step held in slot ``k`` (``-1`` empty), return
the slot to overwrite with ``u_n``, or ``-1``. Integer arithmetic in int32; costs saturate at
``2**30`` (only reached for segments far longer than a run with that many slots would make).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ._machine import repetition

i32 = jnp.int32
COST_CAP = 1 << 30


def optimum(n, s):
    """``t(n, s)``, the Revolve optimum, for int32 scalars (saturating)."""
    n = n.astype(i32)
    s = s.astype(i32)

    def general(_):
        # Under vmap the conds below become selects and this branch also runs for s == 1 (and
        # n <= 1), where repetition(n, 1) would loop n times for a value that is discarded.
        r, b = repetition(jnp.where((s == 1) | (n <= 1), 1, n), s)
        # C(s + r, s + 1) = beta(s, r) * r / (s + 1), computed without overflow.
        c = (b // (s + 1)) * r + ((b % (s + 1)) * r) // (s + 1)
        return jnp.minimum(r * n - c, COST_CAP)

    def one(_):
        big = n > 46340
        return jnp.where(big, COST_CAP, (n * (n - 1)) // 2)

    return lax.cond(n <= 1, lambda _: i32(0), lambda _: lax.cond(s == 1, one, general, None), None)


_optimum_v = jax.vmap(optimum)


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
        order = jnp.argsort(held).astype(i32)
        h = held[order]
        h_ext = jnp.concatenate([h, n[None]])
        tg = targets(n, s)
        idx = jnp.arange(s, dtype=i32)
        lengths = h_ext[1:] - h_ext[:-1]  # segment i = [h[i], h[i+1]), i = 0..s-1
        a = _optimum_v(lengths, s - idx)
        b = _optimum_v(lengths, s - idx + 1)  # one slot more
        b = jnp.where(idx >= 1, b, 0)
        # b_suffix[i] = sum_{k >= i} b[k]; prefix[j] = sum(a[:j-1]).
        b_suffix = jnp.concatenate([jnp.cumsum(b[::-1])[::-1], jnp.zeros((1,), i32)])
        a_cum = jnp.concatenate([jnp.zeros((1,), i32), jnp.cumsum(a)])
        j = jnp.arange(1, s, dtype=i32)
        prefix = a_cum[j - 1]
        merged = _optimum_v(h_ext[j + 1] - h_ext[j - 1], s - j + 1)
        cost = prefix + merged + b_suffix[j + 1]
        protected = jnp.any(h[j][:, None] == tg[None, :], axis=1)
        cost = jnp.where(protected, jnp.iinfo(jnp.int32).max, cost)
        best_j = jnp.argmin(cost)
        best = cost[best_j]
        any_candidate = ~jnp.all(protected)
        n_is_target = jnp.any(tg == n)
        keep = a_cum[s - 1] + optimum(n + 1 - h[s - 1], i32(1))
        ok = any_candidate & (n_is_target | (best < keep))
        return jnp.where(ok, order[best_j + 1], i32(-1))

    return lax.cond(jnp.any(empty), lambda _: first_empty, full, None)
