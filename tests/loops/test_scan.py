"""First-order correctness of ``retrograde.scan`` / ``retrograde.fori_loop`` against ``jax.lax``.

Everything in float64 under ``jax.jit``; relative error <= 1e-12 against ``jax.lax.scan`` (the
unbounded-memory reference). Compile time dominates, so each test compiles one program that
bundles several transformations, and references are compiled once per step count.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrograde
from retrograde import schedules as rs

from . import _problems as P

RTOL = 1e-12
SCHEDULES = P.offline_schedules()
SCHED_IDS = [name for name, _ in SCHEDULES]


def _ct_like(tree, seed):
    """A deterministic cotangent/tangent for ``tree``: floats get values, ints get float0."""
    rng = np.random.default_rng(seed)

    def one(x):
        if not hasattr(x, "dtype"):
            x = jnp.asarray(x)
        if jnp.issubdtype(x.dtype, jnp.inexact):
            return jnp.asarray(rng.standard_normal(x.shape), x.dtype)
        return np.zeros(x.shape, jax.dtypes.float0)

    return jax.tree_util.tree_map(one, tree)


# ----------------------------------------------------------------------------- every schedule, N

STEPS = (1, 2, 7, 100)


def _vjp_program(scan):
    """Primal outputs and the VJP w.r.t. (params, init, xs) for a cotangent on every output, for
    every step count in ``STEPS`` in one program (one compilation per schedule)."""

    def one(p, c0, xs, ct):
        out, pullback = jax.vjp(lambda p, c0, xs: P.run(scan, p, c0, xs), p, c0, xs)
        return out, pullback(ct)

    return P.jit(lambda args: {n: one(*a) for n, a in args.items()})


@functools.cache
def _vjp_reference():
    args = {}
    for n in STEPS:
        p, c0, xs = P.params(), P.init(), P.xs(n)
        out_shape = jax.eval_shape(functools.partial(P.run, P.lax_scan), p, c0, xs)
        args[n] = (p, c0, xs, _ct_like(out_shape, seed=n))
    return args, _vjp_program(P.lax_scan)(args)


@pytest.mark.parametrize("schedule", [s for _, s in SCHEDULES], ids=SCHED_IDS)
def test_vjp_every_schedule(schedule):
    """Primal and ``jax.vjp`` (cotangents on carry and ys; gradient w.r.t. the closed-over
    parameters, init and xs) for every offline schedule and N in ``STEPS``."""
    args, ref = _vjp_reference()
    got = _vjp_program(P.rscan(schedule))(args)
    failures = []
    for n in STEPS:
        (out, bar), (ref_out, ref_bar) = got[n], ref[n]
        for what, a, b in (("primal", out, ref_out), ("vjp", bar, ref_bar)):
            err = P.rel_err(a, b)
            if not err <= RTOL:
                failures.append(f"N={n} {what}: relative error {err:.3e}")
        assert out[0]["n"].dtype == jnp.int32 and int(out[0]["n"]) == n
        # The int counter gets a float0 cotangent, like with jax.lax.scan.
        assert bar[1]["n"].dtype == jax.dtypes.float0
    assert not failures, failures


# ----------------------------------------------------------------------------- every transformation


def _transforms_program(scan):
    """One jitted program exercising every first-order transformation."""

    def L(p, c0, xs):
        return P.loss(scan, p, c0, xs)

    def f(p, c0, xs, tangent, ct):
        out = {}
        out["primal"] = P.run(scan, p, c0, xs)
        out["value_and_grad"] = jax.value_and_grad(L, argnums=(0, 1, 2), allow_int=True)(p, c0, xs)
        out["grad_p"] = jax.grad(L)(p, c0, xs)
        _, pullback = jax.vjp(lambda p, c0, xs: P.run(scan, p, c0, xs), p, c0, xs)
        out["vjp"] = pullback(ct)
        out["jvp"] = jax.jvp(lambda p, c0, xs: P.run(scan, p, c0, xs), (p, c0, xs), tangent)
        y, lin = jax.linearize(L, p, c0, xs)
        out["linearize"] = (y, lin(*tangent))
        # Transposing the linearized loop (float inputs only) is the adjoint again.
        L_u = lambda p, u, xs: L(p, dict(c0, u=u), xs)
        _, lin_u = jax.linearize(L_u, p, c0["u"], xs)
        lin_t = jax.linear_transpose(lin_u, p, c0["u"], xs)
        out["linear_transpose"] = lin_t(jnp.float64(1.5))
        out["jacfwd"] = jax.jacfwd(lambda u: P.run(scan, p, dict(c0, u=u), xs)[0]["u"])(c0["u"])
        out["jacrev"] = jax.jacrev(lambda u: P.run(scan, p, dict(c0, u=u), xs)[0]["u"])(c0["u"])
        # vmap of the loop over a batch of initial states and of xs.
        u_batch = c0["u"][None, :] * jnp.array([[1.0], [0.5], [-0.7]])
        xs_batch = jax.tree_util.tree_map(lambda x: jnp.stack([x, 0.9 * x, 1.1 * x]), xs)
        out["vmap"] = jax.vmap(lambda u, xs: P.run(scan, p, dict(c0, u=u), xs))(u_batch, xs_batch)
        # vmap of the gradient over a batch of a closed-over parameter.
        cs = p["c"] * jnp.array([1.0, 1.2])
        out["vmap_grad"] = jax.vmap(lambda c: jax.grad(L, argnums=(0, 2))(dict(p, c=c), c0, xs))(cs)
        return out

    return P.jit(f)


@functools.cache
def _transforms_reference(n):
    p, c0, xs = P.params(), P.init(), P.xs(n)
    tangent = _ct_like((p, c0, xs), seed=10 + n)
    out_shape = jax.eval_shape(lambda: P.run(P.lax_scan, p, c0, xs))
    ct = _ct_like(out_shape, seed=20 + n)
    args = (p, c0, xs, tangent, ct)
    return args, _transforms_program(P.lax_scan)(*args)


@pytest.mark.parametrize(
    "schedule, n",
    [
        (rs.Revolve(3), 7),
        pytest.param(rs.Periodic(3), 100, marks=pytest.mark.slow),
    ],
    ids=["Revolve3-N7", "Periodic3-N100"],
)
def test_every_transformation(schedule, n):
    """primal, grad, value_and_grad, vjp, jvp, linearize (+ linear_transpose), jacfwd, jacrev,
    vmap of the loop and vmap of its gradient, all in one jitted program."""
    args, ref = _transforms_reference(n)
    got = _transforms_program(P.rscan(schedule))(*args)
    assert set(got) == set(ref)
    for key in ref:
        P.assert_close(got[key], ref[key], RTOL, key)


# ----------------------------------------------------------------------------- N = 0


def test_zero_steps():
    """N = 0 returns init and empty ys; the gradient w.r.t. init passes straight through and
    the gradients w.r.t. params and xs are zero (forward and reverse)."""
    p, c0, xs = P.params(), P.init(), P.xs(0)
    tangent = _ct_like((p, c0, xs), seed=3)

    def program(scan):
        def f(p, c0, xs):
            out = P.run(scan, p, c0, xs)
            g = jax.grad(P.loss, argnums=(1, 2, 3), allow_int=True)(scan, p, c0, xs)
            t = jax.jvp(lambda *a: P.loss(scan, *a), (p, c0, xs), tangent)
            return out, g, t

        return P.jit(f)

    got = program(P.rscan(rs.Revolve(3)))(p, c0, xs)
    ref = program(P.lax_scan)(p, c0, xs)
    P.assert_close(got, ref, RTOL, "N=0")
    (carry, (y0, y1)), (gp, gc, gx), _ = got
    P.assert_close(carry, c0, 0.0, "carry")
    assert y0.shape == (0,) and y1.shape == (0, P.M)
    assert float(jnp.max(jnp.abs(gp["W"]))) == 0.0 and float(gp["c"]) == 0.0
    np.testing.assert_allclose(gc["u"], 3 * c0["u"] ** 2, rtol=1e-15)
    assert gx["a"].shape == (0,)


def test_zero_steps_length_only():
    step = lambda u, _: (u * 2.0, u)
    u, ys = P.jit(lambda u: retrograde.scan(step, u, length=0))(jnp.ones(2))
    np.testing.assert_array_equal(u, jnp.ones(2))
    assert ys.shape == (0, 2)
    g = P.jit(jax.grad(lambda u: jnp.sum(retrograde.scan(step, u, length=0)[0] ** 2)))(
        jnp.arange(2.0)
    )
    np.testing.assert_array_equal(g, 2 * jnp.arange(2.0))


# ----------------------------------------------------------------------------- nesting


def _nested_loss(outer_scan, inner_scan, theta, u0, xs):
    """A loop whose step runs an inner loop of 4 sub-steps (over its own per-step inputs)."""

    def outer(u, x):
        def inner(v, z):
            v = v + 0.1 * jnp.tanh(theta * v * x + z)
            return v, jnp.sum(v)

        v, ys = inner_scan(inner, u, jnp.linspace(0.0, 0.3, 4) * x)
        return v, jnp.sum(ys**2)

    u, ys = outer_scan(outer, u0, xs)
    return jnp.sum(u**2) + 0.1 * jnp.sum(ys)


def test_nested_scan():
    """``retrograde.scan`` inside the body of ``retrograde.scan``: grad and jvp."""
    theta, u0 = jnp.float64(0.7), jnp.array([0.3, -0.2, 0.5])
    xs = jnp.linspace(0.5, 1.5, 6)

    def program(outer_scan, inner_scan):
        L = functools.partial(_nested_loss, outer_scan, inner_scan)

        def f(theta, u0, xs):
            g = jax.grad(L, argnums=(0, 1, 2))(theta, u0, xs)
            t = jax.jvp(L, (theta, u0, xs), (1.0, jnp.ones(3), jnp.ones(6)))
            return g, t

        return P.jit(f)

    ref = program(P.lax_scan, P.lax_scan)(theta, u0, xs)
    got = program(P.rscan(rs.Revolve(2)), P.rscan(rs.Revolve(2)))(theta, u0, xs)
    P.assert_close(got, ref, RTOL, "nested")


# ----------------------------------------------------------------------------- fori_loop


def _fori_loss(fori, theta, val0):
    def body(i, val):
        u, (a, k) = val
        fi = i.astype(jnp.float64)
        u = u + 0.1 * jnp.sin(theta * u + 0.1 * fi) * a
        a = a * (1.0 - 0.05 * jnp.sum(u))
        return u, (a, k + 2)

    u, (a, k) = fori(2, 11, body, val0)
    return jnp.sum(u**3) + a**2, k


@pytest.mark.parametrize("schedule", [rs.Revolve(2), rs.StoreAll()], ids=["Revolve2", "StoreAll"])
def test_fori_loop(schedule):
    """``retrograde.fori_loop`` against ``jax.lax.fori_loop`` with static bounds: value, grad
    w.r.t. a parameter and a pytree init (int leaf included), and jvp."""
    theta = jnp.float64(0.9)
    val0 = (jnp.array([0.2, -0.4, 0.6]), (jnp.float64(1.1), jnp.int32(3)))

    def program(fori):
        L = functools.partial(_fori_loss, fori)

        def f(theta, val0):
            (v, k), g = jax.value_and_grad(L, argnums=(0, 1), has_aux=True, allow_int=True)(
                theta, val0
            )
            t = jax.jvp(lambda th: L(th, val0)[0], (theta,), (jnp.float64(1.0),))
            return v, k, g, t

        return P.jit(f)

    ref = program(jax.lax.fori_loop)(theta, val0)
    got = program(functools.partial(retrograde.fori_loop, schedule=schedule))(theta, val0)
    P.assert_close(got, ref, RTOL, "fori_loop")
    assert int(got[1]) == 3 + 2 * 9


def test_fori_loop_empty_range():
    f = lambda u: retrograde.fori_loop(5, 2, lambda i, v: v * 3.0, u)
    np.testing.assert_array_equal(P.jit(f)(jnp.ones(2)), jnp.ones(2))
    np.testing.assert_array_equal(P.jit(jax.grad(lambda u: jnp.sum(f(u))))(jnp.ones(2)), 1.0)
