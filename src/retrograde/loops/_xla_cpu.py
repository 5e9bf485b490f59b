"""Workarounds for XLA's CPU runtime, and the runtime facts they rest on.

The facts (why a loop body's thunk count and buffer sizes matter, and what each costs) are
stated once, in docs/performance.md, "The XLA CPU executor rule"; the code refers to that
section. The numbers are named here, once:

- :data:`SEQUENTIAL_THUNKS`: a thunk sequence (a loop body, a branch) of at most this many
  thunks runs in order, on the calling thread;
- :data:`SMALL_BUFFER_BYTES`: so does one whose every buffer is at most this large (the
  machine's vectors stay within it up to :data:`MAX_SMALL_SLOTS` slots).

Over both, a body runs on the concurrent executor, which costs more per iteration than a small
step. The helpers below give a part of a body a thunk sequence of its own, so that each stays
within the budget.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jax_core

SEQUENTIAL_THUNKS = 8
SMALL_BUFFER_BYTES = 512
# The binomial machine's int32 vectors have ``S + 2`` entries for ``S`` slots.
MAX_SMALL_SLOTS = SMALL_BUFFER_BYTES // 4 - 2


def once(pred, f, operands):
    """``f(operands)`` inside a loop that runs once: ``pred`` is true whenever this runs, which
    XLA cannot know, so the loop stays. Its body is a thunk sequence of its own, so grouping a
    part in such a loop can keep both bodies within the thunk budget (docs/performance.md, "The
    XLA CPU executor rule")."""

    def body(c):
        return False, f(c[1])

    return lax.while_loop(lambda c: c[0], body, (pred, operands))[1]


def branch(pred, f, x):
    """``f(x)`` as the branch of a conditional, ``pred`` being true whenever this runs (the other
    branch, never taken, returns zeros). Like :func:`once`, a thunk sequence of its own, but
    with no loop state to initialise: for a function that makes new arrays rather than updating
    ``x``. ``f`` is traced once (its jaxpr gives the zeros' types and is the branch)."""
    leaves, tree = jax.tree_util.tree_flatten(x)

    def flat(*v):
        return f(jax.tree_util.tree_unflatten(tree, v))

    closed, shapes = jax.make_jaxpr(flat, return_shape=True)(*leaves)
    out_tree = jax.tree_util.tree_structure(shapes)
    run = jax_core.jaxpr_as_fun(closed)

    def taken(v):
        return jax.tree_util.tree_unflatten(out_tree, run(*v))

    def zeros(v):  # made in the branch
        return jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)

    return lax.cond(pred, taken, zeros, leaves)
