"""The compiled reverse sweep: the one executor of macro-actions, and the adjoints built on it.

Traced inside a primitive's lowering (unbatched: a batched primitive runs these under
``jax.vmap``, see :mod:`._batch_levels`), so only ``jax.lax`` is used. Costs, for a loop of ``N``
steps and a schedule with ``t`` plain evaluations and ``S`` slots, of :func:`adjoint`: from saved
snapshots ``t - (N - 1)`` plain and ``N`` recorded evaluations, otherwise ``t`` plain and ``N``
recorded; memory: ``S`` snapshots, the carry and its cotangent, one step's VJP working set, and
the cotangents of ``xs`` (``O(N)``, only if wanted).

:func:`reverse` executes a stream of macro-actions (:mod:`._machine`) from a source
(:class:`._sources.MacroActionSource`): moves (restore, advance, store) and leaves. A leaf runs
as two plain loops, its forward part storing every state and its records reading them back, so
most steps cost what they cost in ``jax.lax.scan``'s reverse pass; the stream comes from the
in-graph binomial machine (``O(S)`` state) or, for schedules without a binomial reversal, from a
table of rows. A ``DATA`` leaf of ``n`` steps (mixed checkpointing) makes ``n - 1`` evaluations
keeping each step's stored residuals in a data row, one recorded evaluation and ``n - 1``
reversals from the rows (no evaluation); memory: ``L`` data rows of the step's stored residuals
(``L``: the longest such leaf less one), beside the ``S`` snapshots. The lead leaf
(:attr:`._tables.Tables.lead`), whose data a forward sweep kept, makes one recorded evaluation
and ``N - 1 - start`` reversals from the rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._jax_private import core
from . import _machine as machine
from . import _pool
from . import _residuals as residuals
from ._batch_levels import summed_vjp
from ._body import Body, is_float
from ._forward_sweep import forward
from ._offload import Offload, Segments, tags_of
from ._placement import online_phases, place_thinned
from ._slots import any_over, load, put_row, row, store, zeros, zeros_after
from ._sources import BinomialSource, MacroActionSource, source_for
from ._tables import LINEARIZED, Tables
from ._xla_cpu import once

i32 = jnp.int32


def confined(seeds, sweep, zero, axes):
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


def _differentiated(body, keep):
    """Which consts and xs leaves get cotangents: ``(fc, fx)``, the float leaves selected by
    ``keep`` (a ``WrtMasks``: masks over the float leaves; ``None`` selects them all)."""

    def masked(avals, mask):
        fl = [is_float(a) for a in avals]
        if mask is None:
            return fl
        it = iter(mask)
        return [f and next(it) for f in fl]

    cmask, xmask = (keep.consts, keep.xs) if keep is not None else (None, None)
    return masked(body.const_avals, cmask), masked(body.x_avals, xmask)


class StepRunner:
    """The step, on the snapshot leaves of the state, and its VJP, for one reverse sweep.

    ``cur`` holds the carry leaves that snapshots hold; write-only buffer leaves (``body.stored``
    False) are fed to the step as fixed zeros, since nothing the step computes depends on them, so
    recomputation never carries (or writes) them. ``off``: the sweep's offloaded slots, if any.

    ``sums``: for each differentiated const (each entry of the consts cotangent), the vmap axes
    its cotangent is summed over (``adj_p``'s ``sums``, :mod:`._batch_levels`): each step's
    contribution is summed over them as it is added, so the sweep carries one cotangent, not one
    per element of the batch.

    ``kept``: the masks ``(dc, dk, dx)`` over the consts, carry and x leaves that the step's
    data are linearized in (those of a forward sweep that kept its lead leaf's data,
    ``fwd_p``'s ``kept``); ``None``: the leaves this sweep differentiates. They must include
    those.
    """

    off: Offload | None = None
    invariants: list | None = None  # the loop-invariant residuals, once data rows are made
    pool: _pool.Pool | None = None  # the data residuals kept in the snapshot buffer, if any

    def __init__(self, body: Body, consts, xs, ys_bar, ymask, keep, batched, sums=None, kept=None):
        self.body, self.consts, self.xs = body, consts, xs
        self.kept = kept
        self.batched = batched
        self.run = body.runner(batched)
        self.fc, self.fx = _differentiated(body, keep)
        self.sums = list(sums) if sums is not None else [()] * sum(self.fc)
        self.fk = [is_float(a) for a in body.carry_avals]
        # Float carry leaves held constant (their cotangents come out zero).
        self.held_k = [False] * sum(self.fk) if keep is None else [not k for k in keep.carry]
        self.fy = [is_float(a) for a in body.y_avals]
        self.y_avals_f = [a for a, f in zip(body.y_avals, self.fy) if f]
        ybar_of = iter(ys_bar)
        self.ybar_full = [next(ybar_of) if m else None for m in ymask]
        self.filler = [
            None if keep_ else zeros([a])[0] for a, keep_ in zip(body.carry_avals, body.stored)
        ]

    def full(self, cur):
        """The step's carry from the snapshot leaves ``cur``."""
        return self.body.restore(self.filler, cur)

    def step(self, cur, i):
        return self.body.snapshot(self.run(self.consts, self.full(cur), row(self.xs, i))[0])

    def advance(self, cur, a, b):
        return lax.fori_loop(a, b, lambda i, c: self.step(c, i), list(cur))

    def ybar_row(self, i):
        """The cotangents of step ``i``'s float ``y`` leaves (zeros where none is given)."""
        return [
            lax.dynamic_index_in_dim(yb, i, 0, keepdims=False) if yb is not None else zeros([a])[0]
            for yb, a in zip(self.ybar_full, self.y_avals_f)
        ]

    def record(self, i, cur, kbar, cbar, xbar):
        """The VJP of step ``i`` at ``cur``: the new carry cotangent, the accumulated consts
        cotangent and the ``xs`` cotangents with step ``i``'s row written."""
        consts, fc, fk, fx, fy = self.consts, self.fc, self.fk, self.fx, self.fy
        x = row(self.xs, i)
        full = self.full(cur)
        ybar_i = self.ybar_row(i)

        def merge(float_vals, others, flags):
            it, other = iter(float_vals), iter(others)
            return [next(it) if f else next(other) for f in flags]

        def parts(values, flags):
            return [v for v, f in zip(values, flags) if f], [
                v for v, f in zip(values, flags) if not f
            ]

        (c_f, c_o), (k_f, k_o), (x_f, x_o) = parts(consts, fc), parts(full, fk), parts(x, fx)
        nc, nk, nx, nco, nko = len(c_f), len(k_f), len(x_f), len(c_o), len(k_o)

        def f(*z):
            """The step on its differentiated leaves, then the others (no value closed over)."""
            z_f, z_o = z[: nc + nk + nx], z[nc + nk + nx :]
            k_f = [
                lax.stop_gradient(v) if held else v
                for v, held in zip(z_f[nc : nc + nk], self.held_k)
            ]
            k_new, y = self.run(
                merge(z_f[:nc], z_o[:nco], fc),
                merge(k_f, z_o[nco : nco + nko], fk),
                merge(z_f[nc + nk :], z_o[nco + nko :], fx),
            )
            return [v for v, f in zip(k_new, fk) if f] + [v for v, f in zip(y, fy) if f]

        # The VJP of the batched step where a consts cotangent is summed over the batch
        # (``sums``): it contracts over the batch, as ``lax.scan``'s batched transpose does.
        grads = summed_vjp(
            f,
            [*c_f, *k_f, *x_f],
            [*c_o, *k_o, *x_o],
            [*kbar, *ybar_i],
            [*self.sums, *[()] * (nk + nx)],
            self.body.effects,
        )
        dc, dk, dx = grads[:nc], grads[nc : nc + nk], grads[nc + nk :]
        xbar = put_row(xbar, dx, i) if xbar else xbar
        return list(dk), [a + b for a, b in zip(cbar, dc)], xbar

    # Steps reversed from their data (mixed checkpointing, :mod:`._residuals`).

    def _masks(self):
        """The masks of the leaves this sweep differentiates: ``(dc, dk, dx)``."""
        held = iter(self.held_k)
        dk = tuple(f and not next(held) for f in self.fk)
        return tuple(self.fc), dk, tuple(self.fx)

    def linearization(self) -> residuals.Linearization:
        """The step split into its evaluation keeping its data and its VJP from that data, for
        the leaves this sweep differentiates (held carry leaves are not), or those of
        ``kept``."""
        dc, dk, dx = self._masks() if self.kept is None else self.kept
        return residuals.linearization(self.body, dc, dk, dx, self.batched)

    def data_rows(self, n_rows: int, deps, tables: _pool.Reversal | None = None, slots=()) -> list:
        """``n_rows`` data rows of each stored residual (zeros tied to ``deps``, as slots are:
        :func:`._slots.zeros_after`), but of those that share the snapshot buffer ``slots``
        (given ``tables`` whose rule pools them, :mod:`._pool`); computes the loop-invariant
        residuals, once per sweep."""
        lin = self.linearization()
        self.invariants = lin.invariants(self.consts)
        if self.kept is not None:
            for want, have, what in zip(self._masks(), self.kept, ("consts", "carry", "xs")):
                if any(w and not h for w, h in zip(want, have)):
                    raise ValueError(
                        f"retrograde: this reverse sweep differentiates {what} leaves that its "
                        "forward sweep kept no data for (its data were linearized in fewer "
                        "leaves); differentiate the loop in those leaves too."
                    )
        if tables is not None and slots:
            self.pool = _pool.plan(self.body, tables, lin.stored_avals, rows=slots[0].shape[0])
        return zeros_after(_pool.rest_avals(self.pool, lin.stored_avals), (n_rows,), deps)

    def linearize(self, cur, i):
        """Step ``i`` from ``cur`` keeping its data: ``(next state, stored residuals)``."""
        new, _, data = self.linearization().linearize(self.consts, self.full(cur), row(self.xs, i))
        return self.body.snapshot(new), data

    def reverse_from(self, i, data, kbar, cbar, xbar):
        """The VJP of step ``i`` from its stored residuals ``data`` (no evaluation), as
        :meth:`record`."""
        lin = self.linearization()
        sums = self.sums
        if self.kept is not None:  # one per const linearized in; those not wanted: unsummed
            given = iter(self.sums)
            sums = [next(given) if w else () for w, h in zip(self.fc, self.kept[0]) if h]
        dc, dk, dx = lin.vjp(
            self.consts, row(self.xs, i), self.invariants, data, [*kbar, *self.ybar_row(i)], sums
        )
        if self.kept is not None:  # linearized in more leaves: those this sweep differentiates
            dc, dk, dx = (
                _within(v, have, want)
                for v, have, want in zip((dc, dk, dx), self.kept, self._masks())
            )
        given = iter(dk)  # for the float carry leaves not held; held ones get zeros
        dk = [jnp.zeros_like(k) if held else next(given) for k, held in zip(kbar, self.held_k)]
        xbar = put_row(xbar, dx, i) if xbar else xbar
        return dk, [a + b for a, b in zip(cbar, dc)], xbar

    def data_forward(self, act, cur, slots, data):
        """A ``DATA`` leaf's evaluations (nothing for other actions, nor for a leaf whose data
        the forward sweep kept, ``fresh == LINEARIZED``): steps ``start .. stop - 2`` from the
        state at hand, each keeping its data in row ``n - start`` (pooled residuals in the
        snapshot buffer ``slots`` from the leaf's level on, :func:`._pool.keep`). Returns
        ``(cur, slots, data)``."""

        def one(j, st):
            cur, slots, data = st
            cur, d = self.linearize(cur, act.start + j)
            return cur, *_pool.keep(self.pool, slots, data, act.store, j, d)

        evaluates = (act.kind == machine.DATA) & (act.fresh != LINEARIZED)
        w = jnp.where(evaluates, act.stop - 1 - act.start, 0)
        return lax.fori_loop(0, w, one, (cur, slots, data))

    def data_records(self, act, slots, data, kbar, cbar, xbar):
        """A ``DATA`` leaf's reversals from data (nothing for other actions): steps
        ``stop - 2`` down to ``start``, after its last step was recorded."""
        avals = self.linearization().stored_avals

        def one(j, state):
            k = act.stop - 2 - j
            d = _pool.fetch(self.pool, slots, data, act.store, k - act.start, avals)
            return self.reverse_from(k, d, *state)

        w = jnp.where(act.kind == machine.DATA, act.stop - 1 - act.start, 0)
        return lax.fori_loop(0, w, one, (kbar, cbar, xbar))

    # The macro-actions.

    def move(self, act, cur, slots):
        """Restore, advance, store (each only if the action asks)."""
        cur = load(slots, act.restore, cur, self.off, act.start)
        cur = self.advance(cur, act.start, act.stop)
        return cur, store(slots, act.store, cur, self.off, act.stop)

    def leaf_forward(self, act, idx, cur, slots, pairs=False):
        """A leaf's forward part: store every state from ``first`` on and advance to the last.

        With ``pairs`` (static), the same loop also runs a ``PAIRS`` leaf's forward part: for
        each two-step segment ``[a, a + 2)``, lowest first, advance from ``u_a`` (in its slot)
        and store ``u_{a+1}``, the last at hand. So the step has one call site for both (one
        copy in the program, not two). Trip ``j`` evaluates step ``i`` (a leaf's ``first + j``,
        a ``PAIRS`` leaf's ``start + 2 j``) from slot ``idx[i - start]`` after storing the state
        at hand: a leaf's ``u_i`` into that same slot (the step reads back what was just
        stored), a ``PAIRS`` leaf's ``u_{i-1}`` into ``idx[i - 1 - start]``, on its first trip
        ``u_start`` (restored before the loop) into its own slot. Both slots of each trip are
        read from two ``int32`` vectors made once per leaf, so the loop body holds the leaf
        loop's store, one row read and the step: no select, no conditional."""
        if not pairs:
            cur = load(slots, act.restore, cur)

            def one(i, cs):
                cur, slots = cs
                slots = put_row(slots, cur, idx[i - act.start])
                return self.step(cur, i), slots

            return lax.fori_loop(act.first, act.stop - 1, one, (cur, slots))

        is_pairs = act.kind == machine.PAIRS
        base = jnp.where(is_pairs, act.start, act.first)
        stride = jnp.where(is_pairs, 2, 1)
        w = jnp.where(is_pairs, (act.stop - act.start) // 2, act.stop - 1 - act.first)
        # Per trip, the slot stored into and the slot the step reads (made once per leaf).
        k = base - act.start + stride * jnp.arange(idx.shape[0], dtype=i32)
        reads = idx[jnp.clip(k, 0, idx.shape[0] - 1)]
        writes = jnp.where(is_pairs, idx[jnp.clip(k - 1, 0, idx.shape[0] - 1)], reads)
        # A PAIRS leaf starts from u_start, which its first trip stores into its own slot.
        cur = load(slots, jnp.where(is_pairs, idx[0], act.restore), cur)

        def trip(j, cs):
            cur, slots = cs
            slots = put_row(slots, cur, writes[j])
            return self.step(row(slots, reads[j]), base + stride * j), slots

        return lax.fori_loop(0, w, trip, (cur, slots))

    def leaf_records(self, act, idx, cur, slots, kbar, cbar, xbar, with_data=False):
        """A leaf's records, last step first: the last from the state at hand (or its slot, if
        the leaf's last state is held), the others each straight from its slot (no state carried
        from record to record). With ``with_data`` (static), a ``DATA`` leaf records only its
        last step here (:meth:`data_records` reverses the others)."""
        last = act.stop - 1
        cur = load(slots, jnp.where(act.fresh != 0, -1, idx[last - act.start]), cur)
        state = self.record(last, cur, kbar, cbar, xbar)

        def one(j, state):
            k = last - 1 - j
            return self.record(k, row(slots, idx[k - act.start]), *state)

        count = last - act.start
        if with_data:
            count = jnp.where(act.kind == machine.DATA, 0, count)
        return lax.fori_loop(0, count, one, state)


def _within(values, have, want) -> list:
    """``values`` over the leaves ``have`` selects, restricted to those ``want`` selects (a
    subset)."""
    out, it = [], iter(values)
    for h, w in zip(have, want):
        v = next(it) if h else None
        if w:
            out.append(v)
    return out


def reverse(
    steps: StepRunner,
    source: MacroActionSource,
    cur,
    slots,
    kbar,
    cbar,
    xbar,
    data=(),
    n_steps=None,
    first=None,
):
    """Execute the macro-actions of ``source`` from the state ``cur`` and snapshot rows
    ``slots`` (and, for ``DATA`` leaves, the data rows ``data``, :meth:`StepRunner.data_rows`).
    ``n_steps``: the steps reversed, if it may be zero (traced; then nothing runs). ``first``:
    a leaf (int32[7], :meth:`._tables.Tables.lead_action`) executed before the source's actions.

    One iteration per leaf: the moves before it, in a loop of their own (the cotangents are not
    its operands), then the leaf, whose records run unconditionally (a conditional's untaken
    branch would copy the cotangents). The source's :meth:`~._sources.MacroActionSource.step`
    and :meth:`~._sources.MacroActionSource.leaf_slots` have one call site, in the moves loop:
    each of its trips executes the pending action if it is a move, then asks the next. A leaf
    leaves ``NOP`` pending (nothing to execute, ask the next), so the moves loop that follows
    asks for what comes after it, unless it recorded step 0: steps are recorded last first,
    each once, so that leaf is the last and ``DONE`` is left pending. So the program holds one
    copy of the source's step (for the binomial machine, its largest part) and one of each of
    the step's roles in a leaf. The pending action travels packed in one int32[7] (its fields
    as loop state would be seven scalars, each copied per iteration)."""

    def moving(c):
        return (c[1][0] == machine.MOVE) | (c[1][0] == NOP)

    def control(c):
        """The next action and, should it be a leaf, its slots."""
        m, nxt = source.step(c[0])
        return m, machine.vector(nxt), source.leaf_slots(m)

    def move(c):
        m, act, idx, cur, slots = c
        cur, slots = once(
            act[0] == machine.MOVE, lambda cs: steps.move(machine.Action(*act), *cs), (cur, slots)
        )
        if source.control_apart:
            m, act, idx = once(act[0] != machine.DONE, control, (m, act, idx))
        else:  # its leaf slots after the loop, which ends where they are read (one site too)
            m, act = source.step(m)
            act = machine.vector(act)
        return m, act, idx, cur, slots

    def leaf(act, idx, cur, slots, data, kbar, cbar, xbar):
        act = machine.Action(*act)
        cur, slots = steps.leaf_forward(act, idx, cur, slots, source.with_pairs)
        if source.with_data:
            cur, slots, data = steps.data_forward(act, cur, slots, data)
        kbar, cbar, xbar = steps.leaf_records(
            act, idx, cur, slots, kbar, cbar, xbar, source.with_data
        )
        if source.with_data:
            kbar, cbar, xbar = steps.data_records(act, slots, data, kbar, cbar, xbar)
        return cur, slots, data, kbar, cbar, xbar

    def one_leaf(c):
        m, act, cur, slots, data, kbar, cbar, xbar = c
        m, act, idx, cur, slots = lax.while_loop(moving, move, (m, act, idx0, cur, slots))
        if not source.control_apart:
            idx = source.leaf_slots(m)
        cur, slots, data, kbar, cbar, xbar = leaf(act, idx, cur, slots, data, kbar, cbar, xbar)
        # Steps are recorded last first, each once: the leaf that records step 0 is the last.
        act = jnp.where(act[2] == 0, _DONE, _NOP)
        return (m, act, cur, slots, data, kbar, cbar, xbar)

    act = _NOP if n_steps is None else jnp.where(n_steps > 0, _NOP, _DONE)
    if first is not None:  # a leaf is not a move: the first trip executes it
        act = first
    idx0 = jnp.zeros(jax.eval_shape(source.leaf_slots, source.state).shape, i32)
    state = (source.state, act, list(cur), list(slots), list(data), list(kbar), cbar, xbar)
    state = lax.while_loop(lambda c: c[1][0] != machine.DONE, one_leaf, state)
    return state[5], state[6], state[7]


# The executor's own pending action: nothing to execute, ask the source for the next one.
NOP = -1
_NOP = np.asarray([NOP, -1, 0, 0, 0, -1, 0], np.int32)
_DONE = np.asarray([machine.DONE, -1, 0, 0, 0, -1, 0], np.int32)


def _cotangent_init(body, consts, xs, keep=None, sums=None):
    """Zero cotangents of the differentiated consts and xs; one summed over vmap axes
    (``sums``, as :class:`StepRunner`'s) is one value for the whole batch."""
    fc, fx = _differentiated(body, keep)
    sums = iter(sums if sums is not None else [()] * sum(fc))
    consts_bar = [
        (zeros([core.typeof(c)])[0] if next(sums) else jnp.zeros_like(c))
        for c, f in zip(consts, fc)
        if f
    ]
    xs_bar = [jnp.zeros_like(x) for x, f in zip(xs, fx) if f]
    return consts_bar, xs_bar


def adjoint(
    body: Body,
    tables: Tables,
    consts,
    carry0,
    xs,
    snaps,
    carry_bar,
    ys_bar,
    ymask,
    keep=None,
    axes=(),
    sums=None,
    kept=None,
):
    """Execute the schedule's reverse sweep from the forward sweep's snapshots ``snaps`` (as
    :func:`._forward_sweep.forward` returns them), or, with ``snaps is None``, its forward sweep
    first; return the cotangents of the float leaves of consts, carry_0 and xs.

    With a lead leaf (:attr:`._tables.Tables.lead`) the forward keeps its data, linearized in
    the leaves of ``kept`` (``fwd_p``'s; the reverse's own forward: in the leaves it
    differentiates), and the reverse starts by reversing it from them. Snapshots laid without
    (``kept is None``) have the reverse linearize the lead leaf again (``Tables.relinearized``).

    ``carry_bar`` holds one cotangent per float carry leaf; ``ys_bar`` one per float ``y`` leaf
    whose ``ymask`` entry is True (the others are zero and never materialised). ``keep`` (a
    ``WrtMasks``) selects the float leaves whose cotangents are wanted (``None``: all); the others
    are held constant, so their cotangents cost neither time nor memory. ``axes``:
    the names of the ``vmap`` axes this runs under (see :func:`confined`); ``sums``: the vmap
    axes each consts cotangent is summed over (see :class:`StepRunner`).
    """
    consts_bar, xs_bar = _cotangent_init(body, consts, xs, keep, sums)
    if tables.length == 0:
        return consts_bar, list(carry_bar), xs_bar
    steps = StepRunner(
        body, consts, xs, ys_bar, ymask, keep, bool(axes), sums, kept if snaps is not None else None
    )
    ns = sum(body.stored)

    def sweep(snaps, off=None, lead=False):
        steps.off = off
        if off is not None:  # the stored snapshots are batched as u_{N-1} is
            off.tags = tags_of(snaps[ns : 2 * ns])
        rows = []
        if tables.data_rows:  # zeros, or the forward's (its lead leaf's data)
            rows = steps.data_rows(tables.data_rows, [*carry_bar, *carry0], tables, snaps[:ns])
            rows = snaps[2 * ns :] if lead else rows
        kbar, cbar, xbar = reverse(
            steps,
            source_for(tables, after_lead=lead),
            snaps[ns : 2 * ns],
            snaps[:ns],
            carry_bar,
            consts_bar,
            xs_bar,
            rows,
            first=jnp.asarray(tables.lead_action()) if lead else None,
        )
        if off is not None:  # the last read of the store: release it
            off.close()
        return cbar, kbar, xbar

    lead = tables.lead is not None and (snaps is None or kept is not None)
    if snaps is not None:
        snaps = list(snaps)
        if tables.offload is None:
            return sweep(snaps, lead=lead)
        return sweep(snaps[:-1], Offload(tables.offload, snaps[-1]))

    def own():
        rows = zeros_after(body.snapshot_avals, (_pool.rows(body, tables),), [*carry_bar, *carry0])
        off = Offload.open(tables.offload) if tables.offload is not None else None
        # the lead leaf's data, linearized in the leaves this sweep differentiates
        data = _pool.lead(body, tables, steps._masks(), steps.batched) if lead else None
        _, _, own_snaps = forward(
            body,
            tables.length,
            consts,
            carry0,
            xs,
            tables,
            ys=False,
            slots=rows,
            batched=bool(axes),
            off=off,
            lead=data,
        )
        return sweep(own_snaps, off, lead)

    def zero():
        return consts_bar, [jnp.zeros_like(k) for k in carry_bar], xs_bar

    return confined([*carry_bar, *ys_bar], own, zero, axes)


def adjoint_while(
    body: Body,
    n_slots: int,
    max_steps,
    n_steps,
    consts,
    carry0,
    ck,
    carry_bar,
    keep=None,
    axes=(),
    layout=None,
    rule: machine.Rule = machine.REVOLVE,
    sums=None,
):
    """Reverse ``n_steps`` steps of a body without per-step inputs or outputs.

    From ``ck = (slots, held)`` (the forward sweep's snapshots) or, with ``ck is None``, after
    replaying the forward sweep's placement. The segments between held snapshots are reversed by
    the in-graph binomial machine, by ``rule`` (which may make ``DATA`` leaves). Returns
    cotangents of float consts and carry leaves.

    With a two-level ``layout`` (``Online(n_slots, slow=...)``) the held snapshots are in a store
    (``ck = ([handle, *tags], held)``): each segment's start is restored from it into one of the
    ``n_slots`` device slots, which reverse the segment (:class:`._offload.Segments`).
    """
    consts_bar, _ = _cotangent_init(body, consts, [], keep, sums)
    steps = StepRunner(body, consts, [], [], (), keep, bool(axes), sums)

    def sweep_offloaded(handle, held, tags):
        steps.off = Offload(layout, handle, tags)
        rows = zeros_after(body.snapshot_avals, (n_slots,), [*carry_bar, *carry0])
        kbar, cbar, _ = reverse(
            steps,
            Segments(n_slots, held, n_steps),
            body.snapshot(carry0),
            rows,
            carry_bar,
            consts_bar,
            [],
            n_steps=n_steps,
        )
        steps.off.close()  # the last read of the store: release it
        return cbar, kbar

    # A rule that takes slots lowest first keeps its data in the free snapshot rows (_pool)
    # once the held snapshots are moved to rows 0, 1, ... in step order.
    pooled = rule.pooled is not None and rule.data_rows(n_slots) > 0

    def sweep(slots, held):
        if pooled:
            slots, held = _pool.held_first(slots, held)

        def ascending():
            if pooled:
                return held, jnp.arange(n_slots, dtype=i32), jnp.sum(held >= 0, dtype=i32)
            order = machine.argsort(jnp.where(held < 0, jnp.iinfo(jnp.int32).max, held))
            return held[order], order, jnp.sum(held >= 0, dtype=i32)

        source = BinomialSource(
            n_slots, ascending, n_steps, at_hand=False, with_pairs=True, rule=rule
        )
        data = []
        if source.with_data:
            deps = [*carry_bar, *carry0]
            if pooled:
                plan = _pool.MachinePlan(n_slots, rule)
                data = steps.data_rows(plan.data_rows, deps, plan, slots)
            else:
                data = steps.data_rows(rule.data_rows(n_slots), deps)
        kbar, cbar, _ = reverse(
            steps, source, body.snapshot(carry0), slots, carry_bar, consts_bar, [], data, n_steps
        )
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
        state: tuple = (body.snapshot(carry0), [], jnp.full((layout.n_offloaded,), -1, i32))
        state = lax.fori_loop(
            0,
            n_steps,
            replay(lambda n, snap, slots, held: place_thinned(n, snap, slots, held, off=off)),
            state,
        )
        return sweep_offloaded(off.handle, state[2], tags_of(state[0]))

    def own():
        state = (
            body.snapshot(carry0),
            zeros_after(body.snapshot_avals, (n_slots,), [*carry_bar, *carry0]),
            jnp.full((n_slots,), -1, i32),
        )
        start: int | jax.Array = 0
        for place, stop in online_phases(n_slots, max_steps):
            end = n_steps if stop is None else jnp.minimum(n_steps, stop)
            state = lax.fori_loop(start, end, replay(place), state)
            start = end
        return sweep(state[1], state[2])

    def zero():
        return consts_bar, [jnp.zeros_like(k) for k in carry_bar]

    return confined(list(carry_bar), own if layout is None else own_offloaded, zero, axes)
