"""``CheckpointAdjoint`` inside ``jax.shard_map`` with JAX's default ``check_vma=True``: a state
split over 4 of the 8 host devices (``conftest.py``), a vector field with a halo exchange
(``ppermute``), a global reduction (``psum``), a mean (``pmean``) and a gather (``all_gather``),
constant and adaptive steps (the controller's norm a global one, so every device takes the same
steps). The reference is diffrax's ``DirectAdjoint`` on the same program with
``check_vma=False``: diffrax's own adjoints do not run with the check on (its save buffers and its
Runge-Kutta stage buffers are built replicated, diffrax issue 735), which is also why these
solvers have no stage loop and the solves pass ``throw=False`` (equinox's runtime error branch
changes the solution's type)."""

from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import retrograde.diffrax as rdx

from .._compare import assert_close

DEVICES = 4
pytestmark = pytest.mark.skipif(jax.device_count() < DEVICES, reason="needs 4 host devices")

MESH = Mesh(np.array(jax.devices()[:DEVICES]), ("x",))
RING = [(i, (i + 1) % DEVICES) for i in range(DEVICES)]


def _field(t, y, k):
    left = lax.ppermute(y, "x", RING)
    total = lax.psum(jnp.sum(y), "x")
    every = jnp.sum(jnp.tanh(lax.all_gather(y, "x")), 0)
    return (
        -k * y + 0.3 * jnp.tanh(left) + 0.05 * jnp.tanh(total) + 0.02 * (lax.pmean(y, "x") + every)
    )


def _norm(y):  # the same on every device
    return jnp.sqrt(lax.psum(jnp.sum(y**2), "x") / (DEVICES * y.size))


SOLVERS = {
    "euler": (diffrax.Euler(), {}),
    "reversible_heun_adaptive": (
        diffrax.ReversibleHeun(),
        {"stepsize_controller": diffrax.PIDController(rtol=1e-4, atol=1e-6, norm=_norm)},
    ),
}


def _loss_fn(adjoint, solver, kw, check_vma=True):
    def loss(k, y0):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(_field),
            solver,
            0.0,
            1.0,
            0.1,
            y0,
            args=k,
            saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, 1.0, 5)),
            adjoint=adjoint,
            max_steps=16,
            throw=False,
            **kw,
        )
        return lax.psum(jnp.sum(sol.ys**2 * jnp.arange(1.0, 6.0)[:, None]), "x")

    f = jax.shard_map(loss, mesh=MESH, in_specs=(P(), P("x")), out_specs=P(), check_vma=check_vma)
    return jax.jit(f)


K = 0.7
Y0 = jnp.linspace(0.1, 1.0, 2 * DEVICES)
DY = jnp.cos(3.0 * Y0)
MODES = {
    "forward": lambda f: f(K, Y0),
    "grad": lambda f: jax.grad(f, (0, 1))(K, Y0),
    "jvp": lambda f: jax.jvp(f, (K, Y0), (0.3, DY)),
    "hvp": lambda f: jax.jvp(jax.grad(f, 1), (K, Y0), (0.3, DY))[1],
    "grad_of_grad": lambda f: jax.grad(lambda t: jax.grad(f, 0)(t, Y0))(K),
}


# Second order costs compile time (CheckpointAdjoint's, issue 33): grad of grad and the adaptive
# HVP run with the slow tests (`make test-all`).
_SLOW = {("euler", "grad_of_grad"), ("reversible_heun_adaptive", "hvp")}
CASES = [
    pytest.param(*c, marks=pytest.mark.slow) if c in _SLOW else c
    for c in [("euler", m) for m in MODES]
    + [("reversible_heun_adaptive", m) for m in ("grad", "hvp")]
]


@pytest.mark.parametrize(("solver", "mode"), CASES)
def test_checkpoint_adjoint_inside_shard_map(solver, mode):
    solver_, kw = SOLVERS[solver]
    got = MODES[mode](_loss_fn(rdx.CheckpointAdjoint(), solver_, kw))
    ref = MODES[mode](_loss_fn(diffrax.DirectAdjoint(), solver_, kw, check_vma=False))
    assert_close(got, ref, 1e-12, f"{solver} {mode}")
