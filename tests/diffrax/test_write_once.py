"""``write_once``: the row scatter whose transpose leaves the buffer's cotangent alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrograde.diffrax._write_once import write_once

jax.config.update("jax_enable_x64", True)

M, K, ROW = 6, 3, (2,)
INDEX = jnp.array([4, 1, M + 2], jnp.int32)  # the last row is dropped


def reference(buffer, index, rows):
    return buffer.at[index].set(rows, mode="drop", unique_indices=True)


def loss(write, x):
    """A scalar through a buffer that starts constant and gets each row at most once."""
    rows = jnp.stack([jnp.sin(x * (j + 1) * jnp.array([1.0, 2.0])) for j in range(K)])
    buf = write(jnp.full((M, *ROW), 0.5), INDEX, rows)
    return jnp.sum(jnp.cos(buf) * jnp.arange(M * 2.0).reshape(M, *ROW))


def test_values_and_first_order():
    key = jax.random.PRNGKey(0)
    buffer = jax.random.normal(key, (M, *ROW))
    rows = jax.random.normal(jax.random.PRNGKey(1), (K, *ROW))
    np.testing.assert_array_equal(write_once(buffer, INDEX, rows), reference(buffer, INDEX, rows))
    t_buf, t_rows = jnp.ones_like(buffer), 2 * jnp.ones_like(rows)
    _, t_ours = jax.jvp(lambda b, r: write_once(b, INDEX, r), (buffer, rows), (t_buf, t_rows))
    _, t_ref = jax.jvp(lambda b, r: reference(b, INDEX, r), (buffer, rows), (t_buf, t_rows))
    np.testing.assert_array_equal(t_ours, t_ref)
    ct = jax.random.normal(jax.random.PRNGKey(2), (M, *ROW))
    _, pull = jax.vjp(lambda b, r: write_once(b, INDEX, r), buffer, rows)
    ct_buf, ct_rows = pull(ct)
    # Rows: the cotangent at their index (zero for the dropped one). Buffer: passed on whole,
    # since under the write-once rule the overwritten old value is never used.
    np.testing.assert_array_equal(ct_rows, ct.at[INDEX].get(mode="fill", fill_value=0))
    np.testing.assert_array_equal(ct_buf, ct)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_derivatives_match_scatter(order):
    def nth(write):
        f = lambda x: loss(write, x)
        for _ in range(order):
            f = jax.grad(f)
        return f(0.3)

    np.testing.assert_allclose(nth(write_once), nth(reference), rtol=1e-12)
    hess = jax.hessian(lambda v: loss(write_once, v[0] * v[1]))(jnp.array([0.3, 1.2]))
    hess_ref = jax.hessian(lambda v: loss(reference, v[0] * v[1]))(jnp.array([0.3, 1.2]))
    np.testing.assert_allclose(hess, hess_ref, rtol=1e-12)


@pytest.mark.parametrize("batched", ["buffer", "index", "rows", "all"])
def test_vmap(batched):
    b = 3
    buffer = jax.random.normal(jax.random.PRNGKey(0), (M, *ROW))
    rows = jax.random.normal(jax.random.PRNGKey(1), (K, *ROW))
    index = INDEX
    args, axes = [buffer, index, rows], [None, None, None]
    names = ["buffer", "index", "rows"]
    for j, name in enumerate(names):
        if batched in (name, "all"):
            if name == "index":
                args[j] = jnp.stack([INDEX, jnp.array([0, M + 5, 5]), jnp.array([M, 2, 3])])
            else:
                args[j] = jnp.stack([args[j] * (i + 1) for i in range(b)])
            axes[j] = 0
    out = jax.vmap(write_once, in_axes=tuple(axes))(*args)
    want = jax.vmap(reference, in_axes=tuple(axes))(*args)
    np.testing.assert_array_equal(out, want)
    # The batched transpose reads each element's own rows.
    g = jax.vmap(
        jax.grad(lambda x, i: jnp.sum(write_once(jnp.zeros((M, *ROW)), i, rows * x) ** 2)),
        in_axes=(0, 0),
    )(jnp.arange(1.0, 4.0), args[1] if axes[1] == 0 else jnp.stack([INDEX] * b))
    g_ref = jax.vmap(
        jax.grad(lambda x, i: jnp.sum(reference(jnp.zeros((M, *ROW)), i, rows * x) ** 2)),
        in_axes=(0, 0),
    )(jnp.arange(1.0, 4.0), args[1] if axes[1] == 0 else jnp.stack([INDEX] * b))
    np.testing.assert_allclose(g, g_ref, rtol=1e-12)


def test_shape_errors_name_the_arguments():
    with pytest.raises(ValueError, match="index"):
        write_once(jnp.zeros((M, 2)), jnp.zeros((2, 2), jnp.int32), jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match="rows"):
        write_once(jnp.zeros((M, 2)), INDEX, jnp.zeros((K, 3)))
