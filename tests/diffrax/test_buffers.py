"""``bounded_while_loop``: the loop CheckpointAdjoint runs inside one solver step.

Its two ways of running -- an integer carry (replayed: a ``lax.while_loop`` over the iterations
that happen, then one vectorised evaluation of the rows written, rounded up to a tier of 2, 4,
8, ... rows: the cases below hit every tier of 12) and a carry with floats (a
masked ``lax.scan``) -- against a closed form, in every derivative mode, float64; and the
first-order form of the integer carry (``first_order=True``: each row evaluated once in the
loop, its VJP a ``custom_vjp``) in first-order modes, with its structure and evaluation count.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrograde.diffrax._buffers import bounded_while_loop, is_write_only, unwrap, wrap

TS = jnp.linspace(0.0, 1.0, 12)


def _saves(theta, t_end, ts=TS):
    """diffrax's save loop in miniature: write ``sin(theta * ts[i]) * ts[i]`` at ``i`` while
    ``ts[i] <= t_end``. The carry is an index (integer: the replayed loop)."""

    def cond(s):
        i, _ = s
        return (i < ts.shape[0]) & (ts[jnp.minimum(i, ts.shape[0] - 1)] <= t_end)

    def body(s):
        i, ys = s
        t = ts[i]
        return i + 1, ys.at[i].set(jnp.sin(theta * t) * t)

    init = (jnp.int32(0), jnp.zeros(ts.shape))
    return bounded_while_loop(cond, body, init, max_steps=ts.shape[0], buffers=lambda s: s[1])


def _saves_ref(theta, t_end, ts=TS):
    n = jnp.sum(ts <= t_end)
    return n, jnp.where(ts <= t_end, jnp.sin(theta * ts) * ts, 0.0)


def _decay(theta, t_end, ts=TS):
    """A float carry (the masked scan): ``y <- y * exp(-theta * dt)``, writing ``y`` at each
    save time ``<= t_end``."""

    def cond(s):
        i, _, _ = s
        return (i < ts.shape[0]) & (ts[jnp.minimum(i, ts.shape[0] - 1)] <= t_end)

    def body(s):
        i, y, ys = s
        y = y * jnp.exp(-theta * 0.1)
        return i + 1, y, ys.at[i].set(y)

    init = (jnp.int32(0), jnp.float64(2.0), jnp.zeros(ts.shape))
    out = bounded_while_loop(cond, body, init, max_steps=ts.shape[0], buffers=lambda s: s[2])
    return out[0], out[2]


def _decay_ref(theta, t_end, ts=TS):
    k = jnp.arange(1, ts.shape[0] + 1, dtype=ts.dtype)
    return jnp.sum(ts <= t_end), jnp.where(ts <= t_end, 2.0 * jnp.exp(-theta * 0.1 * k), 0.0)


CASES = [(_saves, _saves_ref), (_decay, _decay_ref)]


def _loss(loop):
    return lambda theta, t_end: jnp.sum(jnp.cos(loop(theta, t_end)[1]) * TS)


@pytest.mark.parametrize("loop,ref", CASES, ids=["integer carry", "float carry"])
@pytest.mark.parametrize(
    "t_end", [-1.0, 0.1, 0.25, 0.45, 2.0], ids=["none", "two", "three", "six", "all"]
)
def test_values_and_every_mode(loop, ref, t_end):
    theta, t_end = jnp.float64(0.7), jnp.float64(t_end)
    n, ys = jax.jit(loop)(theta, t_end)
    n_ref, ys_ref = ref(theta, t_end)
    assert int(n) == int(n_ref)
    np.testing.assert_allclose(ys, ys_ref, rtol=1e-13, atol=0)
    f, g = _loss(loop), _loss(ref)
    for mode in (
        jax.grad,
        lambda h: jax.grad(jax.grad(h)),
        lambda h: jax.grad(jax.grad(jax.grad(h))),
        jax.hessian,
        lambda h: lambda th, te: jax.jvp(lambda x: jax.grad(h)(x, te), (th,), (1.0,)),
    ):
        np.testing.assert_allclose(
            jax.jit(mode(f))(theta, t_end), mode(g)(theta, t_end), rtol=1e-10, atol=1e-14
        )


@pytest.mark.parametrize("loop,ref", CASES, ids=["integer carry", "float carry"])
def test_vmap_batched_predicate(loop, ref):
    """Each element stops at its own save time; gradients per element."""
    t_ends = jnp.array([-1.0, 0.2, 0.45, 2.0])
    theta = jnp.float64(0.7)
    out = jax.jit(jax.vmap(jax.grad(_loss(loop)), (None, 0)))(theta, t_ends)
    expect = jax.vmap(jax.grad(_loss(ref)), (None, 0))(theta, t_ends)
    np.testing.assert_allclose(out, expect, rtol=1e-10, atol=1e-14)
    ys = jax.vmap(lambda te: loop(theta, te)[1])(t_ends)
    np.testing.assert_allclose(ys, jax.vmap(lambda te: ref(theta, te)[1])(t_ends), rtol=1e-13)


def test_write_only_buffer_with_predicate():
    """A buffer handed in as :class:`WriteOnly` with a false predicate receives no write."""
    buf = wrap(jnp.zeros(TS.shape), pred=jnp.bool_(False))

    def body(s):
        i, b = s
        return i + 1, b.at[i].set(1.0)

    out = bounded_while_loop(lambda s: s[0] < 3, body, (jnp.int32(0), buf), max_steps=5)
    assert is_write_only(out[1])
    np.testing.assert_array_equal(unwrap(out)[1], np.zeros(TS.shape))
    out = bounded_while_loop(
        lambda s: s[0] < 3, body, (jnp.int32(0), wrap(jnp.zeros(5))), max_steps=5
    )
    np.testing.assert_array_equal(unwrap(out)[1], [1.0, 1.0, 1.0, 0.0, 0.0])


def test_replayed_loop_runs_only_the_iterations_that_happen():
    """The integer-carry loop lowers to a while loop (trip count = iterations run), not a scan
    of max_steps iterations."""
    jaxpr = jax.make_jaxpr(_saves)(0.7, 0.45)
    prims = {e.primitive.name for e in jaxpr.eqns}
    assert "while" in prims and "scan" not in prims
    jaxpr = jax.make_jaxpr(_decay)(0.7, 0.45)
    assert "while" not in {e.primitive.name for e in jaxpr.eqns}


def _first_order(loop):
    """``loop`` with the inner loop of a step that is executed or reverse-differentiated once
    (``first_order=True``, CheckpointAdjoint's ``first_order_body_fun``)."""
    import functools

    from retrograde.diffrax import _buffers

    def run(theta, t_end):
        plain = _buffers.bounded_while_loop
        _buffers.bounded_while_loop = functools.partial(plain, first_order=True)
        try:
            return loop(theta, t_end)
        finally:
            _buffers.bounded_while_loop = plain

    return run


@pytest.mark.parametrize("t_end", [-1.0, 0.1, 0.45, 2.0], ids=["none", "two", "six", "all"])
def test_first_order_values_and_gradient(t_end):
    """The one-copy save loop (a ``custom_vjp``): values and first-order gradients equal the
    closed form's, alone and under ``vmap`` with a batched predicate."""
    theta, t_end = jnp.float64(0.7), jnp.float64(t_end)
    loop = _first_order(_saves)
    n, ys = jax.jit(loop)(theta, t_end)
    n_ref, ys_ref = _saves_ref(theta, t_end)
    assert int(n) == int(n_ref)
    np.testing.assert_allclose(ys, ys_ref, rtol=1e-13, atol=0)
    f, g = _loss(loop), _loss(_saves_ref)
    np.testing.assert_allclose(
        jax.jit(jax.grad(f, (0, 1)))(theta, t_end), jax.grad(g, (0, 1))(theta, t_end), rtol=1e-12
    )
    t_ends = jnp.array([-1.0, 0.2, 0.45, 2.0])
    out = jax.jit(jax.vmap(jax.grad(f), (None, 0)))(theta, t_ends)
    np.testing.assert_allclose(out, jax.vmap(jax.grad(g), (None, 0))(theta, t_ends), rtol=1e-12)


def test_first_order_loop_evaluates_each_row_once():
    """Structure of the one-copy save loop: the body's ``sin`` is traced once into the forward
    loop and once into its VJP (no tiers, no ``switch``; the third ``sin`` is the derivative of
    the loss's ``cos``), and at run time the body runs once per row written forward and once per
    row reverse: ``2 n`` evaluations for ``n`` rows."""
    calls = []

    def saves(theta, t_end):
        def cond(s):
            i, _ = s
            return (i < TS.shape[0]) & (TS[jnp.minimum(i, TS.shape[0] - 1)] <= t_end)

        def body(s):
            i, ys = s
            jax.debug.callback(lambda: calls.append(1))
            return i + 1, ys.at[i].set(jnp.sin(theta * TS[i]) * TS[i])

        init = (jnp.int32(0), jnp.zeros(TS.shape))
        out = bounded_while_loop(
            cond, body, init, max_steps=TS.shape[0], buffers=lambda s: s[1], first_order=True
        )
        return jnp.sum(jnp.cos(out[1]) * TS)

    grad = jax.jit(jax.grad(saves))
    text = grad.lower(0.7, 0.45).as_text()
    assert text.count("stablehlo.sine") == 3 and "stablehlo.case" not in text
    jax.block_until_ready(grad(0.7, 0.45))
    calls.clear()
    jax.block_until_ready(grad(0.7, 0.45))
    assert len(calls) == 2 * 5  # five save times <= 0.45, each evaluated forward and reverse
