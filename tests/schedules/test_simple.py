"""StoreAll, RecomputeAll and Periodic: exact counts and slot use."""

from __future__ import annotations

import pytest

from retrograde.schedules import (
    End,
    Periodic,
    RecomputeAll,
    Revolve,
    StoreAll,
    revolve_optimum,
    simulate,
)

STEPS = [0, 1, 2, 3, 7, 10, 11, 64, 100]


@pytest.mark.parametrize("n", STEPS)
def test_store_all(n):
    stats = simulate(StoreAll(), n)
    assert stats.plain == max(n - 1, 0)
    assert stats.recorded == n
    assert stats.peak_slots == (max(n - 1, 0),)
    assert stats.reads == (max(n - 1, 0),)
    assert stats.evaluations == max(2 * n - 1, 0)


@pytest.mark.parametrize("n", STEPS)
def test_recompute_all(n):
    stats = simulate(RecomputeAll(), n)
    assert stats.plain == n * (n - 1) // 2 == revolve_optimum(n, 1)
    assert stats.recorded == n
    assert stats.peak_slots == (min(n, 1),)
    assert RecomputeAll().levels[0].slots == 1
    assert list(RecomputeAll().actions(n)) == list(Revolve(1).actions(n))


@pytest.mark.parametrize("n", STEPS)
@pytest.mark.parametrize("every", [1, 2, 3, 4, 10, 200])
def test_periodic(n, every):
    stats = simulate(Periodic(every), n)
    starts = list(range(0, n, every))
    # Forward sweep to the last segment start, then each segment recomputed once.
    expected_plain = starts[-1] + n - len(starts) if n else 0
    assert stats.plain == expected_plain
    assert stats.recorded == n
    assert stats.peak_slots[0] <= Periodic(every).max_slots(n)[0]
    assert stats.plain >= revolve_optimum(n, max(1, stats.peak_slots[0]))


def test_periodic_sqrt_scheme():
    n, k = 10_000, 100
    stats = simulate(Periodic(k), n)
    assert stats.plain == 9900 + 10_000 - 100
    assert stats.peak_slots == (100 + 98,)


def test_zero_steps_is_just_end():
    for schedule in (StoreAll(), RecomputeAll(), Periodic(3)):
        assert list(schedule.actions(0)) == [End()]


@pytest.mark.parametrize("bad", [0, -1])
def test_periodic_rejects_bad_every(bad):
    with pytest.raises(ValueError, match="every"):
        Periodic(bad)


@pytest.mark.parametrize("bad", [2.0, "3", True, None])
def test_periodic_rejects_non_int(bad):
    with pytest.raises(TypeError, match="every"):
        Periodic(bad)


def test_schedules_are_immutable_and_hashable():
    import dataclasses

    for schedule in (StoreAll(), RecomputeAll(), Periodic(4), Revolve(3)):
        hash(schedule)
        assert schedule == type(schedule)(*dataclasses.astuple(schedule))
    with pytest.raises(dataclasses.FrozenInstanceError):
        Revolve(3).snapshots = 4  # type: ignore[misc]
