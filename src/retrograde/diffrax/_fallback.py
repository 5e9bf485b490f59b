"""A stand-in for ``retrograde.while_loop`` built on :func:`retrograde.scan`.

Same signature and semantics: ``max_steps`` steps of a masked body, a finished step skipped by a
``lax.cond`` (with a batched predicate the step runs while any element is live, each element
masked by its own predicate). Differentiable in every mode in memory bounded by the schedule,
because ``retrograde.scan`` is; but it always walks ``max_steps`` steps (the finished ones cost a
``cond``), and its schedule is an offline one over ``max_steps``. ``CheckpointAdjoint`` uses it
only when ``retrograde.while_loop`` is not available.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import equinox.internal as eqxi

from ..schedules import Online, Revolve

__all__ = ["scan_while_loop"]


def scan_while_loop(cond_fun, body_fun, init_val, *, schedule=None, max_steps=None, buffers=None):
    if max_steps is None:
        raise ValueError("the scan-based while_loop needs max_steps.")
    from .. import scan

    if isinstance(schedule, Online):
        schedule = Revolve(schedule.snapshots)
    leaves, treedef = jtu.tree_flatten(init_val)
    leaves = [jnp.asarray(x) for x in leaves]
    buf_ids = set()
    if buffers is not None:
        buf_ids = {id(b) for b in jtu.tree_leaves(buffers(init_val))}
    # buffers are masked per element here (the stand-in has no write-only storage).
    del buf_ids

    def step(carry, _):
        val = jtu.tree_unflatten(treedef, carry)
        live = jnp.asarray(cond_fun(val))

        def run(c):
            new = jtu.tree_leaves(body_fun(jtu.tree_unflatten(treedef, c)))
            return [jnp.where(live, n, o).astype(o.dtype) for n, o in zip(new, c)]

        out = jax.lax.cond(eqxi.unvmap_any(live), run, lambda c: list(c), carry)
        return out, None

    final, _ = scan(step, leaves, length=max_steps, schedule=schedule)
    return jtu.tree_unflatten(treedef, final)
