"""retrograde.while_loop against an unbounded-memory reference (jax.lax.fori_loop with the same
step count), in float64: every derivative mode, online schedules, buffers, counts and memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrograde
from retrograde.schedules import Online, Revolve, revolve_optimum, simulate

from . import _problems as P

N = 23


def _step(theta, w):
    def body(state):
        i, u, v = state
        u = u + 0.05 * jnp.sin(theta * u) + 0.01 * w * jnp.sum(v)
        v = v * (1.0 - 0.02 * jnp.tanh(u[0]))
        return i + 1, u, v

    return body


def _loss(theta, w, schedule, n=N):
    body = _step(theta, w)
    _, u, v = retrograde.while_loop(
        lambda s: s[0] < n,
        body,
        (jnp.int32(0), jnp.ones(3) * theta, jnp.ones(2)),
        schedule=schedule,
    )
    return jnp.sum(u**2) + jnp.sum(v * u[:2])


def _ref(theta, w, n=N):
    body = _step(theta, w)
    _, u, v = jax.lax.fori_loop(
        0, n, lambda i, s: body(s), (jnp.int32(0), jnp.ones(3) * theta, jnp.ones(2))
    )
    return jnp.sum(u**2) + jnp.sum(v * u[:2])


MODES = {
    "value": lambda f: f,
    "grad": lambda f: jax.grad(f, argnums=(0, 1)),
    "jvp": lambda f: lambda t, w: jax.jvp(f, (t, w), (1.0, 0.5))[1],
    "grad_grad": lambda f: jax.grad(jax.grad(f), argnums=(0, 1)),
    "hessian": lambda f: jax.hessian(f, argnums=(0, 1)),
    "jacrev_jacrev": lambda f: jax.jacrev(jax.jacrev(f)),
    "hvp": lambda f: lambda t, w: jax.jvp(jax.grad(f), (t, w), (1.0, 0.0))[1],
    "third": lambda f: jax.grad(jax.grad(jax.grad(f))),
}


# Each case compiles a while loop differentiated to its order (5-25 s on 2 cores), with the
# suite's fast-compile options as the other correctness tests (``_problems.FAST_COMPILE``). The
# default run keeps every mode at Online(4) but two, and grad and hessian at Online(1). Slow
# (`make test-all`): jacrev_jacrev-4 (reverse over reverse, which grad_grad-4 checks, batched by
# vmap, which hessian-1 checks of a reverse sweep) and hessian-4 (jax.hessian is hessian-1's at
# another slot count; forward over reverse at Online(4) is hvp-4's).
_SLOW_MODES = {("jacrev_jacrev", 4), ("hessian", 4)}


@pytest.mark.parametrize(
    "mode, s",
    [
        pytest.param(m, s, marks=pytest.mark.slow) if (m, s) in _SLOW_MODES else (m, s)
        for m, s in [(m, 4) for m in sorted(MODES)] + [("grad", 1), ("hessian", 1)]
    ],
)
def test_modes_match_reference(mode, s):
    make = MODES[mode]
    got = P.jit(make(lambda t, w: _loss(t, w, Online(s))))(0.7, 0.3)
    want = P.jit(make(_ref))(0.7, 0.3)
    P.assert_close(got, want, 1e-10)


@pytest.mark.parametrize(
    "mode",
    [
        "grad",
        "jvp",
        "hvp",
        "grad_grad",
        # Third order is test_modes_match_reference[third-4]'s; here
        # it compiles for 20-45 s.
        pytest.param("third", marks=pytest.mark.slow),
    ],
)
def test_pairs_leaves_match_reference(mode):
    """``Online(12)`` over 40 steps ends in runs of two-step segments, which the reversal takes
    as two ``PAIRS`` leaves (of 4 and 3 segments; ``tests/loops/test_machine.py``)."""
    make = MODES[mode]
    got = P.jit(make(lambda t, w: _loss(t, w, Online(12), n=40)))(0.7, 0.3)
    want = P.jit(make(lambda t, w: _ref(t, w, n=40)))(0.7, 0.3)
    P.assert_close(got, want, 1e-10)


def test_vmap_batched_predicate():
    def g(theta):
        return retrograde.while_loop(
            lambda u: u < 10.0, lambda u: u * (1 + theta), 1.0, schedule=Online(3)
        )

    def gref(theta):
        n = jnp.ceil(jnp.log(10.0) / jnp.log1p(theta))
        return (1 + theta) ** n

    th = jnp.array([0.1, 0.3, 0.7])
    P.assert_close(jax.vmap(g)(th), jax.vmap(gref)(th), 1e-12)
    P.assert_close(jax.vmap(jax.grad(g))(th), jax.vmap(jax.grad(gref))(th), 1e-10)
    P.assert_close(
        jax.grad(lambda t: jnp.sum(jax.vmap(g)(t)))(th), jax.vmap(jax.grad(gref))(th), 1e-10
    )


def test_predicate_runs_once_per_forward_step():
    """Unbatched, the step runs without its guard: the predicate is evaluated only by the forward
    loop (N + 1 times), never by recomputation or the reverse sweep."""
    calls = [0]

    def pred(st):
        jax.debug.callback(lambda: calls.__setitem__(0, calls[0] + 1))
        return st[0] < N

    def f(theta):
        _, u = retrograde.while_loop(
            pred,
            lambda st: (st[0] + 1, st[1] * jnp.cos(theta * st[1])),
            (0, jnp.ones(2)),
            schedule=Online(3),
        )
        return jnp.sum(u)

    g = jax.jit(jax.grad(f))
    g(0.3).block_until_ready()
    calls[0] = 0
    g(0.3).block_until_ready()
    jax.effects_barrier()
    assert calls[0] == N + 1


@pytest.mark.parametrize("n", [20, 50])
def test_past_the_decision_table(monkeypatch, n):
    """Steps beyond the ``Online`` rule's table (8192 steps, here patched to 20) evaluate the rule
    in a loop of their own: the gradient matches the reference, the executed step evaluations
    are the schedule's, and the predicate runs once per state, twice on the state where the
    table's loop hands over (there only if the loop gets that far); also under ``vmap`` with a
    batched predicate."""
    from retrograde.loops import _placement

    monkeypatch.setattr(_placement, "DECISIONS", 20)
    steps, preds = [0], [0]

    def advance(theta, u):
        return u + 0.05 * jnp.sin(theta * u)

    def loss(theta, stop, tick=lambda: None):
        def body(st):
            tick()
            return st[0] + 1, advance(theta, st[1])

        return jnp.sum(
            retrograde.while_loop(
                lambda st: st[0] < stop(st), body, (0, jnp.ones(2)), schedule=Online(4)
            )[1]
        )

    def ref(theta, k):
        return jnp.sum(jax.lax.fori_loop(0, k, lambda i, u: advance(theta, u), jnp.ones(2)))

    def counted(st):  # the predicate's bound, counting its evaluations
        jax.debug.callback(lambda: preds.__setitem__(0, preds[0] + 1))
        return n

    def tick():
        jax.debug.callback(lambda: steps.__setitem__(0, steps[0] + 1))

    g = jax.jit(jax.grad(lambda theta: loss(theta, counted, tick)))
    g(0.5).block_until_ready()
    steps[0] = preds[0] = 0
    got = g(0.5).block_until_ready()
    jax.effects_barrier()
    np.testing.assert_allclose(got, jax.grad(ref)(0.5, n), rtol=1e-12)
    stats = simulate(Online(4), n)
    assert steps[0] == stats.plain + stats.recorded
    assert preds[0] == n + 1 + (n >= 20)

    # A batched predicate: the elements stop at n and n + 3.
    got = jax.jit(jax.vmap(jax.grad(lambda t: loss(t, lambda st: n + 3 * (t > 0.6)))))(
        jnp.asarray([0.5, 0.7])
    )
    want = [jax.grad(ref)(0.5, n), jax.grad(ref)(0.7, n + 3)]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_vmap_batched_predicate_with_first_order_body():
    """Batch elements that stop early are left alone by the fast body too."""

    def run(step):
        def g(theta):
            return retrograde.while_loop(
                lambda u: u < 10.0,
                step(theta),
                1.0,
                schedule=Online(3),
                first_order_body_fun=step(theta),
            )

        return g

    plain = run(lambda theta: lambda u: u * (1 + theta))
    fast = run(lambda theta: lambda u: _kick_scale(u, theta))
    th = jnp.array([0.1, 0.3, 0.7])
    want = jax.vmap(jax.grad(plain))(th)
    P.assert_close(jax.vmap(jax.grad(fast))(th), want, 1e-12)
    P.assert_close(jax.grad(lambda t: jnp.sum(jax.vmap(fast)(t)))(th), want, 1e-12)


@jax.custom_vjp
def _kick_scale(u, theta):
    return u * (1 + theta)


def _kick_scale_fwd(u, theta):
    return u * (1 + theta), (u, theta)


def _kick_scale_bwd(res, g):
    u, theta = res
    return g * (1 + theta), g * u


_kick_scale.defvjp(_kick_scale_fwd, _kick_scale_bwd)


def test_max_steps_caps_the_loop():
    out = retrograde.while_loop(lambda s: True, lambda s: s + 1.0, 0.0, max_steps=7)
    assert float(out) == 7.0
    g = jax.grad(
        lambda x: retrograde.while_loop(lambda s: True, lambda s: s * x, 1.0, max_steps=5)
    )(1.1)
    np.testing.assert_allclose(g, 5 * 1.1**4, rtol=1e-12)


def test_zero_steps():
    f = lambda x: retrograde.while_loop(lambda s: s > 10.0, lambda s: s * 2.0, x)
    assert float(f(1.0)) == 1.0
    assert float(jax.grad(f)(1.0)) == 1.0


@pytest.mark.parametrize("n, s", [(60, 4), (300, 8), (40, 12)])
def test_executed_evaluations_equal_online_schedule(n, s):
    count = [0]

    def tick():
        count[0] += 1

    def f(theta):
        def body(st):
            jax.debug.callback(tick)
            return st[0] + 1, st[1] + 0.001 * jnp.sin(theta * st[1])

        return jnp.sum(
            retrograde.while_loop(lambda st: st[0] < n, body, (0, jnp.ones(2)), schedule=Online(s))[
                1
            ]
        )

    g = jax.jit(jax.grad(f))
    g(0.5).block_until_ready()
    count[0] = 0
    g(0.5).block_until_ready()
    stats = simulate(Online(s), n)
    assert count[0] == stats.plain + stats.recorded
    # Within 5% of the offline optimum for the steps actually taken.
    assert count[0] <= 1.05 * (revolve_optimum(n, s) + n)


def _decay(n, s):
    """A while loop of ``n`` steps on 500 floats with ``Online(s)``, as a loss of ``theta``."""

    def f(theta):
        st = retrograde.while_loop(
            lambda st: st[0] < n,
            lambda st: (st[0] + 1, st[1] + 0.001 * jnp.tanh(theta * st[1])),
            (0, jnp.ones(500)),
            schedule=Online(s),
        )
        return jnp.sum(st[1] ** 2)

    return f


def _carries(fn):
    """Temp memory of ``jit(fn)(0.5)`` in carries of 500 float64."""
    return jax.jit(fn).lower(0.5).compile().memory_analysis().temp_size_in_bytes / (500 * 8)


def _hvp(f):
    return lambda t: jax.jvp(jax.grad(f), (t,), (1.0,))[1]


ORDERS = {
    "grad": jax.grad,
    "hvp": _hvp,
    "grad_grad": lambda f: jax.grad(jax.grad(f)),
    "third": lambda f: jax.grad(jax.grad(jax.grad(f))),
}
_CARRIES = {}


def _decay_carries(order, n, s):
    """``_carries(ORDERS[order](_decay(n, s)))``, compiled once per session (each compile takes
    5-15 s; the memory tests below share them)."""
    key = (order, n, s)
    if key not in _CARRIES:
        _CARRIES[key] = _carries(ORDERS[order](_decay(n, s)))
    return _CARRIES[key]


def test_memory_does_not_grow_with_steps():
    for order in ("grad", "hvp"):
        assert _decay_carries(order, 10000, 8) <= 1.1 * _decay_carries(order, 1000, 8)
    # 14.1 carries: 8 slots, the state, its cotangent, XLA's copy of the cotangent that the
    # record overwrites in place (the record runs outside any conditional), the step's working set.
    assert _decay_carries("grad", 1000, 8) <= 8 + 7


@pytest.mark.parametrize(
    "orders",
    [
        ("grad", "hvp"),
        # Reverse over reverse at PAIRS leaves: two more 10-15 s compiles.
        pytest.param(("grad_grad",), marks=pytest.mark.slow),
    ],
    ids="-".join,
)
def test_pairs_leaves_memory_does_not_grow_with_steps(orders):
    """``Online(40)`` over 500 and 700 steps reverses with ``PAIRS`` leaves (runs of 2-8
    two-step segments): memory is the same at both step counts, at first and second order, and
    within the slots plus the bound's 7 carries at first order (measured 46.8)."""
    for order in orders:
        assert _decay_carries(order, 700, 40) <= 1.01 * _decay_carries(order, 500, 40)
    if "grad" in orders:
        assert _decay_carries("grad", 700, 40) <= 40 + 7


def test_higher_order_memory():
    """Each order's sweeps hold their snapshots one at a time. Measured (carries of 500 float64,
    Online(8)): first order 14.1, grad of grad 28.2, third order 54.4."""
    assert _decay_carries("grad_grad", 1000, 8) <= 2 * (8 + 7)
    assert _decay_carries("third", 1000, 8) <= 4 * (8 + 7)


M = 30


def _buffered(theta, buffers):
    def body(st):
        i, u, saved = st
        u = u + 0.05 * jnp.sin(theta * u)
        return i + 1, u, saved.at[i].set(u[0] * u[1])

    st = retrograde.while_loop(
        lambda st: st[0] < M,
        body,
        (0, jnp.ones(2), jnp.zeros(M)),
        schedule=Online(4),
        buffers=buffers,
    )
    return jnp.sum(st[2] ** 2) + jnp.sum(st[1])


def _buffered_ref(theta):
    def body(i, st):
        u, saved = st
        u = u + 0.05 * jnp.sin(theta * u)
        return u, saved.at[i].set(u[0] * u[1])

    u, saved = jax.lax.fori_loop(0, M, body, (jnp.ones(2), jnp.zeros(M)))
    return jnp.sum(saved**2) + jnp.sum(u)


def test_buffers_exact_and_not_in_snapshots():
    f = lambda t: _buffered(t, lambda v: v[2])
    P.assert_close(f(0.5), _buffered_ref(0.5), 1e-12)
    grad = jax.jit(jax.grad(f)).lower(0.5).compile()  # one compile: the value and the memory
    P.assert_close(grad(0.5), jax.grad(_buffered_ref)(0.5), 1e-10)
    hvp = lambda g: jax.jit(lambda t: jax.jvp(jax.grad(g), (t,), (1.0,))[1])(0.5)
    P.assert_close(hvp(f), hvp(_buffered_ref), 1e-10)
    with_buf = grad.memory_analysis().temp_size_in_bytes
    plain = jax.jit(jax.grad(lambda t: _buffered(t, None))).lower(0.5).compile()
    assert with_buf < plain.memory_analysis().temp_size_in_bytes


def test_reading_a_buffer_is_an_error():
    def body(st):
        i, u, saved = st
        return i + 1, u + saved[0], saved.at[i].set(u[0])

    with pytest.raises(ValueError, match="buffer leaf 2"):
        retrograde.while_loop(
            lambda st: st[0] < 5, body, (0, jnp.ones(2), jnp.zeros(M)), buffers=lambda v: v[2]
        )


def test_bad_arguments():
    with pytest.raises(ValueError, match="Online"):
        retrograde.while_loop(lambda s: s < 1, lambda s: s + 1, 0.0, schedule=Revolve(3))
    with pytest.raises(TypeError, match="max_steps"):
        retrograde.while_loop(lambda s: s < 1, lambda s: s + 1, 0.0, max_steps=2.5)
    with pytest.raises(TypeError, match="boolean scalar"):
        retrograde.while_loop(lambda s: s, lambda s: s + 1, jnp.ones(2))
    with pytest.raises(ValueError, match="same array objects"):
        retrograde.while_loop(
            lambda s: s[0] < 1, lambda s: s, (0.0, 1.0), buffers=lambda v: jnp.zeros(3)
        )


# --------------------------------------------------------------------- first_order_body_fun


@jax.custom_vjp
def _kick(u, theta):
    """``u + 0.05 sin(theta u)`` with a hand-written VJP: reverse-differentiable once only."""
    return u + 0.05 * jnp.sin(theta * u)


def _kick_fwd(u, theta):
    return _kick(u, theta), (u, theta)


def _kick_bwd(res, g):
    u, theta = res
    c = 0.05 * jnp.cos(theta * u)
    return g * (1.0 + c * theta), jnp.sum(g * c * u)


_kick.defvjp(_kick_fwd, _kick_bwd)


def _dual_loss(theta, count, *, alias=False, n=17):
    def body(st):
        return st[0] + 1, st[1] + 0.05 * jnp.sin(theta * st[1])

    theta_fast = theta * 1.0 if alias else theta  # a traced value body_fun does not close over

    def fast(st):
        jax.debug.callback(count)
        return st[0] + 1, _kick(st[1], theta_fast)

    _, u = retrograde.while_loop(
        lambda st: st[0] < n,
        body,
        (0, jnp.ones(3) * 0.7),
        schedule=Online(3),
        first_order_body_fun=fast,
    )
    return jnp.sum(u**2)


def _dual_ref(theta, n=17):
    u = jax.lax.fori_loop(0, n, lambda i, u: u + 0.05 * jnp.sin(theta * u), jnp.ones(3) * 0.7)
    return jnp.sum(u**2)


def test_first_order_body_runs_steps_and_vjps_only():
    """The fast body (a custom_vjp step: no jvp, no second order) runs every executed step and
    VJP of a first-order gradient; every transformation beyond uses body_fun."""
    calls = [0]

    def count():
        calls[0] += 1

    theta = 0.8
    g = jax.jit(jax.grad(lambda t: _dual_loss(t, count)))(theta)
    np.testing.assert_allclose(g, jax.grad(_dual_ref)(theta), rtol=1e-12)
    jax.effects_barrier()
    assert calls[0] >= 17  # forward steps ran the fast body (and so did recomputation)
    # Forward mode and second order would fail on the custom_vjp: they use body_fun.
    _, t = jax.jvp(lambda t: _dual_loss(t, count), (theta,), (1.0,))
    _, t_ref = jax.jvp(_dual_ref, (theta,), (1.0,))
    np.testing.assert_allclose(t, t_ref, rtol=1e-12)
    h = P.jit(jax.hessian(lambda t: _dual_loss(t, count)))(theta)
    np.testing.assert_allclose(h, jax.hessian(_dual_ref)(theta), rtol=1e-10)
    gv = jax.vmap(jax.grad(lambda t: _dual_loss(t, count)))(jnp.array([0.5, 0.8]))
    np.testing.assert_allclose(gv, jax.vmap(jax.grad(_dual_ref))(jnp.array([0.5, 0.8])), rtol=1e-12)


def test_first_order_body_closing_over_other_tracers_is_ignored():
    calls = [0]

    def count():
        calls[0] += 1

    g = jax.grad(lambda t: _dual_loss(t, count, alias=True))(0.8)
    np.testing.assert_allclose(g, jax.grad(_dual_ref)(0.8), rtol=1e-12)
    jax.effects_barrier()
    assert calls[0] == 0


def test_first_order_body_must_match():
    with pytest.raises(TypeError, match="first_order_body_fun"):
        retrograde.while_loop(
            lambda s: s < 3.0, lambda s: s + 1.0, 0.0, first_order_body_fun=lambda s: (s, s)
        )
