"""Online(snapshots): validity, slot bound, cost against the offline optimum, protocol errors."""

from __future__ import annotations

from math import comb

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrograde.schedules import (
    End,
    Free,
    Online,
    OnlineSchedule,
    Record,
    Store,
    beta,
    online_store_slot,
    online_targets,
    online_totals,
    repetition_number,
    revolve_optimum,
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
