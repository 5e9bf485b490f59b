"""``adj_jvp_p``: ``adj_p`` and its tangent, from one augmented reverse sweep: the JVP of
``adj_p`` (:mod:`._adj_p`).

Partial evaluation (``jax.linearize``, ``grad`` of an HVP), its own JVP, and batching where only
tangents are batched split it into the two ``adj_p`` it fuses (:func:`_adj_jvp_split`). See
:mod:`._primitives` for the notation.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive

from .._jax_private import ad, batching, core, dispatch, mlir, pe
from . import _batch_levels
from ._adj_p import AdjArgs, adj_dce, adj_out_avals, adj_p, adjoint_tangent, output_sums
from ._body import Body, cut, is_float
from ._primitives import (
    LoopPlan,
    abstract_eval,
    check_unbatched_steps,
    expand,
    flat,
    floats_of,
    full_from_floats,
    full_mask,
    instantiate,
    lowering,
    nonzero,
    pick,
    xs_avals,
    ys_avals,
)

adj_jvp_p = Primitive("retrograde_adjoint_jvp")
adj_jvp_p.multiple_results = True
adj_jvp_p.def_impl(lambda *args, **params: dispatch.apply_primitive(adj_jvp_p, *args, **params))


# ----------------------------------------------------------------------------- input groups


class AdjJvpArgs(NamedTuple):
    """Inputs of ``adj_jvp_p``: ``primal``, the groups of :class:`._adj_p.AdjArgs`, then the
    tangents that are not symbolic zeros, selected by ``masks``, one mask per group: consts,
    carry, xs, carry_bar, ys_bar. With ``has_snaps``, ``primal.snaps`` are the forward sweep's
    snapshots and ``dsnaps`` their tangents on the float stored leaves (rows, then ``u_{N-1}``),
    laid by the forward's ``tan_p``: together the augmented sweep's snapshots. Without, both
    sweeps lay their own."""

    primal: AdjArgs
    dconsts: list
    dcarry: list
    dxs: list
    dcarry_bar: list
    dys_bar: list
    dsnaps: list

    @classmethod
    def of(cls, args, body: Body, plan: LoopPlan, has_snaps: bool, ymask, masks):
        n_primal = sum(AdjArgs.sizes(body, plan, has_snaps, ymask))
        n_stored = sum(st and is_float(a) for st, a in zip(body.stored, body.carry_avals))
        tangents = cut(
            args[n_primal:], [*(sum(m) for m in masks), 2 * n_stored if has_snaps else 0]
        )
        assert n_primal + sum(map(len, tangents)) == len(args), (len(args), n_primal)
        return cls(AdjArgs.of(args[:n_primal], body, plan, has_snaps, ymask), *tangents)

    def flat(self) -> list:
        return flat(self.primal) + flat(self[1:])

    @classmethod
    def pack(cls, body: Body, a: AdjArgs, t: AdjArgs):
        """From the primals and tangents of ``adj_p``'s inputs: ``(args, masks)``. The
        snapshots are shared if the forward laid their tangents (:func:`._tan_p.apply_tangent`)."""
        groups = (t.consts, t.carry, t.xs, t.carry_bar, t.ys_bar)
        masks = tuple(tuple(nonzero(v) for v in g) for g in groups)
        given = [pick(m, g) for m, g in zip(masks, groups)]
        dsnaps = []
        if any(nonzero(v) for v in t.snaps):
            ns = sum(body.stored)
            fs = [is_float(v) for v in body.snapshot_avals]
            dsnaps = [instantiate(v) for v in pick(fs, t.snaps[:ns]) + pick(fs, t.snaps[ns:])]
        else:
            a = a._replace(snaps=[])
        return cls._make([a, *given, dsnaps]), masks

    def unpack(self, body: Body, plan: LoopPlan, ymask, masks) -> tuple[AdjArgs, AdjArgs]:
        """The primals and tangents of ``adj_p``'s inputs (symbolic zeros off the masks; no
        snapshots)."""
        x_avals = xs_avals(body, plan.length) if not plan.dynamic else []
        y_avals = floats_of(ys_avals(body, plan.length) if not plan.dynamic else [], body.y_avals)
        mc, mk, mx, mkb, myb = masks
        t = AdjArgs(
            [],
            expand(mc, self.dconsts, body.const_avals),
            expand(mk, self.dcarry, body.carry_avals),
            expand(mx, self.dxs, x_avals),
            [],
            expand(mkb, self.dcarry_bar, floats_of(body.carry_avals, body.carry_avals)),
            expand(myb, self.dys_bar, pick(ymask, y_avals)),
        )
        return self.primal._replace(snaps=[]), t


# ----------------------------------------------------------------------------- the split


def _cotangent_lists(body, plan, carry_bar, ys_bar, ymask):
    """``(kbar, ybar)`` as full leaf lists over the outputs, from the float leaves' cotangents
    (``ys_bar`` only where ``ymask``)."""
    y_avals = ys_avals(body, plan.length) if not plan.dynamic else []
    y_float = floats_of(y_avals, body.y_avals)
    return (
        full_from_floats(carry_bar, body.carry_avals),
        full_from_floats(expand(ymask, ys_bar, y_float), y_avals),
    )


def _adj_jvp_split(args, body, plan, has_snaps, ymask, keep, masks, sums):
    """``adj_jvp_p`` as the two ``adj_p`` it fuses: the primal adjoint (which then reads only
    primals) and the ``z``-half of the augmented one. Both lay their own snapshots: the
    forward's would live beside theirs when XLA runs them late, and the augmented one's are
    not transposable inputs."""
    a, t = AdjJvpArgs.of(args, body, plan, has_snaps, ymask, masks).unpack(body, plan, ymask, masks)
    out = adj_p.bind(
        *flat(a),
        body=body,
        plan=plan,
        has_snaps=False,
        ymask=ymask,
        keep=keep,
        sums=sums,
        kept=None,
        batch_levels=(),
    )
    w = _cotangent_lists(body, plan, a.carry_bar, a.ys_bar, ymask)
    dw = _cotangent_lists(body, plan, t.carry_bar, t.ys_bar, ymask)
    tangent = adjoint_tangent(
        body, plan, a.z, (t.consts, t.carry, t.xs), w, dw, a.steps, keep, sums=sums
    )
    return [*out, *flat(tangent)]


def _adj_jvp_split_under(batch_levels, params):
    """:func:`_adj_jvp_split` under the batch levels of an ``adj_jvp_p`` (a function of its
    inputs)."""
    return _batch_levels.vmapped(lambda *args: _adj_jvp_split(args, **params), batch_levels)


# ----------------------------------------------------------------------------- abstract evaluation


adj_jvp_p.def_effectful_abstract_eval(
    abstract_eval(
        lambda body, plan, has_snaps, ymask, keep, masks, sums: 2 * adj_out_avals(body, plan, keep),
        lambda **params: True,
    )
)


# ----------------------------------------------------------------------------- lowering


def _adj_jvp_impl(args, body, plan, has_snaps, ymask, keep, masks, sums):
    """``adj_jvp_p`` in one augmented sweep: zero tangents are given to the float carry leaves
    and the kept consts and xs leaves that have none, so that its tangent half is ``J^T w``
    whole. A carry leaf held constant (``keep.carry``) is held in the primal adjoint only, so
    then the two sweeps run apart. With ``has_snaps`` the sweep reads the forward's snapshots
    and their tangents instead of laying its own."""
    if not all(keep.carry):
        return _adj_jvp_split(args, body, plan, has_snaps, ymask, keep, masks, sums)
    g = AdjJvpArgs.of(args, body, plan, has_snaps, ymask, masks)
    a, t = g.unpack(body, plan, ymask, masks)
    snaps = []
    if has_snaps:  # the augmented body's snapshots: stored leaves, then their tangents
        ns, nd = sum(body.stored), len(g.dsnaps) // 2
        snaps = g.primal.snaps[:ns] + g.dsnaps[:nd] + g.primal.snaps[ns:] + g.dsnaps[nd:]
    x_avals = xs_avals(body, plan.length) if not plan.dynamic else []

    def forced(tangents, avals, mask):
        return [
            jnp.zeros(v.aval.shape, v.aval.dtype) if m and not nonzero(v) else v
            for v, m in zip(tangents, mask)
        ]

    dz = (
        forced(t.consts, body.const_avals, full_mask(keep.consts, body.const_avals)),
        forced(t.carry, body.carry_avals, [is_float(v) for v in body.carry_avals]),
        forced(t.xs, x_avals, full_mask(keep.xs, body.x_avals)),
    )
    w = _cotangent_lists(body, plan, a.carry_bar, a.ys_bar, ymask)
    dw = _cotangent_lists(body, plan, t.carry_bar, t.ys_bar, ymask)
    primal, tangent = adjoint_tangent(
        body, plan, a.z, dz, w, dw, a.steps, keep, primal=True, snaps=snaps, sums=sums
    )
    return [*flat(primal), *flat(tangent)]


mlir.register_lowering(
    adj_jvp_p, lowering(lambda args, axes, **params: _adj_jvp_impl(args, **params))
)


# ----------------------------------------------------------------------------- JVP


def _adj_jvp_jvp(primals, tangents, *, batch_levels, **params):
    """The JVP of the split (whose ``adj_p`` fuse again, one order up)."""
    return jax.jvp(
        lambda *args: _adj_jvp_split(args, **params),
        tuple(primals),
        tuple(instantiate(t) for t in tangents),
    )


ad.primitive_jvps[adj_jvp_p] = _batch_levels.jvp_rule(_adj_jvp_jvp)


# ----------------------------------------------------------------------------- partial evaluation


def _adj_jvp_partial_eval(trace, *tracers, batch_levels, **params):
    """Split ``adj_jvp_p`` when some input is unknown: the primal adjoint's inputs are primals,
    so its outputs stay known (as ``jax.linearize`` requires of primal outputs)."""
    if all(t.pval.is_known() for t in tracers):
        return trace.default_process_primitive(
            adj_jvp_p, tracers, dict(params, batch_levels=batch_levels)
        )
    with core.set_current_trace(trace):
        return _adj_jvp_split_under(batch_levels, params)(*tracers)


pe.custom_partial_eval_rules[adj_jvp_p] = _adj_jvp_partial_eval


def _adj_jvp_partial_eval_custom(saveable, unks_in, inst_in, eqn):
    """As :func:`_adj_jvp_partial_eval` for a jaxpr (``jax.checkpoint``): the split as a call."""
    params = dict(eqn.params)
    batch_levels = params.pop("batch_levels")
    closed = jax.make_jaxpr(_adj_jvp_split_under(batch_levels, params))(
        *(v.aval for v in eqn.invars)
    )
    call = eqn.replace(primitive=core.closed_call_p, params=dict(call_jaxpr=closed))
    return pe.partial_eval_jaxpr_custom_rules[core.closed_call_p](saveable, unks_in, inst_in, call)


pe.partial_eval_jaxpr_custom_rules[adj_jvp_p] = _adj_jvp_partial_eval_custom


# ----------------------------------------------------------------------------- dead code


pe.dce_rules[adj_jvp_p] = lambda used, eqn: adj_dce(used, eqn, halves=2)


# ----------------------------------------------------------------------------- batching


def _adj_jvp_out_axes(data, dims, *, body, plan, has_snaps, ymask, keep, masks, sums):
    """As ``adj_p``'s, for both halves."""
    check_unbatched_steps(AdjJvpArgs.of(dims, body, plan, has_snaps, ymask, masks).primal.steps)
    return 2 * _summed_axes(data.name, dict(body=body, plan=plan, keep=keep, sums=sums))


def _summed_axes(name, params) -> list:
    """Batch axis 0 for each output of ``adj_p``, none for those summed over ``name``."""
    return [None if name in names else 0 for names in output_sums(params)]


_batch_levels.batcher(adj_jvp_p, _adj_jvp_out_axes)
_adj_jvp_batched = batching.fancy_primitive_batchers[adj_jvp_p]


def _adj_jvp_batch(data, args, dims, *, batch_levels, **params):
    """Batch ``adj_jvp_p``; when only tangents are batched (``jax.jacfwd`` of a gradient) its
    primal outputs must stay unbatched, so it runs split: one primal adjoint, unbatched."""
    d = AdjJvpArgs.of(
        dims, params["body"], params["plan"], params["has_snaps"], params["ymask"], params["masks"]
    )
    if any(v is not None for v in flat(d.primal)) or all(v is None for v in dims):
        return _adj_jvp_batched(data, args, dims, batch_levels=batch_levels, **params)
    name = None if data.name is core.no_axis_name else data.name
    n = len(adj_out_avals(params["body"], params["plan"], params["keep"]))
    axes = [None] * n + _summed_axes(name, params)
    outs = jax.vmap(
        _adj_jvp_split_under(batch_levels, params),
        in_axes=list(dims),
        out_axes=axes,
        axis_size=data.size,
        axis_name=name,
        spmd_axis_name=data.spmd_name,
    )(*args)
    return outs, axes


batching.fancy_primitive_batchers[adj_jvp_p] = _adj_jvp_batch
