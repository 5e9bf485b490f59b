"""Mixed checkpointing in the compiled loops (issue #35): wall time against ``Revolve(s)`` at equal
memory.

``retrograde.schedules.Mixed(s, data_size)`` reverses short segments from each step's data (the
residuals of its VJP) instead of recomputing them, so it makes fewer forward evaluations than
``Revolve(s)`` with the same budget of ``s`` states: the compiled loops keep a leaf's data in the
snapshot buffers' free rows (``retrograde.loops._pool``). The data size is measured from the
traced step (``retrograde.loops._residuals.measure``). It pays when a step's forward costs at
least its adjoint and its data is small. Cases (``N = 1000`` steps, ``s = 20``, gradient in
``u_0``, float64):

- ``implicit``: ``u + dt * w(u)``, ``w`` solving ``w + exp(w) = u`` elementwise by Newton's method
  (a ``custom_jvp`` whose derivative comes from the solution): the forward costs many times the
  adjoint, and the data is one state (the derivative ``1 / (1 + exp(w))``);
- ``chain``: ``u + dt * sin(a_30 sin(... sin(a_1 u)))``: 30 residuals a step, more than the
  budget: ``Mixed`` is Revolve's;
- ``exponax KS``: a real client, exponax's Kuramoto-Sivashinsky 1D stepper (128 points,
  ``dt = 0.1``; skipped with the install command when exponax is missing:
  ``pip install 'retrograde[bench]'``).

Printed, from one run: the measured data size, forward evaluations (``simulate``), temp memory
(XLA's ``temp_size_in_bytes``), and median wall times of the compiled gradients (round robin, so
that load from other processes slows both alike), as ratios mixed / Revolve.

    python benchmarks/mixed_loops.py             # ~1-2 minutes on 2 cores
    python benchmarks/mixed_loops.py --quick     # N = 300, fewer repeats
    python benchmarks/mixed_loops.py --markdown
    python benchmarks/mixed_loops.py --clock cpu  # the process's CPU time: steadier under load
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

import retrograde
from retrograde import schedules as rs
from retrograde.loops._residuals import measure

from _common import prepare, print_table, time_round_robin

jax.config.update("jax_enable_x64", True)

DT = 0.05
NEWTON = 40  # iterations of the implicit step's solve
CHAIN = 30  # layers of the chain step


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


def exponax_ks():
    """exponax's Kuramoto-Sivashinsky 1D stepper as a scan step, and its initial state; ``None``
    when exponax is not installed."""
    try:
        import exponax as ex
    except ImportError:
        print("exponax KS skipped: pip install 'retrograde[bench]'  (or: pip install exponax)")
        return None
    stepper = ex.stepper.KuramotoSivashinsky(1, 60.0, 128, 0.1)
    u0 = ex.ic.RandomTruncatedFourierSeries(1, cutoff=5)(128, key=jax.random.PRNGKey(0))
    return (lambda u, _: (stepper(u), None)), u0


# ----------------------------------------------------------------------------- the run


def case(name, step, u0, n_steps, s, repeats, clock):
    d = measure(step, u0)

    def gradient(schedule):
        def loss(u0):
            u, _ = retrograde.scan(step, u0, length=n_steps, schedule=schedule)
            return jnp.sum(u**2)

        return jax.grad(loss)

    schedules = {"Revolve": rs.Revolve(s), "mixed": rs.Mixed(s, data_size=d)}
    compiled, outs, temps, evals = {}, {}, {}, {}
    for key, schedule in schedules.items():
        compiled[key], outs[key], _, temps[key] = prepare(gradient(schedule), u0)
        evals[key] = rs.simulate(schedule, n_steps).evaluations
    err = float(
        jnp.max(jnp.abs(outs["mixed"] - outs["Revolve"])) / jnp.max(jnp.abs(outs["Revolve"]))
    )
    times = time_round_robin(compiled, (u0,), repeats, clock=clock)
    median = {k: statistics.median(v) for k, v in times.items()}
    return [
        name,
        f"{d:.3g}",
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
    parser.add_argument("--size", type=int, default=2000, help="floats in the synthetic states")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall", help="cpu: the process's CPU time"
    )
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    n = args.n or (300 if args.quick else 1000)
    repeats = args.repeats or (3 if args.quick else 7)
    cases = [
        (name, step, jnp.linspace(0.5, 2.0, args.size))
        for name, step in (("implicit", implicit), ("chain", chain))
    ]
    ks = exponax_ks()
    if ks is not None:
        cases.append(("exponax KS", *ks))
    rows = [case(name, step, u0, n, args.snapshots, repeats, clock) for name, step, u0 in cases]
    print_table(
        f"Mixed against Revolve({args.snapshots}), N = {n}, float64 ({args.size} values; KS 128), "
        "gradient in u_0 "
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
