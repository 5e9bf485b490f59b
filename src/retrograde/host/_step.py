"""Steps and loss terms for host-driven loops.

A *step* maps ``(n, state, params) -> next_state``; ``state`` and ``params`` are pytrees of
arrays. Two kinds are accepted wherever a step is expected:

* a JAX-differentiable function ``step(n, state, params)``: its plain evaluation, VJP and JVP come
  from JAX, each compiled once with ``jax.jit`` (``n`` arrives as a traced integer scalar, so a new
  step index never triggers a recompilation); for mixed schedules, its data are the residuals of
  ``jax.vjp`` (the leaves of the function it returns);
* a :class:`Step` of hand-written functions, for NumPy or SciPy code.

A *loss term* is :class:`Running` (summed over the states after every step) or :class:`Final`
(read on the last state only).
"""

from __future__ import annotations

import dataclasses
import inspect
import weakref
from collections.abc import Callable, Sequence
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
            ``next_state`` must have the structure, shapes and dtypes of ``state``.
        vjp: ``vjp(n, state, params, next_state_bar) -> (state_bar, params_bar)``: the transposed
            Jacobian of ``forward`` at ``(state, params)`` applied to the cotangent of its output.
            ``state_bar`` has the structure, shapes and dtypes of ``state``, ``params_bar`` those
            of ``params`` (leaves or subtrees that carry no derivative may be ``0.0``, and so may
            all of it). It receives the same ``state`` that ``forward`` received (a private
            copy), so it may recompute intermediates itself.
        jvp: optional ``jvp(n, state, params, state_dot, params_dot) -> (next_state,
            next_state_dot)``, used only by :func:`retrograde.host.jvp`.
        linearize: optional, for mixed schedules (their ``Linearize`` actions): ``linearize(n,
            state, params) -> (next_state, data)``, ``forward`` that also returns ``data``, a
            pytree of arrays holding what the adjoint of step ``n`` needs (its linearisation
            point: intermediates, a factorisation as arrays, ...). The driver stores a copy of
            ``data`` in a slot of the schedule's level (RAM or disk), as it stores states.
        vjp_from: ``vjp_from(n, data, params, next_state_bar) -> (state_bar, params_bar)``: what
            ``vjp`` returns, computed from the ``data`` that ``linearize`` returned for step
            ``n`` (a private copy) instead of from the state. Give both or neither.

    Aliasing: ``state``, ``next_state_bar``, ``state_dot`` and ``data`` are the driver's
    private arrays, never read again after the call: every function may overwrite them (and may
    return them). What they return is handed to later calls in turn, so return fresh arrays or
    the ones you were given, never arrays you keep (the ``data`` ``linearize`` returns is copied
    before the next call, so it may alias ``next_state``). ``params`` (and ``params_dot``) are
    read-only.

    Cost: the driver calls ``forward`` for every plain evaluation, ``linearize`` for every
    ``Linearize`` action, and once per step either ``vjp`` (a recorded step; ``forward`` is not
    called before it in the reverse sweep) or ``vjp_from`` (a step reversed from its data).

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
    linearize: Callable[[int, PyTree, PyTree], tuple[PyTree, PyTree]] | None = None
    vjp_from: Callable[[int, PyTree, PyTree, PyTree], tuple[PyTree, PyTree]] | None = None

    def __post_init__(self):
        for name in ("forward", "vjp"):
            if not callable(getattr(self, name)):
                raise TypeError(
                    f"Step({name}=...) must be callable, got {getattr(self, name)!r}; see the "
                    "docstring of retrograde.host.Step for its signature."
                )
        for name in ("jvp", "linearize", "vjp_from"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(f"Step({name}=...) must be callable or None, got {value!r}.")
        if (self.linearize is None) != (self.vjp_from is None):
            given, missing = (
                ("linearize", "vjp_from") if self.vjp_from is None else ("vjp_from", "linearize")
            )
            raise TypeError(
                f"Step({given}=...) was given without {missing}: a step reversed from stored data "
                "needs both, linearize(n, state, params) -> (next_state, data) and "
                "vjp_from(n, data, params, next_state_bar) -> (state_bar, params_bar)."
            )


@dataclasses.dataclass(frozen=True)
class Running:
    """A loss summed over the states after every step: ``J += sum_{n=1..N} f(n, u_n, params)``.

    Args:
        f: ``f(n, state, params) -> float``.
        grad: ``grad(n, state, params) -> (state_bar, params_bar)``, the gradient of ``f`` (shaped
            like ``state`` and ``params``; zero leaves or subtrees may be ``0.0``). Leave it
            ``None`` when ``f`` is JAX-differentiable (it is then compiled once with
            ``jax.jit(jax.grad(f))``); give it for NumPy code.

    Both receive read-only views of the state and may return its arrays: the driver only reads
    what a loss returns.

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


#: What a ``step`` argument accepts: a JAX function ``step(n, state, params) -> state`` or a
#: :class:`Step`.
StepLike = Step | Callable[[Any, PyTree, PyTree], PyTree]
#: What a ``loss`` argument accepts: ``None``, one :class:`Running` or :class:`Final` term, or a
#: sequence of them.
LossLike = Running | Final | Sequence[Running | Final] | None


# ----------------------------------------------------------------------------------------------
# Internal adapters: one interface for both kinds of steps and losses.


class StepImpl:
    """What the driver calls: ``forward``, ``vjp``, ``jvp`` with the :class:`Step` signatures;
    ``where(callback, n)`` names a callback in error messages."""

    is_jax: bool

    def forward(self, n, state, params):
        raise NotImplementedError

    def vjp(self, n, state, params, out_bar):
        raise NotImplementedError

    def jvp(self, n, state, params, state_dot, params_dot):
        raise NotImplementedError

    def linearize(self, n, state, params):
        """``(next_state, data)``: step ``n`` keeping what its adjoint needs (a pytree)."""
        raise NotImplementedError

    def vjp_from(self, n, data, params, out_bar):
        """``(state_bar, params_bar)`` of step ``n`` from the ``data`` of :meth:`linearize`."""
        raise NotImplementedError

    def where(self, callback: str, n: int) -> str:
        raise NotImplementedError


class _HostStep(StepImpl):
    is_jax = False

    def __init__(self, step: Step):
        self.step = step

    def where(self, callback, n):
        return f"Step.{callback} at step {n}"

    def forward(self, n, state, params):
        return self.step.forward(n, state, params)

    def vjp(self, n, state, params, out_bar):
        return _pair(
            self.step.vjp(n, state, params, out_bar),
            self.where("vjp", n),
            "(state_bar, params_bar)",
        )

    def jvp(self, n, state, params, state_dot, params_dot):
        if self.step.jvp is None:
            raise ValueError(
                "This Step has no jvp; pass Step(forward, vjp, jvp=...) with "
                "jvp(n, state, params, state_dot, params_dot) -> (next_state, next_state_dot)."
            )
        return _pair(
            self.step.jvp(n, state, params, state_dot, params_dot),
            self.where("jvp", n),
            "(next_state, next_state_dot)",
        )

    def linearize(self, n, state, params):
        if self.step.linearize is None:
            raise ValueError(
                f"The schedule reverses step {n} from stored data (a Linearize action: mixed "
                "checkpointing), but this Step has no linearize; pass Step(forward, vjp, "
                "linearize=..., vjp_from=...) with linearize(n, state, params) -> (next_state, "
                "data) and vjp_from(n, data, params, next_state_bar) -> (state_bar, params_bar), "
                "or use a schedule without Linearize actions such as Revolve(s)."
            )
        return _pair(
            self.step.linearize(n, state, params),
            self.where("linearize", n),
            "(next_state, data)",
        )

    def vjp_from(self, n, data, params, out_bar):
        assert self.step.vjp_from is not None  # linearize made the data: both were given
        return _pair(
            self.step.vjp_from(n, data, params, out_bar),
            self.where("vjp_from", n),
            "(state_bar, params_bar)",
        )


def _pair(res, where, what):
    if not (isinstance(res, tuple) and len(res) == 2):
        got = "None (a missing `return`?)" if res is None else type(res).__name__
        raise TypeError(f"{where} returned {got}; it must return a pair {what}.")
    return res


class JaxCore:
    """The compiled forward, VJP and JVP of a JAX step function ``fn`` (each jitted once), and
    for mixed schedules ``linearize`` (the step and the function ``jax.vjp`` returns, a pytree
    whose leaves are the residuals the step's adjoint reads) and ``vjp_from`` (that function
    applied to a cotangent)."""

    def __init__(self, fn: Callable):
        import jax

        def vjp(n, state, params, out_bar):
            _, pullback = jax.vjp(lambda s, p: fn(n, s, p), state, params)
            return pullback(out_bar)

        def jvp(n, state, params, state_dot, params_dot):
            return jax.jvp(lambda s, p: fn(n, s, p), (state, params), (state_dot, params_dot))

        def linearize(n, state, params):
            return jax.vjp(lambda s, p: fn(n, s, p), state, params)

        self.forward = jax.jit(fn)
        self.vjp = jax.jit(vjp)
        self.jvp = jax.jit(jvp)
        self.linearize = jax.jit(linearize)
        self.vjp_from = jax.jit(lambda pullback, out_bar: pullback(out_bar))


class JaxStep(StepImpl):
    """A JAX function ``step(n, state, params)``. Holds ``fn`` (the cached compiled core only
    refers to it weakly, so that it, what it captures and its compiled code die together)."""

    is_jax = True

    def __init__(self, fn: Callable, core: JaxCore):
        self.fn = fn
        self.core = core
        self.name = getattr(fn, "__qualname__", None) or type(fn).__name__

    def where(self, callback, n):
        return f"the JAX step {self.name} ({callback}) at step {n}"

    def forward(self, n, state, params):
        return self.core.forward(n, state, params)

    def vjp(self, n, state, params, out_bar):
        return self.core.vjp(n, state, params, out_bar)

    def jvp(self, n, state, params, state_dot, params_dot):
        return self.core.jvp(n, state, params, state_dot, params_dot)

    def linearize(self, n, state, params):
        return self.core.linearize(n, state, params)

    def vjp_from(self, n, data, params, out_bar):
        return self.core.vjp_from(data, out_bar)


def as_step(step: StepLike | StepImpl) -> StepImpl:
    """Adapt a :class:`Step` or a JAX function ``step(n, state, params)``."""
    if isinstance(step, StepImpl):
        return step
    if isinstance(step, Step):
        return _HostStep(step)
    if callable(step):
        return JaxStep(step, _JAX_STEPS.get(step, JaxCore))
    raise TypeError(
        f"step must be a JAX function step(n, state, params) -> state or a "
        f"retrograde.host.Step(forward, vjp); got {step!r}."
    )


class LossImpl:
    """A loss term: ``value(n, state, params)`` and ``grad(n, state, params)``; holds the term
    (its compiled JAX functions, cached per ``f``, refer to ``f`` weakly)."""

    def __init__(self, term: Running | Final, jax_fns=None):
        self.term = term
        self.running = isinstance(term, Running)
        self.label = type(term).__name__
        if jax_fns is not None or term.grad is None:
            self._value, self._grad = jax_fns or _LOSSES.get(term.f, _jax_loss)
            self.is_jax = True
        else:
            self._value = term.f
            self._grad = term.grad
            self.is_jax = False

    def where(self, callback, n):
        return f"{self.label}.{callback} at step {n}"

    def value(self, n, state, params):
        v = self._value(n, state, params)
        try:
            if np.ndim(v) == 0:
                return float(v)
        except (TypeError, ValueError):
            pass
        shape = getattr(v, "shape", None)
        raise TypeError(
            f"{self.where('f', n)} returned {type(v).__name__}"
            + ("" if shape is None else f" of shape {tuple(shape)}")
            + "; a loss must return a real scalar (a float or a 0-d array)."
        )

    def grad(self, n, state, params):
        return _pair(self._grad(n, state, params), self.where("grad", n), "(state_bar, params_bar)")


def _jax_loss(f):
    import jax

    return jax.jit(f), jax.jit(jax.grad(f, argnums=(1, 2)))


def as_losses(loss: LossLike) -> tuple[LossImpl, ...]:
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
    return tuple(LossImpl(t) for t in terms)


class WeakCache:
    """Compiled adapters cached per user function, for as long as that function lives.

    ``get(fn, make)`` returns ``make(call)``, made once per ``fn``, where ``call`` calls ``fn``
    through a weak reference: the cache never keeps ``fn``, the arrays it captures or its
    compiled code alive (a value that referred to its own key would). Whoever uses the result
    holds ``fn`` itself. Functions are told apart by identity (so unhashable callables are
    cached too); bound methods per (function, instance). Functions that cannot be weakly
    referenced are not cached (``make(fn)`` each time).

    Example: ``core = cache.get(step_fn, JaxCore)``.
    """

    def __init__(self):
        self._entries: dict[tuple[int, ...], tuple[Any, list]] = {}

    def get(self, fn, make):
        parts = (fn.__func__, fn.__self__) if inspect.ismethod(fn) else (fn,)
        key = tuple(id(p) for p in parts)
        hit = self._entries.get(key)
        if hit is not None:
            return hit[0]
        try:
            ref = weakref.WeakMethod(fn) if inspect.ismethod(fn) else weakref.ref(fn)

            # dropped as soon as any part dies (before its id can be reused)
            def forget(_ref: object, key: tuple = key) -> None:
                self._entries.pop(key, None)

            refs = [weakref.ref(p, forget) for p in parts]
        except TypeError:  # not weakly referenceable
            return make(fn)
        value = make(_weak_caller(ref, fn))
        self._entries[key] = (value, refs)
        return value

    def __len__(self):
        return len(self._entries)


def _weak_caller(ref, fn):
    name = getattr(fn, "__qualname__", None) or type(fn).__name__

    def call(*args):
        f = ref()
        if f is None:  # pragma: no cover - the driver holds fn while it runs
            raise RuntimeError(f"{name} was garbage collected while its compiled code was in use.")
        return f(*args)

    call.__name__ = getattr(fn, "__name__", name)
    call.__qualname__ = name
    return call


_JAX_STEPS = WeakCache()
_LOSSES = WeakCache()
