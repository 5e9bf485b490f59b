"""Sources of macro-actions (:mod:`._machine`) for the reverse executor
(:func:`._reverse_sweep.reverse`).

A source is a state (a pytree of int32 arrays, carried by the executor's loop) and two traced
functions of it; :class:`MacroActionSource` declares what the executor reads. There are three:

- :class:`BinomialSource`: the in-graph binomial machine, from held snapshots (``O(S)`` state);
- :class:`RowSource`: a table of rows, the machine's own written when tracing or translated from
  a schedule's actions (``MultiLevel``);
- :class:`._offload.Segments`: the machine segment by segment between offloaded snapshots
  (``Online(s, slow=...)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from jax import lax

from . import _machine as machine
from ._tables import Tables
from ._xla_cpu import branch

i32 = jnp.int32


class MacroActionSource(Protocol):
    """What the reverse executor reads of a source of macro-actions.

    Attributes:
        state: the initial state (a pytree of arrays).
        with_pairs: whether ``PAIRS`` leaves may come (static).
        with_data: whether ``DATA`` leaves may come (static): steps reversed from their data.
        control_apart: whether :meth:`step` and :meth:`leaf_slots` run in a one-trip loop of
            their own (:func:`._xla_cpu.once`): for a source whose step is many small kernels,
            which then run in order (docs/performance.md, "The XLA CPU executor rule").

    The executor calls :meth:`step` and :meth:`leaf_slots` from one place in its program (its
    moves loop), so a source whose step is large (the binomial machine) is traced and compiled
    once per reverse sweep.
    """

    state: Any
    with_pairs: bool
    with_data: bool
    control_apart: bool

    def step(self, state) -> tuple[Any, machine.Action]:
        """The next state and the next action."""
        ...

    def leaf_slots(self, state) -> jax.Array:
        """int32[S + 1]: the slot of each state of the leaf just emitted (:mod:`._machine`)."""
        ...


class BinomialSource:
    """Macro-actions from the in-graph binomial machine; ``with_pairs``: also ``PAIRS``
    leaves (:mod:`._machine`). The first action is asked as the others are: the machine's
    step is in the program once, in the executor's moves loop."""

    # The machine's step is many small kernels over buffers within SMALL_BUFFER_BYTES (up to
    # MAX_SMALL_SLOTS slots, :mod:`._xla_cpu`), which run in order in a loop of their own; in
    # the moves loop's body, beside the move, they would run on the concurrent executor.
    control_apart = True

    def __init__(
        self,
        n_slots: int,
        held: Callable[[], tuple[Any, Any, Any]],
        n_steps,
        at_hand: bool,
        with_pairs: bool = False,
        rule: machine.Rule = machine.REVOLVE,
    ):
        """``held()``: the held snapshots ``(steps, slots, count)`` as :func:`._machine.init`
        takes them. It is traced, with the machine's initial state, in a conditional's branch
        of its own (:func:`._xla_cpu.branch`), so that their many small kernels run in order
        there. ``rule``: the machine's leaves and splits."""
        self.with_pairs = with_pairs
        self.rule = rule
        self.with_data = rule.data_rows(n_slots) > 0

        def init(n):
            return n, machine.init(n_slots, *held(), n, at_hand)

        _, self.state = branch(n_steps >= 0, init, jnp.asarray(n_steps, i32))

    def step(self, st):
        return machine.step(st, self.with_pairs, self.rule)

    def leaf_slots(self, st):
        return machine.leaf_slots(st, self.with_pairs)


class RowSource:
    """Macro-actions read off a table of rows: the machine's own (with where its leaves keep
    their states, see :class:`._tables.Tables`), or translated from a schedule's actions (each
    leaf records one step, at hand)."""

    with_pairs = False  # no PAIRS leaves
    control_apart = False  # a row read is one kernel

    def __init__(self, tables: Tables):
        self.rows = jnp.asarray(tables.rows, i32)
        self.with_data = tables.data_rows > 0
        self.n_slots = tables.n_slots
        self.order = self.leaves = None
        if tables.leaves is not None:
            self.order = jnp.asarray(tables.free_order, i32)
            self.leaves = jnp.asarray(tables.leaves, i32)
        self.state = i32(0)

    def step(self, ptr):
        done = jnp.asarray([machine.DONE, -1, 0, 0, 0, -1, 0], i32)
        if self.rows.shape[0] == 0:
            return ptr, machine.Action(*done)
        row = lax.dynamic_index_in_dim(
            self.rows, jnp.minimum(ptr, self.rows.shape[0] - 1), 0, keepdims=False
        )
        return ptr + 1, machine.Action(*jnp.where(ptr < self.rows.shape[0], row, done))

    def leaf_slots(self, ptr):
        """int32[S + 1]: the slot of each state of the leaf in row ``ptr - 1``."""
        i = jnp.arange(self.n_slots + 1, dtype=i32)
        if self.leaves is None:
            return jnp.zeros_like(i)
        own, f = self.leaves[jnp.clip(ptr - 1, 0, self.leaves.shape[0] - 1)]
        top = self.order.shape[0] - 1
        return jnp.where(
            own < 0,
            f + i,
            jnp.where(i == 0, own, self.order[jnp.clip(f - i, 0, top)]),
        )


def source_for(tables: Tables, after_lead: bool = False) -> MacroActionSource:
    """The source of an offline schedule's reversal for a known step count; with
    ``after_lead``, of what follows the lead leaf (:attr:`._tables.Tables.lead`, executed first
    from the data the forward kept): the rows after those it replaces, or the in-graph machine
    on the steps ``0 .. start - 1`` from the stores below ``start``, nothing at hand."""
    if after_lead:
        assert tables.lead is not None
        if tables.rows is not None:
            k = tables.lead_rows
            more = tables.leaves is not None and len(tables.rows) > k  # else none to read
            leaves = tables.leaves[k:] if more else None
            return RowSource(dataclasses.replace(tables, rows=tables.rows[k:], leaves=leaves))
        start = tables.lead[0]
        below = tables.store_steps < start
        steps, slots, _ = dataclasses.replace(
            tables, store_steps=tables.store_steps[below], store_slots=tables.store_slots[below]
        ).held
        count = int(below.sum())
        return BinomialSource(
            tables.n_slots,
            lambda: (jnp.asarray(steps), jnp.asarray(slots), count),
            start,
            at_hand=False,
            rule=tables.rule,
        )
    if tables.rows is not None:
        return RowSource(tables)
    steps, slots, count = tables.held
    return BinomialSource(
        tables.n_slots,
        lambda: (jnp.asarray(steps), jnp.asarray(slots), count),
        tables.length,
        at_hand=True,
        rule=tables.rule,
    )
