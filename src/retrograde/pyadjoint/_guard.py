"""Block variables that refuse to fall back to a live object.

pyadjoint's ``BlockVariable.saved_output`` returns the live ``output`` when the variable holds no
checkpoint: after the object was assigned again (a Firedrake ``Function``) or at a new control
(an ``AdjFloat``), that is a wrong value read silently. Once a loop is taped, every variable a
block made is switched to :class:`GuardedBlockVariable` (a subclass, so pyadjoint sees the same
object), whose ``saved_output`` raises :class:`MissingValueError` instead.
"""

from __future__ import annotations

from typing import Any

from pyadjoint.block import Block
from pyadjoint.block_variable import BlockVariable

from .._store import SnapshotError

__all__ = ["MissingValueError", "GuardedBlockVariable", "RUNNING", "describe", "guard"]


class MissingValueError(SnapshotError):
    """A block needed a value that no snapshot and no recomputation provided.

    Raised instead of reading the live (possibly overwritten) object. It names the step that
    needed the value and the variable (its type and the block and step that made it).
    """


def describe(bv: BlockVariable) -> str:
    """``bv`` for an error message, without reading its value."""
    made = getattr(bv, "_retrograde_made", None)
    where = "" if made is None else f" made by {made[1]} in step {made[0]}"
    return f"a {type(bv.output).__name__}{where}"


class _Running:
    """The step a sweep is running, for the message, and ``reads``: while not ``None``, the set
    that every guarded read adds its variable to (the checkpoint manager watches which outputs a
    block's adjoint reads). Instance attributes: assigning a class attribute in the step loop
    would invalidate the type's attribute cache on every step."""

    __slots__ = ("step", "reads")

    def __init__(self):
        self.step: int | None = None
        self.reads: set | None = None


RUNNING = _Running()


class GuardedBlockVariable(BlockVariable):
    """A :class:`pyadjoint.block_variable.BlockVariable` whose ``saved_output`` raises
    :class:`MissingValueError` when it holds no checkpoint (cost: two tests per read)."""

    @property
    def saved_output(self) -> Any:
        checkpoint = self._checkpoint
        if checkpoint is None:
            step = RUNNING.step
            at = "" if step is None else f"step {step} needs "
            raise MissingValueError(
                f"{at}the value of {describe(self)}, which no snapshot holds: retrograde never "
                "reads the live object in its place. This is a bug in retrograde.pyadjoint (or "
                "a block that reads a variable it did not declare as a dependency); please report "
                "it with the loop that shows it."
            )
        reads = RUNNING.reads
        if reads is not None:
            reads.add(self)
        return self.output._ad_restore_at_checkpoint(checkpoint)


def guard(bv: BlockVariable, step: int, block: Block) -> None:
    """Switch ``bv`` (made by ``block`` in ``step``) to :class:`GuardedBlockVariable`."""
    if type(bv) is BlockVariable:
        bv.__class__ = GuardedBlockVariable
    bv._retrograde_made = (step, type(block).__name__)
