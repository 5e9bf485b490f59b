"""Trace and compile time of derivatives through our loops and their peers, each in a fresh process.

The compile targets of issue #33, measured (no target is asserted; the last table prints each
ratio beside its limit). Cases (``--cases``), each at every derivative order (``--orders``:
``grad`` the first-order gradient, ``hvp`` ``jax.jvp`` of it, ``gradgrad`` the gradient in the
parameters of the squared norm of the gradient in the initial state, "two-level") that the
peer supports:

- ``scan``: ``N = 1000`` steps of an MLP step ``u + 0.01 W2 tanh(W1 u + b1)`` (32-dim state,
  64 hidden, float64), derivatives in ``(W1, b1, W2)`` (and ``u0``);
  ``retrograde.scan`` (default schedule) against ``jax.lax.scan`` and nested remat (sqrt(N) x
  sqrt(N), ``_common.nested_remat``);
- ``while``: ``retrograde.while_loop`` (default ``Online(16)``) over 500 steps of
  ``u + 0.01 tanh(W u)`` (64-dim state), the step count a traced condition, against
  ``jax.lax.fori_loop(0, 500, ...)``;
- ``node``: a small neural ODE (4-dim state, 4-32-4 tanh MLP, Tsit5, ``PIDController(rtol=1e-6,
  atol=1e-6)``, ``SaveAt`` at 50 times, ``max_steps=4096``; ``overhead.py``'s ``diffrax`` case):
  ``retrograde.diffrax.CheckpointAdjoint`` against ``RecursiveCheckpointAdjoint`` (first order
  only: its loop cannot be differentiated again) and ``DirectAdjoint``.

Each function is measured in its own process (``--child``): JAX's backend and the libraries are
warmed up first, then ``jax.jit(f).trace(*args)`` (the jaxpr), ``.lower()`` (StableHLO: our
primitives trace their sweeps here, in their lowering rules) and ``.compile()`` (XLA) are timed
apart. "trace s" below is ``jit(f).lower(*args)`` (jaxpr and lowering), the issue's split.

Structural counts, per function: ``tanh`` ops (the step's only transcendental, so each is a copy
of the step's evaluation: forward, recomputation or linearization) in the lowered StableHLO
and in XLA's optimized HLO (``compiled.as_text()``: fused computations and loop bodies, after
XLA's simplifications), and ``while`` loops in each. With ``--sites`` our functions also count,
while lowering, which function of ``retrograde.loops`` evaluates the step's jaxpr (a wrapper
around ``Body.runner``, a private method, in the child only): the copies of the step each
loop of the sweeps holds.

    python benchmarks/compile_time.py                    # every case and order; ~2 min on 2 cores
    python benchmarks/compile_time.py --quick            # first order only; ~1 min
    python benchmarks/compile_time.py --markdown --sites # markdown, with the copies per site
    python benchmarks/compile_time.py --cases node --orders grad,gradgrad
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time

MiB = 2**20
CASES = ("scan", "while", "node")
ORDERS = ("grad", "hvp", "gradgrad")
# case -> (methods, {order: methods that support it}); the first method is ours
METHODS = {
    "scan": ("retrograde.scan", "lax.scan", "nested remat"),
    "while": ("retrograde.while_loop", "lax.fori_loop"),
    "node": ("CheckpointAdjoint", "RecursiveCheckpointAdjoint", "DirectAdjoint"),
}
UNSUPPORTED = {("RecursiveCheckpointAdjoint", "hvp"), ("RecursiveCheckpointAdjoint", "gradgrad")}
# The targets: (case, order) -> (peer, limit) on trace + compile
TARGETS = {
    ("scan", "grad"): ("lax.scan", 1.3),
    ("scan", "hvp"): ("lax.scan", 1.3),
    ("scan", "gradgrad"): ("lax.scan", 1.3),
    ("while", "grad"): ("lax.fori_loop", 2.0),
    ("while", "hvp"): ("lax.fori_loop", 2.0),
    ("while", "gradgrad"): ("lax.fori_loop", 2.0),
    ("node", "grad"): ("RecursiveCheckpointAdjoint", 1.2),
    ("node", "hvp"): ("DirectAdjoint", 1.0),
    ("node", "gradgrad"): ("DirectAdjoint", 1.0),
}


# ------------------------------------------------------------------------------ the problems
def _derivatives(order, loss, theta, u0, jnp, jax):
    """``(f, args)`` of one derivative order of ``loss(theta, u0)``."""
    if order == "grad":
        return jax.grad(loss, (0, 1)), (theta, u0)
    if order == "hvp":
        v = jax.tree.map(lambda x: 0.5 * jnp.ones_like(x), theta)
        grad = lambda th, u: jax.grad(loss)(th, u)
        return (lambda th, u, v: jax.jvp(lambda t: grad(t, u), (th,), (v,))[1]), (theta, u0, v)

    def two_level(th, u):
        g = jax.grad(loss, 1)(th, u)
        return sum(jnp.sum(x**2) for x in jax.tree.leaves(g))

    return jax.grad(two_level), (theta, u0)


def problem(case, method, order):
    """``(f, args)``: the function to trace and compile and its arguments."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    if case == "scan":
        import retrograde

        from _common import nested_remat

        n, d, h = 1000, 32, 64
        theta = dict(
            w1=jnp.asarray(rng.standard_normal((h, d)) / np.sqrt(d)),
            b1=jnp.asarray(0.1 * rng.standard_normal(h)),
            w2=jnp.asarray(rng.standard_normal((d, h)) / np.sqrt(h)),
        )
        u0 = jnp.asarray(rng.standard_normal(d))
        run = {
            "retrograde.scan": lambda f, u: retrograde.scan(f, u, length=n)[0],
            "lax.scan": lambda f, u: jax.lax.scan(f, u, length=n)[0],
            "nested remat": lambda f, u: nested_remat(f, u, n),
        }[method]

        def loss(p, u):
            step = lambda u, _: (u + 0.01 * p["w2"] @ jnp.tanh(p["w1"] @ u + p["b1"]), None)
            return jnp.sum(run(step, u) ** 2)

        return _derivatives(order, loss, theta, u0, jnp, jax)
    if case == "while":
        import retrograde

        n, d = 500, 64
        w = jnp.asarray(rng.standard_normal((d, d)) / np.sqrt(d))
        u0 = jnp.asarray(rng.standard_normal(d))

        def loss(w, u):
            body = lambda u: u + 0.01 * jnp.tanh(w @ u)
            if method == "lax.fori_loop":
                out = jax.lax.fori_loop(0, n, lambda i, u: body(u), u)
            else:
                out = retrograde.while_loop(
                    lambda c: c[0] < n, lambda c: (c[0] + 1, body(c[1])), (0, u)
                )[1]
            return jnp.sum(out**2)

        return _derivatives(order, loss, w, u0, jnp, jax)
    # node
    import diffrax
    import equinox as eqx

    from retrograde.diffrax import CheckpointAdjoint

    adjoint = {
        "CheckpointAdjoint": CheckpointAdjoint,
        "RecursiveCheckpointAdjoint": diffrax.RecursiveCheckpointAdjoint,
        "DirectAdjoint": diffrax.DirectAdjoint,
    }[method]()
    mlp = eqx.nn.MLP(4, 4, 32, 1, activation=jnp.tanh, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(mlp, eqx.is_array)
    rot = jnp.asarray([[0, 1, 0, 0], [-1, 0, 0, 0], [0, 0, 0, 3], [0, 0, -3, 0]], jnp.float64)
    y0 = jnp.asarray([1.0, -0.5, 0.25, 0.8])

    def loss(p, y0):
        net = eqx.combine(p, static)
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, a: rot @ y + 0.1 * net(y)),
            diffrax.Tsit5(),
            0.0,
            50.0,
            0.01,
            y0,
            saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, 50.0, 50)),
            stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6),
            adjoint=adjoint,
            max_steps=4096,
        )
        return jnp.mean(sol.ys**2)

    if order == "grad":  # in the network only, as overhead.py's case
        return jax.grad(loss), (params, y0)
    return _derivatives(order, loss, params, y0, jnp, jax)


# ------------------------------------------------------------------------------ the child
def watch_sites():
    """Count, while lowering, which function of ``retrograde.loops`` evaluates a step's jaxpr:
    wrap ``Body.runner`` (private; in this child process only). Returns the counter."""
    import inspect

    from retrograde.loops import _body

    sites: collections.Counter = collections.Counter()
    plain = _body.Body.runner
    loops_dir = os.path.dirname(_body.__file__)
    helpers = {"one", "f", "run", "step", "traced", "fun", "<lambda>"}

    def runner(self, batched=False):
        run = plain(self, batched)

        def traced(*args):
            """The chain of ``retrograde.loops`` functions that called, innermost first, up
            to the second that is not a small helper (a loop body, a lambda)."""
            names, module, named = [], "?", 0
            for frame in inspect.stack()[1:60]:
                if os.path.dirname(frame.filename) != loops_dir:
                    continue
                if not names:
                    module = os.path.basename(frame.filename)[:-3]
                names.append(frame.function)
                named += frame.function not in helpers
                if named == 2:
                    break
            sites[f"{module}: {' < '.join(names)}"] += 1
            return run(*args)

        return traced

    _body.Body.runner = runner
    return sites


def child(case, method, order, sites):
    """Trace, lower and compile one function; print one JSON line."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import retrograde.loops  # imported before timing: imports are not tracing

    if case == "node":
        import diffrax  # noqa: F401

        import retrograde.diffrax  # noqa: F401
    jax.block_until_ready(jax.jit(lambda x: jnp.tanh(x) + 1)(jnp.ones(3)))  # the backend
    fn, args = problem(case, method, order)
    watched = watch_sites() if sites and method == METHODS[case][0] else None
    t0 = time.perf_counter()
    traced = jax.jit(fn).trace(*args)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    low, opt = lowered.as_text(), compiled.as_text()
    out = dict(
        trace=t1 - t0,
        lower=t2 - t1,
        compile=t3 - t2,
        tanh_lowered=len(re.findall(r"stablehlo\.tanh", low)),
        tanh_compiled=len(re.findall(r"[ )]tanh\(", opt)),
        while_lowered=len(re.findall(r"stablehlo\.while", low)),
        while_compiled=len(re.findall(r"[ )]while\(", opt)),
        hlo_lines=opt.count("\n"),
    )
    if watched is not None:
        out["sites"] = dict(watched)
    print(json.dumps(out))


def run_child(case, method, order, sites, timeout):
    """:func:`child` in a fresh process: its dict, or a string saying why not."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", case, method, order]
    if sites:
        cmd.append("--sites")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timeout ({timeout:.0f} s)"
    if proc.returncode != 0:
        return f"failed: {(proc.stderr.strip().splitlines() or ['?'])[-1][:100]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------ tables
def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def total(r):
    return None if isinstance(r, str) or r is None else r["trace"] + r["lower"] + r["compile"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"subset of {','.join(CASES)}")
    ap.add_argument("--orders", default=None, help=f"subset of {','.join(ORDERS)} (default all)")
    ap.add_argument("--quick", action="store_true", help="first order only")
    ap.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    ap.add_argument("--sites", action="store_true", help="also count the step's copies per site")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per process (600)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(*a.child, a.sites)
        return 0
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _common import print_table

    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    orders = [o.strip() for o in (a.orders or ("grad" if a.quick else ",".join(ORDERS))).split(",")]
    bad = [c for c in cases if c not in CASES] + [o for o in orders if o not in ORDERS]
    if bad:
        ap.error(f"unknown {bad}; cases {list(CASES)}, orders {list(ORDERS)}")
    if "node" in cases:
        try:
            import diffrax  # noqa: F401
            import equinox  # noqa: F401
        except ImportError:
            print("skipped node: diffrax is not installed; pip install 'retrograde[bench]'")
            cases.remove("node")
    t_start = time.perf_counter()
    res = {}
    for case in cases:
        for order in orders:
            for method in METHODS[case]:
                if (method, order) in UNSUPPORTED:
                    continue
                r = run_child(case, method, order, a.sites, a.timeout)
                res[case, order, method] = r
                detail = r if isinstance(r, str) else f"{total(r):.2f} s"
                print(f"  {case} {order} {method}: {detail}", flush=True)

    rows = []
    for (case, order, method), r in res.items():
        peer = TARGETS[case, order][0]
        ref = res.get((case, order, peer))
        if isinstance(r, str):
            rows.append([case, order, method, r, *[""] * 10])
            continue
        rows.append(
            [
                case,
                order,
                method,
                fmt(r["trace"]),
                fmt(r["lower"]),
                fmt(r["compile"]),
                fmt(total(r)),
                fmt(total(r) / total(ref) if total(ref) else None),
                str(r["tanh_lowered"]),
                str(r["tanh_compiled"]),
                str(r["while_lowered"]),
                str(r["while_compiled"]),
                f"{r['hlo_lines']:,}",
            ]
        )
    print_table(
        "Trace and compile time, each in a fresh process (seconds; jaxpr, lowering, XLA); "
        "structural counts of the lowered and the optimized program",
        [
            "case",
            "order",
            "method",
            "jaxpr s",
            "lower s",
            "compile s",
            "total s",
            "/ peer",
            "tanh lowered",
            "tanh compiled",
            "while lowered",
            "while compiled",
            "HLO lines",
        ],
        rows,
        a.markdown,
        left=3,
    )

    targets = []
    for (case, order), (peer, limit) in TARGETS.items():
        ours = res.get((case, order, METHODS[case][0]))
        theirs = res.get((case, order, peer))
        if ours is None or theirs is None:
            continue
        ratio = total(ours) / total(theirs) if total(ours) and total(theirs) else None
        split = (
            f"trace {ours['trace'] + ours['lower']:.2f} vs "
            f"{theirs['trace'] + theirs['lower']:.2f} s, compile {ours['compile']:.2f} vs "
            f"{theirs['compile']:.2f} s"
            if ratio is not None
            else "-"
        )
        verdict = "-" if ratio is None else ("PASS" if ratio <= limit else "MISS")
        targets.append([case, order, f"/ {peer}", fmt(ratio), f"{limit:g}", verdict, split])
    print_table(
        "Targets of issue #33 (trace + compile)",
        ["case", "order", "ratio of", "ratio", "limit", "verdict", "detail"],
        targets,
        a.markdown,
        left=3,
    )

    if a.sites:
        site_rows = []
        for (case, order, _method), r in res.items():
            if isinstance(r, str) or "sites" not in r:
                continue
            for site, count in sorted(r["sites"].items(), key=lambda kv: -kv[1]):
                site_rows.append([case, order, site, str(count)])
        print_table(
            "Where our lowering evaluates the step's jaxpr (one count per copy in the program)",
            ["case", "order", "site (innermost first)", "copies"],
            site_rows,
            a.markdown,
            left=3,
        )
    print(f"\nTotal {time.perf_counter() - t_start:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
