"""Higher-order derivatives of ``retrograde.scan`` against ``jax.lax.scan``.

Float64 under ``jax.jit``; relative error <= 1e-10. Plus Taylor tests: the gradient and the
Hessian (computed through the checkpointed reverse sweeps) make the Taylor remainder of the
loss converge at second and third order.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrograde import schedules as rs

from . import _problems as P

RTOL = 1e-10
N = 5


def _all_orders(scan):
    """Every higher-order transformation in one jitted program."""
    L = functools.partial(P.small_loss, scan)

    def f(p, u0, xs, dp, du, dxs):
        out = {}
        Lb = lambda b: L(dict(p, b=b), u0, xs)
        out["grad_grad"] = jax.grad(jax.grad(Lb))(p["b"])
        out["grad_grad_grad"] = jax.grad(jax.grad(jax.grad(Lb)))(p["b"])
        # Mixed: gradient w.r.t. p and xs of a scalar function of the gradient w.r.t. u0.
        out["mixed"] = jax.grad(
            lambda p, xs: jnp.sum(jnp.sin(jax.grad(L, argnums=1)(p, u0, xs))), argnums=(0, 1)
        )(p, xs)
        out["hessian"] = jax.hessian(L, argnums=(0, 1))(p, u0, xs)
        out["jacfwd_jacrev"] = jax.jacfwd(jax.jacrev(L, argnums=2), argnums=2)(p, u0, xs)
        out["jacrev_jacrev"] = jax.jacrev(jax.jacrev(L, argnums=(0, 1)), argnums=(0, 1))(p, u0, xs)
        grad_all = jax.grad(L, argnums=(0, 1, 2))
        out["hvp"] = jax.jvp(grad_all, (p, u0, xs), (dp, du, dxs))
        out["grad_of_jvp"] = jax.grad(
            lambda p, u0, xs: jax.jvp(L, (p, u0, xs), (dp, du, dxs))[1], argnums=(0, 1, 2)
        )(p, u0, xs)
        # Third order forward over reverse, and reverse over an HVP under jax.checkpoint.
        hvp_u = lambda u: jax.jvp(lambda v: jax.grad(L, argnums=1)(p, v, xs), (u,), (du,))
        out["jvp_jvp_grad"] = jax.jvp(lambda u: hvp_u(u)[1], (u0,), (du[::-1],))
        out["grad_checkpoint_hvp"] = jax.grad(
            jax.checkpoint(lambda u: jnp.sum(jnp.sin(hvp_u(u)[0] * hvp_u(u)[1])))
        )(u0)
        # vmap of HVPs over a batch of directions in u0.
        dus = jnp.stack([du, 2.0 * du[::-1], jnp.ones_like(du)])
        out["vmap_hvp"] = jax.vmap(
            lambda d: jax.jvp(lambda u: jax.grad(L, argnums=1)(p, u, xs), (u0,), (d,))[1]
        )(dus)
        return out

    return P.jit(f)


def _some_orders(scan):
    """A smaller set for the other schedules: forward-over-reverse and reverse-over-reverse."""
    L = functools.partial(P.small_loss, scan)

    def f(p, u0, xs, dp, du, dxs):
        return {
            "hessian": jax.hessian(L, argnums=(0, 1))(p, u0, xs),
            "grad_grad": jax.grad(
                lambda p, xs: jnp.sum(jax.grad(L, argnums=(0, 1))(p, u0, xs)[1] ** 2),
                argnums=(0, 1),
            )(p, xs),
        }

    return P.jit(f)


def _args():
    p, u0, xs = P.small_params(), P.small_u0(), P.small_xs(N)
    rng = np.random.default_rng(7)
    dp = jax.tree_util.tree_map(lambda x: jnp.asarray(rng.standard_normal(np.shape(x))), p)
    du = jnp.asarray(rng.standard_normal(2))
    dxs = jnp.asarray(rng.standard_normal(N))
    return p, u0, xs, dp, du, dxs


@functools.cache
def _reference(which):
    program = {"all": _all_orders, "some": _some_orders}[which]
    return program(P.lax_scan)(*_args())


def _check(got, ref):
    assert set(got) == set(ref)
    failures = []
    for key in ref:
        err = P.rel_err(got[key], ref[key])
        if not err <= RTOL:
            failures.append(f"{key}: {err:.3e}")
    assert not failures, failures


def test_every_higher_order_transformation():
    """grad(grad), grad(grad(grad)), mixed, hessian, jacfwd(jacrev), jacrev(jacrev), jvp(grad),
    grad(jvp), jvp(jvp(grad)), grad of a checkpointed HVP and vmap of HVPs, under
    Revolve(2)."""
    _check(_all_orders(P.rscan(rs.Revolve(2)))(*_args()), _reference("all"))


@pytest.mark.parametrize("schedule", [rs.StoreAll(), rs.Periodic(3)], ids=["StoreAll", "Periodic3"])
def test_hessian_and_grad_grad(schedule):
    _check(_some_orders(P.rscan(schedule))(*_args()), _reference("some"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "schedule", [s for _, s in P.offline_schedules()], ids=[i for i, _ in P.offline_schedules()]
)
def test_every_higher_order_transformation_every_schedule(schedule):
    _check(_all_orders(P.rscan(schedule))(*_args()), _reference("all"))


def _nested_loss(scan, theta):
    """A loop whose step runs an inner loop (the case where a custom_vjp adjoint breaks
    ``jax.hessian``)."""

    def outer(u, x):
        def inner(v, z):
            return v + 0.1 * jnp.tanh(theta * v * x + z), jnp.sum(v)

        v, ys = scan(inner, u, jnp.linspace(0.0, 0.3, 3) * x)
        return v, jnp.sum(ys**2)

    u, ys = scan(outer, jnp.array([0.3, -0.2]), jnp.linspace(0.5, 1.5, 4))
    return jnp.sum(u**2) + jnp.sum(ys)


def test_nested_hessian_and_grad_grad():
    def program(scan):
        L = functools.partial(_nested_loss, scan)
        return P.jit(lambda th: (jax.hessian(L)(th), jax.grad(jax.grad(L))(th)))

    got = program(P.rscan(rs.Revolve(2)))(jnp.float64(0.7))
    ref = program(P.lax_scan)(jnp.float64(0.7))
    P.assert_close(got, ref, RTOL, "nested")


# ----------------------------------------------------------------------------- Taylor tests


def _slope(hs, rs_):
    return float(np.polyfit(np.log(hs), np.log(rs_), 1)[0])


def test_taylor_remainders():
    """|J(m + h d) - J(m) - h g.d| = O(h^2) and |... - h^2/2 d.H.d| = O(h^3), with g from the
    checkpointed adjoint and H.d from forward-over-reverse, on a 40-step loop with 2 slots."""
    n = 40
    scan = P.rscan(rs.Revolve(2))
    p, u0, xs = P.small_params(), P.small_u0(), P.small_xs(n)
    m = (p, u0, xs)
    rng = np.random.default_rng(11)
    d = jax.tree_util.tree_map(lambda x: jnp.asarray(rng.standard_normal(np.shape(x))), m)
    J = lambda m: P.small_loss(scan, *m)
    vdot = lambda a, b: sum(
        jnp.vdot(x, y) for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )

    @P.jit
    def derivatives(m, d):
        g = jax.grad(J)(m)
        _, hd = jax.jvp(jax.grad(J), (m,), (d,))
        return J(m), vdot(g, d), vdot(d, hd)

    @P.jit
    def shifted(h):
        return J(jax.tree_util.tree_map(lambda x, y: x + h * y, m, d))

    j0, gd, dhd = (float(v) for v in derivatives(m, d))
    hs = 1e-2 * 2.0 ** -np.arange(5)
    js = np.array([float(shifted(h)) for h in hs])
    r1 = np.abs(js - j0 - hs * gd)
    r2 = np.abs(js - j0 - hs * gd - 0.5 * hs**2 * dhd)
    s1, s2 = _slope(hs, r1), _slope(hs, r2)
    assert abs(s1 - 2.0) <= 0.2, (s1, r1)
    assert abs(s2 - 3.0) <= 0.2, (s2, r2)


# ----------------------------------------------------------------------------- regressions


def test_grad_grad_with_ys_cotangent_depending_on_params():
    """Regression: reverse-over-reverse lost the ``J_Q ct`` cotangent of the ``ys`` half of the
    adjoint's cotangent input when the carry also had float leaves (the transpose returned its
    cotangents in the order ``a_k, a_y, b_k, b_y`` instead of ``a_k, b_k, a_y, b_y``), so
    ``grad(grad)`` of ``sum(y**2)`` with ``y = u + b``, ``N = 1`` gave 0 instead of 2."""
    step = lambda b: lambda u, _: (u + b, u + b)

    def program(scan):
        J = lambda b: jnp.sum(scan(step(b), jnp.float64(0.5), None, length=3)[1] ** 2)
        return P.jit(jax.grad(jax.grad(J)))

    got = program(P.rscan(rs.StoreAll()))(jnp.float64(0.6))
    ref = program(P.lax_scan)(jnp.float64(0.6))
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    assert float(ref) == pytest.approx(28.0)


def test_derivatives_of_a_pruned_adjoint():
    """``jax.jit`` prunes the adjoint's unread outputs (its dead-code rule: here the cotangents
    of ``u0`` and ``xs``). The pruned adjoint must still differentiate, batch and run."""
    from jax._src.interpreters import partial_eval as pe
    from jax.extend import core as jcore

    p, u0, xs, dp, _, _ = _args()

    def program(scan, check_pruned=False):
        L = functools.partial(P.small_loss, scan)
        closed = jax.make_jaxpr(lambda p: jax.grad(L)(p, u0, xs))(p)
        jaxpr, _ = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
        if check_pruned:
            keeps = [e.params["keep"] for e in jaxpr.eqns if "keep" in e.params]
            assert keeps and any(not all(m) for k in keeps for m in k if m), keeps
        flat = jcore.jaxpr_as_fun(jcore.ClosedJaxpr(jaxpr, closed.consts))
        g = lambda p: flat(*jax.tree_util.tree_leaves(p))
        # Jitted (one compile; eagerly, each primitive of the derivatives compiles on its own).
        return jax.jit(
            lambda p: {
                "grad": jax.grad(lambda p: sum(jnp.sum(v**2) for v in g(p)))(p),
                "jvp": jax.jvp(g, (p,), (dp,))[1],
                "vmap": jax.vmap(lambda s: g(jax.tree_util.tree_map(lambda v: s * v, p)))(
                    jnp.array([0.5, 1.0])
                ),
            }
        )(p)

    _check(program(P.rscan(rs.Revolve(2)), check_pruned=True), program(P.lax_scan))
