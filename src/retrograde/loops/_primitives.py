"""Three primitives whose rules close under every JAX transformation.

Notation (``docs/derivatives.md``): ``z = (consts, carry_0, xs)`` are the inputs of a loop with
body ``P``, ``F(z) = (carry_N, ys)`` its outputs, ``J = dF/dz``, and ``snaps`` the snapshots laid
by the forward sweep (a cache: a function of ``z``, so no derivative flows through it).

================  =====================================================  ===================
primitive         computes                                               linear in
================  =====================================================  ===================
``fwd_p``         ``F(z)`` (and ``snaps`` when ``save``)                 -
``tan_p``         ``J(z) z_dot``: the forward loop of ``jvp(P)``         ``z_dot``
``adj_p``         ``J(z)^T w``: the schedule's reverse sweep             ``w``
``adjt_p``        ``adj_p`` and its tangent, from one augmented sweep    -
================  =====================================================  ===================

Each primitive's inputs come in named groups (:class:`FwdArgs`, :class:`TanArgs`,
:class:`AdjArgs`), split and flattened in one place. The static :class:`Extent` says how many
steps the loop takes: ``length`` when known when tracing; otherwise the count is the ``steps``
group (a while loop, :mod:`._while`), whose snapshots were placed online and carry their steps.

Rules:

- JVP of ``fwd_p``: ``fwd_p`` with ``save=True`` and ``tan_p(z, snaps; z_dot)``. When the
  snapshots are read (``save``), ``tan_p`` also lays their tangents (``lay``: the tangent
  states at the same steps), which the JVP of the ``adj_p`` reading them takes as the tangent
  half of its augmented sweep's snapshots instead of running that sweep's forward again.
- Transpose of ``tan_p`` in ``z_dot``: ``adj_p(z, snaps; ct)``.
- Transpose of ``adj_p`` in ``w``: ``tan_p(z, snaps; ct)``.
- JVP of ``tan_p``: ``tan_p`` of the body ``jvp(P)`` (the tangent-of-tangent part).
- JVP of ``adj_p``: ``J^T w_dot + Hess<w, F> z_dot``, which is the ``z``-half of
  ``adj_p`` on ``jvp(P)`` with cotangent ``(w_dot, w)``; its tangent half is ``J^T w``, the
  primal output. ``adjt_p`` binds both: one augmented sweep where a separate primal sweep would
  cost a whole first-order adjoint more. Partial evaluation (``jax.linearize``, ``grad`` of an
  HVP) and its own JVP split it into the two ``adj_p`` again, since JAX needs primal outputs
  computed from primals alone.
- Transpose of that (``adj_p`` on ``C = jvp(Q)`` with the tangent half of ``z`` and the primal
  half of the cotangent unknown): ``z_dot_bar = Hess<w, F_Q> ct`` (the Hessian is symmetric, so it
  is the same JVP-of-adjoint again) and ``w_dot_bar = J_Q ct`` (a ``tan_p``). No reverse sweep is
  ever transposed, so every order runs in memory bounded by the schedule: the snapshots of a
  ``k``-times augmented body hold ``2^k`` copies of the carry.
- Batching appends a level: the primitive's program runs under ``jax.vmap`` (:mod:`._levels`),
  and the JVP and transpose of a batched primitive are the ``vmap`` of the unbatched rules.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax._src import core, dispatch
from jax._src.interpreters import ad, batching, mlir
from jax._src.interpreters import partial_eval as pe
from jax.extend.core import Primitive

from ..schedules import Schedule
from . import _levels
from ._body import Body, cut, is_float, jvp_body
from ._forward_sweep import advance_steps, forward
from ._reverse_sweep import adjoint, adjoint_while
from ._slots import zeros_after
from ._offload import (
    Layout, Offload, release_with, stored_effects, two_level, unread_snapshots_dce,
)
from ._tables import tables_for

fwd_p = Primitive("retrograde_forward")
tan_p = Primitive("retrograde_tangent")
adj_p = Primitive("retrograde_adjoint")
adjt_p = Primitive("retrograde_adjoint_and_tangent")
for _p in (fwd_p, tan_p, adj_p, adjt_p):
    _p.multiple_results = True
    _p.def_impl(lambda *args, _p=_p, **params: dispatch.apply_primitive(_p, *args, **params))


def _fwd_eager(*args, **params):
    """``fwd_p`` run on its own: a store of offloaded snapshots is released with its handle if no
    reverse sweep reads it first (e.g. after ``jax.jvp``, or a dropped ``jax.vjp`` function)."""
    outs = dispatch.apply_primitive(fwd_p, *args, **params)
    if params["save"] and params["extent"].offload is not None:
        release_with(outs[-1])
    return outs


fwd_p.def_impl(_fwd_eager)


# ----------------------------------------------------------------------------- static parameters


@dataclasses.dataclass(frozen=True)
class Extent:
    """The steps a loop takes and the schedule that reverses them.

    ``length`` is the step count when it is known when tracing (``scan``, ``fori_loop``: an
    offline schedule); ``None`` for a while loop, whose count is a run-time input (the ``steps``
    group), at most ``max_steps`` if given, and whose snapshots, placed online by ``schedule``
    (``Online(s)``), carry the int32 steps they hold. ``unroll`` is the forward sweep's unroll
    factor (a performance hint).
    """

    length: int | None
    schedule: Schedule
    unroll: int = 1
    max_steps: int | None = None

    @property
    def dynamic(self) -> bool:
        return self.length is None

    @property
    def n_steps_inputs(self) -> int:
        return 1 if self.dynamic else 0

    @property
    def n_slots(self) -> int:
        """Snapshot slots (in device memory)."""
        if self.dynamic:
            return self.schedule.snapshots
        return tables_for(self.schedule, self.length).n_slots

    def tables(self):
        return tables_for(self.schedule, self.length)

    @property
    def offload(self) -> Layout | None:
        """Where the slots live when some are outside device memory (host RAM, disk), else
        ``None``; the snapshots then hold the int32 handle of their store (:meth:`handle_of`)."""
        if self.dynamic:
            return two_level(self.schedule)
        return self.tables().offload

    def snapshot_avals(self, body: Body) -> list:
        """The snapshots: ``S`` rows of each stored carry leaf, then the stored leaves of
        ``u_{N-1}`` (known count) or the int32 held steps (run-time count). With offloaded
        slots, the handle of their store follows (known count) or replaces the rows (run-time
        count, ``Online(s, slow=...)``, with the stored leaves' tags: the held steps are those
        of the offloaded slots)."""
        rows = [_timed(a, self.n_slots) for a in body.snapshot_avals]
        handle = [core.ShapedArray((), jnp.int32)] if self.offload is not None else []
        if self.dynamic:
            if handle:  # and the stored leaves' tags (``_offload.tags_of``)
                return handle + [_timed(a, 0) for a in body.snapshot_avals] + [
                    core.ShapedArray((self.offload.n_offloaded,), jnp.int32)]
            return rows + [core.ShapedArray((self.n_slots,), jnp.int32)]
        return rows + list(body.snapshot_avals) + handle

    def handle_of(self, snaps):
        """The handle of the offloaded snapshots' store among the snapshots."""
        return snaps[0] if self.dynamic else snaps[-1]

    def n_snapshots(self, body: Body) -> int:
        return len(self.snapshot_avals(body))


# ----------------------------------------------------------------------------- input groups


def _groups(cls, args, sizes):
    parts = cut(args, sizes)
    assert sum(sizes) == len(args), (cls.__name__, sizes, len(args))
    return cls(*parts)


def _flat(groups) -> list:
    return [v for g in groups for v in g]


class FwdArgs(NamedTuple):
    """Inputs of ``fwd_p``: the loop's inputs."""

    consts: list
    carry: list
    xs: list

    @classmethod
    def of(cls, args, body: Body):
        return _groups(cls, args, [body.nc, body.nk, body.nx])


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
    def of(cls, args, body: Body, extent: Extent, has_snaps: bool, masks):
        mc, mk, mx = masks
        return _groups(cls, args, [
            extent.n_steps_inputs, body.nc, body.nk, body.nx,
            extent.n_snapshots(body) if has_snaps else 0, sum(mc), sum(mk), sum(mx),
        ])

    @property
    def z(self):
        return self.consts, self.carry, self.xs

    @property
    def dz(self):
        return self.dconsts, self.dcarry, self.dxs


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
    def of(cls, args, body: Body, extent: Extent, has_snaps: bool, ymask):
        return _groups(cls, args, cls.sizes(body, extent, has_snaps, ymask))

    @staticmethod
    def sizes(body: Body, extent: Extent, has_snaps: bool, ymask) -> list[int]:
        return [extent.n_steps_inputs, body.nc, body.nk, body.nx,
                extent.n_snapshots(body) if has_snaps else 0, _n_float(body.carry_avals),
                sum(ymask)]

    @property
    def z(self):
        return self.consts, self.carry, self.xs


class Keep(NamedTuple):
    """Which float leaves ``adj_p`` differentiates with respect to (static): masks over the
    float leaves of consts, xs and carry. Consts and xs leaves not kept get no output (they are
    held constant, at no cost); carry leaves not kept are held constant too and their output
    cotangent is zero. A carry leaf may be left out only if no kept leaf depends on it (those
    without a tangent in the JVP's fixed point, as ``lax``'s loops leave them: e.g. a time
    that a ``VirtualBrownianTree`` refuses to differentiate)."""

    consts: tuple
    xs: tuple
    carry: tuple

    @classmethod
    def every(cls, body: Body) -> Keep:
        """Every float leaf."""
        return cls(*(tuple(True for a in avals if is_float(a))
                     for avals in (body.const_avals, body.x_avals, body.carry_avals)))


class AdjOuts(NamedTuple):
    """Outputs of ``adj_p``: cotangents of the float consts and xs leaves selected by ``keep``,
    and of every float carry leaf (zero where ``keep.carry`` is False)."""

    consts: list
    carry: list
    xs: list

    @classmethod
    def of(cls, outs, body: Body, keep: Keep):
        return _groups(cls, outs, [sum(keep.consts), _n_float(body.carry_avals), sum(keep.xs)])


class AdjTanArgs(NamedTuple):
    """Inputs of ``adjt_p``: ``primal``, the groups of :class:`AdjArgs`, then the tangents that
    are not symbolic zeros, selected by ``masks``, one mask per group: consts, carry, xs,
    carry_bar, ys_bar. With ``has_snaps``, ``primal.snaps`` are the forward sweep's snapshots
    and ``dsnaps`` their tangents on the float stored leaves (rows, then ``u_{N-1}``), laid by
    the forward's ``tan_p``: together the augmented sweep's snapshots. Without, both sweeps lay
    their own."""

    primal: AdjArgs
    dconsts: list
    dcarry: list
    dxs: list
    dcarry_bar: list
    dys_bar: list
    dsnaps: list

    @classmethod
    def of(cls, args, body: Body, extent: Extent, has_snaps: bool, ymask, masks):
        n_primal = sum(AdjArgs.sizes(body, extent, has_snaps, ymask))
        n_float = sum(st and is_float(a) for st, a in zip(body.stored, body.carry_avals))
        tangents = cut(args[n_primal:], [*(sum(m) for m in masks),
                                         2 * n_float if has_snaps else 0])
        assert n_primal + sum(map(len, tangents)) == len(args), (len(args), n_primal)
        return cls(AdjArgs.of(args[:n_primal], body, extent, has_snaps, ymask), *tangents)

    def flat(self) -> list:
        return _flat(self.primal) + _flat(self[1:])

    @classmethod
    def pack(cls, body: Body, a: AdjArgs, t: AdjArgs):
        """From the primals and tangents of ``adj_p``'s inputs: ``(args, masks)``. The
        snapshots are shared if the forward laid their tangents (:func:`apply_tangent`)."""
        groups = (t.consts, t.carry, t.xs, t.carry_bar, t.ys_bar)
        masks = tuple(tuple(_nz(v) for v in g) for g in groups)
        nonzero = [_pick(m, g) for m, g in zip(masks, groups)]
        dsnaps = []
        if any(_nz(v) for v in t.snaps):
            ns = sum(body.stored)
            fs = [is_float(v) for v in body.snapshot_avals]
            dsnaps = [_inst(v) for v in _pick(fs, t.snaps[:ns]) + _pick(fs, t.snaps[ns:])]
        else:
            a = a._replace(snaps=[])
        return cls(a, *nonzero, dsnaps), masks

    def unpack(self, body: Body, extent: Extent, ymask, masks) -> tuple[AdjArgs, AdjArgs]:
        """The primals and tangents of ``adj_p``'s inputs (symbolic zeros off the masks; no
        snapshots)."""
        x_avals = _xs_avals(body, extent.length) if not extent.dynamic else []
        y_avals = _floats_of(_ys_avals(body, extent.length) if not extent.dynamic else [],
                             body.y_avals)
        mc, mk, mx, mkb, myb = masks
        t = AdjArgs([], _expand(mc, self.dconsts, body.const_avals),
                    _expand(mk, self.dcarry, body.carry_avals), _expand(mx, self.dxs, x_avals),
                    [], _expand(mkb, self.dcarry_bar, _floats_of(body.carry_avals,
                                                                body.carry_avals)),
                    _expand(myb, self.dys_bar, _pick(ymask, y_avals)))
        return self.primal._replace(snaps=[]), t


# ----------------------------------------------------------------------------- helpers


def _timed(aval, n):
    return core.ShapedArray((n,) + tuple(aval.shape), aval.dtype)


def _n_float(avals) -> int:
    return sum(is_float(a) for a in avals)


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


def _undef(x) -> bool:
    return ad.is_undefined_primal(x)


def _full_from_floats(values, avals):
    it = iter(values)
    return [next(it) if is_float(a) else _zero(a) for a in avals]


def _full_mask(mask, avals):
    """A mask over the float leaves of ``avals`` as one over all of them (False elsewhere)."""
    it = iter(mask)
    return [next(it) if is_float(a) else False for a in avals]


def _floats_of(values, avals):
    return [v for v, a in zip(values, avals) if is_float(a)]


def _ys_avals(body, length):
    return [_timed(a, length) for a in body.y_avals]


def _xs_avals(body, length):
    return [_timed(a, length) for a in body.x_avals]


# ----------------------------------------------------------------------------- abstract eval


def _fwd_outs(body, extent, save):
    outs = list(body.carry_avals) + _ys_avals(body, extent.length)
    return outs + (extent.snapshot_avals(body) if save else [])


def _laid(body, masks) -> list[bool]:
    """The stored carry leaves whose snapshot tangents ``tan_p`` lays (those with a tangent)."""
    return [st and m for st, m in zip(body.stored, masks[1])]


def _tan_outs(body, extent, masks, lay):
    mc, mk, mx = masks
    _, _, my = jvp_body(body, mc, mk, mx)
    outs = [a.to_tangent_aval() for a, m in zip(body.carry_avals, mk) if m]
    outs += [_timed(a.to_tangent_aval(), extent.length) for a, m in zip(body.y_avals, my) if m]
    if lay:  # the snapshots' tangents: rows, then the state u_{N-1}
        laid = _pick(_laid(body, masks), body.carry_avals)
        outs += [_timed(a.to_tangent_aval(), extent.n_slots) for a in laid]
        outs += [a.to_tangent_aval() for a in laid]
    return outs


def _adj_outs(body, extent, keep):
    outs = _pick(keep.consts, _floats_of(body.const_avals, body.const_avals))
    outs += _floats_of(body.carry_avals, body.carry_avals)
    if extent.dynamic:
        return outs
    xs = _xs_avals(body, extent.length)
    return outs + _pick(keep.xs, _floats_of(xs, body.x_avals))


def _abstract(outs_fn, stores):
    """The abstract evaluation rule; ``stores(**params)``: whether the primitive reaches the
    stores of offloaded slots (then it has their ordered effect)."""

    def rule(*args, body, levels, **params):
        effs = body.effects
        if stores(**params):
            effs = effs | stored_effects(params["extent"].offload)
        return _levels.batched_avals(outs_fn(body, **params), levels), effs

    return rule


fwd_p.def_effectful_abstract_eval(
    _abstract(lambda body, extent, save: _fwd_outs(body, extent, save),
              lambda extent, save: save))
tan_p.def_effectful_abstract_eval(
    lambda *a, body, extent, has_snaps, masks, lay, levels: (
        _levels.batched_avals(_tan_outs(body, extent, masks, lay), levels),
        jvp_body(body, *masks)[0].effects
        | (stored_effects(extent.offload) if has_snaps else set()),
    ))
adj_p.def_effectful_abstract_eval(
    _abstract(lambda body, extent, has_snaps, ymask, keep: _adj_outs(body, extent, keep),
              lambda **params: True))
adjt_p.def_effectful_abstract_eval(
    _abstract(lambda body, extent, has_snaps, ymask, keep, masks:
              2 * _adj_outs(body, extent, keep),
              lambda **params: True))


# ----------------------------------------------------------------------------- lowering


def _fwd_impl(args, body, extent, save, axes):
    a = FwdArgs.of(args, body)
    tables = extent.tables() if save else None
    off = Offload.open(tables.offload) if tables is not None and tables.offload is not None else None
    carry, ys, snaps = forward(body, extent.length, a.consts, a.carry, a.xs, tables,
                               unroll=extent.unroll, batched=bool(axes), off=off)
    return [*carry, *ys, *snaps, *([off.handle] if off is not None else [])]


def _tan_impl(args, body, extent, has_snaps, masks, lay, axes):
    a = TanArgs.of(args, body, extent, has_snaps, masks)
    if has_snaps and extent.offload is not None:
        # The tangent loop never reads the snapshots (they are there for its transpose, which
        # would have replaced it): a tangent that runs is their last holder, so it releases them.
        Offload(extent.offload, extent.handle_of(a.snaps)).close()
    child, _, _ = jvp_body(body, *masks)
    consts, carry = [*a.consts, *a.dconsts], [*a.carry, *a.dcarry]
    if extent.dynamic:
        carry = advance_steps(child, consts, carry, a.steps[0], batched=bool(axes))
        return carry[body.nk :]
    # With ``lay``, the child's stored leaves that are tangents (the primals' are in the
    # forward's snapshots): rows, then u_{N-1}.
    laid = [False] * body.nk + list(child.stored[body.nk :])
    tables = extent.tables() if lay else None
    # Slots tied each to its tangent and that tangent's primal (batched as their union, see
    # ``_tan_out_axes``): equal zero-filled slots of the loop's forward sweep would be merged
    # with these into one buffer, copied for each (a third buffer).
    primal_of = [i for i, m in enumerate(masks[1]) if m]
    slots = None
    if lay:
        slots = [zeros_after([v.aval], (tables.n_slots,), [v, carry[i]])[0]
                 for v, i, st in zip(carry[body.nk :], primal_of, laid[body.nk :]) if st]
    carry, ys, snaps = forward(child, extent.length, consts, carry, [*a.xs, *a.dxs], tables,
                               slots=slots, unroll=extent.unroll, batched=bool(axes),
                               stored=laid)
    return [*carry[body.nk :], *ys[body.ny :], *snaps]


def _adj_impl(args, body, extent, has_snaps, ymask, keep, axes):
    a = AdjArgs.of(args, body, extent, has_snaps, ymask)
    if extent.dynamic:
        snaps = (a.snaps[:-1], a.snaps[-1]) if has_snaps else None
        cbar, kbar = adjoint_while(body, extent.n_slots, extent.max_steps, a.steps[0], a.consts,
                                   a.carry, snaps,
                                   a.carry_bar, keep, axes, extent.offload)
        return [*cbar, *kbar]
    cbar, kbar, xbar = adjoint(body, extent.tables(), a.consts, a.carry, a.xs,
                               a.snaps if has_snaps else None, a.carry_bar, a.ys_bar, ymask,
                               keep, axes)
    return [*cbar, *kbar, *xbar]


def _lowering(impl):
    def run(*args, levels, **params):
        axes = _levels.names(levels)
        return _levels.vmapped(lambda *a: impl(a, axes=axes, **params), levels)(*args)

    return mlir.lower_fun(run, multiple_results=True)


mlir.register_lowering(fwd_p, _lowering(_fwd_impl))
mlir.register_lowering(tan_p, _lowering(_tan_impl))
mlir.register_lowering(adj_p, _lowering(_adj_impl))
mlir.register_lowering(adjt_p,
                       _lowering(lambda args, axes, **params: _adjt_impl(args, **params)))


# ----------------------------------------------------------------------------- building blocks


def forward_loop(body: Body, extent: Extent, consts, carry, xs, save=False) -> list:
    """Bind ``fwd_p``: the outputs ``carry_N, ys`` (and the snapshots, with ``save``)."""
    return fwd_p.bind(*consts, *carry, *xs, body=body, extent=extent, save=save, levels=())


def apply_tangent(body, extent, z, snaps, dz, steps=(), lay=False):
    """``J(z) dz`` as full leaf lists ``(carry_N_dot, ys_dot)`` with symbolic zeros.

    ``z = (consts, carry, xs)`` and ``dz`` alike (entries may be symbolic zeros); ``snaps`` are
    the snapshots (or an empty list); ``steps`` the run-time step count (while loops). With
    ``lay`` (a loop of known length without offloaded slots), also the tangents of the
    snapshots that the forward sweep lays, laid out as those (symbolic zeros where a stored
    leaf has no tangent): ``(carry_N_dot, ys_dot, snaps_dot)``.
    """
    c, k, x = z
    dc, dk, dx = dz
    mc = tuple(_nz(t) for t in dc)
    mk0 = tuple(_nz(t) for t in dk)
    mx = tuple(_nz(t) for t in dx)
    y_avals = _ys_avals(body, extent.length) if not extent.dynamic else []
    snap_avals = extent.snapshot_avals(body) if lay else []
    if not any(mc + mk0 + mx):
        zeros = [_zero(a) for a in body.carry_avals], [_zero(a) for a in y_avals]
        return (*zeros, [_zero(a) for a in snap_avals]) if lay else zeros
    _, mk, my = jvp_body(body, mc, mk0, mx)
    args = TanArgs(list(steps), list(c), list(k), list(x), list(snaps), _pick(mc, dc),
                   [_inst(t) for t in _pick(mk, dk)], _pick(mx, dx))
    outs = tan_p.bind(*_flat(args), body=body, extent=extent, has_snaps=bool(snaps),
                      masks=(mc, mk, mx), lay=lay, levels=())
    laid = _pick(body.stored, _laid(body, (mc, mk, mx)))
    tk, ty, rows, last = cut(outs, [sum(mk), sum(my), sum(laid), sum(laid)])
    tk, ty = _expand(mk, tk, body.carry_avals), _expand(my, ty, y_avals)
    if not lay:
        return tk, ty
    ns = sum(body.stored)
    return tk, ty, _expand(laid, rows, snap_avals[:ns]) + _expand(laid, last, snap_avals[ns:])


def apply_adjoint(body, extent, z, snaps, kbar, ybar, steps=(), keep=None) -> AdjOuts:
    """``J(z)^T w`` over the float leaves of ``z``; ``w = (kbar, ybar)`` are full leaf lists over
    the outputs (symbolic zeros allowed; non-float leaves ignored). Returns the cotangents of the
    float leaves of consts, carry and xs (of those selected by ``keep``, a :class:`Keep`;
    ``None``: all)."""
    c, k, x = z
    kbar_f = [_inst(t) for t in _floats_of(kbar, body.carry_avals)]
    ybar_f = _floats_of(ybar, body.y_avals)
    ymask = tuple(_nz(t) for t in ybar_f)
    keep = Keep.every(body) if keep is None else keep
    args = AdjArgs(list(steps), list(c), list(k), list(x), list(snaps), kbar_f,
                   _pick(ymask, ybar_f))
    outs = adj_p.bind(*_flat(args), body=body, extent=extent, has_snaps=bool(snaps),
                      ymask=ymask, keep=keep, levels=())
    return AdjOuts.of(outs, body, keep)


def adjoint_tangent(body, extent, z, dz, w, dw, steps=(), keep=None, primal=False, snaps=()):
    """Tangent of ``z, w -> J(z)^T w`` along ``(dz, dw)``: ``J^T dw + Hess<w, F> dz``.

    ``w = (kbar, ybar)`` and ``dw`` are full leaf lists over the outputs (symbolic zeros
    allowed). Computed as the ``z``-half of the adjoint of ``jvp(body)`` with cotangent
    ``(dw, w)``. Returns cotangents over the float leaves of consts, carry and xs (those
    selected by ``keep``, as in :func:`apply_adjoint`), an :class:`AdjOuts`.

    With ``primal``, returns ``(J^T w, tangent)``: ``J^T w`` is the cotangent of the tangent
    half of the same sweep, so it costs no sweep of its own. That needs a tangent on every float
    carry leaf and on every kept consts and xs leaf, and every carry leaf kept. ``snaps``: the
    augmented body's snapshots, if the forward laid them (else the sweep lays its own).
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
    keep = Keep.every(body) if keep is None else keep
    # Only the primal half of the child's consts and xs cotangents is wanted; its carry is
    # differentiated where the parent's is, and on every tangent leaf.
    # With ``primal``, also the tangent halves of the kept consts and xs leaves.
    tc = tuple(_pick(mc, _full_mask(keep.consts, body.const_avals))) if primal else ()
    tx = tuple(_pick(mx, _full_mask(keep.xs, body.x_avals))) if primal else ()
    child_keep = Keep(keep.consts + (tc or (False,) * sum(mc)),
                      keep.xs + (tx or (False,) * sum(mx)), keep.carry + (True,) * sum(mk))
    out = apply_adjoint(child, extent, (zc, zk, zx), list(snaps), kbar_child, ybar_child, steps,
                        child_keep)
    nc, nf, nx = sum(keep.consts), _n_float(body.carry_avals), sum(keep.xs)
    tangent = AdjOuts(out.consts[:nc], out.carry[:nf], out.xs[:nx])
    if not primal:
        return tangent
    assert sum(tc) == nc and sum(tx) == nx and all(keep.carry) and len(out.carry) == 2 * nf
    return AdjOuts(out.consts[nc:], out.carry[nf:], out.xs[nx:]), tangent


# ----------------------------------------------------------------------------- JVP rules


def _fwd_jvp(primals, tangents, *, body, extent, save, levels):
    a, t = FwdArgs.of(primals, body), FwdArgs.of(tangents, body)
    outs = forward_loop(body, extent, a.consts, a.carry, a.xs, save=True)
    carry, ys, snaps = cut(outs, [body.nk, body.ny, extent.n_snapshots(body)])
    # When ``save`` is already set, an adjoint of an inner derivative reads these snapshots.
    # The transpose of this tangent then re-lays its own instead of sharing them: sharing would
    # keep them alive (and force a copy) beside the inner derivative's augmented sweeps; this
    # costs one extra forward sweep, at higher order only.
    # The snapshots' tangents are laid only for an adjoint that reads the snapshots (``save``).
    lay = save and extent.offload is None
    tk, ty, *laid = apply_tangent(body, extent, a, [] if save else snaps, t, lay=lay)
    if not save:
        return [*carry, *ys], [*tk, *ty]
    dsnaps = laid[0] if lay else [_zero(core.typeof(v)) for v in snaps]
    return [*carry, *ys, *snaps], [*tk, *ty, *dsnaps]


def _tan_jvp(primals, tangents, *, body, extent, has_snaps, masks, lay, levels):
    a = TanArgs.of(primals, body, extent, has_snaps, masks)
    t = TanArgs.of(tangents, body, extent, has_snaps, masks)
    child, _, _ = jvp_body(body, *masks)
    out = tan_p.bind(*primals, body=body, extent=extent, has_snaps=has_snaps, masks=masks,
                     lay=lay, levels=())
    zk, zy = apply_tangent(
        child, extent, ([*a.consts, *a.dconsts], [*a.carry, *a.dcarry], [*a.xs, *a.dxs]), [],
        ([*t.consts, *t.dconsts], [*t.carry, *t.dcarry], [*t.xs, *t.dxs]), a.steps,
    )
    # The laid snapshot tangents are a cache, as snapshots are: no derivative flows through them.
    laid = out[len(zk) - body.nk + len(zy) - body.ny :]
    return out, [*zk[body.nk :], *zy[body.ny :], *(_zero(core.typeof(v)) for v in laid)]


def _adj_jvp(primals, tangents, *, body, extent, has_snaps, ymask, keep, levels):
    a = AdjArgs.of(primals, body, extent, has_snaps, ymask)
    t = AdjArgs.of(tangents, body, extent, has_snaps, ymask)
    if not any(_nz(v) for v in [*t.consts, *t.carry, *t.xs, *t.carry_bar, *t.ys_bar]):
        out = adj_p.bind(*primals, body=body, extent=extent, has_snaps=has_snaps, ymask=ymask,
                         keep=keep, levels=())
        return out, [_zero(core.typeof(o)) for o in out]
    args, masks = AdjTanArgs.pack(body, a, t)
    outs = adjt_p.bind(*args.flat(), body=body, extent=extent, has_snaps=bool(args.dsnaps),
                       ymask=ymask, keep=keep, masks=masks, levels=())
    return cut(outs, [len(outs) // 2, len(outs) // 2])


def _adjt_split(args, body, extent, has_snaps, ymask, keep, masks):
    """``adjt_p`` as the two ``adj_p`` it fuses: the primal adjoint (which then reads only
    primals) and the ``z``-half of the augmented one. Both lay their own snapshots: the
    forward's would live beside theirs when XLA runs them late, and the augmented one's are
    not transposable inputs."""
    a, t = AdjTanArgs.of(args, body, extent, has_snaps, ymask, masks).unpack(body, extent,
                                                                              ymask, masks)
    out = adj_p.bind(*_flat(a), body=body, extent=extent, has_snaps=False, ymask=ymask,
                     keep=keep, levels=())
    w = _cotangent_lists(body, extent, a.carry_bar, a.ys_bar, ymask)
    dw = _cotangent_lists(body, extent, t.carry_bar, t.ys_bar, ymask)
    tangent = adjoint_tangent(body, extent, a.z, (t.consts, t.carry, t.xs), w, dw, a.steps,
                              keep)
    return [*out, *_flat(tangent)]


def _adjt_split_under(levels, params):
    """:func:`_adjt_split` under the batch levels of an ``adjt_p`` (a function of its inputs)."""
    return _levels.vmapped(lambda *args: _adjt_split(args, **params), levels)


def _adjt_impl(args, body, extent, has_snaps, ymask, keep, masks):
    """``adjt_p`` in one augmented sweep: zero tangents are given to the float carry leaves
    and the kept consts and xs leaves that have none, so that its tangent half is ``J^T w``
    whole. A carry leaf held constant (``keep.carry``) is held in the primal adjoint only, so
    then the two sweeps run apart. With ``has_snaps`` the sweep reads the forward's snapshots
    and their tangents instead of laying its own."""
    if not all(keep.carry):
        return _adjt_split(args, body, extent, has_snaps, ymask, keep, masks)
    g = AdjTanArgs.of(args, body, extent, has_snaps, ymask, masks)
    a, t = g.unpack(body, extent, ymask, masks)
    snaps = []
    if has_snaps:  # the augmented body's snapshots: stored leaves, then their tangents
        ns, nd = sum(body.stored), len(g.dsnaps) // 2
        snaps = g.primal.snaps[:ns] + g.dsnaps[:nd] + g.primal.snaps[ns:] + g.dsnaps[nd:]
    x_avals = _xs_avals(body, extent.length) if not extent.dynamic else []

    def forced(tangents, avals, mask):
        return [jnp.zeros(v.aval.shape, v.aval.dtype) if m and not _nz(v) else v
                for v, m in zip(tangents, mask)]

    dz = (forced(t.consts, body.const_avals, _full_mask(keep.consts, body.const_avals)),
          forced(t.carry, body.carry_avals, [is_float(v) for v in body.carry_avals]),
          forced(t.xs, x_avals, _full_mask(keep.xs, body.x_avals)))
    w = _cotangent_lists(body, extent, a.carry_bar, a.ys_bar, ymask)
    dw = _cotangent_lists(body, extent, t.carry_bar, t.ys_bar, ymask)
    primal, tangent = adjoint_tangent(body, extent, a.z, dz, w, dw, a.steps, keep, primal=True,
                                      snaps=snaps)
    return [*_flat(primal), *_flat(tangent)]


def _cotangent_lists(body, extent, carry_bar, ys_bar, ymask):
    """``(kbar, ybar)`` as full leaf lists over the outputs, from the float leaves' cotangents
    (``ys_bar`` only where ``ymask``)."""
    y_avals = _ys_avals(body, extent.length) if not extent.dynamic else []
    y_float = _floats_of(y_avals, body.y_avals)
    return (_full_from_floats(carry_bar, body.carry_avals),
            _full_from_floats(_expand(ymask, ys_bar, y_float), y_avals))


ad.primitive_jvps[fwd_p] = _levels.jvp_rule(_fwd_jvp)
ad.primitive_jvps[tan_p] = _levels.jvp_rule(_tan_jvp)
ad.primitive_jvps[adj_p] = _levels.jvp_rule(_adj_jvp)


def _adjt_jvp(primals, tangents, *, levels, **params):
    """The JVP of the split (whose ``adj_p`` fuse again, one order up)."""
    return jax.jvp(lambda *args: _adjt_split(args, **params), tuple(primals),
                   tuple(_inst(t) for t in tangents))


ad.primitive_jvps[adjt_p] = _levels.jvp_rule(_adjt_jvp)


def _adjt_partial_eval(trace, *tracers, levels, **params):
    """Split ``adjt_p`` when some input is unknown: the primal adjoint's inputs are primals,
    so its outputs stay known (as ``jax.linearize`` requires of primal outputs)."""
    if all(t.pval.is_known() for t in tracers):
        return trace.default_process_primitive(adjt_p, tracers, dict(params, levels=levels))
    with core.set_current_trace(trace):
        return _adjt_split_under(levels, params)(*tracers)


pe.custom_partial_eval_rules[adjt_p] = _adjt_partial_eval


def _adjt_partial_eval_custom(saveable, unks_in, inst_in, eqn):
    """As :func:`_adjt_partial_eval` for a jaxpr (``jax.checkpoint``): the split as a call."""
    params = dict(eqn.params)
    levels = params.pop("levels")
    closed = jax.make_jaxpr(_adjt_split_under(levels, params))(*(v.aval for v in eqn.invars))
    call = eqn.replace(primitive=core.closed_call_p, params=dict(call_jaxpr=closed))
    return pe.partial_eval_jaxpr_custom_rules[core.closed_call_p](saveable, unks_in, inst_in,
                                                                  call)


pe.partial_eval_jaxpr_custom_rules[adjt_p] = _adjt_partial_eval_custom


# ----------------------------------------------------------------------------- transposes


def _tan_transpose(cts, *args, body, extent, has_snaps, masks, lay, levels):
    mc, mk, mx = masks
    _, _, my = jvp_body(body, mc, mk, mx)
    a = TanArgs.of(args, body, extent, has_snaps, masks)
    if any(_undef(v) for v in [*a.steps, *a.consts, *a.carry, *a.xs, *a.snaps]):
        raise NotImplementedError("retrograde: tan_p is linear only in its tangent inputs.")
    ctk, cty = cut(cts, [sum(mk), sum(my)])  # the laid snapshot tangents are a cache
    y_avals = _ys_avals(body, extent.length) if not extent.dynamic else []
    kbar = _expand(mk, ctk, body.carry_avals)
    ybar = _expand(my, cty, y_avals)
    # Carry leaves without a tangent are held constant (nothing with a tangent depends on them).
    keep = Keep.every(body)._replace(carry=tuple(_floats_of(mk, body.carry_avals)))
    bar = apply_adjoint(body, extent, a.z, a.snaps, kbar, ybar, a.steps, keep)
    full = (
        _full_from_floats(bar.consts, body.const_avals),
        _full_from_floats(bar.carry, body.carry_avals),
        _full_from_floats(bar.xs, _xs_avals(body, extent.length) if not extent.dynamic else []),
    )
    out = [None] * (len(a.steps) + len(a.consts) + len(a.carry) + len(a.xs) + len(a.snaps))
    for vals, mask, f in zip(a.dz, masks, full):
        out += [ct if _undef(v) else None for v, ct in zip(vals, _pick(mask, f))]
    return out


def _adj_transpose(cts, *args, body, extent, has_snaps, ymask, keep, levels):
    a = AdjArgs.of(args, body, extent, has_snaps, ymask)
    ct = AdjOuts.of(cts, body, keep)
    x_avals = _xs_avals(body, extent.length) if not extent.dynamic else []
    # Cotangents over all float consts, carry and xs leaves (zero where this adjoint's output
    # is none or constant).
    ct_c = _expand(keep.consts, ct.consts, _floats_of(body.const_avals, body.const_avals))
    ct_k = _expand(keep.carry, _pick(keep.carry, ct.carry),
                   _floats_of(body.carry_avals, body.carry_avals))
    ct_x = _expand(keep.xs, ct.xs, _floats_of(x_avals, body.x_avals))
    n_pre = len(a.steps) + len(a.consts) + len(a.carry) + len(a.xs) + len(a.snaps)
    if not any(_undef(v) for v in [*a.consts, *a.carry, *a.xs, *a.snaps]):
        # w -> J^T w is linear; its transpose is ct -> J ct.
        dz = (
            _full_from_floats(ct_c, body.const_avals),
            _full_from_floats(ct_k, body.carry_avals),
            _full_from_floats(ct_x, x_avals),
        )
        tk, ty = apply_tangent(body, extent, a.z, a.snaps, dz, a.steps)
        tk_f = _floats_of(tk, body.carry_avals)
        ty_f = _pick(ymask, _floats_of(ty, body.y_avals))
        out = [None] * n_pre
        out += [t if _undef(v) else None
                for v, t in zip([*a.carry_bar, *a.ys_bar], [*tk_f, *ty_f])]
        return out
    out = _adj_transpose_hessian(a, body, extent, ymask, (ct_c, ct_k, ct_x))
    return [None] * len(a.steps) + out


def _adj_transpose_hessian(a: AdjArgs, body, extent, ymask, ct):
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
    if any(_undef(v) for v in [*cq, *kq, *xq, *a.snaps]):
        raise NotImplementedError("retrograde: unsupported transposition of the adjoint.")
    nfkq, nfyq = _n_float(q.carry_avals), _n_float(q.y_avals)
    # Cotangent halves: a (on Q's outputs) and b (on their tangents).
    a_k, b_k = a.carry_bar[:nfkq], a.carry_bar[nfkq:]
    ymask_a, ymask_b = ymask[:nfyq], ymask[nfyq:]
    n_ya = sum(ymask_a)
    a_y, b_y = a.ys_bar[:n_ya], a.ys_bar[n_ya:]
    if any(_undef(v) for v in [*b_k, *b_y]):
        raise NotImplementedError("retrograde: the adjoint is not linear in both its inputs.")
    qy_avals = _ys_avals(q, extent.length) if not extent.dynamic else []
    qx_avals = _xs_avals(q, extent.length) if not extent.dynamic else []
    # b as full leaf lists over Q's outputs.
    b_full_k = _expand(mk, b_k, q.carry_avals)
    b_ydot = _expand(ymask_b, b_y, [a_ for a_, m in zip(qy_avals, my) if m])
    b_full_y = _expand(my, b_ydot, qy_avals)
    # ct restricted to the primal half (Q's float leaves).
    nfcq, nfxq = _n_float(q.const_avals), _n_float(q.x_avals)
    ct_c, ct_k, ct_x = ct
    dz = (
        _full_from_floats(ct_c[:nfcq], q.const_avals),
        _full_from_floats(ct_k[:nfkq], q.carry_avals),
        _full_from_floats(ct_x[:nfxq], qx_avals),
    )
    zq = (cq, kq, xq)
    # zq_dot_bar = Hess<b, F_Q> ct, over the leaves that carry tangents.
    if any(_undef(v) for v in [*cq_dot, *kq_dot, *xq_dot]):
        zero_w = ([_zero(a_) for a_ in q.carry_avals], [_zero(a_) for a_ in qy_avals])
        h = adjoint_tangent(q, extent, zq, dz, (b_full_k, b_full_y), zero_w, a.steps)
        full_c = _full_from_floats(h.consts, q.const_avals)
        full_k = _full_from_floats(h.carry, q.carry_avals)
        full_x = _full_from_floats(h.xs, qx_avals)
        dots = []
        for vals, mask, full in ((cq_dot, mc, full_c), (kq_dot, mk, full_k),
                                 (xq_dot, mx, full_x)):
            dots.append([h_ if _undef(v) else None for v, h_ in zip(vals, _pick(mask, full))])
        out_c, out_k, out_x = dots
    else:
        out_c, out_k, out_x = [None] * len(cq_dot), [None] * len(kq_dot), [None] * len(xq_dot)
    out = [None] * len(cq) + out_c + [None] * len(kq) + out_k + [None] * len(xq) + out_x
    out += [None] * len(a.snaps)
    # a_bar = J_Q ct.
    if any(_undef(v) for v in [*a_k, *a_y]):
        tk, ty = apply_tangent(q, extent, zq, [], dz, a.steps)
        tk_f = _floats_of(tk, q.carry_avals)
        ty_f = _pick(ymask_a, _floats_of(ty, q.y_avals))
        a_k_bar = [t if _undef(v) else None for v, t in zip(a_k, tk_f)]
        a_y_bar = [t if _undef(v) else None for v, t in zip(a_y, ty_f)]
    else:
        a_k_bar, a_y_bar = [None] * len(a_k), [None] * len(a_y)
    # The cotangent inputs are ordered (carry_bar = [a_k, b_k], ys_bar = [a_y, b_y]).
    out += a_k_bar + [None] * len(b_k) + a_y_bar + [None] * len(b_y)
    return out


ad.primitive_transposes[tan_p] = _levels.transpose_rule(_tan_transpose)
ad.primitive_transposes[adj_p] = _levels.transpose_rule(_adj_transpose)


# ----------------------------------------------------------------------------- dead code


def _adj_dce(used_outputs, eqn, halves=1):
    """Drop the consts and xs cotangents nobody reads: the adjoint then holds those leaves
    constant, so they cost neither per-step work nor memory (an unread ``xs`` cotangent would
    be an ``O(N)`` buffer). Carry cotangents are the sweep's state and always stay. With
    ``halves=2`` (``adjt_p``) the outputs are two :class:`AdjOuts` over the same ``keep``: a
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
    flags = _flat(selected) * halves
    levels = tuple(dataclasses.replace(lv, out_axes=tuple(_pick(flags, lv.out_axes)))
                   for lv in params["levels"])
    outvars = _pick(flags, eqn.outvars)
    new = eqn.replace(params=dict(params, keep=keep, levels=levels), outvars=outvars)
    return [True] * len(eqn.invars), new


pe.dce_rules[adj_p] = _adj_dce
pe.dce_rules[adjt_p] = lambda used, eqn: _adj_dce(used, eqn, halves=2)


def _tan_dce(used_outputs, eqn):
    """Lay no snapshot tangents that nobody reads."""
    if not any(used_outputs) and not eqn.effects:
        return [False] * len(eqn.invars), None
    params = eqn.params
    n = len(eqn.outvars) - 2 * sum(_laid(params["body"], params["masks"])) * params["lay"]
    if not params["lay"] or any(used_outputs[n:]):
        return [True] * len(eqn.invars), eqn
    levels = tuple(dataclasses.replace(lv, out_axes=lv.out_axes[:n]) for lv in params["levels"])
    new = eqn.replace(params=dict(params, lay=False, levels=levels), outvars=eqn.outvars[:n])
    return [True] * len(eqn.invars), new


pe.dce_rules[tan_p] = _tan_dce


def _fwd_dce(used_outputs, eqn):
    body = eqn.params["body"]
    return unread_snapshots_dce(used_outputs, eqn, body.nk + body.ny, body.effects)


pe.dce_rules[fwd_p] = _fwd_dce


# ----------------------------------------------------------------------------- batching


def carry_fixpoint(jaxpr, data, consts_b, carry_b, xs_b, nk):
    """Which carry leaves a batched loop carries batched (JAX's scan rule): those batched
    initially or made batched by a step. Returns ``(carry_b, ys_b)``."""
    carry_b = list(carry_b)
    for _ in range(nk + 1):
        _, out_b = batching.batch_jaxpr(jaxpr, data, [*consts_b, *carry_b, *xs_b],
                                        instantiate=carry_b + [False] * (len(jaxpr.out_avals) - nk))
        new = [a or b for a, b in zip(carry_b, out_b[:nk])]
        if new == carry_b:
            return carry_b, list(out_b[nk:])
        carry_b = new
    raise AssertionError("retrograde: batching fixpoint not reached")


def _b(dims):
    return [d is not None for d in dims]


def _axes(flags):
    return [0 if f else None for f in flags]


def _fwd_out_axes(data, dims, *, body, extent, save):
    d = FwdArgs.of(dims, body)
    carry_b, ys_b = carry_fixpoint(body.jaxpr, data, _b(d.consts), _b(d.carry), _b(d.xs), body.nk)
    snaps = 2 * _axes(_pick(body.stored, carry_b)) if save else []
    handle = [None] if save and extent.offload is not None else []
    return _axes(carry_b) + _axes(ys_b) + snaps + handle


def _unbatched_steps(dims):
    if any(d is not None for d in dims):
        raise NotImplementedError(
            "retrograde: vmap over a loop whose step count differs per batch element must "
            "batch the loop itself (retrograde.while_loop handles a batched predicate)."
        )


def _tan_out_axes(data, dims, *, body, extent, has_snaps, masks, lay):
    """The batching of the tangent outputs, from the parent body with a leaf batched where its
    value or its tangent is: the tangent of an output depends only on inputs (and their
    tangents) that the output itself depends on. (The tangent body is not analysed: it may hold
    a ``custom_vjp``'s linearisation, which only transposes.)"""
    d = TanArgs.of(dims, body, extent, has_snaps, masks)
    _unbatched_steps(d.steps)

    def union(values, tangents, mask):
        batched = [v is not None for v in values]
        for j, t in zip((j for j, m in enumerate(mask) if m), tangents):
            batched[j] = batched[j] or t is not None
        return batched

    mc, mk, mx = masks
    carry_b, ys_b = carry_fixpoint(body.jaxpr, data, union(d.consts, d.dconsts, mc),
                                   union(d.carry, d.dcarry, mk), union(d.xs, d.dxs, mx), body.nk)
    _, _, my = jvp_body(body, mc, mk, mx)
    laid = _axes(_pick(_laid(body, masks), carry_b)) * 2 if lay else []
    return _axes(_pick(mk, carry_b)) + _axes(_pick(my, ys_b)) + laid


def _adj_out_axes(data, dims, *, body, extent, has_snaps, ymask, keep):
    _unbatched_steps(AdjArgs.of(dims, body, extent, has_snaps, ymask).steps)
    return [0] * len(_adj_outs(body, extent, keep))


_levels.batcher(fwd_p, _fwd_out_axes)
_levels.batcher(tan_p, _tan_out_axes)
def _adjt_out_axes(data, dims, *, body, extent, has_snaps, ymask, keep, masks):
    _unbatched_steps(AdjTanArgs.of(dims, body, extent, has_snaps, ymask, masks).primal.steps)
    return [0] * (2 * len(_adj_outs(body, extent, keep)))


_levels.batcher(adj_p, _adj_out_axes)
_levels.batcher(adjt_p, _adjt_out_axes)
_adjt_batched = batching.fancy_primitive_batchers[adjt_p]


def _adjt_batch(data, args, dims, *, levels, **params):
    """Batch ``adjt_p``; when only tangents are batched (``jax.jacfwd`` of a gradient) its
    primal outputs must stay unbatched, so it runs split: one primal adjoint, unbatched."""
    d = AdjTanArgs.of(dims, params["body"], params["extent"], params["has_snaps"],
                      params["ymask"], params["masks"])
    if any(v is not None for v in _flat(d.primal)) or all(v is None for v in dims):
        return _adjt_batched(data, args, dims, levels=levels, **params)
    n = len(_adj_outs(params["body"], params["extent"], params["keep"]))
    axes = [None] * n + [0] * n
    name = None if data.name is core.no_axis_name else data.name
    outs = jax.vmap(_adjt_split_under(levels, params), in_axes=list(dims), out_axes=axes,
                    axis_size=data.size, axis_name=name, spmd_axis_name=data.spmd_name)(*args)
    return outs, axes


batching.fancy_primitive_batchers[adjt_p] = _adjt_batch
