"""``fwd_p``: the loop's forward sweep, ``F(z)`` (and the snapshots, with ``save``).

Its JVP is ``fwd_p`` with ``save`` and a ``tan_p`` (:mod:`._tan_p`) reading the snapshots; it is
never transposed (the snapshots are a cache). See :mod:`._primitives` for the notation.

``kept`` (with ``save``): ``None``, or the masks ``(dc, dk, dx)`` of the leaves with tangents,
in which the forward linearizes the steps of the schedule's lead leaf (mixed checkpointing,
:attr:`._tables.Tables.lead`) keeping their data for the adjoint (``adj_p`` with the same
``kept``), which then evaluates none of them again. Set by the first-order JVP; a JVP of
``fwd_p`` with ``save`` (a second order, whose augmented sweep shares the snapshots and their
tangents) lays states only where the snapshots get tangents: its lead data rows come out zero,
and ``tan_p`` and ``adj_p`` with ``kept`` read snapshots with nonzero tangents as states.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax.extend.core import Primitive

from .._jax_private import ad, core, dispatch, mlir, pe
from . import _batch_levels, _pool
from ._body import Body, cut, jvp_body
from ._forward_sweep import forward
from ._offload import Offload, unread_snapshots_dce
from ._offload_runs import release_with
from ._primitives import (
    LoopPlan,
    abstract_eval,
    batch_axes,
    batched,
    carry_fixpoint,
    lowering,
    nonzero,
    pick,
    split_groups,
    ys_avals,
    zero,
)
from ._tan_p import apply_tangent

fwd_p = Primitive("retrograde_forward")
fwd_p.multiple_results = True


def _fwd_eager(*args, **params):
    """``fwd_p`` run on its own: a store of offloaded snapshots is released with its handle if no
    reverse sweep reads it first (e.g. after ``jax.jvp``, or a dropped ``jax.vjp`` function)."""
    outs = dispatch.apply_primitive(fwd_p, *args, **params)
    if params["save"] and params["plan"].offload is not None:
        release_with(outs[-1])
    return outs


fwd_p.def_impl(_fwd_eager)


# ----------------------------------------------------------------------------- input groups


class FwdArgs(NamedTuple):
    """Inputs of ``fwd_p``: the loop's inputs."""

    consts: list
    carry: list
    xs: list

    @classmethod
    def of(cls, args, body: Body):
        return split_groups(cls, args, [body.nc, body.nk, body.nx])


# ----------------------------------------------------------------------------- abstract evaluation


def _fwd_outs(body, plan, save, kept):
    outs = list(body.carry_avals) + ys_avals(body, plan.length)
    return outs + (plan.snapshot_avals(body, kept) if save else [])


fwd_p.def_effectful_abstract_eval(
    abstract_eval(
        lambda body, plan, save, kept: _fwd_outs(body, plan, save, kept),
        lambda plan, save, kept: save,
    )
)


# ----------------------------------------------------------------------------- lowering


def _fwd_impl(args, body, plan, save, kept, axes):
    a = FwdArgs.of(args, body)
    tables = plan.tables() if save else None
    off = (
        Offload.open(tables.offload) if tables is not None and tables.offload is not None else None
    )
    lead = _pool.lead(body, tables, kept, bool(axes)) if save and kept is not None else None
    carry, ys, snaps = forward(
        body,
        plan.length,
        a.consts,
        a.carry,
        a.xs,
        tables,
        unroll=plan.unroll,
        batched=bool(axes),
        off=off,
        lead=lead,
    )
    return [*carry, *ys, *snaps, *([off.handle] if off is not None else [])]


mlir.register_lowering(fwd_p, lowering(_fwd_impl))


# ----------------------------------------------------------------------------- bind


def forward_loop(body: Body, plan: LoopPlan, consts, carry, xs, save=False, kept=None) -> list:
    """Bind ``fwd_p``: the outputs ``carry_N, ys`` (and the snapshots, with ``save``; with
    ``kept``, the lead leaf's data too)."""
    return fwd_p.bind(
        *consts, *carry, *xs, body=body, plan=plan, save=save, kept=kept, batch_levels=()
    )


# ----------------------------------------------------------------------------- JVP


def _fwd_jvp(primals, tangents, *, body, plan, save, kept, batch_levels):
    a, t = FwdArgs.of(primals, body), FwdArgs.of(tangents, body)
    masks = [tuple(nonzero(v) for v in g) for g in t]
    mk = jvp_body(body, *masks)[1]
    # When ``save`` is already set, an adjoint of an inner derivative reads these snapshots.
    # The transpose of this tangent then re-lays its own instead of sharing them: sharing would
    # keep them alive (and force a copy) beside the inner derivative's augmented sweeps; this
    # costs one extra forward sweep, at higher order only.
    # The snapshots' tangents are saved only for an adjoint that reads the snapshots (``save``).
    save_tangents = save and plan.offload is None
    # A first order keeps the lead leaf's data, linearized in the leaves with tangents. Snapshots
    # an augmented sweep shares with their (nonzero) tangents hold states only: their lead data
    # rows come out zero, and the adjoints that read them know them by their tangents.
    if not save:
        lay = plan.lead_data(body, (masks[0], mk, masks[2]))
    else:
        shared = save_tangents and any(st and m for st, m in zip(body.stored, mk))
        lay = None if shared else kept
    outs = forward_loop(body, plan, a.consts, a.carry, a.xs, save=True, kept=lay)
    carry, ys, snaps = cut(outs, [body.nk, body.ny, plan.n_snapshots(body, lay)])
    n_states = plan.n_snapshots(body)
    tk, ty, *saved = apply_tangent(
        body, plan, a, [] if save else snaps, t, save_tangents=save_tangents, kept=lay
    )
    if not save:
        return [*carry, *ys], [*tk, *ty]
    dsnaps = saved[0] if save_tangents else [zero(core.typeof(v)) for v in snaps[:n_states]]
    rest = plan.snapshot_avals(body, kept)[n_states:]
    if lay is None:
        snaps = snaps + [jnp.zeros(r.shape, r.dtype) for r in rest]
    return [*carry, *ys, *snaps], [*tk, *ty, *dsnaps, *(zero(r) for r in rest)]


ad.primitive_jvps[fwd_p] = _batch_levels.jvp_rule(_fwd_jvp)


# ----------------------------------------------------------------------------- dead code


def _fwd_dce(used_outputs, eqn):
    body = eqn.params["body"]
    return unread_snapshots_dce(used_outputs, eqn, body.nk + body.ny, body.effects)


pe.dce_rules[fwd_p] = _fwd_dce


# ----------------------------------------------------------------------------- batching


def _fwd_out_axes(axis, dims, *, body, plan, save, kept):
    d = FwdArgs.of(dims, body)
    carry_b, ys_b = carry_fixpoint(
        body.jaxpr, axis, batched(d.consts), batched(d.carry), batched(d.xs), body.nk
    )
    snaps = 2 * batch_axes(pick(body.stored, carry_b)) if save else []
    if save and kept is not None:  # the data may vary with any input: all batched if one is
        any_b = any(v is not None for v in dims)
        snaps = [0 if any_b else None] * plan.n_snapshots(body, kept)
    handle = [None] if save and plan.offload is not None else []
    return batch_axes(carry_b) + batch_axes(ys_b) + snaps + handle


_batch_levels.batcher(fwd_p, _fwd_out_axes)
