"""Steps and loss terms for host-driven loops.

A *step* maps ``(n, state, params) -> next_state``; ``state`` and ``params`` are pytrees of
arrays. Two kinds are accepted wherever a step is expected:

* a JAX-differentiable function ``step(n, state, params)``: its plain evaluation, VJP and JVP come
  from JAX, each compiled once with ``jax.jit`` (``n`` arrives as a traced integer scalar, so a new
  step index never triggers a recompilation);
* a :class:`Step` of hand-written functions, for NumPy or SciPy code.

A *loss term* is :class:`Running` (summed over the states after every step) or :class:`Final`
(read on the last state only).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["Step", "Running", "Final"]

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Step:
    """A time step with a hand-written adjoint (NumPy, SciPy, or anything else).

    Args:
        forward: ``forward(n, state, params) -> next_state``; ``n`` is the step index (a Python
            int), ``state`` a pytree of arrays. It may update the arrays of ``state`` in place and
            return them: every snapshot is a private copy, so this never corrupts the adjoint.
        vjp: ``vjp(n, state, params, next_state_bar) -> (state_bar, params_bar)``: the transposed
            Jacobian of ``forward`` at ``(state, params)`` applied to the cotangent of its output.
            ``state_bar`` has the structure of ``state``, ``params_bar`` that of ``params`` (leaves
            that carry no derivative may be ``0.0``, and so may all of it). It receives the same
            ``state`` that ``forward`` received (a private copy), so it may recompute
            intermediates itself.
        jvp: optional ``jvp(n, state, params, state_dot, params_dot) -> (next_state,
            next_state_dot)``, used only by :func:`retrograde.host.jvp`.

    Cost: the driver calls ``forward`` for every plain evaluation and ``vjp`` once per step
    (``forward`` is not called before ``vjp`` in the reverse sweep).

    Example:
        >>> import numpy as np
        >>> step = Step(
        ...     forward=lambda n, u, a: u + a * np.sin(u),
        ...     vjp=lambda n, u, a, ub: (ub * (1 + a * np.cos(u)), np.sum(ub * np.sin(u))),
        ... )
    """

    forward: Callable[[int, PyTree, PyTree], PyTree]
    vjp: Callable[[int, PyTree, PyTree, PyTree], tuple[PyTree, PyTree]]
    jvp: Callable[..., tuple[PyTree, PyTree]] | None = None

    def __post_init__(self):
        for name in ("forward", "vjp"):
            if not callable(getattr(self, name)):
                raise TypeError(
                    f"Step({name}=...) must be callable, got {getattr(self, name)!r}; see the "
                    "docstring of retrograde.host.Step for its signature."
                )
        if self.jvp is not None and not callable(self.jvp):
            raise TypeError(f"Step(jvp=...) must be callable or None, got {self.jvp!r}.")


@dataclasses.dataclass(frozen=True)
class Running:
    """A loss summed over the states after every step: ``J += sum_{n=1..N} f(n, u_n, params)``.

    Args:
        f: ``f(n, state, params) -> float``.
        grad: ``grad(n, state, params) -> (state_bar, params_bar)``, the gradient of ``f``.
            Leave it ``None`` when ``f`` is JAX-differentiable (it is then compiled once with
            ``jax.jit(jax.grad(f))``); give it for NumPy code.

    The initial state ``u_0`` is not part of the sum; add a separate term of your own if needed.

    Example:
        >>> import jax.numpy as jnp
        >>> loss = Running(lambda n, u, p: 1e-3 * jnp.sum(u**2))
    """

    f: Callable[[Any, PyTree, PyTree], Any]
    grad: Callable[[Any, PyTree, PyTree], tuple[PyTree, PyTree]] | None = None

    def __post_init__(self):
        _check_loss_fns(type(self).__name__, self.f, self.grad)


@dataclasses.dataclass(frozen=True)
class Final:
    """A loss read on the last state only: ``J += f(N, u_N, params)``.

    Args:
        f: ``f(n, state, params) -> float`` (called with ``n = N``).
        grad: ``grad(n, state, params) -> (state_bar, params_bar)``; ``None`` for JAX code.

    Example:
        >>> import jax.numpy as jnp
        >>> loss = Final(lambda n, u, p: jnp.sum(u**2))
    """

    f: Callable[[Any, PyTree, PyTree], Any]
    grad: Callable[[Any, PyTree, PyTree], tuple[PyTree, PyTree]] | None = None

    def __post_init__(self):
        _check_loss_fns(type(self).__name__, self.f, self.grad)


def _check_loss_fns(kind, f, grad):
    if not callable(f):
        raise TypeError(f"{kind}(f=...) must be callable as f(n, state, params), got {f!r}.")
    if grad is not None and not callable(grad):
        raise TypeError(
            f"{kind}(grad=...) must be callable as grad(n, state, params) -> (state_bar, "
            f"params_bar), or None for a JAX-differentiable f; got {grad!r}."
        )


# ----------------------------------------------------------------------------------------------
# Internal adapters: one interface for both kinds of steps and losses.


class _StepImpl:
    """What the driver calls: ``forward``, ``vjp``, ``jvp`` with the :class:`Step` signatures."""

    is_jax: bool

    def forward(self, n, state, params):
        raise NotImplementedError

    def vjp(self, n, state, params, out_bar):
        raise NotImplementedError

    def jvp(self, n, state, params, state_dot, params_dot):
        raise NotImplementedError


class _HostStep(_StepImpl):
    is_jax = False

    def __init__(self, step: Step):
        self.step = step

    def forward(self, n, state, params):
        return self.step.forward(n, state, params)

    def vjp(self, n, state, params, out_bar):
        res = self.step.vjp(n, state, params, out_bar)
        if not (isinstance(res, tuple) and len(res) == 2):
            raise TypeError(
                f"Step.vjp at step {n} returned {type(res).__name__}; it must return a pair "
                "(state_bar, params_bar)."
            )
        return res

    def jvp(self, n, state, params, state_dot, params_dot):
        if self.step.jvp is None:
            raise ValueError(
                "This Step has no jvp; pass Step(forward, vjp, jvp=...) with "
                "jvp(n, state, params, state_dot, params_dot) -> (next_state, next_state_dot)."
            )
        return self.step.jvp(n, state, params, state_dot, params_dot)


class _JaxStep(_StepImpl):
    """A JAX function ``step(n, state, params)``; forward, VJP and JVP each jitted once."""

    is_jax = True

    def __init__(self, fn: Callable):
        import jax

        self.fn = fn

        def vjp(n, state, params, out_bar):
            _, pullback = jax.vjp(lambda s, p: fn(n, s, p), state, params)
            return pullback(out_bar)

        def jvp(n, state, params, state_dot, params_dot):
            return jax.jvp(lambda s, p: fn(n, s, p), (state, params), (state_dot, params_dot))

        self._forward = jax.jit(fn)
        self._vjp = jax.jit(vjp)
        self._jvp = jax.jit(jvp)

    def forward(self, n, state, params):
        return self._forward(n, state, params)

    def vjp(self, n, state, params, out_bar):
        return self._vjp(n, state, params, out_bar)

    def jvp(self, n, state, params, state_dot, params_dot):
        return self._jvp(n, state, params, state_dot, params_dot)


def as_step(step) -> _StepImpl:
    """Adapt a :class:`Step` or a JAX function ``step(n, state, params)``."""
    if isinstance(step, _StepImpl):
        return step
    if isinstance(step, Step):
        return _HostStep(step)
    if callable(step):
        return _cached(_JAX_STEPS, step, _JaxStep)
    raise TypeError(
        f"step must be a JAX function step(n, state, params) -> state or a "
        f"retrograde.host.Step(forward, vjp); got {step!r}."
    )


class _LossImpl:
    """A loss term: ``value(n, state, params)`` and ``grad(n, state, params)``."""

    def __init__(self, term: Running | Final):
        self.term = term
        self.running = isinstance(term, Running)
        if term.grad is None:
            import jax

            self._value = jax.jit(term.f)
            self._grad = jax.jit(jax.grad(term.f, argnums=(1, 2)))
            self.is_jax = True
        else:
            self._value = term.f
            self._grad = term.grad
            self.is_jax = False

    def value(self, n, state, params) -> float:
        return float(self._value(n, state, params))

    def grad(self, n, state, params):
        res = self._grad(n, state, params)
        if not (isinstance(res, tuple) and len(res) == 2):
            raise TypeError(
                f"The loss gradient at step {n} returned {type(res).__name__}; "
                f"{type(self.term).__name__}(grad=...) must return a pair (state_bar, params_bar)."
            )
        return res


def as_losses(loss) -> tuple[_LossImpl, ...]:
    """Normalise ``loss``: ``None``, one :class:`Running`/:class:`Final`, or a sequence of them."""
    if loss is None:
        return ()
    terms = tuple(loss) if isinstance(loss, (tuple, list)) else (loss,)
    for t in terms:
        if not isinstance(t, (Running, Final)):
            raise TypeError(
                f"loss must be retrograde.host.Running(f), retrograde.host.Final(f), or a tuple of "
                f"them; got {t!r}. Wrap a function of the last state as Final(f) and a per-step "
                "cost as Running(f)."
            )
    return tuple(_cached(_LOSSES, t, _LossImpl) if t.grad is None else _LossImpl(t) for t in terms)


# Adapters are cached per user function, so that repeated calls reuse the compiled programs.
_JAX_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOSSES: dict = {}


def _cached(cache, key, make):
    try:
        return cache[key]
    except KeyError:
        pass
    except TypeError:  # unhashable or not weak-referenceable: no caching
        return make(key)
    value = make(key)
    try:
        if isinstance(cache, dict) and len(cache) > 256:
            cache.clear()
        cache[key] = value
    except TypeError:
        pass
    return value


def dtype_of(x) -> np.dtype:
    """The dtype of an array-like leaf (NumPy, JAX or a Python scalar)."""
    dt = getattr(x, "dtype", None)
    return np.dtype(dt) if dt is not None else np.result_type(x)


def zeros_like_tree(tree):
    """NumPy zeros with the structure, shapes and (floating) dtypes of ``tree``."""
    import jax

    def z(x):
        dt = dtype_of(x)
        if not np.issubdtype(dt, np.inexact):
            dt = np.float64
        return np.zeros(np.shape(x), dtype=dt)

    return jax.tree_util.tree_map(z, tree)
