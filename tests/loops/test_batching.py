"""``vmap`` of the loops batches only what is batched, as ``jax.lax``'s loops do.

A batched loop runs its unbatched program under ``jax.vmap``: closed-over values and carry leaves
that never meet a batched value stay unbatched, axis names bind inside the step and the
predicate, and derivatives of batched loops (and batches of derivatives) equal ``jax.lax``'s.
Everything in float64 against ``jax.lax.scan`` / ``jax.lax.while_loop``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrograde
from retrograde.schedules import Mixed, Revolve

from ._problems import assert_close

N = 12


def _ours(schedule=Revolve(3)):
    return functools.partial(retrograde.scan, schedule=schedule)


def _shared_weight_loss(scan, w, u0):
    def step(u, x):
        return jnp.tanh(w @ u) + 0.1 * x, jnp.sum(u)

    u, ys = scan(step, u0, jnp.linspace(0.0, 1.0, N))
    return jnp.sum(u**2) + jnp.sum(ys)


def test_unbatched_weight_stays_unbatched():
    """vmap over initial states with a shared closed-over weight: the vmapped loss needs no more
    temporary memory than lax.scan's (the weight is not copied per batch element), and the
    gradients (per example, with respect to the state and to the weight) are lax.scan's."""
    d, b = 40, 8
    w = jax.random.normal(jax.random.PRNGKey(0), (d, d)) / d
    u0s = jax.random.normal(jax.random.PRNGKey(1), (b, d))

    def temp(scan):
        f = jax.vmap(lambda u: _shared_weight_loss(scan, w, u))
        return jax.jit(f).lower(u0s).compile().memory_analysis().temp_size_in_bytes

    assert temp(_ours()) <= 1.2 * temp(jax.lax.scan) + 4 * 8 * b * d
    for argnums in (0, 1):
        g = lambda scan: jax.vmap(
            jax.grad(functools.partial(_shared_weight_loss, scan), argnums=argnums), (None, 0)
        )(w, u0s)
        assert_close(g(_ours()), g(jax.lax.scan), 1e-12)


def _mixed(scan, c, u0, v0, xs):
    """Carry (u, v, k): u meets the batched input, v only the unbatched c, k never changes."""

    def step(carry, x):
        u, v, k = carry
        return (u * jnp.cos(c * v) + x, v * 0.9 + c, k), u[0] + v

    return scan(step, (u0, v0, jnp.float64(2.0)), xs)


@pytest.mark.parametrize(
    "in_axes",
    [(None, 0, None, None), (0, None, None, None), (None, None, None, 1), (None, 1, 0, None)],
)
def test_mixed_batching_matches_lax(in_axes):
    c, u0, v0 = jnp.float64(0.3), jnp.ones(3), jnp.float64(0.5)
    xs = jnp.linspace(0.0, 1.0, N * 3).reshape(N, 3)
    args = [c, u0, v0, xs]
    args = [
        jnp.stack([a * (1 + 0.1 * i) for i in range(4)], axis=ax) if ax is not None else a
        for a, ax in zip(args, in_axes)
    ]
    ours = jax.vmap(functools.partial(_mixed, _ours()), in_axes)(*args)
    ref = jax.vmap(functools.partial(_mixed, jax.lax.scan), in_axes)(*args)
    assert_close(ours, ref, 1e-12)
    # Gradients of a batched loop, and a batch of gradients.
    loss = lambda scan: lambda *a: sum(jnp.sum(t) for t in jax.tree.leaves(_mixed(scan, *a)))
    g_ours = jax.vmap(jax.grad(loss(_ours()), argnums=(0, 1, 2, 3)), in_axes)(*args)
    g_ref = jax.vmap(jax.grad(loss(jax.lax.scan), argnums=(0, 1, 2, 3)), in_axes)(*args)
    assert_close(g_ours, g_ref, 1e-12)
    g_ours = jax.grad(lambda *a: jnp.sum(jax.vmap(loss(_ours()), in_axes)(*a)), (0, 1, 2, 3))
    g_ref = jax.grad(lambda *a: jnp.sum(jax.vmap(loss(jax.lax.scan), in_axes)(*a)), (0, 1, 2, 3))
    assert_close(g_ours(*args), g_ref(*args), 1e-12)


def test_unchanged_carry_leaf_stays_unbatched():
    """A carry leaf the loop never changes comes back unbatched: out_axes=None works."""
    xs = jnp.ones((5, N))

    def f(scan, x):
        (k, u), _ = scan(lambda c, x: ((c[0], c[1] + x * c[0]), None), (jnp.float64(2.0), 0.0), x)
        return k, u

    k, u = jax.vmap(functools.partial(f, _ours()), out_axes=(None, 0))(xs)
    assert k == 2.0 and u.shape == (5,)
    w = jax.vmap(
        lambda x: retrograde.while_loop(
            lambda c: c[0] < 4, lambda c: (c[0] + 1, c[1], c[2] + x), (0, 3.0, x)
        ),
        out_axes=(None, None, 0),
    )(jnp.arange(3.0))
    assert w[1] == 3.0


def test_axis_name_binds_in_step_and_predicate():
    """lax.psum over the vmap's axis inside the step, lax.axis_index in a while predicate."""
    xs = jnp.linspace(0.0, 1.0, 4 * N).reshape(4, N)

    def scan_psum(scan, x):
        def step(c, xi):
            return c + jax.lax.psum(xi, "i") * c * 0.1, c

        return scan(step, 1.0, x)

    ours = jax.vmap(functools.partial(scan_psum, _ours()), axis_name="i")(xs)
    ref = jax.vmap(functools.partial(scan_psum, jax.lax.scan), axis_name="i")(xs)
    assert_close(ours, ref, 1e-12)
    g = lambda scan: jax.grad(
        lambda x: jnp.sum(jax.vmap(functools.partial(scan_psum, scan), axis_name="i")(x)[0])
    )
    assert_close(g(_ours())(xs), g(jax.lax.scan)(xs), 1e-12)

    def run(loop, u):
        return loop(
            lambda c: c[0] < 3 + jax.lax.axis_index("i"), lambda c: (c[0] + 1, c[1] * 1.5), (0, u)
        )[1]

    u = jnp.arange(1.0, 5.0)
    ours = jax.vmap(lambda u: run(retrograde.while_loop, u), axis_name="i")(u)
    ref = jax.vmap(lambda u: run(jax.lax.while_loop, u), axis_name="i")(u)
    assert_close(ours, ref, 1e-12)
    grad = jax.grad(
        lambda u: jnp.sum(jax.vmap(lambda v: run(retrograde.while_loop, v), axis_name="i")(u) ** 2)
    )(u)
    assert_close(grad, 2 * ref * 1.5 ** (3 + np.arange(4)), 1e-12)


def test_axis_name_binds_without_batched_inputs():
    """A loop whose inputs are all unbatched but whose step or predicate names the vmap's axis
    (lax.axis_index, lax.psum, inside a lax.cond) is batched, as jax.lax's loops are (JAX's
    testWhileLoopAxisIndexBatched)."""

    def run(loop, x):
        return loop(lambda c: c < jax.lax.axis_index("i"), lambda c: c + 2, x)

    batch = lambda f: jax.vmap(lambda _, x: f(x), axis_name="i", in_axes=(0, None))
    ours = batch(lambda x: run(retrograde.while_loop, x))(jnp.zeros(4), 0)
    assert_close(ours, batch(lambda x: run(jax.lax.while_loop, x))(jnp.zeros(4), 0), 0)

    def scan_named(scan, w):
        def step(c, _):
            index = jax.lax.convert_element_type(jax.lax.axis_index("i"), c.dtype)
            bump = jax.lax.cond(c > 0, lambda: index * 0.01, lambda: jnp.zeros((), c.dtype))
            return jnp.sin(c * w) + jax.lax.psum(c, "i") * 0.1 + bump, None

        return scan(step, 1.0, None, length=N)[0]

    for f in (scan_named, lambda scan, w: jax.grad(functools.partial(scan_named, scan))(w)):
        assert_close(
            batch(functools.partial(f, _ours()))(jnp.zeros(3), 0.7),
            batch(functools.partial(f, jax.lax.scan))(jnp.zeros(3), 0.7),
            1e-12,
        )


def test_vmap_of_vmap_and_of_higher_derivatives():
    w = jnp.array([[0.3, -0.2], [0.1, 0.4]])
    u0 = jnp.arange(12.0).reshape(2, 3, 2) / 10

    def loss(scan, w, u):
        return _shared_weight_loss(scan, w, u)

    for fun in (
        lambda scan: jax.vmap(jax.vmap(functools.partial(loss, scan, w))),
        lambda scan: jax.vmap(jax.vmap(jax.grad(functools.partial(loss, scan, w)))),
        lambda scan: jax.vmap(jax.vmap(jax.hessian(functools.partial(loss, scan, w)))),
    ):
        # Jitted: eagerly, each primitive of the batched derivative compiles on its own.
        assert_close(jax.jit(fun(_ours()))(u0), jax.jit(fun(jax.lax.scan))(u0), 1e-11)
    # Per-example Hessian-vector products with respect to the shared weight.
    hvp = lambda scan: jax.jit(
        jax.vmap(
            lambda u: jax.jvp(jax.grad(lambda w: loss(scan, w, u)), (w,), (jnp.ones_like(w),))[1]
        )
    )
    assert_close(hvp(_ours())(u0[0]), hvp(jax.lax.scan)(u0[0]), 1e-11)


def test_read_only_leaf_is_forwarded():
    """A carry leaf the step returns unchanged comes out as the input itself, so that lax.cond
    around the loop forwards it and a batched predicate leaves it unbatched (JAX's
    test_scan_readonly_carry_optimization); its gradient is the identity's."""
    loops = {
        "scan": lambda y: _ours()(lambda c, _: ((c[0], c[1] * 2.0), None), (y, y), None, length=3)[
            0
        ],
        "while": lambda y: retrograde.while_loop(
            lambda c: c[1] < 10.0, lambda c: (c[0], c[1] * 2.0), (y, y)
        ),
    }
    for loop, doublings in zip(loops.values(), (3, 2)):  # while: 3 -> 6 -> 12
        f = lambda x, y: jax.lax.cond(x < 0, lambda y: loop(y)[0], lambda y: loop(y)[0], y)
        assert_close(jax.vmap(f, (0, None), None)(jnp.arange(3.0), 3.0), 3.0, 0)
        grad = jax.grad(lambda y: loop(y)[0] + loop(y)[1])(3.0)
        assert_close(grad, 1.0 + 2.0**doublings, 1e-12)


def test_while_read_only_leaf_stays_unbatched():
    """A carry leaf the step returns unchanged stays unbatched under a batched predicate, as in
    jax.lax.while_loop (JAX's test_while_readonly_carry_optimization: out_axes=None for it), and
    the gradient with respect to it is forward mode's through jax.lax.while_loop."""
    w = jnp.array([[0.3, -0.2], [0.1, 0.4]])
    xs, limits = jnp.linspace(0.1, 0.8, 8).reshape(4, 2), jnp.arange(4)

    def run(loop, w, x, limit):
        _, x, w = loop(
            lambda c: c[0] < limit, lambda c: (c[0] + 1, jnp.tanh(c[1] @ c[2]), c[2]), (0, x, w)
        )
        return w, x

    batch = lambda loop: jax.vmap(
        functools.partial(run, loop), in_axes=(None, 0, 0), out_axes=(None, 0)
    )
    assert_close(
        batch(retrograde.while_loop)(w, xs, limits), batch(jax.lax.while_loop)(w, xs, limits), 1e-12
    )
    loss = lambda loop: lambda w: jnp.sum(batch(loop)(w, xs, limits)[1] ** 2)
    assert_close(
        jax.grad(loss(retrograde.while_loop))(w), jax.jacfwd(loss(jax.lax.while_loop))(w), 1e-12
    )


def test_while_batched_predicate_mixes():
    """A predicate batched through one carry leaf; another leaf unbatched until the guard."""

    def run(loop, limit, scale):
        return loop(
            lambda c: c[0] < limit, lambda c: (c[0] + 1, c[1] * scale, c[2] + 1.0), (0, 1.0, 0.0)
        )

    limits = jnp.array([2, 5, 3])
    for in_axes, args in (((0, None), (limits, 1.1)), ((None, 0), (4, jnp.array([1.1, 0.9])))):
        ours = jax.vmap(functools.partial(run, retrograde.while_loop), in_axes)(*args)
        ref = jax.vmap(functools.partial(run, jax.lax.while_loop), in_axes)(*args)
        assert_close(ours, ref, 1e-12)
    g = jax.vmap(jax.grad(lambda s, lim: run(retrograde.while_loop, lim, s)[1]), (None, 0))
    n = limits.astype(jnp.float64)  # explicit: the file also runs with strict promotion
    assert_close(g(1.1, limits), n * 1.1 ** (n - 1.0), 1e-12)


# A parameter's cotangent under vmap: summed over the batch inside each step (issue 33).

_B, _D = 3, 5  # sizes found in no other buffer of the problem below


def _rnn_loss(loop, w, u0, xs):
    """A small recurrent cell with a closed-over weight ``w`` (shape ``(D, 2 D)``)."""

    def cell(u, x):
        return jnp.tanh(w @ jnp.concatenate([u, x])) * 0.9 + 0.1 * u

    return jnp.sum(loop(cell, u0, xs) ** 2)


def _loops():
    """Each loop as ``(cell, u0, xs) -> u_N`` on its reverse path (known count, run-time count)."""

    def scan(schedule):
        return lambda cell, u0, xs: retrograde.scan(
            lambda u, x: (cell(u, x), None), u0, xs, schedule=schedule
        )[0]

    def while_(cell, u0, xs):
        def body(c):
            return c[0] + 1, cell(c[1], xs[c[0]])

        return retrograde.while_loop(lambda c: c[0] < xs.shape[0], body, (0, u0))[1]

    def lax_scan(cell, u0, xs):
        return jax.lax.scan(lambda u, x: (cell(u, x), None), u0, xs)[0]

    loops = {"Revolve(3)": scan(Revolve(3)), "Mixed(3, 1.0)": scan(Mixed(3, 1.0))}
    return {**loops, "while_loop": while_}, lax_scan


def _batch_grad(loop):
    """The gradient in the shared weight of the batch's summed loss, and an HVP along ``v``."""
    us = jax.random.normal(jax.random.PRNGKey(1), (_B, _D))
    xs = jax.random.normal(jax.random.PRNGKey(2), (_B, N, _D))

    def total(w):
        return jnp.sum(jax.vmap(lambda u, x: _rnn_loss(loop, w, u, x))(us, xs))

    grad = jax.grad(total)
    return grad, lambda w, v: jax.jvp(grad, (w,), (v,))[1]


def _while_carries(hlo: str) -> list[str]:
    """The types of the values every while loop of an optimized HLO module carries."""
    return [
        line.split("=", 1)[1].split(" while(")[0] for line in hlo.splitlines() if " while(" in line
    ]


@pytest.mark.parametrize("name", ["Revolve(3)", "Mixed(3, 1.0)", "while_loop"])
def test_shared_weight_cotangent_summed_in_each_step(name):
    """grad (and an HVP) in a weight shared by a vmapped batch: no loop of the compiled program
    carries a per-element copy of the weight's cotangent (``f64[B, D, 2D]``), as ``lax.scan``'s
    batched transpose carries none, nor computes one (a product per element, then a sum), also
    where steps are reversed from their data (``Mixed``: the transpose of the linear part sums
    over the batch as a record does); the derivatives equal ``lax.scan``'s."""
    ours, lax_scan = _loops()
    w = jax.random.normal(jax.random.PRNGKey(0), (_D, 2 * _D)) / _D
    v = jax.random.normal(jax.random.PRNGKey(3), w.shape)
    grad, hvp = _batch_grad(ours[name])
    ref_grad, ref_hvp = _batch_grad(lax_scan)
    per_element = f"f64[{_B},{_D},{2 * _D}]"
    for fun, ref, args in ((grad, ref_grad, (w,)), (hvp, ref_hvp, (w, v))):
        compiled = jax.jit(fun).lower(*args).compile()
        hlo = compiled.as_text()
        carries = _while_carries(hlo)
        assert carries and not [c for c in carries if per_element in c], carries
        # nor any value of the program: one product contracts over the batch
        assert not [line for line in hlo.splitlines() if per_element in line]
        assert_close(compiled(*args), jax.jit(ref)(*args), 1e-12)


@pytest.mark.parametrize("schedule", [Revolve(3), Mixed(3, 1.0)])
def test_shared_weight_summed_cotangent_every_order(schedule):
    """The summed cotangent of a shared weight over a nested vmap, its gradient (grad of grad),
    with steps reversed from states and from their data (mixed): ``lax.scan``'s, in float64."""
    w = jax.random.normal(jax.random.PRNGKey(0), (_D, 2 * _D)) / _D
    us = jax.random.normal(jax.random.PRNGKey(1), (2, 2, _D))
    xs = jax.random.normal(jax.random.PRNGKey(2), (2, 2, N, _D))

    def grad(loop):
        def total(w):
            return jnp.sum(jax.vmap(jax.vmap(lambda u, x: _rnn_loss(loop, w, u, x)))(us, xs))

        g = jax.grad(total)
        return jax.jit(lambda w: (g(w), jax.grad(lambda w: jnp.sum(jnp.sin(g(w))))(w)))

    ours = lambda cell, u0, xs: retrograde.scan(
        lambda u, x: (cell(u, x), None), u0, xs, schedule=schedule
    )[0]
    assert_close(grad(ours)(w), grad(_loops()[1])(w), 1e-12)
