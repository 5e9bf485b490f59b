"""Gradients of host-driven loops for every schedule, in RAM and on disk."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrograde.host as rh
from retrograde import schedules as rs

from . import _host_problems as P

N = 20
SCHEDULES = P.schedule_list()
IDS = [name for name, _ in SCHEDULES]
SCHEDS = [s for _, s in SCHEDULES]
STORAGES = ["memory", "disk"]


def _storage(kind, schedule, tmp_path):
    if kind == "memory":
        return rh.Memory()
    if len(schedule.levels) > 1:  # MultiLevel: keep level 0 in RAM, the rest on disk
        return {
            i: (rh.Memory() if i == 0 else rh.Disk(tmp_path)) for i in range(len(schedule.levels))
        }
    return rh.Disk(tmp_path)


def _kw(schedule, n):
    # online schedules run the same loop with n_steps given (until= is tested separately)
    return dict(schedule=schedule)


@pytest.fixture(scope="module")
def np_reference():
    s0, p = P.state0(), P.params0()
    J = P.np_reference_J(s0, p, N)
    ga, gc, gu = P.fd_grad(s0, p, N)
    with rh.forward(P.NP_STEP, s0, p, N, schedule=rs.StoreAll(), loss=P.NP_LOSS) as fp:
        g = fp.vjp()
    return J, (ga, gc, gu), g


@pytest.fixture(scope="module")
def jax_reference():
    return P.jax_reference(N)


@pytest.fixture(scope="module")
def hvp_reference():
    s0 = jax.tree_util.tree_map(jnp.asarray, P.state0())
    p = jax.tree_util.tree_map(jnp.asarray, P.params0())
    rng = np.random.default_rng(7)
    pd = {"a": rng.standard_normal(P.M), "c": np.float64(rng.standard_normal())}
    sd = {"u": rng.standard_normal(P.M), "memo": np.zeros(P.M)}
    f = lambda q, s: P.jax_reference_J(q, s, N)
    g_ref = jax.grad(f, argnums=(0, 1))
    J, (gp, gs), (hp, hs) = jax.jit(
        lambda p, s0, pd, sd: (f(p, s0), *jax.jvp(g_ref, (p, s0), (pd, sd)))
    )(p, s0, pd, sd)
    return (s0, p, pd, sd), float(J), (gp, gs), (hp, hs)


@pytest.mark.parametrize("kind", STORAGES)
@pytest.mark.parametrize("schedule", SCHEDS, ids=IDS)
def test_numpy_step_in_place(schedule, kind, tmp_path, np_reference):
    """NumPy Step updating its state in place, long-range dependency, running + final loss:
    against finite differences and against StoreAll."""
    J_ref, (ga, gc, gu), g_sa = np_reference
    s0, p = P.state0(), P.params0()
    s0_copy = {k: v.copy() for k, v in s0.items()}
    J, g = rh.value_and_grad(
        P.NP_STEP,
        P.NP_LOSS,
        s0,
        p,
        N,
        storage=_storage(kind, schedule, tmp_path),
        **_kw(schedule, N),
    )
    np.testing.assert_allclose(J, J_ref, rtol=1e-13)
    np.testing.assert_allclose(g.params["a"], ga, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(g.params["c"], gc, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(g.state0["u"], gu, rtol=1e-6, atol=1e-8)
    # exactly the StoreAll adjoint
    for got, want in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g_sa)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    # the caller's state was not touched by the in-place step
    for k in s0:
        np.testing.assert_array_equal(s0[k], s0_copy[k])
    assert list(tmp_path.iterdir()) == []  # disk directory removed


@pytest.mark.parametrize("kind", STORAGES)
@pytest.mark.parametrize("schedule", SCHEDS, ids=IDS)
def test_jax_step(schedule, kind, tmp_path, jax_reference):
    J_ref, gp, gs = jax_reference
    J, g = rh.value_and_grad(
        P.jax_step,
        P.JAX_LOSS,
        P.state0(),
        P.params0(),
        N,
        storage=_storage(kind, schedule, tmp_path),
        schedule=schedule,
    )
    np.testing.assert_allclose(J, J_ref, rtol=1e-13)
    np.testing.assert_allclose(g.params["a"], gp["a"], rtol=1e-11)
    np.testing.assert_allclose(g.params["c"], gp["c"], rtol=1e-11)
    np.testing.assert_allclose(g.state0["u"], gs["u"], rtol=1e-11)
    assert list(tmp_path.iterdir()) == []


def test_eval_counts_match_the_schedule():
    """Plain evaluations = the schedule's (simulated) plain count + 1 (the step to u_N)."""
    for name, sched in SCHEDULES:
        if sched.online:
            continue
        with rh.forward(
            P.NP_STEP, P.state0(), P.params0(), N, schedule=sched, loss=P.NP_LOSS
        ) as fp:
            fp.vjp()
            stats = rs.simulate(sched, N)
            assert fp.counts.plain == stats.plain + 1, name
            assert fp.counts.recorded == N
            assert fp.counts.writes == stats.writes, name
            assert fp.counts.reads == stats.reads, name


@pytest.mark.parametrize("kind", STORAGES)
@pytest.mark.parametrize("schedule", SCHEDS, ids=IDS)
def test_repeated_vjp_on_one_handle(schedule, kind, tmp_path):
    """vjp many times with different cotangents; the first sweep is not rerun and its snapshots
    survive, the reverse part's snapshots are freed after each call."""
    s0, p = P.state0(), P.params0()
    storage = _storage(kind, schedule, tmp_path)
    rng = np.random.default_rng(3)
    bars = [{"u": rng.standard_normal(P.M), "memo": rng.standard_normal(P.M)} for _ in range(2)]
    with rh.forward(P.NP_STEP, s0, p, N, schedule=schedule, loss=P.NP_LOSS, storage=storage) as fp:
        plain_fwd = fp.counts.plain
        held = [s.nbytes for s in fp._stores]
        files = sorted(tmp_path.rglob("*.snap"))
        g1 = fp.vjp()
        gb = [fp.vjp(b, loss_bar=0.0) for b in bars]
        g1b = fp.vjp()
        gmix = fp.vjp(bars[0], loss_bar=2.0)
        assert [s.nbytes for s in fp._stores] == held
        assert sorted(tmp_path.rglob("*.snap")) == files
        per_vjp = (fp.counts.plain - plain_fwd) / 5
        assert per_vjp == int(per_vjp)
        assert fp.counts.recorded == 5 * N
    assert list(tmp_path.iterdir()) == []
    # same as fresh computations
    for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g1b)):
        np.testing.assert_array_equal(a, b)
    for bar, g in zip(bars, gb):
        lin = rh.Final(
            lambda n, s, q, bar=bar: sum(np.sum(bar[k] * s[k]) for k in bar),
            grad=lambda n, s, q, bar=bar: (bar, {"a": 0.0, "c": 0.0}),
        )
        _, ref = rh.value_and_grad(P.NP_STEP, lin, s0, p, N, schedule=rs.StoreAll())
        for x, y in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(ref)):
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-14)
    for x, y1, y2 in zip(*(jax.tree_util.tree_leaves(t) for t in (gmix, g1, gb[0]))):
        np.testing.assert_allclose(x, 2 * y1 + y2, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("kind", STORAGES)
@pytest.mark.parametrize("sched", SCHEDS, ids=IDS)
def test_replay_m0_m1_m0(sched, kind, tmp_path):
    """Gradients at m0, then m1, then m0 again each equal a fresh computation."""
    p0, p1 = P.params0(0), P.params0(5)
    storage = _storage(kind, sched, tmp_path)

    def run(p):
        return rh.value_and_grad(
            P.NP_STEP, P.NP_LOSS, P.state0(), p, N, schedule=sched, storage=storage
        )

    def run_jax(p):
        return rh.value_and_grad(
            P.jax_step, P.JAX_LOSS, P.state0(), p, N, schedule=sched, storage=storage
        )

    for fn in (run, run_jax):
        a, b, c = fn(p0), fn(p1), fn(p0)
        assert a[0] == c[0] and a[0] != b[0]
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(c)):
            np.testing.assert_array_equal(x, y)
        fresh = rh.value_and_grad(P.NP_STEP, P.NP_LOSS, P.state0(), p1, N, schedule=rs.StoreAll())
        for x, y in zip(jax.tree_util.tree_leaves(b), jax.tree_util.tree_leaves(fresh)):
            np.testing.assert_allclose(x, y, rtol=1e-11, atol=1e-13)


def test_online_until(tmp_path):
    """A loop of unknown length (a `while` on the state) with an online schedule."""
    sched = rs.Online(3)
    if sched is None:
        pytest.skip("retrograde.schedules.Online is not available yet")

    def step(n, s, p):
        return {
            "t": s["t"] + p["dt"] * (1 + 0.5 * jnp.sin(s["u"][0])),
            "u": s["u"] + p["dt"] * jnp.cos(p["w"] * s["u"]),
        }

    loss = rh.Final(lambda n, s, p: jnp.sum(s["u"] ** 3))
    s0 = {"t": np.float64(0.0), "u": np.linspace(0.1, 0.4, 3)}
    p = {"dt": np.float64(0.05), "w": np.float64(1.3)}
    until = lambda n, s: s["t"] >= 1.0
    for storage in (rh.Memory(), rh.Disk(tmp_path)):
        with rh.forward(
            step, s0, p, None, until=until, schedule=sched, loss=loss, storage=storage
        ) as fp:
            n_steps = fp.n_steps
            g = fp.vjp()
            g2 = fp.vjp()
        assert 10 < n_steps < 30
        # Hessian-vector product through the same online schedule
        d = {"dt": np.float64(0.0), "w": np.float64(1.0)}
        h = rh.hvp(step, loss, s0, p, None, d, until=until, schedule=sched, storage=storage)
        h_ref = rh.hvp(step, loss, s0, p, n_steps, d, schedule=rs.StoreAll())
        np.testing.assert_allclose(h.hvp.params["w"], h_ref.hvp.params["w"], rtol=1e-12)
        np.testing.assert_allclose(h.hvp.state0["u"], h_ref.hvp.state0["u"], rtol=1e-12)
        J_ref, g_ref = rh.value_and_grad(step, loss, s0, p, n_steps, schedule=rs.StoreAll())
        assert fp.value == pytest.approx(J_ref, rel=1e-14)
        for x, y, z in zip(*(jax.tree_util.tree_leaves(t) for t in (g, g_ref, g2))):
            np.testing.assert_allclose(x, y, rtol=1e-12)
            np.testing.assert_array_equal(x, z)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", STORAGES)
@pytest.mark.parametrize("schedule", SCHEDS, ids=IDS)
def test_hvp_against_jax_hessian(schedule, kind, tmp_path, hvp_reference):
    (s0, p, pd, sd), J, (gp, gs), (hp, hs) = hvp_reference
    storage = _storage(kind, schedule, tmp_path)
    r = rh.hvp(P.jax_step, P.JAX_LOSS, s0, p, N, pd, sd, schedule=schedule, storage=storage)
    np.testing.assert_allclose(r.value, J, rtol=1e-13)
    np.testing.assert_allclose(r.hvp.params["a"], hp["a"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(r.hvp.params["c"], hp["c"], rtol=1e-10)
    np.testing.assert_allclose(r.hvp.state0["u"], hs["u"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(r.grad.params["a"], gp["a"], rtol=1e-11)
    np.testing.assert_allclose(r.grad.state0["u"], gs["u"], rtol=1e-11)
    assert list(tmp_path.iterdir()) == []


def test_hvp_taylor_third_order(tmp_path):
    """|J(m + h d) - J(m) - h g.d - h^2/2 d.H.d| = O(h^3)."""
    s0 = P.state0()
    p = P.params0()
    rng = np.random.default_rng(11)
    d = {"a": rng.standard_normal(P.M), "c": np.float64(rng.standard_normal())}
    r = rh.hvp(
        P.jax_step, P.JAX_LOSS, s0, p, N, d, schedule=rs.Revolve(3), storage=rh.Disk(tmp_path)
    )
    gd = float(np.dot(r.grad.params["a"], d["a"]) + r.grad.params["c"] * d["c"])
    dHd = float(np.dot(r.hvp.params["a"], d["a"]) + r.hvp.params["c"] * d["c"])
    res = []
    hs = [0.04, 0.02, 0.01, 0.005]
    for h in hs:
        ph = {"a": p["a"] + h * d["a"], "c": p["c"] + h * d["c"]}
        Jh = P.np_reference_J(s0, ph, N)
        res.append(abs(Jh - r.value - h * gd - 0.5 * h * h * dHd))
    rates = [np.log2(res[i] / res[i + 1]) for i in range(len(hs) - 1)]
    assert min(rates) > 2.8, (res, rates)
    # without the Hessian term only second order: the check has teeth
    res2 = [
        abs(
            P.np_reference_J(s0, {"a": p["a"] + h * d["a"], "c": p["c"] + h * d["c"]}, N)
            - r.value
            - h * gd
        )
        for h in hs
    ]
    assert np.log2(res2[0] / res2[1]) < 2.2


@pytest.mark.parametrize("schedule", [rs.Revolve(3), rs.StoreAll()], ids=["Revolve3", "StoreAll"])
def test_jvp_matches_gradient(schedule):
    s0, p = P.state0(), P.params0()
    rng = np.random.default_rng(2)
    pd = {"a": rng.standard_normal(P.M), "c": np.float64(0.3)}
    sd = {"u": rng.standard_normal(P.M), "memo": np.zeros(P.M)}
    J, g = rh.value_and_grad(P.jax_step, P.JAX_LOSS, s0, p, N, schedule=schedule)
    t = rh.jvp(P.jax_step, s0, p, N, sd, pd, loss=P.JAX_LOSS)
    expect = (
        np.dot(g.params["a"], pd["a"]) + g.params["c"] * pd["c"] + np.dot(g.state0["u"], sd["u"])
    )
    assert t.value == pytest.approx(J, rel=1e-13)
    assert t.value_dot == pytest.approx(float(expect), rel=1e-11)


def test_numpy_step_jvp():
    step = rh.Step(
        forward=lambda n, u, a: u + 0.1 * np.sin(a * u),
        vjp=lambda n, u, a, b: (
            b * (1 + 0.1 * a * np.cos(a * u)),
            np.sum(b * 0.1 * u * np.cos(a * u)),
        ),
        jvp=lambda n, u, a, ud, ad: (
            u + 0.1 * np.sin(a * u),
            ud + 0.1 * np.cos(a * u) * (a * ud + ad * u),
        ),
    )
    u0 = np.linspace(0.2, 1.0, 4)
    t = rh.jvp(step, u0, 1.7, 15, np.zeros(4), 1.0)
    eps = 1e-6
    tp = rh.jvp(step, u0, 1.7 + eps, 15)
    tm = rh.jvp(step, u0, 1.7 - eps, 15)
    np.testing.assert_allclose(t.state_dot, (tp.state - tm.state) / (2 * eps), rtol=1e-7)
    with pytest.raises(ValueError, match="no jvp"):
        rh.jvp(rh.Step(step.forward, step.vjp), u0, 1.7, 3)


def test_zero_steps_and_final_state():
    s0, p = P.state0(), P.params0()
    J, g = rh.value_and_grad(P.NP_STEP, P.NP_LOSS, s0, p, 0, schedule=rs.Revolve(2))
    assert J == pytest.approx(P.np_reference_J(s0, p, 0))
    np.testing.assert_allclose(g.state0["u"], 2 * s0["u"] + p["c"])
    with rh.forward(P.NP_STEP, s0, p, 7, schedule=rs.Revolve(2)) as fp:
        ref = {k: v.copy() for k, v in s0.items()}
        for n in range(7):
            ref = P.np_forward(n, ref, p)
        np.testing.assert_allclose(fp.state["u"], ref["u"], rtol=1e-15)
        assert fp.value is None
        g = fp.vjp({"u": np.ones(P.M), "memo": np.zeros(P.M)})
        assert g.params["a"].shape == (P.M,)
    assert not os.path.exists(os.path.join("nonexistent"))


@pytest.mark.parametrize("schedule", SCHEDS, ids=IDS)
def test_vjp_keep_false_frees_as_it_goes(schedule, tmp_path):
    """keep=False (what value_and_grad uses): same gradient, first-sweep snapshots released as the
    schedule frees them, peak memory within the schedule's slots; no further vjp."""
    s0, p = P.state0(), P.params0()
    with rh.forward(P.NP_STEP, s0, p, N, schedule=schedule, loss=P.NP_LOSS) as fp:
        g1 = fp.vjp()
        peak_keep = [s.peak_nbytes for s in fp._stores]
    with rh.forward(P.NP_STEP, s0, p, N, schedule=schedule, loss=P.NP_LOSS) as fp:
        g2 = fp.vjp(keep=False)
        assert all(s.nbytes == 0 for s in fp._stores)
        peak = [s.peak_nbytes for s in fp._stores]
        with pytest.raises(ValueError, match="keep=False"):
            fp.vjp()
    for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g2)):
        np.testing.assert_array_equal(a, b)
    state_bytes = 2 * P.M * 8
    max_slots = schedule.max_slots(N)
    for lvl, (pk, pkk) in enumerate(zip(peak, peak_keep)):
        assert pk <= max_slots[lvl] * state_bytes
        assert pk <= pkk


def test_jax_step_is_traced_once():
    """Forward and VJP of a JAX step compile once, whatever the step index or run."""
    traces = []

    def step(n, u, a):
        traces.append(n)
        return u + 0.1 * jnp.sin(a * u + n)

    loss = rh.Final(lambda n, u, a: jnp.sum(u**2))
    rh.value_and_grad(step, loss, np.ones(3), 1.2, 17, schedule=rs.Revolve(3))
    rh.value_and_grad(step, loss, np.ones(3), 1.5, 9, schedule=rs.Revolve(4), storage=rh.Disk())
    assert len(traces) == 2  # one trace for forward, one for the VJP


def test_mixed_numpy_step_with_jax_loss_and_jax_step_with_numpy_loss():
    s0, p = P.state0(), P.params0()
    J1, g1 = rh.value_and_grad(P.NP_STEP, P.JAX_LOSS, s0, p, N, schedule=rs.Revolve(3))
    J2, g2 = rh.value_and_grad(P.jax_step, P.NP_LOSS, s0, p, N, schedule=rs.Revolve(3))
    J3, g3 = rh.value_and_grad(P.NP_STEP, P.NP_LOSS, s0, p, N, schedule=rs.StoreAll())
    for J, g in ((J1, g1), (J2, g2)):
        assert J == pytest.approx(J3, rel=1e-13)
        for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(g3)):
            np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-14)


def test_zero_params_bar_may_be_a_plain_zero():
    """A step or loss that does not depend on (part of) params may return 0.0 for it."""
    step = rh.Step(lambda n, u, p: u * p["a"], lambda n, u, p, b: (b * p["a"], 0.0))
    loss = rh.Final(lambda n, u, p: np.sum(u**2), grad=lambda n, u, p: (2 * u, 0.0))
    p = {"a": np.float64(1.1), "b": np.ones(2)}
    J, g = rh.value_and_grad(step, loss, np.ones(3), p, 4, schedule=rs.Revolve(2))
    assert J == pytest.approx(3 * 1.1**8)
    assert isinstance(g.params, dict) and np.all(g.params["b"] == 0)
    np.testing.assert_allclose(g.state0, 2 * 1.1**8 * np.ones(3))


# ---------------------------------------------------------------- Python scalars (weak types)
def _weak_step(n, u, p):
    return jax.tree_util.tree_map(lambda x: x + 0.1 * jnp.sin(p["a"] * x) + p["c"] * x * n, u)


def _weak_f(n, u, p):
    return p["a"] * sum(jnp.sum(x**2) for x in jax.tree_util.tree_leaves(u))


def _weak_reference(kind, s0, p, n_steps):
    """J and its gradient from jax.grad of the same loop written as a Python loop."""

    def J(p, s):
        total = 0.0
        for n in range(n_steps):
            s = _weak_step(n, s, p)
            if kind == "Running":
                total = total + _weak_f(n + 1, s, p)
        return total + (_weak_f(n_steps, s, p) if kind == "Final" else 0.0)

    return jax.value_and_grad(J, argnums=(0, 1))(p, s0)


WEAK_STATES = {
    "float": lambda: 0.7,
    "list": lambda: [0.7, -0.4],
    "array": lambda: np.array([0.7, -0.4, 1.1]),
}


@pytest.mark.parametrize("x64", [False, True], ids=["float32", "x64"])
@pytest.mark.parametrize("kind", ["Final", "Running"])
@pytest.mark.parametrize("state", list(WEAK_STATES))
def test_jax_step_with_python_scalars_follows_jax_weak_types(x64, kind, state):
    """A JAX step given Python float parameters and states (and, below, a NumPy float64
    parameter): under default JAX the driver computes in float32, as JAX does, and checks the
    cotangents against that (issue #31: it used to require float64 from a function of its own);
    the gradient is jax.grad's of the same loop, with the structure of the inputs."""
    rtol, dtype = (1e-12, np.float64) if x64 else (1e-5, np.float32)
    n_steps = 10
    loss = getattr(rh, kind)(_weak_f)
    with jax.enable_x64(x64):
        for p in ({"a": 1.3, "c": 0.02}, {"a": np.float64(1.3), "c": np.array(0.02)}):
            s0 = WEAK_STATES[state]()
            J_ref, (gp_ref, gs_ref) = _weak_reference(kind, s0, p, n_steps)
            J, g = rh.value_and_grad(_weak_step, loss, s0, p, n_steps, schedule=rs.Revolve(3))
            with rh.forward(_weak_step, s0, p, n_steps, schedule=rs.Revolve(3), loss=loss) as fp:
                g2 = fp.vjp()
                g3 = fp.vjp(loss_bar=2.0)
            assert J == pytest.approx(float(J_ref), rel=rtol)
            assert fp.value == pytest.approx(float(J_ref), rel=rtol)
            for got in (g, g2, jax.tree_util.tree_map(lambda x: x / 2, g3)):
                assert jax.tree_util.tree_structure(got.params) == jax.tree_util.tree_structure(p)
                assert jax.tree_util.tree_structure(got.state0) == jax.tree_util.tree_structure(s0)
                for a, b in zip(
                    jax.tree_util.tree_leaves((got.params, got.state0)),
                    jax.tree_util.tree_leaves((gp_ref, gs_ref)),
                ):
                    assert np.asarray(a).dtype == dtype
                    np.testing.assert_allclose(
                        np.asarray(a), np.asarray(b), rtol=rtol, atol=rtol * 1e-2
                    )


@pytest.mark.parametrize("x64", [False, True], ids=["float32", "x64"])
def test_hvp_and_jvp_with_python_scalars(x64):
    """hvp and jvp share the path: Python float parameters, state and directions under default
    (float32) JAX and under x64, against jax.jvp of jax.grad of the same loop."""
    rtol, dtype = (1e-5, np.float32) if x64 is False else (1e-12, np.float64)
    n_steps = 8
    with jax.enable_x64(x64):
        p, pd = {"a": 1.3, "c": 0.02}, {"a": 0.5, "c": -1.0}
        s0, sd = [0.7, -0.4], [1.0, 0.25]

        def J(p, s):
            return _weak_reference("Final", s, p, n_steps)[0]

        (g_ref, dg_ref) = jax.jvp(jax.grad(J, argnums=(0, 1)), (p, s0), (pd, sd))
        J_ref, J_dot_ref = jax.jvp(J, (p, s0), (pd, sd))
        loss = rh.Final(_weak_f)
        hp = rh.hvp(_weak_step, loss, s0, p, n_steps, pd, sd, schedule=rs.Revolve(3))
        assert hp.value == pytest.approx(float(J_ref), rel=rtol)
        for got, ref in ((hp.grad, g_ref), (hp.hvp, dg_ref)):
            for a, b in zip(
                jax.tree_util.tree_leaves((got.params, got.state0)), jax.tree_util.tree_leaves(ref)
            ):
                assert np.asarray(a).dtype == dtype
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=rtol)
        t = rh.jvp(_weak_step, s0, p, n_steps, sd, pd, loss=loss)
        assert t.value == pytest.approx(float(J_ref), rel=rtol)
        assert t.value_dot == pytest.approx(float(J_dot_ref), rel=rtol)
        assert all(np.asarray(x).dtype == dtype for x in t.state_dot)


def test_numpy_step_keeps_float64_for_python_scalars():
    """A hand-written NumPy step computes Python scalars in NumPy's float64, x64 or not."""
    step = rh.Step(lambda n, u, a: u * a, lambda n, u, a, b: (b * a, np.sum(b * u)))
    loss = rh.Final(lambda n, u, a: np.sum(u**2), grad=lambda n, u, a: (2 * u, 0.0))
    with jax.enable_x64(False):
        J, g = rh.value_and_grad(step, loss, 1.0, 1.5, 3, schedule=rs.Revolve(2))
    assert J == 1.5**6
    assert np.asarray(g.params).dtype == np.float64 and g.params == 6 * 1.5**5
    assert np.asarray(g.state0).dtype == np.float64 and g.state0 == 2 * 1.5**6


@pytest.mark.parametrize("x64", [False, True], ids=["float32", "x64"])
def test_leaf_dtype_is_decided_as_jax_decides_it(x64):
    from retrograde.host._trees import TreeSpec, dtype_of

    bits = 64 if x64 else 32
    with jax.enable_x64(x64):
        tree = {"f": 1.0, "i": 3, "z": 1j, "b": True, "a": np.zeros(2), "h": np.float16(1)}
        want = {
            "f": f"float{bits}",
            "i": f"int{bits}",
            "z": f"complex{2 * bits}",
            "b": "bool",
            "a": f"float{bits}",
            "h": "float16",
        }
        spec = TreeSpec(tree, "params", jax_step=True)
        assert [str(d) for d in spec.dtypes] == [want[k] for k in sorted(tree)]
        assert [str(d) for d in spec.cot_dtypes] == [
            want[k] if k in "fzah" else f"float{bits}" for k in sorted(tree)
        ]
        # a NumPy step: NumPy's dtypes, x64 or not
        assert [str(dtype_of(x)) for x in (1.0, 3, 1j, np.zeros(2))] == [
            "float64",
            "int64",
            "complex128",
            "float64",
        ]
