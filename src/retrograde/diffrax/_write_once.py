"""``write_once(buffer, index, rows)``: a row scatter into a buffer that is written at most once
per row, with the transpose that this rule allows.

``buffer.at[index].set(rows, mode="drop")`` is linear in ``(buffer, rows)``; JAX transposes it to
``rows_bar = buffer_bar[index]`` *and* ``buffer_bar.at[index].set(0)``: the rows overwritten get
no cotangent from the old buffer. When every row of a buffer is written at most once and the
buffer starts from a constant (diffrax's ``SaveAt`` buffers start as ``inf`` and are written once
per save index, the rule equinox's loop buffers rely on too), the old value at a written row is
never used, so the zeroing is wasted work: a scatter into the whole cotangent buffer each reverse
step, which XLA on CPU also makes copy the buffer before (it cannot order the read of the rows
before the in-place write). ``write_once`` transposes to ``rows_bar = buffer_bar[index]`` and
passes ``buffer_bar`` on unchanged.

Shapes: ``buffer (m, *row)``, ``index (k,)`` int32 (out-of-bounds entries, ``>= m``, are dropped;
in-bounds entries are distinct), ``rows (k, *row)``. Cost: ``O(k * row)``, independent of ``m``.
Differentiable in every mode: the JVP is ``write_once`` of the tangents, and the transpose is a
gather (whose own transpose is JAX's).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.extend.core import Primitive

from .._jax_private import ad, batching, dispatch, mlir

__all__ = ["write_once", "write_once_p"]

write_once_p = Primitive("retrograde_write_once")
# ``retrograde.while_loop``'s write-only check: operand 0 is the buffer written into.
write_once_p.buffer_operands = (0,)  # type: ignore[attr-defined]  # ours; Primitive has no slots


def write_once(buffer, index, rows):
    """``buffer.at[index].set(rows, mode="drop")`` for a buffer whose rows are each written at
    most once (see the module docstring); ``index`` entries ``>= len(buffer)`` are dropped."""
    buffer = jnp.asarray(buffer)
    index = jnp.asarray(index, jnp.int32)
    rows = jnp.asarray(rows, buffer.dtype)
    if index.ndim != 1 or rows.shape != (index.shape[0], *buffer.shape[1:]):
        raise ValueError(
            f"write_once: expected index (k,) and rows (k, {buffer.shape[1:]}), got "
            f"{index.shape} and {rows.shape}."
        )
    return write_once_p.bind(buffer, index, rows)


def _impl(buffer, index, rows):
    return buffer.at[index].set(rows, mode="drop", unique_indices=True)


write_once_p.def_impl(lambda *args: dispatch.apply_primitive(write_once_p, *args))
write_once_p.def_abstract_eval(lambda buffer, index, rows: buffer)
mlir.register_lowering(write_once_p, mlir.lower_fun(_impl, multiple_results=False))


def _jvp(primals, tangents):
    buffer, index, rows = primals
    t_buffer, _, t_rows = tangents
    out = write_once_p.bind(buffer, index, rows)
    if type(t_buffer) is ad.Zero and type(t_rows) is ad.Zero:
        return out, ad.Zero.from_primal_value(out)  # type: ignore[attr-defined]  # untyped in JAX
    t_buffer = ad.instantiate_zeros(t_buffer)
    t_rows = ad.instantiate_zeros(t_rows)
    return out, write_once_p.bind(t_buffer, index, t_rows)


def _transpose(ct, buffer, index, rows):
    assert not ad.is_undefined_primal(index)
    if type(ct) is ad.Zero:
        return [None, None, None]
    ct_buffer = ct if ad.is_undefined_primal(buffer) else None
    ct_rows = None
    if ad.is_undefined_primal(rows):
        ct_rows = ct.at[index].get(mode="fill", fill_value=0)
    return [ct_buffer, None, ct_rows]


ad.primitive_jvps[write_once_p] = _jvp
ad.primitive_transposes[write_once_p] = _transpose


def _batch(args, dims):
    """Batched write: the batch becomes part of the row axis (``B * m`` rows, indices offset by
    ``b * m``; dropped entries stay out of bounds and distinct)."""
    buffer, index, rows = args
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)

    def lead(a, d):
        if d is None:
            return jnp.broadcast_to(a, (size, *a.shape))
        return jnp.moveaxis(a, d, 0)

    buffer, index, rows = (lead(a, d) for a, d in zip(args, dims))
    b, m, k = size, buffer.shape[1], index.shape[1]
    inside = (index >= 0) & (index < m)
    batch = jnp.arange(b, dtype=jnp.int32)[:, None]
    spare = b * m + batch * k + jnp.arange(k, dtype=jnp.int32)[None, :]
    flat_index = jnp.where(inside, index + batch * m, spare).reshape(b * k)
    out = write_once_p.bind(
        buffer.reshape(b * m, *buffer.shape[2:]),
        flat_index,
        rows.reshape(b * k, *rows.shape[2:]),
    )
    return out.reshape(buffer.shape), 0


batching.primitive_batchers[write_once_p] = _batch
