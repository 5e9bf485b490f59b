"""``retrograde.scan`` with a carry sharded over the 8 host devices (``conftest.py`` sets
``--xla_force_host_platform_device_count=8``): gradients equal the unsharded reference, keep the
carry's sharding, and the snapshot slots are stored sharded (no device holds a full carry)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from retrograde import schedules as rs
from retrograde.loops._tables import tables_for

from . import _problems as P

DEVICES = 8
K = 4  # carry elements per device
D = DEVICES * K
N = 10
SCHEDULE = rs.Revolve(3)

pytestmark = pytest.mark.skipif(
    jax.device_count() < DEVICES, reason=f"needs {DEVICES} (host) devices"
)


def _loss(scan, theta, u0):
    def step(u, x):
        return u + 0.1 * jnp.sin(theta * u * x) + 0.01 * jnp.roll(u, 1), jnp.sum(u**2)

    u, ys = scan(step, u0, jnp.linspace(0.5, 1.5, N))
    return jnp.sum(u**3) + 0.1 * jnp.sum(ys)


@pytest.fixture(scope="module")
def sharded():
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("x",))
    sharding = NamedSharding(mesh, PartitionSpec("x"))
    u0 = jax.device_put(jnp.linspace(-1.0, 1.0, D), sharding)
    grad = P.jit(jax.value_and_grad(lambda th, u: _loss(P.rscan(SCHEDULE), th, u), (0, 1)))
    compiled = grad.lower(jnp.float64(0.7), u0).compile()
    return sharding, u0, compiled


def test_sharded_gradient_matches_reference(sharded):
    sharding, u0, compiled = sharded
    value, (g_theta, g_u) = compiled(jnp.float64(0.7), u0)
    ref = P.jit(jax.value_and_grad(lambda th, u: _loss(P.lax_scan, th, u), (0, 1)))(
        jnp.float64(0.7), np.asarray(u0)
    )
    P.assert_close((value, (g_theta, g_u)), ref, 1e-12, "sharded grad")
    assert g_u.sharding.is_equivalent_to(sharding, 1), g_u.sharding


def test_snapshots_stay_sharded(sharded):
    """The partitioned program holds the snapshot slots as ``f64[slots, K]`` per device and
    never a stack of full carries ``f64[..., D]``. (The step itself may communicate: the
    transpose of ``jnp.roll`` pads a local piece to ``f64[D]``.)"""
    _, _, compiled = sharded
    hlo = compiled.as_text()
    slots = tables_for(SCHEDULE, N).n_slots
    assert f"f64[{slots},{K}]" in hlo
    full = re.findall(rf"f64\[(?:\d+,)+{D}\]", hlo)
    assert not full, f"stacks of full carries in the partitioned program: {sorted(set(full))}"
