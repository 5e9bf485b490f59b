"""Three primitives whose rules close under every JAX transformation.

Notation (``../shared/design/derivatives.md``): ``z = (consts, carry_0, xs)`` are the inputs of a
loop with body ``P``, ``F(z) = (carry_N, ys)`` its outputs, ``J = dF/dz``, and ``ck`` the
snapshots laid by the forward sweep (a cache: a function of ``z``, so no derivative flows through
it).

================  =====================================================  ===================
primitive         computes                                               linear in
================  =====================================================  ===================
``fwd_p``         ``F(z)`` (and ``ck`` when ``save``)                    -
``tan_p``         ``J(z) z_dot``: the forward loop of ``jvp(P)``         ``z_dot``
``adj_p``         ``J(z)^T w``: the schedule's reverse sweep             ``w``
================  =====================================================  ===================

Rules:

- JVP of ``fwd_p``: ``fwd_p`` with ``save=True`` and ``tan_p(z, ck; z_dot)``.
- Transpose of ``tan_p`` in ``z_dot``: ``adj_p(z, ck; ct)``.
- Transpose of ``adj_p`` in ``w``: ``tan_p(z, ck; ct)``.
- JVP of ``tan_p``: ``tan_p`` of the body ``jvp(P)`` (the tangent-of-tangent part).
- JVP of ``adj_p``: ``J^T w_dot + Hess<w, F> z_dot``, which is the ``z``-half of
  ``adj_p`` on ``jvp(P)`` with cotangent ``(w_dot, w)``.
- Transpose of that (``adj_p`` on ``C = jvp(Q)`` with the tangent half of ``z`` and the primal
  half of the cotangent unknown): ``z_dot_bar = Hess<w, F_Q> ct`` (the Hessian is symmetric, so it
  is the same JVP-of-adjoint again) and ``w_dot_bar = J_Q ct`` (a ``tan_p``). No reverse sweep is
  ever transposed, so every order runs in memory bounded by the schedule: the snapshots of a
  ``k``-times augmented body hold ``2^k`` copies of the carry.
- Batching: the body is vmapped; every input is given the batch axis (axis 0, or axis 1 for
  arrays whose leading axis is time or the snapshot slot).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax._src import core, dispatch
from jax._src.interpreters import ad, batching, mlir
from jax._src.interpreters import partial_eval as pe
from jax.extend.core import Primitive

from ._body import Body, batch_body, is_float, jvp_body, split
from ._execute import adjoint, adjoint_while, advance_steps, forward
from ._plan import compile_plan

fwd_p = Primitive("retrograde_forward")
tan_p = Primitive("retrograde_tangent")
adj_p = Primitive("retrograde_adjoint")
for _p in (fwd_p, tan_p, adj_p):
    _p.multiple_results = True
    _p.def_impl(lambda *args, _p=_p, **params: dispatch.apply_primitive(_p, *args, **params))


# ----------------------------------------------------------------------------- helpers


def _timed(aval, n):
    return core.ShapedArray((n,) + tuple(aval.shape), aval.dtype)


def _floats(avals):
    return [is_float(a) for a in avals]


def _nz(t) -> bool:
    return type(t) is not ad.Zero


def _zero(aval):
    return ad.Zero(aval.to_tangent_aval())


def _inst(t):
    return ad.instantiate_zeros(t)


def _expand(mask, values, avals):
    """Full list over leaves: the next value where ``mask``, a symbolic zero elsewhere."""
    it = iter(values)
    return [next(it) if m else _zero(a) for m, a in zip(mask, avals)]


def _pick(mask, values):
    return [v for v, m in zip(values, mask) if m]


def _ck_avals(body: Body, n_slots: int, dynamic: bool = False):
    slots = [_timed(a, n_slots) for a in body.snapshot_avals]
    if dynamic:
        return slots + [core.ShapedArray((n_slots,), jnp.int32)]
    return slots + list(body.carry_avals)


def _undef(x) -> bool:
    return ad.is_undefined_primal(x)


# ----------------------------------------------------------------------------- abstract eval


def _fwd_abstract(*args, body, length, schedule, save):
    outs = list(body.carry_avals) + [_timed(a, length) for a in body.y_avals]
    if save:
        outs += _ck_avals(body, compile_plan(schedule, length).n_slots)
    return outs, body.effects


def _tan_abstract(*args, body, length, schedule, has_ck, masks):
    mc, mk, mx = masks
    child, _, my = jvp_body(body, mc, mk, mx)
    outs = [a.to_tangent_aval() for a, m in zip(body.carry_avals, mk) if m]
    outs += [_timed(a.to_tangent_aval(), length) for a, m in zip(body.y_avals, my) if m]
    return outs, child.effects


def _adj_abstract(*args, body, length, schedule, has_ck, ymask, keep):
    cmask, xmask = keep
    outs = _pick(cmask, [a for a in body.const_avals if is_float(a)])
    outs += [a for a in body.carry_avals if is_float(a)]
    outs += _pick(xmask, [_timed(a, length) for a in body.x_avals if is_float(a)])
    return outs, body.effects


fwd_p.def_effectful_abstract_eval(_fwd_abstract)
tan_p.def_effectful_abstract_eval(_tan_abstract)
adj_p.def_effectful_abstract_eval(_adj_abstract)


# ----------------------------------------------------------------------------- lowering


def _ck_size(body, has_ck, length):
    """Number of snapshot inputs: (slots, u_{N-1}) for a known length, (slots, held) otherwise."""
    if not has_ck:
        return 0
    return sum(body.stored) + (body.nk if length is not None else 1)


def _npre(length) -> int:
    """A loop of unknown length takes its step count as a leading int32 input."""
    return 0 if length is not None else 1


def _n_slots(schedule, length) -> int:
    return compile_plan(schedule, length).n_slots if length is not None else schedule.snapshots


def _fwd_impl(*args, body, length, schedule, save):
    c, k, x = split(args, [body.nc, body.nk, body.nx])
    carry, ys, slots, cur = forward(body, compile_plan(schedule, length), c, k, x, save)
    return [*carry, *ys, *slots, *cur]


def _tan_impl(*args, body, length, schedule, has_ck, masks):
    mc, mk, mx = masks
    child, _, _ = jvp_body(body, mc, mk, mx)
    pre, c, k, x, _, dc, dk, dx = split(
        args,
        [_npre(length), body.nc, body.nk, body.nx, _ck_size(body, has_ck, length), sum(mc),
         sum(mk), sum(mx)],
    )
    if length is None:
        carry = advance_steps(child, [*c, *dc], [*k, *dk], pre[0])
        return carry[body.nk :]
    plan = compile_plan(schedule, length)
    carry, ys, _, _ = forward(child, plan, [*c, *dc], [*k, *dk], [*x, *dx], save=False)
    return [*carry[body.nk :], *ys[body.ny :]]


def _adj_impl(*args, body, length, schedule, has_ck, ymask, keep):
    nkf = sum(_floats(body.carry_avals))
    pre, c, k, x, ckv, kbar, ybar = split(
        args,
        [_npre(length), body.nc, body.nk, body.nx, _ck_size(body, has_ck, length), nkf,
         sum(ymask)],
    )
    ns = sum(body.stored)
    ck = (ckv[:ns], ckv[ns:]) if has_ck else None
    if length is None:
        ck = (ckv[:ns], ckv[ns]) if has_ck else None
        cbar, kbar0 = adjoint_while(body, schedule.snapshots, pre[0], c, k, ck, kbar, keep)
        return [*cbar, *kbar0]
    plan = compile_plan(schedule, length)
    cbar, kbar0, xbar = adjoint(body, plan, c, k, x, ck, kbar, ybar, ymask, keep)
    return [*cbar, *kbar0, *xbar]


mlir.register_lowering(fwd_p, mlir.lower_fun(_fwd_impl, multiple_results=True))
mlir.register_lowering(tan_p, mlir.lower_fun(_tan_impl, multiple_results=True))
mlir.register_lowering(adj_p, mlir.lower_fun(_adj_impl, multiple_results=True))


# ----------------------------------------------------------------------------- building blocks


def apply_tangent(body, length, schedule, z, ckv, dz, pre=()):
    """``J(z) dz`` as full leaf lists ``(carry_N_dot, ys_dot)`` with symbolic zeros.

    ``z = (consts, carry, xs)`` and ``dz`` alike (entries may be symbolic zeros); ``ckv`` are the
    snapshots (or an empty list).
    """
    c, k, x = z
    dc, dk, dx = dz
    mc = tuple(_nz(t) for t in dc)
    mk0 = tuple(_nz(t) for t in dk)
    mx = tuple(_nz(t) for t in dx)
    y_avals = [_timed(a, length) for a in body.y_avals]
    if not any(mc + mk0 + mx):
        return [_zero(a) for a in body.carry_avals], [_zero(a) for a in y_avals]
    _, mk, my = jvp_body(body, mc, mk0, mx)
    outs = tan_p.bind(
        *pre, *c, *k, *x, *ckv, *_pick(mc, dc), *[_inst(t) for t in _pick(mk, dk)], *_pick(mx, dx),
        body=body, length=length, schedule=schedule, has_ck=bool(ckv), masks=(mc, mk, mx),
    )
    tk, ty = split(outs, [sum(mk), sum(my)])
    return _expand(mk, tk, body.carry_avals), _expand(my, ty, y_avals)


def _all_kept(body):
    """``keep`` selecting every float consts and xs leaf."""
    return (
        tuple(True for a in body.const_avals if is_float(a)),
        tuple(True for a in body.x_avals if is_float(a)),
    )


def apply_adjoint(body, length, schedule, z, ckv, kbar, ybar, pre=(), keep=None):
    """``J(z)^T w`` over the float leaves of ``z``; ``w = (kbar, ybar)`` are full leaf lists over
    the outputs (symbolic zeros allowed; non-float leaves ignored). Returns three lists of
    cotangents of the float leaves of consts, carry and xs (of the consts and xs leaves selected
    by ``keep = (cmask, xmask)``, masks over their float leaves; ``None``: all)."""
    c, k, x = z
    fk, fy = _floats(body.carry_avals), _floats(body.y_avals)
    kbar_f = [_inst(t) for t, f in zip(kbar, fk) if f]
    ybar_f = [t for t, f in zip(ybar, fy) if f]
    ymask = tuple(_nz(t) for t in ybar_f)
    keep = _all_kept(body) if keep is None else keep
    outs = adj_p.bind(
        *pre, *c, *k, *x, *ckv, *kbar_f, *_pick(ymask, ybar_f),
        body=body, length=length, schedule=schedule, has_ck=bool(ckv), ymask=ymask, keep=keep,
    )
    nfc, nfk = sum(keep[0]), sum(fk)
    return split(outs, [nfc, nfk, len(outs) - nfc - nfk])


def adjoint_tangent(body, length, schedule, z, dz, w, dw, pre=(), keep=None):
    """Tangent of ``z, w -> J(z)^T w`` along ``(dz, dw)``: ``J^T dw + Hess<w, F> dz``.

    ``w = (kbar, ybar)`` and ``dw`` are full leaf lists over the outputs (symbolic zeros
    allowed). Computed as the ``z``-half of the adjoint of ``jvp(body)`` with cotangent
    ``(dw, w)``. Returns cotangent lists over the float leaves of consts, carry and xs (those
    selected by ``keep``, as in :func:`apply_adjoint`).
    """
    c, k, x = z
    dc, dk, dx = dz
    kbar, ybar = w
    dkbar, dybar = dw
    mc = tuple(_nz(t) for t in dc)
    mk0 = tuple(_nz(t) for t in dk)
    mx = tuple(_nz(t) for t in dx)
    child, mk, my = jvp_body(body, mc, mk0, mx)
    zc = [*c, *_pick(mc, dc)]
    zk = [*k, *[_inst(t) for t in _pick(mk, dk)]]
    zx = [*x, *_pick(mx, dx)]
    # Cotangent on the child's outputs: (dw on the primal half, w on the tangent half).
    kbar_child = [*dkbar, *_pick(mk, kbar)]
    ybar_child = [*dybar, *_pick(my, ybar)]
    cmask, xmask = _all_kept(body) if keep is None else keep
    # Only the primal half of the child's consts and xs cotangents is wanted.
    child_keep = (cmask + (False,) * sum(mc), xmask + (False,) * sum(mx))
    cc, kk, xx = apply_adjoint(
        child, length, schedule, (zc, zk, zx), [], kbar_child, ybar_child, pre, child_keep
    )
    return cc, kk[: sum(_floats(body.carry_avals))], xx


def _full_from_floats(values, avals):
    it = iter(values)
    return [next(it) if is_float(a) else _zero(a) for a in avals]


# ----------------------------------------------------------------------------- JVP rules


def _fwd_jvp(primals, tangents, *, body, length, schedule, save):
    c, k, x = split(primals, [body.nc, body.nk, body.nx])
    dc, dk, dx = split(tangents, [body.nc, body.nk, body.nx])
    outs = fwd_p.bind(*primals, body=body, length=length, schedule=schedule, save=True)
    carry, ys, ckv = split(outs, [body.nk, body.ny, sum(body.stored) + body.nk])
    # When ``save`` is already set, an adjoint of an inner derivative reads these snapshots.
    # The transpose of this tangent then re-lays its own instead of sharing them: sharing would
    # keep them alive (and force a copy) beside the inner derivative's augmented sweeps; this
    # costs one extra forward sweep, at higher order only.
    tk, ty = apply_tangent(body, length, schedule, (c, k, x), [] if save else ckv, (dc, dk, dx))
    primal_out = [*carry, *ys] + (ckv if save else [])
    tangent_out = [*tk, *ty] + ([_zero(core.typeof(v)) for v in ckv] if save else [])
    return primal_out, tangent_out


def _tan_jvp(primals, tangents, *, body, length, schedule, has_ck, masks):
    mc, mk, mx = masks
    child, _, my = jvp_body(body, mc, mk, mx)
    sizes = [_npre(length), body.nc, body.nk, body.nx, _ck_size(body, has_ck, length),
             sum(mc), sum(mk), sum(mx)]
    pre, c, k, x, _, dc, dk, dx = split(primals, sizes)
    _, tc, tk, tx, _, tdc, tdk, tdx = split(tangents, sizes)
    out = tan_p.bind(*primals, body=body, length=length, schedule=schedule, has_ck=has_ck,
                     masks=masks)
    zk, zy = apply_tangent(
        child, length, schedule, ([*c, *dc], [*k, *dk], [*x, *dx]), [],
        ([*tc, *tdc], [*tk, *tdk], [*tx, *tdx]), pre,
    )
    return out, [*zk[body.nk :], *zy[body.ny :]]


def _adj_jvp(primals, tangents, *, body, length, schedule, has_ck, ymask, keep):
    fk, fy = _floats(body.carry_avals), _floats(body.y_avals)
    nkf = sum(fk)
    sizes = [_npre(length), body.nc, body.nk, body.nx, _ck_size(body, has_ck, length), nkf,
             sum(ymask)]
    pre, c, k, x, _, kbar, ybar = split(primals, sizes)
    _, tc, tk, tx, _, tkbar, tybar = split(tangents, sizes)
    if not any(_nz(t) for t in [*tc, *tk, *tx, *tkbar, *tybar]):
        out = adj_p.bind(*primals, body=body, length=length, schedule=schedule, has_ck=has_ck,
                         ymask=ymask, keep=keep)
        return out, [_zero(core.typeof(o)) for o in out]
    # The primal adjoint re-lays its own snapshots rather than reading the forward's: XLA may
    # run it after the augmented sweep below, and the forward's snapshots would then live beside
    # the augmented ones. One extra forward sweep, at second order only.
    out = adj_p.bind(*pre, *c, *k, *x, *kbar, *ybar, body=body, length=length,
                     schedule=schedule, has_ck=False, ymask=ymask, keep=keep)
    y_avals = [_timed(a, length) for a in body.y_avals]
    w = (
        _full_from_floats(kbar, body.carry_avals),
        _full_from_floats(_expand(ymask, ybar, [a for a, f in zip(y_avals, fy) if f]), y_avals),
    )
    dw = (
        _full_from_floats(tkbar, body.carry_avals),
        _full_from_floats(_expand(ymask, tybar, [a for a, f in zip(y_avals, fy) if f]), y_avals),
    )
    cc, kk, xx = adjoint_tangent(body, length, schedule, (c, k, x), (tc, tk, tx), w, dw, pre,
                                 keep)
    return out, [*cc, *kk, *xx]


ad.primitive_jvps[fwd_p] = _fwd_jvp
ad.primitive_jvps[tan_p] = _tan_jvp
ad.primitive_jvps[adj_p] = _adj_jvp


# ----------------------------------------------------------------------------- transposes


def _tan_transpose(cts, *args, body, length, schedule, has_ck, masks):
    mc, mk, mx = masks
    _, _, my = jvp_body(body, mc, mk, mx)
    sizes = [_npre(length), body.nc, body.nk, body.nx, _ck_size(body, has_ck, length),
             sum(mc), sum(mk), sum(mx)]
    pre, c, k, x, ckv, dc, dk, dx = split(args, sizes)
    if any(_undef(v) for v in [*pre, *c, *k, *x, *ckv]):
        raise NotImplementedError("retrograde: tan_p is linear only in its tangent inputs.")
    ctk, cty = split(cts, [sum(mk), sum(my)])
    y_avals = [_timed(a, length) for a in body.y_avals]
    kbar = _expand(mk, ctk, body.carry_avals)
    ybar = _expand(my, cty, y_avals)
    cb, kb, xb = apply_adjoint(body, length, schedule, (c, k, x), ckv, kbar, ybar, pre)
    full_c = _full_from_floats(cb, body.const_avals)
    full_k = _full_from_floats(kb, body.carry_avals)
    full_x = _full_from_floats(xb, [_timed(a, length) for a in body.x_avals])
    out = [None] * (len(pre) + len(c) + len(k) + len(x) + len(ckv))
    for vals, mask, full in ((dc, mc, full_c), (dk, mk, full_k), (dx, mx, full_x)):
        out += [ct if _undef(v) else None for v, ct in zip(vals, _pick(mask, full))]
    return out


def _adj_transpose(cts, *args, body, length, schedule, has_ck, ymask, keep):
    fk, fy = _floats(body.carry_avals), _floats(body.y_avals)
    nkf = sum(fk)
    sizes = [_npre(length), body.nc, body.nk, body.nx, _ck_size(body, has_ck, length), nkf,
             sum(ymask)]
    pre, c, k, x, ckv, kbar, ybar = split(args, sizes)
    cmask, xmask = keep
    ct_c, ct_k, ct_x = split(cts, [sum(cmask), nkf, sum(xmask)])
    x_avals = [_timed(a, length) for a in body.x_avals]
    # Cotangents over all float consts and xs leaves (zero where this adjoint had no output).
    ct_c = _expand(cmask, ct_c, [a for a in body.const_avals if is_float(a)])
    ct_x = _expand(xmask, ct_x, [a for a in x_avals if is_float(a)])
    if not any(_undef(v) for v in [*c, *k, *x, *ckv]):
        # w -> J^T w is linear; its transpose is ct -> J ct.
        dz = (
            _full_from_floats(ct_c, body.const_avals),
            _full_from_floats(ct_k, body.carry_avals),
            _full_from_floats(ct_x, x_avals),
        )
        tk, ty = apply_tangent(body, length, schedule, (c, k, x), ckv, dz, pre)
        tk_f = [t for t, f in zip(tk, fk) if f]
        ty_f = _pick(ymask, [t for t, f in zip(ty, fy) if f])
        out = [None] * (len(pre) + len(c) + len(k) + len(x) + len(ckv))
        out += [t if _undef(v) else None for v, t in zip([*kbar, *ybar], [*tk_f, *ty_f])]
        return out
    out = _adj_transpose_hessian(c, k, x, ckv, kbar, ybar, body, length, schedule, ymask,
                                 (ct_c, ct_k, ct_x), pre)
    return [None] * len(pre) + out


def _adj_transpose_hessian(c, k, x, ckv, kbar, ybar, body, length, schedule, ymask, ct, pre):
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
    cq, cq_dot = c[: q.nc], c[q.nc :]
    kq, kq_dot = k[: q.nk], k[q.nk :]
    xq, xq_dot = x[: q.nx], x[q.nx :]
    if any(_undef(v) for v in [*cq, *kq, *xq, *ckv]):
        raise NotImplementedError("retrograde: unsupported transposition of the adjoint.")
    fkq, fyq = _floats(q.carry_avals), _floats(q.y_avals)
    nfkq, nfyq = sum(fkq), sum(fyq)
    # Cotangent halves: a (on Q's outputs) and b (on their tangents).
    a_k, b_k = kbar[:nfkq], kbar[nfkq:]
    ymask_a, ymask_b = ymask[:nfyq], ymask[nfyq:]
    n_ya = sum(ymask_a)
    a_y, b_y = ybar[:n_ya], ybar[n_ya:]
    if any(_undef(v) for v in [*b_k, *b_y]):
        raise NotImplementedError("retrograde: the adjoint is not linear in both its inputs.")
    qy_avals = [_timed(a, length) for a in q.y_avals]
    qx_avals = [_timed(a, length) for a in q.x_avals]
    # b as full leaf lists over Q's outputs.
    b_full_k = _expand(mk, b_k, q.carry_avals)
    b_ydot = _expand(ymask_b, b_y, [a for a, m in zip(qy_avals, my) if m])
    b_full_y = _expand(my, b_ydot, qy_avals)
    # ct restricted to the primal half (Q's float leaves).
    nfcq, nfxq = sum(_floats(q.const_avals)), sum(_floats(q.x_avals))
    ct_c, ct_k, ct_x = ct
    dz = (
        _full_from_floats(ct_c[:nfcq], q.const_avals),
        _full_from_floats(ct_k[:nfkq], q.carry_avals),
        _full_from_floats(ct_x[:nfxq], qx_avals),
    )
    zq = (cq, kq, xq)
    # zq_dot_bar = Hess<b, F_Q> ct, over the leaves that carry tangents.
    if any(_undef(v) for v in [*cq_dot, *kq_dot, *xq_dot]):
        zero_w = ([_zero(a) for a in q.carry_avals], [_zero(a) for a in qy_avals])
        hc, hk, hx = adjoint_tangent(
            q, length, schedule, zq, dz, (b_full_k, b_full_y), zero_w, pre
        )
        full_c = _full_from_floats(hc, q.const_avals)
        full_k = _full_from_floats(hk, q.carry_avals)
        full_x = _full_from_floats(hx, qx_avals)
        dots = []
        for vals, mask, full in ((cq_dot, mc, full_c), (kq_dot, mk, full_k),
                                 (xq_dot, mx, full_x)):
            dots.append([h if _undef(v) else None for v, h in zip(vals, _pick(mask, full))])
        out_c, out_k, out_x = dots
    else:
        out_c, out_k, out_x = [None] * len(cq_dot), [None] * len(kq_dot), [None] * len(xq_dot)
    out = [None] * len(cq) + out_c + [None] * len(kq) + out_k + [None] * len(xq) + out_x
    out += [None] * len(ckv)
    # a_bar = J_Q ct.
    if any(_undef(v) for v in [*a_k, *a_y]):
        tk, ty = apply_tangent(q, length, schedule, zq, [], dz, pre)
        tk_f = [t for t, f in zip(tk, fkq) if f]
        ty_f = _pick(ymask_a, [t for t, f in zip(ty, fyq) if f])
        a_k_bar = [t if _undef(v) else None for v, t in zip(a_k, tk_f)]
        a_y_bar = [t if _undef(v) else None for v, t in zip(a_y, ty_f)]
    else:
        a_k_bar, a_y_bar = [None] * len(a_k), [None] * len(a_y)
    # The inputs are ordered (kbar = [a_k, b_k], ybar = [a_y, b_y]).
    out += a_k_bar + [None] * len(b_k) + a_y_bar + [None] * len(b_y)
    return out


ad.primitive_transposes[tan_p] = _tan_transpose
ad.primitive_transposes[adj_p] = _adj_transpose


# ----------------------------------------------------------------------------- dead code


def _adj_dce(used_outputs, eqn):
    """Drop the consts and xs cotangents nobody reads: the adjoint then holds those leaves
    constant, so they cost neither per-step work nor memory (an unread ``xs`` cotangent would
    be an ``O(N)`` buffer). Carry cotangents are the sweep's state and always stay."""
    if not any(used_outputs) and not eqn.effects:
        return [False] * len(eqn.invars), None
    params = eqn.params
    cmask, xmask = params["keep"]
    nkf = sum(_floats(params["body"].carry_avals))
    uc, _, ux = split(used_outputs, [sum(cmask), nkf, sum(xmask)])
    vc, vk, vx = split(eqn.outvars, [sum(cmask), nkf, sum(xmask)])

    def narrow(mask, used):
        it = iter(used)
        return tuple(m and next(it) for m in mask)

    keep = (narrow(cmask, uc), narrow(xmask, ux))
    if keep == (cmask, xmask):
        return [True] * len(eqn.invars), eqn
    outvars = _pick(uc, vc) + vk + _pick(ux, vx)
    return [True] * len(eqn.invars), eqn.replace(params=dict(params, keep=keep), outvars=outvars)


pe.dce_rules[adj_p] = _adj_dce


# ----------------------------------------------------------------------------- batching


def _layout_fwd(body, save, **_):
    ins = [0] * (body.nc + body.nk) + [1] * body.nx
    outs = [0] * body.nk + [1] * body.ny + ([1] * sum(body.stored) + [0] * body.nk if save else [])
    return ins, outs


def _layout_ck(body, has_ck, length):
    if not has_ck:
        return []
    return [1] * sum(body.stored) + ([0] * body.nk if length is not None else [None])


def _layout_tan(body, has_ck, masks, length, **_):
    mc, mk, mx = masks
    _, _, my = jvp_body(body, mc, mk, mx)
    ck = _layout_ck(body, has_ck, length)
    ins = [None] * _npre(length) + [0] * (body.nc + body.nk) + [1] * body.nx + ck
    ins += [0] * (sum(mc) + sum(mk)) + [1] * sum(mx)
    return ins, [0] * sum(mk) + [1] * sum(my)


def _layout_adj(body, has_ck, ymask, length, keep, **_):
    ck = _layout_ck(body, has_ck, length)
    nkf = sum(_floats(body.carry_avals))
    ins = [None] * _npre(length) + [0] * (body.nc + body.nk) + [1] * body.nx + ck
    ins += [0] * nkf + [1] * sum(ymask)
    outs = [0] * (sum(keep[0]) + nkf) + [1] * sum(keep[1])
    return ins, outs


def _to_axis(x, d, pos, size):
    if pos is None:  # must stay unbatched: a step count, or the slots' step numbers
        if d is not None:
            raise NotImplementedError(
                "retrograde: vmap over a loop whose step count differs per batch element must "
                "batch the loop itself (retrograde.while_loop handles a batched predicate)."
            )
        return x
    if d is None:
        x = jnp.expand_dims(x, pos)
        shape = list(x.shape)
        shape[pos] = size
        return jnp.broadcast_to(x, shape)
    return jnp.moveaxis(x, d, pos)


def _batcher(prim, layout):
    def rule(args, dims, **params):
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        ins, outs = layout(**params)
        args = [_to_axis(a, d, p, size) for a, d, p in zip(args, dims, ins)]
        params = dict(params, body=batch_body(params["body"], size))
        return prim.bind(*args, **params), outs

    return rule


batching.primitive_batchers[fwd_p] = _batcher(fwd_p, _layout_fwd)
batching.primitive_batchers[tan_p] = _batcher(tan_p, _layout_tan)
batching.primitive_batchers[adj_p] = _batcher(adj_p, _layout_adj)
