"""The loops' second cache level: bodies shared between traces of the same structure.

The first level (:class:`._carry.StepCache`) maps the *identity* of the user's step function to
its traced body. A closure created anew on each call (``lambda u, _: (stepper(u), None)``) misses
it every time, is traced again (cheap), and would get a new :class:`~._body.Body`: the primitives
take the body as a parameter compared by identity, so JAX would compile the loop again, and every
cache hanging off a body (its tangent bodies, ...) would start empty. Here a body already built
from a jaxpr of the same *structure* is handed out instead, and the new trace's constants are
passed as its inputs (a body's constants are leading inputs, :func:`~._body.make_body`).

Two closed jaxprs have the same structure (:func:`structure_key`) when they have the same
equations in the same order (primitives, parameters, effects, equation contexts), the same
literals (by value, bit for bit), the same abstract values of every variable (shape, dtype, weak
type, sharding, varying mesh axes), variables renamed by position, and the same constant
*avals*: constant values do not count, they are inputs. Sub-jaxprs in parameters (``pjit``,
``cond``, ``while``, ``scan``, ``custom_jvp_call``, ...) are compared the same way, their own
constants by value.

Correct by construction: a parameter enters the key only as a value compared by value
(:func:`param_value`). A callable parameter (``custom_jvp_call``'s ``jvp_jaxpr_fun``,
``custom_vjp_call``'s ``fwd_jaxpr_thunk`` and ``bwd``, a ``pure_callback``/``io_callback``/
``debug_callback``'s ``callback``), a tracer, or an object whose equality is identity-based
and that holds state makes the jaxpr not internable: the step then gets a body of its own, as
without this level. Nothing is ever compared by ``repr`` or ``str``.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.extend.linear_util as lu
import numpy as np

from .._jax_private import config, core
from ._body import Body


class NotInternable(Exception):
    """A jaxpr holds something not compared by value (a callable, a tracer, an object equal only
    to itself)."""


def structure_key(*closed_jaxprs) -> Hashable | None:
    """The structural key of these closed jaxprs (``None`` entries allowed), constants counted by
    their abstract values only, and of JAX's trace context; ``None`` if one is not internable."""
    try:
        return (
            config.trace_context(),
            tuple(None if c is None else jaxpr_key(c.jaxpr) for c in closed_jaxprs),
        )
    except NotInternable:
        return None


def jaxpr_key(jaxpr) -> tuple:
    """The structure of an open jaxpr: constant and input types, equations and outputs, each
    variable named by the position of its binding. Raises :class:`NotInternable`."""
    names: dict = {}

    def bind(v) -> tuple:
        names[v] = len(names)
        return _var_type(v)

    def atom(a):
        if isinstance(a, core.Literal):
            return ("literal", _aval(a.aval), _array(a.val))
        try:
            return names[a]
        except KeyError:  # a free variable: not a closed program
            raise NotInternable("a free variable") from None

    consts = tuple(bind(v) for v in jaxpr.constvars)
    ins = tuple(bind(v) for v in jaxpr.invars)
    eqns = []
    for eqn in jaxpr.eqns:
        args = tuple(atom(a) for a in eqn.invars)
        params = tuple(sorted((k, param_value(v)) for k, v in eqn.params.items()))
        outs = tuple(
            ("drop", _aval(v.aval)) if isinstance(v, core.DropVar) else bind(v) for v in eqn.outvars
        )
        eqns.append((eqn.primitive, args, params, outs, _effects(eqn.effects), eqn.ctx))
    outs = tuple(atom(a) for a in jaxpr.outvars)
    high = getattr(jaxpr, "is_high", False)
    return (consts, ins, tuple(eqns), outs, _effects(jaxpr.effects), high)


def param_value(x) -> Hashable:
    """An equation parameter as a hashable value, equal exactly when the parameters are: Python
    scalars by type and value (floats bit for bit), containers element by element, jaxprs by
    :func:`jaxpr_key` (a closed jaxpr's constants by value), arrays by dtype, shape and bytes.
    JAX's interned types (abstract values, equation contexts), enum members, classes and bodies
    (immutable programs, held by the key) stand for themselves, as does an object without
    instance state equal only to itself (a sentinel: the key holds it, so its identity is never
    another object's). Another object counts as itself if its class defines equality and
    hashing (meshes, shardings, ...). Raises :class:`NotInternable` for a function (a callable,
    or a ``WrappedFun`` such as ``custom_jvp_call``'s ``jvp_jaxpr_fun``), a tracer, or a
    stateful object equal only to itself."""
    t = type(x)
    if x is None or t in (bool, int, str, bytes):
        return (t, x)
    if t is float:
        return (t, x.hex())
    if t is complex:
        return (t, x.real.hex(), x.imag.hex())
    if isinstance(x, core.Tracer):
        raise NotInternable("a tracer")
    if isinstance(x, core.Jaxpr):
        return ("jaxpr", jaxpr_key(x))
    if isinstance(x, core.ClosedJaxpr):
        return ("closed jaxpr", jaxpr_key(x.jaxpr), tuple(_const(c) for c in x.consts))
    if isinstance(x, (tuple, list)):
        return (t, tuple(param_value(e) for e in x))
    if isinstance(x, (set, frozenset)):
        return (t, frozenset(param_value(e) for e in x))
    if isinstance(x, dict):
        return (t, frozenset((param_value(k), param_value(v)) for k, v in x.items()))
    if isinstance(x, (np.ndarray, np.generic, jax.Array)):
        return _array(x)
    if isinstance(x, (np.dtype, enum.Enum, type, Body)) or t in _INTERNED:
        return x
    if isinstance(x, _SHARDING_TYPES):  # values, though a Mesh is a callable context decorator
        return (t, x)
    if callable(x) or isinstance(x, lu.WrappedFun):
        raise NotInternable(f"a function as a parameter ({t.__name__})")
    if t.__eq__ is object.__eq__:
        if _stateless(x):  # e.g. a sentinel such as jit's UNSPECIFIED sharding
            return ("identity", x)
        raise NotInternable(f"an object equal only to itself ({t.__name__})")
    try:
        hash(x)
    except TypeError:
        raise NotInternable(f"an unhashable parameter ({t.__name__})") from None
    return (t, x)


#: JAX's types whose instances are interned (equal values are the same object): compared as
#: themselves, by identity, which the key's reference keeps meaningful.
_INTERNED = (core.ShapedArray, core.JaxprEqnContext)


#: Meshes, shardings and partition specs: equal by value, hashable.
_SHARDING_TYPES = (
    jax.sharding.Mesh,
    jax.sharding.AbstractMesh,
    jax.sharding.Sharding,
    jax.sharding.PartitionSpec,
)


def _stateless(x) -> bool:
    """Whether ``x`` holds no instance state (nothing about it can change after tracing)."""
    if getattr(x, "__dict__", {}):
        return False
    return all(not getattr(c, "__slots__", ()) for c in type(x).__mro__ if c is not object)


def _aval(a) -> Hashable:
    return a if type(a) is core.ShapedArray else param_value(a)


def _var_type(v) -> tuple:
    qdd = (v.initial_qdd, v.final_qdd)
    return (_aval(v.aval),) if qdd == (None, None) else (_aval(v.aval), param_value(qdd))


def _effects(effects) -> frozenset:
    return frozenset(param_value(e) for e in effects)


def _array(x) -> tuple:
    """A concrete array or scalar by value: dtype, shape and bytes."""
    if isinstance(x, core.Tracer):
        raise NotInternable("a tracer")
    try:
        a = np.asarray(x)
    except (TypeError, ValueError, RuntimeError) as e:  # a key array, one not addressable here
        raise NotInternable(f"an array not readable here ({e})") from None
    return ("array", type(x), a.dtype, a.shape, a.tobytes())


def _const(c) -> tuple:
    return _array(c)


class InternTable:
    """A bounded table of values (bodies) by structural key, least recently used first out.

    Memory: at most ``maxsize`` entries, each holding its key (about the size of the traced
    step's jaxprs) and its value: the loop's bodies (the step's jaxpr, the guarded and fast
    jaxprs of a while loop) and what hangs off them (tangent bodies of each derivative order
    taken), plus, through JAX's own caches keyed on the body, the loop's compiled programs. No
    constant value is held (constants are inputs; a sub-jaxpr's constants are in its key)."""

    def __init__(self, maxsize: int = 256):
        self.maxsize = maxsize
        self._entries: OrderedDict = OrderedDict()
        self.hits = self.misses = self.skipped = 0

    def get(self, key: Hashable | None, build: Callable[[], Any]) -> Any:
        """The value interned under ``key``, or ``build()`` (interned unless ``key`` is None)."""
        if key is None:
            self.skipped += 1
            return build()
        try:
            value = self._entries.get(key)
        except (TypeError, ValueError):  # a parameter whose equality does not give a bool
            self.skipped += 1
            return build()
        if value is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return value
        self.misses += 1
        value = build()
        self._entries[key] = value
        while len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.hits = self.misses = self.skipped = 0


#: The loops' bodies by structure: ``scan``/``fori_loop`` steps and ``while_loop`` step and
#: predicate pairs (``retrograde.diffrax.CheckpointAdjoint`` runs ``while_loop``).
bodies = InternTable()
