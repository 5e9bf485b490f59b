"""The action vocabulary that every schedule speaks.

A schedule for ``N`` steps of ``u_{n+1} = step(u_n)`` is executed by a machine that holds one
*current* state (the state ``u_n`` "at hand") and a number of snapshot slots on one or more
storage levels (level 0 is the fastest, e.g. device memory; later levels may be host memory
or disk). The machine understands six actions:

=============================  ==============================================================
``Advance(start, stop)``       Plain evaluation of steps ``start .. stop-1``: the current state
                               must be ``u_start``; afterwards it is ``u_stop``. Costs
                               ``stop - start`` plain evaluations.
``Store(step, slot, level)``   Copy the current state (which must be ``u_step``) into an empty
                               slot. Costs one write on that level.
``Restore(step, slot, level)`` Make the snapshot in ``slot`` (which must hold ``u_step``) the
                               current state. The snapshot stays. Costs one read.
``Free(step, slot, level)``    Release the slot (which must hold ``u_step``).
``Record(step)``               Recorded evaluation of step ``step`` (the step and its adjoint):
                               the current state must be ``u_step``. Steps are recorded in the
                               order ``N-1, N-2, ..., 0``. Afterwards no state is at hand.
``End()``                      All ``N`` steps were recorded; every slot still held is released.
=============================  ==============================================================

Actions are small immutable tuples, so that a schedule can stream millions of them cheaply.
"""

from __future__ import annotations

from typing import NamedTuple, Union

__all__ = ["Advance", "Store", "Restore", "Free", "Record", "End", "Action"]


class Advance(NamedTuple):
    """Plain evaluation of steps ``start .. stop-1`` (state ``u_start`` -> ``u_stop``).

    Costs ``stop - start`` plain evaluations.

    Example:
        >>> from retrograde.schedules import Revolve
        >>> list(Revolve(2).actions(3))[:2]
        [Store(step=0, slot=0, level=0), Advance(start=0, stop=1)]
    """

    start: int
    stop: int


class Store(NamedTuple):
    """Copy the current state ``u_step`` into the empty ``slot`` of storage ``level``.

    Costs one write on that level. Example: ``Store(step=0, slot=0, level=0)`` keeps ``u_0``.
    """

    step: int
    slot: int
    level: int = 0


class Restore(NamedTuple):
    """Make the snapshot ``u_step`` held in ``slot`` of ``level`` the current state.

    Costs one read; the snapshot stays. Example: ``Restore(step=0, slot=0)`` brings back ``u_0``.
    """

    step: int
    slot: int
    level: int = 0


class Free(NamedTuple):
    """Release ``slot`` of ``level``, which holds ``u_step``.

    Example: ``Free(step=0, slot=0)`` after the last use of ``u_0``.
    """

    step: int
    slot: int
    level: int = 0


class Record(NamedTuple):
    """Recorded evaluation (step plus adjoint) of step ``step``; needs ``u_step`` at hand.

    Steps are recorded in the order ``N-1, ..., 0``. Example: ``Record(step=2)``.
    """

    step: int


class End(NamedTuple):
    """End of the schedule: every step was recorded; remaining slots are released.

    Example:
        >>> from retrograde.schedules import End, Revolve
        >>> list(Revolve(3).actions(0))
        [End()]
    """


Action = Union[Advance, Store, Restore, Free, Record, End]
