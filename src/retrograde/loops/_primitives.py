"""Four primitives whose rules close under every JAX transformation.

Notation (``docs/derivatives.md``): ``z = (consts, carry_0, xs)`` are the inputs of a loop with
body ``P``, ``F(z) = (carry_N, ys)`` its outputs, ``J = dF/dz``, and ``snaps`` the snapshots laid
by the forward sweep (a cache: a function of ``z``, so no derivative flows through it).

================  =====================================================  ===================
primitive         computes                                               linear in
================  =====================================================  ===================
``fwd_p``         ``F(z)`` (and ``snaps`` when ``save``)                 -
``tan_p``         ``J(z) z_dot``: the forward loop of ``jvp(P)``         ``z_dot``
``adj_p``         ``J(z)^T w``: the schedule's reverse sweep             ``w``
``adj_jvp_p``     ``adj_p`` and its tangent, from one augmented sweep    -
================  =====================================================  ===================

Each primitive's inputs come in named groups, split and flattened in one place (a
``NamedTuple`` in the primitive's module: ``FwdArgs``, ``TanArgs``, ``AdjArgs``,
``AdjJvpArgs``). The static :class:`LoopPlan` says how many steps the loop takes: ``length``
when known when tracing; otherwise the count is the ``steps`` group (a while loop,
:mod:`._while`), whose snapshots were placed online and carry their steps.

Rules:

- JVP of ``fwd_p``: ``fwd_p`` with ``save=True`` and ``tan_p(z, snaps; z_dot)``. When the
  snapshots are read (``save``), ``tan_p`` also lays their tangents (``save_tangents``: the
  tangent states at the same steps), which the JVP of the ``adj_p`` reading them takes as the
  tangent half of its augmented sweep's snapshots instead of running that sweep's forward
  again.
- Transpose of ``tan_p`` in ``z_dot``: ``adj_p(z, snaps; ct)``.
- Transpose of ``adj_p`` in ``w``: ``tan_p(z, snaps; ct)``.
- JVP of ``tan_p``: ``tan_p`` of the body ``jvp(P)`` (the tangent-of-tangent part).
- JVP of ``adj_p``: ``J^T w_dot + Hess<w, F> z_dot``, which is the ``z``-half of
  ``adj_p`` on ``jvp(P)`` with cotangent ``(w_dot, w)``; its tangent half is ``J^T w``, the
  primal output. ``adj_jvp_p`` binds both: one augmented sweep where a separate primal sweep
  would cost a whole first-order adjoint more. Partial evaluation (``jax.linearize``, ``grad`` of an
  HVP) and its own JVP split it into the two ``adj_p`` again, since JAX needs primal outputs
  computed from primals alone.
- Transpose of that (``adj_p`` on ``C = jvp(Q)`` with the tangent half of ``z`` and the primal
  half of the cotangent unknown): ``z_dot_bar = Hess<w, F_Q> ct`` (the Hessian is symmetric, so it
  is the same JVP-of-adjoint again) and ``w_dot_bar = J_Q ct`` (a ``tan_p``). No reverse sweep is
  ever transposed, so every order runs in memory bounded by the schedule: the snapshots of a
  ``k``-times augmented body hold ``2^k`` copies of the carry.
- Batching appends a level: the primitive's program runs under ``jax.vmap``
  (:mod:`._batch_levels`), and the JVP and transpose of a batched primitive are the ``vmap`` of
  the unbatched rules.

Each primitive lives in a module of its own, as ``jax.lax``'s loops do: the primitive, its input
groups (a ``NamedTuple``), its abstract evaluation, lowering, bind function, JVP, transpose,
partial evaluation, dead-code and batching rules, in that order: ``fwd_p`` in :mod:`._fwd_p`,
``tan_p`` in :mod:`._tan_p`, ``adj_p`` in :mod:`._adj_p`, ``adj_jvp_p`` in :mod:`._adj_jvp_p`.
This module holds what they share: the static :class:`LoopPlan`, the leaf-list helpers, the
abstract-evaluation and lowering rules' common form, and the batching fixpoint.
"""

from __future__ import annotations

import dataclasses
from typing import cast

import jax.numpy as jnp

from .._jax_private import ad, batching, core, mlir
from ..schedules import Online, Schedule
from . import _batch_levels
from ._body import Body, cut, is_float
from ._offload import stored_effects
from ._offload_runs import Layout, two_level
from ._pool import lead, rest_avals
from ._pool import rows as pool_rows
from ._tables import tables_for

# ----------------------------------------------------------------------------- static parameters


@dataclasses.dataclass(frozen=True)
class LoopPlan:
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
            return cast(Online, self.schedule).snapshots  # a while loop's schedule is Online
        return tables_for(self.schedule, self.length).n_slots

    def tables(self):
        return tables_for(self.schedule, self.length)

    def slot_rows(self, body: Body) -> int:
        """Rows of each snapshot buffer of ``body``'s loop: the slots, and more where a mixed
        schedule's data share them (:func:`._pool.rows`)."""
        if self.dynamic:
            return self.n_slots
        return pool_rows(body, self.tables())

    @property
    def offload(self) -> Layout | None:
        """Where the slots live when some are outside device memory (host RAM, disk), else
        ``None``; the snapshots then hold the int32 handle of their store (:meth:`handle_of`)."""
        if self.dynamic:
            return two_level(self.schedule)
        return self.tables().offload

    def lead_data(self, body: Body, masks):
        """The masks ``(dc, dk, dx)`` a forward sweep linearizes its lead leaf in (``fwd_p``'s
        ``data``), given the leaves that carry tangents (``masks``, carry after the fixpoint),
        or ``None``: no lead leaf (:attr:`._tables.Tables.lead`), or no tangent."""
        if self.dynamic or self.tables().lead is None or self.offload is not None:
            return None
        avals = (body.const_avals, body.carry_avals, body.x_avals)
        data = tuple(
            tuple(m and is_float(a) for m, a in zip(ms, av)) for ms, av in zip(masks, avals)
        )
        return data if any(any(m) for m in data) else None

    def snapshot_avals(self, body: Body, data=None) -> list:
        """The snapshots: ``S`` rows of each stored carry leaf, then the stored leaves of
        ``u_{N-1}`` (known count) or the int32 held steps (run-time count). With offloaded
        slots, the handle of their store follows (known count) or replaces the rows (run-time
        count, ``Online(s, slow=...)``, with the stored leaves' tags: the held steps are those
        of the offloaded slots). With ``data`` (:meth:`lead_data`), the lead leaf's data rows of
        the residuals not pooled follow ``u_{N-1}``."""
        if data is not None:
            lin, pool = lead(body, self.tables(), data)
            rest = [timed(a, self.tables().data_rows) for a in rest_avals(pool, lin.stored_avals)]
            return self.snapshot_avals(body) + rest
        rows = [timed(a, self.slot_rows(body)) for a in body.snapshot_avals]
        handle = [core.ShapedArray((), jnp.int32)] if self.offload is not None else []
        if self.dynamic:
            if handle:  # and the stored leaves' tags (``_offload.tags_of``)
                return (
                    handle
                    + [timed(a, 0) for a in body.snapshot_avals]
                    + [core.ShapedArray((self.offload.n_offloaded,), jnp.int32)]
                )
            return rows + [core.ShapedArray((self.n_slots,), jnp.int32)]
        return rows + list(body.snapshot_avals) + handle

    def handle_of(self, snaps):
        """The handle of the offloaded snapshots' store among the snapshots."""
        return snaps[0] if self.dynamic else snaps[-1]

    def n_snapshots(self, body: Body, data=None) -> int:
        return len(self.snapshot_avals(body, data))


# ---------------------------------------------------------------------- input groups and leaf lists


def split_groups(cls, args, sizes):
    parts = cut(args, sizes)
    assert sum(sizes) == len(args), (cls.__name__, sizes, len(args))
    return cls(*parts)


def flat(groups) -> list:
    return [v for g in groups for v in g]


def timed(aval, n):
    """``n`` rows of ``aval``: same dtype, sharding and varying manual axes."""
    return core.unmapped_leading_aval(n, aval)


def n_float(avals) -> int:
    return sum(is_float(a) for a in avals)


def nonzero(t) -> bool:
    return type(t) is not ad.Zero


def zero(aval):
    return ad.Zero(aval.to_tangent_aval())


def instantiate(t):
    return ad.instantiate_zeros(t)


def expand(mask, values, avals):
    """Full list over leaves: the next value where ``mask``, a symbolic zero elsewhere."""
    it = iter(values)
    return [next(it) if m else zero(a) for m, a in zip(mask, avals)]


def pick(mask, values):
    return [v for v, m in zip(values, mask) if m]


def undefined(x) -> bool:
    return ad.is_undefined_primal(x)


def full_from_floats(values, avals):
    it = iter(values)
    return [next(it) if is_float(a) else zero(a) for a in avals]


def full_mask(mask, avals):
    """A mask over the float leaves of ``avals`` as one over all of them (False elsewhere)."""
    it = iter(mask)
    return [next(it) if is_float(a) else False for a in avals]


def floats_of(values, avals):
    return [v for v, a in zip(values, avals) if is_float(a)]


def ys_avals(body, length):
    return [timed(a, length) for a in body.y_avals]


def xs_avals(body, length):
    return [timed(a, length) for a in body.x_avals]


# ----------------------------------------------------------------- abstract evaluation and lowering


def abstract_eval(outs_fn, stores):
    """The abstract evaluation rule; ``stores(**params)``: whether the primitive reaches the
    stores of offloaded slots (then it has their ordered effect)."""

    def rule(*args, body, batch_levels, **params):
        effs = body.effects
        if stores(**params):
            effs = effs | stored_effects(params["plan"].offload)
        return _batch_levels.batched_avals(outs_fn(body, **params), batch_levels), effs

    return rule


def lowering(impl):
    def run(*args, batch_levels, **params):
        axes = _batch_levels.names(batch_levels)
        return _batch_levels.vmapped(lambda *a: impl(a, axes=axes, **params), batch_levels)(*args)

    return mlir.lower_fun(run, multiple_results=True)


# ----------------------------------------------------------------------------- batching


def carry_fixpoint(jaxpr, data, consts_b, carry_b, xs_b, nk):
    """Which carry leaves a batched loop carries batched (JAX's scan rule): those batched
    initially or made batched by a step. Returns ``(carry_b, ys_b)``."""
    carry_b = list(carry_b)
    for _ in range(nk + 1):
        _, out_b = batching.batch_jaxpr(
            jaxpr,
            data,
            [*consts_b, *carry_b, *xs_b],
            instantiate=carry_b + [False] * (len(jaxpr.out_avals) - nk),
        )
        new = [a or b for a, b in zip(carry_b, out_b[:nk])]
        if new == carry_b:
            return carry_b, list(out_b[nk:])
        carry_b = new
    raise AssertionError("retrograde: batching fixpoint not reached")


def batched(dims):
    return [d is not None for d in dims]


def batch_axes(flags):
    return [0 if f else None for f in flags]


def check_unbatched_steps(dims):
    if any(d is not None for d in dims):
        raise NotImplementedError(
            "retrograde: vmap over a loop whose step count differs per batch element must "
            "batch the loop itself (retrograde.while_loop handles a batched predicate)."
        )
