"""``tan_p``: ``J(z) z_dot``, the forward loop of ``jvp(P)``, linear in ``z_dot``.

Its transpose in ``z_dot`` is ``adj_p`` (:mod:`._adj_p`); its JVP is ``tan_p`` of the body
``jvp(P)``. See :mod:`._primitives` for the notation.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from jax.extend.core import Primitive

from .._jax_private import ad, core, dispatch, mlir, pe
from . import _batch_levels
from ._body import Body, cut, jvp_body
from ._forward_sweep import advance_steps, forward
from ._offload import Offload, stored_effects
from ._primitives import (
    LoopPlan,
    batch_axes,
    carry_fixpoint,
    check_unbatched_steps,
    expand,
    flat,
    floats_of,
    full_from_floats,
    instantiate,
    lowering,
    nonzero,
    pick,
    split_groups,
    timed,
    undefined,
    xs_avals,
    ys_avals,
    zero,
)
from ._slots import zeros_after

tan_p = Primitive("retrograde_tangent")
tan_p.multiple_results = True
tan_p.def_impl(lambda *args, **params: dispatch.apply_primitive(tan_p, *args, **params))


# ----------------------------------------------------------------------------- input groups


class TanArgs(NamedTuple):
    """Inputs of ``tan_p``: the run-time step count (while loops), the loop's inputs, the
    forward sweep's snapshots (or none), and the tangents of the inputs selected by ``masks``."""

    steps: list
    consts: list
    carry: list
    xs: list
    snaps: list
    dconsts: list
    dcarry: list
    dxs: list

    @classmethod
    def of(cls, args, body: Body, plan: LoopPlan, has_snaps: bool, masks, kept=None):
        mc, mk, mx = masks
        return split_groups(
            cls,
            args,
            [
                plan.n_steps_inputs,
                body.nc,
                body.nk,
                body.nx,
                plan.n_snapshots(body, kept) if has_snaps else 0,
                sum(mc),
                sum(mk),
                sum(mx),
            ],
        )

    @property
    def z(self):
        return self.consts, self.carry, self.xs

    @property
    def dz(self):
        return self.dconsts, self.dcarry, self.dxs


# ----------------------------------------------------------------------------- abstract evaluation


def _saved_tangents(body, masks) -> list[bool]:
    """The stored carry leaves whose snapshot tangents ``tan_p`` lays (those with a tangent)."""
    return [st and m for st, m in zip(body.stored, masks[1])]


def _tan_outs(body, plan, masks, save_tangents):
    mc, mk, mx = masks
    _, _, my = jvp_body(body, mc, mk, mx)
    outs = [a.to_tangent_aval() for a, m in zip(body.carry_avals, mk) if m]
    outs += [timed(a.to_tangent_aval(), plan.length) for a, m in zip(body.y_avals, my) if m]
    if save_tangents:  # the snapshots' tangents: rows, then the state u_{N-1}
        saved = pick(_saved_tangents(body, masks), body.carry_avals)
        outs += [timed(a.to_tangent_aval(), plan.slot_rows(body)) for a in saved]
        outs += [a.to_tangent_aval() for a in saved]
    return outs


tan_p.def_effectful_abstract_eval(
    lambda *a, body, plan, has_snaps, masks, save_tangents, kept, batch_levels: (
        _batch_levels.batched_avals(_tan_outs(body, plan, masks, save_tangents), batch_levels),
        jvp_body(body, *masks)[0].effects | (stored_effects(plan.offload) if has_snaps else set()),
    )
)


# ----------------------------------------------------------------------------- lowering


def _tan_impl(args, body, plan, has_snaps, masks, save_tangents, kept, axes):
    a = TanArgs.of(args, body, plan, has_snaps, masks, kept)
    if has_snaps and plan.offload is not None:
        # The tangent loop never reads the snapshots (they are there for its transpose, which
        # would have replaced it): a tangent that runs is their last holder, so it releases them.
        Offload(plan.offload, plan.handle_of(a.snaps)).close()
    child, _, _ = jvp_body(body, *masks)
    consts, carry = [*a.consts, *a.dconsts], [*a.carry, *a.dcarry]
    if plan.dynamic:
        carry = advance_steps(child, consts, carry, a.steps[0], batched=bool(axes))
        return carry[body.nk :]
    # With ``save_tangents``, the child's stored leaves that are tangents (the primals' are in the
    # forward's snapshots): rows, then u_{N-1}.
    saved = [False] * body.nk + list(child.stored[body.nk :])
    tables = plan.tables() if save_tangents else None
    # Slots tied each to its tangent and that tangent's primal (batched as their union, see
    # ``_tan_out_axes``): equal zero-filled slots of the loop's forward sweep would be merged
    # with these into one buffer, copied for each (a third buffer).
    primal_of = [i for i, m in enumerate(masks[1]) if m]
    slots = None
    if save_tangents:
        slots = [
            zeros_after([v.aval], (plan.slot_rows(body),), [v, carry[i]])[0]
            for v, i, st in zip(carry[body.nk :], primal_of, saved[body.nk :])
            if st
        ]
    carry, ys, snaps = forward(
        child,
        plan.length,
        consts,
        carry,
        [*a.xs, *a.dxs],
        tables,
        slots=slots,
        unroll=plan.unroll,
        batched=bool(axes),
        stored=saved,
    )
    return [*carry[body.nk :], *ys[body.ny :], *snaps]


mlir.register_lowering(tan_p, lowering(_tan_impl))


# ----------------------------------------------------------------------------- bind


def apply_tangent(body, plan, z, snaps, dz, steps=(), save_tangents=False, kept=None):
    """``J(z) dz`` as full leaf lists ``(carry_N_dot, ys_dot)`` with symbolic zeros.

    ``z = (consts, carry, xs)`` and ``dz`` alike (entries may be symbolic zeros); ``snaps`` are
    the snapshots (or an empty list), with the lead leaf's data if ``kept`` (``fwd_p``'s);
    ``steps`` the run-time step count (while loops). With
    ``save_tangents`` (a loop of known length without offloaded slots), also the tangents of the
    snapshots that the forward sweep lays, laid out as those (symbolic zeros where a stored
    leaf has no tangent): ``(carry_N_dot, ys_dot, snaps_dot)``.
    """
    c, k, x = z
    dc, dk, dx = dz
    mc = tuple(nonzero(t) for t in dc)
    mk0 = tuple(nonzero(t) for t in dk)
    mx = tuple(nonzero(t) for t in dx)
    y_avals = ys_avals(body, plan.length) if not plan.dynamic else []
    snap_avals = plan.snapshot_avals(body) if save_tangents else []
    if not any(mc + mk0 + mx):
        zeros = [zero(a) for a in body.carry_avals], [zero(a) for a in y_avals]
        return (*zeros, [zero(a) for a in snap_avals]) if save_tangents else zeros
    _, mk, my = jvp_body(body, mc, mk0, mx)
    args = TanArgs(
        list(steps),
        list(c),
        list(k),
        list(x),
        list(snaps),
        pick(mc, dc),
        [instantiate(t) for t in pick(mk, dk)],
        pick(mx, dx),
    )
    outs = tan_p.bind(
        *flat(args),
        body=body,
        plan=plan,
        has_snaps=bool(snaps),
        masks=(mc, mk, mx),
        save_tangents=save_tangents,
        kept=kept if snaps else None,
        batch_levels=(),
    )
    saved = pick(body.stored, _saved_tangents(body, (mc, mk, mx)))
    tk, ty, rows, last = cut(outs, [sum(mk), sum(my), sum(saved), sum(saved)])
    tk, ty = expand(mk, tk, body.carry_avals), expand(my, ty, y_avals)
    if not save_tangents:
        return tk, ty
    ns = sum(body.stored)
    return tk, ty, expand(saved, rows, snap_avals[:ns]) + expand(saved, last, snap_avals[ns:])


# ----------------------------------------------------------------------------- JVP


def _tan_jvp(primals, tangents, *, body, plan, has_snaps, masks, save_tangents, kept, batch_levels):
    a = TanArgs.of(primals, body, plan, has_snaps, masks, kept)
    t = TanArgs.of(tangents, body, plan, has_snaps, masks, kept)
    child, _, _ = jvp_body(body, *masks)
    if kept is not None and any(nonzero(v) for v in t.snaps):
        # Snapshots with tangents were laid by a JVP of ``fwd_p``: states only (see there).
        a, kept = a._replace(snaps=a.snaps[: plan.n_snapshots(body)]), None
    out = tan_p.bind(
        *flat(a),
        body=body,
        plan=plan,
        has_snaps=has_snaps,
        masks=masks,
        save_tangents=save_tangents,
        kept=kept,
        batch_levels=(),
    )
    zk, zy = apply_tangent(
        child,
        plan,
        ([*a.consts, *a.dconsts], [*a.carry, *a.dcarry], [*a.xs, *a.dxs]),
        [],
        ([*t.consts, *t.dconsts], [*t.carry, *t.dcarry], [*t.xs, *t.dxs]),
        a.steps,
    )
    # The saved snapshot tangents are a cache, as snapshots are: no derivative flows through them.
    saved = out[len(zk) - body.nk + len(zy) - body.ny :]
    return out, [*zk[body.nk :], *zy[body.ny :], *(zero(core.typeof(v)) for v in saved)]


ad.primitive_jvps[tan_p] = _batch_levels.jvp_rule(_tan_jvp)


# ----------------------------------------------------------------------------- transpose


def _tan_transpose(cts, *args, body, plan, has_snaps, masks, save_tangents, kept, batch_levels):
    from ._adj_p import WrtMasks, apply_adjoint  # here: _adj_p imports this module

    mc, mk, mx = masks
    _, _, my = jvp_body(body, mc, mk, mx)
    a = TanArgs.of(args, body, plan, has_snaps, masks, kept)
    if any(undefined(v) for v in [*a.steps, *a.consts, *a.carry, *a.xs, *a.snaps]):
        raise NotImplementedError("retrograde: tan_p is linear only in its tangent inputs.")
    ctk, cty = cut(cts, [sum(mk), sum(my)])  # the saved snapshot tangents are a cache
    y_avals = ys_avals(body, plan.length) if not plan.dynamic else []
    kbar = expand(mk, ctk, body.carry_avals)
    ybar = expand(my, cty, y_avals)
    # Carry leaves without a tangent are held constant (nothing with a tangent depends on them).
    keep = WrtMasks.every(body)._replace(carry=tuple(floats_of(mk, body.carry_avals)))
    if kept is not None:  # the data kept are linearized in the leaves with tangents only
        keep = keep._replace(
            consts=tuple(floats_of(mc, body.const_avals)), xs=tuple(floats_of(mx, body.x_avals))
        )
    bar = apply_adjoint(body, plan, a.z, a.snaps, kbar, ybar, a.steps, keep, kept=kept)
    x_avals = xs_avals(body, plan.length) if not plan.dynamic else []
    full = (
        full_from_floats(
            expand(keep.consts, bar.consts, floats_of(body.const_avals, body.const_avals)),
            body.const_avals,
        ),
        full_from_floats(bar.carry, body.carry_avals),
        full_from_floats(expand(keep.xs, bar.xs, floats_of(x_avals, body.x_avals)), x_avals),
    )
    out = [None] * (len(a.steps) + len(a.consts) + len(a.carry) + len(a.xs) + len(a.snaps))
    for vals, mask, f in zip(a.dz, masks, full):
        out += [ct if undefined(v) else None for v, ct in zip(vals, pick(mask, f))]
    return out


ad.primitive_transposes[tan_p] = _batch_levels.transpose_rule(_tan_transpose)


# ----------------------------------------------------------------------------- dead code


def _tan_dce(used_outputs, eqn):
    """Lay no snapshot tangents that nobody reads."""
    if not any(used_outputs) and not eqn.effects:
        return [False] * len(eqn.invars), None
    params = eqn.params
    saves = params["save_tangents"]
    n = len(eqn.outvars) - 2 * sum(_saved_tangents(params["body"], params["masks"])) * saves
    if not saves or any(used_outputs[n:]):
        return [True] * len(eqn.invars), eqn
    batch_levels = tuple(
        dataclasses.replace(lv, out_axes=lv.out_axes[:n]) for lv in params["batch_levels"]
    )
    new = eqn.replace(
        params=dict(params, save_tangents=False, batch_levels=batch_levels), outvars=eqn.outvars[:n]
    )
    return [True] * len(eqn.invars), new


pe.dce_rules[tan_p] = _tan_dce


# ----------------------------------------------------------------------------- batching


def _tan_out_axes(axis, dims, *, body, plan, has_snaps, masks, save_tangents, kept):
    """The batching of the tangent outputs, from the parent body with a leaf batched where its
    value or its tangent is: the tangent of an output depends only on inputs (and their
    tangents) that the output itself depends on. (The tangent body is not analysed: it may hold
    a ``custom_vjp``'s linearisation, which only transposes.)"""
    d = TanArgs.of(dims, body, plan, has_snaps, masks, kept)
    check_unbatched_steps(d.steps)

    def union(values, tangents, mask):
        batched = [v is not None for v in values]
        for j, t in zip((j for j, m in enumerate(mask) if m), tangents):
            batched[j] = batched[j] or t is not None
        return batched

    mc, mk, mx = masks
    carry_b, ys_b = carry_fixpoint(
        body.jaxpr,
        axis,
        union(d.consts, d.dconsts, mc),
        union(d.carry, d.dcarry, mk),
        union(d.xs, d.dxs, mx),
        body.nk,
    )
    _, _, my = jvp_body(body, mc, mk, mx)
    saved = batch_axes(pick(_saved_tangents(body, masks), carry_b)) * 2 if save_tangents else []
    return batch_axes(pick(mk, carry_b)) + batch_axes(pick(my, ys_b)) + saved


_batch_levels.batcher(tan_p, _tan_out_axes)
