"""A loop body as a closed jaxpr, and its tangent-augmented version.

A :class:`Body` is the step ``(consts, carry, x) -> (carry, y)`` of a loop, flattened into leaves:
``nc`` constants (closed-over values, parameters), ``nk`` carry leaves and ``nx`` per-step input
leaves in, ``nk`` carry leaves and ``ny`` per-step output leaves out.

:func:`jvp_body` builds the tangent-augmented body ``(z, z_dot) -> (step(z), d step(z) . z_dot)``
in group layout (each group's primal leaves, then the tangents of the leaves selected by a mask),
and remembers its parent, so that the transpose rules can recognise the tangent half of an input.
Bodies are never batched: a batched loop runs its unbatched program under ``jax.vmap``
(:mod:`._batch_levels`).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax.extend import core as jex_core

from .._jax_private import ad, core, pe

Mask = tuple[bool, ...]


def cut(seq: Sequence, sizes: Sequence[int]) -> list[list]:
    """Split ``seq`` into consecutive lists of the given sizes (the rest, if any, is dropped)."""
    out, i = [], 0
    for n in sizes:
        out.append(list(seq[i : i + n]))
        i += n
    return out


def is_float(aval) -> bool:
    """Whether leaves of this abstract value get tangents and cotangents."""
    return jax.numpy.issubdtype(aval.dtype, jax.numpy.inexact)


class Body:
    """The step of a loop as a closed jaxpr ``(consts, carry, x) -> (carry, y)``.

    Hashable by identity (it is a primitive parameter). ``parent`` and ``masks`` are set when this
    body is ``jvp_body(parent, *masks)``: then each group of leaves is the parent's leaves followed
    by the tangents of the parent leaves where the group's mask is True.

    ``fast``, if given, is a second closed jaxpr of the same signature computing the same function,
    used wherever the step or its VJP is *executed* (:meth:`runner`), never where the body is
    transformed (:func:`jvp_body` builds from ``jaxpr``): e.g. the same step with an inner loop
    whose reverse mode is a ``custom_vjp``, quicker to reverse but not differentiable twice.

    ``guard``, if given, is a closed jaxpr ``(consts, carry) -> [bool]`` (a while loop's predicate):
    then ``jaxpr`` is the guarded step ``where(guard(z), step(z), z)`` and ``fast`` the unguarded
    step. The two agree on every step a loop executes unbatched (the loop runs, and its reversal
    replays, only steps whose predicate held), so execution skips the guard; batched, it keeps it
    (batch elements may have stopped before the others): see :meth:`runner`.
    """

    __slots__ = (
        "jaxpr",
        "nc",
        "nk",
        "nx",
        "ny",
        "parent",
        "masks",
        "stored",
        "fast",
        "guard",
        "_jvp_cache",
        "_guarded_fast",
        "__weakref__",
    )

    def __init__(
        self,
        jaxpr,
        nc: int,
        nk: int,
        nx: int,
        parent: Body | None = None,
        masks: tuple[Mask, Mask, Mask, Mask] | None = None,
        stored: Mask | None = None,
        fast=None,
        guard=None,
    ):
        if guard is not None and fast is None:
            raise ValueError("Body: a guard needs the unguarded step as fast.")
        self.jaxpr = jaxpr
        self.fast = fast
        self.guard = guard
        self.nc, self.nk, self.nx = nc, nk, nx
        self.ny = len(jaxpr.out_avals) - nk
        self.parent = parent
        self.masks = masks  # (consts, carry, xs, ys) masks of the parent's leaves
        # Carry leaves kept in snapshots; the others are write-only buffers, stored once.
        self.stored = (True,) * nk if stored is None else tuple(stored)
        self._jvp_cache: dict = {}
        self._guarded_fast = None

    # Abstract values of each group.
    @property
    def const_avals(self):
        return self.jaxpr.in_avals[: self.nc]

    @property
    def carry_avals(self):
        return self.jaxpr.in_avals[self.nc : self.nc + self.nk]

    @property
    def x_avals(self):
        return self.jaxpr.in_avals[self.nc + self.nk :]

    @property
    def y_avals(self):
        return self.jaxpr.out_avals[self.nk :]

    @property
    def snapshot_avals(self):
        """Abstract values of the carry leaves that snapshots hold (buffers excluded)."""
        return [a for a, keep in zip(self.carry_avals, self.stored) if keep]

    def snapshot(self, carry) -> list:
        """The leaves of a carry that go into a snapshot."""
        return [c for c, keep in zip(carry, self.stored) if keep]

    def restore(self, carry, snapshot) -> list:
        """``carry`` with its snapshot leaves replaced (buffer leaves stay as they are)."""
        it = iter(snapshot)
        return [next(it) if keep else c for c, keep in zip(carry, self.stored)]

    @property
    def effects(self):
        return self.jaxpr.effects

    def executed(self, batched: bool = False):
        """The closed jaxpr that executes one step: ``fast`` where there is one (with its guard
        put back when ``batched``), else ``jaxpr``."""
        jaxpr = self.jaxpr if self.fast is None else self.fast
        if batched and self.guard is not None:
            if self._guarded_fast is None:
                self._guarded_fast = guarded(self.fast, self.guard, self.nc, self.nk)
            jaxpr = self._guarded_fast
        return jaxpr

    def runner(self, batched: bool = False):
        """The function that executes one step, ``(consts, carry, x) -> (carry, y)`` as lists of
        leaves (of the jaxpr :meth:`executed`)."""
        fun = jex_core.jaxpr_as_fun(self.executed(batched))
        nk = self.nk

        def run(consts, carry, x):
            out = fun(*consts, *carry, *x)
            return list(out[:nk]), list(out[nk:])

        return run

    def __repr__(self):
        depth, b = 0, self
        while b.parent is not None:
            depth, b = depth + 1, b.parent
        return f"Body(nc={self.nc}, nk={self.nk}, nx={self.nx}, ny={self.ny}, jvp_depth={depth})"


def make_body(closed_jaxpr, nk: int, nx: int) -> tuple[Body, list]:
    """Closure-convert a traced step: its constants become leading inputs.

    Returns the body and the constant values (possibly tracers of an outer transformation, which
    is how closed-over parameters get derivatives).
    """
    consts = list(closed_jaxpr.consts)
    jaxpr = pe.convert_constvars_jaxpr(closed_jaxpr.jaxpr)
    closed = jex_core.ClosedJaxpr(jaxpr, ())
    return Body(closed, len(consts), nk, nx), consts


def jvp_body(body: Body, mc: Mask, mk: Mask, mx: Mask) -> tuple[Body, Mask, Mask]:
    """The tangent-augmented body for tangents on the leaves selected by the masks.

    The carry mask is widened to a fixed point (a carry leaf whose tangent becomes nonzero after
    one step must carry a tangent from the start). Returns ``(child, carry_mask, y_mask)``.
    Memoised per body and masks.
    """
    key = (mc, mk, mx)
    hit = body._jvp_cache.get(key)
    if hit is not None:
        return hit
    nc, nk, nx, ny = body.nc, body.nk, body.nx, body.ny
    fk = tuple(is_float(a) for a in body.carry_avals)
    mk_fix = tuple(m and f for m, f in zip(mk, fk))
    while True:
        _, out_nz = ad.jvp_jaxpr(body.jaxpr, [*mc, *mk_fix, *mx], instantiate=False)
        new = tuple(a or (b and f) for a, b, f in zip(mk_fix, out_nz[:nk], fk))
        if new == mk_fix:
            break
        mk_fix = new
    jaxpr_jvp, out_nz = ad.jvp_jaxpr(
        body.jaxpr, [*mc, *mk_fix, *mx], instantiate=[*mk_fix, *([False] * ny)]
    )
    my = tuple(bool(b) for b in out_nz[nk:])
    sizes_in = [nc, sum(mc), nk, sum(mk_fix), nx, sum(mx)]
    n_kt, n_yt = sum(mk_fix), sum(my)

    def augmented(*args):
        c, cd, k, kd, x, xd = cut(args, sizes_in)
        out = jex_core.jaxpr_as_fun(jaxpr_jvp)(*c, *k, *x, *cd, *kd, *xd)
        kp, yp, kt, yt = cut(out, [nk, ny, n_kt, n_yt])
        return [*kp, *kt, *yp, *yt]

    def tangent_avals(avals, mask):
        return [a.to_tangent_aval() for a, m in zip(avals, mask) if m]

    avals = [
        *body.const_avals,
        *tangent_avals(body.const_avals, mc),
        *body.carry_avals,
        *tangent_avals(body.carry_avals, mk_fix),
        *body.x_avals,
        *tangent_avals(body.x_avals, mx),
    ]
    closed = jax.make_jaxpr(augmented)(*avals)
    child = Body(
        closed,
        nc + sum(mc),
        nk + n_kt,
        nx + sum(mx),
        parent=body,
        masks=(mc, mk_fix, mx, my),
        stored=body.stored + tuple(st for st, m in zip(body.stored, mk_fix) if m),
    )
    result = (child, mk_fix, my)
    body._jvp_cache[key] = result
    return result


def passthrough(step, nc: int, nk: int) -> list[bool]:
    """Which carry leaves the closed jaxpr ``step`` ``(consts, carry, x) -> (carry, y)`` returns
    unchanged (the output is the input variable). A loop returns such a leaf as it came in, as
    ``jax.lax``'s loops do: ``jax.lax.cond`` around the loop then sees it forwarded, and
    ``vmap`` keeps it unbatched."""
    jaxpr = step.jaxpr
    return [o is i for o, i in zip(jaxpr.outvars[:nk], jaxpr.invars[nc : nc + nk])]


def forward_unchanged(body: Body, carry_in, outs) -> list:
    """The loop's outputs ``outs`` (carry first) with each carry leaf that ``body``'s step
    returns unchanged replaced by its input (:func:`passthrough`)."""
    same = passthrough(body.jaxpr, body.nc, body.nk)
    return [x if s else o for x, o, s in zip(carry_in, outs, same)] + list(outs[body.nk :])


def guarded(step, guard, nc: int, nk: int):
    """The closed jaxpr ``where(guard(z), step(z), z)`` on the carry, for closed jaxprs ``step``
    ``(consts, carry, x) -> (carry, y)`` and ``guard`` ``(consts, carry) -> [bool]``. The guard is a
    scalar, or one boolean per batch element (broadcast over each leaf's trailing axes). A leaf
    that ``step`` returns unchanged is returned as it is, unguarded: a batched guard does not make
    it batched (as ``jax.lax.while_loop`` keeps a read-only carry leaf unbatched). Inside
    ``jax.shard_map`` a leaf that does not vary over a mesh axis the guard varies over is
    unguarded too (the guard would change its type): each device replays only steps whose
    predicate held there, so the guard is true wherever it is not batched."""
    run_step, run_guard = jex_core.jaxpr_as_fun(step), jex_core.jaxpr_as_fun(guard)
    same = passthrough(step, nc, nk)

    def fun(*args):
        (ok,) = run_guard(*args[: nc + nk])
        ok = jax.numpy.asarray(ok)  # a constant predicate comes back as a Python bool
        out = run_step(*args)
        wider = core.typeof(ok).mat.varying
        kept = [
            o
            if s
            else n
            if not wider <= core.typeof(o).mat.varying
            else jax.numpy.where(ok.reshape(ok.shape + (1,) * (o.ndim - ok.ndim)), n, o)
            for n, o, s in zip(out[:nk], args[nc : nc + nk], same)
        ]
        return [*kept, *out[nk:]]

    return jax.make_jaxpr(fun)(*step.in_avals)
