"""Public functions: ``forward``, ``value_and_grad``, ``hvp``, ``jvp``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from ..schedules import Schedule
from ._driver import ForwardPass, Grads, copy_tree, initial_state
from ._step import (
    JaxCore,
    JaxStep,
    LossImpl,
    LossLike,
    PyTree,
    Step,
    StepLike,
    WeakCache,
    as_losses,
    as_step,
)
from ._storage import StorageSpec
from ._trees import TreeSpec, private, readonly

__all__ = ["forward", "value_and_grad", "hvp", "jvp", "HessianProduct", "Tangents"]

tree_util = jax.tree_util


def forward(
    step: StepLike,
    state0: PyTree,
    params: PyTree,
    n_steps: int | None,
    *,
    schedule: Schedule,
    loss: LossLike = None,
    storage: StorageSpec = None,
    until: Callable[[int, Any], Any] | None = None,
    progress: bool | None = None,
) -> ForwardPass:
    """Run the loop ``u_{n+1} = step(n, u_n, params)`` once, laying the schedule's snapshots.

    Args:
        step: a JAX function ``step(n, state, params) -> state`` or a :class:`Step`.
        state0: the initial state ``u_0``, a pytree of arrays (copied, never modified).
        params: the parameters, a pytree (copied; every step gets the same read-only arrays;
            leaves that are not arrays are passed as they are).
        n_steps: ``N``; ``None`` for a loop that stops when ``until`` says so (online schedules).
        schedule: a :mod:`retrograde.schedules` schedule (``Revolve(s)``, ``StoreAll()``,
            ``MultiLevel(...)``, an online schedule, ...).
        loss: ``None``, a :class:`Running` or :class:`Final` term, or a tuple of them;
            ``J = sum_{n=1..N} running(n, u_n, p) + final(N, u_N, p)``.
        storage: where each schedule level keeps its snapshots: ``None`` (each level's
            ``Level(storage=...)``, as in the compiled loops: ``"disk"`` levels on
            ``Disk(level.directory)``, others in :class:`Memory`), one store for all levels, a
            list per level, or a mapping level index/name -> store.
        until: ``until(n, u_n) -> bool``: stop before step ``n`` when true (needs an online
            schedule; with ``n_steps`` as well, the loop stops at whichever comes first).
        progress: ``None`` shows a tqdm bar when ``N >= 1000`` (or unknown) and stderr is a
            terminal; ``True``/``False`` force it on/off.

    Returns:
        A :class:`ForwardPass` with ``.state`` (``u_N``), ``.value`` (``J``) and ``.vjp(...)``,
        callable many times; close it (``with`` block) to release the snapshots.

    Cost: the schedule's first sweep plus the steps from its end to ``N`` (one step for the
    schedules shipped, none when the sweep ends at ``u_N``); memory: the snapshots (and, for a
    mixed schedule, the step data) of that sweep until closed, the state the reverse part starts
    from, ``u_N`` (``.state``), the final loss gradient and ``params`` (copies), plus the
    snapshots and data of a running ``vjp``.

    Arrays: steps may overwrite the state and cotangents they are handed; see
    ``docs/host.md`` for the whole aliasing contract.

    MPI: when each rank steps its own part of a distributed state, call this on every rank with
    the same schedule and step count (an ``until`` must return the same answer on every rank,
    e.g. after an allreduce); each rank keeps its own snapshots (``Disk`` names its directory and
    files by rank), and ``params`` cotangents are per rank (sum them yourself if shared).

    Example:
        >>> import jax.numpy as jnp
        >>> import retrograde.host as rh
        >>> from retrograde.schedules import Revolve
        >>> step = lambda n, u, a: u + 0.1 * jnp.sin(a * u)
        >>> with rh.forward(step, jnp.ones(3), 2.0, 50, schedule=Revolve(4),
        ...                 loss=rh.Final(lambda n, u, a: jnp.sum(u**2))) as fp:
        ...     g1 = fp.vjp()                       # dJ/d(a, u0)
        ...     g2 = fp.vjp(jnp.ones(3), loss_bar=0.0)   # d(sum u_N)/d(a, u0)
        >>> round(float(g1.params), 3), round(float(g2.params), 3)
        (-7.401, -2.356)
    """
    return ForwardPass(
        as_step(step),
        as_losses(loss),
        state0,
        params,
        n_steps,
        schedule=schedule,
        storage=storage,
        until=until,
        progress=progress,
    )


def value_and_grad(
    step: StepLike,
    loss: LossLike,
    state0: PyTree,
    params: PyTree,
    n_steps: int | None,
    *,
    schedule: Schedule,
    storage: StorageSpec = None,
    until: Callable[[int, Any], Any] | None = None,
    progress: bool | None = None,
) -> tuple[float, Grads]:
    """The loss ``J`` and its gradient, reversing the loop with ``schedule``.

    Arguments as in :func:`forward`; ``loss`` is required (:class:`Running`, :class:`Final` or a
    tuple of them).

    Returns:
        ``(J, Grads(params=dJ/dparams, state0=dJ/du_0))``.

    Cost: the schedule's plain evaluations plus one, and ``N`` adjoint evaluations; memory: the
    schedule's snapshots plus the state at hand, the state's cotangent and the parameters'
    cotangent (plus what the step allocates). All snapshots (and any disk directory) are
    released before returning, also on an exception.

    Example:
        >>> import numpy as np
        >>> import retrograde.host as rh
        >>> from retrograde.schedules import Revolve
        >>> step = rh.Step(lambda n, u, a: u + 0.1 * np.sin(a * u),
        ...                lambda n, u, a, b: (b * (1 + 0.1 * a * np.cos(a * u)),
        ...                                    np.sum(b * 0.1 * u * np.cos(a * u))))
        >>> loss = rh.Final(lambda n, u, a: np.sum(u**2), grad=lambda n, u, a: (2 * u, 0.0))
        >>> J, g = rh.value_and_grad(step, loss, np.ones(3), 2.0, 100, schedule=Revolve(5))
        >>> round(float(J), 3), round(float(g.params), 3)
        (7.402, -7.402)
    """
    if loss is None:
        raise ValueError(
            "value_and_grad needs a loss: Running(f) (summed over steps), Final(f) (last state) "
            "or a tuple of them."
        )
    with ForwardPass(
        as_step(step),
        as_losses(loss),
        state0,
        params,
        n_steps,
        schedule=schedule,
        storage=storage,
        until=until,
        progress=progress,
        single=True,
    ) as fp:
        grads = fp.vjp(keep=False)
        return fp.value, grads


class HessianProduct(NamedTuple):
    """Result of :func:`hvp`: ``value`` ``J``, ``grad`` (:class:`Grads`) and ``hvp``
    (:class:`Grads`, the Hessian of ``J`` with respect to ``(params, state0)`` applied to the
    direction).

    Example: ``hp = rh.hvp(step, loss, u0, p, 100, p_dot, schedule=Revolve(8))``;
    ``hp.value``, ``hp.grad`` and ``hp.hvp`` (the latter two shaped like the inputs).
    """

    value: float
    grad: Grads
    hvp: Grads


def _aug_loss(f):
    """Compiled value ``f`` (primal) and gradient of ``f_dot`` of a tangent-augmented loss."""

    def fdot(n, s, p):
        return jax.jvp(lambda u, q: f(n, u, q), (s[0], p[0]), (s[1], p[1]))[1]

    return jax.jit(lambda n, s, p: f(n, s[0], p[0])), jax.jit(jax.grad(fdot, argnums=(1, 2)))


def _aug_step(fn):
    def aug(n, s, p):
        return jax.jvp(lambda u, q: fn(n, u, q), (s[0], p[0]), (s[1], p[1]))

    return JaxCore(aug)


_AUG_STEPS = WeakCache()
_AUG_LOSSES = WeakCache()


def hvp(
    step: StepLike,
    loss: LossLike,
    state0: PyTree,
    params: PyTree,
    n_steps: int | None,
    params_dot: PyTree,
    state0_dot: PyTree | None = None,
    *,
    schedule: Schedule,
    storage: StorageSpec = None,
    until: Callable[[int, Any], Any] | None = None,
    progress: bool | None = None,
) -> HessianProduct:
    """Hessian-vector product of ``J`` through the same schedule (JAX steps and losses only).

    Forward-over-reverse: the schedule runs on the tangent-augmented step
    ``(u, u_dot) -> jax.jvp(step)`` with the tangent of the loss, ``J_dot = <grad J, d>``; its
    gradient is ``H d`` and, in the tangent slots, ``grad J`` itself.

    Args:
        params_dot, state0_dot: the direction ``d`` (``state0_dot=None``: zero).
        the rest: as in :func:`value_and_grad`.

    Returns:
        :class:`HessianProduct` ``(value, grad, hvp)``, each gradient a :class:`Grads`.

    Cost: like one :func:`value_and_grad` with steps about 3x as expensive; snapshots hold
    ``(u, u_dot)``, twice the memory.

    Example:
        >>> import jax.numpy as jnp
        >>> import retrograde.host as rh
        >>> from retrograde.schedules import Revolve
        >>> step = lambda n, u, a: u + 0.1 * jnp.sin(a * u)
        >>> loss = rh.Final(lambda n, u, a: jnp.sum(u**2))
        >>> r = rh.hvp(step, loss, jnp.ones(3), 2.0, 50, 1.0, schedule=Revolve(4))
        >>> d2J_da2 = r.hvp.params
        >>> round(float(d2J_da2), 2)
        11.1
    """
    if isinstance(step, Step) or not callable(step):
        raise TypeError(
            "hvp needs a JAX step function step(n, state, params) (second derivatives come from "
            f"JAX); got {step!r}. For a hand-written Step, difference two value_and_grad calls."
        )
    terms = as_losses(loss)
    if not terms:
        raise ValueError("hvp needs a loss: Running(f), Final(f) or a tuple of them.")
    for t in terms:
        if not t.is_jax:
            raise TypeError(
                f"hvp needs JAX-differentiable loss terms (grad=None); {t.term!r} has a "
                "hand-written grad."
            )
    aug_step = JaxStep(step, _AUG_STEPS.get(step, _aug_step))
    aug_losses = tuple(LossImpl(t.term, _AUG_LOSSES.get(t.term.f, _aug_loss)) for t in terms)
    s0 = initial_state(state0, True)
    sd = _tangent(state0_dot, s0, "state0_dot", "hvp", True)
    pd = _tangent(params_dot, params, "params_dot", "hvp", True)
    aug_until = None if until is None else (lambda n, s: until(n, s[0]))
    with ForwardPass(
        aug_step,
        aug_losses,
        (s0, sd),
        (params, pd),
        n_steps,
        schedule=schedule,
        storage=storage,
        until=aug_until,
        progress=progress,
        single=True,
    ) as fp:
        g = fp.vjp(keep=False)
        value = fp.value
    (h_p, g_p), (h_u, g_u) = g.params, g.state0
    return HessianProduct(value, Grads(g_p, g_u), Grads(h_p, h_u))


def _tangent(tangent, primal, name, where, jax_step):
    """A private copy of ``tangent`` (``None``: zero) with the structure, shapes and floating
    dtypes of ``primal`` as the step computes it (``jax_step``: a JAX one); plain ``0.0`` leaves
    or subtrees are zeros."""
    spec = TreeSpec(primal, name.removesuffix("_dot"), jax_step)
    if tangent is None:
        return spec.materialize([None] * len(spec))
    leaves = spec.check_cotangent(tangent, where, name, verb="got")
    return spec.materialize(
        [None if x is None else np.array(x, dtype=spec.cot_dtypes[i]) for i, x in enumerate(leaves)]
    )


class Tangents(NamedTuple):
    """Result of :func:`jvp`: final state and its tangent; loss value and its tangent (``None``
    without a loss).

    Example: ``t = rh.jvp(step, u0, p, 100, u0_dot, p_dot)``; the final state and its
    directional derivative, shaped like the state.
    """

    state: Any
    state_dot: Any
    value: float | None
    value_dot: float | None


def jvp(
    step: StepLike,
    state0: PyTree,
    params: PyTree,
    n_steps: int | None,
    state0_dot: PyTree | None = None,
    params_dot: PyTree | None = None,
    *,
    loss: LossLike = None,
    until: Callable[[int, Any], Any] | None = None,
) -> Tangents:
    """Forward-mode derivative of the loop: no snapshots, ``O(1)`` extra memory.

    Uses ``Step.jvp`` (required) for a hand-written step and ``jax.jvp`` for a JAX step; the loss
    tangent is ``<grad f, (u_dot, params_dot)>`` summed like the loss.

    Args:
        state0_dot, params_dot: the tangent direction (``None``: zero).
        n_steps, until, loss: as in :func:`forward` (no schedule is needed).

    Returns:
        :class:`Tangents` ``(state, state_dot, value, value_dot)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import retrograde.host as rh
        >>> t = rh.jvp(lambda n, u, a: u * a, jnp.ones(2), 0.5, 3, params_dot=1.0)
        >>> [float(x) for x in t.state_dot]      # d(u0 a^3)/da = 3 a^2
        [0.75, 0.75]
    """
    impl = as_step(step)
    losses = as_losses(loss)
    if n_steps is None and until is None:
        raise ValueError("jvp needs n_steps or until=lambda n, state: <stop?>.")
    state = initial_state(state0, impl.is_jax)
    sspec = TreeSpec(state, "state", impl.is_jax)
    pspec = TreeSpec(params, "params", impl.is_jax)
    sdot = _tangent(state0_dot, state, "state0_dot", "jvp", impl.is_jax)
    pdot = private(_tangent(params_dot, params, "params_dot", "jvp", impl.is_jax), copy=False)
    params = private(params, copy=True)
    J, Jdot = 0.0, 0.0

    def dot(g, t):
        return sum(
            float(np.sum(np.asarray(a) * np.asarray(b)))
            for a, b in zip(g, tree_util.tree_leaves(t))
            if a is not None
        )

    def add_loss(n, L):
        nonlocal J, Jdot
        view = readonly(state)
        J += L.value(n, view, params)
        gs, gp = L.grad(n, view, params)
        where = L.where("grad", n)
        Jdot += dot(sspec.check_cotangent(gs, where, "state_bar"), sdot) + dot(
            pspec.check_cotangent(gp, where, "params_bar"), pdot
        )

    n = 0
    while (n_steps is None or n < n_steps) and not (
        until is not None and bool(until(n, readonly(state)))
    ):
        state, sdot = impl.jvp(n, state, params, sdot, pdot)
        where = impl.where("jvp", n)
        state = sspec.check_primal(state, where)
        sdot = sspec.materialize(sspec.check_cotangent(sdot, where, "next_state_dot"))
        n += 1
        for L in losses:
            if L.running:
                add_loss(n, L)
    for L in losses:
        if not L.running:
            add_loss(n, L)
    if losses:
        return Tangents(copy_tree(state), copy_tree(sdot), J, Jdot)
    return Tangents(copy_tree(state), copy_tree(sdot), None, None)
