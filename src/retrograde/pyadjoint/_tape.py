"""The tape that runs a retrograde schedule: :func:`enable_checkpointing`."""

from __future__ import annotations

from pyadjoint.tape import Tape, get_working_tape

from ..schedules import Schedule
from ._manager import CheckpointManager

__all__ = ["enable_checkpointing", "CheckpointedTape"]


class CheckpointedTape(Tape):
    """pyadjoint's :class:`~pyadjoint.tape.Tape`, with what its checkpoint manager is never
    asked routed to the :class:`~._manager.CheckpointManager`: every dependency read and every
    output made while taping (``add_to_checkpointable_state``, ``add_to_adjoint_dependencies``),
    ``evaluate_tlm`` and ``evaluate_hessian``.
    :func:`enable_checkpointing` switches a tape to this class in place (no new state: the same
    slots), so everything that holds the tape keeps it.
    """

    __slots__ = ()

    def _retrograde(self) -> CheckpointManager | None:
        m = self._checkpoint_manager
        return m if isinstance(m, CheckpointManager) else None

    def add_to_checkpointable_state(self, block_var, last_used):
        m = self._retrograde()
        if m is None:
            return super().add_to_checkpointable_state(block_var, last_used)
        m.capture_read(block_var, last_used)

    def add_to_adjoint_dependencies(self, block_var, last_used):
        m = self._retrograde()
        if m is None:
            return super().add_to_adjoint_dependencies(block_var, last_used)
        m.capture_output(block_var)  # the manager reads the graph, and keeps a step's data

    def evaluate_tlm(self, markings=False):
        m = self._retrograde()
        if m is None:
            return super().evaluate_tlm(markings)
        m.evaluate_tlm(markings)

    def evaluate_hessian(self, markings=False):
        m = self._retrograde()
        if m is None:
            return super().evaluate_hessian(markings)
        m.evaluate_hessian(markings)


def enable_checkpointing(
    schedule: Schedule, *, tape: Tape | None = None, n_steps: int | None = None
) -> CheckpointManager:
    """Checkpoint a pyadjoint tape with a retrograde schedule: the replacement of
    ``tape.enable_checkpointing(schedule)``.

    Call it on an empty tape, then tape the loop as usual with ``tape.timestepper(...)``;
    ``ReducedFunctional``, ``derivative``, ``tlm``, ``hessian``, ``taylor_test`` and ``minimize``
    work unchanged, at any control, as often as asked.

    Args:
        schedule: any retrograde schedule (``Revolve(s)``, ``StoreAll()``, ``Online(s)``,
            ``RecomputeAll()``, ``MultiLevel`` with a ``Level(storage="disk")``...).
        tape: the tape (default: pyadjoint's working tape).
        n_steps: the number of time steps, if known before taping. Without it an offline
            schedule places its snapshots online while taping (``Revolve(s)`` as ``Online(s)``)
            and plays its optimum for the count taped afterwards.

    Returns:
        The :class:`~retrograde.pyadjoint.CheckpointManager` (its ``counts`` tell what ran).

    Cost: a derivative after taping or ``ReducedFunctional.__call__`` costs the reverse part of
    ``simulate(schedule, N)`` (its plain evaluations after the forward sweep, and ``N``
    recorded steps), one taken again without re-evaluating ``N`` more; each
    ``ReducedFunctional.__call__`` and ``tlm`` ``N`` step evaluations; a ``hessian`` one
    augmented reverse part, plus ``N`` steps with tangents unless ``tlm`` ran just before.
    Memory: the schedule's snapshots of ``u_n`` (the values made before step ``n`` and read in
    step ``n`` or later) and the state at hand; the tape's inputs are never copied.

    Example:
        >>> import pyadjoint as pa
        >>> import retrograde.pyadjoint as rp
        >>> from retrograde.schedules import Revolve
        >>> tape = pa.Tape()
        >>> with pa.set_working_tape(tape):
        ...     _ = rp.enable_checkpointing(Revolve(2))
        ...     m = pa.AdjFloat(0.7)
        ...     u = m
        ...     for n in tape.timestepper(iter(range(6))):
        ...         u = 1.1 * u + 0.1 * u ** 2
        ...     rf = pa.ReducedFunctional(u, pa.Control(m))
        ...     round(float(rf.derivative()), 6) == round(float(pa.ReducedFunctional(
        ...         u, pa.Control(m)).derivative()), 6)
        True
    """
    tape = get_working_tape() if tape is None else tape
    if not isinstance(tape, Tape):
        raise TypeError(f"enable_checkpointing(tape=...) must be a pyadjoint Tape, got {tape!r}.")
    if len(tape.get_blocks()):
        raise ValueError(
            "enable_checkpointing must be called on an empty tape, before the loop is taped "
            "(as tape.enable_checkpointing): this tape already holds "
            f"{len(tape.get_blocks())} blocks. Call tape.clear_tape() first, or use a new Tape()."
        )
    if type(tape) is Tape:
        tape.__class__ = CheckpointedTape
    elif not isinstance(tape, CheckpointedTape):
        raise TypeError(
            f"enable_checkpointing needs a pyadjoint Tape, got a {type(tape).__name__}."
        )
    manager = CheckpointManager(schedule, tape, n_steps)
    tape._checkpoint_manager = manager
    return manager
