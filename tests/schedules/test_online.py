"""Online(snapshots): validity, slot bound, cost against the offline optimum, protocol errors;
Online(snapshots, data_size=d): each segment reversed by mixed checkpointing."""

from __future__ import annotations

from math import comb

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrograde.schedules import (
    End,
    Free,
    Level,
    Mixed,
    Online,
    OnlineSchedule,
    Record,
    Restore,
    Store,
    beta,
    online_decisions,
    online_store_slot,
    online_targets,
    online_totals,
    repetition_number,
    reverse_held_mixed,
    revolve_optimum,
    schedule_stream,
    segment_cost,
    simulate,
)
from retrograde.schedules._optimum import optimum

TARGET_S = (4, 8, 16, 44)


def _optimum_total(n: int, s: int) -> int:
    return revolve_optimum(n, s) + n


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 500), s=st.integers(1, 12))
def test_valid_and_within_slots(n, s):
    stats = simulate(Online(s), n)  # raises ScheduleError if invalid
    assert stats.recorded == n
    assert stats.peak_slots[0] <= s
    assert stats.peak_slots[0] == min(s, n)


@pytest.mark.parametrize(
    "n, s",
    [
        (0, 1),
        (0, 3),
        (1, 1),
        (1, 5),
        (2, 1),
        (2, 2),
        (3, 1),
        (7, 7),
        (7, 8),
        (7, 50),
        (50, 1),
        (50, 2),
        (200, 3),
        (1000, 16),
    ],
)
def test_edge_cases(n, s):
    stats = simulate(Online(s), n)
    assert stats.recorded == n
    assert stats.peak_slots[0] == min(s, n)
    assert stats.evaluations == online_totals(s, n)[n]
    if s >= n:  # every state is kept: only the forward sweep is plain
        assert stats.plain == n
    if s == 1:  # only u_0: recompute everything
        assert stats.plain == n + n * (n - 1) // 2


def test_fast_totals_match_simulation():
    for s in (1, 2, 3, 5, 8, 16, 44):
        totals = online_totals(s, 700)
        for n in list(range(0, 100)) + list(range(100, 701, 61)):
            assert simulate(Online(s), n).evaluations == totals[n], (n, s)


def test_never_better_than_offline():
    for s in (2, 4, 8):
        totals = online_totals(s, 400)
        for n in range(1, 401):
            assert totals[n] >= _optimum_total(n, s) + 1, (n, s)


@pytest.mark.parametrize("s", TARGET_S)
def test_within_five_percent_of_offline(s):
    # For tiny N no online schedule can be within 5% (N = 1 costs 2 against 1); from N = 40 on,
    # Online must be.
    n_max = 4000
    totals = online_totals(s, n_max)
    worst = max(totals[n] / _optimum_total(n, s) for n in range(40, n_max + 1))
    assert worst <= 1.05, worst
    for n in range(1, 40):
        assert totals[n] <= 1.05 * _optimum_total(n, s) + 6, (n, s)


@pytest.mark.slow
@pytest.mark.parametrize("s", TARGET_S)
def test_within_five_percent_of_offline_up_to_1e5(s):
    totals = online_totals(s, 100_000)
    worst = max(totals[n] / _optimum_total(n, s) for n in range(40, 100_001))
    assert worst <= 1.05, worst


@pytest.mark.parametrize("s", [2, 3, 4, 5, 8])
def test_optimal_held_set_at_epoch_ends(s):
    # At N = beta(s, r) the held set is the unique optimal offline snapshot set.
    held = [-1] * s
    ends = {beta(s, r) for r in range(1, 40) if beta(s, r) <= 3000}
    for n in range(max(ends)):
        k = online_store_slot(n, held, s)
        if k >= 0:
            held[k] = n
        if n + 1 in ends:
            assert tuple(sorted(held)) == online_targets(n, s)
            assert segment_cost(held, n + 1, s) + max(held) == revolve_optimum(n + 1, s)


@pytest.mark.parametrize("s", [1, 2, 3, 4, 7, 16, 44])
def test_incremental_placement_matches_pure_rule(s):
    # on_step and the fast totals use an incremental engine; it must decide exactly as the
    # documented pure rule, and cost what the pure cost says.
    run, held, totals = Online(s).start(), [-1] * s, online_totals(s, 1500)
    for n in range(1500):
        k = online_store_slot(n, held, s)
        want = (
            ()
            if k < 0
            else (Store(n, k, 0),)
            if held[k] < 0
            else (Free(held[k], k, 0), Store(n, k, 0))
        )
        assert tuple(run.on_step(n)) == want, (n, s)
        if k >= 0:
            held[k] = n
        assert totals[n + 1] == 2 * (n + 1) + segment_cost(held, n + 1, s)


@pytest.mark.parametrize("s", [1, 2, 3, 7])
def test_fast_optimum_closed_form(s):
    # The hot path of the placement rule (O(1) for two slots) against t(N, s) = r N - C(s+r, s+1).
    for n in range(1, 3000):
        r = repetition_number(n, s)
        assert optimum(n, s) == r * n - comb(s + r, s + 1), (n, s)


def test_store_slot_is_pure():
    held = [0, 35, 55, 65]
    before = list(held)
    first = online_store_slot(80, held, 4)
    assert held == before
    assert online_store_slot(80, tuple(held), 4) == first
    assert first in (-1, 1, 2, 3)  # slot 0 (u_0) is never overwritten


def test_protocol_actions():
    run = Online(3).start()
    assert list(run.on_step(0)) == [Store(0, 0, 0)]
    assert list(run.on_step(1)) == [Store(1, 1, 0)]
    assert list(run.on_step(2)) == [Store(2, 2, 0)]
    actions = list(run.reverse(3))
    assert actions[-1] == End()
    assert [a for a in actions if type(a) is Record] == [Record(2), Record(1), Record(0)]
    assert sum(type(a) is Free for a in actions) == 3


def test_actions_raises():
    assert isinstance(Online(4), OnlineSchedule) and Online(4).online
    with pytest.raises(ValueError, match="online schedule"):
        Online(4).actions(10)


@pytest.mark.parametrize(
    "bad, exc",
    [(0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError), ("4", TypeError)],
)
def test_bad_snapshots(bad, exc):
    with pytest.raises(exc, match="snapshots"):
        Online(bad)


def test_protocol_misuse():
    run = Online(4).start()
    run.on_step(0)
    with pytest.raises(ValueError, match="expected n=1"):
        run.on_step(2)
    run.on_step(1)
    with pytest.raises(ValueError, match="n_steps must be 2"):
        run.reverse(5)
    list(run.reverse(2))
    with pytest.raises(ValueError, match="already"):
        run.reverse(2)
    with pytest.raises(ValueError, match="start"):
        run.on_step(2)


def test_memory_independent_of_n():
    import tracemalloc

    def peak(n):
        tracemalloc.start()
        run = Online(8).start()
        for k in range(n):
            run.on_step(k)
        for _ in run.reverse(n):
            pass
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    small, big = peak(300), peak(3_000)
    assert big < small + 4096, (small, big)


def test_run_can_be_copied_before_reverse():
    # retrograde.host deep-copies a run after the forward sweep to reverse it more than once.
    import copy

    run = Online(5).start()
    for n in range(300):
        run.on_step(n)
    first = list(copy.deepcopy(run).reverse(300))
    second = list(copy.deepcopy(run).reverse(300))
    assert first == second == list(run.reverse(300))


def test_default_for_an_unknown_step_count():
    """``retrograde.while_loop``'s default schedule is decided in ``schedules._default`` only."""
    from retrograde.schedules import default_schedule

    assert default_schedule(None, online=True) == Online(16)
    with pytest.raises(ValueError, match="online=True"):
        default_schedule(None)


# ----------------------------------------------------------------------------- mixed reversal

MIXED_CASES = [(1, 1), (2, 1), (4, 1), (6, 2), (5, 0.5), (4, 1.5), (3, 4), (7, 3)]


def _held_after(s: int, n: int) -> list[int]:
    held = [-1] * s
    for step, k in enumerate(online_decisions(s, n) if n else ()):
        if k >= 0:
            held[k] = step
    return held


@pytest.mark.parametrize("s, d", MIXED_CASES)
def test_mixed_reversal_is_valid_and_never_worse(s, d):
    """``Online(s, data_size=d)``: valid for every ``N <= 120`` (the simulator checks the
    weighted budget ``states + d * data <= s``), every step recorded or reversed once, its
    evaluations ``N`` plus each segment's ``Mixed(s - i, d)`` optimum (the docstring's formula),
    at most ``Online(s)``'s, and equal when no step's data fits (``d > s``)."""
    schedule = Online(s, data_size=d)
    for n in range(121):
        stats = simulate(schedule, n)
        plain = simulate(Online(s), n)
        assert stats.recorded + stats.reversed == n
        assert stats.peak_memory[0] <= s
        held = sorted(p for p in _held_after(s, n) if p >= 0) + [n]
        formula = n + sum(
            Mixed(s - i, d).evaluations(held[i + 1] - held[i]) for i in range(len(held) - 1)
        )
        assert stats.evaluations == formula, n
        assert stats.evaluations <= plain.evaluations, n
        if d > s:
            assert stats.evaluations == plain.evaluations
            assert stats.linearized == 0


def test_mixed_reversal_saves_and_default_is_online():
    """At ``N = 1000``, ``s = 16``, data of one state: 3035 evaluations against ``Online``'s 3866
    (``Mixed(16)`` offline: 3015). ``data_size=None`` streams exactly ``Online(s)``'s actions."""
    assert simulate(Online(16, data_size=1), 1000).evaluations == 3035
    assert simulate(Online(16), 1000).evaluations == 3866
    for n in (0, 1, 5, 77):
        assert list(schedule_stream(Online(5, data_size=None), n)) == list(
            schedule_stream(Online(5), n)
        )
    assert Online(5, data_size=None) == Online(5)


def test_mixed_reversal_matches_reverse_held_mixed():
    """The run's reversal is :func:`reverse_held_mixed` of the held set; each segment's actions
    restore its start from the slot ``Online`` placed it in."""
    s, n = 4, 40
    run = Online(s, data_size=1).start()
    for step in range(n):
        run.on_step(step)
    held = _held_after(s, n)
    assert list(run.reverse(n)) == list(reverse_held_mixed(held, n, Mixed(s, 1)))
    first = next(iter(reverse_held_mixed(held, n, Mixed(s, 1))))
    assert first == Restore(max(held), held.index(max(held)), 0)


def test_mixed_reversal_arguments():
    assert repr(Online(4, data_size=2)) == "Online(snapshots=4, data_size=2)"
    assert Online(4, data_size=2).levels[0].slots == 4 + 2
    assert Online(4, data_size=2).memory_budget == 4
    with pytest.raises(ValueError, match="one level; drop slow="):
        Online(4, slow=Level(8, storage="host"), data_size=1)
    with pytest.raises(ValueError, match="data_size"):
        Online(4, data_size=0)
    with pytest.raises(ValueError, match="state slots"):
        list(reverse_held_mixed([0, 3], 5, Mixed(3)))
