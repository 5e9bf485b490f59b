"""retrograde.pyadjoint: correct checkpointed derivatives of pyadjoint tapes at every control.

References: pyadjoint's unchecked tape (which stores everything) and finite differences, in
float64. Loops: ``_models.py`` (the issue's long-range loop on ``AdjFloat``; a Firedrake-like
loop on a mutable ``Vec`` with delegated checkpoints, in-place recompute, multistep reads, a solve
whose adjoint reads its output and a parameter changed mid-run).
"""

from __future__ import annotations

import gc
import itertools
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pyadjoint as pa
import pytest
from checkpoint_schedules import Revolve as PyadjointRevolve

import retrograde.pyadjoint as rp
from retrograde.schedules import (
    Level,
    MultiLevel,
    Online,
    RecomputeAll,
    Revolve,
    ScheduleError,
    StoreAll,
    simulate,
)

from ._models import (
    RECOMPUTES,
    DiskPackage,
    Vec,
    adjfloat_loop,
    derivatives,
    finite_differences,
    poisoned_derivatives,
    uniform_loop,
    vec_loop,
)

pa.continue_annotation()

SCHEDULES = [
    (Revolve(2), None),
    (Revolve(2), 9),
    (Revolve(3), 9),
    (StoreAll(), None),
    (StoreAll(), 9),
    (Online(2), None),
    (RecomputeAll(), None),
    (RecomputeAll(), 9),
]
IDS = [f"{s}-n{n}" for s, n in SCHEDULES]


def _disk(tmp_path):
    return MultiLevel(
        [
            Level(1),
            Level(None, write_cost=1.0, read_cost=1.0, storage="disk", directory=str(tmp_path)),
        ]
    )


@pytest.mark.parametrize("schedule,n_steps", SCHEDULES, ids=IDS)
def test_adjfloat_long_range(schedule, n_steps):
    ref, _, _ = derivatives(adjfloat_loop, p1=0.9)
    got, _, _ = derivatives(adjfloat_loop, schedule, n_steps, p1=0.9)
    np.testing.assert_allclose(got, ref, rtol=1e-13)
    for p, g, H in ((0.7, ref[0], None), (0.9, ref[3], ref[5])):
        g_fd, H_fd = finite_differences(adjfloat_loop, p)
        np.testing.assert_allclose(g, g_fd, rtol=1e-6)
        if H is not None:
            np.testing.assert_allclose(H, H_fd, rtol=5e-3)  # second differences


@pytest.mark.parametrize("change_at", [None, 4])
@pytest.mark.parametrize("schedule,n_steps", SCHEDULES, ids=IDS)
def test_firedrake_like_loop(schedule, n_steps, change_at):
    ref, _, _ = derivatives(vec_loop, change_at=change_at)
    got, _, _ = derivatives(vec_loop, schedule, n_steps, change_at=change_at)
    np.testing.assert_allclose(got, ref, rtol=1e-13)


def test_references_agree_with_finite_differences():
    ref, _, _ = derivatives(vec_loop)
    g_fd, _ = finite_differences(vec_loop, 0.7)
    g1_fd, H1_fd = finite_differences(vec_loop, 1.3)
    np.testing.assert_allclose([ref[0], ref[3], ref[5]], [g_fd, g1_fd, H1_fd], rtol=1e-5)


def test_pyadjoint_own_revolve_is_wrong_on_this_loop():
    """The fault class the tests cover: pyadjoint's manager reads overwritten live values."""
    ref, _, _ = derivatives(vec_loop)
    tape = pa.Tape()
    with pa.set_working_tape(tape):
        tape.enable_checkpointing(PyadjointRevolve(9, 2))
        p = pa.AdjFloat(0.7)
        rf = pa.ReducedFunctional(vec_loop(p, tape), pa.Control(p))
        assert abs(float(rf.derivative()) - ref[0]) > 1e-3 * abs(ref[0])


def test_disk_level(tmp_path):
    ref, _, _ = derivatives(vec_loop)
    got, manager, tape = derivatives(vec_loop, _disk(tmp_path), 9)
    np.testing.assert_allclose(got, ref, rtol=1e-13)
    assert manager.counts.writes[1] > 0 and manager.counts.reads[1] > 0
    assert any(tmp_path.iterdir())  # the store's private directory, with snapshot files
    del manager, tape
    gc.collect()
    assert not any(p.is_dir() and any(p.iterdir()) for p in tmp_path.iterdir())


def test_package_disk_checkpointing(tmp_path):
    """With package data on the tape (Firedrake's disk checkpointing), disk snapshots are the
    package's own, written only while the manager has resumed it."""
    ref, _, _ = derivatives(vec_loop)
    package = DiskPackage(str(tmp_path))
    tape = pa.Tape(package_data={"vec": package})
    with pa.set_working_tape(tape):
        rp.enable_checkpointing(_disk(tmp_path), n_steps=9)
        p = pa.AdjFloat(0.7)
        rf = pa.ReducedFunctional(vec_loop(p, tape), pa.Control(p))
        got = [
            float(rf.derivative()),
            float(rf.derivative()),
            float(rf(pa.AdjFloat(1.3))),
            float(rf.derivative()),
        ]
    np.testing.assert_allclose(got, ref[:4], rtol=1e-13)
    assert package.files > 0
    calls = [c for c in package.calls if c in ("continue", "pause")]
    assert calls[0] == "pause" and "continue" in calls
    for a, b in itertools.pairwise(calls):
        assert not (a == "continue" and b == "continue")


@pytest.mark.parametrize("schedule", [Revolve(2), StoreAll(), Online(3)], ids=str)
def test_no_read_of_live_objects(schedule):
    """Every live object on the tape poisoned with NaN after taping: nothing changes."""
    ref, _, _ = derivatives(vec_loop)
    got = poisoned_derivatives(schedule)
    np.testing.assert_allclose(got, ref[:6], rtol=1e-13)


@pytest.mark.parametrize(
    "schedule,n_steps",
    [(Revolve(3), 12), (Revolve(3), None), (Online(3), None), (StoreAll(), 12)],
    ids=str,
)
def test_recomputations_equal_simulate(schedule, n_steps):
    """Block recomputations counted in the blocks: ``2 (plain + N) + 1`` for a derivative
    (the reverse part's plain steps and the N recorded ones; the functional's block once, with
    step N - 1), ``2 N + 1`` for a re-evaluation; ``StoreAll`` recomputes nothing it holds."""
    N = 12
    tape = pa.Tape()
    with pa.set_working_tape(tape):
        manager = rp.enable_checkpointing(schedule, n_steps=n_steps)
        p = pa.AdjFloat(0.7)
        rf = pa.ReducedFunctional(uniform_loop(p, tape, N), pa.Control(p))
        taped_online = isinstance(schedule, Online) or n_steps is None
        taped = (
            Online(schedule.snapshots)
            if isinstance(schedule, Revolve) and taped_online
            else schedule
        )
        later_online = isinstance(schedule, Online)
        for k, (reverse_of, online) in enumerate(((taped, taped_online), (schedule, later_online))):
            RECOMPUTES.clear()
            steps, recorded = manager.counts.steps, manager.counts.recorded
            rerun = manager.counts.rerun
            rf.derivative()
            plain = simulate(reverse_of, N).plain - (N if online else N - 1)
            assert manager.counts.steps - steps == plain
            assert manager.counts.recorded - recorded == N
            if isinstance(schedule, StoreAll):
                # every value kept: nothing recomputed, but after taping the last step, whose
                # functional no block read (so pyadjoint made no copy of it)
                assert manager.counts.rerun - rerun == (1, 0)[k]
                assert sum(RECOMPUTES.values()) == (3, 0)[k]
            else:
                assert manager.counts.rerun - rerun == N
                assert sum(RECOMPUTES.values()) == 2 * (plain + N) + 1
            RECOMPUTES.clear()
            rf(pa.AdjFloat(1.1))
            assert sum(RECOMPUTES.values()) == 2 * N + 1


def test_taylor_first_and_second_order():
    tape = pa.Tape()
    with pa.set_working_tape(tape):
        rp.enable_checkpointing(Revolve(3))
        p = pa.AdjFloat(0.7)
        rf = pa.ReducedFunctional(vec_loop(p, tape), pa.Control(p))
        h = pa.AdjFloat(0.1)
        assert pa.taylor_test(rf, pa.AdjFloat(0.9), h) > 1.9
        rf(pa.AdjFloat(0.9))
        dJdm = rf.derivative()._ad_dot(h)
        Hm = rf.hessian(h)._ad_dot(h)
        assert pa.taylor_test(rf, pa.AdjFloat(0.9), h, dJdm=dJdm, Hm=Hm) > 2.9


def _minimize(schedule):
    seen = []
    tape = pa.Tape()
    with pa.set_working_tape(tape):
        if schedule is not None:
            rp.enable_checkpointing(schedule)
        p = pa.AdjFloat(0.7)
        J = vec_loop(p, tape)
        target = 3.0
        obj = (J - target) ** 2
        rf = pa.ReducedFunctional(
            obj, pa.Control(p), eval_cb_post=lambda v, c: seen.append((float(c), float(v)))
        )
        opt = pa.minimize(rf, method="L-BFGS-B", options={"maxiter": 50})
    return float(opt), seen


def test_minimize_same_iterates():
    ref_opt, ref_seen = _minimize(None)
    opt, seen = _minimize(Revolve(2))
    assert len(seen) == len(ref_seen) > 2
    np.testing.assert_allclose(seen, ref_seen, rtol=1e-12)
    np.testing.assert_allclose(opt, ref_opt, rtol=1e-12)


# ------------------------------------------------------------------ memory
STATE = 131072  # 1 MB of float64


class _Logistic(pa.Block):
    """``u <- u + c p u (1 - u)`` with one allocation per evaluation and per adjoint."""

    c = 0.01

    def __init__(self, u, p):
        super().__init__()
        self.add_dependency(u)
        self.add_dependency(p)

    def recompute_component(self, inputs, block_variable, idx, prepared):
        u, p = inputs[0].data, float(inputs[1])
        r = 1.0 - u
        r *= u
        r *= self.c * p
        r += u
        return Vec(r, share=True)

    def evaluate_adj_component(self, inputs, adj_inputs, block_variable, idx, prepared=None):
        u, p, lam = inputs[0].data, float(inputs[1]), adj_inputs[0].data
        if idx == 0:
            r = u * (-2.0 * self.c * p)
            r += 1.0 + self.c * p
            r *= lam
            return Vec(r, share=True)
        return self.c * (float(np.dot(lam, u)) - float(np.einsum("i,i,i", lam, u, u)))


class _HalfSquare(pa.Block):
    """``J = sum(u * u) / 2`` (an ``AdjFloat``) with one allocation per adjoint."""

    def __init__(self, u):
        super().__init__()
        self.add_dependency(u)

    def recompute_component(self, inputs, block_variable, idx, prepared):
        u = inputs[0].data
        return pa.AdjFloat(0.5 * float(np.dot(u, u)))

    def evaluate_adj_component(self, inputs, adj_inputs, block_variable, idx, prepared=None):
        return Vec(inputs[0].data * float(adj_inputs[0]), share=True)


def _logistic_loop(p, tape, n_steps):
    u = Vec(np.full(STATE, 0.5))
    for _ in tape.timestepper(iter(range(n_steps))):
        block = _Logistic(u, p)
        tape.add_block(block)
        with pa.stop_annotating():
            u.data[...] = block.recompute_component([u, p], None, 0, None).data
        block.add_output(u.create_block_variable())
    block = _HalfSquare(u)
    tape.add_block(block)
    J = block.recompute_component([u], None, 0, None)
    block.add_output(J.block_variable)
    return J


def _peak_states(n_steps, snapshots=5, checked=True):
    tape = pa.Tape()
    with pa.set_working_tape(tape):
        if checked:
            rp.enable_checkpointing(Revolve(snapshots))
        p = pa.AdjFloat(0.7)
        J = _logistic_loop(p, tape, n_steps)
        rf = pa.ReducedFunctional(J, pa.Control(p))
        rf.derivative()  # ends the taping: the tape's structures (its graph, the plan) are made
        gc.collect()
        tracemalloc.start()
        base, _ = tracemalloc.get_traced_memory()
        rf(pa.AdjFloat(0.8))
        g = float(rf.derivative())
        g2 = float(rf.derivative())
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return (peak - base) / (8 * STATE), g, g2


def test_memory_bounded_and_flat_in_n():
    """Revolve(5), a 1 MB state: re-evaluation and derivative (traced once taped) hold at
    most 5 + 3 states, the same at N = 60 and 120 (tracemalloc). ``u_0`` is the tape's input, so
    Revolve's slot of ``u_0`` holds nothing: 4 snapshots, the state at hand, the recomputed
    output and the adjoints of both, ``lambda_{n+1}`` and ``lambda_n``."""
    peak_100, g100, again = _peak_states(60)
    assert g100 == again  # a second derivative, after a new first sweep
    _, ref, _ = _peak_states(60, checked=False)
    np.testing.assert_allclose(g100, ref, rtol=1e-13)
    peak_200, _, _ = _peak_states(120)
    assert peak_100 <= 5 + 3 + 0.1 and peak_200 <= 5 + 3 + 0.1
    assert abs(peak_200 - peak_100) < 0.1


# ------------------------------------------------------------------ errors
def test_errors():
    tape = pa.Tape()
    with pa.set_working_tape(tape):
        with pytest.raises(TypeError, match="retrograde schedule"):
            rp.enable_checkpointing(PyadjointRevolve(9, 2))
        _ = pa.AdjFloat(1.0) * pa.AdjFloat(2.0)
        with pytest.raises(ValueError, match="empty tape"):
            rp.enable_checkpointing(Revolve(2))
    for taped, given, match in ((5, 9, "took 5 time steps"), (12, 9, "more than n_steps=9")):
        tape = pa.Tape()
        with pa.set_working_tape(tape), pytest.raises(Exception, match=match):
            rp.enable_checkpointing(Revolve(2), n_steps=given)
            p = pa.AdjFloat(0.7)
            rf = pa.ReducedFunctional(adjfloat_loop(p, tape, taped), pa.Control(p))
            rf.derivative()
    tape = pa.Tape()  # a loop taped on after it was evaluated: its step count would change
    with pa.set_working_tape(tape):
        rp.enable_checkpointing(Revolve(2))
        p = pa.AdjFloat(0.7)
        rf = pa.ReducedFunctional(adjfloat_loop(p, tape, 4), pa.Control(p))
        rf(pa.AdjFloat(0.8))
        with pytest.raises(ScheduleError, match="cannot take more time steps"):
            adjfloat_loop(p, tape, 2)
    tape = pa.Tape()
    with pa.set_working_tape(tape), pytest.raises(ValueError, match="needs n_steps"):
        rp.enable_checkpointing(MultiLevel([Level(2), Level(None, 1.0, 1.0)]))
    tape = pa.Tape()
    with pa.set_working_tape(tape):
        rp.enable_checkpointing(Revolve(2))
        p = pa.AdjFloat(0.7)
        rf = pa.ReducedFunctional(adjfloat_loop(p, tape), pa.Control(p))
        with pytest.raises(ValueError, match="derivative"):
            rf.hessian(pa.AdjFloat(1.0))


def test_missing_value_is_an_error_naming_step_and_variable():
    tape = pa.Tape()
    with pa.set_working_tape(tape):
        manager = rp.enable_checkpointing(Revolve(2))
        p = pa.AdjFloat(0.7)
        rf = pa.ReducedFunctional(vec_loop(p, tape), pa.Control(p))
        rf.derivative()
        rf(pa.AdjFloat(0.9))
        for snap in manager._persistent.values():
            snap.entries.clear()  # as if a snapshot had lost what it must hold
        with pytest.raises(
            rp.MissingValueError, match=r"step \d+: the snapshot lacks a Vec made by"
        ):
            rf.derivative()


def test_heat_example_checks_itself():
    """examples/pyadjoint_heat.py: finite differences and Taylor tests pass (exit status 0)."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(root / "examples" / "pyadjoint_heat.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "rate 3.0" in out.stdout or "rate 2.9" in out.stdout
