"""Step evaluations of compiled ``retrograde.scan`` programs, counted by a callback in the step.

The compiled gradient must evaluate the step exactly ``simulate(schedule, N).plain + 1 + N``
times: the schedule's plain evaluations, one extra forward step (the primitive must also produce
``u_N``), and ``N`` recorded steps (each VJP runs the step once). The primal runs it ``N`` times.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrograde
from retrograde import schedules as rs
from retrograde.loops import _tables

N = 20
CALLS: list[int] = []


def _loss(schedule, n, theta, u0):
    def step(u, x):
        jax.debug.callback(lambda: CALLS.append(1), ordered=False)
        return u + 0.1 * jnp.sin(theta * u) * x, jnp.sum(u)

    u, ys = retrograde.scan(step, u0, jnp.linspace(0.5, 1.5, n), schedule=schedule)
    return jnp.sum(u**2) + jnp.sum(ys)


def _count(fun, *args) -> int:
    CALLS.clear()
    jax.block_until_ready(fun(*args))
    jax.effects_barrier()
    return len(CALLS)


ARGS = (jnp.float64(0.7), jnp.array([0.2, -0.3, 0.5]))
SCHEDULES = [
    ("Revolve1", rs.Revolve(1)),
    ("Revolve2", rs.Revolve(2)),
    ("Revolve5", rs.Revolve(5)),
    ("Revolve25", rs.Revolve(25)),
    ("StoreAll", rs.StoreAll()),
    ("RecomputeAll", rs.RecomputeAll()),
    ("Periodic3", rs.Periodic(3)),
    ("MultiLevel2+3", rs.MultiLevel([rs.Level(2), rs.Level(3)])),
]


@pytest.mark.parametrize("schedule", [s for _, s in SCHEDULES], ids=[i for i, _ in SCHEDULES])
def test_gradient_count(schedule):
    grad = jax.jit(jax.grad(functools.partial(_loss, schedule, N), argnums=(0, 1)))
    stats = rs.simulate(schedule, N)
    assert stats.recorded == N
    assert _count(grad, *ARGS) == stats.plain + 1 + N
    # Running the compiled program again counts the same (nothing cached between runs).
    assert _count(grad, *ARGS) == stats.plain + 1 + N


@pytest.mark.parametrize("s", [1, 2, 5, 25])
def test_revolve_plain_is_optimal(s):
    assert rs.simulate(rs.Revolve(s), N).plain == rs.revolve_optimum(N, s)


def test_primal_and_tangent_counts():
    """The primal runs N steps. ``jax.jvp`` runs 2N: the JVP rule of the forward primitive binds
    the forward loop (N steps, for the primal outputs and snapshots) and, separately, the tangent
    loop of the augmented step (N steps, each evaluating the step with its tangent)."""
    L = functools.partial(_loss, rs.Revolve(2), N)
    assert _count(jax.jit(L), *ARGS) == N
    jvp = jax.jit(lambda th, u0: jax.jvp(L, (th, u0), (1.0, jnp.ones(3))))
    assert _count(jvp, *ARGS) == 2 * N


@pytest.mark.parametrize("schedule", [s for _, s in SCHEDULES], ids=[i for i, _ in SCHEDULES])
def test_hvp_count(schedule):
    """``jax.jvp(jax.grad(f))`` (gradient and HVP) counts the gradient's evaluations plus ``N``:
    the forward loop, the tangent loop (which lays the snapshots' tangents) and one reverse
    sweep of the augmented step from those snapshots, whose tangent half is the gradient. No
    sweep of its own for the gradient, no forward sweep of the augmented step's own."""
    L = functools.partial(_loss, schedule, N)
    hvp = jax.jit(lambda th, u0: jax.jvp(jax.grad(L, argnums=(0, 1)), (th, u0), (1.0, jnp.ones(3))))
    assert _count(hvp, *ARGS) == rs.simulate(schedule, N).plain + 1 + 2 * N


def test_zero_and_one_step():
    for n in (0, 1):
        grad = jax.jit(jax.grad(functools.partial(_loss, rs.Revolve(2), n)))
        assert _count(grad, *ARGS) == rs.simulate(rs.Revolve(2), n).plain + (n > 0) + n


@pytest.mark.parametrize("schedule", [rs.Revolve(2), rs.Revolve(5), rs.StoreAll()], ids=repr)
def test_machine_when_rows_are_too_many(schedule, monkeypatch):
    """A reversal of more than ``ROW_LIMIT`` macro-actions runs the in-graph machine instead of
    reading a table of them: the same evaluations and the same gradient."""
    grad = jax.grad(functools.partial(_loss, schedule, N), argnums=(0, 1))
    with_rows = jax.jit(grad)(*ARGS)
    monkeypatch.setattr(_tables, "ROW_LIMIT", 0)
    _tables.tables_for.cache_clear()
    try:
        assert _tables.tables_for(schedule, N).rows is None
        fresh = jax.jit(lambda *a: grad(*a))
        assert _count(fresh, *ARGS) == rs.simulate(schedule, N).plain + 1 + N
        for a, b in zip(fresh(*ARGS), with_rows):
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)
    finally:
        _tables.tables_for.cache_clear()
