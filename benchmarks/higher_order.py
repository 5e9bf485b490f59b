"""Higher-order derivatives of a long scan: memory and time of retrograde against the alternatives.

The loop: N steps of an elementwise nonlinear update of a carry of C float64,

    u_{n+1} = u_n + dt * tanh(theta * u_n + p),      loss(theta, p) = mean(u_N ** 2),

with a closed-over scalar ``theta`` and vector ``p`` (size C). Four derivatives of ``loss``:

- first order:   ``jax.grad(loss, argnums=1)``                      (gradient in p)
- HVP:           ``jax.jvp(jax.grad(loss, argnums=1), (p,), (v,))``  (Hessian-vector product in p)
- grad of grad:  ``d^2 loss / d theta^2``  as ``jax.grad(jax.grad(loss))``
- third order:   ``d^3 loss / d theta^3``  as ``jax.grad(jax.grad(jax.grad(loss)))``

for three loops: ``retrograde.scan`` with ``Revolve(s)``, plain ``jax.lax.scan`` and the usual
workaround, a nested sqrt(N) scan (an outer ``lax.scan`` over chunks, each chunk an inner
``lax.scan`` under ``jax.checkpoint``). For each it reports XLA's temporary buffer size of the
compiled function (``jax.jit(f).lower(...).compile().memory_analysis().temp_size_in_bytes``),
also in carries, the median wall time (timed round-robin after a warm-up), the ratios against
``lax.scan`` and against the nested remat scan, and the agreement of every result with
``lax.scan``'s. Under the table: the HVP / first-order time ratio of retrograde (target <= 4).

    python benchmarks/higher_order.py             # N in {1000, 10000}, C = 500, s = 16; ~3-4 min
    python benchmarks/higher_order.py --quick     # N = 10000 only, C = 200, 2 repeats; ~1-2 min
    python benchmarks/higher_order.py --markdown  # the tables as markdown (for the README)
    python benchmarks/higher_order.py --ns 1000 --carry 4000 --snapshots 20 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import retrograde  # noqa: E402
from retrograde.schedules import Revolve  # noqa: E402

from _common import nested_remat, nested_shape, print_table  # noqa: E402

DT = 0.01


def step_fn(theta, p):
    def step(u, _):
        return u + DT * jnp.tanh(theta * u + p), None

    return step


def make_loops(n: int, s: int):
    """Name -> run(theta, p, u0) -> u_N."""

    def retro(theta, p, u0):
        return retrograde.scan(step_fn(theta, p), u0, length=n, schedule=Revolve(s))[0]

    def lax_plain(theta, p, u0):
        return jax.lax.scan(step_fn(theta, p), u0, length=n)[0]

    def nested(theta, p, u0):
        return nested_remat(step_fn(theta, p), u0, n)

    return {
        f"retrograde Revolve({s})": retro,
        "lax.scan": lax_plain,
        "nested remat ({} x {})".format(*nested_shape(n)): nested,
    }


def make_ops(run):
    """Derivative name -> f(theta, p, u0, v)."""

    def loss(theta, p, u0):
        return jnp.mean(run(theta, p, u0) ** 2)

    g_p = jax.grad(loss, argnums=1)
    d1 = jax.grad(loss)
    d2 = jax.grad(d1)
    d3 = jax.grad(d2)
    return {
        "first order": lambda theta, p, u0, v: g_p(theta, p, u0),
        "HVP": lambda theta, p, u0, v: jax.jvp(lambda q: g_p(theta, q, u0), (p,), (v,))[1],
        "grad of grad": lambda theta, p, u0, v: d2(theta, p, u0),
        "third order": lambda theta, p, u0, v: d3(theta, p, u0),
    }


OPS = ("first order", "HVP", "grad of grad", "third order")


def measure_all(fns, args, repeats: int):
    """Key -> (temp bytes, median seconds, value); compiled and warmed up first, timed
    round-robin so that load changes on the machine hit every entry alike."""
    compiled, temps, vals, warm = {}, {}, {}, {}
    for key, f in fns.items():
        c = jax.jit(f).lower(*args).compile()
        temps[key] = c.memory_analysis().temp_size_in_bytes
        t0 = time.perf_counter()
        vals[key] = np.asarray(jax.block_until_ready(c(*args)))
        warm[key] = time.perf_counter() - t0
        compiled[key] = c
        print(f"  compiled {key}: temp {temps[key] / 2**20:.2f} MiB", flush=True)
    times = {k: [] for k in fns}
    for _r in range(repeats):
        for key, c in compiled.items():
            if warm[key] < 1.0:  # an untimed call first: the previous entry's clean-up
                jax.block_until_ready(c(*args))
            t0 = time.perf_counter()
            jax.block_until_ready(c(*args))
            times[key].append(time.perf_counter() - t0)
    return {k: (temps[k], statistics.median(times[k]), vals[k]) for k in fns}


def run_n(n: int, carry: int, s: int, repeats: int, markdown: bool):
    rng = np.random.default_rng(0)
    theta = jnp.float64(0.7)
    p = jnp.asarray(rng.uniform(-0.5, 0.5, carry))
    u0 = jnp.asarray(np.linspace(-2.0, 2.0, carry))
    v = jnp.asarray(rng.standard_normal(carry))
    args = (theta, p, u0, v)
    carry_bytes = carry * 8

    loops = make_loops(n, s)
    names = list(loops)
    fns = {}
    for name, run in loops.items():
        for op, f in make_ops(run).items():
            fns[(op, name)] = f
    res = measure_all(fns, args, repeats)

    ref_name = "lax.scan"
    nested_name = names[2]
    header = [
        "derivative",
        "loop",
        "temp MiB",
        "temp / carry",
        "time ms",
        "time / lax.scan",
        "time / nested",
        "mem / lax.scan",
        "mem / nested",
        "rel. err vs lax.scan",
    ]
    rows = []
    for op in OPS:
        t_ref, t_nest = res[(op, ref_name)][1], res[(op, nested_name)][1]
        m_ref, m_nest = res[(op, ref_name)][0], res[(op, nested_name)][0]
        val_ref = res[(op, ref_name)][2]
        for name in names:
            temp, t, val = res[(op, name)]
            err = np.linalg.norm(val - val_ref) / max(np.linalg.norm(val_ref), 1e-300)
            rows.append(
                [
                    op,
                    name,
                    f"{temp / 2**20:.2f}",
                    f"{temp / carry_bytes:.1f}",
                    f"{t * 1e3:.1f}",
                    f"{t / t_ref:.2f}",
                    f"{t / t_nest:.2f}",
                    f"{temp / m_ref:.3f}",
                    f"{temp / m_nest:.2f}",
                    "-" if name == ref_name else f"{err:.1e}",
                ]
            )
    title = (
        f"N = {n}, carry = {carry} float64 ({carry_bytes / 1024:.1f} KiB), s = {s}, "
        f"median of {repeats} (jax {jax.__version__}, {jax.devices()[0].platform})"
    )
    print_table(title, header, rows, markdown, left=2)

    retro = names[0]
    t1 = res[("first order", retro)][1]
    th = res[("HVP", retro)][1]
    ratio = th / t1
    print()
    bullet = "- " if markdown else "  "
    print(
        f"{bullet}{retro}: HVP time / first-order time = {ratio:.2f} (target <= 4): "
        f"{'PASS' if ratio <= 4 else 'MISS'}"
    )
    for op in OPS[1:]:
        base = res[("first order", retro)][0]
        print(f"{bullet}{retro}: {op} temp / first-order temp = {res[(op, retro)][0] / base:.2f}")
    return {op: res[(op, retro)][0] for op in OPS}


def main(ns, carry, s, repeats, markdown):
    temps = {n: run_n(n, carry, s, repeats, markdown) for n in ns}
    if len(ns) > 1:
        print()
        print(
            "**retrograde temp memory against N (must not grow):**\n"
            if markdown
            else "retrograde temp memory against N (must not grow):"
        )
        for op in OPS:
            vals = ", ".join(f"N={n}: {temps[n][op]} B" for n in ns)
            print(f"{'- ' if markdown else '  '}{op}: {vals}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--ns",
        type=int,
        nargs="+",
        default=None,
        help="step counts (default 1000 10000; --quick: 10000)",
    )
    ap.add_argument(
        "--carry", type=int, default=None, help="carry size in float64 (default 500; --quick: 200)"
    )
    ap.add_argument("--snapshots", type=int, default=16, help="Revolve slots s (default 16)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats (3; 2 with --quick)")
    ap.add_argument("--quick", action="store_true", help="a ~1 minute version")
    ap.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    a = ap.parse_args()
    ns = a.ns or ([10_000] if a.quick else [1_000, 10_000])
    carry = a.carry or (200 if a.quick else 500)
    reps = a.repeats if a.repeats is not None else (2 if a.quick else 3)
    main(ns, carry, a.snapshots, reps, a.markdown)
