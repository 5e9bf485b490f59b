"""``adj_p``: ``J(z)^T w``, the schedule's reverse sweep, linear in ``w``.

Its transpose in ``w`` is ``tan_p`` (:mod:`._tan_p`); its JVP is ``adj_jvp_p``
(:mod:`._adj_jvp_p`), whose transpose is again an ``adj_p`` and a ``tan_p`` (the Hessian part
here, :func:`_adj_transpose_hessian`). See :mod:`._primitives` for the notation.

Its ``sums`` parameter (one tuple of vmap axis names per float consts leaf, :func:`no_sums`) makes
its program sum a consts cotangent over those axes, step by step inside the sweep: under
``vmap``, where a transpose would sum a parameter's cotangents over the batch after the sweep
(:func:`._batch_levels.transpose_rule`), the sweep carries one cotangent instead of one per
element, and each step's contribution is summed as it is added.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from jax.extend.core import Primitive

from .._jax_private import ad, core, dispatch, mlir, pe
from . import _batch_levels
from ._body import Body, cut, is_float, jvp_body
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
    n_float,
    nonzero,
    pick,
    split_groups,
    undefined,
    xs_avals,
    ys_avals,
    zero,
)
from ._reverse_sweep import adjoint, adjoint_while
from ._tables import machine_rule
from ._tan_p import apply_tangent

adj_p = Primitive("retrograde_adjoint")
adj_p.multiple_results = True
adj_p.def_impl(lambda *args, **params: dispatch.apply_primitive(adj_p, *args, **params))


# ----------------------------------------------------------------------------- input groups


class AdjArgs(NamedTuple):
    """Inputs of ``adj_p``: the run-time step count (while loops), the loop's inputs, the
    forward sweep's snapshots (or none), the cotangent of every float carry leaf and those of the
    float ``ys`` leaves selected by ``ymask``."""

    steps: list
    consts: list
    carry: list
    xs: list
    snaps: list
    carry_bar: list
    ys_bar: list

    @classmethod
    def of(cls, args, body: Body, plan: LoopPlan, has_snaps: bool, ymask, kept=None):
        return split_groups(cls, args, cls.sizes(body, plan, has_snaps, ymask, kept))

    @staticmethod
    def sizes(body: Body, plan: LoopPlan, has_snaps: bool, ymask, kept=None) -> list[int]:
        return [
            plan.n_steps_inputs,
            body.nc,
            body.nk,
            body.nx,
            plan.n_snapshots(body, kept) if has_snaps else 0,
            n_float(body.carry_avals),
            sum(ymask),
        ]

    @property
    def z(self):
        return self.consts, self.carry, self.xs


class WrtMasks(NamedTuple):
    """Which float leaves ``adj_p`` differentiates with respect to (static, its ``keep``
    parameter): masks over the float leaves of consts, xs and carry. Consts and xs leaves not
    kept get no output (they are held constant, at no cost); carry leaves not kept are held
    constant too and their output cotangent is zero. A carry leaf may be left out only if no
    kept leaf depends on it (those without a tangent in the JVP's fixed point, as ``lax``'s
    loops leave them: e.g. a time that a ``VirtualBrownianTree`` refuses to differentiate)."""

    consts: tuple
    xs: tuple
    carry: tuple

    @classmethod
    def every(cls, body: Body) -> WrtMasks:
        """Every float leaf."""
        return cls(
            *(
                tuple(True for a in avals if is_float(a))
                for avals in (body.const_avals, body.x_avals, body.carry_avals)
            )
        )


def no_sums(body: Body) -> tuple:
    """``sums`` that sum nothing: one empty tuple per float consts leaf."""
    return ((),) * n_float(body.const_avals)


def jvp_sums(body: Body, sums, mc) -> tuple:
    """The ``sums`` of ``jvp(body)`` (:func:`._body.jvp_body` with consts tangents ``mc``): a
    tangent const is summed as its primal is."""
    full = iter(sums)
    per_leaf = [next(full) if is_float(a) else () for a in body.const_avals]
    return tuple(sums) + tuple(
        names for names, m, a in zip(per_leaf, mc, body.const_avals) if m and is_float(a)
    )


def output_sums(params) -> list:
    """The vmap axes each output of ``adj_p`` (or each half of ``adj_jvp_p``'s) is summed over:
    its consts cotangents' ``sums``; carry and xs cotangents none."""
    body, plan, keep = params["body"], params["plan"], params["keep"]
    rest = len(adj_out_avals(body, plan, keep)) - sum(keep.consts)
    return [*pick(keep.consts, params["sums"]), *[()] * rest]


class AdjOuts(NamedTuple):
    """Outputs of ``adj_p``: cotangents of the float consts and xs leaves selected by ``keep``,
    and of every float carry leaf (zero where ``keep.carry`` is False)."""

    consts: list
    carry: list
    xs: list

    @classmethod
    def of(cls, outs, body: Body, keep: WrtMasks):
        return split_groups(cls, outs, [sum(keep.consts), n_float(body.carry_avals), sum(keep.xs)])


# ----------------------------------------------------------------------------- abstract evaluation


def adj_out_avals(body, plan, keep):
    outs = pick(keep.consts, floats_of(body.const_avals, body.const_avals))
    outs += floats_of(body.carry_avals, body.carry_avals)
    if plan.dynamic:
        return outs
    xs = xs_avals(body, plan.length)
    return outs + pick(keep.xs, floats_of(xs, body.x_avals))


adj_p.def_effectful_abstract_eval(
    abstract_eval(
        lambda body, plan, has_snaps, ymask, keep, sums, kept: adj_out_avals(body, plan, keep),
        lambda **params: True,
    )
)


# ----------------------------------------------------------------------------- lowering


def _adj_impl(args, body, plan, has_snaps, ymask, keep, sums, kept, axes):
    a = AdjArgs.of(args, body, plan, has_snaps, ymask, kept)
    sums = pick(keep.consts, sums)
    if plan.dynamic:
        snaps = (a.snaps[:-1], a.snaps[-1]) if has_snaps else None
        cbar, kbar = adjoint_while(
            body,
            plan.n_slots,
            plan.max_steps,
            a.steps[0],
            a.consts,
            a.carry,
            snaps,
            a.carry_bar,
            keep,
            axes,
            plan.offload,
            machine_rule(plan.schedule),
            sums,
        )
        return [*cbar, *kbar]
    cbar, kbar, xbar = adjoint(
        body,
        plan.tables(),
        a.consts,
        a.carry,
        a.xs,
        a.snaps if has_snaps else None,
        a.carry_bar,
        a.ys_bar,
        ymask,
        keep,
        axes,
        sums,
        kept,
    )
    return [*cbar, *kbar, *xbar]


mlir.register_lowering(adj_p, lowering(_adj_impl))


# ----------------------------------------------------------------------------- bind


def apply_adjoint(
    body, plan, z, snaps, kbar, ybar, steps=(), keep=None, sums=None, kept=None
) -> AdjOuts:
    """``J(z)^T w`` over the float leaves of ``z``; ``w = (kbar, ybar)`` are full leaf lists over
    the outputs (symbolic zeros allowed; non-float leaves ignored). Returns the cotangents of the
    float leaves of consts, carry and xs (of those selected by ``keep``, a :class:`WrtMasks`;
    ``None``: all), the consts' summed over the vmap axes ``sums`` names (``None``: none).
    ``kept``: ``fwd_p``'s, for snapshots with the lead leaf's data (``keep`` within it)."""
    c, k, x = z
    kbar_f = [instantiate(t) for t in floats_of(kbar, body.carry_avals)]
    ybar_f = floats_of(ybar, body.y_avals)
    ymask = tuple(nonzero(t) for t in ybar_f)
    keep = WrtMasks.every(body) if keep is None else keep
    args = AdjArgs(list(steps), list(c), list(k), list(x), list(snaps), kbar_f, pick(ymask, ybar_f))
    outs = adj_p.bind(
        *flat(args),
        body=body,
        plan=plan,
        has_snaps=bool(snaps),
        ymask=ymask,
        keep=keep,
        sums=no_sums(body) if sums is None else tuple(sums),
        kept=kept if snaps else None,
        batch_levels=(),
    )
    return AdjOuts.of(outs, body, keep)


def adjoint_tangent(
    body, plan, z, dz, w, dw, steps=(), keep=None, primal=False, snaps=(), sums=None
):
    """Tangent of ``z, w -> J(z)^T w`` along ``(dz, dw)``: ``J^T dw + Hess<w, F> dz``.

    ``w = (kbar, ybar)`` and ``dw`` are full leaf lists over the outputs (symbolic zeros
    allowed). Computed as the ``z``-half of the adjoint of ``jvp(body)`` with cotangent
    ``(dw, w)``. Returns cotangents over the float leaves of consts, carry and xs (those
    selected by ``keep``, as in :func:`apply_adjoint`), an :class:`AdjOuts`.

    With ``primal``, returns ``(J^T w, tangent)``: ``J^T w`` is the cotangent of the tangent
    half of the same sweep, so it costs no sweep of its own. That needs a tangent on every float
    carry leaf and on every kept consts and xs leaf, and every carry leaf kept. ``snaps``: the
    augmented body's snapshots, if the forward laid them (else the sweep lays its own).
    ``sums``: as :func:`apply_adjoint`'s, over ``body``'s float consts.
    """
    c, k, x = z
    dc, dk, dx = dz
    kbar, ybar = w
    dkbar, dybar = dw
    mc = tuple(nonzero(t) for t in dc)
    mk0 = tuple(nonzero(t) for t in dk)
    mx = tuple(nonzero(t) for t in dx)
    child, mk, my = jvp_body(body, mc, mk0, mx)
    zc = [*c, *pick(mc, dc)]
    zk = [*k, *[instantiate(t) for t in pick(mk, dk)]]
    zx = [*x, *pick(mx, dx)]
    # Cotangent on the child's outputs: (dw on the primal half, w on the tangent half).
    kbar_child = [*dkbar, *pick(mk, kbar)]
    ybar_child = [*dybar, *pick(my, ybar)]
    keep = WrtMasks.every(body) if keep is None else keep
    # Only the primal half of the child's consts and xs cotangents is wanted; its carry is
    # differentiated where the parent's is, and on every tangent leaf.
    # With ``primal``, also the tangent halves of the kept consts and xs leaves.
    tc = tuple(pick(mc, full_mask(keep.consts, body.const_avals))) if primal else ()
    tx = tuple(pick(mx, full_mask(keep.xs, body.x_avals))) if primal else ()
    child_keep = WrtMasks(
        keep.consts + (tc or (False,) * sum(mc)),
        keep.xs + (tx or (False,) * sum(mx)),
        keep.carry + (True,) * sum(mk),
    )
    sums = no_sums(body) if sums is None else sums
    out = apply_adjoint(
        child,
        plan,
        (zc, zk, zx),
        list(snaps),
        kbar_child,
        ybar_child,
        steps,
        child_keep,
        jvp_sums(body, sums, mc),
    )
    nc, nf, nx = sum(keep.consts), n_float(body.carry_avals), sum(keep.xs)
    tangent = AdjOuts(out.consts[:nc], out.carry[:nf], out.xs[:nx])
    if not primal:
        return tangent
    assert sum(tc) == nc and sum(tx) == nx and all(keep.carry) and len(out.carry) == 2 * nf
    return AdjOuts(out.consts[nc:], out.carry[nf:], out.xs[nx:]), tangent


# ----------------------------------------------------------------------------- JVP


def _adj_jvp(primals, tangents, *, body, plan, has_snaps, ymask, keep, sums, kept, batch_levels):
    a = AdjArgs.of(primals, body, plan, has_snaps, ymask, kept)
    t = AdjArgs.of(tangents, body, plan, has_snaps, ymask, kept)
    if kept is not None and any(nonzero(v) for v in t.snaps):
        # Snapshots with tangents were laid by a JVP of ``fwd_p``: states only (see there).
        n = plan.n_snapshots(body)
        a, t, kept = a._replace(snaps=a.snaps[:n]), t._replace(snaps=t.snaps[:n]), None
    if not any(nonzero(v) for v in [*t.consts, *t.carry, *t.xs, *t.carry_bar, *t.ys_bar]):
        out = adj_p.bind(
            *flat(a),
            body=body,
            plan=plan,
            has_snaps=has_snaps,
            ymask=ymask,
            keep=keep,
            sums=sums,
            kept=kept,
            batch_levels=(),
        )
        return out, [zero(core.typeof(o)) for o in out]
    from ._adj_jvp_p import AdjJvpArgs, adj_jvp_p  # the JVP's primitive: it imports this module

    args, masks = AdjJvpArgs.pack(body, a, t)
    outs = adj_jvp_p.bind(
        *args.flat(),
        body=body,
        plan=plan,
        has_snaps=bool(args.dsnaps),
        ymask=ymask,
        keep=keep,
        masks=masks,
        sums=sums,
        batch_levels=(),
    )
    return cut(outs, [len(outs) // 2, len(outs) // 2])


ad.primitive_jvps[adj_p] = _batch_levels.jvp_rule(_adj_jvp)


# ----------------------------------------------------------------------------- transpose


def _adj_transpose(cts, *args, body, plan, has_snaps, ymask, keep, sums, kept, batch_levels):
    # A consts cotangent summed over vmap axes (``sums``) is, per element, the element's own
    # plus the others': each element's transpose gets the cotangent whole (the batching rule
    # passes it so), as the transpose of ``lax.psum`` over a vmap axis does.
    a = AdjArgs.of(args, body, plan, has_snaps, ymask, kept)
    ct = AdjOuts.of(cts, body, keep)
    x_avals = xs_avals(body, plan.length) if not plan.dynamic else []
    # Cotangents over all float consts, carry and xs leaves (zero where this adjoint's output
    # is none or constant).
    ct_c = expand(keep.consts, ct.consts, floats_of(body.const_avals, body.const_avals))
    ct_k = expand(
        keep.carry, pick(keep.carry, ct.carry), floats_of(body.carry_avals, body.carry_avals)
    )
    ct_x = expand(keep.xs, ct.xs, floats_of(x_avals, body.x_avals))
    n_pre = len(a.steps) + len(a.consts) + len(a.carry) + len(a.xs) + len(a.snaps)
    if not any(undefined(v) for v in [*a.consts, *a.carry, *a.xs, *a.snaps]):
        # w -> J^T w is linear; its transpose is ct -> J ct.
        dz = (
            full_from_floats(ct_c, body.const_avals),
            full_from_floats(ct_k, body.carry_avals),
            full_from_floats(ct_x, x_avals),
        )
        tk, ty = apply_tangent(body, plan, a.z, a.snaps, dz, a.steps, kept=kept)
        tk_f = floats_of(tk, body.carry_avals)
        ty_f = pick(ymask, floats_of(ty, body.y_avals))
        out = [None] * n_pre
        out += [
            t if undefined(v) else None for v, t in zip([*a.carry_bar, *a.ys_bar], [*tk_f, *ty_f])
        ]
        return out
    out = _adj_transpose_hessian(a, body, plan, ymask, (ct_c, ct_k, ct_x))
    return [None] * len(a.steps) + out


def _adj_transpose_hessian(a: AdjArgs, body, plan, ymask, ct):
    """Transpose of ``(zq_dot, a) -> z-half of adj[jvp(Q)]((zq, zq_dot), (a, b))``.

    That map is ``J_Q^T a + Hess<b, F_Q> zq_dot``; its transpose sends ``ct`` to
    ``zq_dot_bar = Hess<b, F_Q> ct`` (restricted to the leaves that carry tangents) and
    ``a_bar = J_Q ct``.
    """
    q = body.parent
    if q is None:
        raise NotImplementedError(
            "retrograde: the adjoint is linear in its cotangent only; cannot transpose it with "
            "respect to the loop inputs."
        )
    mc, mk, mx, my = body.masks
    cq, cq_dot = a.consts[: q.nc], a.consts[q.nc :]
    kq, kq_dot = a.carry[: q.nk], a.carry[q.nk :]
    xq, xq_dot = a.xs[: q.nx], a.xs[q.nx :]
    if any(undefined(v) for v in [*cq, *kq, *xq, *a.snaps]):
        raise NotImplementedError("retrograde: unsupported transposition of the adjoint.")
    nfkq, nfyq = n_float(q.carry_avals), n_float(q.y_avals)
    # Cotangent halves: a (on Q's outputs) and b (on their tangents).
    a_k, b_k = a.carry_bar[:nfkq], a.carry_bar[nfkq:]
    ymask_a, ymask_b = ymask[:nfyq], ymask[nfyq:]
    n_ya = sum(ymask_a)
    a_y, b_y = a.ys_bar[:n_ya], a.ys_bar[n_ya:]
    if any(undefined(v) for v in [*b_k, *b_y]):
        raise NotImplementedError("retrograde: the adjoint is not linear in both its inputs.")
    qy_avals = ys_avals(q, plan.length) if not plan.dynamic else []
    qx_avals = xs_avals(q, plan.length) if not plan.dynamic else []
    # b as full leaf lists over Q's outputs.
    b_full_k = expand(mk, b_k, q.carry_avals)
    b_ydot = expand(ymask_b, b_y, [a_ for a_, m in zip(qy_avals, my) if m])
    b_full_y = expand(my, b_ydot, qy_avals)
    # ct restricted to the primal half (Q's float leaves).
    nfcq, nfxq = n_float(q.const_avals), n_float(q.x_avals)
    ct_c, ct_k, ct_x = ct
    dz = (
        full_from_floats(ct_c[:nfcq], q.const_avals),
        full_from_floats(ct_k[:nfkq], q.carry_avals),
        full_from_floats(ct_x[:nfxq], qx_avals),
    )
    zq = (cq, kq, xq)
    # zq_dot_bar = Hess<b, F_Q> ct, over the leaves that carry tangents.
    if any(undefined(v) for v in [*cq_dot, *kq_dot, *xq_dot]):
        zero_w = ([zero(a_) for a_ in q.carry_avals], [zero(a_) for a_ in qy_avals])
        h = adjoint_tangent(q, plan, zq, dz, (b_full_k, b_full_y), zero_w, a.steps)
        full_c = full_from_floats(h.consts, q.const_avals)
        full_k = full_from_floats(h.carry, q.carry_avals)
        full_x = full_from_floats(h.xs, qx_avals)
        dots = []
        for vals, mask, full in ((cq_dot, mc, full_c), (kq_dot, mk, full_k), (xq_dot, mx, full_x)):
            dots.append([h_ if undefined(v) else None for v, h_ in zip(vals, pick(mask, full))])
        out_c, out_k, out_x = dots
    else:
        out_c, out_k, out_x = [None] * len(cq_dot), [None] * len(kq_dot), [None] * len(xq_dot)
    out = [None] * len(cq) + out_c + [None] * len(kq) + out_k + [None] * len(xq) + out_x
    out += [None] * len(a.snaps)
    # a_bar = J_Q ct.
    if any(undefined(v) for v in [*a_k, *a_y]):
        tk, ty = apply_tangent(q, plan, zq, [], dz, a.steps)
        tk_f = floats_of(tk, q.carry_avals)
        ty_f = pick(ymask_a, floats_of(ty, q.y_avals))
        a_k_bar = [t if undefined(v) else None for v, t in zip(a_k, tk_f)]
        a_y_bar = [t if undefined(v) else None for v, t in zip(a_y, ty_f)]
    else:
        a_k_bar, a_y_bar = [None] * len(a_k), [None] * len(a_y)
    # The cotangent inputs are ordered (carry_bar = [a_k, b_k], ys_bar = [a_y, b_y]).
    out += a_k_bar + [None] * len(b_k) + a_y_bar + [None] * len(b_y)
    return out


ad.primitive_transposes[adj_p] = _batch_levels.transpose_rule(_adj_transpose, output_sums)


# ----------------------------------------------------------------------------- dead code


def adj_dce(used_outputs, eqn, halves=1):
    """Drop the consts and xs cotangents nobody reads: the adjoint then holds those leaves
    constant, so they cost neither per-step work nor memory (an unread ``xs`` cotangent would
    be an ``O(N)`` buffer). Carry cotangents are the sweep's state and always stay. With
    ``halves=2`` (``adj_jvp_p``) the outputs are two :class:`AdjOuts` over the same ``keep``: a
    leaf stays if either reads it."""
    if not any(used_outputs) and not eqn.effects:
        return [False] * len(eqn.invars), None
    params = eqn.params
    old, body = params["keep"], params["body"]
    n = len(used_outputs) // halves
    used = AdjOuts.of([any(used_outputs[i::n]) for i in range(n)], body, old)

    def narrow(mask, used):
        it = iter(used)
        return tuple(m and next(it) for m in mask)

    keep = old._replace(consts=narrow(old.consts, used.consts), xs=narrow(old.xs, used.xs))
    if keep == old:
        return [True] * len(eqn.invars), eqn
    selected = AdjOuts(used.consts, [True] * len(used.carry), used.xs)
    flags = flat(selected) * halves
    batch_levels = tuple(
        dataclasses.replace(lv, out_axes=tuple(pick(flags, lv.out_axes)))
        for lv in params["batch_levels"]
    )
    outvars = pick(flags, eqn.outvars)
    new = eqn.replace(params=dict(params, keep=keep, batch_levels=batch_levels), outvars=outvars)
    return [True] * len(eqn.invars), new


pe.dce_rules[adj_p] = adj_dce


# ----------------------------------------------------------------------------- batching


def _adj_out_axes(axis, dims, *, body, plan, has_snaps, ymask, keep, sums, kept):
    """Every output batched, but the consts cotangents summed over this vmap's axis."""
    check_unbatched_steps(AdjArgs.of(dims, body, plan, has_snaps, ymask, kept).steps)
    params = dict(body=body, plan=plan, keep=keep, sums=sums)
    return [None if axis.name in names else 0 for names in output_sums(params)]


_batch_levels.batcher(adj_p, _adj_out_axes)


def sum_output(eqn, k, name):
    """``eqn`` (an ``adj_p``) with its output ``k`` summed over the vmap axis ``name`` in its
    program, if ``k`` is a consts cotangent (else ``None``): the rule of
    :data:`._batch_levels.summers`."""
    keep, sums = eqn.params["keep"], list(eqn.params["sums"])
    if k >= sum(keep.consts):
        return None
    j = [i for i, m in enumerate(keep.consts) if m][k]  # the float consts leaf
    sums[j] = (*sums[j], name)
    return eqn.replace(params=dict(eqn.params, sums=tuple(sums)))


_batch_levels.summers[adj_p] = sum_output
