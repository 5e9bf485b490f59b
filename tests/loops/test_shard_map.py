"""The loops inside ``jax.shard_map`` with JAX's default ``check_vma=True``: the primitives keep
the varying manual axes (``vma``) of every value through all their rules, so a step with
``psum``, ``pmean``, ``ppermute`` and ``all_gather`` gives the values and derivatives of
``jax.lax``'s loops (float64, 4 of the 8 host devices ``conftest.py`` forces)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import retrograde
from retrograde.schedules import Mixed, Online, Revolve

from . import _problems as PB

DEVICES = 4
L = 3  # carry elements per device
N = 9

pytestmark = pytest.mark.skipif(jax.device_count() < DEVICES, reason="needs 4 host devices")

MESH = Mesh(np.array(jax.devices()[:DEVICES]), ("x",))
RING = [(i, (i + 1) % DEVICES) for i in range(DEVICES)]


def _device(dtype):
    """This device's index along ``x``, as ``dtype`` (no implicit promotion: the tests also
    run with ``jax_numpy_dtype_promotion="strict"``)."""
    return lax.axis_index("x").astype(dtype)


def _step(theta):
    """A step with a global reduction, a mean, a halo exchange and a gather."""

    def step(u):
        s = lax.psum(jnp.sum(u * u), "x")
        m = lax.pmean(u, "x")
        left = lax.ppermute(u, "x", RING)
        every = jnp.sum(jnp.tanh(lax.all_gather(u, "x")), 0)
        return u + 0.05 * jnp.sin(theta * u) + 0.02 * (jnp.tanh(s) * u + m + left + 0.1 * every)

    return step


def _run(loop, step, u0, schedule):
    """``N`` steps of ``step`` from ``u0`` by ``loop`` (``"scan"``, ``"fori"``, ``"while"``),
    with ``retrograde``'s loop under ``schedule`` or, when it is ``"lax"``, ``jax.lax``'s."""
    ref = schedule == "lax"
    if loop == "scan":
        scan = lax.scan if ref else PB.rscan(schedule)
        return scan(lambda u, _: (step(u), None), u0, None, length=N)[0]
    if loop == "fori":
        if ref:
            return lax.fori_loop(0, N, lambda i, u: step(u), u0)
        return retrograde.fori_loop(0, N, lambda i, u: step(u), u0, schedule=schedule)
    # a while loop whose predicate reads a global reduction and the device's index
    body = lambda c: (c[0] + 1, step(c[1]))
    if ref:
        return lax.fori_loop(0, N, lambda i, c: body(c), (0, u0))[1]

    def cond(c):
        big = lax.psum(jnp.sum(c[1] ** 2), "x") < 1e6
        return (c[0] < N + 0 * _device(c[0].dtype)) & big

    return retrograde.while_loop(cond, body, (0, u0), schedule=schedule)[1]


def _loss_fn(loop, schedule, jit=True, mesh=MESH):
    def loss(theta, u0):
        u = _run(loop, _step(theta), u0, schedule)
        return lax.psum(jnp.sum(u**2 * (1.0 + _device(u.dtype))), "x")

    f = jax.shard_map(loss, mesh=mesh, in_specs=(P(), P("x")), out_specs=P())
    return jax.jit(f) if jit else f


THETA = 0.7
U0 = jnp.linspace(0.1, 1.0, DEVICES * L)
DU = jnp.cos(3.0 * U0)

MODES = {
    "forward": lambda f: f(THETA, U0),
    "grad": lambda f: jax.grad(f, (0, 1))(THETA, U0),
    "jvp": lambda f: jax.jvp(f, (THETA, U0), (0.3, DU)),
    "hvp": lambda f: jax.jvp(jax.grad(f, 1), (THETA, U0), (0.3, DU))[1],
    "grad_of_grad": lambda f: jax.grad(lambda t: jax.grad(f, 0)(t, U0))(THETA),
}
SCHEDULES = {"scan": Revolve(3), "fori": Revolve(4), "while": Online(3)}


# fori_loop is a scan of (counter, carry): its first-order modes run by default; second order of
# fori_loop and while_loop with the slow tests (`make test-all`), scan's by default.
_SLOW = {("fori", "hvp"), ("fori", "grad_of_grad"), ("while", "grad_of_grad")}
_SKIP = {("fori", "forward"), ("fori", "jvp")}  # scan's, exactly


@pytest.mark.parametrize(
    ("loop", "mode"),
    [
        pytest.param(lp, m, marks=pytest.mark.slow) if (lp, m) in _SLOW else (lp, m)
        for lp in SCHEDULES
        for m in MODES
        if (lp, m) not in _SKIP
    ],
)
def test_collectives_every_derivative(loop, mode):
    got = MODES[mode](_loss_fn(loop, SCHEDULES[loop]))
    ref = MODES[mode](_loss_fn(loop, "lax"))
    PB.assert_close(got, ref, 1e-12, f"{loop} {mode}")


@pytest.mark.parametrize("mode", ["grad", "hvp"])
def test_mixed_schedule_with_collectives(mode):
    """``Mixed``: steps reversed from their residuals (pooled with the snapshots), a step with
    collectives, a replicated cotangent seed."""
    got = MODES[mode](_loss_fn("scan", Mixed(3, 2.0)))
    ref = MODES[mode](_loss_fn("scan", "lax"))
    PB.assert_close(got, ref, 1e-12, f"Mixed {mode}")


def test_default_schedule_and_eager_shard_map():
    """``schedule=None`` and a ``shard_map`` that is not inside ``jit``."""
    got = jax.grad(_loss_fn("scan", None, jit=False), (0, 1))(THETA, U0)
    ref = jax.grad(_loss_fn("scan", "lax", jit=False), (0, 1))(THETA, U0)
    PB.assert_close(got, ref, 1e-12, "default schedule, eager shard_map")


@pytest.mark.parametrize("loop", ["scan", "while"])
def test_vmap_inside_shard_map(loop):
    """A batch of initial states mapped inside the ``shard_map`` body."""

    def make(schedule):
        def loss(theta, u0s):
            us = jax.vmap(lambda u0: _run(loop, _step(theta), u0, schedule))(u0s)
            return lax.psum(jnp.sum(jnp.sin(us)), "x")

        f = jax.shard_map(loss, mesh=MESH, in_specs=(P(), P(None, "x")), out_specs=P())
        return jax.jit(jax.grad(f, (0, 1)))

    u0s = jnp.stack([U0, 0.5 * U0 + 0.1])
    PB.assert_close(
        make(SCHEDULES[loop])(THETA, u0s), make("lax")(THETA, u0s), 1e-12, f"{loop} vmap"
    )


def test_carry_that_becomes_varying_is_a_type_error_naming_the_axes():
    """A replicated carry that the step makes vary over ``x``: the error ``jax.lax.scan``
    gives (a ``TypeError``), with the leaf, the axes and the fix."""

    def loss(theta, u0):
        step = lambda c, _: ((c[0] + lax.ppermute(c[1], "x", RING)[0], c[1]), None)
        c, _ = retrograde.scan(step, (theta * 1.0, u0), None, length=3, schedule=Revolve(2))
        return lax.psum(c[0], "x")

    f = jax.shard_map(loss, mesh=MESH, in_specs=(P(), P("x")), out_specs=P())
    with pytest.raises(TypeError, match=r"varying over mesh axes \('x',\)") as info:
        jax.jit(f)(THETA, U0)
    msg = str(info.value)
    assert "c[0]" in msg and "pcast" in msg and "varying mesh axes differ" in msg, msg


@pytest.mark.parametrize("where", ["jit", "shard_map"])
def test_mesh_with_explicit_axes(where):
    """``jax.make_mesh``'s default mesh types every array's sharding (explicit axes): the slot
    buffers are typed as rows of the carry, under ``jit`` with a sharded input and inside
    ``shard_map``; gradients and HVPs equal ``jax.lax.scan``'s."""
    mesh = jax.make_mesh((DEVICES,), ("x",), devices=jax.devices()[:DEVICES])
    u0 = jax.device_put(U0, jax.NamedSharding(mesh, P("x")))

    def make(schedule):
        if where == "jit":
            step = lambda th: lambda u: u + 0.05 * jnp.sin(th * u) + 0.01 * jnp.tanh(jnp.sum(u))
            return jax.jit(lambda th, u: jnp.sum(_run("scan", step(th), u, schedule) ** 2))
        return _loss_fn("scan", schedule, mesh=mesh)

    du = jax.device_put(DU, jax.NamedSharding(mesh, P("x")))
    modes = {
        "grad": lambda f: jax.grad(f, (0, 1))(THETA, u0),
        "hvp": lambda f: jax.jvp(jax.grad(f, 1), (THETA, u0), (0.3, du))[1],
    }
    with jax.set_mesh(mesh):
        for mode, run in modes.items():
            PB.assert_close(run(make(Revolve(3))), run(make("lax")), 1e-12, f"{where} {mode}")


def test_while_loop_with_a_step_count_per_device():
    """A predicate on ``lax.axis_index``: each device takes its own number of steps. The step
    has no collective, and the replicated parameter is made varying before the loop
    (``pcast``), so the reverse sweep has none either (its cotangent is summed once, after the
    loop; read inside the loop, a replicated value's cotangent is summed in every step, a
    collective that devices running different step counts would wait on forever). Against a
    ``lax.scan`` of the longest count that stops each device's updates at its own count."""

    def ours(theta, u0):
        theta = lax.pcast(theta, "x", to="varying")
        cond = lambda c: c[0] < 3 + 2 * _device(c[0].dtype)
        body = lambda c: (c[0] + 1, c[1] + 0.1 * jnp.sin(theta * c[1]))
        _, u = retrograde.while_loop(cond, body, (0, u0), schedule=Online(2))
        return lax.psum(jnp.sum(u**2), "x")

    def ref(theta, u0):
        n = 3 + 2 * _device(jnp.int32)
        step = lambda u, i: (jnp.where(i < n, u + 0.1 * jnp.sin(theta * u), u), None)
        u, _ = lax.scan(step, u0, jnp.arange(3 + 2 * DEVICES, dtype=jnp.int32))
        return lax.psum(jnp.sum(u**2), "x")

    wrap = lambda f: jax.jit(jax.shard_map(f, mesh=MESH, in_specs=(P(), P("x")), out_specs=P()))
    for mode in ("grad", "hvp"):
        PB.assert_close(MODES[mode](wrap(ours)), MODES[mode](wrap(ref)), 1e-12, mode)
