"""Mixed checkpointing against Revolve: forward evaluations per step, and the cost of planning.

Prints (markdown) the forward evaluations per step (plain, linearized and recorded, over ``N``)
of ``Revolve(s)`` and of ``Mixed(s, data_size)`` for data of 1, 2 and 4 states, at ``N =
1000`` and ``s = 5, 10, 20, 40`` (the table of docs/choosing-a-schedule.md); then the counts at
``N = 1000``, ``s = 20``, data of one state, checked by the validating simulator. First, how
long planning and streaming the schedule takes (the band rule for a whole data size, the
dynamic program for a fractional one), as measured on this machine: the issue asks for under a
second at N = 10^4, s = 40.

    python benchmarks/mixed_counts.py          # a few seconds
    python benchmarks/mixed_counts.py --steps 2000
"""

from __future__ import annotations

import argparse
import time

from retrograde.schedules import Mixed, revolve_optimum, simulate
from retrograde.schedules._mixed import band_rule_applies

SNAPSHOTS = (5, 10, 20, 40)
DATA_SIZES = (1, 2, 4)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main(n_steps: int = 1000) -> None:
    n = n_steps
    print("## Planning and streaming (one run on this machine, tables not yet computed)\n")
    print("| schedule | rule | N | evaluations | plan s | stream s | actions |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for schedule, steps in [
        (Mixed(40), 10_000),
        (Mixed(40), 100_000),
        (Mixed(40, 2.0), 10_000),
        (Mixed(40, 3.0), 10_000),
        (Mixed(10, 2.0), 100_000),
        (Mixed(40, 1.5), 10_000),
    ]:
        evaluations, plan = _timed(lambda: schedule.evaluations(steps))
        count, stream = _timed(lambda: sum(1 for _ in schedule.actions(steps)))
        rule = "band" if band_rule_applies(schedule._leaves) else "table"
        print(
            f"| {schedule!r} | {rule} | {steps:,} | {evaluations:,} | {plan:.3f} | {stream:.3f} | "
            f"{count:,} |"
        )
    print(f"\n## Forward evaluations per step at N = {n}\n")
    heads = [f"data = {d} state{'s' if d > 1 else ''}" for d in DATA_SIZES]
    print("| snapshots | Revolve (t(N,s)+N)/N | " + " | ".join(f"mixed, {h}" for h in heads) + " |")
    print("|---:|---:|" + "---:|" * len(DATA_SIZES))
    for s in SNAPSHOTS:
        revolve = (revolve_optimum(n, s) + n) / n
        mixed = [Mixed(s, d).evaluations(n) / n for d in DATA_SIZES]
        print(f"| {s} | {revolve:.3f} | " + " | ".join(f"{m:.3f}" for m in mixed) + " |")

    stats = simulate(Mixed(20), 1000)
    print(
        f"\nN = 1000, s = 20, data = 1 state: Mixed {stats.evaluations} (plain {stats.plain}, "
        f"linearized {stats.linearized}, recorded {stats.recorded}; {stats.reversed} steps "
        f"reversed from data) against Revolve {revolve_optimum(1000, 20) + 1000}."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="N for the table (default 1000)")
    main(parser.parse_args().steps)
