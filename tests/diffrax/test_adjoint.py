"""CheckpointAdjoint against diffrax.DirectAdjoint (float64, relative error <= 1e-10).

Default run: a neural ODE (equinox MLP vector field, Tsit5 + PIDController, SaveAt(ts=...) with
100 times) through the real ``retrograde.while_loop``: first-order gradient w.r.t. the network, y0,
args and a closed-over value; jax.jvp; a gradient of a gradient (equinox.filter_grad nested).
``-m slow`` adds jax.hessian, vmap, other solvers / SaveAt / controllers, and the scan stand-in.
"""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

from ._diffrax_problems import assert_close, checkpoint_adjoint, inputs, loss, solve

DIRECT = diffrax.DirectAdjoint()


@eqx.filter_jit
def grad_all(model, y0, a, c, adjoint, kw):
    return eqx.filter_grad(lambda p: loss(*p, adjoint, **kw))((model, y0, a, c))


@eqx.filter_jit
def jvp_all(model, y0, a, c, adjoint, kw):
    dmodel = jax.tree_util.tree_map(
        lambda x: 0.1 * jnp.ones_like(x), eqx.filter(model, eqx.is_array)
    )
    tangents = (dmodel, jnp.array([1.0, -2.0]), jnp.array(0.5), jnp.array(-1.0))

    def f(m_dyn, y0, a, c):
        m = eqx.combine(m_dyn, eqx.filter(model, eqx.is_array, inverse=True))
        return loss(m, y0, a, c, adjoint, **kw)

    return jax.jvp(f, (eqx.filter(model, eqx.is_array), y0, a, c), tangents)


@eqx.filter_jit
def grad_of_grad(model, y0, a, c, adjoint, kw):
    # d/d(model) of |d loss / d y0|^2: the gradient w.r.t. a network of a scalar built from the
    # gradient w.r.t. another argument.
    def inner(m):
        g = eqx.filter_grad(lambda y: loss(m, y, a, c, adjoint, **kw))(y0)
        return jnp.sum(g**2)

    return eqx.filter_grad(inner)(model)


@eqx.filter_jit
def hessian_y0_a(model, y0, a, c, adjoint, kw):
    return jax.hessian(lambda y, a: loss(model, y, a, c, adjoint, **kw), argnums=(0, 1))(y0, a)


@eqx.filter_jit
def vmap_grad(model, y0s, a, c, adjoint, kw):
    # a batch of initial values: each element takes its own adaptive steps (batched predicate).
    return jax.vmap(lambda y: jax.grad(lambda y: loss(model, y, a, c, adjoint, **kw))(y))(y0s)


def _check(fn, kw=None, tol=1e-10, args=None):
    args = inputs() if args is None else args
    kw = {} if kw is None else kw
    ref = fn(*args, DIRECT, kw)
    out = fn(*args, checkpoint_adjoint(), kw)
    return assert_close(out, ref, tol)


@pytest.mark.slow
def test_solution_and_stats():
    model, y0, a, c = inputs()
    ref = solve(model, y0, a, c, DIRECT)
    sol = solve(model, y0, a, c, checkpoint_adjoint())
    assert_close(sol.ys, ref.ys, 1e-13)
    assert int(sol.stats["num_steps"]) == int(ref.stats["num_steps"])
    assert int(sol.stats["num_steps"]) >= 5  # adaptive steps, more than one save per step
    assert sol.result == diffrax.RESULTS.successful


def test_grad_model_y0_args_closure():
    _check(grad_all)


def test_jvp():
    _check(jvp_all)


def test_grad_of_grad():
    _check(grad_of_grad)


@pytest.mark.slow
def test_hessian():
    _check(hessian_y0_a)


@pytest.mark.slow
def test_vmap_batched_predicate():
    model, y0, a, c = inputs()
    y0s = jnp.stack([y0, 2.0 * y0, -y0])
    _check(vmap_grad, args=(model, y0s, a, c))


SOLVER_CASES = {
    "dopri5": dict(solver=diffrax.Dopri5()),
    "kvaerno5": dict(
        solver=diffrax.Kvaerno5(),
        controller=diffrax.PIDController(rtol=1e-4, atol=1e-4),
        max_steps=128,
    ),
    "constant_steps": dict(controller=diffrax.ConstantStepSize(), dt0=0.15, max_steps=24),
    "saveat_t1": dict(saveat=diffrax.SaveAt(t1=True)),
    "saveat_steps": dict(saveat=diffrax.SaveAt(steps=True)),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(SOLVER_CASES))
def test_cases_grad_and_grad_of_grad(case):
    kw = SOLVER_CASES[case]
    _check(grad_all, kw)
    _check(grad_of_grad, kw)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(SOLVER_CASES))
def test_cases_jvp(case):
    _check(jvp_all, SOLVER_CASES[case])


def test_host_level():
    """``CheckpointAdjoint(Online(2, slow=Level(8, storage="host")))``: the solver states the
    online rule places live in host RAM (``docs/offload.md``); the gradient against
    DirectAdjoint (higher orders with host levels: ``tests/loops/test_offload.py``)."""
    from retrograde.schedules import Level, Online

    adjoint = checkpoint_adjoint(
        Online(2, slow=Level(8, write_cost=0.5, read_cost=0.5, storage="host"))
    )
    assert_close(grad_all(*inputs(), adjoint, {}), grad_all(*inputs(), DIRECT, {}), 1e-10)


def test_wrapped_solver():
    """diffrax.HalfSolver around a Runge-Kutta method, as diffrax's
    test_halfsolver_term_compatible uses it: diffrax's isinstance sees the wrapper as a Runge-Kutta
    method, but the stage loops are the wrapped solver's. Against RecursiveCheckpointAdjoint
    (DirectAdjoint refuses a wrapped solver)."""
    kw = dict(
        solver=diffrax.HalfSolver(diffrax.Heun()),
        max_steps=256,
        controller=diffrax.PIDController(rtol=1e-4, atol=1e-4),
    )
    ref = grad_all(*inputs(), diffrax.RecursiveCheckpointAdjoint(), kw)
    assert_close(grad_all(*inputs(), checkpoint_adjoint(), kw), ref, 1e-10)
