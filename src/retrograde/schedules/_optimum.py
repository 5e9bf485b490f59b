"""Closed forms for binomial checkpointing (Griewank 1992; Griewank & Walther 2000).

The one home of the binomial recurrences of the schedule layer: ``beta(s, r) = C(s + r, s)``,
the repetition number ``r(n, s)`` and the Revolve optimum ``t(n, s)``, one at a time
(:func:`repetition`, :func:`optimum`) and tabulated for every ``n`` (:func:`bands`,
:func:`optimum_table`). Their int32 twins for compiled programs are in
:mod:`retrograde.loops._binomial`.
"""

from __future__ import annotations

from collections.abc import Iterator
from math import comb, isqrt

import numpy as np

from ._base import check_snapshots, check_steps

__all__ = [
    "beta",
    "repetition",
    "repetition_number",
    "optimum",
    "revolve_optimum",
    "bands",
    "optimum_table",
]


def beta(snapshots: int, repetitions: int) -> int:
    """``beta(s, r) = C(s + r, s)``: the most steps ``s`` slots reverse with no step run plainly
    more than ``r`` times.

    Example:
        >>> beta(10, 3)
        286
    """
    return comb(snapshots + repetitions, snapshots)


def repetition(n_steps: int, snapshots: int) -> tuple[int, int]:
    """``(r, beta(s, r))`` for the smallest ``r`` with ``beta(s, r) >= n_steps``: the epoch
    ``beta(s, r - 1) < n_steps <= beta(s, r)`` (``r = 0`` for ``n_steps <= 1``). Costs ``O(r)``
    by ``beta(s, r) = beta(s, r - 1) (s + r) / r``; no checks.

    Example:
        >>> repetition(41, 4)   # 35 = beta(4, 3) < 41 <= beta(4, 4) = 70
        (4, 70)
    """
    r, b = 0, 1
    while b < n_steps:
        r += 1
        b = b * (snapshots + r) // r
    return r, b


def repetition_number(n_steps: int, snapshots: int) -> int:
    """The ``r`` with ``beta(s, r - 1) < n_steps <= beta(s, r)`` (``0`` for ``n_steps <= 1``).

    Costs ``O(r)``. Example:
        >>> repetition_number(1000, 10)
        4
    """
    return repetition(n_steps, snapshots)[0]


def optimum(n: int, s: int) -> int:
    """``t(n, s)``, the fewest plain evaluations that reverse ``n`` steps with ``s >= 1`` slots,
    without argument checks (the hot path of :class:`~retrograde.schedules.Online`): ``n (n -
    1) / 2`` for one slot, ``r n - C(s + r, s + 1) = r n - beta(s, r) r / (s + 1)`` otherwise;
    ``O(1)`` for two slots (``beta(2, r) = (r + 1)(r + 2) / 2``), ``O(r)`` beyond.

    Example:
        >>> optimum(100, 5), optimum(100, 2), optimum(100, 1)
        (316, 845, 4950)
    """
    if n <= 1:
        return 0
    if s == 1:
        return n * (n - 1) // 2
    if s == 2:
        r = max(0, (isqrt(8 * n + 1) - 3) // 2)
        while (r + 1) * (r + 2) // 2 < n:
            r += 1
        return r * n - r * (r + 1) * (r + 2) // 6
    r, b = repetition(n, s)
    return r * n - b * r // (s + 1)


def revolve_optimum(n_steps: int, snapshots: int) -> int:
    """Minimal number of plain step evaluations to reverse ``n_steps`` steps with ``snapshots``
    slots (the slot that holds the initial state counts as one):

        t(N, s) = r * N - C(s + r, s + 1),   beta(s, r - 1) < N <= beta(s, r).

    The recorded evaluations (``N`` of them) are not included. ``t(0, s) = 0``.

    >>> revolve_optimum(100, 5), revolve_optimum(1000, 10), revolve_optimum(10000, 20)
    (316, 3636, 37976)
    """
    return optimum(check_steps(n_steps), check_snapshots(snapshots))


def bands(snapshots: int, n_max: int) -> Iterator[tuple[int, int, int]]:
    """The epochs up to ``n_max``: ``(r, beta(s, r - 1), beta(s, r))`` for ``r = 1, 2, ...``
    until ``beta(s, r) >= n_max``. Every ``n`` in ``(beta(s, r - 1), beta(s, r)]`` has repetition
    number ``r``.

    Example:
        >>> list(bands(2, 10))
        [(1, 1, 3), (2, 3, 6), (3, 6, 10)]
    """
    r, lo, hi = 0, 0, 1
    while hi < n_max:
        r += 1
        lo, hi = hi, hi * (snapshots + r) // r
        yield r, lo, hi


def optimum_table(n_max: int, snapshots: int) -> tuple[np.ndarray, np.ndarray]:
    """``t(n, s)`` and ``r(n, s)`` for ``n = 0 .. n_max`` as int64 arrays, one band at a time
    (``t(n) - t(n - 1) = r(n)``).

    Example:
        >>> t, r = optimum_table(6, 2)
        >>> t.tolist(), r.tolist()
        ([0, 0, 1, 2, 4, 6, 8], [0, 0, 1, 1, 2, 2, 2])
    """
    rep = np.zeros(n_max + 1, dtype=np.int64)
    for r, lo, hi in bands(snapshots, n_max):
        rep[lo + 1 : min(hi, n_max) + 1] = r
    return np.cumsum(rep), rep
