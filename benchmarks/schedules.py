"""Online checkpointing against the offline optimum.

Prints, for N in {1e2, 1e3, 1e4, 1e5} and s in {4, 8, 16, 44}, the total evaluations (plain +
recorded) of ``Online(s)`` and of the offline optimum ``t(N, s) + N``, and their ratio, as a
markdown table; then the worst ratio per ``s`` over a scan of every ``N`` up to 1e5 (one forward
sweep of the placement rule gives the totals for all ``N`` at once). A sample of the table is
re-checked with the validating simulator.

    python benchmarks/schedules.py            # about 20 s
    python benchmarks/schedules.py --n-max 20000
"""

from __future__ import annotations

import argparse
import time

from retrograde.schedules import Online, online_totals, revolve_optimum, simulate

SNAPSHOTS = (4, 8, 16, 44)
NS = (100, 1_000, 10_000, 100_000)


def _online_lower_bound(s: int, n_max: int) -> list[int]:
    """``2 N + min over held sets of segment_cost``: no online schedule does better (it must take
    all ``N`` steps forward, and record ``N``). Dynamic programme, ``O(n_max^2 s)``."""
    t = [[revolve_optimum(n, max(k, 1)) for n in range(n_max + 1)] for k in range(s + 1)]
    best = [list(t[1])]  # best[k - 1][n]: reverse n steps from a held start with k slots
    for k in range(2, s + 1):
        row = list(t[k])
        for n in range(2, n_max + 1):
            row[n] = min(row[n], min(t[k][j] + best[-1][n - j] for j in range(1, n)))
        best.append(row)
    return [2 * n + best[s - 1][n] for n in range(n_max + 1)]


def main(n_max: int = 100_000, small: int = 40, check: bool = True) -> None:
    t0 = time.perf_counter()
    totals = {s: online_totals(s, n_max) for s in SNAPSHOTS}
    t_scan = time.perf_counter() - t0

    print("## Online(s) vs the offline optimum: total evaluations (plain + recorded)\n")
    print("|      N |  s | Online | optimum | ratio |")
    print("|-------:|---:|-------:|--------:|------:|")
    for n in NS:
        if n > n_max:
            continue
        for s in SNAPSHOTS:
            opt = revolve_optimum(n, s) + n
            print(f"| {n:6d} | {s:2d} | {totals[s][n]:6d} | {opt:7d} | {totals[s][n] / opt:.4f} |")

    print(f"\n## Worst ratio over every N in {small}..{n_max}; below N = {small}: the excess over")
    print("## the best that any online schedule can do (best held set chosen knowing N)\n")
    print(f"|  s | worst ratio, N >= {small} | at N | N < {small}: max excess | at N |")
    print("|---:|------------:|-----:|------:|-----:|")
    for s in SNAPSHOTS:
        tot = totals[s]
        big = max(range(small, n_max + 1), key=lambda n: tot[n] / (revolve_optimum(n, s) + n))
        rb = tot[big] / (revolve_optimum(big, s) + big)
        bound = _online_lower_bound(s, small - 1)
        excess = [tot[n] - bound[n] for n in range(small)]
        worst_small = max(range(small), key=excess.__getitem__)
        print(f"| {s:2d} | {rb:11.4f} | {big:4d} | {excess[worst_small]:5d} | {worst_small:4d} |")
    print(
        "\n(For tiny N no online schedule is within 5%: N = 1 costs 2 evaluations against 1, "
        "since the loop must take its last step before it knows it is the last.)"
    )
    print(f"\nscan: {t_scan:.1f} s for {len(SNAPSHOTS)} x {n_max} step counts")

    if check:
        t0 = time.perf_counter()
        for n in (100, 1_000, 10_000):
            if n <= n_max:
                for s in SNAPSHOTS:
                    stats = simulate(Online(s), n)
                    assert stats.evaluations == totals[s][n], (n, s)
                    assert stats.peak_slots[0] <= s
        print(f"simulate() agrees on N = 1e2, 1e3, 1e4 ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-max", type=int, default=100_000)
    parser.add_argument("--no-check", action="store_true", help="skip the simulate() check")
    args = parser.parse_args()
    main(args.n_max, check=not args.no_check)
