"""A small neural ODE for CheckpointAdjoint tests, and comparison helpers.

``loss(model, y0, a, c)``: an equinox MLP vector field ``a * model(y) - c * y`` (``model`` and
``c`` closed over by the vector field, ``a`` passed as diffrax ``args``), solved on [0, T] with
adaptive steps (Tsit5 + PIDController by default) and ``SaveAt(ts=...)`` at 100 times; the loss is
a weighted sum of squares of the saved values. Every function takes the adjoint as an argument, so
the same code runs with ``diffrax.DirectAdjoint`` (the reference) and ``CheckpointAdjoint``.
"""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr

import retrograde.diffrax as rdx

from .. import _compare

T1 = 3.0
N_SAVE = 100
DIM = 2


def checkpoint_adjoint(schedule=None):
    """The adjoint under test."""
    return rdx.CheckpointAdjoint(schedule=schedule)


def make_model(key=0, width=4, depth=1):
    return eqx.nn.MLP(DIM, DIM, width, depth, activation=jnp.tanh, key=jr.PRNGKey(key))


def inputs():
    model = make_model()
    y0 = jnp.array([0.6, -0.4])
    a = jnp.array(0.9)
    c = jnp.array(0.3)
    return model, y0, a, c


def solve(
    model,
    y0,
    a,
    c,
    adjoint,
    *,
    solver=None,
    saveat=None,
    controller=None,
    dt0=0.1,
    max_steps=32,
    t1=T1,
):
    solver = diffrax.Tsit5() if solver is None else solver
    saveat = diffrax.SaveAt(ts=jnp.linspace(0.0, t1, N_SAVE)) if saveat is None else saveat
    if controller is None:
        controller = diffrax.PIDController(rtol=1e-6, atol=1e-6)

    def vf(t, y, args):
        f = model(y) if y.ndim == 1 else jax.vmap(model)(y)  # (DIM,) or a batch (B, DIM)
        return args * f - c * y + jnp.sin(4.0 * t)

    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(vf),
        solver,
        0.0,
        t1,
        dt0,
        y0,
        args=a,
        saveat=saveat,
        stepsize_controller=controller,
        adjoint=adjoint,
        max_steps=max_steps,
    )
    return sol


def loss(model, y0, a, c, adjoint, **kw):
    ys = solve(model, y0, a, c, adjoint, **kw).ys
    ys = jnp.where(jnp.isfinite(ys), ys, 0.0)  # SaveAt(steps=True) pads unused rows with inf
    w = jnp.linspace(1.0, 2.0, ys.shape[0])[:, None] * jnp.array([1.0, 0.5])
    w = w.reshape(w.shape[:1] + (1,) * (ys.ndim - 2) + w.shape[1:])
    return jnp.sum(w * ys**2)


def assert_close(x, ref, tol=1e-10):
    """The suite's comparison (``tests/_compare.py``) of the array leaves of ``x`` and ``ref``
    (models hold functions too)."""
    return _compare.assert_close(eqx.filter(x, eqx.is_array), eqx.filter(ref, eqx.is_array), tol)


def second_order_temp_bytes(adjoint, n_steps, batch=64, **extra):
    """Compile (do not run) d/d(model) |d loss / d y0|^2 with ``n_steps`` constant steps on a
    batch of ``batch`` initial values; return ``memory_analysis().temp_size_in_bytes``."""
    model, y0, a, c = inputs()
    y0 = jnp.tile(y0, (batch, 1)) * jnp.linspace(0.5, 1.5, batch)[:, None]
    kw = dict(controller=diffrax.ConstantStepSize(), dt0=T1 / n_steps, max_steps=n_steps, **extra)
    dyn, static = eqx.partition(model, eqx.is_array)

    def gg(dyn, y0, a, c):
        def inner(d):
            m = eqx.combine(d, static)
            g = jax.grad(lambda y: loss(m, y, a, c, adjoint, **kw))(y0)
            return jnp.sum(g**2)

        return jax.grad(inner)(dyn)

    compiled = jax.jit(gg).lower(dyn, y0, a, c).compile()
    return compiled.memory_analysis().temp_size_in_bytes
