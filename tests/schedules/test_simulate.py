"""The simulator: it accepts every valid schedule and rejects every invalid stream."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrograde.schedules import (
    Advance,
    End,
    Executor,
    Free,
    Level,
    MultiLevel,
    Online,
    OnlineRun,
    OnlineSchedule,
    Periodic,
    RecomputeAll,
    Record,
    Restore,
    Revolve,
    ScheduleError,
    Simulator,
    Store,
    StoreAll,
    execute,
    revolve_optimum,
    schedule_stream,
    simulate,
)

ONE = (Level(2),)
UNLIMITED = (Level(None),)


# --------------------------------------------------------------------------------------------
# Valid streams
# --------------------------------------------------------------------------------------------


def test_hand_written_valid_stream():
    actions = [
        Store(0, 0),
        Advance(0, 2),
        Record(2),
        Restore(0, 0),
        Advance(0, 1),
        Record(1),
        Restore(0, 0),
        Record(0),
        Free(0, 0),
        End(),
    ]
    stats = execute(actions, 3, ONE)
    assert (stats.plain, stats.recorded, stats.writes, stats.reads, stats.peak_slots) == (
        3,
        3,
        (1,),
        (2,),
        (1,),
    )
    assert stats.evaluations == 6
    assert stats.cost == 6


def test_cost_model_uses_level_costs():
    levels = (Level(1, name="memory"), Level(None, write_cost=0.5, read_cost=2.0, name="disk"))
    actions = [Store(0, 0, 1), Advance(0, 1), Record(1), Restore(0, 0, 1), Record(0), End()]
    stats = execute(actions, 2, levels)
    assert stats.writes == (0, 1) and stats.reads == (0, 1)
    assert stats.cost == 1 + 2 + 0.5 + 2.0
    assert stats.total_cost(forward_cost=2.0, adjoint_cost=3.0) == 2 + 6 + 0.5 + 2.0


def test_end_releases_held_slots():
    # End() after everything was recorded is fine even if slots are still held.
    stats = execute([Store(0, 0), Record(0), End()], 1, ONE)
    assert stats.peak_slots == (1,)


def test_zero_steps():
    assert execute([End()], 0, ONE).plain == 0


# --------------------------------------------------------------------------------------------
# Invalid streams
# --------------------------------------------------------------------------------------------

INVALID = {
    "record without state at hand": [Record(1), End()],
    "record again without restore": [Advance(0, 1), Record(1), Record(0), End()],
    "record out of order": [Record(0), End()],
    "record skips a step": [Advance(0, 1), Store(1, 0), Advance(1, 2), Record(1), End()],
    "restore of an unwritten slot": [Advance(0, 2), Record(2), Restore(0, 0), End()],
    "restore of a freed slot": [
        Store(0, 0),
        Advance(0, 2),
        Record(2),
        Free(0, 0),
        Restore(0, 0),
        End(),
    ],
    "restore of the wrong step": [Store(0, 0), Advance(0, 2), Record(2), Restore(1, 0), End()],
    "free of an empty slot": [Free(0, 1), End()],
    "store into an occupied slot": [Store(0, 0), Advance(0, 1), Store(1, 0), End()],
    "store of a state not at hand": [Store(1, 0), End()],
    "store beyond the level's slots": [Store(0, 0), Advance(0, 1), Store(1, 2), End()],
    "store into a negative slot": [Store(0, -1), End()],
    "store on a missing level": [Store(0, 0, 1), End()],
    "advance from the wrong state": [Advance(1, 2), End()],
    "advance past N": [Advance(0, 4), End()],
    "empty advance": [Advance(0, 0), End()],
    "advance without state at hand": [Advance(0, 2), Record(2), Advance(2, 3), End()],
    "end before all records": [Advance(0, 2), Record(2), End()],
    "missing End": [
        Store(0, 0),
        Advance(0, 2),
        Record(2),
        Restore(0, 0),
        Advance(0, 1),
        Record(1),
        Restore(0, 0),
        Record(0),
    ],
    "action after End": [Advance(0, 2), Record(2), Store(0, 0), End(), Store(0, 1)],
    "unknown action": [object(), End()],
}


@pytest.mark.parametrize("name", list(INVALID))
def test_invalid_streams_are_rejected(name):
    with pytest.raises(ScheduleError):
        execute(INVALID[name], 3, ONE)


def test_action_after_end():
    actions = [
        Store(0, 0),
        Advance(0, 2),
        Record(2),
        Restore(0, 0),
        Advance(0, 1),
        Record(1),
        Restore(0, 0),
        Record(0),
        End(),
        Record(0),
    ]
    with pytest.raises(ScheduleError, match="after End"):
        execute(actions, 3, ONE)


def test_exceeding_a_levels_slots_with_a_real_schedule():
    # Revolve(3) declares three slots; run its stream on a simulator with two.
    with pytest.raises(ScheduleError, match="slots"):
        execute(Revolve(3).actions(20), 20, (Level(2),))


def test_messages_are_specific():
    with pytest.raises(ScheduleError, match="state at hand is None"):
        execute([Advance(0, 1), Record(1), Record(0), End()], 2, ONE)
    with pytest.raises(ScheduleError, match="next step to record is 1"):
        execute([Record(0), End()], 2, ONE)
    with pytest.raises(ScheduleError, match="without End"):
        execute([Record(0)], 1, ONE)


class _BadOnline(OnlineSchedule):
    """An online schedule whose on_step returns a forbidden action."""

    class _Run(OnlineRun):
        def on_step(self, n):
            return [Advance(n, n + 1)]

        def reverse(self, n_steps):
            yield End()

    def start(self):
        return self._Run()


def test_online_on_step_may_only_store_or_free():
    with pytest.raises(ScheduleError, match="only Store/Free"):
        simulate(_BadOnline(), 3)


# --------------------------------------------------------------------------------------------
# A tiny online schedule: the protocol works through simulate, and asking it for a fixed N fails
# --------------------------------------------------------------------------------------------


class _StoreEveryOnline(OnlineSchedule):
    """Online store-everything: stores each state on the way, reverses from the stored states."""

    class _Run(OnlineRun):
        def on_step(self, n):
            return [Store(n, n, 0)]

        def reverse(self, n_steps) -> Iterator:
            for n in range(n_steps - 1, -1, -1):
                yield Restore(n, n, 0)
                yield Record(n)
                yield Free(n, n, 0)
            yield End()

    def start(self):
        return self._Run()


def test_online_protocol_through_simulate():
    stats = simulate(_StoreEveryOnline(), 10)
    assert (stats.plain, stats.recorded, stats.peak_slots) == (10, 10, (10,))


def test_online_schedule_refuses_fixed_n():
    with pytest.raises(ValueError, match="online schedule"):
        _StoreEveryOnline().actions(10)


# --------------------------------------------------------------------------------------------
# Property tests: every schedule is valid for every N and slot count
# --------------------------------------------------------------------------------------------


def _schedules(slots: int) -> list:
    """Every schedule of ``retrograde.schedules``, configured with ``slots``."""
    out = [Revolve(slots), StoreAll(), RecomputeAll(), Periodic(slots), Online(slots)]
    for disk in (None, max(1, slots // 2)):
        out.append(MultiLevel([Level(slots), Level(disk, write_cost=2.0, read_cost=2.0)]))
    return out


def _check_valid(schedule, n: int) -> None:
    stats = simulate(schedule, n)  # raises ScheduleError if the stream is invalid
    assert stats.n_steps == n
    assert stats.recorded == n
    for peak, level, bound in zip(stats.peak_slots, schedule.levels, schedule.max_slots(n)):
        if level.slots is not None:
            assert peak <= level.slots
        assert peak <= bound
    # No schedule beats the proven optimum for the slots it actually used.
    assert stats.plain >= revolve_optimum(n, max(1, sum(stats.peak_slots)))
    if isinstance(schedule, Revolve):
        assert stats.plain == revolve_optimum(n, schedule.snapshots)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), slots=st.integers(1, 40))
def test_every_schedule_is_valid(n, slots):
    for schedule in _schedules(slots):
        _check_valid(schedule, n)


@pytest.mark.parametrize("n", [0, 1, 2, 3])
@pytest.mark.parametrize("slots", [1, 2, 3, 5])
def test_every_schedule_edge_cases(n, slots):
    for schedule in _schedules(slots):
        _check_valid(schedule, n)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 60), extra=st.integers(0, 20))
def test_enough_slots(n, extra):
    # s >= N: Revolve needs no recomputation at all.
    stats = simulate(Revolve(n + extra), n)
    assert stats.plain == n - 1


# --------------------------------------------------------------------------------------------
# Bad arguments
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -3])
def test_revolve_needs_a_slot(bad):
    with pytest.raises(ValueError, match="snapshots"):
        Revolve(bad)


@pytest.mark.parametrize("bad", [2.5, "10", None, True])
def test_revolve_snapshots_must_be_int(bad):
    with pytest.raises(TypeError, match="snapshots"):
        Revolve(bad)


@pytest.mark.parametrize("schedule", [Revolve(3), StoreAll(), RecomputeAll(), Periodic(2)])
def test_negative_steps(schedule):
    with pytest.raises(ValueError, match="n_steps"):
        simulate(schedule, -1)
    with pytest.raises(ValueError, match="n_steps"):
        list(schedule.actions(-1))


@pytest.mark.parametrize("bad", [2.0, "5", None])
def test_non_int_steps(bad):
    with pytest.raises(TypeError, match="n_steps"):
        simulate(Revolve(3), bad)
    with pytest.raises(TypeError, match="n_steps"):
        list(Revolve(3).actions(bad))


def test_numpy_int_steps_are_accepted():
    np = pytest.importorskip("numpy")
    assert simulate(Revolve(3), np.int64(10)).recorded == 10


def test_optimum_arguments():
    with pytest.raises(ValueError, match="snapshots"):
        revolve_optimum(10, 0)
    with pytest.raises(ValueError, match="n_steps"):
        revolve_optimum(-1, 3)


def test_level_arguments():
    with pytest.raises(ValueError, match="slots"):
        Level(0)
    with pytest.raises(TypeError, match="slots"):
        Level(2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="write_cost"):
        Level(3, write_cost=-1.0)
    with pytest.raises(ValueError, match="read_cost"):
        Level(3, read_cost=float("nan"))
    assert Level(None).slots is None


def test_simulate_rejects_non_schedules():
    with pytest.raises(TypeError, match="Schedule"):
        simulate(object(), 3)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# The simulator as an Executor: copies, online step counts, one dispatch
# --------------------------------------------------------------------------------------------


def test_copies_of_a_simulator_continue_independently():
    # What the host driver does: one first sweep, then each reverse sweep from a copy.
    actions = list(Revolve(3).actions(20))
    first = next(i for i, a in enumerate(actions) if type(a) is Record)
    sim = Simulator(Revolve(3).levels, 20).run(actions[:first])
    one, two = sim.copy().run(actions[first:]), sim.copy().run(actions[first:])
    assert one.stats() == two.stats() == simulate(Revolve(3), 20)
    assert not sim.ended and sim.recorded == 0 and sim.current == 19 and sim.held != one.held


def test_online_step_count_is_given_when_the_loop_stops():
    run = Online(3).start()
    sim = Simulator(Online(3).levels, None).run(run.forward(lambda n: n < 7))
    with pytest.raises(ScheduleError, match="cannot stop after 5 steps"):
        sim.copy().stopped(5)
    sim.stopped(7)
    with pytest.raises(ScheduleError, match="N is 7 already"):
        sim.copy().stopped(7)
    assert sim.run(run.reverse(7)).stats() == simulate(Online(3), 7)
    with pytest.raises(ScheduleError, match="step count is unknown"):
        Simulator(ONE, None).run([Advance(0, 1), Record(0)])


def test_schedule_stream_plays_the_online_protocol():
    stream = list(schedule_stream(Online(4), 30))
    assert execute(stream, 30, Online(4).levels) == simulate(Online(4), 30)
    assert sum(type(a) is Advance and a.stop - a.start == 1 for a in stream[:60]) >= 30
    assert list(schedule_stream(Revolve(4), 30)) == list(Revolve(4).actions(30))
    with pytest.raises(TypeError, match="Schedule"):
        schedule_stream(object(), 3)


def test_executor_dispatches_every_kind_once():
    seen = []

    class Log(Executor):
        def log(self, a):
            seen.append(a)

        advance = store = restore = free = record = end = log

    actions = list(Periodic(3).actions(10))
    assert Log().run(actions).ended and seen == actions
    with pytest.raises(ScheduleError, match="after End"):
        Log().run([End(), Record(0)])
    with pytest.raises(ScheduleError, match="Unknown action"):
        Executor().execute((0, 1))
