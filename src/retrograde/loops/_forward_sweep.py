"""The compiled forward sweeps: a loop of known length that stores the snapshots of an offline
schedule (:func:`forward`), and a while loop that places them online (:func:`forward_while`).

Traced inside a primitive's lowering (unbatched: a batched primitive runs these under
``jax.vmap``, see :mod:`._batch_levels`), so only ``jax.lax`` is used. :func:`forward` runs
``N`` evaluations; memory: the carry, the ``ys`` (``O(N)`` by nature) and, with tables, ``S``
snapshots plus the state ``u_{N-1}``. With a ``lead`` (mixed checkpointing,
:attr:`._tables.Tables.lead`), ``N - 1 - start`` of those evaluations keep their data, in the
rows its rightmost leaf reads (the snapshot rows from its level on and data rows of their own),
so that the reverse sweep evaluates none of them again.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _pool
from ._body import Body
from ._offload import Offload, tags_of
from ._placement import online_phases, place_thinned
from ._pool import rows as pool_rows
from ._slots import any_over, put_row, put_row_if, row, zeros
from ._tables import Tables

i32 = jnp.int32


def forward(
    body: Body,
    length: int,
    consts,
    carry,
    xs,
    tables: Tables | None = None,
    *,
    ys: bool = True,
    slots=None,
    unroll=1,
    batched=False,
    off: Offload | None = None,
    stored=None,
    lead=None,
):
    """Run all ``N = length`` steps. Returns ``(carry_N, ys, snaps)``: the stacked per-step
    outputs (none unless ``ys``), and with ``tables`` the snapshots, ``S`` rows of each stored
    carry leaf (written into ``slots`` if given) followed by the stored leaves of ``u_{N-1}``.
    Snapshots of offloaded slots go to the store of ``off`` (required if the tables have some).
    ``stored`` (a mask over the carry leaves) overrides which leaves are stored
    (``body.stored``).

    ``lead``: ``(linearization, pool)`` (:mod:`._residuals`, :func:`._pool.plan`) for tables
    with a ``lead`` ``(start, level)``: steps ``start .. N - 2`` keep their data as the lead
    leaf's rows (:func:`._pool.keep`), and ``tables.data_rows`` rows of each residual not
    pooled follow the snapshots.

    With ``m`` stores, ``m <= N / DENSE`` and ``unroll == 1``, the steps between two stores run
    as a plain inner loop (one outer iteration per store, which stores the segment's first
    state: the last one runs to ``u_{N-1}``), so a step costs what it costs without snapshots,
    and the program holds two copies of the step (that loop's and the last step's). Otherwise
    each step tests whether its state is stored (a conditional): with more stores, by reading
    its slot off a table of ``N - 1`` (the stores are ``O(N)`` already), which keeps the loop
    body within the thunk budget (docs/performance.md, "The XLA CPU executor rule"); with every
    state stored (``StoreAll``), with no test."""
    n = tables.length if tables is not None else length
    step = body.runner(batched)
    ys_buf = zeros(body.y_avals, (n,)) if ys else []
    stored = body.stored if stored is None else stored

    def snapshot(carry):
        return [c for c, st in zip(carry, stored) if st]

    if tables is not None and slots is None:
        slots = zeros(snapshot(body.carry_avals), (pool_rows(body, tables),))

    def one(i, state):
        carry, ys_buf = state
        new, y = step(consts, carry, row(xs, i))
        return new, put_row(ys_buf, y, i) if ys else ys_buf

    if n == 0:  # nothing to trace (a step would index an empty xs)
        return list(carry), ys_buf, ([*slots, *snapshot(carry)] if tables else [])
    if tables is None:
        carry, ys_buf = lax.fori_loop(0, n, one, (list(carry), ys_buf), unroll=unroll)
        return carry, ys_buf, []

    def keep(k, i, carry, slots, hit=None):
        """``slots`` with ``u_i`` (``carry``) in slot ``k`` if ``hit`` (``None``: always, with no
        test); an offloaded slot's snapshot goes to its store."""
        snap = snapshot(carry)
        if off is not None:
            k = off.keep(k, snap, i, True if hit is None else hit)
            hit = (k >= 0) if hit is None else hit & (k >= 0)
        return put_row(slots, snap, k) if hit is None else put_row_if(hit, slots, snap, k)

    at_steps = np.asarray(tables.store_steps, np.int32)
    at_slots = np.asarray(tables.store_slots, np.int32)
    # The plain steps end at u_end: u_{N-1}, or the lead leaf's start.
    end = n - 1 if lead is None else tables.lead[0]
    below = at_steps <= end
    at_steps, at_slots = at_steps[below], at_slots[below]
    m = len(at_steps)
    state = (list(carry), ys_buf)
    nested = unroll == 1 and m * DENSE <= n
    if nested:
        # One loop over the store points, each segment storing its first state (no
        # conditional: every schedule stores u_0), then advancing to the next store point or to
        # N - 1: the program holds the step there and in the last step (below) only.
        first = int(at_steps[0]) if m else end
        if first > 0:  # a schedule that does not store u_0: the steps before its first store
            state = lax.fori_loop(0, first, one, state)
        if m:
            starts = jnp.asarray(at_steps)
            ends = jnp.asarray(np.append(at_steps[1:], end).astype(np.int32))
            where = jnp.asarray(at_slots)

            def segment(q, st):
                state, slots = st
                slots = keep(where[q], starts[q], state[0], slots)
                return lax.fori_loop(starts[q], ends[q], one, state), slots

            state, slots = lax.fori_loop(0, m, segment, (state, list(slots)))
    elif m * DENSE <= n:  # few stores, unrolled steps: a pointer to the next store point
        steps = jnp.asarray(np.append(at_steps, n).astype(np.int32))
        where = jnp.asarray(np.append(at_slots, 0).astype(np.int32))

        def advance(i, st):  # store u_i if it is a store point, then step
            state, slots, ptr = st
            hit = steps[ptr] == i
            slots = keep(where[ptr], i, state[0], slots, hit)
            return one(i, state), slots, ptr + hit.astype(i32)

        # The last step is taken apart: its state u_{N-1} is the reverse sweep's first.
        state, slots, _ = lax.fori_loop(
            0, end, advance, (state, list(slots), i32(0)), unroll=unroll
        )
    elif end > 0:  # many stores: each step's slot (-1: none) read off a table of N - 1
        slot_of = np.full(end, -1, np.int32)
        below = at_steps < end
        slot_of[at_steps[below]] = at_slots[below]
        every = bool((slot_of >= 0).all())  # StoreAll: no test per step
        where = jnp.asarray(slot_of)

        def advance(i, st):
            state, slots = st
            k = where[i]
            return one(i, state), keep(k, i, state[0], slots, None if every else k >= 0)

        state, slots = lax.fori_loop(0, end, advance, (state, list(slots)), unroll=unroll)
    if not nested and m and int(at_steps[-1]) == end:  # u_end is stored as well
        slots = keep(jnp.asarray(at_slots[-1]), end, state[0], slots)
    kept = []
    if lead is not None:
        state, slots, kept = _keep_lead(tables, lead, consts, xs, state, slots, ys)
    last = snapshot(state[0])
    carry, ys_buf = one(n - 1, state)
    return carry, ys_buf, [*slots, *last, *kept]


def _keep_lead(tables: Tables, lead, consts, xs, state, slots, ys):
    """Steps ``start .. N - 2`` from ``u_start`` (``state``), each keeping its data as row
    ``i - start`` of the lead leaf (:attr:`Tables.lead`). Returns ``(state, slots, rows)``: the
    state ``u_{N-1}`` (and ``ys``), the snapshot buffers with the pooled data, the data rows of
    the others."""
    lin, pool = lead
    start, level = tables.lead
    rows = zeros(_pool.rest_avals(pool, lin.stored_avals), (tables.data_rows,))

    def one(i, st):
        (carry, ys_buf), slots, rows = st
        new, y, data = lin.linearize(consts, carry, row(xs, i))
        slots, rows = _pool.keep(pool, slots, rows, level, i - start, data)
        return (new, put_row(ys_buf, y, i) if ys else ys_buf), slots, rows

    n = tables.length
    return lax.fori_loop(start, n - 1, one, (state, list(slots), rows))


# A forward sweep with at most one store per DENSE steps runs its steps between stores as inner
# loops (see :func:`forward`).
DENSE = 4


def forward_while(
    body: Body, cond: Body, n_slots: int, max_steps, consts, carry, save: bool, axes=(), layout=None
):
    """Run ``while cond(carry) and n < max_steps: carry = body(carry)``; with ``save``, place
    snapshots by the ``Online`` rule as steps arrive. Returns ``(carry_N, N, slots, held)``:
    ``S`` rows of each stored carry leaf and int32[S] held steps (``-1`` empty). Under ``vmap``
    (``axes``) the loop runs while any element goes on. With a two-level ``layout``
    (``Online(s, slow=...)``) the snapshots go to the offloaded slots of a new store: ``slots`` is
    then its handle and the tags of the stored leaves (:func:`._offload.tags_of`), and ``held``
    has one entry per offloaded slot."""
    held = jnp.full((n_slots if layout is None else layout.n_offloaded,), -1, i32)
    slots = zeros(body.snapshot_avals, (n_slots,)) if save and layout is None else []
    limit = jnp.iinfo(jnp.int32).max if max_steps is None else max_steps
    step = body.runner(bool(axes))

    def go(n, carry):
        _, (ok,) = cond.runner(False)(consts, [], carry)
        return any_over(ok, axes) & (n < limit)

    def stopped(n, carry):  # False, typed as ``go``'s value (it may vary over mesh axes)
        return zeros(cond.y_avals)[0]

    def run(phases, state):
        """Run the loop from ``state``, in phases ``[(place, stop), ...]``: the steps ``n <
        stop`` (``None``: the rest) store by ``place`` (``None``: nothing), each phase its own
        loop. The predicate is evaluated in the loops' conditions, which only read the state
        (evaluated in the body and carried, it made XLA copy the counter and the state every
        step, docs/performance.md). A later phase's loop evaluates it only from the step where
        the phase begins, in a conditional: once per state, but twice on the state where a loop
        that reaches the next phase hands over to it."""

        def one(place):
            def one(state):
                n, carry, slots, held = state
                if place is not None:
                    slots, held = place(n, body.snapshot(carry), slots, held)
                carry, _ = step(consts, carry, [])
                return n + 1, carry, slots, held

            return one

        start = None  # the first step of the phase, None for the first phase
        for place, stop in phases:

            def more(s, start=start, stop=stop):
                ok = (
                    go(s[0], s[1])
                    if start is None
                    else lax.cond(s[0] >= start, go, stopped, s[0], s[1])
                )
                return ok if stop is None else ok & (s[0] < stop)

            state = lax.while_loop(more, one(place), state)
            start = stop
        return state

    state = (i32(0), list(carry), slots, held)
    if not save:
        n, carry, _, _ = run([(None, None)], state)
        return carry, n, [], held
    if layout is not None:  # Online(s, slow=...): thinning on the offloaded slots
        off = Offload.open(layout, n_device=0)
        n, carry, _, held = run(
            [(lambda n, snap, slots, held: place_thinned(n, snap, slots, held, off=off), None)],
            state,
        )
        return carry, n, [off.handle, *tags_of(body.snapshot(carry))], held
    n, carry, slots, held = run(online_phases(n_slots, max_steps), state)
    return carry, n, slots, held


def advance_steps(body: Body, consts, carry, n_steps, batched=False):
    """``n_steps`` plain steps of a body without per-step inputs (traced count)."""
    step = body.runner(batched)
    return lax.fori_loop(0, n_steps, lambda i, c: step(consts, c, [])[0], list(carry))
