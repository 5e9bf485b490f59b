"""A checkpointed loop inside ``jax.shard_map``: a heat equation split over 4 devices.

    python examples/sharded_heat.py      # a few seconds, on 4 CPU devices it forces

A periodic rod, ``u_t = D u_xx + theta u (1 - u^2)`` (diffusion with a nonlinear reaction),
explicit Euler steps. Each of the 4 devices of a mesh axis ``"x"`` holds a block of the rod; a
step exchanges one halo cell with each neighbour (``lax.ppermute``) and the loss sums over the
devices (``lax.psum``). The gradient with respect to ``theta`` and ``u0`` is computed by
``retrograde.scan`` with ``Revolve(8)``: each device keeps 8 snapshots of its own block, not one
per step, and recomputes the rest. The script checks the gradient against ``jax.lax.scan``'s
(float64) and exits non-zero if they differ by more than 1e-10 (relative).
``benchmarks/sharded.py`` times the same loss over 10,000 steps.

On real accelerators, drop the ``XLA_FLAGS`` lines and build the mesh from ``jax.devices()``;
across hosts, call ``jax.distributed.initialize()`` first (docs/distributed.md).
"""

import os

# 4 CPU devices, set before JAX is imported (unless the caller chose a device count already)
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    ).strip()

import functools
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import retrograde  # noqa: E402
from retrograde.schedules import Revolve, simulate  # noqa: E402

DEVICES, LOCAL, N = 4, 32, 1000  # devices, cells per device, steps
DIFFUSION, THETA = 1.0, 40.0
SCHEDULE = Revolve(8)
TOLERANCE = 1e-10
TO_RIGHT = [(i, (i + 1) % DEVICES) for i in range(DEVICES)]  # device i sends to device i + 1
TO_LEFT = [(i, (i - 1) % DEVICES) for i in range(DEVICES)]


def exchange_halo(u):
    """This device's block ``u`` with one neighbour cell on each side (periodic)."""
    left = lax.ppermute(u[-1:], "x", TO_RIGHT)  # the left neighbour's last cell
    right = lax.ppermute(u[:1], "x", TO_LEFT)  # the right neighbour's first cell
    return jnp.concatenate([left, u, right])


def step(theta, u, dx, halo=exchange_halo):
    """One explicit step of this device's block ``u`` (cells of width ``dx``)."""
    padded = halo(u)
    laplacian = (padded[:-2] - 2 * u + padded[2:]) / dx**2
    dt = 0.2 * dx**2 / DIFFUSION  # D dt / dx^2 = 0.2: stable explicit steps
    return u + dt * (DIFFUSION * laplacian + theta * u * (1 - u**2))


def loss(scan, theta, u0, n_steps=N):
    """Runs inside ``shard_map``: ``u0`` is this device's block, ``theta`` is replicated.
    ``scan`` is ``jax.lax.scan`` or a drop-in for it."""
    local = u0.shape[0]
    dx = 1.0 / (DEVICES * local)
    x = (lax.axis_index("x") * local + jnp.arange(local) + 0.5) * dx  # this block's cells
    target = 0.5 * jnp.sin(2 * jnp.pi * x) ** 2
    u, _ = scan(lambda u, _: (step(theta, u, dx), None), u0, None, length=n_steps)
    return lax.psum(dx * jnp.sum((u - target) ** 2), "x")  # the same on every device


def sharded(mesh, fn):
    """``fn(theta, u0)`` on the mesh: ``theta`` replicated, ``u0`` split over ``"x"``."""
    return jax.shard_map(fn, mesh=mesh, in_specs=(P(), P("x")), out_specs=P())


def initial_state(local=LOCAL):
    x = (jnp.arange(DEVICES * local) + 0.5) / (DEVICES * local)
    return 0.3 * jnp.cos(2 * jnp.pi * x) + 0.1 * jnp.sin(6 * jnp.pi * x)


def main() -> int:
    if jax.device_count() < DEVICES:
        print(f"needs {DEVICES} devices, found {jax.device_count()} (XLA_FLAGS set earlier?)")
        return 1
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("x",))
    theta, u0 = jnp.float64(THETA), initial_state()

    def gradient(scan):
        return jax.jit(jax.value_and_grad(sharded(mesh, functools.partial(loss, scan)), (0, 1)))

    checkpointed = functools.partial(retrograde.scan, schedule=SCHEDULE)  # lax.scan's signature
    value, (g_theta, g_u0) = gradient(checkpointed)(theta, u0)
    value_ref, (g_theta_ref, g_u0_ref) = gradient(lax.scan)(theta, u0)

    stats = simulate(SCHEDULE, N)
    print(f"{N} steps on {DEVICES} devices of {LOCAL} cells, {SCHEDULE}: each device keeps")
    print(f"  {stats.peak_slots[0]} snapshots of its block and runs {stats.plain} plain steps")
    print(f"  (+ {N} recorded), against {N} stored blocks for jax.lax.scan")
    print(f"loss {float(value):.12f} (jax.lax.scan: {float(value_ref):.12f})")
    print(f"dL/dtheta {float(g_theta):.12e} (jax.lax.scan: {float(g_theta_ref):.12e})")
    print(f"dL/du0 is sharded as u0: {g_u0.sharding.spec}")
    error = max(
        abs(float(g_theta - g_theta_ref)) / abs(float(g_theta_ref)),
        float(jnp.max(jnp.abs(g_u0 - g_u0_ref)) / jnp.max(jnp.abs(g_u0_ref))),
    )
    print(f"relative error of the gradient against jax.lax.scan: {error:.2e}")
    if not error <= TOLERANCE:
        print(f"FAILED: relative error {error:.2e} > {TOLERANCE:g}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
