"""Eager (un-jitted) ``jax.grad`` of a loop whose step closure is created anew on each call: the
item of issue #33 "eager calls with a re-created closure cost no more than eager ``lax.scan``'s".

The loss builds its step as ``lambda u, _: (stepper(params, u), None)`` inside, so every call
passes the loop a new function object (which the first cache level, keyed on the function's
identity, cannot recognise) closing over new parameter values. Cases (``--cases``), each
``N = 1000`` steps (``--steps``), float64, gradient in the parameters:

- ``mlp``: ``u + dt * W2 @ tanh(W1 @ u + b1)``, a 32-dim state, 64 hidden units;
- ``pde``: an explicit step of the 1D viscous Burgers equation on 128 periodic points (central
  differences, ``jnp.roll``), gradient in the viscosity and the initial state.

Compared: ``retrograde.scan`` (default schedule), eager ``jax.lax.scan``, and eager ``lax.scan``
of ``jax.checkpoint(step)``. Each takes a first call, then ``--calls`` more (default 5) with
other parameter values, the three taking turns within each round so that a busy machine slows
them alike; the table gives the first call's time, the median of the others, XLA compilations
per later call (``jax.monitoring``'s backend-compile events) and the ratio of medians to
``lax.scan``'s. Target: ``retrograde.scan`` at most 1.2x eager ``lax.scan`` per call (PASS/FAIL).
Gradients are checked against ``lax.scan``'s (relative error column).

    python benchmarks/eager_closure.py             # both cases, about a minute on 2 cores
    python benchmarks/eager_closure.py --cases mlp --calls 9 --markdown
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import retrograde

from _common import print_table

jax.config.update("jax_enable_x64", True)

TARGET = 1.2
EVENT = "/jax/core/compile/backend_compile_duration"


def mlp_case(n: int):
    d, h, dt = 32, 64, 0.05
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {
        "W1": jax.random.normal(k1, (h, d)) / np.sqrt(d),
        "b1": 0.1 * jax.random.normal(k2, (h,)),
        "W2": jax.random.normal(k3, (d, h)) / np.sqrt(h),
    }
    u0 = jnp.linspace(-1.0, 1.0, d)

    def stepper(p, u):
        return u + dt * p["W2"] @ jnp.tanh(p["W1"] @ u + p["b1"])

    def perturb(p, k):
        return jax.tree_util.tree_map(lambda a: a * (1.0 + 0.01 * k), p)

    return stepper, params, u0, perturb


def pde_case(n: int):
    m = 128
    dx = 2 * np.pi / m
    x = jnp.arange(m) * dx
    dt = 0.2 * dx * dx / 0.1  # explicit diffusion limit for nu <= 0.1 (and |u| <= 1)
    params = {"nu": jnp.float64(0.05), "u0": 0.5 * jnp.sin(x)}

    def stepper(p, u):
        up, um = jnp.roll(u, -1), jnp.roll(u, 1)
        return u + dt * (p["nu"] * (up - 2 * u + um) / dx**2 - u * (up - um) / (2 * dx))

    def perturb(p, k):
        return {"nu": p["nu"] * (1.0 + 0.01 * k), "u0": p["u0"] * (1.0 + 0.01 * k)}

    return stepper, params, params["u0"], perturb


CASES = {"mlp": mlp_case, "pde": pde_case}


def make_losses(stepper, u0, n: int, has_u0: bool):
    """The three losses: each builds its step closure anew on every call."""

    def start(p):
        return p["u0"] if has_u0 else u0

    def loss_retrograde(p):
        u, _ = retrograde.scan(lambda u, _: (stepper(p, u), None), start(p), length=n)
        return jnp.sum(u**2)

    def loss_lax(p):
        u, _ = jax.lax.scan(lambda u, _: (stepper(p, u), None), start(p), length=n)
        return jnp.sum(u**2)

    def loss_remat(p):
        u, _ = jax.lax.scan(jax.checkpoint(lambda u, _: (stepper(p, u), None)), start(p), length=n)
        return jnp.sum(u**2)

    return {
        "retrograde.scan": loss_retrograde,
        "lax.scan": loss_lax,
        "lax.scan(checkpoint)": loss_remat,
    }


class Compiles:
    """Counts XLA compilations while active."""

    def __init__(self):
        self.n = 0

    def _listen(self, event, duration, **kwargs):
        if event == EVENT:
            self.n += 1

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listen)


def rel_err(a, b) -> float:
    a, b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    num = max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(a, b))
    den = max(float(jnp.max(jnp.abs(y))) for y in b)
    return num / den


def run_case(name: str, n: int, calls: int, markdown: bool) -> bool:
    stepper, params, u0, perturb = CASES[name](n)
    losses = make_losses(stepper, u0, n, has_u0="u0" in params)
    grads = {k: jax.grad(f) for k, f in losses.items()}
    times: dict = {k: [] for k in grads}
    compiles: dict = {k: [] for k in grads}
    errors: dict = {k: 0.0 for k in grads}
    for r in range(calls + 1):  # round 0: the first calls
        p = perturb(params, r)
        outs = {}
        for k, g in grads.items():
            with Compiles() as c:
                t = time.perf_counter()
                outs[k] = jax.block_until_ready(g(p))
                times[k].append(time.perf_counter() - t)
            compiles[k].append(c.n)
        for k in grads:
            errors[k] = max(errors[k], rel_err(outs[k], outs["lax.scan"]))
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    rows = [
        [
            k,
            f"{v[0]:.3f}",
            f"{med[k] * 1e3:.1f}",
            f"{statistics.mean(compiles[k][1:]):.1f}",
            f"{med[k] / med['lax.scan']:.3f}",
            f"{errors[k]:.1e}",
        ]
        for k, v in times.items()
    ]
    print_table(
        f"{name}: eager jax.grad, step closure re-created per call, N = {n}, "
        f"median of {calls} calls after the first",
        ["loop", "first call s", "per call ms", "compiles/call", "x lax.scan", "rel. err"],
        rows,
        markdown,
    )
    ratio = med["retrograde.scan"] / med["lax.scan"]
    ok = ratio <= TARGET
    print(
        f"{'PASS' if ok else 'FAIL'}: retrograde.scan {ratio:.3f}x eager lax.scan per call "
        f"(target <= {TARGET}x); {med['retrograde.scan'] / med['lax.scan(checkpoint)']:.3f}x "
        "lax.scan(checkpoint)"
    )
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}")
    results = [run_case(c, args.steps, args.calls, args.markdown) for c in args.cases.split(",")]
    print("\nall targets met" if all(results) else "\nsome targets missed")


if __name__ == "__main__":
    main()
