"""``jax.lax`` semantics of the front ends ``retrograde.scan`` / ``fori_loop`` / ``while_loop``,
each compared against ``jax.lax`` itself:

- ``scan(reverse=True)``: values and derivatives (grad, jvp, vmap, hessian) to 1e-12 in float64,
  evaluation counts those of the schedule;
- ``unroll``: validated as in ``jax.lax``, results and counts unchanged;
- weak types: result dtypes and weak types as in ``jax.lax`` (weakly typed initial leaves take the
  step's type), in the default and in the strict configurations;
- a step returning a list ``[carry, y]``;
- errors of the same types as ``jax.lax``'s, naming the offending carry leaf by its path;
- the eager cache: a second un-jitted call with the same step neither traces nor compiles; a
  step re-created per call (a new closure of the same code and constant types) compiles nothing
  again, and a step holding functions (``custom_jvp`` rules, callbacks) is never shared;
- ``fori_loop`` with traced bounds: a reverse-differentiable ``while_loop``.
- carry leaves without a tangent (by the JVP's fixed point) are not differentiated in the reverse
  sweep either, as in ``jax.lax``: a step may refuse a derivative with respect to them.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import re
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import retrograde
from retrograde import schedules as rs
from retrograde.loops import _intern
from retrograde.loops._carry import step_cache

from . import _problems as P

RTOL = 1e-12
MODES = {
    "default": contextlib.nullcontext,
    "rank_raise": lambda: jax.numpy_rank_promotion("raise"),
    "strict_x64": lambda: _strict_x64(),
}


@contextlib.contextmanager
def _strict_x64():
    with jax.enable_x64(True), jax.numpy_dtype_promotion("strict"):
        yield


def _types(tree):
    """``(dtype, weak_type, shape)`` of every leaf (``jax.lax`` may hand back a Python scalar for
    a carry its step forwards unchanged: it is typed as JAX types it)."""
    return [
        (str(a.dtype), bool(a.weak_type), a.shape)
        for a in map(jnp.asarray, jax.tree_util.tree_leaves(tree))
    ]


def _outcome(fun):
    """``("ok", value)`` or ``("error", exception)``."""
    try:
        return "ok", fun()
    except Exception as e:  # noqa: BLE001 - compared against jax.lax's outcome
        return "error", e


def _same_as_lax(make, mode="default"):
    """Run ``make(module)`` through ``jax.lax`` and ``retrograde`` in ``mode``: both give the same
    values (to RTOL), dtypes and weak types, or both raise the same type of exception. Returns the
    retrograde outcome."""
    with MODES[mode]():
        ref = _outcome(lambda: make(lax))
        got = _outcome(lambda: make(retrograde))
    if ref[0] == "error":
        assert got[0] == "error", f"jax.lax raised {ref[1]!r}, retrograde returned {got[1]}"
        assert type(got[1]) is type(ref[1]), (ref[1], got[1])
        return got
    assert got[0] == "ok", f"retrograde raised {got[1]!r}; jax.lax returned {ref[1]}"
    assert _types(got[1]) == _types(ref[1])
    P.assert_close(
        jax.tree_util.tree_map(jnp.asarray, got[1]),
        jax.tree_util.tree_map(jnp.asarray, ref[1]),
        RTOL,
    )
    return got


# ----------------------------------------------------------------------------- reverse


def _reverse_program(scan):
    """Primal, grad, jvp and vmap of the small problem scanned in reverse, in one program."""
    loss = functools.partial(P.small_loss, functools.partial(scan, reverse=True))

    def prog(p, u0, xs):
        primal = scan(P.small_step(p), {"u": u0, "k": jnp.int32(0)}, xs, reverse=True)
        g = jax.grad(loss, argnums=(0, 1, 2))(p, u0, xs)
        tangents = (jax.tree_util.tree_map(lambda a: 0.5 * a, p), u0[::-1], xs * 0.1)
        t = jax.jvp(loss, (p, u0, xs), tangents)
        v = jax.vmap(lambda u: loss(p, u, xs))(jnp.stack([u0, 1.5 * u0]))
        # No xs (nothing to reverse) but stacked ys.
        none = scan(lambda c, _: (jnp.sin(c) + p["b"], c), u0, None, 4, reverse=True)
        return primal, g, t, v, none

    return P.jit(prog)


@pytest.mark.parametrize(
    "schedule, mode",
    [
        (rs.Revolve(2), "default"),
        (rs.StoreAll(), "default"),
        (rs.Revolve(2), "rank_raise"),
        (rs.Revolve(2), "strict_x64"),
    ],
    ids=["Revolve2", "StoreAll", "Revolve2-rank_raise", "Revolve2-strict_x64"],
)
def test_reverse_matches_lax(schedule, mode):
    args = (P.small_params(), P.small_u0(), P.small_xs(7))
    with MODES[mode]():
        ref = _reverse_program(jax.lax.scan)(*args)
        got = _reverse_program(functools.partial(retrograde.scan, schedule=schedule))(*args)
    P.assert_close(got, ref, RTOL, "reverse scan")


def test_reverse_hessian_matches_lax():
    p, u0, xs = P.small_params(), P.small_u0(), P.small_xs(5)

    def hess(scan):
        loss = functools.partial(P.small_loss, functools.partial(scan, reverse=True))
        return P.jit(jax.hessian(lambda u: loss(p, u, xs)))(u0)

    P.assert_close(
        hess(functools.partial(retrograde.scan, schedule=rs.Revolve(2))),
        hess(jax.lax.scan),
        RTOL,
        "hessian",
    )


CALLS: list[int] = []


def _count(fun, *args) -> int:
    CALLS.clear()
    jax.block_until_ready(fun(*args))
    jax.effects_barrier()
    return len(CALLS)


def _counted_loss(schedule, reverse, unroll, theta, u0):
    def step(u, x):
        jax.debug.callback(lambda: CALLS.append(1), ordered=False)
        return u + 0.1 * jnp.sin(theta * u) * x, jnp.sum(u)

    xs = jnp.linspace(0.5, 1.5, 12)
    u, ys = retrograde.scan(step, u0, xs, reverse=reverse, unroll=unroll, schedule=schedule)
    return jnp.sum(u**2) + jnp.sum(ys * jnp.arange(12.0))


@pytest.mark.parametrize(
    "reverse, unroll",
    [(True, 1), (False, 3), (True, True)],
    ids=["reverse", "unroll3", "reverse-unrollTrue"],
)
def test_reverse_and_unroll_keep_counts(reverse, unroll):
    """The gradient evaluates the step ``plain + 1 + N`` times (as without reverse/unroll, see
    test_counts.py), and agrees with jax.lax.scan."""
    schedule = rs.Revolve(3)
    loss = functools.partial(_counted_loss, schedule, reverse, unroll)
    args = (jnp.float64(0.7), jnp.array([0.2, -0.3, 0.5]))
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    assert _count(grad, *args) == rs.simulate(schedule, 12).plain + 1 + 12
    assert _count(jax.jit(loss), *args) == 12

    def ref(theta, u0):
        step = lambda u, x: (u + 0.1 * jnp.sin(theta * u) * x, jnp.sum(u))
        u, ys = lax.scan(step, u0, jnp.linspace(0.5, 1.5, 12), reverse=reverse)
        return jnp.sum(u**2) + jnp.sum(ys * jnp.arange(12.0))

    P.assert_close(grad(*args), jax.jit(jax.grad(ref, argnums=(0, 1)))(*args), RTOL, "grad")


# ----------------------------------------------------------------------------- unroll


@pytest.mark.parametrize("unroll", [0, 1, 2, 5, True, False])
def test_unroll_values(unroll):
    _same_as_lax(
        lambda m: m.scan(lambda c, x: (c * 0.9 + x, c), 1.0, jnp.arange(4.0), unroll=unroll)
    )
    _same_as_lax(lambda m: m.fori_loop(0, 4, lambda i, v: v * 0.5 + i, 1.0, unroll=unroll))


@pytest.mark.parametrize("unroll", [-1, "a", None], ids=["negative", "str", "None"])
def test_unroll_errors_like_lax(unroll):
    kind, err = _same_as_lax(
        lambda m: m.scan(lambda c, x: (c + x, None), 0.0, jnp.ones(3), unroll=unroll)
    )
    assert kind == "error" and "unroll" in str(err)


def test_unroll_traced_is_a_concretization_error():
    def f(m, u):
        return m.scan(lambda c, x: (c + x, None), 0.0, jnp.ones(3), unroll=u)[0]

    for m in (lax, retrograde):
        with pytest.raises(jax.errors.ConcretizationTypeError, match="unroll"):
            jax.jit(functools.partial(f, m))(2)


def test_fori_unroll_needs_static_bounds():
    for m in (lax, retrograde):
        with pytest.raises(ValueError, match="unroll"):
            jax.jit(lambda n: m.fori_loop(0, n, lambda i, v: v + i, 0.0, unroll=2))(3)
        jax.jit(lambda n: m.fori_loop(0, n, lambda i, v: v + i, 0.0, unroll=1))(3)


# ----------------------------------------------------------------------------- weak types

I8 = jnp.arange(1, 4, dtype=jnp.int8)
BF16 = jnp.arange(1, 4).astype(jnp.bfloat16)
F64, F32 = jnp.linspace(0.5, 1.5, 3), jnp.linspace(0.5, 1.5, 3, dtype=jnp.float32)

WEAK_CASES = {
    # scan: weakly typed initial carries take the step's type
    "int0+int8": lambda m: m.scan(lambda c, x: (c + x, c), 0, I8),
    "float0+bf16": lambda m: m.scan(lambda c, x: (c + x, c * x), 0.0, BF16),
    "int0+floats": lambda m: m.scan(lambda c, x: (c + x, c), 0, F64),
    "int0+1.5": lambda m: m.scan(lambda c, x: (c + 1.5, c), 0, None, 3),
    "weak-stays-weak": lambda m: m.scan(lambda c, x: (c * 2, c), 1.0, None, 3),
    "weak-in-strong-out": lambda m: m.scan(lambda c, x: (c * x, c), 1.0, F64),
    "strong-in-weak-out": lambda m: m.scan(lambda c, x: (1.0, 2.0), jnp.float64(1.0), None, 3),
    "f32-carry-weak-update": lambda m: m.scan(lambda c, x: (c + 1, c), jnp.float32(1), F32),
    "pytree": lambda m: m.scan(
        lambda c, x: ({"a": c["a"] + x, "b": c["b"] * 2}, c["a"]), {"a": 0, "b": 1.0}, I8
    ),
    "list-output": lambda m: m.scan(lambda c, x: [c * x, x], 1.0, F64),
    "zero-steps": lambda m: m.scan(lambda c, x: (c + x, c), 0, jnp.zeros(0, jnp.int8)),
    # scan: dtype changes are errors (never cast back)
    "f32-carry-f64-out": lambda m: m.scan(lambda c, x: (c * x, None), jnp.float32(1), F64),
    "f64-carry-f32-out": lambda m: m.scan(lambda c, x: (x, None), jnp.float64(1), F32),
    "f32-carry-pyfloat-out": lambda m: m.scan(lambda c, x: (1.5, None), jnp.float32(1), None, 2),
    "int-carry-float-out": lambda m: m.scan(lambda c, x: (c * 1.5, None), jnp.int32(1), None, 2),
    # while_loop
    "while-weak-int": lambda m: m.while_loop(lambda c: c < 3, lambda c: c + 1, 0),
    "while-int0+1.5": lambda m: m.while_loop(lambda c: c < 3, lambda c: c + 1.5, 0),
    "while-int0+int8": lambda m: m.while_loop(
        lambda c: c[0] < 3, lambda c: (c[0] + c[1], c[1]), (0, jnp.int8(1))
    ),
    "while-f32-f64": lambda m: m.while_loop(lambda c: c < 3, lambda c: c + F64[0], jnp.float32(0)),
    # fori_loop: the index is a weakly typed int with static bounds, the bounds' type otherwise
    "fori-index": lambda m: m.fori_loop(0, 3, lambda i, v: v + i, 0),
    "fori-index-float": lambda m: m.fori_loop(0, 3, lambda i, v: v + i * F64[0], 0.0),
    "fori-int32-bounds": lambda m: m.fori_loop(jnp.int32(1), 4, lambda i, v: v * i, 1.0),
    "fori-empty": lambda m: m.fori_loop(5, 3, lambda i, v: v + i, 0.0),
    "fori-traced": lambda m: jax.jit(lambda n: m.fori_loop(0, n, lambda i, v: v + i, 0))(4),
    "fori-traced-int32": lambda m: jax.jit(
        lambda n: m.fori_loop(0, n, lambda i, v: (v[0] + i, v[1] * 1.5), (0, 1.0))
    )(jnp.int32(4)),
    "fori-unequal-bounds": lambda m: m.fori_loop(jnp.int32(0), jnp.int64(3), lambda i, v: v, 0.0),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", list(WEAK_CASES))
def test_types_follow_lax(case, mode):
    _same_as_lax(WEAK_CASES[case], mode)


def _weak_loss(scan, while_loop, theta, u0):
    """Loops whose carry stays weakly typed (``u0`` a Python float, or a tracer of one) or
    becomes strong (mixed with ``theta``)."""
    weak, ys = scan(lambda c, x: (c * 0.5 + jnp.sin(c), c * 2.0), u0, None, 4)
    strong, _ = scan(lambda c, x: (c * theta + x, None), u0, F64)
    w = while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, jnp.cos(s[1]) * 1.5), (0, u0))
    return weak**2 + jnp.sum(ys) + strong * weak + w[1]


def _three_steps(cond_fun, body_fun, init_val):
    """The reference for ``_weak_loss``'s while loop, which runs exactly three steps
    (``jax.lax.while_loop`` is not reverse-differentiable)."""
    return lax.scan(lambda s, _: (body_fun(s), None), init_val, None, 3)[0]


def test_derivatives_through_weakly_typed_carries():
    """grad, jvp, vmap and hessian through carries that stay weakly typed, against jax.lax."""

    def program(scan, while_loop):
        loss = functools.partial(_weak_loss, scan, while_loop)

        def prog(theta, u0):
            return (
                loss(theta, u0),
                jax.grad(loss, argnums=(0, 1))(theta, u0),
                jax.jvp(lambda u: loss(theta, u), (u0,), (1.0,)),
                jax.vmap(lambda u: loss(theta, u))(jnp.array([0.3, 0.6])),
                jax.hessian(
                    lambda u: scan(lambda c, x: (c * 0.5 + jnp.sin(c), None), u, None, 4)[0]
                )(u0),
            )

        return P.jit(prog)(0.7, 0.4)

    got = program(
        functools.partial(retrograde.scan, schedule=rs.Revolve(2)),
        functools.partial(retrograde.while_loop, schedule=rs.Online(2)),
    )
    P.assert_close(got, program(lax.scan, _three_steps), RTOL, "weak carries")
    # Un-jitted, the Python floats reach the loops as they are.
    _same_as_lax(
        lambda m: _weak_loss(m.scan, m.while_loop if m is retrograde else _three_steps, 0.7, 0.4)
    )


def test_promoted_carry_is_not_cast_back():
    """An int accumulator updated with floats is promoted (as in jax.lax), not truncated."""
    c, ys = retrograde.scan(lambda c, x: (c + x, c), 0, jnp.full(3, 0.25))
    assert c.dtype == jnp.float64 and float(c) == 0.75
    np.testing.assert_array_equal(ys, [0.0, 0.25, 0.5])


# ----------------------------------------------------------------------------- errors name the leaf

ERROR_CASES = {
    # name: (make(module), TypeError expected, text naming the leaf in retrograde's message)
    "scan-dtype": (
        lambda m: m.scan(
            lambda c, x: ({"u": c["u"], "v": (c["v"][0], x)}, None),
            {"u": F64, "v": (1.0, jnp.float64(0))},
            F32,
        ),
        r"c\['v'\]\[1\] goes in as float64\[\] and comes out as float32\[\]",
    ),
    "scan-shape": (
        lambda m: m.scan(
            lambda c, x: ({"u": c["u"][:2], "w": c["w"]}, None), {"u": F64, "w": 0.0}, None, 2
        ),
        r"c\['u'\] goes in as float64\[3\] and comes out as float64\[2\] "
        r"\(the shapes differ\)",
    ),
    "scan-structure": (
        lambda m: m.scan(lambda c, x: ({"u": (c["u"], c["u"])}, None), {"u": F64}, None, 2),
        r"c\['u'\] is an array in the input carry but a tuple",
    ),
    "scan-missing-key": (
        lambda m: m.scan(lambda c, x: ({"u": c["u"]}, None), {"u": F64, "v": 1.0}, None, 2),
        r"c is a dict with children \['u'\], \['v'\] in the input carry but a "
        r"dict with children \['u'\]",
    ),
    "scan-list-vs-tuple": (
        lambda m: m.scan(lambda c, x: (tuple(c), None), [F64], None, 2),
        r"c is a list .* but a tuple",
    ),
    "scan-not-a-pair": (lambda m: m.scan(lambda c, x: (c, x, x), 0.0, F64), r"pair"),
    "scan-no-pair": (lambda m: m.scan(lambda c, x: c, jnp.zeros(2), F64), r"pair"),
    "scan-unnamed-carry": (
        lambda m: m.scan(lambda *a: ((a[0][0], a[0][1] * 1j), None), (F64[0], F64[1]), None, 2),
        r"carry\[1\] goes in as float64\[\]",
    ),
    "while-body-dtype": (
        lambda m: m.while_loop(
            lambda s: s["n"] < 3,
            lambda s: {"n": s["n"] + 1, "x": s["x"].astype(jnp.float32)},
            {"n": 0, "x": F64[0]},
        ),
        r"s\['x'\] goes in as float64\[\] and comes out as float32\[\]",
    ),
    "while-body-shape": (
        lambda m: m.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, F64), (0, 1.0)),
        r"s\[1\] goes in as float64\[\] .* float64\[3\]",
    ),
    "while-cond-pytree": (
        lambda m: m.while_loop(lambda s: (s < 3,), lambda s: s + 1, 0),
        r"cond_fun must return a boolean scalar, got a pytree",
    ),
    "while-cond-int": (
        lambda m: m.while_loop(lambda s: s, lambda s: s - 1, 3),
        r"cond_fun must return a boolean scalar, got int64\[\]",
    ),
    "while-cond-vector": (
        lambda m: m.while_loop(lambda s: s < 3, lambda s: s + 1, jnp.zeros(2)),
        r"cond_fun must return a boolean scalar, got bool\[2\]",
    ),
    "fori-val": (
        lambda m: m.fori_loop(
            0, 3, lambda i, val: {"a": val["a"].astype(jnp.float32)}, {"a": F64[0]}
        ),
        r"retrograde.fori_loop: body_fun .* val\['a'\] goes in as float64\[\]",
    ),
    "fori-traced-val": (
        lambda m: jax.jit(
            lambda n: m.fori_loop(
                0, n, lambda i, acc: (acc[0], acc[1].astype(jnp.float32)), (1.0, F64)
            )
        )(3),
        r"retrograde.fori_loop: body_fun .* acc\[1\] goes in as float64\[3\]",
    ),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_name_the_leaf(case):
    make, pattern = ERROR_CASES[case]
    kind, err = _same_as_lax(make)
    assert kind == "error" and isinstance(err, TypeError)
    assert pattern is None or re.search(pattern, str(err)), str(err)


def test_first_order_body_fun_checked_like_body_fun():
    with pytest.raises(
        TypeError,
        match=r"first_order_body_fun .* s\[1\] goes in as float64\[\] "
        r"\(weakly typed\) and comes out as float32\[\]",
    ):
        retrograde.while_loop(
            lambda s: s[0] < 3,
            lambda s: (s[0] + 1, s[1] * 2.0),
            (0, 1.0),
            first_order_body_fun=lambda s: (s[0] + 1, jnp.float32(s[1])),
        )


def test_errors_in_strict_modes():
    """The same errors under the strict configurations (nothing in the checks promotes)."""
    for mode in ("rank_raise", "strict_x64"):
        for case in ("scan-dtype", "scan-structure", "fori-val"):
            make, pattern = ERROR_CASES[case]
            kind, err = _same_as_lax(make, mode)
            assert kind == "error" and re.search(pattern, str(err)), str(err)


# ----------------------------------------------------------------------------- eager cache


class _Compiles:
    """Counts XLA compilations (jax.monitoring's backend-compile events) while active."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self):
        self.n = 0

    def _listen(self, event, duration, **kwargs):
        if event == self.EVENT:
            self.n += 1

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listen)


def _twice(call):
    """Run ``call(k)`` for k = 0, 1 eagerly; return (traces, compiles) of each call."""
    counts = []
    traces = []
    for k in range(2):
        with _Compiles() as c:
            n0 = len(TRACES)
            out = jax.block_until_ready(call(k))
        counts.append((len(TRACES) - n0, c.n))
        traces.append(out)
    return counts, traces


TRACES: list[int] = []


def _scan_step(c, x):
    TRACES.append(1)
    return {"u": c["u"] * x + 1.0, "n": c["n"] + 1}, c["u"]


def _fori_body(i, v):
    TRACES.append(1)
    return v * 0.5 + i


def _promoting_step(c, x):
    """An accumulator started as a Python int and updated with floats: traced twice."""
    TRACES.append(1)
    return c * 0.5 + x, c


def _while_body(s):
    TRACES.append(1)
    return s[0] + 1, s[1] * 0.9


def _while_cond(s):
    TRACES.append(1)
    return s[0] < 5


LOOPS = {
    "scan": (lambda mod, k: mod.scan(_scan_step, {"u": jnp.full(2, 1.0 + k), "n": 0}, F64)),
    "scan-reverse": (
        lambda mod, k: mod.scan(_scan_step, {"u": jnp.full(2, 1.0 + k), "n": 0}, F64, reverse=True)
    ),
    "scan-promoted": (lambda mod, k: mod.scan(_promoting_step, k, F64)),
    "fori_loop": (lambda mod, k: mod.fori_loop(0, 6, _fori_body, jnp.float64(k))),
    "while_loop": (lambda mod, k: mod.while_loop(_while_cond, _while_body, (k, jnp.float64(1)))),
}


@pytest.mark.parametrize("loop", list(LOOPS))
def test_second_eager_call_neither_traces_nor_compiles(loop):
    make = LOOPS[loop]
    step_cache.clear()
    _intern.bodies.clear()
    (first, second), outs = _twice(functools.partial(make, retrograde))
    assert first[0] >= 1 and first[1] >= 1, first  # traced and compiled once ...
    assert second == (0, 0), second  # ... and not again
    for k, out in enumerate(outs):  # the second call computes with its own values
        P.assert_close(
            jax.tree_util.tree_map(jnp.asarray, out),
            jax.tree_util.tree_map(jnp.asarray, make(lax, k)),
            RTOL,
        )


def test_cache_entries_depend_on_types_and_config():
    step_cache.clear()
    n0 = len(TRACES)
    retrograde.scan(_scan_step, {"u": jnp.ones(2), "n": 0}, F64)
    retrograde.scan(_scan_step, {"u": jnp.ones(2), "n": 0}, F64)
    assert len(TRACES) - n0 == 1
    retrograde.scan(_scan_step, {"u": jnp.ones(3), "n": 0}, F64)  # another shape: traced
    assert len(TRACES) - n0 == 2
    with jax.numpy_rank_promotion("raise"):  # another configuration: traced
        retrograde.scan(_scan_step, {"u": jnp.ones(2), "n": 0}, F64)
    assert len(TRACES) - n0 == 3


def test_cache_does_not_keep_the_step_alive():
    def make():
        scale = jnp.float64(0.5)
        return lambda c, x: (c * scale + x, None)

    step = make()
    retrograde.scan(step, 1.0, F64)
    ref = weakref.ref(step)
    n = len(step_cache._entries)
    del step
    gc.collect()
    assert ref() is None
    assert len(step_cache._entries) == n - 1


def test_closures_over_tracers_are_not_reused():
    """Under jit a step closing over a traced value is traced per call (nothing stale)."""

    def f(theta):
        return retrograde.scan(lambda c, x: (c * theta + x, None), 1.0, F64)[0]

    def g(theta):
        return lax.scan(lambda c, x: (c * theta + x, None), 1.0, F64)[0]

    for theta in (0.5, 2.0):
        P.assert_close(jax.jit(f)(theta), jax.jit(g)(theta), RTOL)
        P.assert_close(jax.grad(f)(theta), jax.grad(g)(theta), RTOL)


# The second level: closures created anew per call share bodies of the same structure.


def _fresh_loss(loop, a, theta):
    """A loss whose step is a closure created anew on each call, over an array ``a`` (a constant)
    and ``theta`` (differentiated); ``loop`` is ``retrograde`` or ``lax``. While loops are
    compared with ``lax.fori_loop`` (``lax.while_loop`` has no reverse mode)."""
    u0 = jnp.linspace(0.1, 0.4, 4)
    step = lambda u: u + 0.05 * jnp.tanh(a * u + theta * jnp.roll(u, 1))
    if loop == "scan" or loop == "lax":
        scan = retrograde.scan if loop == "scan" else lax.scan
        u, ys = scan(lambda u, x: (step(u) * x, jnp.sum(u)), u0, jnp.linspace(1.0, 1.1, 12))
        return jnp.sum(u**2) + jnp.sum(ys)
    if loop == "fori_loop" or loop == "lax-fori":
        fori = retrograde.fori_loop if loop == "fori_loop" else lax.fori_loop
        return jnp.sum(fori(0, 12, lambda i, u: step(u) + 0.01 * i, u0) ** 2)
    u = retrograde.while_loop(
        lambda s: s[0] < 12, lambda s: (s[0] + 1, step(s[1]) + 0.01 * s[0]), (0, u0)
    )
    return jnp.sum(u[1] ** 2)


FRESH_REFERENCE = {"scan": "lax", "fori_loop": "lax-fori", "while_loop": "lax-fori"}


@pytest.mark.parametrize("loop", list(FRESH_REFERENCE))
def test_recreated_closures_compile_once(loop):
    """Eager ``jax.grad`` three times, each with a new closure over another array value of the
    same type: the same gradient as ``jax.lax``'s each time (exact to 1e-14), and the second and
    third calls share the first one's bodies and compile nothing (no XLA compilation at all)."""
    step_cache.clear()
    _intern.bodies.clear()
    grad = jax.grad(functools.partial(_fresh_loss, loop), argnums=(0, 1))
    grad_ref = jax.grad(functools.partial(_fresh_loss, FRESH_REFERENCE[loop]), argnums=(0, 1))
    compiles, hits = [], []
    for k in range(3):
        a, theta = jnp.linspace(0.5, 1.0, 4) * (1 + k), jnp.float64(0.3 - 0.2 * k)
        h0 = _intern.bodies.hits
        with _Compiles() as c:
            g = jax.block_until_ready(grad(a, theta))
        compiles.append(c.n)
        hits.append(_intern.bodies.hits - h0)
        for x, y in zip(g, grad_ref(a, theta)):
            np.testing.assert_allclose(x, y, rtol=1e-14, atol=0)
    assert compiles[0] >= 1 and compiles[1:] == [0, 0], compiles
    assert hits[0] == 0 and hits[1] >= 1 and hits[2] >= 1, hits


def _sin_jvp(scale):
    """``sin`` with a JVP rule ``scale * cos``: functions of equal primal jaxprs that differ
    only in their JVP rules (a parameter that is a function)."""

    @jax.custom_jvp
    def f(u):
        return jnp.sin(u)

    f.defjvp(lambda p, t: (jnp.sin(p[0]), scale * jnp.cos(p[0]) * t[0]))
    return f


def _rule_loss(loop, f, theta):
    u0 = jnp.linspace(0.1, 0.4, 3)
    step = lambda u: u + 0.1 * f(theta * u)
    if loop == "scan":
        return jnp.sum(retrograde.scan(lambda u, _: (step(u), None), u0, length=6)[0])
    if loop == "fori_loop":
        return jnp.sum(retrograde.fori_loop(0, 6, lambda i, u: step(u), u0))
    if loop == "while_loop":
        return jnp.sum(
            retrograde.while_loop(lambda s: s[0] < 6, lambda s: (s[0] + 1, step(s[1])), (0, u0))[1]
        )
    return jnp.sum(lax.fori_loop(0, 6, lambda i, u: step(u), u0))


@pytest.mark.parametrize("loop", list(FRESH_REFERENCE))
def test_custom_jvp_rules_are_not_shared(loop):
    """Two ``custom_jvp`` functions with equal primals and different rules: neither body is
    interned (``jvp_jaxpr_fun`` is a function), each gradient is its own rule's, as ``lax``'s."""
    _intern.bodies.clear()
    theta = jnp.float64(0.8)
    grads = []
    for scale in (1.0, 3.0):
        f = _sin_jvp(scale)
        g = jax.grad(functools.partial(_rule_loss, loop, f))(theta)
        P.assert_close(g, jax.grad(functools.partial(_rule_loss, "lax", f))(theta), RTOL)
        grads.append(g)
    assert not np.isclose(grads[0], grads[1])
    assert len(_intern.bodies) == 0 and _intern.bodies.hits == 0


@pytest.mark.parametrize("loop", list(FRESH_REFERENCE))
def test_debug_callbacks_are_not_shared(loop):
    """Closures of equal code calling two different ``jax.debug.callback`` functions: each
    callback sees its own loop's steps (the callback is a function: not interned)."""
    _intern.bodies.clear()
    seen: dict = {0: [], 1: []}
    for k in (0, 1):
        record = lambda n, k=k: seen[k].append(int(n))

        def tap(u, n):
            jax.debug.callback(record, n)
            return u * 0.5

        u0 = jnp.ones(2) * (k + 1)
        if loop == "scan":
            out = retrograde.scan(lambda c, n: (tap(c, n), None), u0, jnp.arange(3))[0]
        elif loop == "fori_loop":
            out = retrograde.fori_loop(0, 3, lambda i, c: tap(c, i), u0)
        else:
            out = retrograde.while_loop(
                lambda s: s[0] < 3, lambda s: (s[0] + 1, tap(s[1], s[0])), (0, u0)
            )[1]
        np.testing.assert_array_equal(jax.block_until_ready(out), u0 * 0.125)
    assert seen == {0: [0, 1, 2], 1: [0, 1, 2]}, seen
    assert len(_intern.bodies) == 0


def _key(fun, *args):
    return _intern.structure_key(jax.make_jaxpr(fun)(*args))


def test_structure_keys():
    """Equal for the same code over other constant values (nested ``jit``, ``cond``, ``scan``
    and a ``retrograde.scan`` inside), different for other constant types, other literals (bit
    for bit: 0.0 and -0.0), other shapes; ``None`` for a step with a function as a parameter."""
    u = jnp.ones(3)

    def code(a):
        def step(v):
            w = jax.jit(jnp.clip)(v * a, -1, 1)
            w = lax.cond(w[0] > 0, lambda z: z * 2, lambda z: z - a, w)
            w = retrograde.scan(lambda c, _: (c + a, None), w, None, length=3)[0]
            return lax.scan(lambda c, x: (c * a, x), w, a)[0]

        return step

    assert _key(code(jnp.ones(3)), u) == _key(code(jnp.zeros(3)), u) is not None
    assert _key(code(jnp.ones(3)), u) != _key(code(jnp.ones(3, jnp.float32)), u)
    assert _key(code(jnp.ones(3)), u) != _key(code(jnp.ones(4)), jnp.ones(4))
    assert _key(lambda v: v * 0.0, u) != _key(lambda v: v * -0.0, u)
    assert _key(lambda v: v * 0.5, u) != _key(lambda v: v * 0.25, u)
    assert _key(lambda v: jax.pure_callback(np.sin, v, v), u) is None
    assert _key(lambda v: jax.nn.relu(v), u) is None  # a custom_jvp function


def test_param_values():
    """Parameters by value; a sentinel (no state, equal only to itself) as itself; a function or
    a stateful object equal only to itself not at all."""
    v = _intern.param_value

    class Sentinel:
        pass

    class Stateful:
        def __init__(self):
            self.n = 0

    one, two = Sentinel(), Sentinel()
    assert v((1, 2.0, "a", np.float64(3.0))) == v((1, 2.0, "a", np.float64(3.0)))
    assert v(0.0) != v(-0.0) and v(1) != v(True) and v((1,)) != v([1])
    assert v(np.arange(3)) != v(np.arange(3.0)) and v(np.arange(3)) == v(np.arange(3))
    assert v(one) == v(one) and v(one) != v(two)
    for bad in (Stateful(), lambda: 0, jnp.sin, jax.random.key(0)):
        with pytest.raises(_intern.NotInternable):
            v(bad)


def test_intern_table_is_bounded():
    table = _intern.InternTable(maxsize=2)
    for k in range(3):
        table.get(("k", k), lambda k=k: [k])
    assert len(table) == 2 and table.get(("k", 2), list) == [2] and table.get(("k", 0), list) == []
    assert table.get(None, lambda: "built") == "built" and table.skipped == 1


# ----------------------------------------------------------------------------- traced fori bounds


def _fori_loss(fori, lo, n, theta, v0):
    def body(i, v):
        i = lax.convert_element_type(i, jnp.float64)
        return {"u": v["u"] + 0.1 * jnp.sin(theta * v["u"] + i), "s": v["s"] * 0.9 + i}

    out = fori(lo, n, body, v0)
    return jnp.sum(out["u"] ** 2) + out["s"]


def _check_fori_traced(mode, derivatives):
    theta, v0 = jnp.float64(0.7), {"u": jnp.array([0.2, -0.3]), "s": jnp.float64(1.0)}
    rg = functools.partial(
        _fori_loss, functools.partial(retrograde.fori_loop, schedule=rs.Online(2))
    )
    ref = functools.partial(_fori_loss, lax.fori_loop)
    with MODES[mode]():
        value, value_ref = P.jit(rg), P.jit(ref)
        grad = P.jit(jax.grad(rg, argnums=(2, 3)))
        grad_ref = P.jit(jax.grad(ref, argnums=(2, 3)), static_argnums=(0, 1))  # lax: static only
        jvp = P.jit(lambda lo, n, th: jax.jvp(lambda th: rg(lo, n, th, v0), (th,), (1.0,)))
        jvp_ref = P.jit(lambda lo, n, th: jax.jvp(lambda th: ref(lo, n, th, v0), (th,), (1.0,)))
        for lo, n in ((1, 6), (3, 3), (4, 2)):
            lo_, n_ = jnp.int32(lo), jnp.int32(n)
            P.assert_close(value(lo_, n_, theta, v0), value_ref(lo_, n_, theta, v0), RTOL, "value")
            if derivatives:
                P.assert_close(grad(lo_, n_, theta, v0), grad_ref(lo, n, theta, v0), RTOL, "grad")
                P.assert_close(jvp(lo_, n_, theta), jvp_ref(lo_, n_, theta), RTOL, "jvp")
        if derivatives:
            ns = jnp.array([0, 2, 5], jnp.int32)
            vm = jax.vmap(functools.partial(rg, 0), in_axes=(0, None, None))
            vm_ref = jax.vmap(functools.partial(ref, 0), in_axes=(0, None, None))
            P.assert_close(vm(ns, theta, v0), vm_ref(ns, theta, v0), RTOL, "vmap")


def test_fori_traced_bounds():
    """Traced bounds run a reverse-differentiable while_loop: values and forward derivatives as
    jax.lax's (whose while_loop is not reverse-differentiable), reverse derivatives as jax.lax's
    with the same bounds given statically. Also batched bounds (vmap over ``n``)."""
    _check_fori_traced("default", derivatives=True)


def test_fori_float_bounds():
    """Floating-point bounds as in ``jax.lax.fori_loop``: truncated when concrete (``i`` an int),
    a floating-point counter when traced (values and ``jvp`` as lax's; ``grad`` equals the
    ``jvp``, which lax's while_loop cannot reverse)."""
    body = lambda i, c: c * jnp.sin(i) + 0.1 * c**2
    with jax.enable_x64(True):
        for lo, hi in [(0.5, 3.7), (jnp.float64(1.0), jnp.float64(4.5))]:
            P.assert_close(
                retrograde.fori_loop(lo, hi, body, 1.0), lax.fori_loop(lo, hi, body, 1.0), RTOL
            )

        def traced(fori):
            return jax.jit(lambda x: fori(x, x + 3.0, body, x))

        x = jnp.float64(0.3)
        P.assert_close(traced(retrograde.fori_loop)(x), traced(lax.fori_loop)(x), RTOL)
        ref = jax.jvp(traced(lax.fori_loop), (x,), (1.0,))[1]
        P.assert_close(jax.jvp(traced(retrograde.fori_loop), (x,), (1.0,))[1], ref, RTOL)
        P.assert_close(jax.grad(traced(retrograde.fori_loop))(x), ref, RTOL)
        with pytest.raises(TypeError):  # mixed int and float bounds, as lax
            retrograde.fori_loop(0, 2.5, body, 1.0)


@pytest.mark.parametrize("mode", ["strict_x64", "rank_raise"])
def test_fori_traced_bounds_strict_values(mode):
    _check_fori_traced(mode, derivatives=False)


@pytest.mark.parametrize("mode", ["strict_x64", "rank_raise"])
def test_fori_traced_bounds_strict_derivatives(mode):
    _check_fori_traced(mode, derivatives=True)


# ------------------------------------------------------------------- leaves without tangent


@jax.custom_jvp
def _refuses_derivative(t):
    """The identity, whose derivative raises (as a ``VirtualBrownianTree`` does for its time)."""
    return t


@_refuses_derivative.defjvp
def _refuses_derivative_jvp(primals, tangents):
    raise RuntimeError("this value cannot be differentiated")


def _timed_step(t, y, k):
    return t + 0.1, y * jnp.cos(_refuses_derivative(t)) * k + jnp.sin(y)


@pytest.mark.parametrize("schedule", [rs.Revolve(3), rs.StoreAll(), rs.RecomputeAll()], ids=str)
def test_leaves_without_tangent_are_not_differentiated(schedule):
    """A time leaf that nothing differentiated depends on: grad and Hessian of ``scan`` equal
    ``lax.scan``'s, and the step is never asked for the time's derivative."""

    def loss(scan, y0, ks):
        def step(c, k):
            t, y = _timed_step(*c, k)
            return (t, y), y

        (_, y), ys = scan(step, (0.0, y0), ks)
        return y + jnp.sum(ys**2)

    with jax.enable_x64(True):
        ks = jnp.linspace(0.5, 1.5, 12)
        ours = functools.partial(retrograde.scan, schedule=schedule)
        P.assert_close(
            jax.grad(loss, (1, 2))(ours, 1.0, ks), jax.grad(loss, (1, 2))(lax.scan, 1.0, ks), RTOL
        )
        # Jitted: eagerly, each primitive of the Hessian's program compiles on its own.
        hessian = jax.jit(jax.hessian(loss, 1), static_argnums=0)
        P.assert_close(hessian(ours, 1.0, ks), hessian(lax.scan, 1.0, ks), RTOL)


def test_while_leaves_without_tangent_are_not_differentiated():
    """The same for ``while_loop`` (``Online``) against ``lax.fori_loop``."""

    def ours(y0, k):
        def step(c):
            i, t, y = c
            return (i + 1, *_timed_step(t, y, k))

        return retrograde.while_loop(
            lambda c: c[0] < 15, step, (0, 0.0, y0), schedule=rs.Online(3)
        )[2]

    def ref(y0, k):
        return lax.fori_loop(0, 15, lambda i, c: _timed_step(*c, k), (0.0, y0))[1]

    with jax.enable_x64(True):
        P.assert_close(jax.grad(ours, (0, 1))(1.0, 0.9), jax.grad(ref, (0, 1))(1.0, 0.9), RTOL)
        # Jitted: eagerly, each primitive of the Hessian's program compiles on its own (twice the
        # time); the gradient above runs eagerly.
        P.assert_close(jax.jit(jax.hessian(ours))(1.0, 0.9), jax.hessian(ref)(1.0, 0.9), RTOL)
