"""Where the reverse sweep's per-step time goes: ablations behind docs/performance.md.

The loop of ``benchmarks/overhead.py``'s ``long`` case: ``N = 10000`` steps of
``u + 0.01 * tanh(theta * u)``, 256 float32, gradient in ``theta``. Everything is timed as
per-iteration CPU time of the process (``time.process_time``, minimum over the repeats; the wall
minimum is shown too): on a shared machine CPU time is far less noisy than wall time. Tables:

1. XLA CPU control flow, per iteration of a 100,000-trip ``fori_loop`` whose body is one step:
   a conditional, a select, a zero- and a one-trip nested loop, a 4-way switch, table reads; and
   the same loop with ``k`` independent 256-float carries (``k`` fusions), which shows the
   executor's cliff: a loop body of more than 8 thunks (kernels, copies, nested loops,
   conditionals) using any buffer over 512 bytes is run by XLA's concurrent thunk executor
   instead of in sequence (``xla/backends/cpu/runtime/thunk_executor.h``).
2. Gradients and reverse sweeps, per step: ``lax.scan``'s gradient and backward sweep, the nested
   sqrt(N) remat's gradient;
   hand-written ``fori_loop`` sweeps reading stored states (the ideal ``StoreAll`` sweep), with
   a carried state restored by a select, and with ``retrograde``'s structure (an inner loop of
   action rows per record: zero-trip advance, conditional store, conditional restore);
   ``retrograde.scan``'s gradient and reverse sweep (``jax.vjp`` split) with ``StoreAll`` and
   ``Revolve(16)``; and a prototype executor that runs each record as "restore, one loop
   advancing to the recorded step while storing, VJP" from tables built from the public action
   stream (``schedule.actions(N)``).

    python benchmarks/profile_reverse.py           # ~1-2 minutes
    python benchmarks/profile_reverse.py --quick   # fewer repeats
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import retrograde
from retrograde.schedules import Advance, Record, Restore, Revolve, Store, StoreAll

from _common import nested_remat, nested_shape, prepare, print_table

N, C = 10_000, 256
ITERS = 100_000  # iterations of the control-flow loops


def time_cpu(fns, repeats):
    """Name -> (cpu min, wall min) seconds of each ``(fn, args)``, compiled first, then called in
    turn."""
    compiled = {k: (prepare(f, *a)[0], a) for k, (f, a) in fns.items()}
    cpu = {k: [] for k in fns}
    wall = {k: [] for k in fns}
    for _ in range(repeats):
        for k, (c, a) in compiled.items():
            t0, p0 = time.perf_counter(), time.process_time()
            jax.block_until_ready(c(*a))
            cpu[k].append(time.process_time() - p0)
            wall[k].append(time.perf_counter() - t0)
    return {k: (min(cpu[k]), min(wall[k])) for k in fns}


def step(t, u):
    return u + 0.01 * jnp.tanh(t * u)


def get(x, i):
    return lax.dynamic_index_in_dim(x, i, 0, keepdims=False)


def put(x, v, i):
    return lax.dynamic_update_index_in_dim(x, v, i, 0)


# ------------------------------------------------------------------------------ 1. control flow
def control_flow(repeats, markdown):
    rng = np.random.default_rng(0)
    tab = jnp.asarray(rng.integers(0, 4, ITERS), jnp.int32)
    slots = jnp.asarray(rng.standard_normal((16, C)), jnp.float32)
    u0 = jnp.ones(C, jnp.float32)

    def loop(body):
        return lambda x: lax.fori_loop(0, ITERS, body, u0 + x)

    def one_step(i, u):
        return u + 0.01 * jnp.tanh(u)

    variants = {
        "one step (baseline)": one_step,
        "+ table read": lambda i, u: one_step(i, u) + tab[i],
        "+ select": lambda i, u: jnp.where(tab[i] == 2, 0.999 * one_step(i, u), one_step(i, u)),
        "+ conditional": lambda i, u: lax.cond(
            tab[i] == 2, lambda v: 0.999 * v, lambda v: v, one_step(i, u)
        ),
        "+ conditional restore from slots": lambda i, u: lax.cond(
            tab[i] == 2, lambda v: get(slots, tab[i] % 16), lambda v: v, one_step(i, u)
        ),
        "+ zero-trip nested loop": lambda i, u: lax.fori_loop(
            0, jnp.where(tab[i] == 9, 1, 0), lambda j, v: 0.5 * v, one_step(i, u)
        ),
        "step inside a one-trip nested loop": lambda i, u: lax.fori_loop(
            0, jnp.where(tab[i] == 9, 2, 1), one_step, u
        ),
        "+ 4-way switch": lambda i, u: lax.switch(
            tab[i],
            [lambda v: v, lambda v: 0.5 * v, lambda v: 0.25 * v, lambda v: -v],
            one_step(i, u),
        ),
    }
    fns = {k: (loop(b), (jnp.float32(0),)) for k, b in variants.items()}

    def carries(k, size):
        def f(x):
            us = tuple(jnp.full(size, 0.1 * (i + 1), jnp.float32) + x for i in range(k))
            return lax.fori_loop(
                0, ITERS // 5, lambda i, us: tuple(u + 0.01 * jnp.tanh(u) for u in us), us
            )

        return f

    for size in (64, 256):
        for k in (6, 7, 8, 9):
            fns[f"{k} independent steps of {size} f32"] = (carries(k, size), (jnp.float32(0),))
    res = time_cpu(fns, repeats)
    rows = []
    base = res["one step (baseline)"][0]
    for k, (cpu, wall) in res.items():
        iters = ITERS // 5 if "independent" in k else ITERS
        extra = "" if "independent" in k else f"{(cpu - base) / ITERS * 1e6:+.3f}"
        rows.append([k, f"{cpu / iters * 1e6:.3f}", f"{wall / iters * 1e6:.3f}", extra])
    print_table(
        f"1. XLA CPU loop bodies: us per iteration (CPU time, min of {repeats})",
        ["loop body", "cpu us", "wall us", "vs baseline"],
        rows,
        markdown,
    )


# ------------------------------------------------------------------------------ 2. reverse sweeps
def tables(schedule):
    """Per record (in order): restore slot (-1: none) and packed advance ``[a, b)`` with the
    stores made on the way (``sptr`` into ``(sstep, sslot)``), from the public action stream;
    and the forward sweep's store points. ``u_{N-1}`` is at hand when the reverse part starts."""
    acts = [a for a in schedule.actions(N) if type(a) in (Advance, Store, Restore, Record)]
    first = next(i for i, a in enumerate(acts) if type(a) is Record)
    fwd = [(a.step, a.slot) for a in acts[:first] if type(a) is Store] + [(N, 0)]
    n_slots = 1 + max(a.slot for a in acts if type(a) in (Store, Restore))
    rest, lo, hi, sptr, stores = [], [], [], [0], []
    at, r, a = N - 1, -1, N - 1
    for act in acts[first:]:
        if type(act) is Restore:
            r, at, a = act.slot, act.step, act.step
        elif type(act) is Advance:
            assert act.start == at, act
            at = act.stop
        elif type(act) is Store:
            assert act.step == at, act
            stores.append((act.step, act.slot))
        else:
            assert act.step == at, act
            rest.append(r), lo.append(a), hi.append(at), sptr.append(len(stores))
            r, a = -1, at
    stores.append((N + 1, 0))
    i32 = lambda x: jnp.asarray(np.asarray(x, np.int32))
    return dict(
        n_slots=n_slots,
        fwd=i32(fwd),
        rest=i32(rest),
        lo=i32(lo),
        hi=i32(hi),
        sptr=i32(sptr),
        stores=i32(stores),
        n_rec=len(rest),
    )


def storing_step(t, stores):
    """Loop body ``(j, (u, slots, p))``: store ``u`` where ``stores[p] == (j, slot)`` (a guarded
    in-place write, no conditional) and move ``p`` on, then take the step."""

    def body(j, c):
        u, slots, p = c
        hit = stores[p, 0] == j
        q = stores[p, 1]
        slots = put(slots, jnp.where(hit, u, get(slots, q)), q)
        return step(t, u), slots, p + hit.astype(jnp.int32)

    return body


def proto_forward(T, t, u):
    """The first sweep: N - 1 steps, storing where the schedule says."""
    slots = jnp.zeros((T["n_slots"], C), jnp.float32)
    return lax.fori_loop(0, N - 1, storing_step(t, T["fwd"]), (u, slots, jnp.int32(0)))[:2]


def proto_reverse(T, t, slots, cur, ubar, unroll=1):
    """One iteration per record: restore (if any), one loop advancing to the recorded step and
    storing on the way, the VJP."""

    def one(k, c):
        cur, slots, ubar, tbar = c
        r = T["rest"][k]
        cur = jnp.where(r >= 0, get(slots, jnp.maximum(r, 0)), cur)
        cur, slots, _ = lax.fori_loop(
            T["lo"][k], T["hi"][k], storing_step(t, T["stores"]), (cur, slots, T["sptr"][k])
        )
        dt, ubar = jax.vjp(step, t, cur)[1](ubar)
        return cur, slots, ubar, tbar + dt

    init = (cur, slots, ubar, jnp.float32(0))
    return lax.fori_loop(0, T["n_rec"], one, init, unroll=unroll)[2:]


def reverse_sweeps(repeats, markdown):
    th = jnp.float32(0.7)
    u0 = jnp.asarray(np.linspace(-2.0, 2.0, C, dtype=np.float32))
    states = jax.jit(lambda t, u: lax.scan(lambda u, _: (step(t, u), u), u, length=N)[1])(th, u0)
    ubar = jnp.full(C, 1.0 / C, jnp.float32)
    rev_idx = jnp.asarray(np.arange(N)[::-1].copy(), jnp.int32)
    ops = jnp.asarray(np.r_[np.full(N - 1, 2), 3], jnp.int32)  # RESTORE rows (not a splat)

    def rec(t, u, ubar, tbar):
        dt, du = jax.vjp(step, t, u)[1](ubar)
        return du, tbar + dt

    def ideal(t, U, ubar):
        return lax.fori_loop(
            0, N, lambda k, c: rec(t, get(U, rev_idx[k]), *c), (ubar, jnp.float32(0))
        )

    def restored(t, U, ubar):
        def body(k, c):
            cur = jnp.where(ops[k] == 2, get(U, rev_idx[k]), c[0])
            return (cur, *rec(t, cur, *c[1:]))

        return lax.fori_loop(0, N, body, (u0, ubar, jnp.float32(0)))[1:]

    def moves(t, U, ubar):
        """retrograde's structure: per record an inner loop over its action rows (here one
        RESTORE), each row a zero-trip advance, a conditional store and a conditional restore."""

        def body(k, c):
            cur, slots, ubar, tbar = c

            def move(r, cs):
                cur, slots = cs
                cur = lax.fori_loop(0, jnp.where(ops[r] == 0, 1, 0), lambda i, v: step(t, v), cur)
                slots = lax.cond(ops[r] == 1, lambda s: put(s, cur, rev_idx[r]), lambda s: s, slots)
                cur = lax.cond(ops[r] == 2, lambda v: get(slots, rev_idx[r]), lambda v: v, cur)
                return cur, slots

            cur, slots = lax.fori_loop(k, k + 1, move, (cur, slots))
            return (cur, slots, *rec(t, cur, ubar, tbar))

        return lax.fori_loop(0, N, body, (u0, U, ubar, jnp.float32(0)))[2:]

    def split(loss):
        _, vjp_fn = jax.jit(lambda t, u: jax.vjp(loss, t, u))(th, u0)
        return lambda v: v(jnp.float32(1.0)), (vjp_fn,)

    def lax_loss(t, u):
        return jnp.mean(lax.scan(lambda u, _: (step(t, u), None), u, length=N)[0] ** 2)

    def retro_loss(schedule):
        return lambda t, u: jnp.mean(
            retrograde.scan(lambda u, _: (step(t, u), None), u, length=N, schedule=schedule)[0] ** 2
        )

    fns = {
        "lax.scan gradient (forward and backward)": (jax.grad(lax_loss), (th, u0)),
        "lax.scan backward (stored residuals)": split(lax_loss),
        "nested remat ({} x {}) gradient".format(*nested_shape(N)): (
            jax.grad(
                lambda t, u: jnp.mean(nested_remat(lambda v, _: (step(t, v), None), u, N) ** 2)
            ),
            (th, u0),
        ),
        "fori: VJP at states[idx[k]]": (ideal, (th, states, ubar)),
        "fori: carried state, restored by select": (restored, (th, states, ubar)),
        "fori: + inner loop of 1 row (advance, cond store, cond restore)": (
            moves,
            (th, states, ubar),
        ),
    }
    for name, schedule in (("StoreAll()", StoreAll()), ("Revolve(16)", Revolve(16))):
        T = tables(schedule)
        u_last, slots = jax.jit(lambda t, u, T=T: proto_forward(T, t, u))(th, u0)
        fns[f"retrograde.scan {name} gradient"] = (jax.grad(retro_loss(schedule)), (th, u0))
        fns[f"retrograde.scan {name} backward"] = split(retro_loss(schedule))
        for unroll in (1, 2):
            fns[f"prototype {name}, unroll={unroll}"] = (
                lambda t, s, c, ub, T=T, unroll=unroll: proto_reverse(T, t, s, c, ub, unroll),
                (th, slots, u_last, ubar),
            )

        # The prototype's gradient against lax.scan's.
        def proto_grad(t, u, T=T):
            u_last, slots = proto_forward(T, t, u)
            seed = jax.grad(lambda v: jnp.mean(v**2))(step(t, u_last))
            return proto_reverse(T, t, slots, u_last, seed)[1]

        got, ref = jax.jit(proto_grad)(th, u0), jax.grad(lax_loss)(th, u0)
        assert abs(float(got) - float(ref)) <= 1e-4 * abs(float(ref)), (name, got, ref)
    res = time_cpu(fns, repeats)
    rows = [[k, f"{cpu / N * 1e6:.2f}", f"{wall / N * 1e6:.2f}"] for k, (cpu, wall) in res.items()]
    print_table(
        f"2. Sweeps, N = {N}, {C} float32: us per step (CPU time, min of {repeats})",
        ["sweep", "cpu us", "wall us"],
        rows,
        markdown,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    ap.add_argument("--repeats", type=int, default=None, help="repeats (default 15; quick 5)")
    a = ap.parse_args()
    repeats = a.repeats or (5 if a.quick else 15)
    control_flow(repeats, a.markdown)
    reverse_sweeps(repeats, a.markdown)


if __name__ == "__main__":
    main()
