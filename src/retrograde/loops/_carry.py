"""The loops' front end: array leaves in, the step traced with ``jax.lax``'s carry typing rules
(weakly typed initial leaves promoted, errors naming the leaf by its path), and traced steps cached
per function so that repeated eager calls neither retrace nor recompile.
"""

from __future__ import annotations

import inspect
import operator
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, tree_util

from .._jax_private import config, convert_element_type, core


def leaf_array(leaf, where: str, what: str):
    """``leaf`` as a JAX array, or a ``TypeError`` naming ``what`` (e.g. "init"). Python scalars
    become weakly typed arrays, as in ``jax.lax``."""
    if isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, complex, bool)) or hasattr(
        leaf, "__jax_array__"
    ):
        return jnp.asarray(leaf)
    raise TypeError(
        f"{where}: every leaf of {what} must be an array or a scalar, got "
        f"{type(leaf).__name__} ({leaf!r}). Put non-array data in a closure instead."
    )


def aval_of(value) -> core.ShapedArray:
    """The abstract value of an array or tracer: shape, dtype, weak type and, inside
    ``shard_map``, the mesh axes it varies over (``vma``), with which the step is traced."""
    return core.typeof(value)


def check_static_int(value, where: str, what: str, hint: str = "") -> None:
    """Raise ``ConcretizationTypeError`` (as ``jax.lax`` does) if ``value`` is traced."""
    if isinstance(value, core.Tracer):
        raise core.ConcretizationTypeError(
            value, f"{where}: {what} must be a concrete (static) value, not a traced one.{hint}"
        )


def check_unroll(unroll, length: int, where: str) -> int:
    """Validate ``unroll`` as ``jax.lax.scan`` does and return it as an int (``True``: the whole
    loop, ``False``: 1). A traced value raises ``ConcretizationTypeError``, a negative one
    ``ValueError``, anything but a bool or an int ``TypeError``."""
    check_static_int(unroll, where, "unroll", " Pass a Python int or bool.")
    if isinstance(unroll, (bool, np.bool_)):
        return max(length, 1) if unroll else 1
    try:
        unroll = operator.index(unroll)
    except TypeError:
        raise TypeError(
            f"{where}: unroll must be a bool or a non-negative int, got {unroll!r}."
        ) from None
    if unroll < 0:
        raise ValueError(f"{where}: unroll must be a bool or a non-negative int, got {unroll}.")
    return unroll


# ----------------------------------------------------------------------------- carry types


class Names(NamedTuple):
    """How errors name things: the loop (``where``), the step function (``fun``), the initial
    carry argument (``init``), and ``label(path)``, the carry leaf at a key path of the loop's
    flattened carry as the user knows it (e.g. ``"c['u']"``)."""

    where: str
    fun: str
    init: str
    label: Callable[[tuple], str]


def carry_label(fun: Callable, position: int, default: str, skip: int = 0) -> Callable:
    """``label`` for :class:`Names`: ``fun``'s carry parameter name (the ``position``-th
    parameter, or ``default``) followed by the path, less its first ``skip`` keys (the loop's own
    leaves that wrap the user's carry)."""
    return lambda path: carry_name(fun, position, default) + tree_util.keystr(tuple(path[skip:]))


def carry_name(fun: Callable, position: int, default: str) -> str:
    """The name ``fun`` gives its carry parameter (for error messages), or ``default``."""
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        return default
    if len(params) > position and params[position].kind in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        return params[position].name
    return default


def leaf_paths(tree) -> list[tuple]:
    """The key path of each leaf of the tree structure ``tree``."""
    dummy = tree_util.tree_unflatten(tree, range(tree.num_leaves))
    return [p for p, _ in tree_util.tree_flatten_with_path(dummy)[0]]


def _describe(node) -> str:
    """One pytree node, for a structure error: its type and its keys or number of children."""
    children, _ = tree_util.tree_flatten_with_path(node, is_leaf=lambda y: y is not node)
    if node is None:
        return "None"
    if tree_util.treedef_is_leaf(tree_util.tree_structure(node)):
        return (
            "an array"
            if isinstance(node, (jax.Array, core.Tracer))
            else (f"a leaf ({type(node).__name__})")
        )
    keys = [tree_util.keystr(p) for p, _ in children]
    return f"a {type(node).__name__} with children {', '.join(keys) or '(none)'}"


def structure_diffs(a, b, path: tuple = ()) -> list[tuple[tuple, str, str]]:
    """Where the pytrees ``a`` and ``b`` differ in structure: ``(path, a's node, b's node)``."""
    if tree_util.tree_structure(a) == tree_util.tree_structure(b):  # type: ignore[operator]  # jaxlib: PyTreeDef untyped
        return []
    one_level = lambda t: tree_util.tree_flatten_with_path(t, is_leaf=lambda y: y is not t)
    (ka, ta), (kb, tb) = one_level(a), one_level(b)
    leaf = lambda t: t is not None and tree_util.treedef_is_leaf(tree_util.tree_structure(t))
    if ta != tb or leaf(a) or leaf(b):  # type: ignore[operator]  # jaxlib: PyTreeDef untyped
        return [(path, _describe(a), _describe(b))]
    out = []
    for (pa, ca), (_, cb) in zip(ka, kb):
        out += structure_diffs(ca, cb, path + tuple(pa))
    return out


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else "".join(f"\n  * {s}" for s in items)


def check_structure(names: Names, carry_in, carry_out) -> None:
    """``TypeError`` naming each path where the carry the step returned differs in structure
    from its input carry. Trees that differ only in auxiliary data pass, as in ``jax.lax``."""
    diffs = structure_diffs(carry_in, carry_out)
    if diffs:
        items = [
            f"{names.label(p)} is {a} in the input carry but {b} in the output" for p, a, b in diffs
        ]
        raise TypeError(
            f"{names.where}: {names.fun} must return a carry with the same pytree structure as "
            f"its input carry: {_join(items)}. Return the carry in the structure it came in."
        )


def _type_str(aval) -> str:
    varying = sorted(map(str, aval.mat.varying))
    return (
        f"{aval.dtype.name}{list(aval.shape)}"
        + (" (weakly typed)" if aval.weak_type else "")
        + (f" varying over mesh axes {tuple(varying)}" if varying else "")
    )


def check_types(names: Names, paths, avals_in, avals_out) -> None:
    """``TypeError`` naming each carry leaf (by its path) whose shape, dtype or, inside
    ``jax.shard_map``, varying mesh axes the step changed. Weak types are ignored, as in
    ``jax.lax`` (they are promoted before, see :func:`trace_carry`)."""
    items, fixes = [], []
    for path, a, b in zip(paths, avals_in, avals_out):
        if not core.typematch(a, b):
            what = [
                w
                for w, bad in (
                    ("dtypes", a.dtype != b.dtype),
                    ("shapes", a.shape != b.shape),
                    ("varying mesh axes", a.mat.varying != b.mat.varying),
                )
                if bad
            ]
            items.append(
                f"{names.label(path)} goes in as {_type_str(a)} and comes "
                f"out as {_type_str(b)} (the {' and '.join(what) or 'types'} differ)"
            )
            new = tuple(sorted(map(str, b.mat.varying - a.mat.varying)))
            if new:
                fixes.append(
                    f"jax.lax.pcast(..., {new}, to='varying') to the initial value of "
                    f"{names.label(path)}"
                )
    if items:
        fix = (
            f"Apply {' and '.join(fixes)}, as for jax.lax.scan inside jax.shard_map"
            if fixes
            else "Fix the step's output (e.g. cast it with .astype) or the initial value"
        )
        raise TypeError(
            f"{names.where}: {names.fun} must return each carry leaf with the type (shape, dtype "
            f"and varying mesh axes) it came in with: {_join(items)}. {fix}."
        )


def trace_carry(trace: Callable, init: Sequence, check: Callable) -> tuple[Any, list]:
    """Trace a loop step with ``jax.lax``'s carry typing.

    ``trace(avals)`` traces the step for carry leaves of these abstract values and returns
    ``(traced, out_avals)``, the step's output carry avals among them. A weakly typed initial
    leaf (a Python scalar) whose type the step changes is promoted to the type the step makes of
    it (``0`` with ``int8`` inputs becomes ``int8``, an int ``0`` plus floats becomes a float),
    and the step traced again; then ``check(avals, out_avals)`` raises on any remaining mismatch.

    Returns ``(traced, dtypes)``: ``dtypes[i]`` is the dtype initial leaf ``i`` must be converted
    to, or None.
    """
    avals = [aval_of(v) for v in init]
    traced, out = trace(avals)
    dtypes = [
        jnp.result_type(v, b) if a.weak_type and not core.typematch(a, b) else None
        for v, a, b in zip(init, avals, out)
    ]
    if any(d is not None for d in dtypes):
        avals = [
            a if d is None else a.update(dtype=d, weak_type=False) for a, d in zip(avals, dtypes)
        ]
        traced, out = trace(avals)
    check(avals, out)
    return traced, dtypes


def convert(values: Sequence, dtypes: Sequence) -> list:
    """``values`` converted where ``dtypes`` (from :func:`trace_carry`) names a dtype."""
    return [v if d is None else lax.convert_element_type(v, d) for v, d in zip(values, dtypes)]


def with_weak_types(values: Sequence, avals: Sequence) -> list:
    """``values`` with the weak types of ``avals`` (a loop's results are typed as its step's
    outputs, as in ``jax.lax``); the dtypes already agree."""
    return [
        v
        if core.typeof(v).weak_type == a.weak_type
        else convert_element_type(v, a.dtype, weak_type=a.weak_type)
        for v, a in zip(values, avals)
    ]


def check_pair(out, names: Names) -> None:
    """A scan step returns ``(carry, y)``: a tuple or list of two, as ``jax.lax.scan`` accepts."""
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        got = (
            f"a {type(out).__name__} of {len(out)}"
            if isinstance(out, (tuple, list))
            else (f"{type(out).__name__}")
        )
        raise TypeError(f"{names.where}: {names.fun} must return a pair (carry, y), got {got}.")


# ----------------------------------------------------------------------------- cache


class StepCache:
    """Traced loop steps, so that calling a loop again with the same step function and argument
    types neither retraces the step nor recompiles the loop (its primitives take the traced body
    as a parameter, compared by identity).

    Keyed on the identity of the user's functions, held weakly (an entry goes when one of them is
    freed; a bound method counts as its function and instance), on everything else the trace
    depends on (``key``: trees, abstract values, options), and on JAX's trace context (x64,
    promotion modes, ...). As in ``jax.lax``, a function is assumed to compute the same thing
    each time it is called with the same types, closed-over arrays included. Entries whose
    constants are tracers are not kept (they belong to one transformation's trace). On a miss
    the step is traced and its body looked up by structure (the second level,
    :mod:`._intern`), so a closure created anew per call is traced but not compiled again.
    """

    def __init__(self, maxsize: int = 512):
        self.maxsize = maxsize
        self._entries: OrderedDict = OrderedDict()
        self.hits = self.misses = 0

    @staticmethod
    def _targets(funs) -> list:
        out = []
        for f in funs:
            if inspect.ismethod(f):
                out += [f.__func__, f.__self__]
            elif f is not None:
                out.append(f)
        return out

    def get(self, funs: Sequence, key, build: Callable[[], Any], consts: Callable[[Any], list]):
        """The cached ``build()`` for these functions and ``key``. ``consts(value)`` lists the
        arrays the value holds (a value holding a tracer is not kept)."""
        targets = self._targets(funs)
        full = (tuple(map(id, targets)), config.trace_context(), key)
        try:
            hash(full)

            def forget(_ref: object, k: tuple = full) -> None:
                self._entries.pop(k, None)

            refs = [weakref.ref(t, forget) for t in targets]
        except TypeError:  # not weakly referenceable or unhashable: no caching
            return build()
        entry = self._entries.get(full)
        if entry is not None and all(r() is t for r, t in zip(entry[0], targets)):
            self._entries.move_to_end(full)
            self.hits += 1
            return entry[1]
        self.misses += 1
        value = build()
        if not any(isinstance(c, core.Tracer) for c in consts(value)):
            self._entries[full] = (refs, value)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        self._entries.clear()


step_cache = StepCache()


def cached_wrapper(fun: Callable, make: Callable[[Callable[[], Callable]], Callable], tag: str):
    """A wrapper ``make(get_fun)`` around ``fun`` (e.g. ``fori_loop``'s scan step), the same
    object for the same ``fun`` so that :data:`step_cache` recognises it. The wrapper holds
    ``fun`` weakly (through ``get_fun``), so the cache does not keep it alive."""
    try:
        ref = weakref.WeakMethod(fun) if inspect.ismethod(fun) else weakref.ref(fun)
    except TypeError:
        return make(lambda: fun)

    def build():
        return make(ref)

    return step_cache.get([fun], ("wrapper", tag), build, lambda _: [])
