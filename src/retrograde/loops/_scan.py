"""``retrograde.scan`` and ``retrograde.fori_loop``: drop-in ``jax.lax`` loops, checkpointed."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from jax import tree_util

from ..schedules import Revolve, Schedule, beta
from ..schedules._base import check_steps
from ._body import make_body
from ._carry import leaf_array, match_carry
from ._plan import check_offline
from ._primitives import Extent, forward_loop

Carry = TypeVar("Carry")
X = TypeVar("X")
Y = TypeVar("Y")

__all__ = ["scan", "fori_loop", "default_schedule"]


def default_schedule(length: int) -> Revolve:
    """The default: ``Revolve(s)`` with the fewest slots such that no step is run plainly more
    than twice (``beta(s, 2) = (s + 1)(s + 2) / 2 >= N``), i.e. about ``sqrt(2N)`` snapshots.

    Example:
        >>> default_schedule(10_000)
        Revolve(snapshots=140)
    """
    s = 1
    while beta(s, 2) < length:
        s += 1
    return Revolve(s)


def scan(
    f: Callable[[Carry, X], tuple[Carry, Y]],
    init: Carry,
    xs: X | None = None,
    length: int | None = None,
    *,
    schedule: Schedule | None = None,
) -> tuple[Carry, Y]:
    """Scan ``f`` over the leading axis of ``xs``, like :func:`jax.lax.scan`, with a
    reverse-mode derivative that keeps only the snapshots the ``schedule`` asks for.

    Semantics are those of ``jax.lax.scan`` (without ``reverse``/``unroll``)::

        carry = init
        for n in range(length):
            carry, y[n] = f(carry, xs[n])
        return carry, stack(y)

    Args:
        f: the step, ``(carry, x) -> (carry, y)``; pytrees of arrays. Values it closes over
            (parameters) get derivatives like explicit inputs.
        init: the initial carry, a pytree of arrays; integer and boolean leaves are allowed (they
            get no derivative).
        xs: per-step inputs, a pytree of arrays with leading axis ``length``, or ``None``.
        length: the number of steps; required when ``xs`` is ``None``.
        schedule: an offline schedule from :mod:`retrograde.schedules` (``Revolve``, ``StoreAll``,
            ``RecomputeAll``, ``Periodic``, ``MultiLevel`` with all levels in device memory).
            Default: :func:`default_schedule` (about ``sqrt(2N)`` snapshots, each step run
            plainly at most twice).

    Returns:
        ``(carry, ys)``: the final carry and the per-step outputs stacked along a new leading
        axis of size ``length``.

    Cost: the primal runs ``N`` steps. ``jax.grad`` runs ``t(N, s) + 1`` plain and ``N``
    recorded (step plus VJP) evaluations, ``t`` being the schedule's plain count
    (:func:`retrograde.schedules.simulate`), in memory of ``s + 1`` carries plus one step's VJP
    working set; ``ys`` and the cotangents of ``xs`` are the only ``O(N)`` data. Forward mode
    (``jax.jvp``) runs the tangent with the state. Every JAX transformation composes
    (``jit``, ``vmap``, ``grad`` of ``grad``, ``jax.hessian``, ...), see
    ``docs/derivatives.md``.

    Example:
        >>> import jax, jax.numpy as jnp, retrograde
        >>> from retrograde.schedules import Revolve
        >>> def loss(theta):
        ...     step = lambda u, _: (u + 0.01 * jnp.sin(theta * u), None)
        ...     u, _ = retrograde.scan(step, jnp.ones(3), length=1000, schedule=Revolve(10))
        ...     return jnp.sum(u ** 2)
        >>> g = jax.grad(loss)(0.5)
    """
    if not callable(f):
        raise TypeError(f"retrograde.scan: f must be callable, got {f!r}.")
    xs_flat, xs_tree = tree_util.tree_flatten(xs)
    xs_flat = [leaf_array(x, "retrograde.scan", "xs") for x in xs_flat]
    if length is not None:
        length = check_steps(length, "retrograde.scan: length")
    lengths = {x.shape[0] if x.ndim else None for x in xs_flat}
    if None in lengths:
        raise ValueError("retrograde.scan: every leaf of xs needs a leading (time) axis.")
    if len(lengths) > 1:
        raise ValueError(
            f"retrograde.scan: the leaves of xs have different leading sizes {sorted(lengths)}; "
            "they must all equal the number of steps."
        )
    if lengths:
        (n_xs,) = lengths
        if length is not None and length != n_xs:
            raise ValueError(
                f"retrograde.scan: length={length} disagrees with the leading size {n_xs} of xs. "
                "Pass one of them, or make them equal."
            )
        length = n_xs
    elif length is None:
        raise ValueError("retrograde.scan: pass length when xs is None.")
    if schedule is None:
        schedule = default_schedule(length)
    schedule = check_offline(schedule, "retrograde.scan")

    init_flat, init_tree = tree_util.tree_flatten(init)
    init_flat = [leaf_array(c, "retrograde.scan", "init") for c in init_flat]
    carry_sds = [jax.ShapeDtypeStruct(c.shape, c.dtype) for c in init_flat]
    x_sds = [jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in xs_flat]
    out_tree_box = []

    def flat_step(*args):
        carry = tree_util.tree_unflatten(init_tree, args[: len(init_flat)])
        x = tree_util.tree_unflatten(xs_tree, args[len(init_flat) :])
        out = f(carry, x)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError("retrograde.scan: f must return a pair (carry, y).")
        new_carry, y = out
        fixed = match_carry("retrograde.scan", "f", new_carry, init_tree, carry_sds)
        y_flat, y_tree = tree_util.tree_flatten(y)
        out_tree_box.append(y_tree)
        return [*fixed, *[jnp.asarray(v) for v in y_flat]]

    closed = jax.make_jaxpr(flat_step)(*carry_sds, *x_sds)
    body, consts = make_body(closed, len(init_flat), len(xs_flat))
    outs = forward_loop(body, Extent(length, schedule), consts, init_flat, xs_flat)
    carry = tree_util.tree_unflatten(init_tree, outs[: body.nk])
    ys = tree_util.tree_unflatten(out_tree_box[-1], outs[body.nk :])
    return carry, ys


def fori_loop(
    lower: int,
    upper: int,
    body_fun: Callable[[Any, Carry], Carry],
    init_val: Carry,
    *,
    schedule: Schedule | None = None,
) -> Carry:
    """``jax.lax.fori_loop`` with static bounds, checkpointed: ``upper - lower`` steps of
    ``val = body_fun(i, val)``. See :func:`scan` for ``schedule`` and costs.

    Args:
        lower, upper: Python ints (the number of steps must be known when tracing).
        body_fun: ``(i, val) -> val``, ``i`` an int32 scalar.
        init_val: a pytree of arrays.

    Returns the final ``val``. Cost as :func:`scan` with ``N = upper - lower``.

    Example:
        >>> import jax, jax.numpy as jnp, retrograde
        >>> f = lambda a: retrograde.fori_loop(0, 100, lambda i, u: u * (1 + a / 100), 1.0)
        >>> float(jax.grad(f)(1.0)) > 0
        True
    """
    try:
        lower, upper = operator.index(lower), operator.index(upper)
    except TypeError:
        raise TypeError(
            "retrograde.fori_loop: lower and upper must be Python ints (static bounds); got "
            f"{lower!r}, {upper!r}. For a data-dependent count use retrograde.while_loop."
        ) from None
    length = max(upper - lower, 0)

    def step(carry, _):
        i, val = carry
        return (i + 1, body_fun(i, val)), None

    (_, val), _ = scan(step, (jnp.int32(lower), init_val), length=length, schedule=schedule)
    return val
