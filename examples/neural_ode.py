"""A neural ODE differentiated twice with retrograde.diffrax.CheckpointAdjoint.

The loss is an outer gradient through an inner gradient: how the sensitivity of a neural ODE's
fit to its initial state, |d loss / d y0|^2, changes with the network's weights. diffrax's default
RecursiveCheckpointAdjoint cannot do this (its backward pass is a while loop, which JAX cannot
reverse-differentiate); DirectAdjoint can, storing every step. CheckpointAdjoint keeps a few
snapshots of the solver state, for any number of steps.

    python examples/neural_ode.py
"""

import os

os.environ.setdefault("JAX_ENABLE_X64", "1")  # float64, to compare to 1e-10

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from retrograde.diffrax import CheckpointAdjoint

N_STEPS = 1000  # constant steps; memory of CheckpointAdjoint does not depend on it

# A small network as the vector field, on a batch of 16 two-dimensional states.
model = eqx.nn.MLP(2, 2, 16, 1, activation=jnp.tanh, key=jr.PRNGKey(0))
y0 = jr.normal(jr.PRNGKey(1), (16, 2))
ts = jnp.linspace(0.0, 1.0, 50)  # save times
target = jnp.sin(ts)[:, None, None] * jnp.ones((1, 16, 2))
params, static = eqx.partition(model, eqx.is_array)


def fit_loss(params, y0, adjoint):
    """Squared distance of the trajectory (saved at ts) to a target."""
    net = eqx.combine(params, static)
    term = diffrax.ODETerm(lambda t, y, args: jax.vmap(net)(y))
    sol = diffrax.diffeqsolve(
        term,
        diffrax.Tsit5(),
        0.0,
        1.0,
        1.0 / N_STEPS,
        y0,
        saveat=diffrax.SaveAt(ts=ts),
        adjoint=adjoint,
        max_steps=N_STEPS,
    )
    return jnp.mean((sol.ys - target) ** 2)


def sensitivity_loss(params, y0, adjoint):
    """|d fit_loss / d y0|^2: a scalar built from an inner gradient."""
    g = jax.grad(fit_loss, argnums=1)(params, y0, adjoint)
    return jnp.sum(g**2)


# The outer gradient, w.r.t. the network: a gradient of a gradient.
outer = jax.grad(sensitivity_loss)


def compile_and_run(adjoint):
    compiled = jax.jit(lambda p, y: outer(p, y, adjoint)).lower(params, y0).compile()
    temp_mib = compiled.memory_analysis().temp_size_in_bytes / 2**20
    return compiled(params, y0), temp_mib


def flat(tree):
    return np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(tree)])


g_ckpt, mem_ckpt = compile_and_run(CheckpointAdjoint())  # default schedule: Online(s)
g_direct, mem_direct = compile_and_run(diffrax.DirectAdjoint())

err = np.max(np.abs(flat(g_ckpt) - flat(g_direct))) / np.max(np.abs(flat(g_direct)))
print(f"{N_STEPS} steps, gradient of a gradient w.r.t. {flat(g_ckpt).size} network weights")
print(f"  relative difference CheckpointAdjoint vs DirectAdjoint: {err:.1e}")
print(f"  temp memory: CheckpointAdjoint {mem_ckpt:.2f} MiB, DirectAdjoint {mem_direct:.2f} MiB")
