"""Diffrax adjoints on a neural ODE: CheckpointAdjoint vs RecursiveCheckpointAdjoint,
DirectAdjoint and BacksolveAdjoint.

Problem: an equinox MLP vector field (width 64, depth 2, tanh) on a batch of 64 two-dimensional
states, Tsit5, float64. Runs:

- ``const N`` for N in {1000, 4000}: constant steps, loss on the final state (``SaveAt(t1=True)``);
- ``adaptive``: PIDController(rtol=atol=1e-6), ``SaveAt(ts=...)`` at 100 times, max_steps 4096.

For each adjoint: first-order gradient w.r.t. the MLP (``grad``) and a Hessian-vector product
(``hvp``: d/dp <grad loss(p), v>, reverse over reverse; forward over reverse where that fails):
compile time, run time (best of the repeats after a warm-up; the adjoints of one row take turns
within each repeat, so that load from other processes affects them alike), XLA temp memory
(``memory_analysis().temp_size_in_bytes``) and relative error against DirectAdjoint (max abs
difference / max abs reference). A failing combination is reported with the first line of its
error. Skipped by default (``SKIP``, shown in the table with the reason; ``--no-skip`` runs
them): DirectAdjoint's HVP at N = 4000.

    python benchmarks/diffrax_adjoints.py            # N in {1000, 4000} + adaptive
    python benchmarks/diffrax_adjoints.py --quick    # N = 200 + adaptive (short interval)
    python benchmarks/diffrax_adjoints.py --markdown # a Markdown table
    python benchmarks/diffrax_adjoints.py --acceptance  # the issue's speed check, ~5 minutes

``--small`` runs issue #33's small adaptive ODE instead (4-dim state, 4-32-4 tanh MLP, Tsit5,
``PIDController(rtol=atol=1e-6)``, ``SaveAt`` at 50 times, ``max_steps=4096``, float64; the
problem of ``overhead.py``'s and ``compile_time.py``'s ``diffrax``/``node`` cases), and the same
with 1000 constant steps: the first-order gradient of CheckpointAdjoint, RecursiveCheckpoint and
DirectAdjoint, compiled, then called in turn (``--repeats`` rounds, default 41), each one's
minimum and median and its median's ratio to RecursiveCheckpoint's and DirectAdjoint's (target:
CheckpointAdjoint <= 1.0x RecursiveCheckpoint on the adaptive solve).

    python benchmarks/diffrax_adjoints.py --small   # ~1 minute

``--acceptance`` times the first-order gradient of ``CheckpointAdjoint`` against
``RecursiveCheckpointAdjoint`` at about 4000 steps, on the adaptive problem (``SaveAt(ts=...)``
at 100 times, ``max_steps`` 4096; the interval is chosen to take about 4000 steps, and the
number taken is printed) and on 4000 constant steps: many alternating repeats, then the minimum,
20th percentile and median of each and their ratios.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_ENABLE_X64", "1")

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from retrograde.diffrax import CheckpointAdjoint

from _common import prepare, print_table, time_round_robin

BATCH, DIM, WIDTH, DEPTH = 64, 2, 64, 2
T1 = 1.0


def make_problem():
    model = eqx.nn.MLP(DIM, DIM, WIDTH, DEPTH, activation=jnp.tanh, key=jr.PRNGKey(0))
    # Scale the last layer down so that long solves stay tame.
    model = eqx.tree_at(lambda m: m.layers[-1].weight, model, 0.5 * model.layers[-1].weight)
    y0 = jr.normal(jr.PRNGKey(1), (BATCH, DIM))
    return model, y0


def make_loss(static, y0, adjoint, run, with_steps=False):
    """The loss of one run (``("const", N)`` or ``("adaptive", T)``) as a function of the
    network's parameters; with ``with_steps``, also the number of steps the solve took."""
    kind, n = run
    if kind == "const":
        kw = dict(
            stepsize_controller=diffrax.ConstantStepSize(),
            dt0=T1 / n,
            max_steps=n,
            saveat=diffrax.SaveAt(t1=True),
        )
    else:
        kw = dict(
            stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6),
            dt0=0.01,
            max_steps=4096,
            saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, n, 100)),
        )
    t1 = T1 if kind == "const" else n

    def loss(params):
        model = eqx.combine(params, static)

        def vf(t, y, net):  # the network goes in as args (BacksolveAdjoint needs that)
            return jax.vmap(net)(y) - 0.1 * y

        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(vf), diffrax.Tsit5(), 0.0, t1, y0=y0, args=model, adjoint=adjoint, **kw
        )
        out = jnp.mean(sol.ys**2)
        return (out, sol.stats["num_steps"]) if with_steps else out

    return loss


ADJOINTS = {
    "CheckpointAdjoint": CheckpointAdjoint,
    "RecursiveCheckpoint": diffrax.RecursiveCheckpointAdjoint,
    "DirectAdjoint": diffrax.DirectAdjoint,
    "BacksolveAdjoint": diffrax.BacksolveAdjoint,
}


def derivative(loss, order, v):
    if order == "grad":
        return jax.grad(loss)

    def rev_rev(p):
        return jax.grad(
            lambda q: sum(
                jnp.vdot(a, b)
                for a, b in zip(
                    jax.tree_util.tree_leaves(jax.grad(loss)(q)), jax.tree_util.tree_leaves(v)
                )
            )
        )(p)

    return rev_rev


def flat(tree):
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree_util.tree_leaves(tree)])


def run_label(run):
    kind, n = run
    return f"const N={n}" if kind == "const" else f"adaptive T={n:g}"


# Combinations not run by default, with the reason shown in the table.
SKIP = {
    ("const", 4000, "hvp", "DirectAdjoint"): "skipped: stores all 4000 steps at second order; "
    "minutes to compile and run (its first-order row is the reference)",
}


# The acceptance runs: the adaptive problem on an interval that takes about 4000 steps, and
# 4000 constant steps.
ACCEPTANCE_RUNS = [("adaptive", 51500.0), ("const", 4000)]


def acceptance(repeats: int) -> None:
    """First-order gradient, CheckpointAdjoint against RecursiveCheckpointAdjoint, at about 4000
    steps: ``repeats`` alternating calls of each, then min / 20th percentile / median."""
    model, y0 = make_problem()
    params, static = eqx.partition(model, eqx.is_array)
    names = ("CheckpointAdjoint", "RecursiveCheckpoint")
    print(
        f"first-order gradient, {repeats} alternating repeats (seconds; ratio = "
        "CheckpointAdjoint / RecursiveCheckpoint)"
    )
    print("| run | steps | adjoint | min | p20 | median |")
    print("|---|---:|---|---:|---:|---:|")
    for run in ACCEPTANCE_RUNS:
        count = make_loss(static, y0, diffrax.RecursiveCheckpointAdjoint(), run, with_steps=True)
        steps = int(jax.jit(count)(params)[1])
        compiled = {
            name: prepare(jax.grad(make_loss(static, y0, ADJOINTS[name](), run)), params)[0]
            for name in names
        }
        stats = {
            name: _stats(v) for name, v in time_round_robin(compiled, (params,), repeats).items()
        }
        label = run_label(run)
        for name in names:
            print(
                f"| {label} | {steps} | {name} | "
                + " | ".join(f"{x:.3f}" for x in stats[name])
                + " |",
                flush=True,
            )
        ratio = [a / b for a, b in zip(*stats.values())]
        print(
            f"| {label} | {steps} | ratio | " + " | ".join(f"{x:.3f}" for x in ratio) + " |",
            flush=True,
        )
        del compiled


SMALL_RUNS = {
    "PIDController(1e-6), 50 saves": dict(
        t1=50.0, max_steps=4096, controller=lambda: diffrax.PIDController(rtol=1e-6, atol=1e-6)
    ),
    "1000 constant steps, 50 saves": dict(
        t1=10.0, max_steps=1000, controller=diffrax.ConstantStepSize
    ),
}


def small_loss(adjoint, t1, max_steps, controller, with_steps=False):
    """Issue #33's small adaptive ODE: ``y' = R y + 0.1 mlp(y)`` (``R`` two rotations, of
    frequencies 1 and 3), 4-dim state, the loss ``mean(ys**2)`` over 50 save times."""
    mlp = eqx.nn.MLP(4, 4, 32, 1, activation=jnp.tanh, key=jr.PRNGKey(0))
    params, static = eqx.partition(mlp, eqx.is_array)
    rot = jnp.asarray([[0, 1, 0, 0], [-1, 0, 0, 0], [0, 0, 0, 3], [0, 0, -3, 0]], jnp.float64)
    y0 = jnp.asarray([1.0, -0.5, 0.25, 0.8])

    def loss(p):
        net = eqx.combine(p, static)
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, a: rot @ y + 0.1 * net(y)),
            diffrax.Tsit5(),
            0.0,
            t1,
            0.01,
            y0,
            saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, t1, 50)),
            stepsize_controller=controller(),
            adjoint=adjoint,
            max_steps=max_steps,
        )
        out = jnp.mean(sol.ys**2)
        return (out, sol.stats["num_steps"]) if with_steps else out

    return loss, params


def small(repeats: int, markdown: bool) -> None:
    """The first-order gradient of the small ODE under each adjoint: times from one run (the
    adjoints take turns), ratios of medians to RecursiveCheckpoint and to DirectAdjoint."""
    names = ("CheckpointAdjoint", "RecursiveCheckpoint", "DirectAdjoint")
    rows = []
    for label, kw in SMALL_RUNS.items():
        count, params = small_loss(diffrax.RecursiveCheckpointAdjoint(), with_steps=True, **kw)
        steps = int(jax.jit(count)(params)[1])
        compiled, outs, compile_s = {}, {}, {}
        for name in names:
            c, out, c_s, _ = prepare(jax.grad(small_loss(ADJOINTS[name](), **kw)[0]), params)
            compiled[name], outs[name], compile_s[name] = c, flat(out), c_s
        times = time_round_robin(compiled, (params,), repeats)
        med = {name: float(np.median(v)) for name, v in times.items()}
        ref = outs["DirectAdjoint"]
        for name in names:
            err = float(np.max(np.abs(outs[name] - ref)) / np.max(np.abs(ref)))
            rows.append(
                [
                    f"{label} ({steps} steps)",
                    name,
                    f"{compile_s[name]:.1f}",
                    f"{1e3 * min(times[name]):.2f}",
                    f"{1e3 * med[name]:.2f}",
                    f"{med[name] / med['RecursiveCheckpoint']:.2f}",
                    f"{med[name] / med['DirectAdjoint']:.2f}",
                    f"{err:.1e}",
                ]
            )
    print_table(
        f"Small ODE, first-order gradient, {repeats} rounds (ms; ratios of medians)",
        [
            "run",
            "adjoint",
            "compile s",
            "min ms",
            "median ms",
            "/ Recursive",
            "/ Direct",
            "rel. error vs Direct",
        ],
        rows,
        markdown,
        left=2,
    )


def _stats(v):
    v = sorted(v)
    return v[0], v[len(v) // 5], float(np.median(v))


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="N = 200 and a short adaptive run")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--adjoints", default=",".join(ADJOINTS))
    ap.add_argument("--orders", default="grad,hvp")
    ap.add_argument("--no-skip", action="store_true", help="also run the combinations in SKIP")
    ap.add_argument(
        "--runs",
        default=None,
        help="e.g. const:1000,adaptive:5 (constant N steps / adaptive on [0, T])",
    )
    ap.add_argument(
        "--acceptance",
        action="store_true",
        help="time the first-order gradient against RecursiveCheckpoint at ~4000 steps",
    )
    ap.add_argument(
        "--small",
        action="store_true",
        help="issue #33's small adaptive ODE: first-order gradient against Recursive and Direct",
    )
    args = ap.parse_args()
    if args.small:
        small(args.repeats or 41, args.markdown)
        return
    if args.acceptance:
        acceptance(args.repeats or 9)
        return
    runs = (
        [("const", 200), ("adaptive", 2.0)]
        if args.quick
        else [("const", 1000), ("const", 4000), ("adaptive", 5.0)]
    )
    if args.runs:
        runs = [
            (k, int(v) if k == "const" else float(v))
            for k, v in (r.split(":") for r in args.runs.split(","))
        ]
    repeats = args.repeats or (1 if args.quick else 2)
    model, y0 = make_problem()
    params, static = eqx.partition(model, eqx.is_array)
    v = jax.tree_util.tree_map(
        lambda x: jnp.cos(jnp.arange(x.size, dtype=x.dtype)).reshape(x.shape), params
    )
    rows = []
    for run in runs:
        label = run_label(run)
        for order in args.orders.split(","):
            ref = None
            names = args.adjoints.split(",")
            # the reference first
            names = sorted(names, key=lambda n: n != "DirectAdjoint")
            results, compiled = {}, {}
            for name in names:
                if (*run, order, name) in SKIP and not args.no_skip:
                    results[name] = (None, None, None, None, SKIP[(*run, order, name)])
                    continue
                loss = make_loss(static, y0, ADJOINTS[name](), run)
                try:
                    c, out, c_s, temp = prepare(derivative(loss, order, v), params)
                except Exception as e:  # noqa: BLE001 - reported in the table
                    msg = (
                        str(e).strip().splitlines()[0][:70] if str(e).strip() else type(e).__name__
                    )
                    results[name] = (None, None, None, None, f"fails: {type(e).__name__}: {msg}")
                    continue
                compiled[name] = c
                if name == "DirectAdjoint":
                    ref = flat(out)
                results[name] = (flat(out), c_s, None, temp, "")
            for name, ts in time_round_robin(compiled, (params,), repeats).items():
                out, c_s, _, temp, note = results[name]
                results[name] = (out, c_s, min(ts), temp, note)
            del compiled
            for name in args.adjoints.split(","):
                out, c_s, r_s, temp, note = results[name]
                err = None
                if out is not None and ref is not None:
                    err = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
                rows.append((label, order, name, c_s, r_s, temp, err, note))
                print_row(rows[-1], markdown=False, flush=not args.markdown)
    if args.markdown:
        print()
        print(
            "| run | derivative | adjoint | compile s | run s | temp MiB "
            "| rel. error vs Direct | note |"
        )
        print("|---|---|---|---:|---:|---:|---:|---|")
        for row in rows:
            print_row(row, markdown=True)


def fmt(x, f):
    return "-" if x is None else f.format(x)


def print_row(row, markdown, flush=True):
    label, order, name, c_s, r_s, temp, err, note = row
    cells = [
        label,
        order,
        name,
        fmt(c_s, "{:.1f}"),
        fmt(r_s, "{:.3f}"),
        fmt(None if temp is None else temp / 2**20, "{:.2f}"),
        fmt(err, "{:.1e}"),
        note,
    ]
    if markdown:
        print("| " + " | ".join(cells) + " |")
    else:
        print(
            "{:<16} {:<5} {:<20} compile {:>6}s run {:>7}s temp {:>8} MiB err {:>8} {}".format(
                *cells
            ),
            flush=flush,
        )


if __name__ == "__main__":
    main()
