"""Resources: nothing a gradient used outlives it (step closures, their arrays and compiled
code), and the peak memory of a gradient is the schedule's RAM slots plus two states plus the
parameters' gradient."""

from __future__ import annotations

import gc
import tracemalloc
import weakref

import jax.numpy as jnp
import numpy as np
import pytest

import retrograde.host as rh
from retrograde import schedules as rs


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


LOSS = rh.Final(lambda n, u, a: jnp.sum(u**2))


def _closure(size, seed=0):
    big = np.full(size, 0.1 * seed)

    def step(n, u, a):  # captures all of big, uses a few values of it
        return u + 0.01 * a * jnp.sin(u + 1e-3 * big[: u.shape[0]])

    return step, weakref.ref(big)


def test_step_and_loss_closures_are_released():
    """The cache of compiled steps and losses keeps neither the functions nor what they
    capture (value_and_grad, forward handles, hvp, bound methods)."""
    step, big = _closure(1000)
    rh.value_and_grad(step, LOSS, np.ones(3), 1.5, 5, schedule=rs.Revolve(2))
    with rh.forward(step, np.ones(3), 1.5, 5, schedule=rs.Revolve(2), loss=LOSS) as fp:
        fp.vjp()
    rh.hvp(step, LOSS, np.ones(3), 1.5, 5, 1.0, schedule=rs.Revolve(2))
    del step, fp
    gc.collect()
    assert big() is None

    def weighted_loss():
        weights = np.arange(3.0)
        return rh.Running(lambda n, u, a: jnp.sum(weights * u**2)), weakref.ref(weights)

    loss, w = weighted_loss()
    rh.value_and_grad(lambda n, u, a: u * a, loss, np.ones(3), 0.9, 4, schedule=rs.Revolve(2))
    rh.hvp(lambda n, u, a: u * a, loss, np.ones(3), 0.9, 4, 1.0, schedule=rs.Revolve(2))
    del loss
    gc.collect()
    assert w() is None

    class Model:
        def __init__(self):
            self.table = np.ones(100)

        def step(self, n, u, a):
            return u * a + 0.0 * jnp.sum(self.table)

    class Unhashable:  # a callable compared by value (like an equinox module with arrays)
        __hash__ = None

        def __init__(self):
            self.table = np.ones(100)
            self.traces = 0

        def __eq__(self, other):
            return NotImplemented

        def __call__(self, n, u, a):
            self.traces += 1
            return u * a + 0.0 * jnp.sum(self.table)

    model, fn = Model(), Unhashable()
    table, fn_table = weakref.ref(model.table), weakref.ref(fn.table)
    from retrograde.host._step import _JAX_STEPS

    sizes = []
    for _ in range(2):  # compiled once per bound method's instance, once per callable
        rh.value_and_grad(model.step, LOSS, np.ones(3), 0.9, 4, schedule=rs.Revolve(2))
        rh.value_and_grad(fn, LOSS, np.ones(3), 0.9, 4, schedule=rs.Revolve(2))
        sizes.append(len(_JAX_STEPS))
    assert sizes[0] == sizes[1]
    assert fn.traces == 2  # forward and vjp, each traced once
    del model, fn
    gc.collect()
    assert table() is None and fn_table() is None


def _rss_over_closures(calls, size):
    rss = []
    for i in range(calls):
        step, _ = _closure(size, seed=i)
        rh.value_and_grad(step, LOSS, np.ones(4), 1.5, 3, schedule=rs.Revolve(2))
        del step
        gc.collect()
        rss.append(_rss_mib())
    return rss


def test_rss_flat_over_new_closures():
    """Each call builds a new step closure capturing 8 MiB: RSS stays within 2 of those after
    the first few calls (it grew by one captured array per call before)."""
    mib = 8
    rss = _rss_over_closures(15, mib * 2**20 // 8)
    assert max(rss[5:]) - rss[4] < 2 * mib, rss


@pytest.mark.slow
def test_rss_flat_over_100_closures():
    mib = 16
    rss = _rss_over_closures(100, mib * 2**20 // 8)
    assert max(rss[5:]) - rss[4] < 2 * mib, rss


# ------------------------------------------------------------------ peak memory
SIZE = 40_000  # one state: 320 kB
STATE = SIZE * 8


class _Diffusion:
    """In-place ``u <- 0.6 u + 0.2 u[i-1] - 0.01 u^2 + q`` with a source field q (the
    parameters) and preallocated work arrays; its adjoint writes its result into the state it is
    handed, as the aliasing contract allows."""

    def __init__(self):
        self.t = np.zeros(SIZE)
        self.w = np.zeros(SIZE)

    def forward(self, n, u, q):
        t, w = self.t, self.w
        np.multiply(u, u, out=t)
        t *= -0.01
        w[0] = 0.0
        np.multiply(u[:-1], 0.2, out=w[1:])
        u *= 0.6
        u += w
        u += t
        u += q
        return u

    def vjp(self, n, u, q, lam):
        t, w = self.t, self.w
        np.multiply(u, lam, out=t)  # reads u ...
        t *= -0.02
        np.multiply(lam, 0.6, out=u)  # ... then overwrites it with the result
        w[-1] = 0.0
        np.multiply(lam[1:], 0.2, out=w[:-1])
        u += w
        u += t
        return u, lam


def _gradient_peak(schedule, storage):
    d = _Diffusion()
    x = np.linspace(0, 1, SIZE)
    u0, q = np.sin(np.pi * x), 0.01 * np.cos(x)
    loss = rh.Final(lambda n, u, q: 0.5 * float(np.dot(u, u)), grad=lambda n, u, q: (u, 0.0))
    step = rh.Step(d.forward, d.vjp)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        _J, g = rh.value_and_grad(step, loss, u0, q, 40, schedule=schedule, storage=storage)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak / STATE, g


@pytest.mark.parametrize("case", ["ram", "ram+disk"])
def test_peak_memory_is_the_ram_slots_plus_two_states_plus_the_gradient(case, tmp_path):
    if case == "ram":
        schedule, storage, ram = rs.Revolve(6), rh.Memory(), 6
    else:
        schedule = rs.MultiLevel(
            [
                rs.Level(2, name="memory"),
                rs.Level(8, write_cost=1.0, read_cost=1.0, name="disk", storage="disk"),
            ]
        )
        storage, ram = {"memory": rh.Memory(), "disk": rh.Disk(tmp_path)}, 2
    assert sum(schedule.max_slots(40)[:1]) == ram
    peak, g = _gradient_peak(schedule, storage)
    _, g_ref = _gradient_peak(rs.StoreAll(), rh.Memory())
    np.testing.assert_allclose(g.params, g_ref.params, rtol=1e-12)
    # the state at hand, the cotangent, the gradient of q: one state each (and some 100 kB of
    # bookkeeping: the schedule's tables, snapshot records)
    assert peak <= ram + 2 + 1 + 100e3 / STATE, peak
    assert list(tmp_path.iterdir()) == []
