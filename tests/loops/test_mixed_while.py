"""``while_loop`` with ``Online(s, data_size=d)``: ``Online``'s placement, then each segment between
the held snapshots reversed by ``Mixed(s, d)``'s tree at its level (issue #35).

- Evaluations (a ``jax.debug.callback`` counter in the step): a compiled gradient makes exactly
  ``simulate(Online(s, data_size=d), N).evaluations`` (a while loop's forward sweep runs to
  ``u_N``, which the schedule counts), fewer than ``Online(s)``'s where a step's data fit.
- grad, jvp, HVP, grad of grad and ``vmap(grad)`` against ``jax.lax.fori_loop`` (and the jvp
  against ``jax.lax.while_loop``) in float64.
- Temp memory: the data share the snapshot rows (``_pool.held_first`` moves the held ones to
  rows ``0, 1, ...`` in place), so it is ``Online(s)``'s plus a constant, and flat in ``N``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrograde
from retrograde import schedules as rs
from retrograde.loops import _pool

from . import _problems as P
from .test_counts import CALLS, _count
from .test_mixed import D, _solve, temp_of

RTOL = 1e-12


def _loss(schedule, theta, u0, limit):
    """``sum(u_N^2)`` after ``u <- u + 0.1 sin(theta_0 u + theta_1)`` while ``k < limit``:
    one step's data are ``cos(theta_0 u + theta_1)`` and ``u`` (two states)."""

    def body(st):
        jax.debug.callback(lambda: CALLS.append(1), ordered=False)
        k, u = st
        return k + 1, u + 0.1 * jnp.sin(theta[0] * u + theta[1])

    init = (jnp.int32(0), u0)
    if schedule is None:  # the reference: a fori_loop of as many steps
        u = jax.lax.fori_loop(0, limit, lambda i, st: body(st), init)[1]
    else:
        u = retrograde.while_loop(lambda st: st[0] < limit, body, init, schedule=schedule)[1]
    return jnp.sum(u**2)


THETA, U0 = jnp.array([0.7, 0.3]), jnp.array([0.2, -0.5, 0.9])


@pytest.mark.parametrize("s, d", [(3, 1), (4, 2)])
def test_evaluations_are_the_schedules(s, d):
    """For several ``N`` (one compiled program, the limit traced): the callback counts
    ``simulate``'s evaluations of ``Online(s, data_size=d)``, fewer than ``Online(s)``'s."""
    schedule = rs.Online(s, data_size=d)
    grad = jax.jit(jax.grad(functools.partial(_loss, schedule), argnums=(0, 1)))
    for n in (1, 2, 7, 20, 61):
        stats = rs.simulate(schedule, n)
        assert _count(grad, THETA, U0, n) == stats.evaluations, n
        if n >= 7:
            assert stats.evaluations < rs.simulate(rs.Online(s), n).evaluations


def test_derivatives_against_lax():
    """grad, jvp, HVP, grad of grad and ``vmap(grad)`` (over ``theta``) of ``Online(3,
    data_size=2)`` against ``jax.lax`` (the jvp against ``jax.lax.while_loop`` too), 23 steps."""
    n, du = 23, jnp.array([0.3, -0.2, 0.5])
    assert rs.simulate(rs.Online(3, data_size=2), n).linearized > 0  # segments from data

    def program(schedule):
        L = functools.partial(_loss, schedule)

        def f(theta, u0):
            out = {}
            out["grad"] = jax.grad(L, argnums=(0, 1))(theta, u0, n)
            out["jvp"] = jax.jvp(lambda u: L(theta, u, n), (u0,), (du,))
            out["hvp"] = jax.jvp(lambda u: jax.grad(L, argnums=(0, 1))(theta, u, n), (u0,), (du,))
            out["grad_grad"] = jax.grad(lambda th: jnp.sum(jax.grad(L, argnums=1)(th, u0, n) ** 2))(
                theta
            )
            thetas = theta[None, :] * jnp.array([[1.0], [1.2], [0.8]])
            out["vmap_grad"] = jax.vmap(lambda th: jax.grad(L, argnums=(0, 1))(th, u0, n))(thetas)
            return out

        return P.jit(f)

    got = program(rs.Online(3, data_size=2))(THETA, U0)
    ref = program(None)(THETA, U0)
    failures = [
        f"{k}: {P.rel_err(got[k], ref[k]):.1e}" for k in ref if P.rel_err(got[k], ref[k]) > RTOL
    ]
    assert not failures, failures

    def lax_while(u0):
        body = lambda st: (st[0] + 1, st[1] + 0.1 * jnp.sin(THETA[0] * st[1] + THETA[1]))
        return jnp.sum(jax.lax.while_loop(lambda st: st[0] < n, body, (0, u0))[1] ** 2)

    P.assert_close(got["jvp"], jax.jvp(lax_while, (U0,), (du,)), RTOL, "jvp against while_loop")


def test_held_first_moves_rows_in_place():
    """The held rows go to rows ``0, 1, ...`` in step order (empty rows after), each row
    whole."""
    held = jnp.array([0, 41, -1, 17, 33, -1, 8], jnp.int32)
    rows = jnp.arange(7.0)[:, None] * jnp.ones((7, 3))
    (out,), steps = jax.jit(_pool.held_first)([rows], held)
    order = np.argsort(np.where(np.asarray(held) < 0, 99, np.asarray(held)), kind="stable")
    assert steps.tolist() == [0, 8, 17, 33, 41, -1, -1]
    np.testing.assert_array_equal(out, np.asarray(rows)[order])


CARRY = 8 * D  # the carry's bytes (D float64)


def _temp(schedule, n, order="grad"):
    def loss(theta, u0):
        body = lambda st: (st[0] + 1, st[1] + 0.01 * jnp.sin(theta * st[1]))
        u = retrograde.while_loop(lambda st: st[0] < n, body, (0, u0), schedule=schedule)[1]
        return jnp.sum(u**2)

    return temp_of(loss, order)


def test_memory_is_onlines_and_flat():
    """The step ``u + 0.01 sin(theta u)`` keeps two states of data (``cos(theta u)``, ``u``):
    with ``data_size=2`` they fit in the free snapshot rows, so the gradient's temp memory is
    ``Online(8)``'s plus at most one carry, the same at ``N = 200`` and ``2000``; an HVP's (its
    sweep keeps more data, partly in rows of its own) at most two carries more."""
    mixed, plain = rs.Online(8, data_size=2), rs.Online(8)
    sizes = {n: _temp(mixed, n) for n in (200, 2000)}
    base = _temp(plain, 200)
    print({n: v / CARRY for n, v in sizes.items()}, base / CARRY)
    assert sizes[200] == sizes[2000]
    assert sizes[200] <= base + CARRY
    assert _temp(mixed, 200, "hvp") <= _temp(plain, 200, "hvp") + 2 * CARRY


def test_refused_without_a_band_rule():
    """A fractional data size has no in-graph split rule: refused when the loop is called,
    naming the argument and the fix."""
    with pytest.raises(ValueError, match=r"retrograde.while_loop: schedule=.*whole data_size"):
        _loss(rs.Online(4, data_size=0.5), THETA, U0, 5)


def test_default_is_mixed_where_it_does_less_work():
    """``schedule=None``: ``Online(16, data_size=d)`` where the step's estimated work with it is
    lower (``_while.online_default``: an implicit step, whose recorded steps solve again), else
    ``Online(16)`` (``u + 0.1 sin(0.5 u)``: a record computes ``cos`` only); the callback counts
    that schedule's evaluations exactly and the gradient is ``jax.lax.fori_loop``'s."""
    n = 40
    steps = {
        "implicit": (lambda u: u + 0.05 * _solve(u), rs.Online(16, data_size=1.0)),
        "sin": (lambda u: u + 0.1 * jnp.sin(0.5 * u), rs.Online(16)),
    }
    for name, (f, schedule) in steps.items():

        def loss(u0, loop, f=f):
            def body(st):
                jax.debug.callback(lambda: CALLS.append(1), ordered=False)
                return st[0] + 1, f(st[1])

            return jnp.sum(loop(body, (jnp.int32(0), u0))[1] ** 2)

        ours = lambda body, init: retrograde.while_loop(lambda st: st[0] < n, body, init)
        ref = lambda body, init: jax.lax.fori_loop(0, n, lambda i, st: body(st), init)
        grad = jax.jit(jax.grad(functools.partial(loss, loop=ours)))
        assert _count(grad, U0) == rs.simulate(schedule, n).evaluations, name
        want = jax.grad(functools.partial(loss, loop=ref))(U0)
        P.assert_close(grad(U0), want, RTOL, f"default while_loop for {name}")
    assert (
        rs.simulate(rs.Online(16, data_size=1.0), n).evaluations
        < rs.simulate(rs.Online(16), n).evaluations
    )
