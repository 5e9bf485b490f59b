"""The test suite's one comparison of results: the relative error of pytrees, leaf by leaf."""

from __future__ import annotations

import jax
import numpy as np


def rel_err(a, b) -> float:
    """Largest over leaves of ``max|a - b| / max(max|b|, 1e-300)``; structures must match."""
    ta, tb = jax.tree_util.tree_structure(a), jax.tree_util.tree_structure(b)
    assert ta == tb, f"structures differ: {ta} vs {tb}"
    worst = 0.0
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape, (x.shape, y.shape)
        if x.dtype == jax.dtypes.float0 or y.dtype == jax.dtypes.float0:
            assert x.dtype == y.dtype
            continue
        if not np.issubdtype(y.dtype, np.inexact):
            np.testing.assert_array_equal(x, y)
            continue
        assert x.dtype == y.dtype, (x.dtype, y.dtype)
        if y.size == 0:
            continue
        scale = max(float(np.max(np.abs(y))), 1e-300)
        worst = max(worst, float(np.max(np.abs(x - y))) / scale)
    return worst


def assert_close(a, b, rtol: float, what: str = "") -> float:
    """Assert ``rel_err(a, b) <= rtol`` (``what`` names the comparison); returns the error."""
    err = rel_err(a, b)
    assert err <= rtol, f"{what}: relative error {err:.3e} > {rtol:.0e}"
    return err
