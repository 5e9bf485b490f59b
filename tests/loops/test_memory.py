"""Memory of compiled derivatives of ``retrograde.scan``: bounded by the schedule, not by N.

Only compiles (never runs): ``jax.jit(f).lower(...).compile().memory_analysis()``, carry of
``D`` float64, ``Revolve(S)``, no ``xs``/``ys``. Figures are in carries (``D * 8`` bytes).

Measured (jax 0.10.2, CPU, D = 1000, S = 10; 2026-12-02): first order 13.2 carries, HVP 26.2,
gradient and HVP together 25.2, grad of grad 29.4, third order 55.6; ``jax.lax.scan``'s gradient
2001 at N = 1000 and 20001 at N = 10000.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

import retrograde
from retrograde.schedules import Revolve

D = 1000  # carry size (float64)
S = 10  # snapshot slots
CARRY = 8 * D
BOUND_1 = (S + 6) * CARRY  # first order
BOUNDS = {
    "grad": BOUND_1,
    "hvp": 2 * BOUND_1,  # second order within twice the first-order bound
    "grad_grad": 2 * BOUND_1,
    "third": 4 * BOUND_1,  # third order within four times the first-order bound
}


def _loss(scan, n, theta, u0):
    step = lambda u, _: (u + 0.01 * jnp.sin(theta * u), None)
    u, _ = scan(step, u0, None, length=n)
    return jnp.sum(u**2)


def _program(order, scan, n):
    J = functools.partial(_loss, scan, n)
    if order == "grad":
        return jax.grad(J, argnums=(0, 1))
    if order == "hvp":
        return lambda th, u0: jax.jvp(
            lambda u: jax.grad(J, argnums=1)(th, u), (u0,), (jnp.ones_like(u0),)
        )[1]
    if order == "grad_and_hvp":  # jax.jvp(jax.grad(f)): gradient and HVP together
        return lambda th, u0: jax.jvp(
            lambda u: jax.grad(J, argnums=1)(th, u), (u0,), (jnp.ones_like(u0),)
        )
    if order == "grad_grad":
        return jax.grad(lambda th, u0: jnp.sum(jax.grad(J, argnums=1)(th, u0) ** 2), argnums=1)
    if order == "third":
        return jax.grad(jax.grad(jax.grad(J)))
    raise ValueError(order)


def _ours(f, u0, xs, length):
    return retrograde.scan(f, u0, xs, length=length, schedule=Revolve(S))


def _lax(f, u0, xs, length):
    return jax.lax.scan(f, u0, xs, length=length)


@functools.cache
def temp_bytes(order, which, n):
    scan = {"ours": _ours, "lax": _lax}[which]
    compiled = jax.jit(_program(order, scan, n)).lower(jnp.float64(0.5), jnp.ones(D)).compile()
    stats = compiled.memory_analysis()
    if stats is None or getattr(stats, "temp_size_in_bytes", None) is None:
        pytest.skip("this backend reports no memory analysis")
    return stats.temp_size_in_bytes


@pytest.mark.parametrize("order", list(BOUNDS))
def test_memory_does_not_grow_with_steps(order):
    small, large = temp_bytes(order, "ours", 1000), temp_bytes(order, "ours", 10000)
    print(f"{order}: {small / CARRY:.1f} / {large / CARRY:.1f} carries at N = 1000 / 10000")
    assert large <= 1.1 * small, (order, small, large)
    assert large <= BOUNDS[order], (
        f"{order}: {large / CARRY:.1f} carries > bound {BOUNDS[order] / CARRY:.0f}"
    )


def test_lax_scan_reference_grows():
    """The unbounded-memory reference stores every state: about 10x from N = 1000 to 10000."""
    small, large = temp_bytes("grad", "lax", 1000), temp_bytes("grad", "lax", 10000)
    assert small >= 1000 * CARRY
    assert large >= 8 * small
    assert temp_bytes("grad", "ours", 10000) * 100 < large


def test_memory_gradient_and_hvp_together():
    """jax.jvp(jax.grad(f)) returns the gradient and the HVP: still within the second-order bound
    (the primal adjoint lays its own snapshots, so the forward's need not outlive it)."""
    temp = temp_bytes("grad_and_hvp", "ours", 1000)
    print(f"grad_and_hvp: {temp / CARRY:.1f} carries")
    assert temp <= BOUNDS["hvp"]


def test_unread_xs_cotangent_costs_no_memory():
    """A gradient with respect to the parameters only never builds the ``O(N)`` cotangent of
    ``xs``: the adjoint's dead-code rule drops the outputs nobody reads."""

    def temp(n):
        def f(theta, u0, xs):
            step = lambda u, x: (u + 0.01 * jnp.sin(theta * u + x), None)
            u, _ = retrograde.scan(step, u0, xs, schedule=Revolve(S))
            return jnp.sum(u**2)

        xs = jnp.ones((n, D))
        compiled = jax.jit(jax.grad(f)).lower(jnp.float64(0.5), jnp.ones(D), xs).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    small, large = temp(100), temp(1000)
    assert large <= 1.1 * small
    assert large <= BOUND_1
