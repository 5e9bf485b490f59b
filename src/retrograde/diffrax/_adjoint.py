"""``CheckpointAdjoint``: diffrax's step loop run by ``retrograde.while_loop``."""

from __future__ import annotations

import functools as ft
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from ..loops import while_loop
from ..loops._slots import vary_over, varying_axes
from ..schedules import default_schedule
from ._buffers import bounded_while_loop, unwrap, wrap
from ._private import with_replaced

__all__ = ["CheckpointAdjoint"]


def outer_while_loop(
    cond_fun,
    body_fun,
    init_val,
    *,
    max_steps,
    buffers=None,
    schedule=None,
    first_order_body_fun=None,
    **_,
):
    """Run diffrax's step loop with ``retrograde.while_loop``.

    The loop sees a flat list of plain arrays. Buffer leaves (``buffers(init_val)``: SaveAt
    outputs, dense output) are handed to the step as write-only buffers (:func:`wrap`), so that
    the step's ``buffer_at_set(..., pred=...)`` writes are pure scatters that never read the
    buffer, and passed to ``while_loop`` as its ``buffers`` (stored once, not in every snapshot).
    Non-array leaves (Python constants such as a static ``made_jump=False``) stay static.
    ``first_order_body_fun``: the same step with faster-to-reverse stage loops, for the places
    where the loop only runs steps or their VJPs (``while_loop``'s argument of that name).
    """
    if schedule is None and max_steps is not None:
        schedule = default_schedule(max_steps, online=True)
    leaves, treedef = jtu.tree_flatten(init_val)
    buf_ids = set()
    if buffers is not None:
        buf_ids = {id(b) for b in jtu.tree_leaves(buffers(init_val))}
    is_buf = [id(x) in buf_ids and eqx.is_array(x) for x in leaves]

    # Which leaves are dynamic: arrays in the input, or leaves the step turns into arrays.
    def _wrap_tree(lvs):
        return jtu.tree_unflatten(treedef, [wrap(x) if b else x for x, b in zip(lvs, is_buf)])

    def _out_leaves(val):
        out = jtu.tree_leaves(unwrap(val))
        if len(out) != len(leaves):
            raise TypeError("retrograde.diffrax: the step changed the structure of the state.")
        return out

    out_shape = jax.eval_shape(
        lambda v: _out_leaves(body_fun(_wrap_tree(jtu.tree_leaves(v)))), init_val
    )
    dyn = [
        eqx.is_array(x) or isinstance(o, jax.ShapeDtypeStruct) for x, o in zip(leaves, out_shape)
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

    def flat(step):
        def flat_step(dvals):
            new = _out_leaves(step(_wrap_tree(full(dvals))))
            return [_as_dtype(new[k], dt) for k, dt in zip(dyn_idx, dtypes)]

        return flat_step

    buf_pos = [j for j, k in enumerate(dyn_idx) if is_buf[k]]
    flat_buffers = (lambda dvals: [dvals[j] for j in buf_pos]) if buf_pos else None
    fast = None if first_order_body_fun is None else flat(first_order_body_fun)
    final = while_loop(
        flat_cond,
        flat(body_fun),
        init_dyn,
        schedule=schedule,
        max_steps=max_steps,
        buffers=flat_buffers,
        first_order_body_fun=fast,
    )
    return jtu.tree_unflatten(treedef, full(final))


def _as_dtype(x, dtype):
    """``x`` as an array of ``dtype``; a weakly typed ``x`` of that dtype stays weak (as
    ``lax.while_loop`` keeps it: diffrax's step counters are weak, and strict dtype promotion
    lets a weak int64 meet int32)."""
    x = jnp.asarray(x)
    return x if x.dtype == dtype else x.astype(dtype)


def inner_while_loop(
    cond_fun, body_fun, init_val, *, max_steps, buffers=None, first_order=False, **_
):
    """The loops diffrax nests inside one step (the ``SaveAt(ts=...)`` save loop):
    :func:`bounded_while_loop`, differentiable in every mode, its size bounded by its own
    ``max_steps`` (the number of save times), independent of the solver's ``max_steps``. The save
    loop's carry is two indices, so it runs only the saves the step makes and then evaluates
    their values in one vectorised pass; with ``first_order`` (``first_order_inner_while_loop``,
    in the step that is only executed or reverse-differentiated) each value once, in the loop
    that runs the saves, its VJP a ``custom_vjp``."""
    if max_steps is None:
        raise ValueError("retrograde.diffrax: an inner loop needs max_steps.")
    return bounded_while_loop(
        cond_fun, body_fun, init_val, max_steps=max_steps, buffers=buffers, first_order=first_order
    )


first_order_inner_while_loop = ft.partial(inner_while_loop, first_order=True)


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
            arrive. Default: ``retrograde.schedules.default_schedule(max_steps, online=True)``
            -- ``Online(s)`` with ``(s + 1)(s + 2) / 2 >= max_steps``, the memory and
            recomputation of ``RecursiveCheckpointAdjoint``'s default (``Online(16)`` if
            ``max_steps=None``). Pass e.g. ``Online(16)`` for less memory (more recomputation).

    ``diffeqsolve(..., max_steps=None)`` is differentiable too (``RecursiveCheckpointAdjoint``
    then is not): memory never depends on ``max_steps``. Runge-Kutta stage loops run as bounded
    loops (``scan_kind="bounded"``, as ``DirectAdjoint`` does; an SRK's as ``"lax"``) wherever
    the step is transformed (``jvp``, second and higher order), and as diffrax's faster
    checkpointed loops wherever a step or its VJP is only executed (the forward pass,
    recomputation, first-order reverse sweeps; see ``while_loop``'s ``first_order_body_fun``):
    the two are diffrax's step built twice, once around each version of the solver, unless the
    solver sets ``scan_kind`` itself. ``SaveAt(ts=...)`` save loops run the saves a step makes,
    evaluating each saved value once where the step is only executed or reverse-differentiated
    (its VJP a ``custom_vjp`` over the same saves), and in one vectorised pass where it is
    transformed further (see ``bounded_while_loop``). A
    progress meter's state gets no derivative. Save buffers subclass equinox's private buffer
    type, so diffrax's runtime type annotations accept them (see ``_private.py``).

    Example:
        >>> import diffrax, jax, jax.numpy as jnp
        >>> from retrograde.diffrax import CheckpointAdjoint
        >>> def loss(y0):
        ...     sol = diffrax.diffeqsolve(
        ...         diffrax.ODETerm(lambda t, y, a: -y), diffrax.Tsit5(), 0.0, 1.0, 0.1, y0,
        ...         adjoint=CheckpointAdjoint(), max_steps=64)
        ...     return jnp.sum(sol.ys[-1] ** 2)
        >>> g = jax.grad(loss)(jnp.ones(2))
        >>> [round(float(x), 4) for x in g]   # 2 exp(-2)
        [0.2707, 0.2707]
    """

    schedule: Any = eqx.field(static=True, default=None)

    def loop(
        self,
        *,
        solver: diffrax.AbstractSolver,
        max_steps: int | None,
        terms: Any,
        throw: bool,
        passed_solver_state: bool,
        passed_controller_state: bool,
        **kwargs: Any,
    ) -> Any:
        del throw, passed_solver_state, passed_controller_state
        if _is_unsafe_sde(terms):
            raise ValueError(
                "CheckpointAdjoint does not support UnsafeBrownianPath: the step must be "
                "recomputable."
            )
        kinds = _stage_kinds(_unwrapped(solver))
        fast_solver = None
        if kinds is not None:
            general, fast = kinds
            kind = lambda s: _unwrapped(s).scan_kind
            fast_solver = eqx.tree_at(kind, solver, fast, is_leaf=_is_none)
            solver = eqx.tree_at(kind, solver, general, is_leaf=_is_none)
        kwargs["progress_meter"] = _Undifferentiated(kwargs["progress_meter"])
        return self._loop(
            **kwargs,
            solver=solver,
            max_steps=max_steps,
            terms=terms,
            inner_while_loop=inner_while_loop,
            outer_while_loop=ft.partial(
                _outer_loop, schedule=self.schedule, solver=solver, fast_solver=fast_solver
            ),
        )


def _outer_loop(cond_fun, body_fun, init_val, *, solver, fast_solver, **kwargs):
    """:func:`outer_while_loop`, given as ``first_order_body_fun`` diffrax's step with
    ``fast_solver`` in place of ``solver`` (if the step closes over ``solver``) and
    ``first_order_inner_while_loop`` in place of :func:`inner_while_loop`."""
    fast = body_fun
    if fast_solver is not None:
        fast = with_replaced(fast, solver, fast_solver) or fast
    fast = with_replaced(fast, inner_while_loop, first_order_inner_while_loop) or fast
    if fast is body_fun:
        fast = None
    if jax.sharding.get_abstract_mesh().manual_axes:
        init_val = _varying_init(body_fun, init_val)
    return outer_while_loop(cond_fun, body_fun, init_val, first_order_body_fun=fast, **kwargs)


def _is_save_state(x) -> bool:
    return hasattr(x, "ys") and hasattr(x, "save_index")


def _varying_init(body_fun, init_val):
    """Inside ``jax.shard_map``: diffrax's initial loop state with each leaf typed as the step
    makes it, as a user of ``jax.lax.while_loop`` would write it (``jax.lax.pcast(...,
    to="varying")`` on the initial carry). diffrax builds its save buffers and its solver and
    controller states replicated, while the solution varies over the mesh axes of ``y0``: its
    save buffers are made to vary as ``y0`` does (those saved only after the loop too), then
    every leaf the step makes vary is made to, until the types are fixed (one trace of the step
    per round, at most one round per leaf)."""
    axes = frozenset().union(*(jax.typeof(v).mat.varying for v in jtu.tree_leaves(init_val.y)))

    def vary(x, wanted):
        return vary_over(x, wanted) if isinstance(x, jax.Array) else x

    saves = jtu.tree_map(
        lambda s: eqx.tree_at(lambda t: t.ys, s, jtu.tree_map(lambda y: vary(y, axes), s.ys)),
        init_val.save_state,
        is_leaf=_is_save_state,
    )
    init_val = eqx.tree_at(lambda st: st.save_state, init_val, saves)
    leaves, tree = jtu.tree_flatten(init_val)
    for _ in range(len(leaves) + 1):
        out = jtu.tree_leaves(jax.eval_shape(body_fun, init_val))
        wider = [vary(x, varying_axes(o)) for x, o in zip(leaves, out)]
        if all(w is x for w, x in zip(wider, leaves)):
            return init_val
        leaves = wider
        init_val = jtu.tree_unflatten(tree, leaves)
    return init_val


class _Undifferentiated(diffrax.AbstractProgressMeter):
    """A progress meter whose steps see no derivatives: ``step`` gets its state and progress
    through ``lax.stop_gradient``. A meter's state is for display and its value never reaches
    the solution, but the loop differentiates the whole step (diffrax's meters use
    ``unvmap_max``, which has no derivative rule); ``RecursiveCheckpointAdjoint`` sees these
    derivatives as symbolic zeros."""

    meter: diffrax.AbstractProgressMeter

    def init(self):
        return self.meter.init()

    def step(self, state, progress):
        state, progress = jax.lax.stop_gradient((state, progress))
        return self.meter.step(state, progress)

    def close(self, state):
        return self.meter.close(state)


def _is_none(x) -> bool:
    return x is None


def _unwrapped(solver):
    """The solver whose stage loop runs: ``solver``, or the one a wrapper such as
    ``diffrax.HalfSolver`` wraps (recursively). diffrax's ``isinstance`` sees a wrapper as an
    instance of the solver class it wraps, but only the wrapped solver has ``scan_kind``."""
    while isinstance(solver, diffrax.AbstractWrappedSolver):
        solver = solver.solver
    return solver


def _stage_kinds(solver) -> tuple[str, str] | None:
    """``(general, fast)`` stage-loop kinds for a solver whose ``scan_kind`` is unset: the
    general one is differentiable in every mode (a Runge-Kutta method's ``"bounded"`` loop, an
    SRK's ``"lax"`` scan of its fixed number of stages), the fast one is diffrax's
    ``"checkpointed"`` loop, a ``custom_vjp``. None if the solver has none or sets it."""
    if not isinstance(solver, (diffrax.AbstractRungeKutta, diffrax.AbstractSRK)):
        return None
    if solver.scan_kind is not None:
        return None
    if isinstance(solver, diffrax.AbstractSRK):
        return "lax", "checkpointed"
    return "bounded", "checkpointed"


def _is_unsafe_sde(terms) -> bool:
    """Whether ``terms`` contain a ``diffrax.UnsafeBrownianPath`` (whose samples a recomputed
    step would not reproduce)."""
    is_unsafe = lambda x: isinstance(x, diffrax.UnsafeBrownianPath)
    return any(is_unsafe(x) for x in jtu.tree_leaves(terms, is_leaf=is_unsafe))


CheckpointAdjoint.__init__.__doc__ = """**Arguments:** schedule (a retrograde schedule or None)."""
