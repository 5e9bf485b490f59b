"""Checkpointed pyadjoint tapes (Firedrake, dolfin-adjoint): ``import retrograde.pyadjoint``.

Replace ``tape.enable_checkpointing(schedule)`` with
``retrograde.pyadjoint.enable_checkpointing(schedule)``; everything else (``tape.timestepper``,
``ReducedFunctional``, ``derivative``, ``tlm``, ``hessian``, ``taylor_test``, ``minimize``)
stays. Gradients, tangents and Hessians are right at every control and under every retrograde
schedule; a value that no snapshot holds raises :class:`MissingValueError`, never a read of the
live object. See ``docs/pyadjoint.md``.
"""

try:
    import pyadjoint as _pyadjoint  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "retrograde.pyadjoint needs pyadjoint: pip install 'retrograde[pyadjoint]'"
    ) from e

from ._guard import GuardedBlockVariable, MissingValueError
from ._manager import CheckpointManager, Counts
from ._tape import CheckpointedTape, enable_checkpointing

__all__ = [
    "enable_checkpointing",
    "CheckpointManager",
    "CheckpointedTape",
    "Counts",
    "MissingValueError",
    "GuardedBlockVariable",
]
