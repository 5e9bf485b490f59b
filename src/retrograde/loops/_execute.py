"""The compiled programs behind the primitives: forward sweep, and schedule-driven adjoint.

Everything here is traced inside a primitive's lowering, so it only uses ``jax.lax``. Costs, for a
loop of ``N`` steps and a schedule with ``t`` plain evaluations and ``S`` device slots:

- :func:`forward`: ``N`` plain evaluations; memory: the carry, the ``ys`` (``O(N)`` by nature)
  and, with ``save``, ``S`` snapshots plus the state ``u_{N-1}``.
- :func:`adjoint`: from saved snapshots ``t - (N - 1)`` plain and ``N`` recorded evaluations,
  otherwise ``t`` plain and ``N`` recorded; memory: ``S`` snapshots, the carry and its cotangent,
  one step's VJP working set, and the cotangents of ``xs`` (``O(N)`` by nature, only if ``xs``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._body import Body, is_float
from ._machine import P_DONE, init_state
from ._machine import phase as machine_phase
from ._machine import step as machine_step
from ._placement import store_slot
from ._plan import ADVANCE, RECORD, RESTORE, STORE, Plan


def _slice(xs, n):
    return [lax.dynamic_index_in_dim(x, n, 0, keepdims=False) for x in xs]


def _put(buffers, values, n):
    return [lax.dynamic_update_index_in_dim(b, v, n, 0) for b, v in zip(buffers, values)]


def _zeros(avals, lead=()):
    return [jnp.zeros(lead + tuple(a.shape), a.dtype) for a in avals]


def _zeros_after(avals, lead, deps):
    """Zeros that XLA cannot allocate before ``deps`` exist (see :func:`_confined`).

    The zeros are tied to one element of every dependency: a single one may be a constant (a
    symbolic zero cotangent made concrete), which XLA folds.
    """
    leaves = [d for d in deps if d.size]
    if not leaves:
        return _zeros(avals, lead)
    dep = sum(jnp.real(d.ravel()[0]).astype(jnp.float32) for d in leaves) * 0
    return [jnp.broadcast_to(dep.astype(a.dtype), lead + tuple(a.shape)) for a in avals]


def _confined(seeds, sweep, zero):
    """Run ``sweep()`` inside a conditional on "some seed is nonzero", else return ``zero()``.

    A reverse sweep that lays its own snapshots allocates its slots inside the conditional's
    branch, so XLA keeps them alive only while that sweep runs. Without it, the slots of
    independent sweeps (as in higher derivatives) are all allocated up front and live at once.
    Skipping a sweep whose cotangent seeds are all zero is exact: the adjoint is linear in them.
    """
    live = [jnp.any(s != 0) for s in seeds if s.size]
    if not live:
        return zero()
    pred = live[0]
    for p in live[1:]:
        pred = pred | p
    return lax.cond(pred, sweep, zero)


def forward(body: Body, plan: Plan, consts, carry, xs, save: bool):
    """Run all ``N`` steps. Returns ``(carry_N, ys, slots, cur)``; ``slots`` holds the first
    sweep's snapshots and ``cur`` is ``u_{N-1}`` (both empty lists unless ``save``)."""
    n = plan.length
    ys = _zeros(body.y_avals, (n,))
    slots = _zeros(body.snapshot_avals, (plan.n_slots,)) if save else []
    if n == 0:
        return list(carry), ys, slots, (list(carry) if save else [])
    steps = jnp.asarray(list(plan.store_steps) + [n], jnp.int32)
    where = jnp.asarray(list(plan.store_slots) + [0], jnp.int32)

    def one(i, state):
        carry, ys, slots, ptr = state
        if save:
            hit = steps[ptr] == i
            slots = lax.cond(
                hit, lambda s: _put(s, body.snapshot(carry), where[ptr]), lambda s: list(s), slots
            )
            ptr = ptr + hit.astype(jnp.int32)
        new, y = body(consts, carry, _slice(xs, i))
        return new, _put(ys, y, i), slots, ptr

    state = (list(carry), ys, slots, jnp.int32(0))
    state = lax.fori_loop(0, n - 1, one, state)
    cur = list(state[0]) if save else []
    carry, ys, slots, _ = one(n - 1, state)
    return carry, ys, slots, cur


def _advance(body: Body, consts, xs, cur, a, b):
    return lax.fori_loop(a, b, lambda i, c: body(consts, c, _slice(xs, i))[0], cur)


def _differentiated(body, keep):
    """Which consts and xs leaves get cotangents: ``(fc, fx)``, the float leaves selected by
    ``keep = (cmask, xmask)`` (masks over the float leaves; ``None`` selects them all)."""

    def masked(avals, mask):
        fl = [is_float(a) for a in avals]
        if mask is None:
            return fl
        it = iter(mask)
        return [f and next(it) for f in fl]

    cmask, xmask = keep if keep is not None else (None, None)
    return masked(body.const_avals, cmask), masked(body.x_avals, xmask)


class _Reverse:
    """The two kinds of work of a reverse sweep, on the snapshot leaves of the state only.

    ``cur`` holds the carry leaves that snapshots hold; write-only buffer leaves (``body.stored``
    False) are fed to the step as fixed zeros, since nothing the step computes depends on them, so
    recomputation never carries (or writes) them.

    - :meth:`move` executes one non-recording action row: advance (a zero-trip loop unless the
      row advances), then store and restore, each under a two-way cond that leaves the slots or
      the state untouched when the row is something else (a many-way switch would make XLA keep a
      second copy of the slots). Any other opcode is a no-op. The cotangents are not operands.
    - :meth:`record` is the VJP of one step, run unconditionally: sweeps are organised as one
      iteration per recorded step (the moves before it, then the record), so the carry and
      parameter cotangents never pass through a conditional (a cond's untaken branch would copy
      them, every action).
    """

    def __init__(self, body: Body, consts, xs, ys_bar, ymask, keep=None):
        self.body, self.consts, self.xs = body, consts, xs
        self.fc, self.fx = _differentiated(body, keep)
        self.fk = [is_float(a) for a in body.carry_avals]
        self.fy = [is_float(a) for a in body.y_avals]
        self.y_avals_f = [a for a, f in zip(body.y_avals, self.fy) if f]
        ybar_of = iter(ys_bar)
        self.ybar_full = [next(ybar_of) if m else None for m in ymask]
        # Buffer leaves: zeros that are never carried (placeholders for the snapshot leaves).
        self.filler = [
            None if keep_ else jnp.zeros(a.shape, a.dtype)
            for a, keep_ in zip(body.carry_avals, body.stored)
        ]

    def full(self, cur):
        """The step's carry from the snapshot leaves ``cur``."""
        return self.body.restore(self.filler, cur)

    def step(self, cur, i):
        return self.body.snapshot(self.body(self.consts, self.full(cur), _slice(self.xs, i))[0])

    def advance(self, cur, a, b):
        return lax.fori_loop(a, b, lambda i, c: self.step(c, i), list(cur))

    def move(self, op, a, b, cur, slots):
        is_adv = op == ADVANCE
        cur = self.advance(cur, jnp.where(is_adv, a, 0), jnp.where(is_adv, b, 0))
        slots = lax.cond(op == STORE, lambda s: _put(s, cur, b), lambda s: list(s), slots)
        cur = lax.cond(op == RESTORE, lambda c: _slice(slots, b), lambda c: list(c), cur)
        return cur, slots

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
            k_new, y = self.body(merge(c_f, consts, fc), merge(k_f, full, fk), merge(x_f, x, fx))
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


def _by_record(rows):
    """Group an action table by recorded step: ``(moves, starts, steps)`` where the moves before
    the ``k``-th record are ``moves[starts[k]:starts[k + 1]]`` and it records step ``steps[k]``.
    Rows after the last record (none in a valid reversal) are dropped."""
    rows = np.asarray(rows, np.int32).reshape(-1, 3)
    is_rec = rows[:, 0] == RECORD
    moves = rows[~is_rec]
    # Moves before each record: the count of non-record rows preceding it.
    before = np.cumsum(~is_rec)[is_rec] if is_rec.any() else np.zeros(0, np.int64)
    starts = np.concatenate([[0], before]).astype(np.int32)
    if moves.shape[0] == 0:
        moves = np.zeros((1, 3), np.int32)
        moves[0, 0] = -1
    return moves, starts, rows[is_rec, 1].astype(np.int32)


def _cotangent_init(body, consts, xs, keep=None):
    fc, fx = _differentiated(body, keep)
    consts_bar = [jnp.zeros_like(c) for c, f in zip(consts, fc) if f]
    xs_bar = [jnp.zeros_like(x) for x, f in zip(xs, fx) if f]
    return consts_bar, xs_bar


def adjoint(body: Body, plan: Plan, consts, carry0, xs, ck, carry_bar, ys_bar, ymask,
            keep=None):
    """Execute the schedule's reverse sweep (from ``ck = (slots, cur)``) or its whole stream
    (``ck is None``), and return the cotangents of the float leaves of consts, carry_0 and xs.

    ``carry_bar`` holds one cotangent per float carry leaf; ``ys_bar`` one per float ``y`` leaf
    whose ``ymask`` entry is True (the others are zero and never materialised). ``keep = (cmask,
    xmask)`` selects the float consts and xs leaves whose cotangents are wanted (``None``: all);
    the others are held constant, so their cotangents cost neither time nor memory.
    """
    consts_bar, xs_bar = _cotangent_init(body, consts, xs, keep)
    if plan.length == 0:
        return consts_bar, list(carry_bar), xs_bar
    rev = _Reverse(body, consts, xs, ys_bar, ymask, keep)

    def sweep(rows, slots, cur):
        moves, starts, steps = (jnp.asarray(t) for t in _by_record(rows))

        def one_record(k, state):
            cur, slots, kbar, cbar, xbar = state

            def move(r, cs):
                return rev.move(moves[r, 0], moves[r, 1], moves[r, 2], *cs)

            cur, slots = lax.fori_loop(starts[k], starts[k + 1], move, (cur, slots))
            kbar, cbar, xbar = rev.record(steps[k], cur, kbar, cbar, xbar)
            return cur, slots, kbar, cbar, xbar

        state = (cur, slots, list(carry_bar), consts_bar, xs_bar)
        _, _, kbar, cbar, xbar = lax.fori_loop(0, steps.shape[0], one_record, state)
        return cbar, kbar, xbar

    if ck is not None:
        return sweep(plan.rows[plan.first_record :], list(ck[0]), body.snapshot(ck[1]))

    def own():
        slots = _zeros_after(body.snapshot_avals, (plan.n_slots,), [*carry_bar, *carry0])
        return sweep(plan.rows, slots, body.snapshot(carry0))

    def zero():
        return consts_bar, [jnp.zeros_like(k) for k in carry_bar], xs_bar

    return _confined([*carry_bar, *ys_bar], own, zero)


# ----------------------------------------------------------------------------- unknown length


def forward_while(body: Body, cond: Body, n_slots: int, max_steps, consts, carry, save: bool):
    """Run ``while cond(carry) and n < max_steps: carry = body(carry)``; with ``save``, place
    snapshots by the ``Online`` rule as steps arrive. Returns ``(carry_N, N, slots, held)``."""
    held = jnp.full((n_slots,), -1, jnp.int32)
    slots = _zeros(body.snapshot_avals, (n_slots,)) if save else []
    limit = jnp.iinfo(jnp.int32).max if max_steps is None else max_steps

    def go(state):
        n, carry, _, _ = state
        _, (ok,) = cond(consts, [], carry)
        return ok & (n < limit)

    def one(state):
        n, carry, slots, held = state
        if save:
            slots, held = _place(n, body.snapshot(carry), slots, held, n_slots)
        carry, _ = body(consts, carry, [])
        return n + 1, carry, slots, held

    n, carry, slots, held = lax.while_loop(go, one, (jnp.int32(0), list(carry), slots, held))
    return carry, n, slots, held


def _place(n, snap, slots, held, n_slots):
    k = store_slot(n, held, n_slots)
    slots = lax.cond(k >= 0, lambda s: _put(s, snap, k), lambda s: list(s), slots)
    held = jnp.where(k >= 0, held.at[jnp.maximum(k, 0)].set(n), held)
    return slots, held


def advance_steps(body: Body, consts, carry, n_steps):
    """``n_steps`` plain steps of a body without per-step inputs (traced count)."""
    return _advance(body, consts, [], list(carry), 0, n_steps)


def adjoint_while(body: Body, n_slots: int, n_steps, consts, carry0, ck, carry_bar,
                  keep=None):
    """Reverse ``n_steps`` steps of a body without per-step inputs or outputs.

    From ``ck = (slots, held)`` (the forward sweep's snapshots) or, with ``ck is None``, after
    replaying the forward sweep's placement. Segments between held snapshots are reversed right to
    left by the in-graph binomial machine: one iteration per recorded step, which runs the
    machine's actions up to the next record, then the record (see :class:`_Reverse`). Returns
    cotangents of float consts and carry leaves.
    """
    consts_bar, _ = _cotangent_init(body, consts, [], keep)
    rev = _Reverse(body, consts, [], [], (), keep)

    def sweep(slots, held):
        order = jnp.argsort(jnp.where(held < 0, jnp.iinfo(jnp.int32).max, held)).astype(jnp.int32)
        starts = held[order]
        n_seg = jnp.sum(held >= 0).astype(jnp.int32)
        machine = init_state(n_slots, starts, order, n_seg, n_steps, False)

        def pending(s):
            m, (op, _, _), _, _ = s
            return (op != RECORD) & (machine_phase(m) != P_DONE)

        def move(s):
            m, (op, a, b), cur, slots = s
            cur, slots = rev.move(op, a, b, cur, slots)
            m, action = machine_step(m)
            return m, action, cur, slots

        def one_record(_, state):
            m, action, cur, slots, kbar, cbar = state
            m, action, cur, slots = lax.while_loop(pending, move, (m, action, cur, slots))
            # A record with b > 0 takes its state from slot b - 1 (restore and record at once).
            _, a, b = action
            cur = lax.cond(b > 0, lambda c: _slice(slots, b - 1), lambda c: list(c), cur)
            kbar, cbar, _ = rev.record(a, cur, kbar, cbar, [])
            m, action = machine_step(m)
            return m, action, cur, slots, kbar, cbar

        m, action = machine_step(machine)
        state = (m, action, body.snapshot(carry0), slots, list(carry_bar), consts_bar)
        *_, kbar, cbar = lax.fori_loop(0, n_steps, one_record, state)
        return cbar, kbar

    if ck is not None:
        return sweep(list(ck[0]), ck[1])

    def own():
        def replay(n, state):
            cur, slots, held = state
            slots, held = _place(n, cur, slots, held, n_slots)
            return rev.step(cur, n), slots, held

        init = (body.snapshot(carry0),
                _zeros_after(body.snapshot_avals, (n_slots,), [*carry_bar, *carry0]),
                jnp.full((n_slots,), -1, jnp.int32))
        _, slots, held = lax.fori_loop(0, n_steps, replay, init)
        return sweep(slots, held)

    def zero():
        return consts_bar, [jnp.zeros_like(k) for k in carry_bar]

    return _confined(list(carry_bar), own, zero)
