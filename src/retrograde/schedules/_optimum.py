"""Closed forms for binomial checkpointing (Griewank 1992; Griewank & Walther 2000)."""

from __future__ import annotations

from math import comb

from ._base import check_snapshots, check_steps

__all__ = ["beta", "repetition_number", "revolve_optimum"]


def beta(snapshots: int, repetitions: int) -> int:
    """``beta(s, r) = C(s + r, s)``: the most steps ``s`` slots reverse with no step run plainly
    more than ``r`` times.

    Example:
        >>> beta(10, 3)
        286
    """
    return comb(snapshots + repetitions, snapshots)


def repetition_number(n_steps: int, snapshots: int) -> int:
    """The ``r`` with ``beta(s, r - 1) < n_steps <= beta(s, r)`` (``0`` for ``n_steps <= 1``).

    Costs ``O(r)``. Example:
        >>> repetition_number(1000, 10)
        4
    """
    r, b = 0, 1
    while b < n_steps:
        r += 1
        b = b * (snapshots + r) // r
    return r


def revolve_optimum(n_steps: int, snapshots: int) -> int:
    """Minimal number of plain step evaluations to reverse ``n_steps`` steps with ``snapshots``
    slots (the slot that holds the initial state counts as one):

        t(N, s) = r * N - C(s + r, s + 1),   beta(s, r - 1) < N <= beta(s, r).

    The recorded evaluations (``N`` of them) are not included. ``t(0, s) = 0``.

    >>> revolve_optimum(100, 5), revolve_optimum(1000, 10), revolve_optimum(10000, 20)
    (316, 3636, 37976)
    """
    n_steps = check_steps(n_steps)
    snapshots = check_snapshots(snapshots)
    if n_steps == 0:
        return 0
    r = repetition_number(n_steps, snapshots)
    return r * n_steps - comb(snapshots + r, snapshots + 1)
