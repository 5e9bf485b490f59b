"""Mixed schedules on pyadjoint tapes: steps reversed from their stored adjoint dependencies.

References: pyadjoint's unchecked tape (every value kept), in float64, to 1e-12; the loops of
``_models.py`` (the long-range loop on ``AdjFloat``, the Firedrake-like ``Vec`` loop with
delegated checkpoints, in-place recompute, multistep reads, a solve whose adjoint reads its
output, a parameter assigned mid-run); block recomputations counted in the blocks against the
simulator. The schedules are ``schedules.Mixed(s, d)`` for several budgets and data sizes, and
two of the tests' own for what ``Mixed`` never does (``tests/_mixed_schedules.py``).
"""

from __future__ import annotations

import gc

import numpy as np
import pyadjoint as pa
import pytest

import retrograde.pyadjoint as rp
from retrograde.schedules import (
    Advance,
    Linearize,
    Mixed,
    Record,
    Reverse,
    Revolve,
    ScheduleError,
    simulate,
)

from .._mixed_schedules import OverBudget, mixed_schedules, sweep_counts
from ._models import (
    RECOMPUTES,
    DiskPackage,
    adjfloat_loop,
    derivatives,
    poisoned_derivatives,
    uniform_loop,
    vec_loop,
)

pa.continue_annotation()

N = 9
SCHEDULES = mixed_schedules()
IDS = [name for name, _ in SCHEDULES]
SCHEDS = [s for _, s in SCHEDULES]


@pytest.fixture(scope="module")
def references():
    """The unchecked tape's derivatives of each loop (see ``_models.Derivatives``)."""
    return {
        "adjfloat": derivatives(adjfloat_loop, p1=0.9)[0],
        "vec": derivatives(vec_loop)[0],
        "vec4": derivatives(vec_loop, change_at=4)[0],
    }


@pytest.mark.parametrize("schedule", SCHEDS, ids=IDS)
def test_adjfloat_long_range(schedule, references):
    """Gradient at the taped control, again, at a new control, tlm and Hessian there, and the
    gradient once more: the unchecked tape's to 1e-12."""
    got, manager, _ = derivatives(adjfloat_loop, schedule, N, p1=0.9)
    np.testing.assert_allclose(got, references["adjfloat"], rtol=1e-12)
    assert manager.counts.reversed > 0


@pytest.mark.parametrize("change_at", [None, 4])
@pytest.mark.parametrize("schedule", SCHEDS, ids=IDS)
def test_firedrake_like_loop(schedule, change_at, references):
    got, manager, _ = derivatives(vec_loop, schedule, N, change_at=change_at)
    np.testing.assert_allclose(got, references["vec" if change_at is None else "vec4"], rtol=1e-12)
    assert manager.counts.reversed > 0


@pytest.mark.parametrize("schedule", SCHEDS, ids=IDS)
def test_no_read_of_live_objects(schedule, references):
    """Every live object on the tape poisoned with NaN after taping: nothing changes (the data
    kept while taping are the values read and made then, not the objects)."""
    got = poisoned_derivatives(schedule, n_steps=N)
    np.testing.assert_allclose(got, references["vec"][:6], rtol=1e-12)


def _evaluations_of_last(actions, n_steps) -> int:
    """How often ``actions`` evaluate step ``N - 1`` (advanced over, linearized, recorded)."""
    last = n_steps - 1
    count = 0
    for a in actions:
        kind = type(a)
        if kind is Advance and a.start <= last < a.stop:
            count += 1
        elif kind in (Linearize, Record) and a.step == last:
            count += 1
    return count


def _parts(schedule, n_steps):
    """The actions of the first sweep and of the reverse part."""
    actions = list(schedule.actions(n_steps))
    k = next(i for i, a in enumerate(actions) if type(a) in (Record, Reverse))
    return actions[:k], actions[k:]


@pytest.mark.parametrize("schedule", SCHEDS, ids=IDS)
def test_recomputations_equal_simulate(schedule):
    """Block recomputations counted in the blocks (two per step, and the functional's with step
    ``N - 1``) and the manager's counts equal the simulator's: a derivative runs the reverse
    part (its plain, linearized and recorded steps; the reversed ones recompute nothing), a
    re-evaluation the first sweep and the steps from its end to ``u_N``."""
    n = 12
    st = simulate(schedule, n)
    first, rest = sweep_counts(schedule, n)
    fwd_actions, rev_actions = _parts(schedule, n)
    rev_last = _evaluations_of_last(rev_actions, n)
    fwd_last = _evaluations_of_last(fwd_actions, n) + (first.hand < n)
    tape = pa.Tape()
    with pa.set_working_tape(tape):
        manager = rp.enable_checkpointing(schedule, n_steps=n)
        p = pa.AdjFloat(0.7)
        rf = pa.ReducedFunctional(uniform_loop(p, tape, n), pa.Control(p))
        c = manager.counts
        for _ in range(2):  # after taping, then after a re-evaluation
            RECOMPUTES.clear()
            before = (c.steps, c.linearized, c.recorded, c.rerun, c.reversed)
            rf.derivative()
            after = (c.steps, c.linearized, c.recorded, c.rerun, c.reversed)
            assert tuple(x - y for x, y in zip(after, before)) == (
                rest.plain,
                rest.linearized,
                rest.recorded,
                rest.recorded,
                rest.reversed,
            )
            assert (
                sum(RECOMPUTES.values())
                == 2 * (rest.plain + rest.linearized + rest.recorded) + rev_last
            )
            RECOMPUTES.clear()
            steps, linearized = c.steps, c.linearized
            rf(pa.AdjFloat(1.1))
            assert c.steps - steps == first.plain + n - first.hand
            assert c.linearized - linearized == first.linearized
            assert (
                sum(RECOMPUTES.values())
                == 2 * (first.plain + n - first.hand + first.linearized) + fwd_last
            )
        assert c.recorded + c.reversed == 2 * n
        assert c.data_reads == [2 * r for r in st.data_reads]


def test_only_the_values_read_are_kept():
    """After the first derivative, a step's data are its blocks' dependencies made on the tape
    and the outputs their adjoints read (the solve's, which linearises at its output), not the
    other outputs; a tangent sweep keeps every output, with its tangent."""
    schedule = dict(SCHEDULES)["Mixed20"]  # one leaf: steps 0 .. N - 2 reversed from data
    tape = pa.Tape()
    with pa.set_working_tape(tape):
        manager = rp.enable_checkpointing(schedule, n_steps=N)
        p = pa.AdjFloat(0.7)
        rf = pa.ReducedFunctional(vec_loop(p, tape), pa.Control(p))
        rf.derivative()
        read = {
            type(b).__name__ + ("*" if getattr(b, "uses_output", False) else ""): len(r)
            for b, r in manager.adjoint_reads.items()
        }
        assert read == {
            "AdjFloatExprBlock": 0,
            "InnerBlock": 0,
            "EvolveBlock": 0,
            "EvolveBlock*": 1,  # the solve
            "AssignBlock": 0,
            "MatVecBlock": 0,
        }
        g = manager.graph
        for tangent in (False, True):
            if tangent:
                rf.tlm(pa.AdjFloat(1.0))
            else:
                rf(pa.AdjFloat(1.3))
            data = [s for s in manager._persistent.values() if s.data]
            assert len(data) == N - 1
            for snap in data:
                blocks = g.steps[snap.step]
                deps = {bv for b in blocks for bv in b.get_dependencies() if bv in g.created}
                outs = set(g.outs[snap.step])
                if tangent:
                    want = deps | outs
                else:
                    # (a block whose adjoint never ran, with no adjoint input or no dependency
                    # the control affects, keeps all its outputs)
                    reads = manager.adjoint_reads
                    want = deps | {bv for b in blocks for bv in reads.get(b, b.get_outputs())}
                assert set(snap.entries) == want
                if not tangent:  # no tangents kept in a first-order sweep
                    assert all(t is None for _, t in snap.entries.values())


def test_missing_data_is_an_error_naming_step_and_variable():
    """A step's data that lacks a value its adjoint reads: MissingValueError, never a live read."""
    schedule = dict(SCHEDULES)["Mixed20"]
    tape = pa.Tape()
    with pa.set_working_tape(tape):
        manager = rp.enable_checkpointing(schedule, n_steps=N)
        p = pa.AdjFloat(0.7)
        rf = pa.ReducedFunctional(vec_loop(p, tape), pa.Control(p))
        rf.derivative()
        rf(pa.AdjFloat(0.9))
        for snap in manager._persistent.values():
            if snap.data:
                snap.entries.clear()
        with pytest.raises(rp.MissingValueError, match=r"step 7 needs the value of a \w+ made by"):
            rf.derivative()


def test_data_on_disk(tmp_path):
    """A data level on disk: retrograde's checksummed files, removed with the manager."""
    schedule = mixed_schedules(str(tmp_path))[-1][1]
    ref = derivatives(vec_loop)[0]
    got, manager, tape = derivatives(vec_loop, schedule, N)
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    assert manager.counts.data_writes[1] > 0 and manager.counts.data_reads[1] > 0
    assert manager.counts.data_writes[0] == manager.counts.data_reads[0] == 0
    assert any(tmp_path.iterdir())
    del manager, tape
    gc.collect()
    assert not any(p.is_dir() and any(p.iterdir()) for p in tmp_path.iterdir())


def test_data_larger_than_the_budget_is_revolve(references):
    """``Mixed(2, data_size=3)``: no data slot fits; it runs as ``Revolve(2)`` (the same block
    recomputations, nothing linearized) and its derivatives are the unchecked tape's."""
    got, manager, _ = derivatives(vec_loop, Mixed(2, 3), N)
    np.testing.assert_allclose(got, references["vec"], rtol=1e-12)
    _, revolve, _ = derivatives(vec_loop, Revolve(2), N)
    assert manager.counts.linearized == manager.counts.reversed == 0
    assert (manager.counts.steps, manager.counts.recorded) == (
        revolve.counts.steps,
        revolve.counts.recorded,
    )


def test_over_the_memory_budget():
    """A schedule whose weighted memory exceeds its ``memory_budget`` stops while taping, at the
    action that would exceed it (the manager's simulator is the schedule's)."""
    tape = pa.Tape()
    with pa.set_working_tape(tape):
        rp.enable_checkpointing(OverBudget(), n_steps=N)
        p = pa.AdjFloat(0.7)
        with pytest.raises(ScheduleError, match=r"over the memory budget of 3"):
            vec_loop(p, tape)


def test_needs_n_steps():
    tape = pa.Tape()
    with pa.set_working_tape(tape), pytest.raises(ValueError, match="needs n_steps"):
        rp.enable_checkpointing(SCHEDS[0])


def test_data_on_package_disk(tmp_path):
    """With package data on the tape (Firedrake's disk checkpointing), the data of a disk level
    are the package's own checkpoints."""
    ref = derivatives(vec_loop)[0]
    package = DiskPackage(str(tmp_path))
    tape = pa.Tape(package_data={"vec": package})
    with pa.set_working_tape(tape):
        rp.enable_checkpointing(mixed_schedules(str(tmp_path))[-1][1], n_steps=N)
        p = pa.AdjFloat(0.7)
        rf = pa.ReducedFunctional(vec_loop(p, tape), pa.Control(p))
        got = [
            float(rf.derivative()),
            float(rf(pa.AdjFloat(1.3))),
            float(rf.derivative()),
            float(rf.tlm(pa.AdjFloat(1.0))),
            float(rf.hessian(pa.AdjFloat(1.0))),
        ]
    np.testing.assert_allclose(got, ref[[0, 2, 3, 4, 5]], rtol=1e-12)
    assert package.files > 0
