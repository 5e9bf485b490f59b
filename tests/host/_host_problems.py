"""Test problems for retrograde.host: a long-range-dependency loop, as a NumPy Step that updates
its state in place (hand-written adjoint) and as a JAX function, plus plain references."""

from __future__ import annotations

import numpy as np

import retrograde.host as rh
from retrograde import schedules as rs

DT = 0.05
M = 5  # state size


def schedule_list():
    """Every schedule under test, as (id, schedule)."""
    return [
        ("StoreAll", rs.StoreAll()),
        ("Revolve3", rs.Revolve(3)),
        ("RecomputeAll", rs.RecomputeAll()),
        ("Periodic4", rs.Periodic(4)),
        ("MultiLevel", multilevel()),
        ("Online3", rs.Online(3)),
    ]


def multilevel():
    """MultiLevel with 2 memory slots and 3 disk slots."""
    return rs.MultiLevel(
        [
            rs.Level(2, name="memory"),
            rs.Level(3, write_cost=0.5, read_cost=0.5, name="disk", storage="disk"),
        ]
    )


def params0(seed=0):
    rng = np.random.default_rng(seed)
    return {"a": 1.0 + 0.3 * rng.standard_normal(M), "c": np.float64(0.7)}


def state0(seed=1):
    rng = np.random.default_rng(seed)
    return {"u": 0.5 + 0.3 * rng.standard_normal(M), "memo": np.zeros(M)}


# ---------------------------------------------------------------- NumPy, in place
def np_forward(n, s, p):
    """Every third step makes memo = tanh(u); two steps later u += c * memo**2 reads it; then a
    nonlinear update. Updates the arrays of ``s`` in place and returns ``s``."""
    u, m = s["u"], s["memo"]
    if n % 3 == 0:
        m[:] = np.tanh(u)
    if n % 3 == 2:
        u += p["c"] * m**2
    u += DT * (p["a"] * np.sin(u) - 0.1 * u**3)
    return s


def np_vjp(n, s, p, sbar):
    u0, m0 = s["u"], s["memo"]
    m1 = np.tanh(u0) if n % 3 == 0 else m0
    u1 = u0 + p["c"] * m1**2 if n % 3 == 2 else u0
    return np_vjp_from(n, {"u1": u1, "m1": m1}, p, sbar)


def np_linearize(n, s, p):
    """``np_forward`` that also returns the data its adjoint reads: the state after the memo
    update (``u1``, ``m1``); updates ``s`` in place (the data are copies made first)."""
    u, m = s["u"], s["memo"]
    if n % 3 == 0:
        m[:] = np.tanh(u)
    if n % 3 == 2:
        u += p["c"] * m**2
    data = {"u1": u.copy(), "m1": m.copy()}
    u += DT * (p["a"] * np.sin(u) - 0.1 * u**3)
    return s, data


def np_vjp_from(n, data, p, sbar):
    """The step's VJP from the data of :func:`np_linearize` (no state); :func:`np_vjp` derives
    that data from the state first."""
    u1, m1 = data["u1"], data["m1"]
    a, c = p["a"], p["c"]
    ub = sbar["u"] * (1 + DT * (a * np.cos(u1) - 0.3 * u1**2))
    a_bar = sbar["u"] * DT * np.sin(u1)
    mb = np.array(sbar["memo"], copy=True)
    c_bar = 0.0
    if n % 3 == 2:
        mb = mb + ub * c * 2 * m1
        c_bar = np.sum(ub * m1**2)
    if n % 3 == 0:
        ub = ub + mb * (1 - m1**2)
        mb = np.zeros_like(mb)
    return {"u": ub, "memo": mb}, {"a": a_bar, "c": np.float64(c_bar)}


NP_STEP = rh.Step(np_forward, np_vjp)


def _zs(s):
    return {"u": np.zeros_like(s["u"]), "memo": np.zeros_like(s["memo"])}


NP_RUNNING = rh.Running(
    lambda n, s, p: 0.1 * np.sum(np.sin(s["u"]) * s["u"]),
    grad=lambda n, s, p: (
        {"u": 0.1 * (np.cos(s["u"]) * s["u"] + np.sin(s["u"])), "memo": np.zeros_like(s["memo"])},
        {"a": 0.0, "c": 0.0},
    ),
)
NP_FINAL = rh.Final(
    lambda n, s, p: np.sum(s["u"] ** 2) + np.sum(np.cos(s["memo"])) + p["c"] * np.sum(s["u"]),
    grad=lambda n, s, p: (
        {"u": 2 * s["u"] + p["c"], "memo": -np.sin(s["memo"])},
        {"a": np.zeros_like(p["a"]), "c": np.sum(s["u"])},
    ),
)
NP_LOSS = (NP_RUNNING, NP_FINAL)


def np_reference_J(s0, p, n_steps):
    """Plain NumPy evaluation of the loss (no checkpointing), for finite differences."""
    s = {k: np.array(v, copy=True) for k, v in s0.items()}
    J = 0.0
    for n in range(n_steps):
        s = np_forward(n, s, p)
        J += NP_RUNNING.f(n + 1, s, p)
    return J + NP_FINAL.f(n_steps, s, p)


def fd_grad(s0, p, n_steps, eps=1e-6):
    """Central differences of np_reference_J with respect to params a, c and state0 u."""

    def J(s, q):
        return np_reference_J(s, q, n_steps)

    ga = np.zeros(M)
    for i in range(M):
        qp = {"a": p["a"].copy(), "c": p["c"]}
        qm = {"a": p["a"].copy(), "c": p["c"]}
        qp["a"][i] += eps
        qm["a"][i] -= eps
        ga[i] = (J(s0, qp) - J(s0, qm)) / (2 * eps)
    gc = (J(s0, {"a": p["a"], "c": p["c"] + eps}) - J(s0, {"a": p["a"], "c": p["c"] - eps})) / (
        2 * eps
    )
    gu = np.zeros(M)
    for i in range(M):
        sp = {k: v.copy() for k, v in s0.items()}
        sm = {k: v.copy() for k, v in s0.items()}
        sp["u"][i] += eps
        sm["u"][i] -= eps
        gu[i] = (J(sp, p) - J(sm, p)) / (2 * eps)
    return ga, gc, gu


# ---------------------------------------------------------------- JAX, functional
def jax_step(n, s, p):
    import jax.numpy as jnp

    u, m = s["u"], s["memo"]
    m = jnp.where(n % 3 == 0, jnp.tanh(u), m)
    u = jnp.where(n % 3 == 2, u + p["c"] * m**2, u)
    u = u + DT * (p["a"] * jnp.sin(u) - 0.1 * u**3)
    return {"u": u, "memo": m}


def _jrun(n, s, p):
    import jax.numpy as jnp

    return 0.1 * jnp.sum(jnp.sin(s["u"]) * s["u"])


def _jfin(n, s, p):
    import jax.numpy as jnp

    return jnp.sum(s["u"] ** 2) + jnp.sum(jnp.cos(s["memo"])) + p["c"] * jnp.sum(s["u"])


JAX_LOSS = (rh.Running(_jrun), rh.Final(_jfin))


def jax_reference_J(p, s0, n_steps):
    """The loss through jax.lax.scan (unbounded memory): the reference."""
    import jax
    import jax.numpy as jnp

    def body(s, n):
        s = jax_step(n, s, p)
        return s, _jrun(n + 1, s, p)

    s, js = jax.lax.scan(body, s0, jnp.arange(n_steps))
    return jnp.sum(js) + _jfin(n_steps, s, p)


def jax_reference(n_steps):
    """``(J, dJ/dp, dJ/ds0)`` of :func:`jax_reference_J` at ``params0()``, ``state0()``."""
    import jax
    import jax.numpy as jnp

    s0 = jax.tree_util.tree_map(jnp.asarray, state0())
    p = jax.tree_util.tree_map(jnp.asarray, params0())
    grad = jax.jit(jax.value_and_grad(jax_reference_J, argnums=(0, 1)), static_argnums=2)
    J, (gp, gs) = grad(p, s0, n_steps)
    return float(J), gp, gs
