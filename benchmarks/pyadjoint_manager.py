"""The cost of retrograde.pyadjoint's checkpoint manager itself (issue #31's targets).

A tape of 10,000 cheap blocks: ``N = 5000`` steps of two blocks each on a 4-point ``Vec``
(``examples/pyadjoint_vec.py``): ``v <- A u`` and ``u <- u + 0.01 v + 0.01 p u (1 - u)``, then
``J = inner(u, u)``, control the scalar ``p``. The same loop is taped three times:

- unchecked (pyadjoint's plain tape: every block's output kept, no recomputation);
- ``enable_checkpointing(StoreAll())``: target, ``rf.derivative()`` within 1.2x of the unchecked
  tape's (``rf(m)``'s ratio is printed for information);
- ``enable_checkpointing(Revolve(10))``: target, ``rf.derivative()`` within 1.2x of what its
  recompute count predicts: ``(steps + recorded) x c + a``, with ``steps`` and ``recorded`` the
  manager's counts during that derivative, ``a`` the unchecked tape's ``rf.derivative()`` time
  (the adjoints) and ``c`` the unchecked tape's cost of recomputing one step with its outputs
  made anew (each block's outputs cleared first): a sweep that does not keep every value cannot
  recompute into the previous outputs, as the unchecked tape's ``rf(m)`` does (``c`` from
  ``rf(m)`` is printed for information).

After one warm-up ``rf.derivative()`` (the first ends the taping), each repeat times ``rf(m)``
then ``rf.derivative()`` (the reverse part from the snapshots ``rf(m)`` laid); times are medians
over round-robin repeats (the three tapes in turn, so that load from other processes slows them
alike), from a collected heap with the garbage collector on.
The gradients are checked to agree. Timing is never asserted: a FAIL is printed, the exit
status is 0 (1 only when the gradients disagree).

    python benchmarks/pyadjoint_manager.py            # 7 repeats, ~1 minute on 2 cores
    python benchmarks/pyadjoint_manager.py --quick    # 3 repeats, ~20 s (make bench)
    python benchmarks/pyadjoint_manager.py --steps 2000 --repeats 5 --clock cpu
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import numpy as np  # noqa: E402
import pyadjoint as pa  # noqa: E402
from pyadjoint_vec import Vec, evolve, inner, matvec  # noqa: E402

import retrograde.pyadjoint as rp  # noqa: E402
from retrograde.schedules import Revolve, StoreAll  # noqa: E402

K = 4
A = np.eye(K) * -2 + np.eye(K, k=1) + np.eye(K, k=-1)
LIMIT = 1.2


def _f(u, v, p):
    return u + 0.01 * v + 0.01 * p * u * (1 - u)


def _df(u, v, p):
    return [1 + 0.01 * p * (1 - 2 * u), 0.01, 0.01 * u * (1 - u)]


def _d2f(u, v, p):
    return [[-0.02 * p, 0, 0.01 * (1 - 2 * u)], [0, 0, 0], [0.01 * (1 - 2 * u), 0, 0]]


def tape_loop(schedule, n_steps: int):
    """Tape the loop (``schedule``: ``None`` for unchecked); returns (rf, control, manager)."""
    tape = pa.Tape()
    with pa.set_working_tape(tape):
        manager = None if schedule is None else rp.enable_checkpointing(schedule)
        p = pa.AdjFloat(0.5)
        u, v = Vec(np.linspace(0.1, 0.9, K)), Vec(np.zeros(K))
        for _ in tape.timestepper(iter(range(n_steps))):
            matvec(v, A, u)
            evolve(u, _f, _df, _d2f, [u, v, p])
        rf = pa.ReducedFunctional(inner(u, u), pa.Control(p))
    return rf, p, manager, tape


def timed(fn, clock):
    """``fn()`` timed from a collected heap, with the garbage collector on, as a user runs it."""
    gc.collect()
    t0 = clock()
    out = fn()
    return clock() - t0, out


def measure(n_steps: int, repeats: int, clock) -> dict:
    """Per variant: median ``rf.derivative()`` and ``rf(m)`` times, the gradient, and (Revolve)
    the manager's step counts during one derivative."""
    variants = {"unchecked": None, "StoreAll()": StoreAll(), "Revolve(10)": Revolve(10)}
    runs = {}
    for name, schedule in variants.items():
        rf, p, manager, tape = tape_loop(schedule, n_steps)
        with pa.set_working_tape(tape):
            grad = float(rf.derivative())  # warm-up (ends the taping)
        runs[name] = dict(rf=rf, p=p, m=manager, tape=tape, grad=grad, der=[], call=[])
    unchecked = runs["unchecked"]
    blocks = unchecked["tape"].get_blocks()

    def fresh_forward():
        with pa.stop_annotating():
            for block in blocks:
                for out in block.get_outputs():
                    out.checkpoint = None
                block.recompute()

    unchecked["fresh"] = []
    for _ in range(repeats):
        with pa.set_working_tape(unchecked["tape"]):
            unchecked["fresh"].append(timed(fresh_forward, clock)[0])
        for r in runs.values():
            with pa.set_working_tape(r["tape"]):
                t, _ = timed(lambda: r["rf"](pa.AdjFloat(0.5)), clock)
                r["call"].append(t)
                before = None if r["m"] is None else (r["m"].counts.steps, r["m"].counts.recorded)
                t, g = timed(r["rf"].derivative, clock)
                r["der"].append(t)
                if before is not None:
                    r["counted"] = (
                        r["m"].counts.steps - before[0],
                        r["m"].counts.recorded - before[1],
                    )
                r["grad2"] = float(g)
    return runs


def report(runs: dict, n_steps: int, repeats: int, clock_name: str) -> bool:
    """Print the times and the targets; returns whether the gradients agree."""
    ref = runs["unchecked"]["grad"]
    ok = all(abs(r[k] - ref) <= 1e-10 * abs(ref) for r in runs.values() for k in ("grad", "grad2"))
    blocks = len(runs["unchecked"]["tape"].get_blocks())
    print(
        f"{blocks} blocks ({n_steps} steps x 2 + 1), median of {repeats} ({clock_name} time); "
        f"gradients {'agree' if ok else 'DISAGREE'} (dJ/dp = {ref:.12g})\n"
    )
    print("| tape | rf.derivative() [s] | rf(m) [s] | steps, recorded per derivative |")
    print("|---|---:|---:|---|")
    med = {}
    for name, r in runs.items():
        med[name] = (statistics.median(r["der"]), statistics.median(r["call"]))
        counted = r.get("counted")
        print(
            f"| {name} | {med[name][0]:.4f} | {med[name][1]:.4f} | "
            f"{'-' if counted is None else f'{counted[0]}, {counted[1]}'} |"
        )
    a, call = med["unchecked"]
    fresh = statistics.median(runs["unchecked"]["fresh"]) / n_steps
    in_place = call / n_steps

    def predicted(name, c, how):
        steps, recorded = runs[name]["counted"]
        t = (steps + recorded) * c + a
        return t, (
            f"{name} derivative / predicted ({steps} + {recorded} steps x "
            f"{c * 1e6:.1f} us {how} + {a:.4f} s = {t:.4f} s)"
        )

    rows = [
        ("StoreAll() derivative / unchecked derivative", med["StoreAll()"][0] / a, LIMIT),
        ("StoreAll() rf(m) / unchecked rf(m)", med["StoreAll()"][1] / call, None),
    ]
    for name, c, how, limit in (
        ("Revolve(10)", fresh, "(outputs anew)", LIMIT),
        ("Revolve(10)", in_place, "(in place)", None),
    ):
        t, label = predicted(name, c, how)
        rows.append((label, med[name][0] / t, limit))
    print("\n| target | ratio | limit | verdict |\n|---|---:|---:|---|")
    for label, ratio, limit in rows:
        verdict = "(info)" if limit is None else "PASS" if ratio <= limit else "FAIL"
        print(f"| {label} | {ratio:.2f} | {limit or '-'} | {verdict} |")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 repeats (~20 s)")
    ap.add_argument("--steps", type=int, default=5000, help="time steps (2 blocks each)")
    ap.add_argument("--repeats", type=int, default=None, help="default 7, 3 with --quick")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = ap.parse_args()
    repeats = args.repeats or (3 if args.quick else 7)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    pa.continue_annotation()
    runs = measure(args.steps, repeats, clock)
    return 0 if report(runs, args.steps, repeats, args.clock) else 1


if __name__ == "__main__":
    sys.exit(main())
