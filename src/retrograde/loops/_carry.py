"""Checks shared by the loops: array leaves in, a carry of unchanged type out."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util


def leaf_array(leaf, where: str, what: str):
    """``leaf`` as a JAX array, or a ``TypeError`` naming ``what`` (e.g. "init")."""
    if isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, complex, bool)) or hasattr(
        leaf, "__jax_array__"
    ):
        return jnp.asarray(leaf)
    raise TypeError(
        f"{where}: every leaf of {what} must be an array or a scalar, got "
        f"{type(leaf).__name__} ({leaf!r}). Put non-array data in a closure instead."
    )


def match_carry(where: str, fun: str, new, tree, sds) -> list:
    """Flatten the carry a step returned and check it against the initial one.

    Same structure, shapes and dtypes are required. A result that the carry's dtype can hold
    (float32 into float64), or a weakly typed one of the same kind (a Python scalar promoted by
    JAX), is cast back to the carry's dtype; an int carry that became float raises, as in
    ``jax.lax.scan``.
    """
    new_flat, new_tree = tree_util.tree_flatten(new)
    if new_tree != tree:
        raise TypeError(
            f"{where}: {fun} must return a carry with the same structure as the initial one; got "
            f"{new_tree} for {tree}."
        )
    out = []
    for old, v in zip(sds, new_flat):
        v = jnp.asarray(v)
        if v.shape != old.shape:
            raise TypeError(
                f"{where}: {fun} changed a carry leaf's shape from {old.shape} to {v.shape}."
            )
        if v.dtype != old.dtype:
            same_kind = all(
                jnp.issubdtype(v.dtype, k) == jnp.issubdtype(old.dtype, k)
                for k in (jnp.inexact, jnp.integer, jnp.bool_)
            )
            weak = getattr(v, "weak_type", False)
            if jnp.result_type(v.dtype, old.dtype) != old.dtype and not (weak and same_kind):
                raise TypeError(
                    f"{where}: {fun} changed a carry leaf's dtype from {old.dtype} to {v.dtype}; "
                    "cast it in the step or change the initial dtype."
                )
            v = v.astype(old.dtype)
        out.append(v)
    return out
