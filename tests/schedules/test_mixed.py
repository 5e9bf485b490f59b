"""Mixed checkpointing: counts against an independent dynamic program of the recurrence, the
closed forms, the simulator's weighted memory, and the schedule's structure."""

from __future__ import annotations

import functools
from fractions import Fraction
from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrograde.schedules import (
    Advance,
    End,
    Free,
    Level,
    Linearize,
    Mixed,
    Record,
    Restore,
    Reverse,
    ScheduleError,
    Simulator,
    Store,
    _mixed,
    execute,
    mixed_optimum,
    mixed_split,
    revolve_optimum,
    simulate,
)
from retrograde.schedules._mixed import TABLE_LIMIT, band_rule_applies

N_MAX, S_MAX = 300, 12
DATA_SIZES = (0.5, 1.0, 1.5, 2.0, 4.0)


@functools.cache
def reference(data_size: float) -> np.ndarray:
    """The recurrence of issue 35, written out on its own: ``M[n, b]`` reverses ``n`` steps with
    ``u_0`` at hand and ``b`` half-states of memory free. Either linearize step 0 into a data
    slot (``2 * data_size`` halves) and go on, or store ``u_0`` (2 halves), advance ``i`` steps,
    reverse the rest with the slot taken, restore ``u_0``, free it and reverse the first ``i``.
    Nothing here comes from the schedule's code."""
    data, state, budget = round(2 * data_size), 2, 2 * S_MAX
    big = 10**12
    m = np.full((N_MAX + 1, budget + 1), big, dtype=np.int64)
    m[1, :] = 1
    for n in range(2, N_MAX + 1):
        i = np.arange(1, n)
        for b in range(budget + 1):
            best = 1 + m[n - 1, b - data] if b >= data else big
            if b >= state:
                best = min(best, int((i + m[i, b] + m[n - i, b - state]).min()))
            m[n, b] = best
    return m


def test_reference_agrees_with_the_issue():
    m = reference(1.0)
    for s in range(1, S_MAX + 1):
        for n in range(1, N_MAX + 1):
            if n <= s + 1:
                assert m[n, 2 * s] == n
            if s == 1 and n >= 2:
                assert m[n, 2] == n * (n + 1) // 2 - 1


@pytest.mark.parametrize("data_size", DATA_SIZES)
def test_evaluations_equal_the_recurrence(data_size):
    m = reference(data_size)
    for s in range(1, S_MAX + 1):
        schedule = Mixed(s, data_size)
        got = [schedule.evaluations(n) for n in range(1, N_MAX + 1)]
        assert got == m[1:, 2 * s].tolist(), (s, data_size)


SAMPLE = sorted({*range(1, 41), *range(41, N_MAX + 1, 23), N_MAX})


@pytest.mark.parametrize("data_size", DATA_SIZES)
def test_simulated_streams_are_valid_optimal_and_within_budget(data_size):
    m = reference(data_size)
    for s in range(1, S_MAX + 1, 2):
        schedule = Mixed(s, data_size)
        for n in SAMPLE:
            stats = simulate(schedule, n)  # validates every action and the weighted memory
            assert stats.evaluations == m[n, 2 * s] == schedule.evaluations(n)
            assert stats.recorded + stats.reversed == n
            assert stats.peak_memory[0] <= s
            assert stats.peak_slots[0] <= schedule.state_slots + schedule.data_slots


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 250),
    st.integers(1, 30),
    st.fractions(Fraction(1, 4), Fraction(6), max_denominator=8),
    st.fractions(0, Fraction(7, 8), max_denominator=8),
)
def test_any_budget_and_data_size(n, whole, data_size, part):
    """Budgets that are not whole states and data sizes below and above one state."""
    schedule = Mixed(whole + part, data_size)
    stats = simulate(schedule, n)
    assert stats.evaluations == schedule.evaluations(n)
    assert stats.evaluations <= revolve_optimum(n, whole) + n
    assert stats.peak_memory[0] <= float(whole + part)


def test_issue_values():
    assert simulate(Mixed(10), 1000).evaluations == 3921
    assert simulate(Mixed(40), 1000).evaluations == 2142
    assert simulate(Mixed(10), 10_000).evaluations == 60960
    assert (simulate(Mixed(20), 1000).evaluations, revolve_optimum(1000, 20) + 1000) == (
        2823,
        3747,
    )


@pytest.mark.parametrize("data_size", DATA_SIZES)
def test_never_worse_than_revolve(data_size):
    for s in range(1, S_MAX + 1):
        schedule = Mixed(s, data_size)
        for n in range(1, N_MAX + 1, 7):
            assert schedule.evaluations(n) <= revolve_optimum(n, s) + n


def test_equal_to_revolve_when_no_data_fits():
    for s in range(1, S_MAX + 1):
        schedule = Mixed(s, s + 0.5)
        assert schedule.data_slots == 0
        for n in range(1, 120):
            stats = simulate(schedule, n)
            assert stats.evaluations == revolve_optimum(n, s) + n
            assert stats.linearized == stats.reversed == 0


def test_band_end_closed_form():
    for s in range(1, 41):
        for k in range(1, 12):
            n = comb(s + k, s)
            if n > 10**7:
                break
            expected = (k + 1) * n - comb(s + k, s + 1) - comb(s + k - 1, s - 1)
            assert mixed_optimum(n, s) == expected == k * n - comb(s + k - 1, s + 1)


def test_split_is_optimal_for_mixed_and_revolve():
    """The closed-form split attains the recurrence, and Revolve's optimum too."""
    m = reference(1.0)
    for s in range(2, S_MAX + 1):
        for n in range(1, N_MAX + 1):
            j = mixed_split(n, s)
            if n <= s + 1:
                assert j == 0
                continue
            assert 1 < j < n
            assert j + m[j, 2 * s] + m[n - j, 2 * s - 2] == m[n, 2 * s]
            revolve = revolve_optimum(n, s)
            assert j + revolve_optimum(j, s) + revolve_optimum(n - j, s - 1) == revolve


def test_closed_form_for_large_n_matches_the_schedule():
    for n, s in [(10_000, 40), (5000, 3), (2**12, 7)]:
        assert simulate(Mixed(s), n).evaluations == mixed_optimum(n, s)


# ---------------------------------------------------------------------------------------------
# The band rule (docs/mixed.md, "General leaf sizes") against the tree's own dynamic program
# ---------------------------------------------------------------------------------------------


def tree_reference(leaves: tuple[int, ...], n_max: int) -> np.ndarray:
    """``A[k, n]``: the fewest extra advances of the tree, written out on its own: ``0`` for ``n
    <= c_k``, else ``min_j j + A[k, j] + A[k + 1, n - j]`` (level ``S``: no split)."""
    big = 10**12
    top = len(leaves) - 1
    a = np.full((top + 1, n_max + 1), big, dtype=np.int64)
    for k in range(top, -1, -1):
        a[k, : min(leaves[k], n_max) + 1] = 0
        if k == top:
            continue
        for n in range(leaves[k] + 1, n_max + 1):
            j = np.arange(1, n)
            a[k, n] = (j + a[k, j] + a[k + 1, n - j]).min()
    return a


GRID_DATA = [Fraction(1, 4), Fraction(1, 2), Fraction(2, 3), 1, Fraction(3, 2), 2, 3, 4, 7]
GRID_BUDGETS = [1, Fraction(3, 2), 2, Fraction(5, 2), 3, 4, Fraction(9, 2), 6, Fraction(17, 2)]


@pytest.mark.parametrize("data_size", GRID_DATA, ids=str)
def test_every_split_is_optimal_on_a_grid(data_size):
    """Every budget of the grid (fractional ones, and data larger than the budget), every
    level and every segment of up to 90 steps: the split attains the tree's optimum, and the
    evaluations are ``n + A[0, n]`` (band rule or dynamic program alike)."""
    n_max = 90
    for budget in GRID_BUDGETS:
        schedule = Mixed(budget, data_size)
        leaves = schedule._leaves
        a = tree_reference(leaves, n_max)
        for k in range(len(leaves) - 1):
            for n in range(leaves[k] + 1, n_max + 1):
                j = schedule.split(n, k)
                assert 1 <= j < n and j + a[k, j] + a[k + 1, n - j] == a[k, n], (budget, k, n)
        got = [schedule.evaluations(n) for n in range(1, n_max + 1)]
        assert got == [n + int(a[0, n]) for n in range(1, n_max + 1)], budget


def test_which_leaf_sizes_have_a_band_rule():
    for budget in GRID_BUDGETS:
        for data_size in (1, 2, 3, 4, 7, budget + 1):
            assert band_rule_applies(Mixed(budget, data_size)._leaves), (budget, data_size)
    assert not band_rule_applies(Mixed(12, 1.5)._leaves)  # runs of one and two levels
    assert not band_rule_applies(Mixed(3, 0.5)._leaves)  # drops of two steps


@pytest.mark.parametrize("data_size", [1, 2])
def test_long_schedules_build_no_table(monkeypatch, data_size):
    """``Mixed(40, d).actions(10_000)`` for a whole ``d``: the band rule alone (the timing is
    ``benchmarks/mixed_counts.py``'s)."""

    def no_table(leaves):
        raise AssertionError(f"a dynamic program was built for {leaves}")

    monkeypatch.setattr(_mixed, "_table", no_table)
    schedule = Mixed(40, data_size)
    stats = simulate(schedule, 10_000)
    assert stats.evaluations == schedule.evaluations(10_000)
    assert stats.recorded + stats.reversed == 10_000


# ---------------------------------------------------------------------------------------------
# The structure the compiled loops run
# ---------------------------------------------------------------------------------------------


def _tree(schedule: Mixed, start: int, n: int, level: int, out: list) -> None:
    """The leaves (start, steps, level) of the tree :meth:`Mixed.split` describes."""
    j = schedule.split(n, level)
    if j == 0:
        out.append((start, n, level))
        return
    _tree(schedule, start + j, n - j, level + 1, out)
    _tree(schedule, start, j, level, out)


@pytest.mark.parametrize("s, data_size, n", [(4, 1.0, 60), (6, 0.5, 90), (5, 2.0, 70)])
def test_actions_are_the_split_tree(s, data_size, n):
    schedule = Mixed(s, data_size)
    leaves: list = []
    _tree(schedule, 0, n, 0, leaves)
    acts = list(schedule.actions(n))
    stores = [a for a in acts if type(a) is Store]
    assert all(a.slot < schedule.state_slots for a in stores)
    records = [a.step for a in acts if type(a) is Record]
    assert records == [start + steps - 1 for start, steps, _ in leaves]
    for start, steps, level in leaves:
        assert steps <= schedule.leaf_size(level)
        data = [a for a in acts if type(a) is Linearize and start <= a.step < start + steps]
        assert [a.step for a in data] == list(range(start, start + steps - 1))
        assert all(a.slot >= schedule.state_slots for a in data)
    assert acts[-1] == End()


def test_small_stream():
    assert list(Mixed(2).actions(4)) == [
        Store(0, 0),
        Advance(0, 2),
        Linearize(2, 2),
        Record(3),
        Reverse(2, 2),
        Free(2, 2),
        Restore(0, 0),
        Free(0, 0),
        Linearize(0, 2),
        Record(1),
        Reverse(0, 2),
        Free(0, 2),
        End(),
    ]
    assert list(Mixed(3).actions(1)) == [Record(0), End()]
    assert list(Mixed(3).actions(0)) == [End()]


def test_leaf_sizes_and_slots():
    m = Mixed(10, 0.5)
    assert [m.leaf_size(k) for k in range(11)] == [21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1]
    assert (m.state_slots, m.data_slots, m.levels) == (10, 20, (Level(30, name="memory"),))
    m = Mixed(2.5, 0.5)
    assert [m.leaf_size(k) for k in range(3)] == [6, 4, 2]
    assert Mixed(3, 0.1).leaf_size(0) == 31  # 0.1 is a tenth exactly
    b = Mixed.from_bytes(10 * 2**20 + 5, 2**20, 3 * 2**19)
    assert b.memory_budget == Fraction(10 * 2**20 + 5, 2**20)
    assert b.data_size == Fraction(3, 2) and b.leaf_size(1) == 7


def test_arguments_are_checked():
    with pytest.raises(ValueError, match=r"Mixed\(snapshots=0.5\)"):
        Mixed(0.5)
    with pytest.raises(ValueError, match=r"Mixed\(data_size=...\)"):
        Mixed(4, 0)
    with pytest.raises(TypeError, match="data_size"):
        Mixed(4, "1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finite"):
        Mixed(4, float("inf"))
    with pytest.raises(ValueError, match="state_bytes"):
        Mixed.from_bytes(10, 20, 5)
    with pytest.raises(ValueError, match="data_bytes"):
        Mixed.from_bytes(10, 2, 0)
    with pytest.raises(ValueError, match="level"):
        Mixed(3).leaf_size(4)
    with pytest.raises(ValueError, match="level 3"):
        Mixed(3).split(2, 3)
    with pytest.raises(ValueError, match="snapshots"):
        mixed_optimum(10, 0)
    with pytest.raises(ValueError, match="TABLE_LIMIT"):
        Mixed(40, 1.5).evaluations(int((2 * TABLE_LIMIT / 40) ** 0.5) + 10)


# ---------------------------------------------------------------------------------------------
# The simulator and data slots
# ---------------------------------------------------------------------------------------------


def test_simulator_refuses_a_restart_from_data():
    acts = [Linearize(0, 0), Record(1), Restore(0, 0)]
    with pytest.raises(ScheduleError, match="cannot restart from a step's data"):
        execute(acts, 2, (Level(2),))


def test_simulator_weighs_data_and_checks_the_budget():
    acts = [Store(0, 0), Linearize(0, 1), Linearize(1, 2), Record(2)]
    acts += [Reverse(1, 2), Free(1, 2), Reverse(0, 1), Free(0, 1), Free(0, 0), End()]
    stats = execute(acts, 3, (Level(3),), data_size=0.5)
    assert (stats.peak_slots, stats.peak_memory) == ((3,), (2.0,))
    assert (stats.linearized, stats.reversed, stats.data_writes, stats.data_reads) == (
        2,
        2,
        (2,),
        (2,),
    )
    with pytest.raises(ScheduleError, match="over the memory budget of 3/2"):
        execute(acts, 3, (Level(3),), data_size=0.5, memory_budget=1.5)
    sim = Simulator.for_schedule(Mixed(2.5, 0.25), 3)
    assert (sim.data_size, sim.memory_budget) == (Fraction(1, 4), Fraction(5, 2))
