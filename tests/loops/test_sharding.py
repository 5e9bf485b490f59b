"""``retrograde.scan`` with a carry sharded over the 8 host devices (``conftest.py`` sets
``--xla_force_host_platform_device_count=8``): gradients equal the unsharded reference, keep the
carry's sharding, and the snapshot slots are stored sharded (no device holds a full carry).

Memory is measured per device: on a program partitioned over several devices,
``compiled.memory_analysis()`` reports one device's buffers (a ``jax.lax.scan`` gradient over
a sharded state stores ``N`` local pieces, not ``N`` states: checked below). Host and disk levels
under ``jax.jit`` with a sharded state give the reference gradient; inside ``shard_map`` each
device stores and restores its own piece (docs/distributed.md).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import retrograde
from retrograde import schedules as rs
from retrograde.loops import offload_stats
from retrograde.loops._tables import tables_for
from retrograde.schedules import Level, MultiLevel

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


# --------------------------------------------------------------------------- memory per device

STATE = 16000  # global state size (float64) for the memory measurements


def _mesh(devices):
    return Mesh(np.array(jax.devices()[:devices]), ("x",))


def _memory_loss(scan, n, theta, u0):
    step = lambda u, _: (u + 0.01 * jnp.sin(theta * u) + 0.001 * jnp.roll(u, 1), None)
    u, _ = scan(step, u0, None, length=n)
    return jnp.sum(u**2)


def _manual_loss(scan, n, devices):
    """The loss of :func:`_memory_loss` inside ``jax.shard_map``: each device steps its piece,
    the shift a halo exchange (``ppermute``), the sum a ``psum``."""
    ring = [(i, (i + 1) % devices) for i in range(devices)]

    def loss(theta, u0):
        step = lambda u, _: (
            u + 0.01 * jnp.sin(theta * u) + 0.001 * jax.lax.ppermute(u, "x", ring),
            None,
        )
        u, _ = scan(step, u0, None, length=n)
        return jax.lax.psum(jnp.sum(u**2), "x")

    spec = (PartitionSpec(), PartitionSpec("x"))
    return jax.shard_map(loss, mesh=_mesh(devices), in_specs=spec, out_specs=PartitionSpec())


def _temp_per_device(scan, n, devices, manual=False):
    """``temp_size_in_bytes`` of the compiled gradient over a state of ``STATE`` float64 sharded
    over ``devices`` devices, in local pieces (``8 * STATE / devices`` bytes); ``manual``: the
    loop inside ``jax.shard_map``."""
    sharding = NamedSharding(_mesh(devices), PartitionSpec("x"))
    loss = (
        _manual_loss(scan, n, devices) if manual else (lambda th, u: _memory_loss(scan, n, th, u))
    )
    grad = jax.jit(jax.grad(loss, (0, 1)), in_shardings=(None, sharding))
    compiled = grad.lower(jnp.float64(0.5), jnp.ones(STATE)).compile()
    stats = compiled.memory_analysis()
    if stats is None or getattr(stats, "temp_size_in_bytes", None) is None:
        pytest.skip("this backend reports no memory analysis")
    return stats.temp_size_in_bytes / (8 * STATE / devices)


def _revolve(s):
    return lambda f, c, xs, length: retrograde.scan(f, c, xs, length=length, schedule=rs.Revolve(s))


def test_memory_analysis_is_per_device():
    """The calibration: ``jax.lax.scan``'s gradient keeps its residuals sharded, so one device
    holds about two local pieces per step, a quarter of what two global states per step take."""
    local = _temp_per_device(P.lax_scan, 100, 4)
    assert 2 * 100 <= local < 2 * 100 + 8, local


@pytest.mark.parametrize("manual", [False, True], ids=["jit", "shard_map"])
@pytest.mark.parametrize("devices", [2, 4])
def test_snapshots_are_local_pieces(devices, manual):
    """``Revolve(s)``'s gradient holds ``s`` local pieces per device plus a constant (measured:
    about 3.2 local pieces), flat in ``N``: ``s * state_bytes / devices + constant``, not
    ``s`` global states (which would add ``devices`` local pieces per slot); under ``jit`` with
    a sharded input and inside ``shard_map``."""
    temp = lambda s, n: _temp_per_device(_revolve(s), n, devices, manual)
    small, large = temp(4, 100), temp(4, 1000)
    more_slots = temp(10, 100)
    print(
        f"{devices} devices: {small:.2f} / {large:.2f} local pieces (s = 4, N = 100 / 1000), "
        f"{more_slots:.2f} (s = 10)"
    )
    assert large == small  # flat in N
    assert small <= 4 + 5  # s local pieces and a constant
    assert 5.5 <= more_slots - small <= 6.5  # six more slots: six local pieces


# --------------------------------------------------------------------------- host and disk levels

OFFLOAD_DEVICES = 4
OFFLOAD_N = 20


def _levels(directory):
    return MultiLevel(
        [
            Level(1),
            Level(2, write_cost=0.5, read_cost=0.5, storage="host"),
            Level(None, write_cost=2, read_cost=2, storage="disk", directory=str(directory)),
        ]
    )


def _offload_loss(scan, theta, u0):
    def step(u, x):
        return u + 0.1 * jnp.sin(theta * u * x), jnp.sum(u**2)

    u, ys = scan(step, u0, jnp.linspace(0.5, 1.5, OFFLOAD_N))
    return jnp.sum(u**3) + 0.1 * jnp.sum(ys)


def _offload_grad(loss, in_manual):
    """``value_and_grad`` of ``loss`` over a state sharded over 4 devices: under ``jax.jit``
    (``in_manual`` False) or in ``shard_map`` (each device runs the loop on its piece, the loss
    summed with ``psum``)."""
    mesh = _mesh(OFFLOAD_DEVICES)
    if in_manual:
        local = loss
        loss = jax.shard_map(
            lambda th, u: jax.lax.psum(local(th, u), "x"),
            mesh=mesh,
            in_specs=(PartitionSpec(), PartitionSpec("x")),
            out_specs=PartitionSpec(),
        )
    return P.jit(jax.value_and_grad(loss, (0, 1)))


@pytest.mark.parametrize("in_manual", [False, True], ids=["jit", "shard_map"])
def test_host_and_disk_levels_with_a_sharded_state(tmp_path, in_manual):
    """Gradient equal to ``jax.lax.scan``'s; every store closed, no file left. Under ``jax.jit``
    JAX runs each host callback once, on device 0, with the global state (a gather before each
    store, a scatter after each restore: docs/distributed.md); inside ``shard_map``
    each device stores and restores its own piece (one store per device)."""
    schedule = _levels(tmp_path)
    sharding = NamedSharding(_mesh(OFFLOAD_DEVICES), PartitionSpec("x"))
    u0 = jax.device_put(jnp.linspace(-1.0, 1.0, D), sharding)
    ours = _offload_grad(lambda th, u: _offload_loss(P.rscan(schedule), th, u), in_manual)
    ref = _offload_grad(lambda th, u: _offload_loss(P.lax_scan, th, u), in_manual)
    offload_stats(reset=True)
    got = ours(jnp.float64(0.7), u0)
    jax.block_until_ready(got)
    jax.effects_barrier()
    stats = offload_stats()
    P.assert_close(got, ref(jnp.float64(0.7), u0), 1e-12, "host and disk levels, sharded")
    assert got[1][1].sharding.is_equivalent_to(sharding, 1), got[1][1].sharding
    assert stats.open_stores == 0
    assert list(tmp_path.iterdir()) == []
    expected = rs.simulate(schedule, OFFLOAD_N).writes  # per level, for one run of the loop
    copies, piece = (OFFLOAD_DEVICES, D // OFFLOAD_DEVICES) if in_manual else (1, D)
    for level in (1, 2):
        assert expected[level] > 0
        assert stats.writes[level] == copies * expected[level], stats
        assert stats.bytes_written[level] == stats.writes[level] * piece * 8, stats
