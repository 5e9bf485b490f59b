"""The aliasing contract: steps may overwrite what they are handed, losses may return the state's
arrays, callers may change anything they passed or got back; gradients never change."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import retrograde.host as rh
from retrograde import schedules as rs

from . import _host_problems as P

# ------------------------------------------------------------------ three aliasing cases
# (1) a loss gradient returns the state and the vjp overwrites it; (2) the caller changes
# fp.state; (3) a vjp writes into the cotangent it was handed.
N10 = 10


def _fwd(n, u, a):
    u += 0.01 * a * np.sin(u)
    return u


def _vjp_rerun(n, u, a, ub):
    """Uses u, then re-runs the in-place forward on it (to rebuild intermediates, say)."""
    sb = ub * (1 + 0.01 * a * np.cos(u))
    pb = 0.01 * np.sum(ub * np.sin(u))
    _fwd(n, u, a)
    return sb, pb


def _vjp_into_cotangent(n, u, a, ub):
    """Writes its result into the cotangent it was handed."""
    pb = 0.01 * np.sum(ub * np.sin(u))
    ub *= 1 + 0.01 * a * np.cos(u)
    return ub, pb


RERUN = rh.Step(_fwd, _vjp_rerun)
INTO_COTANGENT = rh.Step(_fwd, _vjp_into_cotangent)
# the README's loss gradient: returns the state's own array
FINAL = rh.Final(lambda n, u, a: 0.5 * np.sum(u**2), grad=lambda n, u, a: (u, 0.0))
RUNNING = rh.Running(lambda n, u, a: 0.5 * np.sum(u**2), grad=lambda n, u, a: (u, 0.0))


def _J(a, terms, u0=np.ones(4), w=None):  # noqa: B008 - read only (copied below)
    u, J = u0.copy(), 0.0
    for n in range(N10):
        u = _fwd(n, u, a)
        J += sum(0.5 * np.sum(u**2) for t in terms if t is RUNNING)
    J += sum(0.5 * np.sum(u**2) for t in terms if t is FINAL)
    return J + (0.0 if w is None else float(np.dot(w, u)))


def _fd(terms, a=1.5, eps=1e-6, **kw):
    return (_J(a + eps, terms, **kw) - _J(a - eps, terms, **kw)) / (2 * eps)


@pytest.mark.parametrize(
    "terms", [(FINAL,), (RUNNING,), (RUNNING, FINAL)], ids=["final", "running", "both"]
)
@pytest.mark.parametrize("storage", [rh.Memory(), rh.Disk()], ids=["memory", "disk"])
def test_case1_loss_gradient_returns_the_state_and_vjp_overwrites_it(terms, storage):
    _, g = rh.value_and_grad(
        RERUN, terms, np.ones(4), 1.5, N10, schedule=rs.Revolve(3), storage=storage
    )
    np.testing.assert_allclose(g.params, _fd(terms), rtol=1e-8)


def test_case2_mutating_fp_state_changes_nothing():
    with rh.forward(RERUN, np.ones(4), 1.5, N10, schedule=rs.Revolve(3), loss=FINAL) as fp:
        g1 = fp.vjp()
        uN = fp.state
        uN -= uN.mean()
        g2 = fp.vjp()
    assert g1.params == g2.params
    np.testing.assert_allclose(g2.params, _fd((FINAL,)), rtol=1e-8)


def test_case3_vjp_that_writes_into_its_cotangent_leaves_the_callers_alone():
    w = np.linspace(0.5, 1.0, 4)
    w0 = w.copy()
    with rh.forward(INTO_COTANGENT, np.ones(4), 1.5, N10, schedule=rs.Revolve(3), loss=FINAL) as fp:
        g1 = fp.vjp(w, loss_bar=0)
        np.testing.assert_array_equal(w, w0)
        g2 = fp.vjp(w, loss_bar=0)
    np.testing.assert_allclose(g1.params, _fd((), w=w0), rtol=1e-8)
    assert g1.params == g2.params


def test_parameters_and_loss_inputs_are_read_only():
    def fwd(n, u, a):
        a[0] = 0.0  # a step that scribbles on its parameters is refused, not obeyed
        return u

    with pytest.raises(ValueError, match="read-only"):
        rh.value_and_grad(
            rh.Step(fwd, _vjp_rerun), FINAL, np.ones(4), np.ones(2), 3, schedule=rs.Revolve(2)
        )

    def scribbling_grad(n, u, a):
        u[:] = 0.0
        return u, 0.0

    with pytest.raises(ValueError, match="read-only"):
        rh.value_and_grad(
            RERUN,
            rh.Final(FINAL.f, grad=scribbling_grad),
            np.ones(4),
            1.5,
            3,
            schedule=rs.Revolve(2),
        )


# ------------------------------------------------------------------ the property test
DT = 0.1


def _np_forward(k, mode):
    def forward(n, s, p):
        u, v = s["u"], s["v"]
        if mode == "fresh":
            v = np.tanh(u) if n % k == 0 else v.copy()
            return {"u": u + DT * (p["a"] * np.sin(u) + p["c"] * v**2), "v": v}
        if n % k == 0:
            v[:] = np.tanh(u)
        u += DT * (p["a"] * np.sin(u) + p["c"] * v**2)
        return s

    return forward


def _np_vjp(k, mode, forward):
    def vjp(n, s, p, sb):
        assert not p["a"].flags.writeable
        u0, v0, a, c = s["u"], s["v"], p["a"], p["c"]
        v1 = np.tanh(u0) if n % k == 0 else v0
        ub_out, vb_out = sb["u"], sb["v"]
        a_bar = ub_out * DT * np.sin(u0)
        c_bar = np.sum(ub_out * DT * v1**2)
        vb = vb_out + ub_out * DT * c * 2 * v1
        ub = ub_out * (1 + DT * a * np.cos(u0))
        if n % k == 0:
            ub = ub + vb * (1 - v1**2)
            vb = np.zeros_like(vb)
        if mode == "inplace":  # results written into the arrays handed in, and returned
            s["u"][...] = ub
            sb["v"][...] = vb
            return {"u": s["u"], "v": sb["v"]}, {"a": a_bar, "c": c_bar}
        if mode == "rerun":  # rebuild intermediates by running the in-place step again
            forward(n, {"u": u0, "v": v0}, p)
        if mode in ("scribble", "rerun"):
            for x in (u0, v0, ub_out, vb_out):
                x[...] = np.nan
        return {"u": ub, "v": vb}, {"a": a_bar, "c": c_bar}

    return vjp


def _np_jvp(k, scribble):
    def jvp(n, s, p, sd, pd):
        u0, v0, a, c = s["u"], s["v"], p["a"], p["c"]
        ud, vd, ad, cd = sd["u"], sd["v"], pd["a"], pd["c"]
        v1 = np.tanh(u0) if n % k == 0 else v0.copy()
        v1d = (1 - v1**2) * ud if n % k == 0 else vd.copy()
        u1 = u0 + DT * (a * np.sin(u0) + c * v1**2)
        u1d = ud + DT * (ad * np.sin(u0) + a * np.cos(u0) * ud + cd * v1**2 + c * 2 * v1 * v1d)
        if scribble:
            for x in (u0, v0, ud, vd):
                x[...] = np.nan
        return {"u": u1, "v": v1}, {"u": u1d, "v": v1d}

    return jvp


def _np_step(k, fwd_mode, vjp_mode, jvp_scribble):
    forward = _np_forward(k, fwd_mode)
    return rh.Step(
        forward, _np_vjp(k, vjp_mode, _np_forward(k, "inplace")), _np_jvp(k, jvp_scribble)
    )


def _jax_step(n, s, p):
    u, v = s["u"], s["v"]
    v = jnp.where(n % 3 == 0, jnp.tanh(u), v)
    return {"u": u + DT * (p["a"] * jnp.sin(u) + p["c"] * v**2), "v": v}


G = np.array([0.3, -0.2, 0.5, 0.1])  # a global array a loss gradient returns
G_COPY = G.copy()


def _np_losses(m):
    g = G[:m]
    running = rh.Running(
        lambda n, s, p: 0.5 * np.sum(s["u"] ** 2),
        grad=lambda n, s, p: ({"u": s["u"], "v": 0.0}, 0.0),
    )
    final = rh.Final(
        lambda n, s, p: 0.5 * np.sum(s["u"] ** 2) + np.sum(g * s["v"]) + p["c"] * np.sum(s["v"]),
        grad=lambda n, s, p: ({"u": s["u"], "v": g + p["c"]}, {"a": 0.0, "c": np.sum(s["v"])}),
    )
    return running, final


def _jrun(n, s, p):
    return 0.5 * jnp.sum(s["u"] ** 2)


def _jfin(n, s, p):
    return (
        0.5 * jnp.sum(s["u"] ** 2)
        + jnp.sum(jnp.asarray(G[: s["v"].shape[0]]) * s["v"])
        + p["c"] * jnp.sum(s["v"])
    )


STORAGES = ["memory", "disk", "mixed"]
SCHEDULES = [name for name, _ in P.schedule_list()]


def _schedule(name):
    return dict(P.schedule_list())[name]


def _storage(kind, schedule, tmp):
    if kind == "memory":
        return rh.Memory()
    if kind == "mixed" and len(schedule.levels) > 1:
        return {0: rh.Memory(), 1: rh.Disk(tmp)}
    return rh.Disk(tmp)


@st.composite
def loops(draw):
    kind = draw(st.sampled_from(["numpy", "jax"]))
    m = draw(st.sampled_from([1, 3, 4]))
    case = dict(
        kind=kind,
        m=m,
        k=3 if kind == "jax" else draw(st.integers(1, 4)),
        n_steps=draw(st.integers(0, 10)),
        fwd_mode=draw(st.sampled_from(["inplace", "fresh"])),
        vjp_mode=draw(st.sampled_from(["fresh", "scribble", "inplace", "rerun"])),
        jvp_scribble=draw(st.booleans()),
        schedule=draw(st.sampled_from(SCHEDULES)),
        storage=draw(st.sampled_from(STORAGES)),
        losses=draw(st.sampled_from(["running", "final", "both"])),
        jax_losses=kind == "jax" and draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        # each vjp: (with a state cotangent?, loss_bar)
        calls=draw(
            st.lists(
                st.tuples(st.booleans(), st.sampled_from([0.0, 1.0, 0.5])), min_size=1, max_size=3
            )
        ),
        last_keep=draw(st.booleans()),
        until=draw(st.booleans()),
    )
    return case


def _inputs(case):
    rng = np.random.default_rng(case["seed"])
    m = case["m"]
    s0 = {"u": 0.5 + 0.3 * rng.standard_normal(m), "v": 0.1 * rng.standard_normal(m)}
    p = {"a": 1.0 + 0.3 * rng.standard_normal(m), "c": np.array(0.3 + 0.1 * rng.random())}
    bars = [{"u": rng.standard_normal(m), "v": rng.standard_normal(m)} for _ in case["calls"]]
    tangents = (
        {"u": rng.standard_normal(m), "v": rng.standard_normal(m)},
        {"a": rng.standard_normal(m), "c": np.array(rng.standard_normal())},
    )
    return s0, p, bars, tangents


def _read_only(tree):
    leaves = jax.tree_util.tree_leaves(tree)
    assert not any(isinstance(x, np.ndarray) and x.flags.writeable for x in leaves)
    return True


def _copy(tree):
    return jax.tree_util.tree_map(lambda x: np.array(x, copy=True), tree)


def _spoil(tree):
    for x in jax.tree_util.tree_leaves(tree):
        if isinstance(x, np.ndarray) and x.flags.writeable:
            x[...] = np.nan


def _assert_same(got, want):
    for x, y in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-12, atol=1e-14)


def check_loop(case, tmp_path):
    s0, p, bars, (sd, pd) = _inputs(case)
    jax_kind = case["kind"] == "jax"
    if jax_kind:
        step = _jax_step
        clean = _jax_step
    else:
        step = _np_step(case["k"], case["fwd_mode"], case["vjp_mode"], case["jvp_scribble"])
        clean = _np_step(case["k"], "fresh", "fresh", False)
    if case["jax_losses"]:
        running, final = rh.Running(_jrun), rh.Final(_jfin)
    else:
        running, final = _np_losses(case["m"])
    loss = {"running": running, "final": final, "both": (running, final)}[case["losses"]]
    N = case["n_steps"]
    schedule = _schedule(case["schedule"])
    kw = {}
    if case["until"] and schedule.online:
        kw = dict(until=lambda n, s: _read_only(s) and n >= N)
        n_arg = None
    else:
        n_arg = N
    storage = _storage(case["storage"], schedule, tmp_path)

    # the reference: unbounded memory, a clean step, untouched inputs
    with rh.forward(clean, _copy(s0), _copy(p), N, schedule=rs.StoreAll(), loss=loss) as ref:
        want = [
            ref.vjp(_copy(b) if with_bar else None, loss_bar=lb)
            for (with_bar, lb), b in zip(case["calls"], bars)
        ]
        want_state, want_value = ref.state, ref.value

    s0_given, p_given = _copy(s0), _copy(p)
    with rh.forward(step, s0, p, n_arg, schedule=schedule, loss=loss, storage=storage, **kw) as fp:
        assert fp.n_steps == N
        _assert_same(s0, s0_given)  # the caller's arrays were not touched
        _assert_same(p, p_given)
        _assert_same(fp.state, want_state)
        assert fp.value == pytest.approx(want_value, rel=1e-13)
        _spoil(fp.state)  # the caller changes everything it passed or got
        _spoil(s0)
        _spoil(p)
        for i, ((with_bar, lb), b) in enumerate(zip(case["calls"], bars)):
            last = i == len(bars) - 1
            b_given = _copy(b)
            g = fp.vjp(b if with_bar else None, loss_bar=lb, keep=not last or case["last_keep"])
            _assert_same(b, b_given)
            _assert_same(g, want[i])
            _spoil(g)
            _spoil(b)
    np.testing.assert_array_equal(G, G_COPY)
    assert list(tmp_path.iterdir()) == []

    # one gradient (no handle: no copy of params, the final gradient becomes the cotangent)
    s0, p, _, (sd, pd) = _inputs(case)
    J_ref, g_ref = rh.value_and_grad(clean, loss, _copy(s0), _copy(p), N, schedule=rs.StoreAll())
    J, g = rh.value_and_grad(step, loss, s0, p, n_arg, schedule=schedule, storage=storage, **kw)
    assert J == pytest.approx(J_ref, rel=1e-13)
    _assert_same(g, g_ref)
    _assert_same((s0, p), _inputs(case)[:2])
    if case["jax_losses"]:  # and its Hessian-vector product
        h_ref = rh.hvp(clean, loss, _copy(s0), _copy(p), N, pd, sd, schedule=rs.StoreAll())
        h = rh.hvp(step, loss, s0, p, n_arg, pd, sd, schedule=schedule, storage=storage, **kw)
        _assert_same(h, h_ref)
    assert list(tmp_path.iterdir()) == []

    if not jax_kind:  # forward mode, with a jvp that scribbles on what it is handed
        s0, p, _, (sd, pd) = _inputs(case)
        t_want = rh.jvp(clean, _copy(s0), _copy(p), N, _copy(sd), _copy(pd), loss=loss)
        given = _copy((s0, p, sd, pd))
        t = rh.jvp(step, s0, p, N, sd, pd, loss=loss)
        _assert_same((s0, p, sd, pd), given)
        _assert_same(t.state_dot, t_want.state_dot)
        assert t.value_dot == pytest.approx(t_want.value_dot, rel=1e-12, abs=1e-14)


PROPERTY = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@PROPERTY
@given(case=loops())
def test_random_host_loops_give_the_reference_gradient(case, tmp_path_factory):
    check_loop(case, tmp_path_factory.mktemp("snapshots"))


@pytest.mark.slow
@settings(PROPERTY, max_examples=600, derandomize=False)
@given(case=loops())
def test_random_host_loops_long(case, tmp_path_factory):
    check_loop(case, tmp_path_factory.mktemp("snapshots"))
