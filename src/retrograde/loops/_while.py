"""``retrograde.while_loop``: a reverse-differentiable ``jax.lax.while_loop``.

The forward primitive ``while_fwd_p`` runs the loop and, when a derivative needs them, places
snapshots with the ``Online`` rule as the steps arrive (the count is unknown until the predicate
fails). It returns the step count ``N``, and from then on the loop is a loop of ``N`` known steps:
its tangent and adjoint are the same ``tan_p``/``adj_p`` primitives as for ``scan``, with ``N`` as
a run-time input and the reversal generated in the compiled program (``_machine.py``). Derivatives
treat ``N`` as fixed (it is piecewise constant in the inputs).

The step is ``where(pred(u), body(u), u)``: the body itself while the loop runs, and the identity
for elements of a batch (under ``vmap`` with a batched predicate) that stopped before the others,
which run on until every element is done. Tangent and adjoint replay this step, so batching needs
no special case beyond "continue while any element continues". Unbatched, every step the loop runs
or replays is one whose predicate held, so execution skips the guard (``Body.guard``): the
predicate is evaluated once per forward step (twice on step 8192 of a loop that gets that far,
where the ``Online`` rule's table hands over to the rule) and never in the reverse sweep.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
from jax import tree_util
from jax.extend.core import Primitive, jaxpr_as_fun

from .._jax_private import ad, core, dispatch, mlir, pe
from ..schedules import Online, Schedule, check_steps, default_schedule, simulate
from . import _batch_levels, _intern, _pool
from . import _residuals as residuals
from ._body import Body, cut, forward_unchanged, guarded, make_body
from ._carry import (
    Names,
    aval_of,
    carry_label,
    check_structure,
    check_types,
    convert,
    leaf_array,
    leaf_paths,
    step_cache,
    trace_carry,
    with_weak_types,
)
from ._forward_sweep import forward_while
from ._offload import stored_effects, unread_snapshots_dce
from ._offload_runs import release_with
from ._primitives import LoopPlan, carry_fixpoint, zero
from ._tables import machine_rule
from ._tan_p import apply_tangent

T = TypeVar("T")

__all__ = ["while_loop"]

while_fwd_p = Primitive("retrograde_while_forward")
while_fwd_p.multiple_results = True


def _eager(*args, **params):
    """``while_fwd_p`` run on its own: as ``_fwd_p._fwd_eager``, an offloaded store that no
    reverse sweep reads is released with its handle."""
    outs = dispatch.apply_primitive(while_fwd_p, *args, **params)
    if params["save"] and params["plan"].offload is not None:
        release_with(outs[params["body"].nk + 1])
    return outs


while_fwd_p.def_impl(_eager)


def _outs(body, plan, save):
    outs = list(body.carry_avals) + [core.ShapedArray((), jnp.int32)]
    return outs + (plan.snapshot_avals(body) if save else [])


def _abstract(*args, body, cond, plan, save, batch_levels):
    effs = body.effects | cond.effects | (stored_effects(plan.offload) if save else set())
    return _batch_levels.batched_avals(_outs(body, plan, save), batch_levels), effs


while_fwd_p.def_effectful_abstract_eval(_abstract)


def _lowered(*args, body, cond, plan, save, batch_levels):
    axes = _batch_levels.names(batch_levels)

    def run(*args):
        c, k = cut(args, [body.nc, body.nk])
        carry, n, slots, held = forward_while(
            body, cond, plan.n_slots, plan.max_steps, c, k, save, axes, plan.offload
        )
        return [*carry, n, *slots, *([held] if save else [])]

    return _batch_levels.vmapped(run, batch_levels)(*args)


mlir.register_lowering(while_fwd_p, mlir.lower_fun(_lowered, multiple_results=True))


def _jvp(primals, tangents, *, body, cond, plan, save, batch_levels):
    c, k = cut(primals, [body.nc, body.nk])
    dc, dk = cut(tangents, [body.nc, body.nk])
    outs = while_fwd_p.bind(*primals, body=body, cond=cond, plan=plan, save=True, batch_levels=())
    carry, (n,), snaps = cut(outs, [body.nk, 1, plan.n_snapshots(body)])
    # As in ``_fwd_p._fwd_jvp``: at higher order the transpose re-lays its own snapshots.
    tk, _ = apply_tangent(body, plan, (c, k, []), [] if save else snaps, (dc, dk, []), steps=[n])
    primal_out = [*carry, n] + (snaps if save else [])
    tangent_out = [*tk, zero(core.typeof(n))]
    tangent_out += [zero(core.typeof(v)) for v in snaps] if save else []
    return primal_out, tangent_out


ad.primitive_jvps[while_fwd_p] = _batch_levels.jvp_rule(_jvp)


def _out_axes(data, dims, *, body, cond, plan, save):
    """The guarded step makes every carry leaf batched when the predicate is; the step count
    and the held steps never are (the loop runs while any element goes on)."""
    dc, dk = cut(dims, [body.nc, body.nk])
    carry_b, _ = carry_fixpoint(
        body.jaxpr, data, [d is not None for d in dc], [d is not None for d in dk], [], body.nk
    )
    out = [0 if b else None for b in carry_b] + [None]
    if save and plan.offload is not None:  # the store's handle, the tags, the held steps
        out += [None] + [0 if b else None for b, st in zip(carry_b, body.stored) if st] + [None]
    elif save:
        out += [0 if b else None for b, st in zip(carry_b, body.stored) if st] + [None]
    return out


_batch_levels.batcher(while_fwd_p, _out_axes)


def _dce(used_outputs, eqn):
    body = eqn.params["body"]
    return unread_snapshots_dce(
        used_outputs, eqn, body.nk + 1, body.effects | eqn.params["cond"].effects
    )


pe.dce_rules[while_fwd_p] = _dce


def while_loop(
    cond_fun: Callable[[T], jax.Array],
    body_fun: Callable[[T], T],
    init_val: T,
    *,
    schedule: Schedule | None = None,
    max_steps: int | None = None,
    buffers: Callable[[T], object] | None = None,
    first_order_body_fun: Callable[[T], T] | None = None,
) -> T:
    """``jax.lax.while_loop`` that is reverse-differentiable, with snapshots placed online.

    Semantics::

        val, n = init_val, 0
        while cond_fun(val) and (max_steps is None or n < max_steps):
            val, n = body_fun(val), n + 1
        return val

    Args:
        cond_fun: ``val -> bool scalar``.
        body_fun: ``val -> val``, returning ``val`` in the structure, shapes and dtypes it came in
            with (else ``TypeError`` naming the leaf by its path); a weakly typed initial leaf (a
            Python scalar) takes the type ``body_fun`` makes of it, as in ``jax.lax``.
        init_val: a pytree of arrays; integer and boolean leaves get no derivative.
        schedule: ``retrograde.schedules.Online(snapshots)`` (default ``Online(16)``): at most
            ``snapshots`` states are kept, placed as steps arrive; the reversal is the binomial one
            between them. Total evaluations are within a few percent of the offline optimum for the
            number of steps actually taken (see ``benchmarks/schedules.py``). ``Online(snapshots,
            slow=Level(h, storage="host"))`` (or ``"disk"``) places up to ``h`` snapshots in host
            RAM (or a temporary file) and reverses each segment between them with ``snapshots``
            device slots (``docs/offload.md``). ``Online(snapshots, data_size=d)`` (``d``: one
            step's adjoint data in states, a whole number) reverses each segment by mixed
            checkpointing (``Mixed(snapshots, d)``'s tree at its level, ``docs/mixed.md``): never
            more evaluations than ``Online(snapshots)`` in the same temporary memory, the data of
            short segments written into the free snapshot rows (what does not fit there, e.g. an
            HVP's larger data, in rows of its own). The default takes ``Online(16, data_size=d)``
            with ``d`` measured from the traced step where its data share the snapshot rows and
            the step's estimated work is lower with it (:func:`online_default`).
        max_steps: optional cap on the number of steps (as in diffrax).
        buffers: optional ``val -> pytree`` selecting leaves of ``val`` (the same objects) that
            are write-only buffers, e.g. saved outputs: each step may write them
            (``buf.at[i].set(x)``, possibly under ``jnp.where``) but nothing the step computes
            may depend on their values. They are kept once, never copied into a snapshot, and
            their cotangents are exact. A step that reads a buffer raises ``ValueError``.
        first_order_body_fun: optional second implementation of ``body_fun`` (the same function,
            closing over the same values), used wherever the loop *runs* steps or their VJPs (the
            forward pass, recomputation, first-order reverse sweeps) and never where the loop is
            differentiated further (``jvp``, second and higher order use ``body_fun``): e.g. the
            same step with an inner loop whose reverse mode is a ``custom_vjp``, quicker to
            reverse but not forward- or twice-differentiable. Ignored if it closes over a traced
            value that ``body_fun`` does not.

    Returns:
        The final ``val``.

    Cost: ``jax.grad`` runs the ``N`` forward steps, then the online reversal from the held
    snapshots, in memory of ``snapshots`` carries plus one step's VJP working set, for any ``N``.
    Every JAX transformation composes: ``jit``, ``vmap`` (a batched predicate runs until every
    element stops), ``jvp``, ``grad`` of ``grad``, ``jax.hessian``. Derivatives treat the number of
    steps as fixed. Called again (un-jitted) with the same functions and argument types, the loop
    is neither traced nor compiled again; with new functions of the same code and constant types
    (closures created anew per call) it is traced but not compiled again, unless they hold
    functions (``custom_jvp`` rules, callbacks).

    Example:
        >>> import jax, jax.numpy as jnp, retrograde
        >>> def decay(k):
        ...     u = retrograde.while_loop(lambda s: s[1] > 0.1,
        ...                               lambda s: (s[0] + 1.0, s[1] * jnp.exp(-k)),
        ...                               (0.0, 1.0))
        ...     return u[1]
        >>> g = jax.grad(decay)(0.3)
    """
    if not callable(cond_fun) or not callable(body_fun):
        raise TypeError("retrograde.while_loop: cond_fun and body_fun must be callable.")
    names = Names("retrograde.while_loop", "body_fun", "init_val", carry_label(body_fun, 0, "val"))
    return named_while_loop(
        cond_fun, body_fun, init_val, schedule, max_steps, buffers, first_order_body_fun, names
    )


def named_while_loop(
    cond_fun, body_fun, init_val, schedule, max_steps, buffers, first_order_body_fun, names: Names
):
    """:func:`while_loop`, with errors worded by ``names`` (``fori_loop`` runs it too)."""
    where = names.where
    chosen = schedule is None
    if chosen:
        schedule = default_schedule(None, online=True)
    if not isinstance(schedule, Online):
        raise ValueError(
            f"{where}: schedule must be retrograde.schedules.Online(snapshots) (the "
            f"step count is unknown until the loop ends), got {schedule!r}. For a known step "
            "count use retrograde.scan or retrograde.fori_loop with an offline schedule."
        )
    if schedule.slow is not None and schedule.slow.storage == "device":
        raise ValueError(
            f"{where}: schedule={schedule!r} keeps its slow level in device memory; in a compiled "
            "loop the slow level of Online(snapshots, slow=...) must live outside it: give it "
            "storage='host' or storage='disk' (or use Online(snapshots) with more slots)."
        )
    if schedule.data_size is not None:
        try:  # the reversal splits in the graph: the leaf sizes need a band rule
            machine_rule(schedule)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
    if max_steps is not None:
        max_steps = check_steps(max_steps, f"{where}: max_steps")
    if first_order_body_fun is not None and not callable(first_order_body_fun):
        raise TypeError(f"{where}: first_order_body_fun must be callable.")
    flat, tree = tree_util.tree_flatten(init_val)
    originals = list(flat)
    flat = [leaf_array(v, where, names.init) for v in flat]
    stored = _buffer_mask(buffers, init_val, originals)
    key = (tree, tuple(map(aval_of, flat)), stored)
    loop = step_cache.get(
        [body_fun, cond_fun, first_order_body_fun],
        key,
        lambda: _trace_while(cond_fun, body_fun, first_order_body_fun, tree, flat, stored, names),
        lambda lp: lp.consts,
    )
    body, cond, consts = loop.body, loop.cond, loop.consts
    if chosen:
        schedule = online_default(body, max_steps, schedule)
    flat = convert(flat, loop.dtypes)
    outs = while_fwd_p.bind(
        *consts,
        *flat,
        body=body,
        cond=cond,
        plan=LoopPlan(None, schedule, max_steps=max_steps),
        save=False,
        batch_levels=(),
    )
    outs = forward_unchanged(body, flat, outs[: len(flat)])
    return tree_util.tree_unflatten(loop.tree, with_weak_types(outs, loop.out_avals))


# Step counts of a while loop are unknown when tracing: the default's estimate takes
# ``max_steps``, at most this many.
ESTIMATE_STEPS = 1000


def online_default(body: Body, max_steps, online: Online) -> Online:
    """The default schedule of a ``while_loop`` of ``body``: ``Online(s, data_size=d)`` with
    the slots ``s`` of the default ``online`` and ``d`` the measured data of one step (for a
    gradient in every float leaf, rounded up to whole states), where all of its data share the
    snapshot buffers (``_pool``), so it takes ``online``'s memory, and where it does less work
    (``_residuals.mixed_pays``, at ``N = min(max_steps, ESTIMATE_STEPS)``: the step count is
    unknown when tracing); else ``online``. Costs ``O(N)`` when tracing (two simulations)."""
    if online.slow is not None or online.data_size is not None or not any(body.stored):
        return online
    d = residuals.whole_data_size(body, online.snapshots)
    if d is None:
        return online
    mixed = Online(online.snapshots, data_size=d)
    n = ESTIMATE_STEPS if max_steps is None else min(max_steps, ESTIMATE_STEPS)
    lin = residuals.linearization(body, *residuals.every_float(body))
    if n < 3 or not residuals.mixed_pays(
        lin.work(), n, simulate(mixed, n).evaluations, simulate(online, n).evaluations
    ):
        return online
    try:
        rule = machine_rule(mixed)
    except ValueError:  # no band rule for these leaf sizes
        return online
    plan = _pool.MachinePlan(online.snapshots, rule)
    if not _pool.shares_all(body, plan, lin.stored_avals, online.snapshots):
        return online  # some data would not share the snapshot rows
    return mixed


class _Loop(NamedTuple):
    """A traced while loop: step and predicate bodies, their constants, the dtypes weakly typed
    initial leaves are promoted to (or None), and the step's output carry avals and tree."""

    body: Body
    cond: Body
    consts: list
    dtypes: list
    out_avals: list
    tree: Any


def _trace_while(cond_fun, body_fun, fast_fun, tree, flat: list, stored, names: Names) -> _Loop:
    """Trace the predicate and the step(s) with ``jax.lax.while_loop``'s carry typing
    (:func:`~._carry.trace_carry`), and build the loop's bodies."""
    where = names.where
    fast_names = names._replace(fun="first_order_body_fun")

    def flat_step(fun, nm, trees):
        def step(*args):
            carry = tree_util.tree_unflatten(tree, args)
            new = fun(carry)
            new_flat, new_tree = tree_util.tree_flatten(new)
            if new_tree != tree:
                check_structure(nm, carry, new)
            trees.append(new_tree)
            return new_flat

        return step

    def flat_cond(*args):
        out = cond_fun(tree_util.tree_unflatten(tree, args))
        leaves, out_tree = tree_util.tree_flatten(out)
        if not tree_util.treedef_is_leaf(out_tree) or len(leaves) != 1:
            raise TypeError(
                f"{where}: cond_fun must return a boolean scalar, got a pytree {out_tree}."
            )
        ok = jnp.asarray(leaves[0])
        if ok.shape != () or ok.dtype != jnp.bool_:
            raise TypeError(
                f"{where}: cond_fun must return a boolean scalar, got "
                f"{ok.dtype}{list(ok.shape)}; compare it, e.g. n < 10."
            )
        return [ok]

    def trace(avals):
        args = list(avals)
        trees: list[Any] = []
        cond_closed = jax.make_jaxpr(flat_cond)(*args)
        body_closed = jax.make_jaxpr(flat_step(body_fun, names, trees))(*args)
        fast_closed = None
        if fast_fun is not None:
            fast_closed = jax.make_jaxpr(flat_step(fast_fun, fast_names, []))(*args)
        return (cond_closed, body_closed, fast_closed, trees[-1]), body_closed.out_avals

    paths = leaf_paths(tree)
    traced, dtypes = trace_carry(
        trace, flat, lambda avals, out: check_types(names, paths, avals, out)
    )
    cond_closed, body_closed, fast_closed, out_tree = traced
    avals = body_closed.in_avals
    if fast_closed is not None:
        check_types(fast_names, paths, avals, fast_closed.out_avals)
    nk = len(flat)
    consts_b, consts_c = list(body_closed.consts), list(cond_closed.consts)
    fast_where = None  # where the fast body's constants sit among the merged ones
    if fast_closed is not None:
        fast_where, consts_b = _merge_consts(consts_b, list(fast_closed.consts))
    consts = [*consts_b, *consts_c]
    # Bodies of the same structure, built before (e.g. from closures created anew per call), are
    # shared: this trace's constants are their inputs, and nothing is compiled again. The bodies
    # depend on the traced jaxprs, on which constants the two steps share, on the buffers and on
    # the constants' types.
    key = _intern.structure_key(cond_closed, body_closed, fast_closed)
    if key is not None:
        const_types = tuple(core.typeof(c) for c in consts)
        key = ("while", key, None if fast_where is None else tuple(fast_where), stored, const_types)
    body, cond = _intern.bodies.get(
        key,
        lambda: _while_bodies(
            cond_closed, body_closed, fast_closed, fast_where, consts, len(consts_b), nk, stored
        ),
    )
    return _Loop(body, cond, consts, dtypes, list(body_closed.out_avals), out_tree)


def _while_bodies(cond_closed, body_closed, fast_closed, fast_where, consts, nb, nk, stored):
    """The guarded step and the predicate as bodies (:class:`Body`) on the merged constants
    ``consts`` (the step's first ``nb``, then the predicate's) and ``nk`` carry leaves, checked
    for buffer reads."""
    body0, _ = make_body(body_closed, nk, 0)
    cond0, _ = make_body(cond_closed, 0, nk)
    const_sds = [core.typeof(c) for c in consts]
    carry_sds = list(body_closed.in_avals)
    fb, fc = jaxpr_as_fun(body0.jaxpr), jaxpr_as_fun(cond0.jaxpr)
    nb0 = len(body0.const_avals)

    def unguarded(step):
        return jax.make_jaxpr(lambda *a: step(a[:nb], a[len(consts) :]))(*const_sds, *carry_sds)

    def general(c, k):
        return fb(*c[:nb0], *k)

    if fast_where is None:
        step = general
    else:
        ff = jaxpr_as_fun(make_body(fast_closed, nk, 0)[0].jaxpr)

        def step(c, k):
            return ff(*[c[j] for j in fast_where], *k)

    cond = Body(jax.make_jaxpr(lambda *a: fc(*a[nb:]))(*const_sds, *carry_sds), len(consts), 0, nk)
    # where(pred(u), body(u), u): the same as body(u) before the loop stops, and the identity for
    # batch elements that stopped earlier than others (under vmap). Tangent and adjoint replay
    # this body for the N steps, so a batched predicate needs no special case there. Executed
    # unbatched, the loop only runs (and its reversal only replays) steps whose predicate held,
    # so it runs the step without the guard (``Body.guard``).
    plain = unguarded(general)
    body = Body(
        guarded(plain, cond.jaxpr, len(consts), nk),
        len(consts),
        nk,
        0,
        stored=stored,
        fast=plain if step is general else unguarded(step),
        guard=cond.jaxpr,
    )
    if not all(stored):
        check_write_only(body)
    return body, cond


def _merge_consts(consts_b: list, consts_f: list) -> tuple[list[int] | None, list]:
    """Constants of ``body_fun`` followed by those only ``first_order_body_fun`` closes over.

    Returns ``(where, merged)``: ``merged[where[j]]`` is the fast body's ``j``-th constant.
    ``where`` is None (no fast body) if a constant only the fast body has is traced: its
    derivative would be lost, since transformations see only ``body_fun``.
    """
    index = {id(c): i for i, c in enumerate(consts_b)}
    merged, where = list(consts_b), []
    for c in consts_f:
        if id(c) not in index:
            if isinstance(c, core.Tracer):
                return None, list(consts_b)
            index[id(c)] = len(merged)
            merged.append(c)
        where.append(index[id(c)])
    return where, merged


def _buffer_mask(buffers, init_val, leaves) -> tuple[bool, ...]:
    """Which carry leaves go into snapshots (False for the leaves ``buffers`` selects)."""
    if buffers is None:
        return (True,) * len(leaves)
    if not callable(buffers):
        raise TypeError(
            f"retrograde.while_loop: buffers must be a function of init_val, got {buffers!r}."
        )
    chosen = tree_util.tree_leaves(buffers(init_val))
    ids = {id(b) for b in chosen}
    mask = tuple(id(v) not in ids for v in leaves)
    if len(chosen) != len(leaves) - sum(mask):
        raise ValueError(
            "retrograde.while_loop: buffers(init_val) must return leaves of init_val itself (the "
            "same array objects), e.g. buffers=lambda val: val['saved']."
        )
    return mask


_WRITE_OPS = {
    "dynamic_update_slice": (0,),
    "scatter": (0,),
    "select_n": None,
    "copy": (0,),
    "copy_p": (0,),
    "convert_element_type": (0,),
}


def check_write_only(body: Body) -> None:
    """Raise ``ValueError`` if the step reads a buffer leaf (``body.stored`` False).

    Allowed: a buffer's value flows only into the operand of ``dynamic_update_slice``/``scatter``
    (a write at an index), the operands a primitive lists in its ``buffer_operands`` attribute
    (a write primitive, such as ``retrograde.diffrax``'s ``write_once``), the cases (not the
    predicate) of ``select_n``, copies, nested ``jit`` calls obeying the same rules, and the
    buffer's own output. Nothing else may depend on it.
    """
    jaxpr = body.jaxpr.jaxpr
    carry_in = jaxpr.invars[body.nc : body.nc + body.nk]
    tainted = {v: k for k, (v, keep) in enumerate(zip(carry_in, body.stored)) if not keep}
    out_taint = _propagate(jaxpr, tainted)
    for j, k in enumerate(out_taint[: body.nk]):
        if k is not None and body.stored[j]:
            _fail(k, f"it flows into carry leaf {j}, which is not a buffer")


def _fail(k, why):
    raise ValueError(
        f"retrograde.while_loop: buffer leaf {k} (a leaf selected by buffers=) is read by the "
        f"step ({why}). Buffers may only be written at an index, e.g. buf.at[i].set(value), and "
        "nothing may depend on their contents; drop the leaf from buffers= if the step needs "
        "its values."
    )


def _propagate(jaxpr, tainted: dict) -> list:
    """Follow buffer values through ``jaxpr``; return the buffer (or None) behind each output."""
    tainted = dict(tainted)
    for eqn in jaxpr.eqns:
        hits = [
            (i, tainted[v])
            for i, v in enumerate(eqn.invars)
            if not isinstance(v, core.Literal) and v in tainted
        ]
        if not hits:
            continue
        name = eqn.primitive.name
        inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        if name in ("pjit", "jit", "closed_call", "core_call") and inner is not None:
            inner = getattr(inner, "jaxpr", inner)
            sub = {inner.invars[i]: k for i, k in hits}
            for o, k in zip(eqn.outvars, _propagate(inner, sub)):
                if k is not None:
                    tainted[o] = k
            continue
        allowed = _WRITE_OPS.get(name, getattr(eqn.primitive, "buffer_operands", ()))
        for i, k in hits:
            if name == "select_n":
                if i == 0:
                    _fail(k, "it decides a select")
            elif i not in allowed:
                _fail(k, f"it flows into {name}")
        for o in eqn.outvars:
            tainted[o] = hits[0][1]
    return [tainted.get(v) if not isinstance(v, core.Literal) else None for v in jaxpr.outvars]
