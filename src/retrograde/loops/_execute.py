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
from jax import lax

from ._body import Body, is_float
from ._machine import P_DONE, init_state
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


def _row_runner(body, consts, xs, ys_bar, ymask, keep=None):
    """The function ``(op, a, b, state) -> state`` that executes one action row.

    ``state = (cur, slots, kbar, cbar, xbar)``. Each row runs as: advance (a zero-trip loop unless
    the row advances), then store and restore, each under a two-way cond that leaves the slots or
    the carry untouched when the row is something else (a many-way switch would make XLA keep a
    second copy of the slots), then record under a two-way cond whose operands are only the carry
    and the cotangents: the slots and the ``xs`` cotangent stay outside it (this step's ``xs``
    cotangent is written after it). Any other opcode is a no-op.
    """
    fc, fx = _differentiated(body, keep)
    fk = [is_float(a) for a in body.carry_avals]
    fy = [is_float(a) for a in body.y_avals]
    y_avals_f = [a for a, f in zip(body.y_avals, fy) if f]
    ybar_of = iter(ys_bar)
    ybar_full = [next(ybar_of) if m else None for m in ymask]

    def merge(float_vals, all_vals, flags):
        it = iter(float_vals)
        return [next(it) if f else v for v, f in zip(all_vals, flags)]

    def record(i, cur, kbar, cbar):
        """One recorded step: the VJP of step ``i`` at ``cur``. Returns the new carry cotangent,
        the accumulated consts cotangent and this step's ``xs`` cotangent."""
        x = _slice(xs, i)
        ybar_i = [
            lax.dynamic_index_in_dim(yb, i, 0, keepdims=False) if yb is not None
            else jnp.zeros(a.shape, a.dtype)
            for yb, a in zip(ybar_full, y_avals_f)
        ]

        def f(c_f, k_f, x_f):
            k_new, y = body(merge(c_f, consts, fc), merge(k_f, cur, fk), merge(x_f, x, fx))
            return (
                [v for v, f in zip(k_new, fk) if f],
                [v for v, f in zip(y, fy) if f],
            )

        c_f = [c for c, f in zip(consts, fc) if f]
        k_f = [c for c, f in zip(cur, fk) if f]
        x_f = [v for v, f in zip(x, fx) if f]
        _, pullback = jax.vjp(f, c_f, k_f, x_f)
        dc, dk, dx = pullback((list(kbar), ybar_i))
        return list(dk), [a + b for a, b in zip(cbar, dc)], list(dx)

    def skip(i, cur, kbar, cbar):
        x_f = [v for v, f in zip(_slice(xs, i), fx) if f]
        return list(kbar), list(cbar), [jnp.zeros_like(v) for v in x_f]

    def run(op, a, b, state):
        cur, slots, kbar, cbar, xbar = state
        is_adv = op == ADVANCE
        cur = _advance(body, consts, xs, cur, jnp.where(is_adv, a, 0), jnp.where(is_adv, b, 0))
        slots = lax.cond(
            op == STORE, lambda s: _put(s, body.snapshot(cur), b), lambda s: list(s), slots
        )
        cur = lax.cond(
            op == RESTORE, lambda c: body.restore(c, _slice(slots, b)), lambda c: list(c), cur
        )
        i = jnp.where(op == RECORD, a, 0)
        kbar, cbar, dx = lax.cond(op == RECORD, record, skip, i, cur, kbar, cbar)
        if xbar:
            old = _slice(xbar, i)
            xbar = _put(xbar, [jnp.where(op == RECORD, d, o) for d, o in zip(dx, old)], i)
        return cur, slots, kbar, cbar, xbar

    return run


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
    run = _row_runner(body, consts, xs, ys_bar, ymask, keep)

    def sweep(rows, slots, cur):
        table = jnp.asarray(rows, jnp.int32)

        def loop(r, state):
            return run(table[r, 0], table[r, 1], table[r, 2], state)

        state = (cur, slots, list(carry_bar), consts_bar, xs_bar)
        _, _, kbar, cbar, xbar = lax.fori_loop(0, table.shape[0], loop, state)
        return cbar, kbar, xbar

    if ck is not None:
        return sweep(plan.rows[plan.first_record :], list(ck[0]), list(ck[1]))

    def own():
        slots = _zeros_after(body.snapshot_avals, (plan.n_slots,), [*carry_bar, *carry0])
        return sweep(plan.rows, slots, list(carry0))

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
    left by the in-graph binomial machine. Returns cotangents of float consts and carry leaves.
    """
    consts_bar, _ = _cotangent_init(body, consts, [], keep)
    run = _row_runner(body, consts, [], [], (), keep)

    def sweep(slots, held):
        order = jnp.argsort(jnp.where(held < 0, jnp.iinfo(jnp.int32).max, held)).astype(jnp.int32)
        starts = held[order]
        n_seg = jnp.sum(held >= 0).astype(jnp.int32)
        machine = init_state(n_slots, starts, order, n_seg, n_steps, False)

        def go(state):
            return state[0]["phase"] != P_DONE

        def one(state):
            m, rows_state = state
            m, (op, a, b) = machine_step(m)
            return m, run(op, a, b, rows_state)

        state = (list(carry0), slots, list(carry_bar), consts_bar, [])
        _, (_, _, kbar, cbar, _) = lax.while_loop(go, one, (machine, state))
        return cbar, kbar

    if ck is not None:
        return sweep(list(ck[0]), ck[1])

    def own():
        def replay(n, state):
            carry, slots, held = state
            slots, held = _place(n, body.snapshot(carry), slots, held, n_slots)
            return body(consts, carry, [])[0], slots, held

        init = (list(carry0), _zeros_after(body.snapshot_avals, (n_slots,), [*carry_bar, *carry0]),
                jnp.full((n_slots,), -1, jnp.int32))
        _, slots, held = lax.fori_loop(0, n_steps, replay, init)
        return sweep(slots, held)

    def zero():
        return consts_bar, [jnp.zeros_like(k) for k in carry_bar]

    return _confined(list(carry_bar), own, zero)
