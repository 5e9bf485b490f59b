"""Pytree bookkeeping for host-driven loops: what user code must return, and who owns which array.

:class:`TreeSpec` records the structure, shapes and dtypes of the state (or of the parameters) and
checks everything a callback returns against it, naming the callback, the step and the leaf.

Ownership rules (the aliasing contract of :mod:`retrograde.host`):

* arrays handed to a step's ``forward``/``vjp``/``jvp`` as state, cotangent or tangent belong to the
  driver, which never reads them again: the callback may overwrite them;
* arrays a step returns become the driver's (they are handed to later step calls in turn);
* parameters and every array handed to a loss or to ``until`` are read-only views;
* arrays a loss returns are only read: the driver copies or adds them into arrays it allocated
  itself, and it writes in place only into those (:func:`accumulate`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

tree_util = jax.tree_util

_SCALARS = (bool, int, float, complex)


#: The type a Python scalar stands for before canonicalization (bool before int: a subclass).
_SCALAR_TYPES = ((bool, np.bool_), (int, np.int64), (float, np.float64), (complex, np.complex128))


def dtype_of(x, jax_step: bool = False) -> np.dtype:
    """The dtype a step computes an array-like leaf (NumPy, JAX or a Python scalar) in.

    For NumPy code (``jax_step=False``) the leaf's own dtype, NumPy's for a Python scalar
    (``float`` -> float64). For a JAX step the dtype JAX gives it: canonicalized (float64 ->
    float32 unless ``jax_enable_x64``), and for a Python scalar, which JAX types weakly, JAX's
    default type of its kind (``float`` -> float32, or float64 under x64; ``int`` -> int32/int64;
    ``complex`` -> complex64/complex128). This is the one place where a leaf's expected dtype
    (and so its cotangent's) is decided.

    Example: ``dtype_of(1.0)`` is float64; ``dtype_of(1.0, jax_step=True)`` is float32 unless
    ``jax_enable_x64``.
    """
    dt = getattr(x, "dtype", None)
    if not jax_step:
        return np.dtype(dt) if dt is not None else np.result_type(x)
    if dt is None:
        dt = next((d for t, d in _SCALAR_TYPES if isinstance(x, t)), None)
        if dt is None:
            dt = np.result_type(x)
    return np.dtype(jax.dtypes.canonicalize_dtype(dt))


def is_plain_zero(x) -> bool:
    """A Python ``0`` or ``0.0`` standing for a zero cotangent."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 0


def is_array_leaf(x) -> bool:
    """An array (NumPy or JAX) or a scalar: what a state, a cotangent or a step's data holds."""
    return isinstance(x, (np.ndarray, np.generic, jax.Array, *_SCALARS))


def readonly(tree):
    """``tree`` with every NumPy array replaced by a read-only view (no copy)."""

    def view(x):
        if isinstance(x, np.ndarray) and x.flags.writeable:
            x = x.view()
            x.flags.writeable = False
        return x

    return tree_util.tree_map(view, tree)


def private(tree, *, copy: bool):
    """Read-only NumPy leaves, copied first when ``copy`` (the caller may change its arrays
    later); other leaves (scalars, JAX arrays, opaque objects) are passed as they are."""

    def leaf(x):
        if isinstance(x, np.ndarray):
            x = np.array(x, copy=True) if copy else x.view()
            x.flags.writeable = False
        return x

    return tree_util.tree_map(leaf, tree)


def fresh(x):
    """A copy the driver owns (JAX arrays are immutable: kept as they are)."""
    if isinstance(x, jax.Array):
        return x
    return np.array(x, copy=True)


def accumulate(acc, x, c: float = 1.0, *, take: bool = False):
    """``acc + c * x``; ``None`` stands for zero.

    ``acc`` must be ``None`` or an array the driver owns (one this function returned): a
    writeable NumPy ``acc`` is updated in place. The result never aliases ``x`` unless ``take``
    says that ``x`` is the driver's own too (it may then be scaled in place and returned).
    """
    if x is None:
        return acc
    if acc is None:
        if take:
            return _scale_own(x, c)
        return fresh(x) if c == 1.0 else x * c
    if isinstance(acc, np.ndarray) and acc.flags.writeable:
        if c == 1.0:
            np.add(acc, x, out=acc)
        else:
            acc += np.multiply(x, c)
        return acc
    return acc + (x if c == 1.0 else x * c)


def _scale_own(x, c):
    if c == 1.0:
        return x
    if isinstance(x, np.ndarray) and x.flags.writeable:
        x *= c
        return x
    return x * c


class TreeSpec:
    """Structure, shapes and dtypes of a pytree (``kind``: "state" or "params") as the step
    computes it: ``jax_step`` says whether that is a JAX step (see :func:`dtype_of`: a Python
    float leaf is then float32 unless ``jax_enable_x64``, not NumPy's float64).

    A leaf that is not an array or a scalar (an opaque object in the parameters) is not checked;
    its cotangent may be anything and defaults to ``0.0``. The cotangent of a floating or complex
    leaf has the leaf's dtype; that of an integer or bool leaf is float64 (for a JAX step: the
    canonical float, float32 unless ``jax_enable_x64``).

    Example: ``TreeSpec({"u": np.zeros(3)}, "state").name(0)`` is ``"state['u']"``.
    """

    def __init__(self, tree, kind: str, jax_step: bool = False):
        flat, self.treedef = tree_util.tree_flatten_with_path(tree)
        self.kind = kind
        self.paths = [tree_util.keystr(p) for p, _ in flat]
        self.shapes: list[tuple | None] = []
        self.dtypes: list[np.dtype | None] = []
        for _, x in flat:
            if is_array_leaf(x):
                self.shapes.append(tuple(np.shape(x)))
                self.dtypes.append(dtype_of(x, jax_step))
            else:
                self.shapes.append(None)
                self.dtypes.append(None)
        real = dtype_of(0.0, jax_step)  # the cotangent dtype of integer and bool leaves
        self.cot_dtypes = [
            None if d is None else (d if np.issubdtype(d, np.inexact) else real)
            for d in self.dtypes
        ]
        self._index = tree_util.tree_unflatten(self.treedef, range(len(flat)))

    def __len__(self):
        return len(self.shapes)

    def name(self, i: int) -> str:
        return f"{self.kind}{self.paths[i]}"

    # ------------------------------------------------------------------ checks
    def check_primal(self, tree, where: str):
        """``tree`` (a new state), which must match this spec exactly; Python scalar leaves
        become 0-d arrays of the leaf's dtype."""
        if tree is None and self.treedef.num_leaves:  # type: ignore[attr-defined]  # jaxlib: PyTreeDef untyped
            raise TypeError(
                f"{where} returned None instead of the new {self.kind} (a missing `return`?)."
            )
        leaves, treedef = tree_util.tree_flatten(tree)
        if treedef != self.treedef:  # type: ignore[operator]  # jaxlib: PyTreeDef untyped
            raise TypeError(
                f"{where} returned a {self.kind} with the structure {treedef}; the {self.kind} "
                f"has the structure {self.treedef} (that of state0)."
            )
        checked = [
            self._leaf(x, i, where, self.kind, self.dtypes[i], convert=True)
            for i, x in enumerate(leaves)
        ]
        if any(x is not y for x, y in zip(checked, leaves)):
            return self.unflatten(checked)
        return tree

    def check_cotangent(self, tree, where: str, what: str, verb: str = "returned") -> list:
        """The leaves of ``tree`` (a cotangent or tangent of this pytree), ``None`` for zero.

        A leaf or a whole subtree may be a plain ``0``/``0.0`` (zero); JAX ``float0`` leaves are
        zero too. Shapes must match; dtypes must be those of the leaves (floating point; float64
        for integer leaves), Python scalars only need to fit.
        """
        out: list[Any] = [None] * len(self)
        errors: list[Exception] = []

        def visit(x, sub):
            if is_plain_zero(x) or getattr(x, "dtype", None) == jax.dtypes.float0:
                return
            if not isinstance(sub, int):
                raise _Mismatch
            try:
                out[sub] = self._leaf(x, sub, where, what, self.cot_dtypes[sub], verb=verb)
            except (TypeError, ValueError) as err:
                errors.append(err)

        try:
            tree_util.tree_map(visit, tree, self._index)
        except (_Mismatch, ValueError, TypeError):
            raise TypeError(
                f"{where} {verb} {what} with the structure {tree_util.tree_structure(tree)}; "
                f"it must have the structure of the {self.kind}, {self.treedef} (a leaf or a "
                "subtree that carries no derivative may be a plain 0.0)."
            ) from None
        if errors:
            raise errors[0]
        return out

    def _leaf(self, x, i, where, what, dtype, convert=False, verb="returned"):
        shape = self.shapes[i]
        if shape is None:  # an opaque leaf: not checked
            return x
        name = self.name(i)
        label = f"{what} leaf {self.paths[i]}" if self.paths[i] else what
        if not is_array_leaf(x):
            raise TypeError(
                f"{where} {verb} {label} of type {type(x).__name__}; expected an array of shape "
                f"{shape} and dtype {dtype} (like {name})."
            )
        if isinstance(x, _SCALARS):  # a Python scalar: only its kind matters
            if shape != ():
                raise ValueError(
                    f"{where} {verb} {label} as the scalar {x!r}; {name} has shape {shape}."
                )
            if np.result_type(x, dtype) != dtype:
                raise TypeError(
                    f"{where} {verb} {label} as the {type(x).__name__} {x!r}, which does not fit "
                    f"the dtype {dtype} of {name}."
                )
            return np.array(x, dtype=dtype) if convert else x
        if tuple(x.shape) != shape:
            raise ValueError(
                f"{where} {verb} {label} of shape {tuple(x.shape)}; {name} has shape {shape}."
            )
        if np.dtype(x.dtype) != dtype:
            raise TypeError(
                f"{where} {verb} {label} with dtype {np.dtype(x.dtype)}; it must be {dtype} "
                f"(that of {name}): cast it, e.g. with .astype(np.{dtype})."
            )
        return x

    # ------------------------------------------------------------------ building
    def unflatten(self, leaves):
        return tree_util.tree_unflatten(self.treedef, leaves)

    def zeros(self, i: int):
        if self.shapes[i] is None:
            return 0.0
        return np.zeros(self.shapes[i], dtype=self.cot_dtypes[i])

    def materialize(self, leaves) -> Any:
        """The pytree of ``leaves`` (from :meth:`check_cotangent`), zeros where ``None``."""
        return self.unflatten([self.zeros(i) if x is None else x for i, x in enumerate(leaves)])


class _Mismatch(Exception):
    pass
