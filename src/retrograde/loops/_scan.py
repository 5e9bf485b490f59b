"""``retrograde.scan`` and ``retrograde.fori_loop``: drop-in ``jax.lax`` loops, checkpointed."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, tree_util

from .._jax_private import core
from ..schedules import (
    Mixed,
    Online,
    Revolve,
    Schedule,
    check_steps,
    default_schedule,
    revolve_optimum,
)
from . import _intern, _pool
from . import _residuals as residuals
from ._body import Body, forward_unchanged, make_body
from ._carry import (
    Names,
    aval_of,
    cached_wrapper,
    carry_label,
    check_pair,
    check_static_int,
    check_structure,
    check_types,
    check_unroll,
    convert,
    leaf_array,
    leaf_paths,
    step_cache,
    trace_carry,
    with_weak_types,
)
from ._fwd_p import forward_loop
from ._primitives import LoopPlan
from ._tables import check_offline, tables_for
from ._while import named_while_loop

Carry = TypeVar("Carry")
X = TypeVar("X")
Y = TypeVar("Y")

__all__ = ["scan", "fori_loop", "default_schedule"]


def scan(
    f: Callable[[Carry, X], tuple[Carry, Y]],
    init: Carry,
    xs: X | None = None,
    length: int | None = None,
    reverse: bool = False,
    unroll: int | bool = 1,
    *,
    schedule: Schedule | None = None,
) -> tuple[Carry, Y]:
    """Scan ``f`` over the leading axis of ``xs``, like :func:`jax.lax.scan`, with a
    reverse-mode derivative that keeps only the snapshots the ``schedule`` asks for.

    Semantics are those of ``jax.lax.scan``::

        carry = init
        for n in (reversed(range(length)) if reverse else range(length)):
            carry, y[n] = f(carry, xs[n])
        return carry, stack(y)

    The carry is typed as in ``jax.lax.scan``: ``f`` must return it with the structure, shapes
    and dtypes it came in with (else ``TypeError`` naming the leaf by its path), except that a
    weakly typed initial leaf (a Python scalar) takes the type ``f`` makes of it (``init=0``
    with ``int8`` inputs gives an ``int8`` carry).

    Args:
        f: the step, ``(carry, x) -> (carry, y)`` (a tuple or list of two); pytrees of arrays.
            Values it closes over (parameters) get derivatives like explicit inputs.
        init: the initial carry, a pytree of arrays; integer and boolean leaves are allowed (they
            get no derivative).
        xs: per-step inputs, a pytree of arrays with leading axis ``length``, or ``None``.
        length: the number of steps; required when ``xs`` is ``None``.
        reverse: run the steps from the last ``xs`` to the first (``ys`` are stacked in the
            order of ``xs``), as ``jax.lax.scan(reverse=True)``.
        unroll: a bool or a non-negative int, validated as in ``jax.lax.scan``; a performance
            hint that changes neither results, evaluation counts nor memory bounds.
        schedule: an offline schedule from :mod:`retrograde.schedules` (``Revolve``, ``StoreAll``,
            ``RecomputeAll``, ``Periodic``, ``MultiLevel``, whose levels may live in host RAM or
            on disk: ``Level(..., storage="host")``, see ``docs/offload.md``).
            Default: :func:`default_schedule` (about ``sqrt(2N)`` snapshots, each step run
            plainly at most twice), or ``Mixed`` with as many snapshots where it makes fewer
            evaluations in the same memory (a step whose data fit a state, see
            ``docs/choosing-a-schedule.md``).

    Returns:
        ``(carry, ys)``: the final carry and the per-step outputs stacked along a new leading
        axis of size ``length``.

    Cost: the primal runs ``N`` steps. ``jax.grad`` runs ``t(N, s) + 1`` plain and ``N``
    recorded (step plus VJP) evaluations, ``t`` being the schedule's plain count
    (:func:`retrograde.schedules.simulate`), in memory of ``s + 1`` carries plus one step's VJP
    working set; ``ys`` and the cotangents of ``xs`` are the only ``O(N)`` data. Forward mode
    (``jax.jvp``) runs the tangent with the state. ``reverse=True`` adds one reversed copy of
    ``xs`` and one of ``ys`` (``N (|x| + |y|)`` elements, ``|x|``, ``|y|`` the sizes of one
    step's slices), and of their tangents or cotangents under a derivative; evaluation counts
    are unchanged. Every JAX transformation composes (``jit``, ``vmap``, ``grad`` of ``grad``,
    ``jax.hessian``, ...), see ``docs/derivatives.md``. Called again (un-jitted) with the same
    ``f`` and argument types, the step is neither traced nor compiled again; with a new ``f`` of
    the same code and constant types (a closure created anew per call) it is traced but not
    compiled again, unless it holds functions (``custom_jvp`` rules, callbacks): see
    ``docs/performance.md``.

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
    names = Names("retrograde.scan", "f", "init", carry_label(f, 0, "carry"))
    return _scan(f, init, xs, length, reverse, unroll, schedule, names)


def _scan(f, init, xs, length, reverse, unroll, schedule, names: Names):
    """:func:`scan`, with errors worded by ``names`` (``fori_loop`` runs it too)."""
    where = names.where
    xs_flat, xs_tree = tree_util.tree_flatten(xs)
    xs_flat = [leaf_array(x, where, "xs") for x in xs_flat]
    if length is not None:
        check_static_int(
            length,
            where,
            "length",
            " For a step count known only at run time "
            "use retrograde.while_loop or retrograde.fori_loop.",
        )
        length = check_steps(length, f"{where}: length")
    length = _scan_length(xs_flat, length)
    reverse = operator.truth(reverse)
    # Validated as jax.lax.scan does; the forward sweeps unroll their loops by it (a performance
    # hint: results, evaluation counts and memory bounds are unaffected).
    unroll = max(1, min(check_unroll(unroll, length, where), max(length, 1)))
    chosen = schedule is None
    if chosen:
        schedule = default_schedule(length)
    schedule = check_offline(schedule, where)

    init_flat, init_tree = tree_util.tree_flatten(init)
    init_flat = [leaf_array(c, where, names.init) for c in init_flat]
    x_avals = [core.mapped_leading_aval(x.shape[0], aval_of(x)) for x in xs_flat]
    key = (init_tree, tuple(map(aval_of, init_flat)), xs_tree, tuple(x_avals))
    step = step_cache.get(
        [f],
        key,
        lambda: _trace_scan(f, init_tree, init_flat, xs_tree, x_avals, names),
        lambda s: s.consts,
    )
    body, consts = step.body, step.consts
    if chosen:
        schedule = mixed_default(body, length, schedule)
    init_flat = convert(init_flat, step.dtypes)
    if reverse:
        xs_flat = [lax.rev(x, (0,)) for x in xs_flat]
    outs = forward_loop(body, LoopPlan(length, schedule, unroll), consts, init_flat, xs_flat)
    outs = forward_unchanged(body, init_flat, outs)
    outs = with_weak_types(outs, step.out_avals)
    carry = tree_util.tree_unflatten(step.carry_tree, outs[: body.nk])
    ys = [lax.rev(y, (0,)) for y in outs[body.nk :]] if reverse else outs[body.nk :]
    # The pair in the container f returned it in (a list stays a list), as jax.lax.scan does.
    return tree_util.tree_unflatten(step.pair, [carry, tree_util.tree_unflatten(step.y_tree, ys)])


def mixed_default(body, length: int, revolve):
    """The default schedule for ``body``: ``Mixed(s, d)`` with the slots ``s`` of the default
    ``revolve`` and ``d`` the measured data of one step (its residuals for a first-order
    gradient in every float leaf, ``_residuals.data_size``, rounded up to whole states), where
    all its data share the snapshot buffers (``_pool``), so it takes ``revolve``'s memory, and
    where it does less work; else ``revolve``.

    Work is estimated from the step's jaxprs (``_residuals.Linearization.work``: ``A`` to
    advance, ``R`` to record, ``L`` to linearize, ``T`` to transpose from data) and compared by
    ``_residuals.mixed_pays``. ``O(N)`` when tracing (the tables' rows); a ``Mixed`` reversal
    longer than its rows allow and without an in-graph split stays Revolve's.
    """
    if not isinstance(revolve, Revolve) or length < 3 or not any(body.stored):
        return revolve
    d = residuals.whole_data_size(body, revolve.snapshots)
    if d is None:
        return revolve
    mixed = Mixed(revolve.snapshots, d)
    lin = residuals.linearization(body, *residuals.every_float(body))
    e_r = revolve_optimum(length, revolve.snapshots) + length
    if not residuals.mixed_pays(lin.work(), length, mixed.evaluations(length), e_r):
        return revolve
    try:
        tables = tables_for(mixed, length)
    except ValueError:  # more macro-actions than the rows allow (no in-graph split)
        return revolve
    if not _pool.shares_all(body, tables, lin.stored_avals, tables.n_slots):
        return revolve  # some data would not share Revolve's rows
    return mixed


class _Step(NamedTuple):
    """A traced scan step: the body, its constants, the dtypes weakly typed initial leaves are
    promoted to (or None), the output avals (carry then one ``y`` each, weak types as traced),
    and the output trees (of the carry, of ``y``, and the pair's container with two leaves)."""

    body: Body
    consts: list
    dtypes: list
    out_avals: list
    carry_tree: Any
    y_tree: Any
    pair: Any


def _scan_length(xs_flat: list, length: int | None) -> int:
    """The number of steps: ``length``, or the leading size shared by every leaf of ``xs``."""
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
        return n_xs
    if length is None:
        raise ValueError("retrograde.scan: pass length when xs is None.")
    return length


def _trace_scan(f, init_tree, init_flat: list, xs_tree, x_avals: list, names: Names) -> _Step:
    """Trace ``f`` into a :class:`Body` with ``jax.lax.scan``'s carry typing
    (:func:`~._carry.trace_carry`)."""
    nk = len(init_flat)

    def trace(avals):
        trees = []

        def flat_step(*args):
            carry = tree_util.tree_unflatten(init_tree, args[:nk])
            out = f(carry, tree_util.tree_unflatten(xs_tree, args[nk:]))
            check_pair(out, names)
            new_carry, y = out
            new_flat, new_tree = tree_util.tree_flatten(new_carry)
            if new_tree != init_tree:
                check_structure(names, carry, new_carry)
            y_flat, y_tree = tree_util.tree_flatten(y)
            pair = tree_util.tree_structure(out, is_leaf=lambda v: v is not out)
            trees.append((new_tree, y_tree, pair))
            return [*new_flat, *y_flat]

        closed = jax.make_jaxpr(flat_step)(*avals, *x_avals)
        return (closed, *trees[-1]), closed.out_avals[:nk]

    def check(avals, out):
        check_types(names, leaf_paths(init_tree), avals, out)

    (closed, *trees), dtypes = trace_carry(trace, init_flat, check)
    nx = len(x_avals)
    # A body of the same structure, traced before (e.g. from a closure created anew per call),
    # is shared: this trace's constants are its inputs, and nothing is compiled again.
    key = _intern.structure_key(closed)
    body = _intern.bodies.get(
        None if key is None else ("scan", key, nk, nx), lambda: make_body(closed, nk, nx)[0]
    )
    consts = list(closed.consts)
    return _Step(body, consts, dtypes, list(closed.out_avals), *trees)


def fori_loop(
    lower: int,
    upper: int,
    body_fun: Callable[[Any, Carry], Carry],
    init_val: Carry,
    *,
    unroll: int | bool | None = None,
    schedule: Schedule | None = None,
) -> Carry:
    """``jax.lax.fori_loop``, checkpointed: ``val = body_fun(i, val)`` for ``i`` from ``lower``
    to ``upper - 1`` (no step if ``upper <= lower``).

    Static bounds (Python ints, or concrete integer arrays) run :func:`scan` over
    ``upper - lower`` steps with an offline ``schedule`` (default: :func:`scan`'s), as
    ``jax.lax.fori_loop`` runs ``jax.lax.scan``; ``i`` is then a weakly typed int, as there.
    Traced bounds (e.g. arguments of a ``jax.jit`` function) run
    :func:`retrograde.while_loop` on ``(i, upper, val)``, again as ``jax.lax.fori_loop`` does,
    but reverse-differentiable here: ``schedule`` must then be an online one (default
    ``Online(16)``), ``i`` has the bounds' dtype, and derivatives treat the step count as fixed.

    Args:
        lower, upper: integer scalars; of equal dtypes unless one is a Python int (it takes the
            other's), as in ``jax.lax``. Floating-point bounds are accepted as there: truncated
            with ``int`` when concrete, a floating-point counter when traced.
        body_fun: ``(i, val) -> val``, returning ``val`` in the structure, shapes and dtypes it
            came in with (as in :func:`scan`).
        init_val: a pytree of arrays.
        unroll: a bool or a non-negative int, only with static bounds (as in ``jax.lax``); a
            performance hint, see :func:`scan`.
        schedule: see above and :func:`scan`.

    Returns the final ``val``. Cost as :func:`scan` with ``N = upper - lower`` for static
    bounds, as :func:`retrograde.while_loop` for traced ones.

    Example:
        >>> import jax, jax.numpy as jnp, retrograde
        >>> f = lambda a: retrograde.fori_loop(0, 100, lambda i, u: u * (1 + a / 100), 1.0)
        >>> float(jax.grad(f)(1.0)) > 0
        True
    """
    where = "retrograde.fori_loop"
    if not callable(body_fun):
        raise TypeError(f"{where}: body_fun must be callable, got {body_fun!r}.")
    lower, upper, static = _fori_bounds(lower, upper)
    # Errors name body_fun's val; the loop's own counter leads the carry.
    names = Names(where, "body_fun", "init_val", carry_label(body_fun, 1, "val", skip=1))
    if static:
        length = max(upper - lower, 0)
        step = cached_wrapper(body_fun, _fori_scan_step, "fori_loop")
        (_, val), _ = _scan(
            step,
            (lower, init_val),
            None,
            length,
            False,
            False if unroll is None else unroll,
            schedule,
            names,
        )
        return val
    if unroll is not None and unroll is not False and unroll != 1:
        raise ValueError(
            f"{where}: unroll needs static loop bounds (Python ints); got traced ones, which run "
            "retrograde.while_loop."
        )
    if schedule is not None and not isinstance(schedule, Online):
        raise ValueError(
            f"{where}: with traced bounds the step count is unknown until the loop runs, so the "
            f"loop runs retrograde.while_loop and schedule must be an online schedule such as "
            f"retrograde.schedules.Online(16), got {schedule!r}. Pass static bounds (Python ints) "
            "to use an offline schedule."
        )
    step = cached_wrapper(body_fun, _fori_while_step, "fori_loop while")
    _, _, val = named_while_loop(
        _fori_cond, step, (lower, upper, init_val), schedule, None, None, None, names
    )
    return val


def _fori_bounds(lower, upper) -> tuple[Any, Any, bool]:
    """``(lower, upper, static)``: Python ints if both bounds are concrete (truncated with
    ``int``, floats too), else the bounds in their common dtype (a floating one counts in
    floats). As in ``jax.lax.fori_loop``, the dtypes must be equal unless one bound is weakly
    typed (a Python int) and both are signed (it then takes the other's); otherwise
    ``TypeError``, as for a bound that is not a real scalar."""
    where = "retrograde.fori_loop"
    dtypes, weak = [], []
    for name, b in (("lower", lower), ("upper", upper)):
        d = getattr(b, "dtype", None)
        ok = not isinstance(b, (bool, np.bool_)) and (
            isinstance(b, (int, float))
            or (
                d is not None
                and jnp.ndim(b) == 0
                and (jnp.issubdtype(d, jnp.integer) or jnp.issubdtype(d, jnp.floating))
            )
        )
        if not ok:
            raise TypeError(
                f"{where}: {name} must be a real scalar, normally an integer (a Python int for a "
                f"fixed number of steps), got {b!r}."
            )
        a = core.typeof(jnp.asarray(b) if isinstance(b, (int, float)) else b)
        dtypes.append(a.dtype)
        weak.append(isinstance(b, (int, float)) or a.weak_type)
    dtype = dtypes[0]
    if dtypes[0] != dtypes[1]:
        signed = all(jnp.issubdtype(d, jnp.signedinteger) for d in dtypes)
        if not signed or weak[0] == weak[1]:
            raise TypeError(
                f"{where}: lower and upper must have equal dtypes, or one be a Python int and "
                f"both signed; got {dtypes[0].name} and {dtypes[1].name}."
            )
        dtype = dtypes[1] if weak[0] else dtypes[0]
    if not isinstance(lower, core.Tracer) and not isinstance(upper, core.Tracer):
        return int(lower), int(upper), True
    lower, upper = (
        b if d == dtype else lax.convert_element_type(b, dtype)
        for b, d in zip((lower, upper), dtypes)
    )
    return lower, upper, False


def _fori_scan_step(get_fun):
    def step(carry, _):
        i, val = carry
        return (i + 1, get_fun()(i, val)), None

    return step


def _fori_while_step(get_fun):
    def step(carry):
        i, upper, val = carry
        return i + 1, upper, get_fun()(i, val)

    return step


def _fori_cond(carry):
    i, upper, _ = carry
    return i < upper
