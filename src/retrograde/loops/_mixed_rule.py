"""The band rule of mixed checkpointing, inside a compiled program (int32).

The in-graph twin of :meth:`retrograde.schedules.Mixed.leaf_size` and
:meth:`retrograde.schedules.Mixed.split` for leaf sizes with a band rule
(:func:`retrograde.schedules._mixed.band_rule_applies`: every whole ``data_size >= 1``, and
``data_size > snapshots``; ``docs/mixed.md``, "General leaf sizes"). ``leaves`` is the static
tuple ``Mixed._leaves`` (``c_0 >= ... >= c_S``, Python ints); the segment's length ``n`` and
its ``level`` are traced int32 scalars. Each call is ``O(S r)`` int32 operations (``r``, the
band of ``n``: a loop over it of ``O(S)`` vector operations, then two loops of ``S + 1``
scalar steps) on constants of ``S + 1`` entries, so nothing here grows with the step count.

Sizes saturate at :data:`._binomial.CAP` (``2**24``): the results are exact for ``n < CAP``
(the callers check the step count when tracing) and ``S <= MAX_LEVELS``.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..schedules import band_rule_applies
from ._binomial import CAP, next_beta, nonneg_divmod

i32 = jnp.int32

#: The most state slots ``S`` the int32 arithmetic here is exact for (a binomial of the pool,
#: at most ``(S + 1) * CAP``, stays below ``2**31``).
MAX_LEVELS = 126


@functools.lru_cache(maxsize=64)
def _constants(leaves: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """The leaf sizes and, per level, the first and last level of its run of equal sizes
    (int32[S + 1] each), checked once per tuple."""
    if not band_rule_applies(leaves):
        raise ValueError(
            f"loops._mixed_rule: the leaf sizes {leaves} have no band rule (a drop of more than "
            "one step from a level to the next, data_size < 1, or runs of levels of two lengths, "
            "a fractional data_size > 1); Mixed plans them by its dynamic program, which a "
            "compiled loop reads as rows."
        )
    if len(leaves) - 1 > MAX_LEVELS:
        raise ValueError(
            f"loops._mixed_rule: {len(leaves) - 1} state slots, over MAX_LEVELS = {MAX_LEVELS} "
            "for int32 arithmetic; use a budget of fewer states."
        )
    top = len(leaves) - 1
    first, last = np.zeros(top + 1, np.int32), np.zeros(top + 1, np.int32)
    for a in range(top + 1):
        first[a] = a if a == 0 or leaves[a - 1] != leaves[a] else first[a - 1]
    for a in range(top, -1, -1):
        last[a] = a if a == top or leaves[a + 1] != leaves[a] else last[a + 1]
    return np.asarray(leaves, np.int32), first, last


def leaf_size(leaves: tuple[int, ...], level):
    """``c_level``: the most steps a leaf at ``level`` reverses from data (int32)."""
    return jnp.asarray(_constants(leaves)[0])[level]


def _sat_add(a, b):
    return jnp.minimum(a + b, CAP)


def _sat_mul(a, b):
    """``min(a * b, CAP)`` for ``0 <= a, b <= CAP``."""
    return jnp.where(a > nonneg_divmod(CAP, jnp.maximum(b, 1))[0], CAP, jnp.minimum(a * b, CAP))


def _next_row(row, c_top):
    """``N(r, .)`` from ``N(r - 1, .)``: ``N(r, a) = N(r - 1, a) + N(r, a + 1)``, ``N(r, S) =
    c_S``; a saturating suffix sum."""
    terms = row.at[-1].set(c_top)
    return lax.associative_scan(_sat_add, terms, reverse=True)


def _band(c, n, level):
    """``(r, N(r - 2, level), N(r - 1, level))`` for ``n > c_level``: the band ``r >= 1`` with
    ``N(r - 1, level) < n <= N(r, level)`` (``N(-1, a) = c_a - c_{a+1}``)."""
    delta = jnp.concatenate([c[:-1] - c[1:], c[-1:]])

    def cond(st):
        return st[3][level] < n

    def body(st):
        r, _, prev, row = st
        return r + 1, prev[level], row, _next_row(row, c[-1])

    r, left, prev, _ = lax.while_loop(cond, body, (i32(0), i32(0), delta, jnp.minimum(c, CAP)))
    return r, left, prev[level]


def _chains(s, i, previous):
    """``beta(s, i) = C(s + i, i)`` (``s >= -1``; ``beta(-1, i) = [i = 0]``) from ``previous =
    beta(s, i - 1)``, saturating; ``0`` for ``i < 0``."""
    step = next_beta(previous, s, jnp.maximum(i, 1))
    return jnp.where(i < 0, 0, jnp.where(i == 0, 1, jnp.where(s + i <= 0, 0, step)))


def _free(c, last, r, level):
    """The steps the free openings of band ``r``'s pool hold, and of its left part's pool:
    ``sum_a m(a) (last(a) - a) c_a`` over the levels ``a < S`` (``m``: chains rooted at ``a``)."""
    top = c.shape[0] - 1

    def body(a, st):
        m, m_left, total, total_left = st
        i = a - level
        m, m_left = _chains(r - 2, i, m), _chains(jnp.maximum(r - 3, -1), i, m_left)
        hold = (last[a] - a) * c[a]
        total = _sat_add(total, _sat_mul(m, hold))
        total_left = _sat_add(total_left, _sat_mul(m_left, hold))
        return m, m_left, total, total_left

    zero = i32(0)
    _, _, total, total_left = lax.fori_loop(0, top, body, (zero, zero, zero, zero))
    return total, total_left


def _left_steps(c, first, last, r, level, o):
    """``o1``: the steps the left part's pool holds of the band's greedy selection for ``o``
    (free openings, then each run's segments as far as the chains reaching it allow; the left
    part's filled first), as ``Mixed``'s ``_greedy``."""
    top = c.shape[0] - 1
    free, free_left = _free(c, last, r, level)
    o1 = jnp.minimum(o, free_left)
    rest = o - o1
    rest = rest - jnp.minimum(rest, free - free_left)

    def body(a, st):
        m, m_left, fresh, fresh_left, need, reach, reach_left, rest, o1 = st
        i = a - level
        segment = (i > 0) & (first[a] == a)
        value = (last[a] - a + 1) * c[a]
        wanted = nonneg_divmod(need + value - 1, value)[0]
        take = jnp.where(segment & (need > 0), jnp.minimum(fresh + reach, wanted), 0)
        take_left = jnp.minimum(take, fresh_left + reach_left)
        step = jnp.minimum(rest, take_left * value)
        rest_after = rest - step
        rest_after = rest_after - jnp.minimum(rest_after, (take - take_left) * value)
        need = jnp.where(segment, need - take * value, need)
        reach = jnp.where(segment, take, reach)
        reach_left = jnp.where(segment, take_left, reach_left)
        o1 = jnp.where(segment, o1 + step, o1)
        rest = jnp.where(segment, rest_after, rest)
        fresh = jnp.where(segment, 0, fresh)
        fresh_left = jnp.where(segment, 0, fresh_left)
        m, m_left = _chains(r - 2, i, m), _chains(jnp.maximum(r - 3, -1), i, m_left)
        fresh = _sat_add(fresh, jnp.where(a < top, m, 0))
        fresh_left = _sat_add(fresh_left, jnp.where(a < top, m_left, 0))
        return m, m_left, fresh, fresh_left, need, reach, reach_left, rest, o1

    zero = i32(0)
    init = (zero, zero, zero, zero, o - free, zero, zero, rest, o1)
    return lax.fori_loop(0, top + 1, body, init)[-1]


def split(leaves: tuple[int, ...], n, level):
    """An optimal split of a segment of ``n`` steps at ``level`` (int32 scalars): ``0`` for a
    leaf (``n <= c_level``), else the band rule's ``j`` (level ``S - 1``: ``n - c_S``; band 1:
    ``c_k - c_{k+1} + min(n - c_k, c_{k+1})``; band ``r >= 2``: ``N(r - 2, level) + o1``), as
    :meth:`Mixed.split` (the segment must be reversible: ``level < S`` or ``n <= c_S``)."""
    c, first, last = (jnp.asarray(x) for x in _constants(leaves))
    n, level = jnp.asarray(n, i32), jnp.asarray(level, i32)
    top = len(leaves) - 1

    def banded_for(n):
        r, left, base = _band(c, n, level)
        o = n - base
        one = left + jnp.minimum(o, c[jnp.minimum(level + 1, top)])
        return jnp.where(r == 1, one, left + _left_steps(c, first, last, r, level, o))

    # Levels S - 1 and S: the only split, n - c_S (the band grows as n / c_S), and a leaf. The
    # stand-in c_level for n ends a batched band loop (vmap runs both branches) at once.
    last_level = level >= top - 1
    n_band = jnp.where(last_level, c[level], n)
    j = lax.cond(n <= c[level], lambda: i32(0), lambda: banded_for(n_band))
    return jnp.where(last_level & (n > c[level]), n - c[top], j)
