"""Test problems for ``retrograde.scan`` / ``retrograde.fori_loop``, and comparison helpers.

The main problem is a random nonlinear step with

- a pytree carry ``{"u": (M,), "v": (scalar, (2,)), "n": int32 counter}`` (the counter enters the
  step but gets no derivative),
- per-step inputs ``xs = {"a": (N,), "b": (N, M)}``,
- per-step outputs ``ys = (scalar, (M,))``,
- closed-over parameters ``p = {"W": (M, M), "c": scalar}`` captured by the step's closure.

Every loop is written once against a ``scan`` argument, so the same code runs through
``jax.lax.scan`` (the unbounded-memory reference) and ``retrograde.scan``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import retrograde
from retrograde import schedules as rs

from .._compare import assert_close, rel_err  # noqa: F401 (the suite's one comparison)

M = 3  # size of the vector carry leaf
DT = 0.1


# --------------------------------------------------------------------------- compilation

# XLA's CPU compile time dominates these tests. Correctness tests compile with the backend
# optimisation level 0 and without the new fusion emitters (about 3x faster to compile; the
# reference is compiled the same way). Memory and count tests use the default options.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def jit(fun, **kwargs):
    """``jax.jit`` with the fast-compile options (falls back to plain jit if unsupported)."""
    try:
        return jax.jit(fun, compiler_options=FAST_COMPILE, **kwargs)
    except TypeError:  # pragma: no cover - older jax without compiler_options
        return jax.jit(fun, **kwargs)


# --------------------------------------------------------------------------- schedules


def offline_schedules():
    """Every offline schedule under test as ``(id, schedule)``."""
    return [
        ("Revolve1", rs.Revolve(1)),
        ("Revolve3", rs.Revolve(3)),
        ("StoreAll", rs.StoreAll()),
        ("RecomputeAll", rs.RecomputeAll()),
        ("Periodic3", rs.Periodic(3)),
        ("MultiLevel2+3", rs.MultiLevel([rs.Level(2), rs.Level(3)])),
    ]


# --------------------------------------------------------------------------- the problem


def params(seed: int = 0):
    rng = np.random.default_rng(seed)
    return {
        "W": jnp.asarray(rng.standard_normal((M, M)) / np.sqrt(M)),
        "c": jnp.float64(0.8 + 0.1 * rng.standard_normal()),
    }


def init(seed: int = 1):
    rng = np.random.default_rng(seed)
    return {
        "u": jnp.asarray(0.5 * rng.standard_normal(M)),
        "v": (
            jnp.float64(0.3 + 0.1 * rng.standard_normal()),
            jnp.asarray(0.2 * rng.standard_normal(2)),
        ),
        "n": jnp.int32(0),
    }


def xs(n: int, seed: int = 2):
    rng = np.random.default_rng(seed)
    return {
        "a": jnp.asarray(1.0 + 0.3 * rng.standard_normal(n)),
        "b": jnp.asarray(0.2 * rng.standard_normal((n, M))),
    }


def make_step(p):
    """The step, closing over the parameters ``p`` (a pytree of arrays, possibly tracers)."""

    def step(carry, x):
        u, (v0, v1), n = carry["u"], carry["v"], carry["n"]
        phase = jnp.where(n % 2 == 0, 1.0, -0.5)  # the int counter enters the step
        h = jnp.tanh(p["W"] @ u + x["b"]) * x["a"]
        u_new = u + DT * (h - 0.3 * u * v0 + phase * 0.05 * jnp.sin(jnp.sum(v1)))
        v0_new = v0 + DT * (p["c"] * jnp.cos(u[0]) - 0.5 * v0**3)
        v1_new = v1 + DT * jnp.sin(v1[::-1] * p["c"] + u[:2]) * 0.5
        y = (jnp.sum(u_new * u_new) * v0_new, jnp.exp(-0.5 * u_new) * x["a"])
        return {"u": u_new, "v": (v0_new, v1_new), "n": n + 1}, y

    return step


def run(scan, p, c0, xs_):
    """The loop through ``scan`` (``jax.lax.scan`` or a schedule-bound ``retrograde.scan``)."""
    return scan(make_step(p), c0, xs_)


def loss(scan, p, c0, xs_):
    """A scalar function of every float output of the loop."""
    carry, (y0, y1) = run(scan, p, c0, xs_)
    w = jnp.arange(1, y1.shape[0] + 1, dtype=jnp.float64)[:, None] if y1.ndim == 2 else 1.0
    return (
        jnp.sum(carry["u"] ** 3)
        + carry["v"][0] ** 2
        + jnp.sum(jnp.cos(carry["v"][1]))
        + 0.1 * jnp.sum(y0)
        + 0.01 * jnp.sum(w * y1**2)
        + 0.0 * carry["n"]
    )


def rscan(schedule):
    """``retrograde.scan`` with a fixed schedule, in the signature of ``jax.lax.scan``."""
    return functools.partial(retrograde.scan, schedule=schedule)


def lax_scan(f, c0, xs_=None, length=None):
    return jax.lax.scan(f, c0, xs_, length=length)


# --------------------------------------------------------------------------- comparisons


def float_leaves(tree):
    return [
        np.asarray(x)
        for x in jax.tree_util.tree_leaves(tree)
        if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)
    ]


# --------------------------------------------------------------------------- a smaller problem
# (for higher-order derivatives, whose programs are large to compile)


def small_params(seed: int = 3):
    rng = np.random.default_rng(seed)
    return {"a": jnp.asarray(1.0 + 0.2 * rng.standard_normal(2)), "b": jnp.float64(0.6)}


def small_u0(seed: int = 4):
    rng = np.random.default_rng(seed)
    return jnp.asarray(0.4 + 0.2 * rng.standard_normal(2))


def small_xs(n: int, seed: int = 5):
    rng = np.random.default_rng(seed)
    return jnp.asarray(1.0 + 0.3 * rng.standard_normal(n))


def small_step(p):
    """Carry ``{"u": (2,), "k": int32}``, scalar x, ys ``{"e": scalar, "f": (2,)}``; closes over
    the parameters ``p = {"a": (2,), "b": scalar}``."""

    def step(carry, x):
        u, k = carry["u"], carry["k"]
        s = jnp.where(k % 2 == 0, 1.0, 0.5)
        u_new = u + DT * (jnp.sin(p["a"] * u[::-1]) * x + s * p["b"] * u**2 - 0.2 * u**3)
        return {"u": u_new, "k": k + 1}, {"e": jnp.sum(u_new) ** 2 * x, "f": u_new * p["b"]}

    return step


def small_loss(scan, p, u0, xs_):
    """Scalar function of the loop's float outputs, of the parameters ``p``, ``u0`` and ``xs``."""
    carry, ys = scan(small_step(p), {"u": u0, "k": jnp.int32(0)}, xs_)
    return jnp.sum(carry["u"] ** 3) + 0.3 * jnp.sum(ys["e"]) + jnp.sum(jnp.cos(ys["f"]))
