"""Mixed checkpointing in the compiled loops (issue #35): wall time against ``Revolve(s)`` at equal
memory.

A mixed schedule reverses short segments from each step's data (the residuals of its VJP, measured
from the traced step: ``retrograde.loops._residuals``) instead of recomputing them, so it makes
fewer forward evaluations than Revolve with the same slots. It pays when a step's forward costs at
least its adjoint and its data is small. Cases (``N = 1000`` steps, ``s = 20`` state slots of
memory for ``Revolve(s)``, gradient in ``u_0``, float64):

- ``implicit``: ``u + dt * w(u)``, ``w`` solving ``w + exp(w) = u`` elementwise by Newton's method
  (a ``custom_jvp`` whose derivative comes from the solution): the forward costs many times the
  adjoint, and the data is one state (the derivative ``1 / (1 + exp(w))``);
- ``chain``: ``u + dt * sin(a_30 sin(... sin(a_1 u)))``: 30 residuals a step, more than the
  budget: the mixed schedule is Revolve's.

The mixed schedule is ``retrograde.schedules.Mixed(s, data_size)`` once it exists. Until then a
stand-in here (:class:`SplitMixed`): the compiled loops keep states and data in separate buffers
(``S`` state rows, ``L`` data rows of ``d`` states), so the stand-in is the optimal binomial tree of
state snapshots over ``S`` slots whose leaves of at most ``L + 1`` steps are reversed from data
(a dynamic program over ``(n, free slots)``, ``O(N^2 S)``), for the ``S + L d <= s`` that makes
the fewest evaluations and whose compiled gradient needs no more temp memory than Revolve's
(to within 0.5%; the data leaves' working set is about a state larger); if none beats Revolve's,
``Revolve(s)`` itself. The first sweep stores the start of its last leaf where a slot is free (the
compiled loop needs that state; ``S`` counts it).

Printed, from one run: forward evaluations (``simulate``), temp memory (XLA's
``temp_size_in_bytes``), and median wall times of the compiled gradients (round robin, so that
load from other processes slows both alike), as ratios mixed / Revolve.

    python benchmarks/mixed_loops.py             # ~1-2 minutes on 2 cores
    python benchmarks/mixed_loops.py --quick     # N = 300, fewer repeats
    python benchmarks/mixed_loops.py --markdown
    python benchmarks/mixed_loops.py --clock cpu  # the process's CPU time: steadier under load
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import retrograde
from retrograde import schedules as rs
from retrograde.loops._residuals import measure
from retrograde.loops._tables import tables_for
from retrograde.schedules import (
    Advance,
    End,
    Free,
    Level,
    Linearize,
    OfflineSchedule,
    Record,
    Restore,
    Reverse,
    Store,
)

from _common import prepare, print_table, time_round_robin

jax.config.update("jax_enable_x64", True)

DT = 0.05
NEWTON = 40  # iterations of the implicit step's solve
CHAIN = 30  # layers of the chain step
TOLERANCE = 0.005  # equal temp memory, to within this fraction


# ----------------------------------------------------------------------------- the steps


@jax.custom_jvp
def solve(u):
    """``w`` with ``w + exp(w) = u``, elementwise, by Newton's method."""

    def newton(_, w):
        e = jnp.exp(w)
        return w - (w + e - u) / (1.0 + e)

    return jax.lax.fori_loop(0, NEWTON, newton, jnp.zeros_like(u))


@solve.defjvp
def _solve_jvp(primals, tangents):
    (u,), (t,) = primals, tangents
    w = solve(u)
    return w, t / (1.0 + jnp.exp(w))


def implicit(u, _):
    return u + DT * (solve(u) - 0.5 * u), None


def chain(u, _):
    v = u
    for k in range(CHAIN):
        v = jnp.sin((1.0 + 0.01 * k) * v)
    return u + DT * v, None


# ----------------------------------------------------------------------------- the stand-in


def optimum_table(n_steps: int, states: int, rows: int):
    """``(cost, split)`` over ``n <= n_steps`` steps and ``b <= states`` free slots: the fewest
    forward evaluations reversing ``n`` steps from ``u_a`` at hand, leaves of at most ``rows + 1``
    steps from data (``n`` evaluations), else the best split ``i``: store ``u_a``, advance ``i``,
    reverse the right part with ``b - 1`` slots, restore, the left part with ``b``."""
    inf = np.iinfo(np.int64).max // 4
    cost = np.full((n_steps + 1, states + 1), inf, np.int64)
    split = np.zeros((n_steps + 1, states + 1), np.int64)
    for b in range(states + 1):
        for n in range(1, n_steps + 1):
            if n - 1 <= rows:
                cost[n, b] = n
            elif b:
                i = np.arange(1, n)
                c = i + cost[n - i, b - 1] + cost[i, b]
                j = int(np.argmin(c))
                cost[n, b], split[n, b] = c[j], j + 1
    return cost, split


@dataclasses.dataclass(frozen=True)
class SplitMixed(OfflineSchedule):
    """The stand-in: ``states`` state slots (0 ..), ``rows`` data slots after them."""

    states: int
    rows: int

    @property
    def levels(self):
        return (Level(self.states + self.rows),)

    @functools.lru_cache(maxsize=4)  # noqa: B019 (a few frozen instances, one table each)
    def table(self, n_steps):
        return optimum_table(n_steps, self.states, self.rows)

    def actions(self, n_steps):
        if n_steps:
            _, split = self.table(n_steps)
            free = list(range(self.states - 1, -1, -1))
            yield from self._reverse(0, n_steps, len(free), free, split, True)
        yield End()

    def _reverse(self, a, n, b, free, split, first):
        """Reverse ``[a, a + n)`` from ``u_a`` at hand with ``b`` free slots (the left parts in a
        loop, the right parts recursively: depth at most ``states``)."""
        while n - 1 > self.rows:
            i, slot = int(split[n, b]), free.pop()
            yield Store(a, slot)
            yield Advance(a, a + i)
            yield from self._reverse(a + i, n - i, b - 1, free, split, first)
            yield Restore(a, slot)
            yield Free(a, slot)
            free.append(slot)
            n, first = i, False
        keep = first and free and n > 1  # the first sweep keeps its last leaf's start
        if keep:
            slot = free[-1]
            yield Store(a, slot)
        data = self.states
        for k in range(n - 1):
            yield Linearize(a + k, data + k)
        yield Record(a + n - 1)
        for k in reversed(range(n - 1)):
            yield Reverse(a + k, data + k)
            yield Free(a + k, data + k)
        if keep:
            yield Free(a, slot)


def mixed_candidates(n_steps: int, s: int, d: float):
    """``[schedules.Mixed(s, d)]`` if it exists, else the stand-ins that beat ``Revolve(s)``
    with ``S + L d <= s`` (the compiled loop's state rows counted, the first sweep's last leaf's
    start included), fewest evaluations first; then ``Revolve(s)``."""
    if hasattr(rs, "Mixed"):
        return [rs.Mixed(s, data_size=d)]
    fewest = rs.simulate(rs.Revolve(s), n_steps).evaluations
    found = {}
    for rows in range(1, int(s / d) + 1 if d > 0 else s):
        budget = s - math.ceil(rows * d)
        for states in range(budget, max(budget - 3, 0), -1):
            schedule = SplitMixed(states, rows)
            if tables_for(schedule, n_steps).n_slots <= budget:
                cost = int(optimum_table(n_steps, states, rows)[0][n_steps, states])
                if cost < fewest:
                    found[schedule] = cost
    return sorted(found, key=found.get) + [rs.Revolve(s)]


# ----------------------------------------------------------------------------- the run


def case(name, step, n_steps, s, size, repeats, clock):
    u0 = jnp.linspace(0.5, 2.0, size)
    d = measure(step, u0)

    def gradient(schedule):
        def loss(u0):
            u, _ = retrograde.scan(step, u0, length=n_steps, schedule=schedule)
            return jnp.sum(u**2)

        return jax.grad(loss)

    compiled, outs, temps, evals, schedules = {}, {}, {}, {}, {}
    # Equal memory: the mixed schedule with the fewest evaluations whose compiled gradient's
    # temp memory is at most Revolve's (to within TOLERANCE: the tables differ by a few hundred
    # bytes).
    for key, candidates in (
        ("Revolve", [rs.Revolve(s)]),
        ("mixed", mixed_candidates(n_steps, s, d)),
    ):
        for schedule in candidates:
            compiled[key], outs[key], _, temps[key] = prepare(gradient(schedule), u0)
            schedules[key] = schedule
            if key == "Revolve" or temps[key] <= (1 + TOLERANCE) * temps["Revolve"]:
                break
        evals[key] = rs.simulate(schedules[key], n_steps).evaluations
    err = float(
        jnp.max(jnp.abs(outs["mixed"] - outs["Revolve"])) / jnp.max(jnp.abs(outs["Revolve"]))
    )
    times = time_round_robin(compiled, (u0,), repeats, clock=clock)
    median = {k: statistics.median(v) for k, v in times.items()}
    return [
        name,
        f"{d:g}",
        repr(schedules["mixed"]),
        f"{evals['Revolve']} / {evals['mixed']}",
        f"{evals['mixed'] / evals['Revolve']:.3f}",
        f"{temps['mixed'] / temps['Revolve']:.3f}",
        f"{median['Revolve'] * 1e3:.0f} / {median['mixed'] * 1e3:.0f}",
        f"{median['mixed'] / median['Revolve']:.3f}",
        f"{err:.1e}",
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--snapshots", type=int, default=20)
    parser.add_argument("--size", type=int, default=2000, help="floats in the state")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall", help="cpu: the process's CPU time"
    )
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    n = args.n or (300 if args.quick else 1000)
    repeats = args.repeats or (3 if args.quick else 7)
    rows = [
        case(name, step, n, args.snapshots, args.size, repeats, clock)
        for name, step in (("implicit", implicit), ("chain", chain))
    ]
    print_table(
        f"Mixed against Revolve({args.snapshots}), N = {n}, {args.size} float64, gradient in u_0 "
        f"({args.clock} time, {jax.default_backend()}, jax {jax.__version__})",
        [
            "step",
            "data (states)",
            "mixed schedule",
            "evaluations R / M",
            "ratio",
            "temp memory ratio",
            "ms R / M",
            "time ratio",
            "rel. diff.",
        ],
        rows,
        args.markdown,
        left=3,
    )


if __name__ == "__main__":
    main()
