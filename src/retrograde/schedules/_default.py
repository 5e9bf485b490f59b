"""The default schedule of the loops and adapters: about ``sqrt(2N)`` snapshots, or
``Online(16)`` where no step count is given (the one place either is decided)."""

from __future__ import annotations

from math import isqrt

from ._base import check_steps
from ._online import Online
from ._optimum import beta
from ._revolve import Revolve

__all__ = ["default_snapshots", "default_schedule"]

#: The slots of the default schedule for a step count not given: ``retrograde.while_loop``'s
#: (whatever its ``max_steps``), hence ``fori_loop``'s with traced bounds, and diffrax's
#: ``CheckpointAdjoint`` with ``max_steps=None``.
UNBOUNDED_SNAPSHOTS = 16


def default_snapshots(n_steps: int) -> int:
    """The fewest slots ``s`` with which no step is run plainly more than twice for ``n_steps``
    steps: the smallest ``s >= 1`` with ``beta(s, 2) = (s + 1)(s + 2) / 2 >= n_steps``, about
    ``sqrt(2 n_steps)`` (the rule of diffrax's ``RecursiveCheckpointAdjoint`` too).

    Example:
        >>> default_snapshots(10_000), default_snapshots(4096), default_snapshots(3)
        (140, 90, 1)
    """
    n_steps = check_steps(n_steps)
    s = max(1, isqrt(2 * n_steps) - 2)  # below the answer: (s + 2)^2 > 2 n_steps there
    while beta(s, 2) < n_steps:
        s += 1
    return s


def default_schedule(n_steps: int | None, *, online: bool = False) -> Revolve | Online:
    """The default schedule for ``n_steps`` steps (for an online schedule: at most
    ``n_steps``): ``Revolve(s)``, or ``Online(s)`` with ``online=True``, with ``s =``
    :func:`default_snapshots` ``(n_steps)``. With ``Revolve``, no step is run plainly more than
    twice; ``Online`` places its snapshots without knowing ``N`` and costs a little more.
    ``n_steps=None`` (no step count given, ``online=True`` only): ``Online(16)``, the default of
    ``retrograde.while_loop``.

    Example:
        >>> default_schedule(10_000), default_schedule(4096, online=True)
        (Revolve(snapshots=140), Online(snapshots=90))
        >>> default_schedule(None, online=True)
        Online(snapshots=16)
    """
    if n_steps is None:
        if not online:
            raise ValueError(
                "default_schedule(None): an offline schedule needs the step count; pass "
                "online=True for a loop whose step count is unknown."
            )
        return Online(UNBOUNDED_SNAPSHOTS)
    s = default_snapshots(n_steps)
    return Online(s) if online else Revolve(s)
