"""First-order gradient of a long scan: memory and time of retrograde against the alternatives.

The loop: N steps of an elementwise nonlinear update of a carry of C float32,

    u_{n+1} = u_n + dt * tanh(theta * u_n),      loss = mean(u_N ** 2),

and the benchmark differentiates ``loss`` with respect to the closed-over scalar ``theta``
(``u_0`` is a jit argument, so nothing large is constant-folded). For each method it reports
XLA's temporary buffer size of the compiled gradient
(``jax.jit(grad).lower(...).compile().memory_analysis().temp_size_in_bytes``), also in carries,
and the median wall time of the compiled gradient over several repeats after a warm-up.

Methods: ``retrograde.scan`` with ``Revolve(s)`` and with ``StoreAll()``; plain ``jax.lax.scan``;
``lax.scan`` over ``jax.checkpoint(step)``; a nested sqrt(N) scan (outer scan over chunks, each
chunk an inner ``lax.scan`` under ``jax.checkpoint``); and equinox's online checkpointed scan
``equinox.internal.scan(..., kind="checkpointed", checkpoints=s)`` at the same ``s``.

    python benchmarks/scan.py              # N=1000, C=100000, s in {10, 45}; 2-3 minutes on 2 cores
    python benchmarks/scan.py --quick      # carry 30000, 3 repeats; about a minute
    python benchmarks/scan.py --markdown   # the table as markdown (for the README)
    python benchmarks/scan.py --n 2000 --carry 50000 --snapshots 10 20 --repeats 9
"""

from __future__ import annotations

import argparse
import statistics
import time

import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np

import retrograde
from retrograde.schedules import Revolve, StoreAll

from _common import nested_remat, nested_shape, print_table

DT = 0.01


def step_fn(theta):
    def step(u, _):
        return u + DT * jnp.tanh(theta * u), None

    return step


def make_losses(n: int, snapshots: tuple[int, ...]):
    """Name -> (s or None, loss(theta, u0))."""

    def finish(u):
        return jnp.mean(u**2)

    def retro(schedule):
        def loss(theta, u0):
            u, _ = retrograde.scan(step_fn(theta), u0, length=n, schedule=schedule)
            return finish(u)

        return loss

    def lax_plain(theta, u0):
        u, _ = jax.lax.scan(step_fn(theta), u0, length=n)
        return finish(u)

    def lax_remat(theta, u0):
        u, _ = jax.lax.scan(jax.checkpoint(step_fn(theta)), u0, length=n)
        return finish(u)

    def nested(theta, u0):
        return finish(nested_remat(step_fn(theta), u0, n))

    def eqx(s):
        def loss(theta, u0):
            u, _ = eqxi.scan(step_fn(theta), u0, None, length=n, kind="checkpointed", checkpoints=s)
            return finish(u)

        return loss

    out = {}
    for s in snapshots:
        out[f"retrograde Revolve({s})"] = (s, retro(Revolve(s)))
        out[f"equinox checkpointed (s={s})"] = (s, eqx(s))
    out["retrograde StoreAll()"] = (None, retro(StoreAll()))
    out["lax.scan"] = (None, lax_plain)
    out["lax.scan + jax.checkpoint(step)"] = (None, lax_remat)
    out["nested remat ({} x {})".format(*nested_shape(n))] = (None, nested)
    return out


def measure_all(losses, args, repeats: int):
    """Name -> (temp bytes, median seconds, gradient) of each compiled ``grad(loss)``.

    Compiles and warms up every method first, then times them round-robin (one call of each per
    round), so that a change in the machine's load hits every method alike."""
    compiled, temps, grads = {}, {}, {}
    for name, (_, loss) in losses.items():
        c = jax.jit(jax.grad(loss)).lower(*args).compile()
        temps[name] = c.memory_analysis().temp_size_in_bytes
        grads[name] = jax.block_until_ready(c(*args))  # warm-up
        compiled[name] = c
        print(f"  compiled {name}: temp {temps[name] / 2**20:.1f} MiB", flush=True)
    times = {name: [] for name in losses}
    for r in range(repeats):
        for name, c in compiled.items():
            jax.block_until_ready(c(*args))  # untimed: the previous entry's clean-up
            t0 = time.perf_counter()
            jax.block_until_ready(c(*args))
            times[name].append(time.perf_counter() - t0)
        print(f"  timed round {r + 1}/{repeats}", flush=True)
    return {name: (temps[name], statistics.median(times[name]), grads[name]) for name in losses}


def main(n: int, carry: int, snapshots: tuple[int, ...], repeats: int, markdown: bool) -> None:
    theta = jnp.float32(0.7)
    u0 = jnp.asarray(np.linspace(-2.0, 2.0, carry, dtype=np.float32))
    carry_bytes = carry * 4
    args = (theta, u0)

    losses = make_losses(n, snapshots)
    measured = measure_all(losses, args, repeats)
    results = {name: (losses[name][0], *measured[name]) for name in losses}

    t_lax = results["lax.scan"][2]
    g_lax = results["lax.scan"][3]

    header = [
        "method",
        "s",
        "temp MiB",
        "temp / carry",
        "time ms",
        "time / equinox(s)",
        "time / lax.scan",
    ]
    rows = []
    for name, (s, temp, t, _) in results.items():
        t_eqx = results[f"equinox checkpointed (s={s})"][2] if s is not None else None
        rows.append(
            [
                name,
                "-" if s is None else str(s),
                f"{temp / 2**20:.1f}",
                f"{temp / carry_bytes:.2f}",
                f"{t * 1e3:.1f}",
                "-" if t_eqx is None else f"{t / t_eqx:.2f}",
                f"{t / t_lax:.2f}",
            ]
        )

    title = (
        f"First-order gradient, N = {n}, carry = {carry} float32 "
        f"({carry_bytes / 2**20:.2f} MiB), median of {repeats} (jax {jax.__version__}, "
        f"{jax.devices()[0].platform})"
    )
    print_table(title, header, rows, markdown)

    # Targets.
    print()
    bullet = "- " if markdown else "  "
    print("Targets:" if not markdown else "**Targets:**\n")
    for s in snapshots:
        _, temp, t, _ = results[f"retrograde Revolve({s})"]
        t_eqx = results[f"equinox checkpointed (s={s})"][2]
        mem_ok = temp <= (s + 3) * carry_bytes
        excess = temp - (s + 3) * carry_bytes
        print(
            f"{bullet}Revolve({s}) memory {temp / carry_bytes:.4f} carries <= s + 3 = {s + 3} "
            f"({temp} B, {excess:+d} B against the bound): {'PASS' if mem_ok else 'MISS'}"
        )
        print(
            f"{bullet}Revolve({s}) time {t / t_eqx:.2f} x equinox(s={s}) <= 0.8: "
            f"{'PASS' if t <= 0.8 * t_eqx else 'MISS'}"
        )
    t_sa = results["retrograde StoreAll()"][2]
    print(
        f"{bullet}StoreAll() time {t_sa / t_lax:.2f} x lax.scan <= 1.2: "
        f"{'PASS' if t_sa <= 1.2 * t_lax else 'MISS'}"
    )

    print()
    print(
        "Agreement with the lax.scan gradient (relative error):"
        if not markdown
        else "**Agreement with the lax.scan gradient (relative error):**\n"
    )
    for name, (_, _, _, g) in results.items():
        if name.startswith("retrograde"):
            err = abs(float(g) - float(g_lax)) / abs(float(g_lax))
            print(f"{bullet}{name}: {err:.2e} (grad = {float(g):.7g}, lax.scan {float(g_lax):.7g})")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1000, help="number of steps (default 1000)")
    p.add_argument(
        "--carry", type=int, default=None, help="carry size in float32 (100000; 30000 with --quick)"
    )
    p.add_argument("--snapshots", type=int, nargs="+", default=[10, 45], help="s values (10 45)")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats (5; 3 with --quick)")
    p.add_argument("--quick", action="store_true", help="smaller carry, fewer repeats (~1 min)")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown")
    a = p.parse_args()
    reps = a.repeats if a.repeats is not None else (3 if a.quick else 5)
    carry = a.carry if a.carry is not None else (30_000 if a.quick else 100_000)
    main(a.n, carry, tuple(a.snapshots), reps, a.markdown)
