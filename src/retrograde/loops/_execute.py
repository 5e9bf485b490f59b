"""The compiled programs behind the primitives: forward sweeps and the schedule's reverse sweep.

Everything here is traced inside a primitive's lowering (unbatched: a batched primitive runs
these under ``jax.vmap``, see :mod:`._levels`), so it only uses ``jax.lax``. Costs, for a loop
of ``N`` steps and a schedule with ``t`` plain evaluations and ``S`` slots:

- :func:`forward`: ``N`` plain evaluations; memory: the carry, the ``ys`` (``O(N)`` by nature)
  and, with tables, ``S`` snapshots plus the state ``u_{N-1}``.
- :func:`adjoint`: from saved snapshots ``t - (N - 1)`` plain and ``N`` recorded evaluations,
  otherwise ``t`` plain and ``N`` recorded; memory: ``S`` snapshots, the carry and its
  cotangent, one step's VJP working set, and the cotangents of ``xs`` (``O(N)``, only if wanted).

The reverse sweep (:func:`_reverse`) executes a stream of macro-actions (:mod:`._machine`): moves
(restore, advance, store) and leaves. A leaf runs as two plain loops, its forward part storing
every state and its records reading them back, so most steps cost what they cost in
``jax.lax.scan``'s reverse pass; the stream comes from the in-graph binomial machine (``O(S)``
state) or, for schedules without a binomial reversal, from a table of rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _machine as machine
from ._body import Body, is_float
from ..schedules import online_decisions
from ._offload import Offload, Segments, tags_of, thinning_slot
from ._placement import store_slot
from ._tables import Tables

i32 = jnp.int32


def _slice(xs, n):
    return [lax.dynamic_index_in_dim(x, n, 0, keepdims=False) for x in xs]


def _put(buffers, values, n):
    return [lax.dynamic_update_index_in_dim(b, v, n, 0) for b, v in zip(buffers, values)]


def _load(slots, k, cur, off: Offload | None = None, step=None):
    """The state in slot ``k``, or ``cur`` if ``k < 0`` (a select, not a conditional: a
    conditional that passes a loop's state through copies it). With ``off``, slots from
    ``off.n_device`` on are offloaded: their state (``u_step``) is fetched from its store."""
    if off is not None:
        k, cur = off.fetch(k, cur, step)
    got = _slice(slots, jnp.maximum(k, 0))
    return [jnp.where(k >= 0, g, c) for g, c in zip(got, cur)]


def _store(slots, k, values, off: Offload | None = None, step=None):
    """``slots`` with ``values`` in slot ``k`` (unchanged if ``k < 0``), in place. With ``off``,
    an offloaded slot's state (``u_step``) goes to its store instead."""
    if off is not None:
        k = off.keep(k, values, step)
    j = jnp.maximum(k, 0)
    old = _slice(slots, j)
    return _put(slots, [jnp.where(k >= 0, v, o) for v, o in zip(values, old)], j)


def _put_if(pred, buffers, values, k):
    """``buffers`` with ``values`` in row ``k`` if ``pred``, as a conditional: in a step's loop
    body that is one kernel, where a select (as in :func:`_store`) adds a read of the row (XLA's
    CPU runtime runs a body of more than 8 kernels on its thread pool, which costs more than a
    small step). Done in place. ``k`` may be a function computing the row inside the branch
    (then the body computes only ``pred``, one kernel fewer per step)."""
    return lax.cond(pred, lambda b: _put(b, values, k() if callable(k) else k),
                    lambda b: list(b), list(buffers))


def _zeros(avals, lead=()):
    return [jnp.zeros(lead + tuple(a.shape), a.dtype) for a in avals]


def any_over(pred, axes):
    """``pred`` or-ed over the batch axes ``axes`` (vmap axis names): one unbatched bool."""
    if not axes:
        return pred
    return lax.psum(pred.astype(i32), axes) > 0


def zeros_after(avals, lead, deps):
    """Zeros that XLA cannot allocate before ``deps`` exist (see :func:`_confined`).

    The zeros are tied to one element of every dependency: a single one may be a constant (a
    symbolic zero cotangent made concrete), which XLA folds.
    """
    leaves = [d for d in deps if d.size]
    if not leaves:
        return _zeros(avals, lead)
    dep = sum(jnp.real(d.ravel()[0]).astype(jnp.float32) for d in leaves) * 0
    return [jnp.broadcast_to(dep.astype(a.dtype), lead + tuple(a.shape)) for a in avals]


def _confined(seeds, sweep, zero, axes):
    """Run ``sweep()`` inside a conditional on "some seed is nonzero", else return ``zero()``.

    A reverse sweep that lays its own snapshots allocates its slots inside the conditional's
    branch, so XLA keeps them alive only while that sweep runs. Without it, the slots of
    independent sweeps (as in higher derivatives) are all allocated up front and live at once.
    Skipping a sweep whose cotangent seeds are all zero is exact: the adjoint is linear in them.
    Under ``vmap`` the predicate is or-ed over the batch, so it stays a conditional.
    """
    live = [jnp.any(s != 0) for s in seeds if s.size]
    if not live:
        return zero()
    pred = live[0]
    for p in live[1:]:
        pred = pred | p
    return lax.cond(any_over(pred, axes), sweep, zero)


# ----------------------------------------------------------------------------- forward sweeps


def forward(body: Body, length: int, consts, carry, xs, tables: Tables | None = None, *,
            ys: bool = True, slots=None, unroll=1, batched=False, off: Offload | None = None,
            stored=None):
    """Run all ``N = length`` steps. Returns ``(carry_N, ys, snaps)``: the stacked per-step
    outputs (none unless ``ys``), and with ``tables`` the snapshots, ``S`` rows of each stored
    carry leaf (written into ``slots`` if given) followed by the stored leaves of ``u_{N-1}``.
    Snapshots of offloaded slots go to the store of ``off`` (required if the tables have some).
    ``stored`` (a mask over the carry leaves) overrides which leaves are stored
    (``body.stored``).

    With ``m`` stores, ``m <= N / DENSE`` and ``unroll == 1``, the steps between two stores run
    as a plain inner loop (one outer iteration per store), so a step costs what it costs
    without snapshots. Otherwise each step tests whether its state is stored (a conditional):
    with more stores, by reading its slot off a table of ``N - 1`` (the stores are ``O(N)``
    already), which keeps the loop body within XLA CPU's 8 thunks (see :func:`_once`); with
    every state stored (``StoreAll``), with no test."""
    n = tables.length if tables is not None else length
    step = body.runner(batched)
    ys_buf = _zeros(body.y_avals, (n,)) if ys else []
    stored = body.stored if stored is None else stored

    def snapshot(carry):
        return [c for c, st in zip(carry, stored) if st]

    if tables is not None and slots is None:
        slots = _zeros(snapshot(body.carry_avals), (tables.n_slots,))

    def one(i, state):
        carry, ys_buf = state
        new, y = step(consts, carry, _slice(xs, i))
        return new, _put(ys_buf, y, i) if ys else ys_buf

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
        return _put(slots, snap, k) if hit is None else _put_if(hit, slots, snap, k)

    at_steps = np.asarray(tables.store_steps, np.int32)
    at_slots = np.asarray(tables.store_slots, np.int32)
    m = len(at_steps)
    state = (list(carry), ys_buf)
    nested = unroll == 1 and m * DENSE <= n
    if nested:
        steps, where = jnp.asarray(at_steps), jnp.asarray(at_slots)

        def segment(q, st):  # advance to the q-th store point and store there
            state, slots = st
            p = steps[q]
            state = lax.fori_loop(jnp.where(q > 0, steps[jnp.maximum(q - 1, 0)], 0), p, one,
                                  state)
            return state, keep(where[q], p, state[0], slots)

        if m:
            state, slots = lax.fori_loop(0, m, segment, (state, list(slots)))
        start = int(at_steps[-1]) if m else 0
        state = lax.fori_loop(start, n - 1, one, state)
    elif m * DENSE <= n:  # few stores, unrolled steps: a pointer to the next store point
        steps = jnp.asarray(np.append(at_steps, n).astype(np.int32))
        where = jnp.asarray(np.append(at_slots, 0).astype(np.int32))

        def advance(i, st):  # store u_i if it is a store point, then step
            state, slots, ptr = st
            hit = steps[ptr] == i
            slots = keep(where[ptr], i, state[0], slots, hit)
            return one(i, state), slots, ptr + hit.astype(i32)

        # The last step is taken apart: its state u_{N-1} is the reverse sweep's first.
        state, slots, _ = lax.fori_loop(0, n - 1, advance, (state, list(slots), i32(0)),
                                        unroll=unroll)
    elif n > 1:  # many stores: each step's slot (-1: none) read off a table of N - 1
        slot_of = np.full(n - 1, -1, np.int32)
        below = at_steps < n - 1
        slot_of[at_steps[below]] = at_slots[below]
        every = bool((slot_of >= 0).all())  # StoreAll: no test per step
        where = jnp.asarray(slot_of)

        def advance(i, st):
            state, slots = st
            k = where[i]
            return one(i, state), keep(k, i, state[0], slots, None if every else k >= 0)

        state, slots = lax.fori_loop(0, n - 1, advance, (state, list(slots)), unroll=unroll)
    if not nested and m and int(at_steps[-1]) == n - 1:  # u_{N-1} is stored as well
        slots = keep(jnp.asarray(at_slots[-1]), n - 1, state[0], slots)
    last = snapshot(state[0])
    carry, ys_buf = one(n - 1, state)
    return carry, ys_buf, [*slots, *last]


# A forward sweep with at most one store per DENSE steps runs its steps between stores as inner
# loops (see :func:`forward`).
DENSE = 4


# The Online rule's decisions are read off a table for this many steps (at most), computed once
# in Python; beyond it the loop evaluates the rule itself.
DECISIONS = 1 << 13


def _decisions(n_slots: int, max_steps):
    """The placement table for the first ``min(max_steps, DECISIONS)`` steps (int32)."""
    n = DECISIONS if max_steps is None else min(max_steps, DECISIONS)
    return jnp.asarray(np.asarray(online_decisions(n_slots, max(n, 1)), np.int32))


def forward_while(body: Body, cond: Body, n_slots: int, max_steps, consts, carry, save: bool,
                  axes=(), layout=None):
    """Run ``while cond(carry) and n < max_steps: carry = body(carry)``; with ``save``, place
    snapshots by the ``Online`` rule as steps arrive. Returns ``(carry_N, N, slots, held)``:
    ``S`` rows of each stored carry leaf and int32[S] held steps (``-1`` empty). Under ``vmap``
    (``axes``) the loop runs while any element goes on. With a two-level ``layout``
    (``Online(s, slow=...)``) the snapshots go to the offloaded slots of a new store: ``slots`` is
    then its handle and the tags of the stored leaves (:func:`._offload.tags_of`), and ``held``
    has one entry per offloaded slot."""
    held = jnp.full((n_slots if layout is None else layout.n_offloaded,), -1, i32)
    slots = _zeros(body.snapshot_avals, (n_slots,)) if save and layout is None else []
    limit = jnp.iinfo(jnp.int32).max if max_steps is None else max_steps
    step = body.runner(bool(axes))

    def go(n, carry):
        _, (ok,) = cond.runner(False)(consts, [], carry)
        return any_over(ok, axes) & (n < limit)

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
                ok = go(s[0], s[1]) if start is None else lax.cond(
                    s[0] >= start, go, lambda *_: jnp.bool_(False), s[0], s[1])
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
        n, carry, _, held = run([(lambda *a: _place_thinned(*a, off=off), None)], state)
        return carry, n, [off.handle, *tags_of(body.snapshot(carry))], held
    n, carry, slots, held = run(_placement(n_slots, max_steps), state)
    return carry, n, slots, held


def _placement(n_slots: int, max_steps):
    """Where the ``Online`` rule stores ``u_n``, as phases ``[(place, stop), ...]``: the steps
    ``n < stop`` (``None``: all the rest) take ``place(n, snap, slots, held)``. The first
    ``m`` decisions are read off a table; steps beyond it (only in a loop that may run that
    long) evaluate the rule. Each phase runs as its own loop, so a step of the first tests
    nothing but its table entry."""
    table = _decisions(n_slots, max_steps)
    m = table.shape[0]

    def from_table(n, snap, slots, held):
        return _stored(n, lambda: table[jnp.minimum(n, m - 1)], snap, slots, held)

    def by_rule(n, snap, slots, held):
        return _stored(n, store_slot(n, held, n_slots), snap, slots, held)

    if max_steps is None or max_steps > m:
        return [(from_table, m), (by_rule, None)]
    return [(from_table, None)]


def _stored(n, k, snap, slots, held, off=None):
    """``u_n`` in slot ``k`` (nothing if ``k < 0``) and ``n`` in ``held[k]``; with ``off``, in its
    store. ``k`` may be a function computing the slot (see :func:`_put_if`)."""
    if off is not None:
        held = jnp.where(k >= 0, held.at[jnp.maximum(k, 0)].set(n), held)
        return _store(slots, k, snap, off, n), held
    row = k() if callable(k) else k
    *slots, held = _put_if(row >= 0, [*slots, held], [*snap, n], k)
    return slots, held


def _place_thinned(n, snap, slots, held, off):
    """Store ``u_n`` where ``Online(s, slow=...)``'s thinning rule puts it, in ``off``'s store."""
    return _stored(n, thinning_slot(n, held), snap, slots, held, off)


def advance_steps(body: Body, consts, carry, n_steps, batched=False):
    """``n_steps`` plain steps of a body without per-step inputs (traced count)."""
    step = body.runner(batched)
    return lax.fori_loop(0, n_steps, lambda i, c: step(consts, c, [])[0], list(carry))


# ----------------------------------------------------------------------------- reverse sweep


def _differentiated(body, keep):
    """Which consts and xs leaves get cotangents: ``(fc, fx)``, the float leaves selected by
    ``keep`` (a ``Keep``: masks over the float leaves; ``None`` selects them all)."""

    def masked(avals, mask):
        fl = [is_float(a) for a in avals]
        if mask is None:
            return fl
        it = iter(mask)
        return [f and next(it) for f in fl]

    cmask, xmask = (keep.consts, keep.xs) if keep is not None else (None, None)
    return masked(body.const_avals, cmask), masked(body.x_avals, xmask)


class _Steps:
    """The step, on the snapshot leaves of the state, and its VJP, for one reverse sweep.

    ``cur`` holds the carry leaves that snapshots hold; write-only buffer leaves (``body.stored``
    False) are fed to the step as fixed zeros, since nothing the step computes depends on them, so
    recomputation never carries (or writes) them. ``off``: the sweep's offloaded slots, if any.
    """

    off: Offload | None = None

    def __init__(self, body: Body, consts, xs, ys_bar, ymask, keep, batched):
        self.body, self.consts, self.xs = body, consts, xs
        self.run = body.runner(batched)
        self.fc, self.fx = _differentiated(body, keep)
        self.fk = [is_float(a) for a in body.carry_avals]
        # Float carry leaves held constant (their cotangents come out zero).
        self.held_k = ([False] * sum(self.fk) if keep is None
                       else [not k for k in keep.carry])
        self.fy = [is_float(a) for a in body.y_avals]
        self.y_avals_f = [a for a, f in zip(body.y_avals, self.fy) if f]
        ybar_of = iter(ys_bar)
        self.ybar_full = [next(ybar_of) if m else None for m in ymask]
        self.filler = [
            None if keep_ else jnp.zeros(a.shape, a.dtype)
            for a, keep_ in zip(body.carry_avals, body.stored)
        ]

    def full(self, cur):
        """The step's carry from the snapshot leaves ``cur``."""
        return self.body.restore(self.filler, cur)

    def step(self, cur, i):
        return self.body.snapshot(self.run(self.consts, self.full(cur), _slice(self.xs, i))[0])

    def advance(self, cur, a, b):
        return lax.fori_loop(a, b, lambda i, c: self.step(c, i), list(cur))

    def record(self, i, cur, kbar, cbar, xbar):
        """The VJP of step ``i`` at ``cur``: the new carry cotangent, the accumulated consts
        cotangent and the ``xs`` cotangents with step ``i``'s row written."""
        consts, fc, fk, fx, fy = self.consts, self.fc, self.fk, self.fx, self.fy
        x = _slice(self.xs, i)
        full = self.full(cur)
        ybar_i = [
            lax.dynamic_index_in_dim(yb, i, 0, keepdims=False) if yb is not None
            else jnp.zeros(a.shape, a.dtype)
            for yb, a in zip(self.ybar_full, self.y_avals_f)
        ]

        def merge(float_vals, all_vals, flags):
            it = iter(float_vals)
            return [next(it) if f else v for v, f in zip(all_vals, flags)]

        def f(c_f, k_f, x_f):
            k_f = [lax.stop_gradient(v) if held else v for v, held in zip(k_f, self.held_k)]
            k_new, y = self.run(merge(c_f, consts, fc), merge(k_f, full, fk), merge(x_f, x, fx))
            return (
                [v for v, f in zip(k_new, fk) if f],
                [v for v, f in zip(y, fy) if f],
            )

        c_f = [c for c, f in zip(consts, fc) if f]
        k_f = [c for c, f in zip(full, fk) if f]
        x_f = [v for v, f in zip(x, fx) if f]
        _, pullback = jax.vjp(f, c_f, k_f, x_f)
        dc, dk, dx = pullback((list(kbar), ybar_i))
        xbar = _put(xbar, dx, i) if xbar else xbar
        return list(dk), [a + b for a, b in zip(cbar, dc)], xbar

    # The macro-actions.

    def move(self, act, cur, slots):
        """Restore, advance, store (each only if the action asks)."""
        cur = _load(slots, act.restore, cur, self.off, act.start)
        cur = self.advance(cur, act.start, act.stop)
        return cur, _store(slots, act.store, cur, self.off, act.stop)

    def leaf_forward(self, act, idx, cur, slots):
        """A leaf's forward part: store every state from ``first`` on and advance to the last."""
        cur = _load(slots, act.restore, cur)

        def one(i, cs):
            cur, slots = cs
            slots = _put(slots, cur, idx[i - act.start])
            return self.step(cur, i), slots

        return lax.fori_loop(act.first, act.stop - 1, one, (cur, slots))

    def pairs_forward(self, act, idx, cur, slots):
        """A ``PAIRS`` leaf's forward part (nothing for other actions): for each two-step
        segment ``[a, a + 2)``, lowest first, advance from ``u_a`` (in its slot) and store
        ``u_{a+1}``, the last at hand. Each store happens a trip later, as a select (a no-op on
        the first trip): no conditional in the loop body."""

        def one(p, cs):
            cur, slots = cs
            slots = _store(slots, jnp.where(p > 0, idx[2 * p - 1], -1), cur)
            a = act.start + 2 * p
            return self.step(_slice(slots, idx[2 * p]), a), slots

        w = jnp.where(act.kind == machine.PAIRS, (act.stop - act.start) // 2, 0)
        return lax.fori_loop(0, w, one, (cur, slots))

    def leaf_records(self, act, idx, cur, slots, kbar, cbar, xbar):
        """A leaf's records, last step first: the last from the state at hand (or its slot, if
        the leaf's last state is held), the others each straight from its slot (no state carried
        from record to record)."""
        last = act.stop - 1
        cur = _load(slots, jnp.where(act.fresh != 0, -1, idx[last - act.start]), cur)
        state = self.record(last, cur, kbar, cbar, xbar)

        def one(j, state):
            k = last - 1 - j
            return self.record(k, _slice(slots, idx[k - act.start]), *state)

        return lax.fori_loop(0, last - act.start, one, state)


class _Binomial:
    """Macro-actions from the in-graph binomial machine; ``with_pairs``: also ``PAIRS``
    leaves (:mod:`._machine`)."""

    # A leaf's control (its slots and the next action) runs in a one-trip loop of its own: the
    # machine's step is many small kernels over buffers of at most 512 bytes (up to 126 slots),
    # which XLA's CPU runtime runs there in order; among the leaf's loops they would run on the
    # concurrent executor (docs/performance.md).
    control_apart = True

    def __init__(self, n_slots, held, n_steps, at_hand, with_pairs=False):
        """``held()``: the held snapshots ``(steps, slots, count)`` as :func:`._machine.init`
        takes them. It is traced, with the machine's initial state and first action, in a
        conditional's branch of its own (:func:`_branch`), so that their many small kernels run
        in order there."""
        self.with_pairs = with_pairs

        def init(n):
            st, act = self.step(machine.init(n_slots, *held(), n, at_hand))
            return n, st, machine.vector(act)

        _, self.state, self.first = _branch(n_steps >= 0, init, jnp.asarray(n_steps, i32))

    def step(self, st):
        return machine.step(st, self.with_pairs)

    def leaf_slots(self, st):
        return machine.leaf_slots(st, self.with_pairs)


class _RowSource:
    """Macro-actions read off a table of rows: the machine's own (with where its leaves keep
    their states, see :class:`._tables.Tables`), or translated from a schedule's actions (each
    leaf records one step, at hand)."""

    with_pairs = False  # no PAIRS leaves (see _Binomial)
    control_apart = False  # a row read is one kernel (see _Binomial)
    first = None  # the first action is read as the others are (see _Binomial)

    def __init__(self, tables: Tables):
        self.rows = jnp.asarray(tables.rows, i32)
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
        row = lax.dynamic_index_in_dim(self.rows, jnp.minimum(ptr, self.rows.shape[0] - 1), 0,
                                       keepdims=False)
        return ptr + 1, machine.Action(*jnp.where(ptr < self.rows.shape[0], row, done))

    def leaf_slots(self, ptr):
        """int32[S + 1]: the slot of each state of the leaf in row ``ptr - 1``."""
        i = jnp.arange(self.n_slots + 1, dtype=i32)
        if self.leaves is None:
            return jnp.zeros_like(i)
        own, f = self.leaves[jnp.clip(ptr - 1, 0, self.leaves.shape[0] - 1)]
        top = self.order.shape[0] - 1
        return jnp.where(own < 0, self.order[jnp.clip(i, 0, top)],
                         jnp.where(i == 0, own, self.order[jnp.clip(f - i, 0, top)]))


def _once(pred, f, operands):
    """``f(operands)`` inside a loop that runs once: ``pred`` is true whenever this runs, which
    XLA cannot know, so the loop stays. Its body is a thunk sequence of its own: XLA's CPU
    runtime runs a loop body of more than 8 thunks that touches buffers over 512 bytes on its
    concurrent executor, which costs more per iteration than running it in order
    (docs/performance.md), so grouping a part in such a loop can keep both bodies within 8."""

    def body(c):
        return False, f(c[1])

    return lax.while_loop(lambda c: c[0], body, (pred, operands))[1]


def _zeros_of(f, x):
    """Zeros shaped as ``f(x)`` (a pytree), without running ``f``."""
    return jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), jax.eval_shape(f, x))


def _once_returning(pred, f, x):
    """``f(x)``, a tuple whose first entry is like ``x``, computed as :func:`_once` does."""
    return _once(pred, lambda c: f(c[0]), (x, *_zeros_of(f, x)[1:]))


def _branch(pred, f, x):
    """``f(x)`` as the branch of a conditional, ``pred`` being true whenever this runs (the other
    branch, never taken, returns zeros). Like :func:`_once`, a thunk sequence of its own, but
    with no loop state to initialise: for a function that makes new arrays rather than updating
    ``x``."""
    return lax.cond(pred, f, lambda y: _zeros_of(f, y), x)  # zeros made in the branch


def _reverse(steps: _Steps, source, cur, slots, kbar, cbar, xbar):
    """Execute the macro-actions of ``source`` from the state ``cur`` and snapshot rows
    ``slots``. One iteration per leaf: the moves before it (the cotangents are not operands),
    then the leaf, whose records run unconditionally (a conditional's untaken branch would copy
    the cotangents). The pending action travels packed in one int32[7] (its fields as loop
    state would be seven scalars, each copied per iteration)."""

    def next_action(m):
        m, act = source.step(m)
        return m, machine.vector(act)

    def moving(c):
        return c[1][0] == machine.MOVE

    def move(c):
        m, act, cur, slots = c
        cur, slots = _once(act[0] == machine.MOVE,
                           lambda cs: steps.move(machine.Action(*act), *cs), (cur, slots))
        return (*next_action(m), cur, slots)

    def control(m):
        """The leaf's slots and the next action."""
        idx = source.leaf_slots(m)
        m, nxt = next_action(m)
        return m, idx, nxt

    def one_leaf(c):
        m, act, cur, slots, kbar, cbar, xbar = c
        m, act, cur, slots = lax.while_loop(moving, move, (m, act, cur, slots))
        if source.control_apart:
            m, idx, nxt = _once_returning(act[0] != machine.DONE, control, m)
        else:
            m, idx, nxt = control(m)
        act = machine.Action(*act)
        cur, slots = steps.leaf_forward(act, idx, cur, slots)
        if source.with_pairs:
            cur, slots = steps.pairs_forward(act, idx, cur, slots)
        kbar, cbar, xbar = steps.leaf_records(act, idx, cur, slots, kbar, cbar, xbar)
        return (m, nxt, cur, slots, kbar, cbar, xbar)

    if source.first is None:
        m, act = next_action(source.state)
    else:  # emitted with the source's initial state
        m, act = source.state, source.first
    state = (m, act, list(cur), list(slots), list(kbar), cbar, xbar)
    state = lax.while_loop(lambda c: c[1][0] != machine.DONE, one_leaf, state)
    return state[4], state[5], state[6]


def _cotangent_init(body, consts, xs, keep=None):
    fc, fx = _differentiated(body, keep)
    consts_bar = [jnp.zeros_like(c) for c, f in zip(consts, fc) if f]
    xs_bar = [jnp.zeros_like(x) for x, f in zip(xs, fx) if f]
    return consts_bar, xs_bar


def _source(tables: Tables):
    if tables.rows is not None:
        return _RowSource(tables)
    steps, slots, count = tables.held
    return _Binomial(tables.n_slots, lambda: (jnp.asarray(steps), jnp.asarray(slots), count),
                     tables.length, at_hand=True)


def adjoint(body: Body, tables: Tables, consts, carry0, xs, snaps, carry_bar, ys_bar, ymask,
            keep=None, axes=()):
    """Execute the schedule's reverse sweep from the forward sweep's snapshots ``snaps`` (as
    :func:`forward` returns them), or, with ``snaps is None``, its forward sweep first; return
    the cotangents of the float leaves of consts, carry_0 and xs.

    ``carry_bar`` holds one cotangent per float carry leaf; ``ys_bar`` one per float ``y`` leaf
    whose ``ymask`` entry is True (the others are zero and never materialised). ``keep`` (a
    ``Keep``) selects the float leaves whose cotangents are wanted (``None``: all); the others
    are held constant, so their cotangents cost neither time nor memory. ``axes``:
    the names of the ``vmap`` axes this runs under (see :func:`_confined`).
    """
    consts_bar, xs_bar = _cotangent_init(body, consts, xs, keep)
    if tables.length == 0:
        return consts_bar, list(carry_bar), xs_bar
    steps = _Steps(body, consts, xs, ys_bar, ymask, keep, bool(axes))
    ns = sum(body.stored)

    def sweep(snaps, off=None):
        steps.off = off
        if off is not None:  # the stored snapshots are batched as u_{N-1} is
            off.tags = tags_of(snaps[ns:])
        kbar, cbar, xbar = _reverse(steps, _source(tables), snaps[ns:], snaps[:ns], carry_bar,
                                    consts_bar, xs_bar)
        if off is not None:  # the last read of the store: release it
            off.close()
        return cbar, kbar, xbar

    if snaps is not None:
        snaps = list(snaps)
        if tables.offload is None:
            return sweep(snaps)
        return sweep(snaps[:-1], Offload(tables.offload, snaps[-1]))

    def own():
        rows = zeros_after(body.snapshot_avals, (tables.n_slots,), [*carry_bar, *carry0])
        off = Offload.open(tables.offload) if tables.offload is not None else None
        _, _, laid = forward(body, tables.length, consts, carry0, xs, tables, ys=False,
                             slots=rows, batched=bool(axes), off=off)
        return sweep(laid, off)

    def zero():
        return consts_bar, [jnp.zeros_like(k) for k in carry_bar], xs_bar

    return _confined([*carry_bar, *ys_bar], own, zero, axes)


def adjoint_while(body: Body, n_slots: int, max_steps, n_steps, consts, carry0, ck, carry_bar,
                  keep=None, axes=(), layout=None):
    """Reverse ``n_steps`` steps of a body without per-step inputs or outputs.

    From ``ck = (slots, held)`` (the forward sweep's snapshots) or, with ``ck is None``, after
    replaying the forward sweep's placement. The segments between held snapshots are reversed by
    the in-graph binomial machine. Returns cotangents of float consts and carry leaves.

    With a two-level ``layout`` (``Online(n_slots, slow=...)``) the held snapshots are in a store
    (``ck = ([handle, *tags], held)``): each segment's start is restored from it into one of the
    ``n_slots`` device slots, which reverse the segment (:class:`._offload.Segments`).
    """
    consts_bar, _ = _cotangent_init(body, consts, [], keep)
    steps = _Steps(body, consts, [], [], (), keep, bool(axes))

    def sweep_offloaded(handle, held, tags):
        steps.off = Offload(layout, handle, tags)
        rows = zeros_after(body.snapshot_avals, (n_slots,), [*carry_bar, *carry0])
        kbar, cbar, _ = _reverse(steps, Segments(n_slots, held, n_steps), body.snapshot(carry0),
                                 rows, carry_bar, consts_bar, [])
        steps.off.close()  # the last read of the store: release it
        return cbar, kbar

    def sweep(slots, held):
        def ascending():
            order = machine.argsort(jnp.where(held < 0, jnp.iinfo(jnp.int32).max, held))
            return held[order], order, jnp.sum(held >= 0, dtype=i32)

        source = _Binomial(n_slots, ascending, n_steps, at_hand=False, with_pairs=True)
        kbar, cbar, _ = _reverse(steps, source, body.snapshot(carry0), slots, carry_bar,
                                 consts_bar, [])
        return cbar, kbar

    if ck is not None:
        if layout is not None:
            return sweep_offloaded(ck[0][0], ck[1], ck[0][1:])
        return sweep(list(ck[0]), ck[1])

    def replay(place):
        def one(n, state):
            cur, slots, held = state
            slots, held = place(n, cur, slots, held)
            return steps.step(cur, n), slots, held

        return one

    def own_offloaded():
        off = Offload.open(layout, n_device=0)
        state = (body.snapshot(carry0), [], jnp.full((layout.n_offloaded,), -1, i32))
        state = lax.fori_loop(0, n_steps, replay(
            lambda *a: _place_thinned(*a, off=off)), state)
        return sweep_offloaded(off.handle, state[2], tags_of(state[0]))

    def own():
        state = (body.snapshot(carry0),
                 zeros_after(body.snapshot_avals, (n_slots,), [*carry_bar, *carry0]),
                 jnp.full((n_slots,), -1, i32))
        start = 0
        for place, stop in _placement(n_slots, max_steps):
            end = n_steps if stop is None else jnp.minimum(n_steps, stop)
            state = lax.fori_loop(start, end, replay(place), state)
            start = end
        return sweep(state[1], state[2])

    def zero():
        return consts_bar, [jnp.zeros_like(k) for k in carry_bar]

    return _confined(list(carry_bar), own if layout is None else own_offloaded, zero, axes)
