"""Mixed checkpointing in the host driver: steps reversed from stored data (``Linearize`` keeps a
step's data in a slot, ``Reverse`` runs its adjoint from it).

References: the loss and gradient through ``jax.lax.scan`` (unbounded memory) for the JAX step,
whose ``linearize``/``vjp_from`` are derived from ``jax.vjp``; finite differences and the
``StoreAll`` adjoint for the NumPy step with a hand-written ``linearize``/``vjp_from``. The
schedules are ``schedules.Mixed(s, d)`` for several budgets and data sizes (and from the JAX
step's measured data bytes, ``Mixed.from_bytes``), and two of the tests' own for what ``Mixed``
never does (``tests/_mixed_schedules.py``), each checked by ``simulate``.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrograde.host as rh
from retrograde import schedules as rs

from .._compare import assert_close
from .._mixed_schedules import OverBudget, mixed_schedules, sweep_counts
from . import _host_problems as P

N = 12
SCHEDULES = mixed_schedules()
IDS = [name for name, _ in SCHEDULES]
SCHEDS = [s for _, s in SCHEDULES]


def _storage(kind, tmp_path):
    return rh.Memory() if kind == "memory" else rh.Disk(tmp_path)


# ---------------------------------------------------------------- a NumPy step with its data
MIXED_STEP = rh.Step(P.np_forward, P.np_vjp, linearize=P.np_linearize, vjp_from=P.np_vjp_from)


class Counted:
    """A Step whose every callback counts its calls."""

    def __init__(self, step: rh.Step):
        self.calls = dict.fromkeys(("forward", "vjp", "linearize", "vjp_from"), 0)

        def counted(name):
            fn = getattr(step, name)

            def call(*args):
                self.calls[name] += 1
                return fn(*args)

            return call

        self.step = dataclasses.replace(step, **{k: counted(k) for k in self.calls})


@pytest.fixture(scope="module")
def jax_reference():
    return P.jax_reference(N)


@pytest.fixture(scope="module")
def np_reference():
    s0, p = P.state0(), P.params0()
    J, g = rh.value_and_grad(P.NP_STEP, P.NP_LOSS, s0, p, N, schedule=rs.StoreAll())
    return J, g, P.fd_grad(s0, p, N)


@pytest.mark.parametrize("schedule", SCHEDS, ids=IDS)
def test_schedules_are_valid(schedule):
    """The tests' mixed schedules pass the simulator: every step reversed once, by Record or
    Reverse, and the two sweeps' counts add up."""
    for n in range(10):
        st = rs.simulate(schedule, n)
        assert st.recorded + st.reversed == n
        assert st.linearized >= st.reversed
        first, rest = sweep_counts(schedule, n)
        assert first.plain + rest.plain == st.plain
        assert first.linearized + rest.linearized == st.linearized


@pytest.mark.parametrize("kind", ["memory", "disk"])
@pytest.mark.parametrize("schedule", SCHEDS, ids=IDS)
def test_jax_step_derived_linearization(schedule, kind, tmp_path, jax_reference):
    """A plain JAX step: its data are the residuals of ``jax.vjp``; gradients equal those
    through ``jax.lax.scan``; snapshot and data files removed at the end."""
    J_ref, gp, gs = jax_reference
    J, g = rh.value_and_grad(
        P.jax_step,
        P.JAX_LOSS,
        P.state0(),
        P.params0(),
        N,
        schedule=schedule,
        storage=_storage(kind, tmp_path),
    )
    np.testing.assert_allclose(J, J_ref, rtol=1e-13)
    assert_close(g.params, gp, 1e-12, "params")
    assert_close(g.state0, gs, 1e-12, "state0")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["memory", "disk"])
@pytest.mark.parametrize("schedule", SCHEDS, ids=IDS)
def test_numpy_step_given_linearization(schedule, kind, tmp_path, np_reference):
    """A NumPy Step with its own ``linearize``/``vjp_from``, updating its state in place: the
    StoreAll adjoint to 1e-12, finite differences to 1e-6."""
    J_ref, g_ref, (ga, gc, gu) = np_reference
    s0, p = P.state0(), P.params0()
    s0_copy = {k: v.copy() for k, v in s0.items()}
    J, g = rh.value_and_grad(
        MIXED_STEP, P.NP_LOSS, s0, p, N, schedule=schedule, storage=_storage(kind, tmp_path)
    )
    np.testing.assert_allclose(J, J_ref, rtol=1e-13)
    assert_close(g, g_ref, 1e-12, "StoreAll")
    np.testing.assert_allclose(g.params["a"], ga, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(g.params["c"], gc, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(g.state0["u"], gu, rtol=1e-6, atol=1e-8)
    for k in s0:
        np.testing.assert_array_equal(s0[k], s0_copy[k])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("schedule", SCHEDS, ids=IDS)
def test_evaluations_equal_simulate(schedule):
    """Every call counted: ``forward`` + ``linearize`` + ``vjp`` = the simulator's ``plain +
    linearized + recorded`` (plus the steps from where the first sweep ends to ``u_N``, which the
    driver takes for the loss); ``vjp_from`` once per step reversed; and each later ``vjp`` runs
    the reverse part only."""
    st = rs.simulate(schedule, N)
    first, rest = sweep_counts(schedule, N)
    to_end = N - first.hand
    c = Counted(MIXED_STEP)
    with rh.forward(c.step, P.state0(), P.params0(), N, schedule=schedule, loss=P.NP_LOSS) as fp:
        assert c.calls == {
            "forward": first.plain + to_end,
            "linearize": first.linearized,
            "vjp": 0,
            "vjp_from": 0,
        }
        fp.vjp()
        assert c.calls["forward"] + c.calls["linearize"] + c.calls["vjp"] == (
            st.plain + st.linearized + st.recorded + to_end
        )
        assert c.calls["vjp"] == st.recorded and c.calls["vjp_from"] == st.reversed
        counts = fp.counts
        assert (counts.plain, counts.linearized, counts.recorded, counts.reversed) == (
            st.plain + to_end,
            st.linearized,
            st.recorded,
            st.reversed,
        )
        assert counts.writes == st.writes and counts.reads == st.reads
        assert counts.data_writes == st.data_writes and counts.data_reads == st.data_reads
        before = dict(c.calls)
        fp.vjp()
        assert {k: c.calls[k] - before[k] for k in c.calls} == {
            "forward": rest.plain,
            "linearize": rest.linearized,
            "vjp": rest.recorded,
            "vjp_from": rest.reversed,
        }


def test_jax_step_counts_and_bytes():
    """The derived linearization's counts are the simulator's; the data's bytes and the states'
    are reported per level, each in its own store."""
    schedule = dict(SCHEDULES)["SplitLeavesDataOnDisk"]
    st = rs.simulate(schedule, N)
    with rh.forward(
        P.jax_step, P.state0(), P.params0(), N, schedule=schedule, loss=P.JAX_LOSS
    ) as fp:
        fp.vjp()
        c = fp.counts
        assert (c.plain, c.linearized, c.recorded, c.reversed) == (
            st.plain + 1,
            st.linearized,
            st.recorded,
            st.reversed,
        )
        assert c.data_writes == st.data_writes == (0, st.linearized)
        state = 2 * P.M * 8  # u and memo, float64
        assert c.state_bytes == (2 * state, 0)  # u_0 and u_h
        # the residuals and the running loss's gradient, for at most the longest leaf's steps
        assert 0 < c.data_bytes[1] and c.data_bytes[0] == 0


@pytest.mark.parametrize("kind", ["memory", "disk"])
@pytest.mark.parametrize("schedule", SCHEDS, ids=IDS)
def test_handle_reversed_twice(schedule, kind, tmp_path):
    """One forward pass reversed three times with different cotangents (the last with
    ``keep=False``): each equals a fresh gradient; the first sweep's data stay for the next."""
    s0, p = P.state0(), P.params0()
    rng = np.random.default_rng(5)
    bar = {"u": rng.standard_normal(P.M), "memo": rng.standard_normal(P.M)}

    def fresh(state_bar, loss_bar):
        with rh.forward(P.NP_STEP, s0, p, N, schedule=rs.StoreAll(), loss=P.NP_LOSS) as fp:
            return fp.vjp(state_bar, loss_bar=loss_bar)

    want = [fresh(None, 1.0), fresh(bar, 0.0), fresh(bar, 2.0)]
    first, _ = sweep_counts(schedule, N)
    storage = _storage(kind, tmp_path)
    with rh.forward(MIXED_STEP, s0, p, N, schedule=schedule, loss=P.NP_LOSS, storage=storage) as fp:
        got = [fp.vjp(), fp.vjp(bar, loss_bar=0.0)]
        writes = sum(fp.counts.data_writes)
        got.append(fp.vjp(bar, loss_bar=2.0, keep=False))
        assert sum(fp.counts.data_writes) - writes == rs.simulate(schedule, N).linearized - (
            first.linearized
        )
        with pytest.raises(ValueError, match="keep=False"):
            fp.vjp()
    for g, w in zip(got, want):
        assert_close(g, w, 1e-12, "vjp")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["Mixed3", "Mixed5-2"])
def test_hvp(name):
    """The Hessian-vector product (forward over reverse: the tangent-augmented JAX step, its
    data derived as for any JAX step) against ``jax.jvp(jax.grad)`` through ``lax.scan``."""
    s0 = jax.tree_util.tree_map(jnp.asarray, P.state0())
    p = jax.tree_util.tree_map(jnp.asarray, P.params0())
    rng = np.random.default_rng(7)
    pd = {"a": rng.standard_normal(P.M), "c": np.float64(rng.standard_normal())}

    def f(q, s):
        return P.jax_reference_J(q, s, N)

    _, hp = jax.jvp(lambda q: jax.grad(f)(q, s0), (p,), (pd,))
    schedule = dict(SCHEDULES)[name]
    r = rh.hvp(P.jax_step, P.JAX_LOSS, P.state0(), P.params0(), N, pd, schedule=schedule)
    assert_close(r.hvp.params, hp, 1e-11, "hvp")
    assert_close(r.grad.params, jax.grad(f)(p, s0), 1e-12, "grad")


# ---------------------------------------------------------------- Mixed's memory budget
def _final_only_reference(n_steps):
    """``J = final(u_N)`` and its gradient through ``jax.lax.scan`` (unbounded memory)."""
    s0 = jax.tree_util.tree_map(jnp.asarray, P.state0())
    p = jax.tree_util.tree_map(jnp.asarray, P.params0())

    def J(q, s):
        def body(u, n):
            return P.jax_step(n, u, q), None

        return P.JAX_LOSS[1].f(n_steps, jax.lax.scan(body, s, jnp.arange(n_steps))[0], q)

    value, (gp, gs) = jax.value_and_grad(J, argnums=(0, 1))(p, s0)
    return float(value), gp, gs


def test_from_bytes_with_the_measured_data():
    """``Mixed.from_bytes`` with the JAX step's data bytes as the driver measures them (one
    ``Linearize``: ``counts.data_bytes``) and a budget of 2 states and 2 steps' data: the
    gradient through ``lax.scan``'s; the bytes held stay within the schedule's slots; the
    simulator (``Simulator.for_schedule``) keeps the weighted memory within the budget."""
    with rh.forward(P.jax_step, P.state0(), P.params0(), 2, schedule=rs.Mixed(1)) as fp:
        data_bytes = fp.counts.data_bytes[0]  # step 0's residuals
        assert fp.counts.linearized == 1
    state_bytes = 2 * P.M * 8  # u and memo, float64
    budget = 2 * state_bytes + 2 * data_bytes
    schedule = rs.Mixed.from_bytes(budget, state_bytes, data_bytes)
    assert schedule.data_size == Fraction(data_bytes, state_bytes) > 1  # residuals: u, sin, ...
    st = rs.simulate(schedule, N)
    assert st.reversed > 0 and st.peak_memory[0] * state_bytes <= budget
    J_ref, gp, gs = _final_only_reference(N)
    with rh.forward(
        P.jax_step, P.state0(), P.params0(), N, schedule=schedule, loss=P.JAX_LOSS[1]
    ) as fp:
        g = fp.vjp(keep=False)  # frees the first sweep's slots as the schedule does
        c = fp.counts
    np.testing.assert_allclose(fp.value, J_ref, rtol=1e-13)
    assert_close(g.params, gp, 1e-12, "params")
    assert_close(g.state0, gs, 1e-12, "state0")
    assert (c.linearized, c.reversed) == (st.linearized, st.reversed)
    assert c.state_bytes[0] <= schedule.state_slots * state_bytes
    assert 0 < c.data_bytes[0] <= schedule.data_slots * data_bytes


def test_data_larger_than_the_budget_is_revolve():
    """``Mixed(2, data_size=3)``: no data slot fits, so it is ``Revolve(2)`` (no ``Linearize``:
    a Step without ``linearize`` runs it), with Revolve's counts and the StoreAll gradient."""
    s0, p = P.state0(), P.params0()
    J_ref, g_ref = rh.value_and_grad(P.NP_STEP, P.NP_LOSS, s0, p, N, schedule=rs.StoreAll())
    with rh.forward(P.NP_STEP, s0, p, N, schedule=rs.Mixed(2, 3), loss=P.NP_LOSS) as fp:
        g = fp.vjp()
        c = fp.counts
    revolve = rs.simulate(rs.Revolve(2), N)
    assert (c.plain - 1, c.recorded, c.linearized, c.reversed) == (revolve.plain, N, 0, 0)
    np.testing.assert_allclose(fp.value, J_ref, rtol=1e-13)
    assert_close(g, g_ref, 1e-12, "StoreAll")


def test_over_the_memory_budget(tmp_path):
    """A schedule whose weighted memory exceeds its ``memory_budget`` stops at the action that
    would exceed it (the driver's simulator is the schedule's, ``Simulator.for_schedule``), and
    leaves no file behind."""
    with pytest.raises(rs.ScheduleError, match=r"over the memory budget of 3"):
        rh.value_and_grad(
            MIXED_STEP,
            P.NP_LOSS,
            P.state0(),
            P.params0(),
            N,
            schedule=OverBudget(),
            storage=rh.Disk(tmp_path),
        )
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- errors
class _RestoreData(rs.OfflineSchedule):
    """Invalid: restarts the forward sweep from a step's data."""

    def actions(self, n_steps):
        yield rs.Linearize(0, 0)
        yield rs.Restore(0, 0)


class _ReverseState(rs.OfflineSchedule):
    """Invalid: reverses a step from a slot that holds a state."""

    def actions(self, n_steps):
        yield rs.Advance(0, n_steps - 1)
        yield rs.Store(n_steps - 1, 0)
        yield rs.Reverse(n_steps - 1, 0)


def test_errors(tmp_path):
    with pytest.raises(TypeError, match=r"Step\(linearize=...\) was given without vjp_from"):
        rh.Step(P.np_forward, P.np_vjp, linearize=P.np_linearize)
    with pytest.raises(TypeError, match=r"Step\(vjp_from=...\) must be callable"):
        rh.Step(P.np_forward, P.np_vjp, linearize=P.np_linearize, vjp_from=3)
    s0, p = P.state0(), P.params0()
    schedule = dict(SCHEDULES)["Mixed20"]  # Linearize(0 .. N - 2), Record(N - 1), Reverse(N - 2) ..
    with pytest.raises(ValueError, match=r"this Step has no linearize; pass Step\(forward, vjp, "):
        rh.value_and_grad(
            P.NP_STEP, P.NP_LOSS, s0, p, N, schedule=schedule, storage=rh.Disk(tmp_path)
        )
    assert list(tmp_path.iterdir()) == []

    def bad(linearize=P.np_linearize, vjp_from=P.np_vjp_from, schedule=schedule):
        step = rh.Step(P.np_forward, P.np_vjp, linearize=linearize, vjp_from=vjp_from)
        rh.value_and_grad(step, P.NP_LOSS, s0, p, N, schedule=schedule, storage=rh.Disk(tmp_path))

    with pytest.raises(
        TypeError, match=r"Step.linearize at step 0 returned dict; it must return a pair"
    ):
        bad(linearize=lambda n, s, q: s)
    with pytest.raises(TypeError, match=r"returned data leaf \['f'\] of type builtin_function"):
        bad(linearize=lambda n, s, q: (P.np_forward(n, s, q), {"f": print}))
    with pytest.raises(ValueError, match=r"Step.vjp_from at step 10 returned state_bar leaf"):
        bad(vjp_from=lambda n, d, q, b: ({"u": np.zeros(2), "memo": b["memo"]}, 0.0))
    with pytest.raises(rh.SnapshotError, match="cannot restart from a step's data"):
        bad(schedule=_RestoreData())
    with pytest.raises(
        rh.SnapshotError, match=f"the data of step {N - 1} is missing.*the snapshot of step {N - 1}"
    ):
        bad(schedule=_ReverseState())
    assert list(tmp_path.iterdir()) == []
