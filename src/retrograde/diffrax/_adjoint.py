"""``CheckpointAdjoint``: diffrax's step loop run by ``retrograde.while_loop``."""

from __future__ import annotations

import contextlib
import functools as ft
import threading
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from ..loops import while_loop
from ._buffers import bounded_while_loop, unwrap, wrap

__all__ = ["CheckpointAdjoint"]


def default_schedule(max_steps: int):
    """``Online(s)`` with the fewest slots ``s`` such that ``(s + 1)(s + 2) / 2 >= max_steps``
    (no step is run plainly more than twice when the solve takes ``max_steps`` steps): the rule
    ``RecursiveCheckpointAdjoint`` uses for its default number of checkpoints, so the two use the
    same memory and recomputation by default (about ``sqrt(2 max_steps)`` snapshots: 90 for
    4096)."""
    from ..schedules import Online, beta

    s = 1
    while beta(s, 2) < max_steps:
        s += 1
    return Online(s)


class _StageKind(str):
    """A Runge-Kutta ``scan_kind`` that reads ``"bounded"``, except while the first-order step is
    traced (inside :func:`_first_order`), where it reads ``"checkpointed"``.

    ``"bounded"`` stage loops are differentiable in every mode; ``"checkpointed"`` ones reverse
    faster (a ``custom_vjp`` storing every stage) but are not forward- or twice-differentiable.
    ``retrograde.while_loop`` runs the second version wherever it executes a step or its VJP,
    and transforms only the first (``first_order_body_fun``).
    """

    _state = threading.local()

    def __new__(cls):
        return super().__new__(cls, "bounded")

    @classmethod
    def current(cls) -> str:
        return "checkpointed" if getattr(cls._state, "fast", False) else "bounded"

    def __eq__(self, other):
        if isinstance(other, _StageKind):
            return True
        return isinstance(other, str) and self.current() == str(other)

    def __ne__(self, other):
        return not self == other

    __hash__ = str.__hash__


@contextlib.contextmanager
def _first_order():
    old = getattr(_StageKind._state, "fast", False)
    _StageKind._state.fast = True
    try:
        yield
    finally:
        _StageKind._state.fast = old


def outer_while_loop(
    cond_fun, body_fun, init_val, *, max_steps, buffers=None, schedule=None, **_
):
    """Run diffrax's step loop with ``retrograde.while_loop``.

    The loop sees a flat list of plain arrays. Buffer leaves (``buffers(init_val)``: SaveAt
    outputs, dense output) are handed to the step as :class:`WriteOnly` wrappers, so that the
    step's ``buffer_at_set(..., pred=...)`` writes are pure scatters that never read the buffer,
    and passed to ``while_loop`` as its ``buffers`` (stored once, not in every snapshot).
    Non-array leaves (Python constants such as a static ``made_jump=False``) stay static.
    """
    loop = while_loop
    if schedule is None:
        schedule = default_schedule(max_steps)
    leaves, treedef = jtu.tree_flatten(init_val)
    buf_ids = set()
    if buffers is not None:
        buf_ids = {id(b) for b in jtu.tree_leaves(buffers(init_val))}
    is_buf = [id(x) in buf_ids and eqx.is_array(x) for x in leaves]

    # Which leaves are dynamic: arrays in the input, or leaves the step turns into arrays.
    def _wrap_tree(lvs):
        return jtu.tree_unflatten(
            treedef, [wrap(x) if b else x for x, b in zip(lvs, is_buf)]
        )

    def _out_leaves(val):
        out = jtu.tree_leaves(unwrap(val))
        if len(out) != len(leaves):
            raise TypeError("retrograde.diffrax: the step changed the structure of the state.")
        return out

    out_shape = jax.eval_shape(lambda v: _out_leaves(body_fun(_wrap_tree(jtu.tree_leaves(v)))),
                               init_val)
    dyn = [
        eqx.is_array(x) or isinstance(o, jax.ShapeDtypeStruct)
        for x, o in zip(leaves, out_shape)
    ]
    dyn_idx = [k for k, d in enumerate(dyn) if d]
    init_dyn = [jnp.asarray(leaves[k]) for k in dyn_idx]
    dtypes = [x.dtype for x in init_dyn]

    def full(dvals):
        lvs = list(leaves)
        for k, v in zip(dyn_idx, dvals):
            lvs[k] = v
        return lvs

    def flat_cond(dvals):
        return cond_fun(jtu.tree_unflatten(treedef, full(dvals)))

    def flat_body(dvals):
        new = _out_leaves(body_fun(_wrap_tree(full(dvals))))
        return [jnp.asarray(new[k]).astype(dt) for k, dt in zip(dyn_idx, dtypes)]

    def first_order_body(dvals):
        with _first_order():
            return flat_body(dvals)

    buf_pos = [j for j, k in enumerate(dyn_idx) if is_buf[k]]
    flat_buffers = (lambda dvals: [dvals[j] for j in buf_pos]) if buf_pos else None

    final = loop(flat_cond, flat_body, init_dyn, schedule=schedule, max_steps=max_steps,
                 buffers=flat_buffers, first_order_body_fun=first_order_body)
    return jtu.tree_unflatten(treedef, full(final))


def inner_while_loop(cond_fun, body_fun, init_val, *, max_steps, buffers=None, **_):
    """The loops diffrax nests inside one step (the ``SaveAt(ts=...)`` save loop):
    :func:`bounded_while_loop`, differentiable in every mode, its size bounded by its own
    ``max_steps`` (the number of save times), independent of the solver's ``max_steps``. The save
    loop's carry is two indices, so it runs only the saves the step makes and then evaluates
    their values in one vectorised pass."""
    if max_steps is None:
        raise ValueError("retrograde.diffrax: an inner loop needs max_steps.")
    return bounded_while_loop(cond_fun, body_fun, init_val, max_steps=max_steps, buffers=buffers)


class CheckpointAdjoint(diffrax.AbstractAdjoint):
    """Differentiate through ``diffrax.diffeqsolve`` with a checkpointed step loop that every JAX
    transformation understands.

    A drop-in ``adjoint=``: like ``diffrax.RecursiveCheckpointAdjoint`` it differentiates the
    numerical solution ("discretise-then-optimise") keeping only a few snapshots of the solver
    state, but the loop is ``retrograde.while_loop``, so reverse mode, forward mode
    (``jax.jvp``), ``vmap``, ``jax.hessian`` and gradients of gradients all work, in memory set by
    the schedule (never by ``max_steps``). The number of steps taken is treated as fixed by
    derivatives (as every discretise-then-optimise adjoint does).

    Args:
        schedule: the ``retrograde.while_loop`` schedule. ``Online(s)`` keeps ``s`` snapshots
            of the solver state (save buffers are stored once, not in snapshots), placed as steps
            arrive. Default: :func:`default_schedule` -- ``Online(s)`` with
            ``(s + 1)(s + 2) / 2 >= max_steps``, the memory and recomputation of
            ``RecursiveCheckpointAdjoint``'s default. Pass e.g. ``Online(16)`` for less memory
            (more recomputation).

    Requires ``diffeqsolve(..., max_steps=int)`` (the default 4096 is fine: memory does not
    depend on it). Runge-Kutta stage loops run as bounded ``lax.scan`` loops (``scan_kind=
    "bounded"``, as ``DirectAdjoint`` does) wherever the step is transformed (``jvp``, second
    and higher order), and as diffrax's faster checkpointed loops wherever a step or its VJP is
    only executed (the forward pass, recomputation, first-order reverse sweeps; see
    ``while_loop``'s ``first_order_body_fun``), unless the solver sets ``scan_kind`` itself;
    ``SaveAt(ts=...)`` save loops run the saves a step makes, then evaluate the saved values in
    one vectorised pass (see ``bounded_while_loop``).

    Example:
        >>> import diffrax, jax, jax.numpy as jnp
        >>> from retrograde.diffrax import CheckpointAdjoint
        >>> def loss(y0):
        ...     sol = diffrax.diffeqsolve(
        ...         diffrax.ODETerm(lambda t, y, a: -y), diffrax.Tsit5(), 0.0, 1.0, 0.1, y0,
        ...         adjoint=CheckpointAdjoint(), max_steps=64)
        ...     return jnp.sum(sol.ys[-1] ** 2)
        >>> g = jax.grad(loss)(jnp.ones(2))
    """

    schedule: Any = eqx.field(static=True, default=None)

    def loop(
        self,
        *,
        solver,
        max_steps,
        terms,
        throw,
        passed_solver_state,
        passed_controller_state,
        **kwargs,
    ):
        del throw, passed_solver_state, passed_controller_state
        if max_steps is None:
            raise ValueError(
                "retrograde.diffrax.CheckpointAdjoint needs diffeqsolve(..., max_steps=int); the "
                "memory used does not depend on it, only on the schedule."
            )
        if _is_unsafe_sde(terms):
            raise ValueError(
                "CheckpointAdjoint does not support UnsafeBrownianPath: the step must be "
                "recomputable."
            )
        if isinstance(solver, _rk_classes()) and getattr(solver, "scan_kind", None) is None:
            solver = eqx.tree_at(
                lambda s: s.scan_kind, solver, _StageKind(), is_leaf=lambda x: x is None
            )
        return self._loop(
            **kwargs,
            solver=solver,
            max_steps=max_steps,
            terms=terms,
            inner_while_loop=inner_while_loop,
            outer_while_loop=ft.partial(outer_while_loop, schedule=self.schedule),
        )


def _rk_classes():
    classes = [diffrax.AbstractRungeKutta]
    srk = getattr(diffrax, "AbstractSRK", None)
    if srk is not None:
        classes.append(srk)
    return tuple(classes)


def _is_unsafe_sde(terms) -> bool:
    try:
        from diffrax._adjoint import is_unsafe_sde
    except ImportError:  # pragma: no cover
        return False
    return is_unsafe_sde(terms)


CheckpointAdjoint.__init__.__doc__ = """**Arguments:** schedule (a retrograde schedule or None)."""
