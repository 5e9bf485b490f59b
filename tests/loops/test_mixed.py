"""Mixed checkpointing in the compiled loops: steps reversed from their data (issue #35).

A ``DATA`` leaf evaluates its steps once, keeping each one's residuals (``_residuals``), and
transposes them from those in reverse order. The schedules are test-owned
(``_mixed_schedules``): ``DataLeaves`` streams ``Linearize``/``Reverse`` through the row tables,
``BinomialData`` runs the binomial machine with a rule whose short segments are ``DATA`` leaves.

- Evaluations (a ``jax.debug.callback`` counter in the step): a compiled gradient makes the
  schedule's ``plain + linearized + recorded`` evaluations, plus one (the forward sweep's last
  step, for ``u_N``): a first sweep that ends by linearizing steps (``Tables.lead``) keeps
  their data, and the reverse sweep starts by transposing them. An HVP's augmented sweep,
  which shares the forward's states and their tangents, linearizes them again
  (``relinearized``).
- Every derivative against ``jax.lax.scan`` / ``jax.lax.fori_loop`` in float64.
- Temp memory within the slots' bytes (states and data rows) plus the constant of the
  ``Revolve`` programs, and flat in ``N``; with ``schedules.Mixed``, whose data share the
  snapshot buffers, that of ``Revolve`` at the same budget.
- ``while_loop``: the segments between the snapshots ``Online`` placed, reversed by the machine
  with a ``DATA`` rule (``DataOnline``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrograde
from retrograde import schedules as rs
from retrograde.loops import _residuals, _tables
from retrograde.loops._body import Body

from . import _problems as P
from ._mixed_schedules import BinomialData, DataLeaves, DataOnline, data_rule, online_data_rule
from .test_counts import ARGS, CALLS, _count
from .test_machine import _run, machine_stats
from .test_scan import _transforms_program, _transforms_reference

RTOL = 1e-12


# ----------------------------------------------------------------------------- the test schedules


@pytest.mark.parametrize("n", [1, 2, 3, 7, 20, 40])
def test_test_schedules_are_valid(n):
    """The simulator runs both test schedules (every action valid, slots within the level) and
    counts their evaluations; with data, fewer than Revolve's with as many state slots."""
    for schedule in (
        DataLeaves(3, 4),
        DataLeaves(1, 3),
        DataLeaves(2, 3, False),
        BinomialData(3, 3),
        BinomialData(1, 3),
    ):
        stats = rs.simulate(schedule, n)
        assert stats.recorded + stats.reversed == n
        assert stats.evaluations <= rs.simulate(rs.Revolve(schedule.snapshots), n).evaluations
        # (the machine recomputes a segment left with one slot step by step, whatever the rule)
        assert stats.linearized > 0 or n < 3 or schedule == BinomialData(1, 3)


def _machine_actions(tables, rule):
    """The in-graph machine's actions (by ``rule``) after the forward sweep of ``tables``, and
    their count with ``DONE``."""
    steps, slots, count = tables.held
    acts, _, k = _run(
        tables.n_slots,
        jnp.asarray(steps),
        jnp.asarray(slots),
        count,
        tables.length,
        True,
        False,
        rule,
    )
    return np.asarray(acts), int(k)


def test_machine_data_leaves_are_its_twins():
    """With a rule making ``DATA`` leaves, the in-graph machine emits exactly the rows its Python
    twin writes when tracing."""
    for schedule, n in ((BinomialData(3, 3), 57), (BinomialData(5, 2), 20)):
        tables = _tables.tables_for(schedule, n)
        acts, k = _machine_actions(tables, data_rule(schedule))
        k = k - 1
        assert tables.rows.tolist() == acts[:k].tolist(), (schedule, n)
        assert tables.data_rows == schedule.leaf - 1


# ----------------------------------------------------------------------------- the data of a step


def _split_step(consts, carry, x):
    (w, th), (u, n) = consts, carry
    jax.debug.callback(lambda: CALLS.append(1), ordered=False)
    h = jnp.tanh((w + w.T) @ u) * jnp.sin(th) + jnp.exp(th) * x
    return (h, n + 1), jnp.sum(h * u)


def test_residuals_are_sorted_and_transpose_to_the_vjp():
    """The residuals of ``tanh((W + W^T) u) sin(th) + exp(th) x``: ``W + W^T`` and the functions
    of ``th`` are loop-invariant, ``x`` is read from ``xs``, and only the state's functions are
    stored; the step's VJP from them equals ``jax.vjp``'s, and the step (its callback) runs once,
    when its data is kept."""
    rng = np.random.default_rng(0)
    w, th = jnp.asarray(rng.standard_normal((3, 3))), jnp.float64(0.3)
    u, x = jnp.asarray(rng.standard_normal(3)), jnp.float64(0.7)
    closed = jax.make_jaxpr(_split_step)((w, th), (u, jnp.int32(0)), x)
    body = Body(closed, 2, 2, 1)
    lin = _residuals.linearization(body, *_residuals.every_float(body))
    kinds = [s.kind for s in lin.sources]
    assert kinds.count(_residuals.INVARIANT) == 4  # W + W^T, sin, cos, exp of th
    assert kinds.count(_residuals.X) == 1
    assert lin.stored_avals and all(a.shape == (3,) for a in lin.stored_avals)
    assert lin.data_bytes == 24 * len(lin.stored_avals)
    CALLS.clear()
    _, _, data = lin.linearize([w, th], [u, jnp.int32(0)], [x])
    jax.effects_barrier()
    assert len(CALLS) == 1
    kbar, ybar = jnp.asarray(rng.standard_normal(3)), jnp.float64(0.5)
    dc, dk, dx = lin.vjp([w, th], [x], lin.invariants([w, th]), data, [kbar, ybar])
    _, pullback = jax.vjp(
        lambda w, th, u, x: (lambda o: (o[0][0], o[1]))(_split_step((w, th), (u, 0), x)),
        w,
        th,
        u,
        x,
    )
    P.assert_close([*dc, *dk, *dx], list(pullback((kbar, ybar))), 1e-14, "vjp from data")


def test_data_size_is_measured_from_the_step():
    """Data sizes in states, every float leaf differentiated (with ``consts=True`` the
    closed-over parameters too)."""
    a = 0.5 * jnp.eye(4)
    u = jnp.ones(4)
    # A linear step keeps its input for the parameter's cotangent: one state; nothing else.
    assert _residuals.measure(lambda u, x: (a @ u, None), u, consts=True) == 1.0
    assert _residuals.measure(lambda u, x: (a @ u, None), u) == 0.0
    assert _residuals.measure(lambda u, x: (u + 0.01 * jnp.sin(0.7 * u), None), u) == 1.0
    # u (for a), tanh and 1 - tanh^2 (JAX's linearisation of tanh); without a: the last two.
    assert (
        _residuals.measure(lambda u, x: (u + 0.01 * jnp.tanh(a @ u), None), u, consts=True) == 3.0
    )
    assert _residuals.measure(lambda u, x: (u + 0.01 * jnp.tanh(a @ u), None), u) == 2.0
    # A step that only reads its parameters from the state keeps nothing.
    assert _residuals.measure(lambda u, x: (u + x, None), u, jnp.ones(4)) == 0.0


# ----------------------------------------------------------------------------- evaluations


def _count_loss(schedule, n, theta, u0):
    """With ``schedule=None``, through ``jax.lax.scan``."""

    def step(u, x):
        jax.debug.callback(lambda: CALLS.append(1), ordered=False)
        return u + 0.1 * jnp.sin(theta * u) * x + 0.05 * jnp.tanh(u[::-1]), jnp.sum(u) * x

    scan = jax.lax.scan if schedule is None else P.rscan(schedule)
    u, ys = scan(step, u0, jnp.linspace(0.5, 1.5, n))
    return jnp.sum(u**2) + jnp.sum(ys**2)


COUNTED = [DataLeaves(3, 4), DataLeaves(2, 3, False), BinomialData(3, 3)]


@pytest.mark.parametrize("schedule", COUNTED, ids=repr)
def test_gradient_count(schedule):
    n = 20
    stats, tables = rs.simulate(schedule, n), _tables.tables_for(schedule, n)
    assert stats.linearized > 0
    grad = jax.jit(jax.grad(functools.partial(_count_loss, schedule, n), argnums=(0, 1)))
    assert _count(grad, *ARGS) == stats.evaluations + 1
    # The first sweep of DataLeaves ends by linearizing: the forward keeps the run's data.
    assert (tables.lead is not None) == isinstance(schedule, DataLeaves)


def test_gradient_count_on_the_machine(monkeypatch):
    """``BinomialData`` run by the in-graph machine (no rows): the same evaluations, and the
    gradient of ``jax.lax.scan``."""
    schedule, n = BinomialData(2, 4), 20
    stats = rs.simulate(schedule, n)
    monkeypatch.setattr(_tables, "ROW_LIMIT", 0)
    _tables.tables_for.cache_clear()
    try:
        assert _tables.tables_for(schedule, n).rows is None
        grad = jax.jit(jax.grad(functools.partial(_count_loss, schedule, n), argnums=(0, 1)))
        assert _count(grad, *ARGS) == stats.evaluations + 1
        ref = jax.jit(jax.grad(functools.partial(_count_loss, None, n), argnums=(0, 1)))(*ARGS)
        P.assert_close(grad(*ARGS), ref, RTOL, "gradient on the machine")
    finally:
        _tables.tables_for.cache_clear()


MIXED = [
    rs.Mixed(3),
    rs.Mixed(4),
    rs.Mixed(2, 0.5),
    rs.Mixed(5, 2.0),
    rs.Mixed(3.5, 0.5),  # the rightmost leaf at the last level: linearized again
    rs.Mixed(3, 7),  # no data fits: Revolve's machine
]


@pytest.mark.parametrize("schedule, n", list(zip(MIXED, [20, 57, 30, 40, 25, 20])), ids=repr)
def test_mixed_gradient_count_and_gradient(schedule, n):
    """``schedules.Mixed`` on the machine (its tree, its leaves at their levels): the schedule's
    evaluations, plus one (the forward keeps the data of a rightmost leaf reversed from data);
    the gradient of ``jax.lax.scan``."""
    stats, tables = rs.simulate(schedule, n), _tables.tables_for(schedule, n)
    assert tables.rows is not None and tables.rule is not None
    grad = jax.jit(jax.grad(functools.partial(_count_loss, schedule, n), argnums=(0, 1)))
    assert _count(grad, *ARGS) == stats.evaluations + 1
    assert (tables.lead is not None) == (schedule == rs.Mixed(3.5, 0.5))
    ref = jax.jit(jax.grad(functools.partial(_count_loss, None, n), argnums=(0, 1)))(*ARGS)
    P.assert_close(grad(*ARGS), ref, RTOL, f"{schedule} gradient")


@pytest.mark.parametrize(
    "schedule, n, machine",
    [
        (rs.Mixed(2, 0.5), 5, False),  # the whole loop is the lead leaf (start 0)
        (rs.Mixed(5, 1.0), 20, False),  # the lead leaf at level 4, a trailing record before it
        (rs.Mixed(5, 1.0), 20, True),  # the in-graph machine on [0, start) after it
        (DataLeaves(3, 4), 20, False),  # a row table: data rows of their own, none pooled
    ],
    ids=str,
)
def test_the_forward_keeps_the_lead_leafs_data(schedule, n, machine, monkeypatch):
    """A first sweep that ends by linearizing ``[start, N)`` (``Tables.lead``): the forward
    sweep keeps those steps' data and the reverse sweep transposes them, so a gradient (in
    every leaf, or in ``u0`` only: data linearized in fewer leaves) and ``vmap(grad)`` (one
    callback per batched step) evaluate the step ``evaluations + 1`` times and agree with
    ``jax.lax.scan``; an HVP's augmented sweep, sharing the
    forward's states, linearizes them again: ``relinearized`` more, besides the tangent
    loop's ``N``."""
    if machine:
        monkeypatch.setattr(_tables, "ROW_LIMIT", 0)
    _tables.tables_for.cache_clear()
    try:
        stats, tables = rs.simulate(schedule, n), _tables.tables_for(schedule, n)
        assert tables.lead is not None and tables.relinearized == n - 1 - tables.lead[0]
        assert (tables.rows is None) == machine
        L = functools.partial(_count_loss, schedule, n)
        R = functools.partial(_count_loss, None, n)
        for argnums in ((0, 1), 1):
            grad = jax.jit(jax.grad(L, argnums=argnums))
            assert _count(grad, *ARGS) == stats.evaluations + 1, argnums
            P.assert_close(grad(*ARGS), jax.grad(R, argnums=argnums)(*ARGS), RTOL, "gradient")
        thetas = jnp.array([0.7, 0.9])
        vgrad = jax.jit(jax.vmap(jax.grad(L, argnums=(0, 1)), in_axes=(0, None)))
        assert _count(vgrad, thetas, ARGS[1]) == stats.evaluations + 1
        ref = jax.vmap(jax.grad(R, argnums=(0, 1)), in_axes=(0, None))(thetas, ARGS[1])
        P.assert_close(vgrad(thetas, ARGS[1]), ref, RTOL, "vmap(grad)")
        hvp = jax.jit(lambda th, u0: jax.jvp(jax.grad(L, argnums=(0, 1)), (th, u0), (1.0, u0)))
        expected = stats.evaluations + 1 + tables.relinearized + n
        assert _count(hvp, *ARGS) == expected
        ref = jax.jvp(jax.grad(R, argnums=(0, 1)), ARGS, (1.0, ARGS[1]))
        P.assert_close(hvp(*ARGS), ref, RTOL, "HVP")
    finally:
        _tables.tables_for.cache_clear()


@jax.custom_jvp
def _solve(u):
    """``w`` with ``w + exp(w) = u``, elementwise, by Newton's method: a forward whose data (the
    derivative ``1 / (1 + exp(w))``) needs all of it."""
    return jax.lax.fori_loop(0, 8, lambda _, w: w - (w + jnp.exp(w) - u) / (1 + jnp.exp(w)), u / 2)


@_solve.defjvp
def _solve_jvp(primals, tangents):
    w = _solve(primals[0])
    return w, tangents[0] / (1 + jnp.exp(w))


def test_default_schedule_is_mixed_where_it_does_less_work():
    """``schedule=None``: ``Mixed(s, d)`` with the default slots and the measured data size
    ``d`` where its estimated work is within ``MIXED_MARGIN`` of Revolve's: for an implicit
    step (a recorded step solves again: its data need the whole forward) with one state of
    data, about ``2N`` evaluations instead of ``3N`` in the same memory; ``Revolve(s)`` for
    ``u + 0.01 sin(0.5 u)``, whose record computes ``cos`` only (the next state is dead code),
    so the fewer evaluations would not pay for the data's writes."""
    n = 200
    s = retrograde.loops.default_schedule(n).snapshots
    steps = {
        "implicit": (lambda u: u + 0.05 * _solve(u), rs.Mixed(s, 1.0)),
        "sin": (lambda u: u + 0.01 * jnp.sin(0.5 * u), rs.Revolve(s)),
    }
    u0 = jnp.linspace(0.1, 1.0, 5)
    for name, (f, schedule) in steps.items():

        def loss(u0, scan, f=f):
            def step(u, _):
                jax.debug.callback(lambda: CALLS.append(1), ordered=False)
                return f(u), None

            return jnp.sum(scan(step, u0, None, length=n)[0] ** 2)

        grad = jax.jit(jax.grad(functools.partial(loss, scan=retrograde.scan)))
        assert _count(grad, u0) == rs.simulate(schedule, n).evaluations + 1, name
        ref = jax.grad(functools.partial(loss, scan=jax.lax.scan))
        P.assert_close(grad(u0), ref(u0), RTOL, f"default for {name}")
    assert rs.Mixed(s, 1.0).evaluations(n) < 0.7 * rs.simulate(rs.Revolve(s), n).evaluations


def test_work_estimates_count_what_each_role_computes():
    """``Linearization.work``: advancing ``u + 0.01 sin(0.5 u)`` (5 elements) computes ``0.5 u``,
    ``sin``, ``0.01 *`` and ``+``; recording computes ``0.5 u`` and ``cos`` (the residual) and
    the linear part (three products and a sum); linearizing both the next state and the
    residual (``0.5 u`` once); a transcendental counts ``TRANSCENDENTAL_WEIGHT`` operations per
    element."""
    closed = jax.make_jaxpr(lambda u, _: (u + 0.01 * jnp.sin(0.5 * u), None))(jnp.ones(5), None)
    body = Body(closed, 0, 1, 0)
    work = _residuals.linearization(body, (), (True,), ()).work()
    t = _residuals.TRANSCENDENTAL_WEIGHT
    assert work == _residuals.Work(
        advance=5 * (3 + t), record=5 * (1 + t) + 20, linearize=5 * (3 + 2 * t), transpose=20
    )


def test_hvp_count():
    """``jvp(grad)``: the gradient's evaluations plus the tangent loop's ``N``; the augmented
    reverse sweep reads the forward's snapshots and their tangents, and reverses its own data
    leaves (the augmented step's residuals)."""
    schedule, n = DataLeaves(3, 4), 20
    stats, tables = rs.simulate(schedule, n), _tables.tables_for(schedule, n)
    L = functools.partial(_count_loss, schedule, n)
    hvp = jax.jit(lambda th, u0: jax.jvp(jax.grad(L, argnums=(0, 1)), (th, u0), (1.0, u0)))
    assert _count(hvp, *ARGS) == stats.evaluations + 1 + tables.relinearized + n


# ----------------------------------------------------------------------------- against jax.lax


@pytest.mark.slow
def test_every_first_order_transformation():
    """grad, vjp, jvp, linearize, linear_transpose, jacfwd, jacrev, vmap and vmap(grad) on the
    pytree problem (int counter, xs, ys, closed-over parameters), as ``tests/loops/test_scan.py``
    checks them for the other schedules (slow: 7 s, mostly compiling; the derivatives the brief
    names run below in one program)."""
    args, ref = _transforms_reference(7)
    got = _transforms_program(P.rscan(DataLeaves(2, 3)))(*args)
    failures = [k for k in ref if not P.rel_err(got[k], ref[k]) <= RTOL]
    assert not failures, failures


def _higher(scan, fori):
    """grad, jvp, HVP, grad of grad and vmap(grad) of the small problem (int counter, xs, ys,
    closed-over parameters), and the gradient and HVP of a fori_loop."""
    L = functools.partial(P.small_loss, scan)

    def f(p, u0, xs, du):
        out = {}
        out["grad"] = jax.grad(L, argnums=(0, 1, 2))(p, u0, xs)
        out["jvp"] = jax.jvp(lambda u, xs: L(p, u, xs), (u0, xs), (du, jnp.cos(xs)))
        out["hvp"] = jax.jvp(lambda u: jax.grad(L, argnums=(0, 1))(p, u, xs), (u0,), (du,))
        out["grad_grad"] = jax.grad(
            lambda p, xs: jnp.sum(jax.grad(L, argnums=1)(p, u0, xs) ** 2), argnums=(0, 1)
        )(p, xs)
        bs = p["b"] * jnp.array([1.0, 1.3, 0.7])
        out["vmap_grad"] = jax.vmap(lambda b: jax.grad(L, argnums=(1, 2))(dict(p, b=b), u0, xs))(bs)

        def fl(th, u):
            u = fori(0, xs.shape[0], lambda i, u: u + 0.1 * jnp.sin(th * u + xs[i]), u)
            return jnp.sum(u**3)

        out["fori_grad"] = jax.grad(fl, argnums=(0, 1))(p["b"], u0)
        out["fori_hvp"] = jax.jvp(lambda u: jax.grad(fl, argnums=1)(p["b"], u), (u0,), (du,))
        return out

    return P.jit(f)


@functools.cache
def _higher_reference(n):
    args = (P.small_params(), P.small_u0(), P.small_xs(n), jnp.array([0.3, -1.1]))
    return args, _higher(P.lax_scan, jax.lax.fori_loop)(*args)


@pytest.mark.parametrize(
    "schedule",
    [rs.Mixed(2, 0.5), pytest.param(DataLeaves(2, 3), marks=pytest.mark.slow)],
    ids=repr,
)
def test_higher_orders_and_fori_loop(schedule):
    """``Mixed`` (the machine, data pooled with the states) and a row-table stream
    (``DataLeaves``, data rows of their own)."""
    args, ref = _higher_reference(11)
    fori = functools.partial(retrograde.fori_loop, schedule=schedule)
    got = _higher(P.rscan(schedule), fori)(*args)
    failures = [f"{k}: {P.rel_err(got[k], ref[k]):.1e}" for k in ref]
    assert all(P.rel_err(got[k], ref[k]) <= 1e-10 for k in ref), failures


# ----------------------------------------------------------------------------- while_loop


def test_while_loop_reverses_online_segments_from_data():
    """``while_loop`` with ``DataOnline``: the segments between the snapshots ``Online`` placed
    are reversed by the machine with a ``DATA`` rule; its evaluations are the machine's (run on
    the same snapshots and simulated), fewer than ``Online``'s, and the gradient is that of
    ``jax.lax.fori_loop``."""
    n, s = 60, 4
    schedule = DataOnline(s, leaf=3)

    def f(loop, theta):
        def body(st):
            jax.debug.callback(lambda: CALLS.append(1), ordered=False)
            return st[0] + 1, st[1] + 0.001 * jnp.sin(theta * st[1])

        return jnp.sum(loop(body, (0, jnp.ones(2)))[1])

    ours = functools.partial(retrograde.while_loop, lambda st: st[0] < n, schedule=schedule)
    grad = jax.jit(jax.grad(functools.partial(f, ours)))
    held = [-1] * s
    for step in range(n):
        k = rs.online_store_slot(step, held, s)
        if k >= 0:
            held[k] = step
    placed = {k: p for k, p in enumerate(held) if p >= 0}
    stats, _ = machine_stats(n, s, placed, False, with_pairs=True, rule=online_data_rule(schedule))
    assert stats.linearized > 0
    assert _count(grad, 0.5) == stats.evaluations
    assert stats.evaluations < rs.simulate(rs.Online(s), n).evaluations
    lax = lambda body, init: jax.lax.fori_loop(0, n, lambda i, st: body(st), init)
    ref = jax.jit(jax.grad(functools.partial(f, lax)))(0.5)
    P.assert_close(grad(0.5), ref, RTOL, "while_loop gradient")


# ----------------------------------------------------------------------------- memory

D = 1000  # carry size (float64)
CARRY = 8 * D


def _temp(schedule, n, order):
    def loss(theta, u0):
        step = lambda u, _: (u + 0.01 * jnp.sin(theta * u), None)
        return jnp.sum(retrograde.scan(step, u0, None, length=n, schedule=schedule)[0] ** 2)

    return temp_of(loss, order)


def temp_of(loss, order="grad"):
    """XLA's temp bytes of the compiled gradient of ``loss(theta, u0)`` in both (``order``
    "grad"), or of an HVP in ``u0`` ("hvp"), at ``theta = 0.5`` and ``u0`` of ``D`` ones."""
    program = jax.grad(loss, argnums=(0, 1))
    if order == "hvp":
        program = lambda th, u0: jax.jvp(
            lambda u: jax.grad(loss, argnums=1)(th, u), (u0,), (jnp.ones_like(u0),)
        )[1]
    compiled = jax.jit(program).lower(jnp.float64(0.5), jnp.ones(D)).compile()
    stats = compiled.memory_analysis()
    if stats is None or getattr(stats, "temp_size_in_bytes", None) is None:
        pytest.skip("this backend reports no memory analysis")
    return stats.temp_size_in_bytes


@pytest.mark.parametrize("order", ["grad", "hvp"])
def test_memory_within_the_slots_and_flat(order):
    """The step ``u + 0.01 sin(theta u)`` keeps 1 state of data (``cos(theta u)``; ``u`` for
    theta's cotangent is the state's own leaf, 2 with it): temp memory at most the slots' bytes
    (states, data rows) plus the 6 carries of the first-order Revolve programs
    (``tests/loops/test_memory.py``), twice that for an HVP, and the same at ``N = 10000`` as at
    ``1000``."""
    schedule = DataLeaves(10, 4)
    sizes = {}
    for n in (1000, 10000):
        tables = _tables.tables_for(schedule, n)
        data = 2 * CARRY  # cos(theta u) and u, per step
        slots = tables.n_slots * CARRY + tables.data_rows * data
        factor = 1 if order == "grad" else 2
        sizes[n] = temp = _temp(schedule, n, order)
        print(f"{order}, N = {n}: {temp / CARRY:.1f} carries, slots {slots / CARRY:.0f}")
        assert temp <= factor * (slots + 6 * CARRY), (order, n, temp / CARRY)
    # Flat in N, but for the slot that keeps the start of the first sweep's linearized run
    # (where the schedule did not store it).
    assert sizes[10000] <= sizes[1000] + factor * CARRY


def test_mixed_on_the_in_graph_machine(monkeypatch):
    """Past ``ROW_LIMIT`` rows ``Mixed`` runs the in-graph machine, splitting by the band rule
    (``_mixed_rule``): its actions are the twin's rows, its evaluations and gradient those of the
    rows; a fractional data size (no band rule) is refused there, saying what to do."""
    for schedule, n in ((rs.Mixed(4), 57), (rs.Mixed(5, 2.0), 40), (rs.Mixed(3.5, 1.0), 25)):
        tables = _tables.tables_for(schedule, n)
        acts, k = _machine_actions(tables, tables.rule)
        assert acts[: k - 1].tolist() == tables.rows.tolist(), schedule
    schedule, n = rs.Mixed(4), 57
    stats = rs.simulate(schedule, n)
    monkeypatch.setattr(_tables, "ROW_LIMIT", 0)
    _tables.tables_for.cache_clear()
    try:
        tables = _tables.tables_for(schedule, n)
        assert tables.rows is None
        grad = jax.jit(jax.grad(functools.partial(_count_loss, schedule, n), argnums=(0, 1)))
        assert _count(grad, *ARGS) == stats.evaluations + 1
        ref = jax.jit(jax.grad(functools.partial(_count_loss, None, n), argnums=(0, 1)))(*ARGS)
        P.assert_close(grad(*ARGS), ref, RTOL, "Mixed on the machine")
        with pytest.raises(ValueError, match=r"no in-graph split rule.*whole data_size"):
            _tables.tables_for(rs.Mixed(4, 0.5), 100)
    finally:
        _tables.tables_for.cache_clear()


@pytest.mark.parametrize("order", ["grad", "hvp"])
def test_mixed_memory_is_revolves_at_the_same_budget(order):
    """``Mixed(10, 2.0)`` for a step that keeps 2 states of data: its leaves' data rows share
    the snapshot buffers (``_pool``), so a gradient and an HVP take the temp memory of
    ``Revolve(10)`` (within one state), the same at ``N = 10000`` as at ``1000``, with fewer
    evaluations."""
    mixed, revolve = rs.Mixed(10, 2.0), rs.Revolve(10)
    base = _temp(revolve, 1000, order)
    for n in (1000, 10000):
        assert rs.simulate(mixed, n).evaluations < rs.simulate(revolve, n).evaluations
        temp = _temp(mixed, n, order)
        print(f"{order}, N = {n}: {temp / CARRY:.1f} carries, Revolve(10) {base / CARRY:.1f}")
        assert temp <= base + CARRY, (order, n, temp / CARRY, base / CARRY)


@pytest.mark.parametrize("order", ["grad", "hvp"])
def test_lead_leaf_data_take_no_memory_of_their_own(order):
    """``Mixed(20, 2.0)`` where its first sweep ends by linearizing a leaf (``Tables.lead``):
    the forward writes that leaf's data into the snapshot buffers' free rows, so a gradient and
    an HVP take the temp memory of ``Revolve(20)`` (within one state)."""
    mixed, revolve = rs.Mixed(20, 2.0), rs.Revolve(20)
    for n in (40, 100):
        assert _tables.tables_for(mixed, n).lead is not None
        base, temp = _temp(revolve, n, order), _temp(mixed, n, order)
        print(f"{order}, N = {n}: {temp / CARRY:.1f} carries, Revolve(20) {base / CARRY:.1f}")
        assert temp <= base + CARRY, (order, n, temp / CARRY, base / CARRY)


# ----------------------------------------------------------------------------- errors


class _Stream(rs.OfflineSchedule):
    def __init__(self, actions):
        self._actions = actions

    def actions(self, n_steps):
        yield from self._actions


def test_unsupported_data_streams_name_the_action():
    """Data must be reversed in the leaf that linearized it, whole."""
    L, R, Rec = rs.Linearize, rs.Reverse, rs.Record
    cases = {
        # data kept across another leaf
        "still to be reversed": [
            rs.Store(0, 0),
            L(0, 1),
            L(1, 2),
            Rec(2),
            R(1, 2),
            rs.Restore(0, 0),
            Rec(0),
            rs.End(),
        ],
        "not linearized in the leaf": [
            rs.Store(0, 0),
            rs.Advance(0, 2),
            Rec(2),
            rs.Restore(0, 0),
            rs.Advance(0, 1),
            Rec(1),
            R(0, 1),
            rs.End(),
        ],
        "end inside a leaf": [rs.Store(0, 0), rs.Advance(0, 1), L(1, 1), Rec(2), rs.End()],
    }
    for message, actions in cases.items():
        with pytest.raises(ValueError, match=message):
            _tables.tables_for(_Stream(actions), 3)
