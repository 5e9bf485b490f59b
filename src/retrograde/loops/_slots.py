"""Rows of buffers in a compiled sweep: per-step rows (``xs``, ``ys``) and snapshot slots.

Shared by the forward sweeps (:mod:`._forward_sweep`), the ``Online`` placement
(:mod:`._placement`) and the reverse sweep (:mod:`._reverse_sweep`). Everything is traced
unbatched and uses only ``jax.lax``.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import lax

from .._jax_private import config, core
from ._offload import Offload

i32 = jnp.int32


def row(xs, n):
    """Row ``n`` of each buffer."""
    return [lax.dynamic_index_in_dim(x, n, 0, keepdims=False) for x in xs]


def put_row(buffers, values, n):
    """``buffers`` with ``values`` in row ``n`` (in place)."""
    return [lax.dynamic_update_index_in_dim(b, v, n, 0) for b, v in zip(buffers, values)]


def load(slots, k, cur, off: Offload | None = None, step=None):
    """The state in slot ``k``, or ``cur`` if ``k < 0`` (a select, not a conditional: a
    conditional that passes a loop's state through copies it). With ``off``, slots from
    ``off.n_device`` on are offloaded: their state (``u_step``) is fetched from its store."""
    if off is not None:
        k, cur = off.fetch(k, cur, step)
    got = row(slots, jnp.maximum(k, 0))
    return [jnp.where(k >= 0, g, c) for g, c in zip(got, cur)]


def store(slots, k, values, off: Offload | None = None, step=None):
    """``slots`` with ``values`` in slot ``k`` (unchanged if ``k < 0``), in place. With ``off``,
    an offloaded slot's state (``u_step``) goes to its store instead."""
    if off is not None:
        k = off.keep(k, values, step)
    j = jnp.maximum(k, 0)
    old = row(slots, j)
    return put_row(slots, [jnp.where(k >= 0, v, o) for v, o in zip(values, old)], j)


def put_row_if(pred, buffers, values, k):
    """``buffers`` with ``values`` in row ``k`` if ``pred``, as a conditional: in a step's loop
    body that is one thunk, where a select (as in :func:`store`) adds a read of the row, which
    can take the body over the thunk budget (docs/performance.md, "The XLA CPU executor rule").
    Done in place. ``k`` may be a function computing the row inside the branch (then the body
    computes only ``pred``, one kernel fewer per step)."""
    return lax.cond(
        pred,
        lambda b: put_row(b, values, k() if callable(k) else k),
        lambda b: list(b),
        list(buffers),
    )


def vary_over(x, axes):
    """``x`` made to vary over the manual mesh axes ``axes`` too (inside ``jax.shard_map``;
    elsewhere, or with ``check_vma=False``, ``axes`` is empty and ``x`` is returned). A loop
    carry built here (a slot buffer, a zero cotangent) must have its leaf's type, as
    ``jax.lax``'s loops check."""
    more = tuple(sorted(frozenset(axes) - core.typeof(x).mat.varying, key=str))
    return lax.pcast(x, more, to="varying") if more else x


def varying_axes(t) -> frozenset:
    """The manual mesh axes an abstract value or ``jax.ShapeDtypeStruct`` varies over."""
    mat = t.mat if isinstance(t, core.ShapedArray) else t.manual_axis_type
    return frozenset() if mat is None else mat.varying


def vary_as(x, aval):
    """``x`` made to vary over the manual mesh axes ``aval`` (an abstract value or a
    ``jax.ShapeDtypeStruct``) varies over."""
    return vary_over(x, varying_axes(aval))


def stacked_sharding(aval, lead=()):
    """The sharding of ``lead + shape`` rows of ``aval``, each row sharded as ``aval`` is, where
    the type must say it (a mesh with explicit axes, as ``jax.make_mesh`` makes by default);
    ``None`` elsewhere (XLA's propagation then shards the rows as the values written in)."""
    for n in reversed(lead):
        aval = core.unmapped_leading_aval(n, aval)
    sharding = aval.sharding
    mesh = getattr(sharding, "mesh", None)
    return sharding if mesh is not None and mesh.explicit_axes else None


def zeros(avals, lead=()):
    """Zeros of ``lead + shape`` for each abstract value, sharded (explicit mesh axes) and
    varying (``jax.shard_map``) as it is."""
    return [
        vary_as(
            jnp.zeros(lead + tuple(a.shape), a.dtype, out_sharding=stacked_sharding(a, lead)), a
        )
        for a in avals
    ]


def any_over(pred, axes):
    """``pred`` or-ed over the batch axes ``axes`` (vmap axis names): one unbatched bool.

    Bound without JAX's varying-axes check: ``axes`` are ``vmap`` axes, which that check would
    look up among the mesh axes inside ``jax.shard_map``; the result gets ``pred``'s varying
    mesh axes back."""
    if not axes:
        return pred
    with config._check_vma(False):
        out = lax.psum(pred.astype(i32), axes) > 0
    return vary_as(out, core.typeof(pred))


def zeros_after(avals, lead, deps):
    """Zeros that XLA cannot allocate before ``deps`` exist (see
    :func:`._reverse_sweep.confined`).

    The zeros are tied to one element of every dependency: a single one may be a constant (a
    symbolic zero cotangent made concrete), which XLA folds. Inside ``jax.shard_map`` a leaf
    is tied only to dependencies that vary over no axis it does not vary over (its type must
    not change), and never to one sharded over explicit mesh axes (one element of it is not a
    value a device holds); a leaf with none left is plain zeros.
    """
    leaves = [d for d in deps if d.size]
    dep_for: dict = {}  # the varying axes of a leaf -> the zero tied to its dependencies
    out = []
    for a in avals:
        if a.mat.varying not in dep_for:
            tied = [
                d
                for d in leaves
                if core.typeof(d).mat.varying <= a.mat.varying
                and stacked_sharding(core.typeof(d)) is None
            ]
            dep_for[a.mat.varying] = (
                sum(jnp.real(d.ravel()[0]).astype(jnp.float32) for d in tied) * 0 if tied else None
            )
        dep: Any = dep_for[a.mat.varying]  # an array, or None
        if dep is None:
            out.extend(zeros([a], lead))
        else:
            full = jnp.broadcast_to(
                dep.astype(a.dtype), lead + tuple(a.shape), out_sharding=stacked_sharding(a, lead)
            )
            out.append(vary_as(full, a))
    return out
