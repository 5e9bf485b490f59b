"""Binomial quantities of the Revolve optimum, computed inside a compiled program (int32).

The in-graph twins of :mod:`retrograde.schedules._optimum` and
:func:`retrograde.schedules.largest_split`, shared by the reversal machine
(:mod:`._machine`) and the online placement rule (:mod:`._placement`):

- :func:`next_beta`, :func:`repetition`: ``beta(s, r) = C(s + r, s)`` and ``r(n, s)``, the
  smallest ``r`` with ``beta(s, r) >= n``, saturating at ``CAP``;
- :func:`largest_split`: the largest optimal first split of a segment;
- :func:`optimum`: ``t(n, s) = r n - C(s + r, s + 1)``, elementwise.

:func:`largest_split` (the machine's, slot count traced) is one loop over the repetition number.
:func:`optimum` with static slot counts (the placement rule) reads a trace-time table of binomials
(:func:`beta_table`, depth :func:`table_depth`) with one comparison per entry, and falls back to a
loop over the repetition number only for segments that outgrow the table.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

CAP = 1 << 24
COST_CAP = 1 << 30
i32 = jnp.int32


def nonneg_divmod(a, b):
    """``a // b`` and ``a % b`` for integers ``a >= 0``, ``b > 0``: on JAX arrays one truncating
    division each (``lax.div``, ``lax.rem``: equal to floor division for these signs, without
    the sign corrections of ``jnp.floor_divide``); on Python or NumPy integers ``//``, ``%``."""
    if not isinstance(a, jax.Array) and not isinstance(b, jax.Array):
        return a // b, a % b
    a, b = jnp.asarray(a, i32), jnp.asarray(b, i32)
    shape = jnp.broadcast_shapes(a.shape, b.shape)
    a, b = jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)
    return lax.div(a, b), lax.rem(a, b)


def next_beta(b, s, q, minimum=jnp.minimum):
    """beta(s, q) from beta(s, q - 1) = b, exactly, saturating at CAP (``minimum=min`` for
    Python integers)."""
    b = minimum(b, CAP)
    whole, part = nonneg_divmod(b, q)
    return minimum(whole * (s + q) + nonneg_divmod(part * (s + q), q)[0], CAP)


def repetition(n, s):
    """r(n, s): the smallest r with beta(s, r) >= n; and beta(s, r)."""

    def cond(st):
        _r, b = st
        return b < n

    def body(st):
        r, b = st
        r = r + 1
        return r, next_beta(b, s, r)

    return lax.while_loop(cond, body, (i32(0), i32(1)))


@functools.cache
def beta_table(s_max: int, r_max: int):
    """``beta(s, r)`` for ``s = 0 .. s_max`` (rows) and ``r = 0 .. r_max`` (columns), by the same
    saturating recurrence as the loop (built at trace time, in NumPy)."""
    table = np.ones((s_max + 1, r_max + 1), np.int64)
    for s in range(s_max + 1):
        for r in range(1, r_max + 1):
            table[s, r] = next_beta(int(table[s, r - 1]), s, r, minimum=min)
    table.flags.writeable = False
    return table


def table_depth(s_max: int) -> int:
    """How many repetition numbers the tables hold for slot counts up to ``s_max``: ``r <= 16``
    for ``s_max >= 8`` (segments of up to ``beta(8, 16) = C(24, 8) = 735471`` steps with 8 slots,
    more with more slots), ``r <= 48`` below (``beta(4, 48) = 270725`` steps with 4 slots);
    longer segments fall back to the loops."""
    return 16 if s_max >= 8 else 48


def largest_split(n, s, s_max: int | None = None):
    """The largest optimal first split ``j`` of a segment of ``n > s + 1`` steps with ``s >= 2``
    slots (the Revolve cost ``j + t(n - j, s - 1) + t(j, s)`` is flat over a range of ``j``;
    :func:`split` returns its smallest end). Larger left parts keep more of the reversal in long
    store-every-state leaves, so the machine emits fewer actions for the same evaluations.

    With ``r = r(n, s)``, the cost's increment ``1 + r(j + 1, s) - r(n - j, s - 1)`` first
    turns positive at ``j = max(1, beta(s, q - 1), n - beta(s - 1, q))`` for ``q = r - 1`` if
    that ``j`` lies in ``[.., min(n - 1, beta(s, q) - 1)]``, else for ``q = r`` (always in range).
    One loop over the repetition number: ``r(n, s)`` iterations of two :func:`next_beta` each
    (one form for every ``n`` and ``s``: the program holds no table and no second form).
    ``s_max`` is accepted for :attr:`._machine.Rule.split`'s signature and unused."""
    del s_max

    # beta(s, q) and beta(s - 1, q) for q = r - 2 .. r, by the recurrences from q = 0 (0 for
    # q < 0); the loop stops at the first q = r with beta(s, r) >= n.
    def cond(st):
        return st[2][2] < n

    def body(st):
        q, b1, bs = st
        q = q + 1
        return (
            q,
            (b1[1], b1[2], next_beta(b1[2], s - 1, q)),
            (bs[1], bs[2], next_beta(bs[2], s, q)),
        )

    zero = (i32(0), i32(0), i32(1))
    _, b1, bs = lax.while_loop(cond, body, (i32(0), zero, zero))
    j1 = jnp.maximum(jnp.maximum(1, bs[0]), n - b1[1])  # q = r - 1
    j2 = jnp.maximum(jnp.maximum(1, bs[1]), n - b1[2])  # q = r
    return jnp.where(j1 <= jnp.minimum(n - 1, bs[1] - 1), j1, j2)


def optimum(n, s):
    """``t(n, s)``, the Revolve optimum, elementwise for int32 arrays of the same shape
    (saturating).

    When ``s`` is concrete (a NumPy array, as in the placement rule), ``r(n, s)`` is counted off
    a trace-time table of ``beta(s, r)`` for ``r`` up to ``table_depth(max(s))``: a comparison
    per table entry, no loop and no division. Only if some element needs a larger ``r``
    (:func:`table_depth`) does the loop run. With ``s`` traced: one loop over the
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
    r_max = table_depth(s_max)
    # Laid out [r, element], so that the sums over r run along the major axis.
    beta = beta_table(s_max, r_max)[s_np]
    chosen = _choose(beta, s_np[..., None], np.arange(r_max + 1))  # as the loop computes it
    step = np.diff(chosen, axis=-1, append=chosen[..., -1:])  # chosen[r + 1] - chosen[r]
    beta, step = (jnp.asarray(np.moveaxis(t, -1, 0).astype(np.int32)) for t in (beta, step))
    s = jnp.asarray(s_np, i32)
    # beta(s, r) < n exactly for r < r(n, s): so r(n, s) counts those entries, and
    # C(s + r, s + 1) is the sum of the steps of ``chosen`` below r(n, s) (chosen[0] = 0).
    below = beta < n[None]
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
        return r, jnp.where(go, next_beta(b, s, jnp.maximum(r, 1)), b)

    # r(n, s) and beta(s, r) as in ``repetition``, for every element at once.
    r, b = lax.while_loop(cond, body, (jnp.zeros_like(n), jnp.ones_like(n)))
    return _finish(n, s, r, _choose(b, s, r))


def _choose(b, s, r):
    """``C(s + r, s + 1) = beta(s, r) r / (s + 1)`` from ``b = beta(s, r)``, without overflow
    (NumPy or JAX integer arrays)."""
    whole, part = nonneg_divmod(b, s + 1)
    return whole * r + nonneg_divmod(part * r, s + 1)[0]


def _finish(n, s, r, c):
    """``t(n, s)`` from ``r = r(n, s)`` and ``c = C(s + r, s + 1)`` (read only where ``s > 1``
    and ``n > 1``; the other cases have closed forms here)."""
    general = jnp.minimum(r * n - c, COST_CAP)
    # n (n - 1) / 2 with the even factor halved first (no int32 overflow below the cap).
    # (For odd n >= 1, (n - 1) // 2 = n // 2; n <= 1 reads none of this.)
    halved, odd = nonneg_divmod(n, 2)
    half = jnp.where(odd == 0, halved * (n - 1), n * halved)
    one = jnp.where(n > 46341, COST_CAP, jnp.minimum(half, COST_CAP))
    return jnp.where(n <= 1, 0, jnp.where(s == 1, one, general)).astype(i32)


def targets(n, s: int):
    """``online_targets(n, s)`` as int32[s]."""
    r, b = repetition(n + 1, i32(s))

    def body(i, st):
        out, c = st
        out = out.at[i].set(b - c)
        whole, part = nonneg_divmod(c, s - i + r)
        c = whole * (s - i) + nonneg_divmod(part * (s - i), s - i + r)[0]
        return out, c

    out, _ = lax.fori_loop(0, s, body, (jnp.zeros((s,), i32), b))
    return out
