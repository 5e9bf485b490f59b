"""The action vocabulary that every schedule speaks.

A schedule for ``N`` steps of ``u_{n+1} = step(u_n)`` is executed by an executor that holds one
*current* state (the state ``u_n`` "at hand") and a number of snapshot slots on one or more
storage levels (level 0 is the fastest, e.g. device memory; later levels may be host memory
or disk). The vocabulary has six actions, and two more for mixed schedules (a slot may hold the
data one step's adjoint needs instead of a state):

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
``Linearize(step, slot, level)`` Evaluation of step ``step`` that also writes the data its adjoint
                               needs into an empty slot: the current state must be ``u_step``;
                               afterwards it is ``u_{step+1}``. Costs one forward evaluation and
                               one write of the step's data.
``Reverse(step, slot, level)``   The adjoint of step ``step`` from the data in ``slot`` (written
                               by ``Linearize(step, ...)``): no forward evaluation. Steps are
                               reversed in the same order as ``Record`` (each step once, by one
                               of the two); afterwards no state is at hand. The slot stays held
                               until ``Free``. Costs one read of the step's data.
=============================  ==============================================================

Actions are small immutable tuples, so that a schedule can stream millions of them cheaply.
Whatever executes them (the simulator, the host loop driver, the picture of a schedule, the
compiled loops' row tables) is an :class:`Executor`: one method per action kind, one dispatch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar, NamedTuple, Self

__all__ = [
    "Advance",
    "Store",
    "Restore",
    "Free",
    "Record",
    "End",
    "Linearize",
    "Reverse",
    "Action",
    "ScheduleError",
    "Executor",
    "relabel",
]


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


class Linearize(NamedTuple):
    """Evaluate step ``step`` (state ``u_step`` -> ``u_{step+1}``) keeping the data its adjoint
    needs in the empty ``slot`` of ``level`` (mixed checkpointing).

    Costs one forward evaluation and one write of the step's data. Example:
    ``Linearize(step=3, slot=1)`` keeps step 3's data in slot 1, then ``u_4`` is at hand.
    """

    step: int
    slot: int
    level: int = 0


class Reverse(NamedTuple):
    """The adjoint of step ``step`` from the data ``Linearize(step, slot, level)`` kept: no
    forward evaluation. Steps are reversed in the order ``N-1, ..., 0``, each by ``Record`` or by
    ``Reverse``; afterwards no state is at hand. The slot stays held until ``Free``.

    Example: ``Reverse(step=3, slot=1)`` then ``Free(step=3, slot=1)``.
    """

    step: int
    slot: int
    level: int = 0


Action = Advance | Store | Restore | Free | Record | End | Linearize | Reverse


class ScheduleError(RuntimeError):
    """A schedule asked for something impossible (restore of an empty slot, a recorded step
    without its state at hand, too many slots, ...).

    Example:
        >>> from retrograde.schedules import Level, Record, ScheduleError, execute
        >>> try:
        ...     execute([Record(0)], 2, (Level(None),))
        ... except ScheduleError as e:
        ...     print(e)
        Record(step=0): the next step to record is 1.
    """


_METHODS = {
    Advance: "advance",
    Store: "store",
    Restore: "restore",
    Free: "free",
    Record: "record",
    End: "end",
    Linearize: "linearize",
    Reverse: "reverse",
}


class Executor:
    """Base of everything that executes actions: one method per action kind (``advance``,
    ``store``, ``restore``, ``free``, ``record``, ``end``, each taking the action), and
    :meth:`execute`/:meth:`run`, which dispatch to them. A subclass overrides the kinds it acts
    on; the others do nothing, except the two actions of mixed schedules (``linearize``,
    ``reverse``), which raise unless overridden. ``End`` ends the stream: any action after it,
    and any object that is not an action, raises :class:`ScheduleError`. For speed, a
    subclass's methods are looked up once, when the class is created: define them in the class
    body.

    Example, counting the plain evaluations of a stream:
        >>> from retrograde.schedules import Executor, Revolve
        >>> class Plain(Executor):
        ...     count = 0
        ...     def advance(self, a):
        ...         self.count += a.stop - a.start
        >>> Plain().run(Revolve(3).actions(10)).count   # revolve_optimum(10, 3)
        15
    """

    #: Whether ``End`` was executed.
    ended: bool = False
    _kinds: ClassVar[dict] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._kinds = {kind: getattr(cls, name) for kind, name in _METHODS.items()}

    def execute(self, action: Action) -> None:
        """Execute one action: call the method named after its kind."""
        if self.ended:
            raise ScheduleError(f"{action} after End().")
        method = self._kinds.get(type(action))
        if method is None:
            raise ScheduleError(f"Unknown action {action!r}.")
        method(self, action)
        if type(action) is End:
            self.ended = True

    def run(self, actions: Iterable[Action]) -> Self:
        """Execute every action of ``actions`` in order (as :meth:`execute`); returns ``self``."""
        kinds = self._kinds
        for action in actions:
            kind = type(action)
            method = kinds.get(kind)
            if method is None or self.ended:
                self.execute(action)  # raises
            method(self, action)
            if kind is End:
                self.ended = True
        return self

    def advance(self, action: Advance) -> None:
        """Plain evaluation of steps ``action.start .. action.stop - 1``."""

    def store(self, action: Store) -> None:
        """Copy the state at hand into a slot."""

    def restore(self, action: Restore) -> None:
        """Make a slot's snapshot the state at hand."""

    def free(self, action: Free) -> None:
        """Release a slot."""

    def record(self, action: Record) -> None:
        """Recorded evaluation (step and adjoint) of ``action.step``."""

    def end(self, action: End) -> None:
        """The end of the schedule."""

    def linearize(self, action: Linearize) -> None:
        """Evaluation of ``action.step`` keeping its adjoint's data in a slot. An executor that
        does not override it cannot run mixed schedules, and says so."""
        raise ScheduleError(f"{action}: {type(self).__name__} does not run mixed schedules.")

    def reverse(self, action: Reverse) -> None:
        """The adjoint of ``action.step`` from a slot's data. As :meth:`linearize`, an error
        unless overridden."""
        raise ScheduleError(f"{action}: {type(self).__name__} does not run mixed schedules.")


def relabel(
    actions: Iterable[Action], offset: int = 0, slots: Sequence[tuple[int, int]] | None = None
) -> Iterator[Action]:
    """The actions of ``actions`` with every step number shifted by ``offset`` and, if ``slots``
    is given, slot ``k`` of level 0 moved to ``slots[k] = (level, slot)``. So a reversal of steps
    ``0 .. n-1`` in slots ``0 .. s-1`` serves for steps ``offset .. offset+n-1`` in any slots.

    Example:
        >>> list(relabel([Store(0, 1), Advance(0, 2), Record(2)], 10, [(0, 0), (1, 4)]))
        [Store(step=10, slot=4, level=1), Advance(start=10, stop=12), Record(step=12)]
    """
    action: Any  # dispatched on type(action), which mypy does not narrow through `kind`
    for action in actions:
        kind = type(action)
        if kind is Advance:
            yield Advance(action.start + offset, action.stop + offset)
        elif kind is Record:
            yield Record(action.step + offset)
        elif kind is End:
            yield action
        else:  # Store, Restore, Free, Linearize, Reverse
            level, slot = (action.level, action.slot) if slots is None else slots[action.slot]
            yield kind(action.step + offset, slot, level)


Executor._kinds = {kind: getattr(Executor, name) for kind, name in _METHODS.items()}
