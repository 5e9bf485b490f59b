"""Mixed checkpointing in the reversal machine: :class:`retrograde.schedules.Mixed` as a
:class:`._machine.Rule`.

``Mixed``'s tree is the machine's traversal (a split stores the right part's start in the lowest
free slot and goes on with the right part; the left part waits on the stack), so the machine
reverses it with the schedule's own leaves and splits. The forward sweep stores the starts along
the tree's rightmost path (:meth:`~retrograde.schedules.Mixed.binomial_stores`) in slots ``0,
1, ...`` and slots are always taken lowest first, so a task of ``s`` slots (its own and the free
ones) of the machine's ``S'`` is at level ``S' - s``: slots ``0 .. level - 1`` are held, the
others free, which is what lets a ``DATA`` leaf's data share their memory. A task is a ``DATA``
leaf if it has at most ``leaf_size(level)`` steps (one step: recorded), else it is split where
``Mixed.split`` says, also with one slot (its right part then a leaf with no slot). ``S'`` is
``Mixed.state_slots``, or one more when the rightmost leaf is at the last level (its start has
no slot in the schedule). The schedule's first sweep ends by linearizing the rightmost leaf when
it is not split (:func:`_relinearized`): a gradient's forward sweep keeps those steps' data in
that leaf's rows (``_tables.Tables.lead``); snapshots of states only have the reversal linearize
them again.

When no step's data fits the budget (``leaf_size(0) == 1``), ``Mixed`` is Revolve and the rule
is :data:`._machine.REVOLVE`. Past ``_tables.ROW_LIMIT`` rows the machine splits in the graph
by the band rule (:mod:`._mixed_rule`, every whole ``data_size``); leaf sizes without one (a
fractional ``data_size``, or more than ``MAX_LEVELS`` states) run only as rows.

``Online(s, data_size=d)`` in ``while_loop`` (:func:`online_rule`) is ``Mixed(s, d)``'s rule
on the segments between the snapshots ``Online`` placed: segment ``i`` (last first) has its own
slot and the ``S - 1 - i`` free ones, so it is a task at level ``i``, reversed by the tree at that
level (:meth:`~retrograde.schedules.Mixed.reverse_stored`). Its rows are permuted first so that
the held snapshots are in slots ``0, 1, ...`` in step order (:func:`._pool.held_first`); the
step count is known only when the loop ends, so the machine splits in the graph, by the band
rule.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..schedules import Mixed, Online, band_rule_applies
from . import _machine as machine
from ._mixed_rule import MAX_LEVELS
from ._mixed_rule import split as band_split

i32 = jnp.int32


def mixed_rule(schedule: Mixed) -> machine.Rule:
    """The machine's rule for ``schedule``."""
    leaves = tuple(schedule.leaf_size(k) for k in range(schedule.state_slots + 1))
    if leaves[0] == 1:
        return machine.REVOLVE
    top = len(leaves) - 1

    def py_leaf(n, s, s_max):
        if n == 1:
            return machine.LEAF
        return machine.DATA if n <= leaves[s_max - 1 - s] else -1

    def leaf(n, s, s_max):
        size = jnp.asarray(leaves, i32)[jnp.clip(s_max - 1 - s, 0, top)]
        return jnp.where(n == 1, machine.LEAF, jnp.where(n <= size, machine.DATA, -1))

    in_graph = band_rule_applies(leaves) and top <= MAX_LEVELS

    def split(n, s, s_max):
        return band_split(leaves, n, s_max - 1 - s)

    return machine.Rule(
        leaf=leaf,
        # Leaf sizes without a band rule (a fractional data size) are planned by a table, read
        # off as the twin's rows.
        split=split if in_graph else None,
        py_leaf=py_leaf,
        py_split=lambda n, s, s_max: schedule.split(n, s_max - 1 - s),
        state_slots=lambda slots: top,
        data_rows=lambda n_slots: leaves[0] - 1,
        split_one_slot=True,
        pooled=lambda level: leaves[min(level, top)] - 1,
        relinearized=lambda stores, n: _relinearized(schedule, stores, n),
    )


def online_rule(schedule: Online) -> machine.Rule:
    """The machine's rule for the segments between ``schedule``'s snapshots in ``while_loop``:
    ``Mixed(snapshots, data_size)``'s (:func:`mixed_rule`), Revolve's without ``data_size`` or
    when no step's data fits. Raises if the leaf sizes have no in-graph split rule."""
    tree = schedule.mixed
    if tree is None:
        return machine.REVOLVE
    rule = mixed_rule(tree)
    if rule.split is None:
        raise ValueError(
            f"schedule={schedule!r}: a while loop reverses by a split rule in the compiled "
            "program (its step count is known only when it stops), which these leaf sizes do "
            f"not have (a data_size below 1 or fractional, or more than {MAX_LEVELS} "
            "snapshots). Use a whole data_size (1, 2, ...: rounding up reserves more memory "
            "per step's data), or fewer snapshots."
        )
    return rule


def _relinearized(schedule: Mixed, stores, n: int) -> int:
    """If the last store ``q`` starts the rightmost leaf (it is not split), the leaf's first
    ``n - 1 - q`` steps, which the schedule's first sweep linearizes (a compiled forward that
    keeps data does too; one that keeps states only has the reversal linearize, or record, them
    again); else none (the rightmost leaf is one step, not stored)."""
    if not stores or schedule.split(n - stores[-1], len(stores) - 1):
        return 0
    return n - 1 - stores[-1]
