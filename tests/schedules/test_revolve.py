"""Revolve: optimal plain-evaluation counts, validity, and O(s) memory while streaming."""

from __future__ import annotations

import functools
import tracemalloc

import pytest

from retrograde.schedules import (
    End,
    Record,
    Revolve,
    beta,
    repetition_number,
    revolve_optimum,
    revolve_split,
    simulate,
)

N_MAX, S_MAX = 200, 10


@functools.cache
def _brute_force_table() -> list[list[int]]:
    """T[s][n] by the recursion T(1, s) = 0, T(n, 1) = n(n-1)/2,
    T(n, s) = min_{1 <= j < n} j + T(n-j, s-1) + T(j, s)."""
    T = [[0] * (N_MAX + 1) for _ in range(S_MAX + 1)]
    for n in range(1, N_MAX + 1):
        T[1][n] = n * (n - 1) // 2
    for s in range(2, S_MAX + 1):
        for n in range(2, N_MAX + 1):
            T[s][n] = min(j + T[s - 1][n - j] + T[s][j] for j in range(1, n))
    return T


def test_brute_force_recursion_sanity():
    T = _brute_force_table()
    assert T[5][100] == 316
    assert T[10][100] == 222
    assert T[3][1] == 0


def test_exhaustive_against_recursion_and_closed_form():
    T = _brute_force_table()
    for s in range(1, S_MAX + 1):
        for n in range(1, N_MAX + 1):
            stats = simulate(Revolve(s), n)
            assert stats.plain == T[s][n] == revolve_optimum(n, s), (n, s)
            assert stats.recorded == n
            assert stats.peak_slots[0] <= s
            assert stats.peak_slots == (min(s, max(n - 1, 1)),)  # u_{N-1} is never stored


@pytest.mark.parametrize(
    "n, s, plain",
    [
        (100, 5, 316),
        (100, 10, 222),
        (100, 20, 178),
        (1000, 5, 6284),
        (1000, 10, 3636),
        (1000, 20, 2747),
        (10000, 5, 112868),
        (10000, 10, 57624),
        (10000, 20, 37976),
    ],
)
def test_design_note_examples(n, s, plain):
    assert revolve_optimum(n, s) == plain
    if n <= 1000:
        stats = simulate(Revolve(s), n)
        assert (stats.plain, stats.recorded) == (plain, n)
        assert stats.peak_slots == (s,)


@pytest.mark.parametrize("s", [5, 20])
def test_design_note_examples_large(s):
    stats = simulate(Revolve(s), 10000)
    assert stats.plain == {5: 112868, 20: 37976}[s]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 50, 100])
@pytest.mark.parametrize("extra", [0, 1, 10])
def test_enough_slots_is_store_all(n, extra):
    s = n + extra
    stats = simulate(Revolve(s), n)
    assert stats.plain == revolve_optimum(n, s) == n - 1
    assert stats.peak_slots == (max(n - 1, 1),)  # u_{N-1} is recorded straight away


def test_zero_steps():
    assert list(Revolve(3).actions(0)) == [End()]
    stats = simulate(Revolve(3), 0)
    assert (stats.plain, stats.recorded, stats.peak_slots) == (0, 0, (0,))
    assert revolve_optimum(0, 3) == 0


def test_records_in_reverse_order():
    recs = [a.step for a in Revolve(4).actions(60) if type(a) is Record]
    assert recs == list(range(59, -1, -1))


def test_beta_and_repetition_number():
    assert beta(5, 0) == 1
    assert beta(2, 3) == 10
    for s in range(1, 8):
        for r in range(1, 6):
            b = beta(s, r)
            assert repetition_number(b, s) == r
            assert repetition_number(b + 1, s) == r + 1
    assert repetition_number(0, 4) == repetition_number(1, 4) == 0


def test_closed_form_at_binomial_boundaries():
    # At N = beta(s, r) every step is run plainly at most r times: t <= r*N.
    for s in range(1, 8):
        for r in range(1, 5):
            n = beta(s, r)
            assert revolve_optimum(n, s) <= r * n
            assert simulate(Revolve(s), n).plain == revolve_optimum(n, s)


def test_split_hint_does_not_change_result():
    for s in range(2, 7):
        for n in range(2, 120):
            exact = revolve_split(n, s)
            for hint in (0, 1, 5, 40):
                assert revolve_split(n, s, hint) == exact


def _stream_peak(n: int, s: int) -> int:
    tracemalloc.start()
    try:
        last = None
        count = 0
        for last in Revolve(s).actions(n):  # noqa: B007 - the last action, checked below
            count += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert last == End()
    return peak


@pytest.mark.parametrize(
    "small_n, large_n",
    [(2_000, 20_000), pytest.param(20_000, 200_000, marks=pytest.mark.slow)],
)
def test_streaming_memory_is_independent_of_n(small_n, large_n):
    s = 20
    small = _stream_peak(small_n, s)
    large = _stream_peak(large_n, s)
    assert large < 1_000_000  # bytes; a few kB in practice
    # O(s): ten times the steps may not cost noticeably more memory.
    assert large < 2 * small + 20_000


@pytest.mark.slow
def test_one_million_steps_stream():
    last = None
    records = 0
    for last in Revolve(20).actions(10**6):
        if type(last) is Record:
            records += 1
    assert last == End()
    assert records == 10**6


def test_optimum_table_matches_brute_force():
    """The tabulated form of ``t(n, s)`` (one band of repetition numbers at a time, what
    ``MultiLevel`` reads) against the recursion, entry by entry."""
    from retrograde.schedules._optimum import optimum_table

    T = _brute_force_table()
    for s in range(1, S_MAX + 1):
        t, r = optimum_table(N_MAX, s)
        assert t.tolist() == T[s], s
        assert r.tolist() == [repetition_number(n, s) for n in range(N_MAX + 1)], s
