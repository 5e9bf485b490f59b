"""States and step data in one budget: a ``DATA`` leaf's data rows in the free slots' memory.

Mixed checkpointing budgets states and data together: a leaf at level ``k`` (``k`` states held)
may keep ``pooled(k)`` steps' data, where Revolve would keep more states. When the machine takes
slots lowest first (:attr:`._machine.Rule.pooled`), slots ``0 .. k - 1`` are held while such a
leaf runs and every slot from ``k`` on is free, so its data goes there: the snapshot buffer of
``R`` rows of ``P`` elements, read as one vector of ``R P``, holds data row ``i`` of a leaf at
level ``k`` from element ``k P + i Q`` on (``Q``: the elements of one step's pooled residuals).
The buffer has ``R = max(S, max_k ceil((k P + pooled(k) Q) / P))`` rows (``S``: the machine's
slots); for a schedule whose data size is the measured ``Q / P``, that is the budget. ``R`` is
sized, when the loop is traced, for a first-order gradient in every float leaf (parameters
included); a derivative in fewer leaves keeps less data and fills fewer rows, and one that keeps
more (an HVP's sweep) pools what fits and keeps the rest in rows of its own.

With several snapshot leaves (a pytree state; the primal and tangent leaves of an HVP's sweep),
the leaves of the dtype with the most elements hold the data together: a step's pooled
residuals, flattened and concatenated, are cut into one piece per leaf, in proportion to their
rows, each written at that leaf's own offsets. Pooled: the stored residuals of that dtype. The
others (another dtype: masks, indices) keep rows of their own, ``pooled(0)`` of each, outside
the budget; so does everything when a leaf is sharded over explicit mesh axes or ``R P`` would
not fit int32 offsets.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol

import jax.numpy as jnp
from jax import lax

from .._jax_private import core
from . import _residuals as residuals
from ._body import Body
from ._machine import Rule, argsort
from ._slots import put_row, row, stacked_sharding, vary_as, varying_axes
from ._tables import Tables

i32 = jnp.int32
_OFFSET_LIMIT = 2**31 - 1


class Reversal(Protocol):
    """What the pool needs of a loop's reversal: a :class:`._tables.Tables`, or a while
    loop's :class:`MachinePlan`."""

    @property
    def n_slots(self) -> int: ...  # the machine's slots

    @property
    def data_rows(self) -> int: ...  # the most data rows a leaf fills

    @property
    def rule(self) -> Rule: ...


class MachinePlan(NamedTuple):
    """A while loop's reversal (:class:`Reversal`): the machine with ``n_slots`` slots and
    ``rule``, after ``Online``'s placement."""

    n_slots: int
    rule: Rule

    @property
    def data_rows(self) -> int:
        return self.rule.data_rows(self.n_slots)


class Pool(NamedTuple):
    """Which stored residuals share the snapshot buffers, and where.

    Attributes:
        pooled: the indices of the stored residuals kept in the snapshot buffers, in order.
        rest: the others' indices (rows of their own).
        hosts: the indices of the snapshot buffers that hold them (the snapshot leaves of their
            dtype), with ``p``: the elements of one row of each, and ``q``: the elements of one
            data row each holds (the pooled residuals of one step, flattened and concatenated,
            are cut into pieces of these sizes, one per host).
    """

    pooled: tuple[int, ...]
    rest: tuple[int, ...]
    hosts: tuple[int, ...]
    p: tuple[int, ...]
    q: tuple[int, ...]


def _hosts(body: Body):
    """The snapshot leaves whose buffers may hold data: those of the dtype with the most
    elements, none sharded over explicit mesh axes (else none)."""
    avals = body.snapshot_avals
    if not avals or any(stacked_sharding(a) is not None for a in avals):
        return ()
    size: dict = {}
    for a in avals:
        size[a.dtype] = size.get(a.dtype, 0) + a.size
    dtype = max(size, key=lambda t: size[t])
    return tuple(i for i, a in enumerate(avals) if a.dtype == dtype and a.size)


def _rows_needed(tables: Reversal, pool: Pool) -> int:
    need = tables.n_slots
    for p, q in zip(pool.p, pool.q):
        most = max(k * p + tables.rule.pooled(k) * q for k in range(tables.n_slots + 1))
        need = max(need, -(-most // p))
    return need


def plan(body: Body, tables: Reversal, stored_avals, rows: int | None = None) -> Pool | None:
    """The pool of a sweep whose data are ``stored_avals`` (one step's), in snapshot buffers of
    ``rows`` rows (``None``: as many as it needs): the residuals of the hosts' dtype, the first
    ones that fit (an HVP's sweep keeps more data per state than the gradient the rows were
    sized for); ``None`` if nothing is pooled (the rule does not pool, or none fits)."""
    hosts = _hosts(body)
    if not hosts or tables.rule.pooled is None or not tables.data_rows:
        return None
    avals = body.snapshot_avals
    dtype = avals[hosts[0]].dtype
    axes = frozenset.intersection(*(varying_axes(avals[h]) for h in hosts))
    pooled = tuple(
        i
        for i, a in enumerate(stored_avals)
        if a.dtype == dtype and a.size and varying_axes(a) == axes
    )
    p = tuple(math.prod(avals[h].shape) for h in hosts)
    while pooled:  # as many residuals as fit in ``rows``, in order
        pool = _cut(pooled, len(stored_avals), hosts, p, stored_avals)
        need = _rows_needed(tables, pool)
        if rows is None or need <= rows:
            return pool if need * max(p) <= _OFFSET_LIMIT else None
        pooled = pooled[:-1]
    return None


def _cut(pooled, n_stored: int, hosts, p, stored_avals) -> Pool:
    """The pool of the residuals ``pooled``: pieces in proportion to the hosts' rows, the
    remainder to the first ones."""
    total = sum(math.prod(stored_avals[i].shape) for i in pooled)
    q = [total * pj // sum(p) for pj in p]
    for j in range(total - sum(q)):
        q[j] += 1
    rest = tuple(i for i in range(n_stored) if i not in pooled)
    return Pool(pooled, rest, hosts, p, tuple(q))


def shares_all(body: Body, tables: Reversal, stored_avals, rows: int) -> bool:
    """Whether every stored residual of ``stored_avals`` shares snapshot buffers of ``rows``
    rows (:func:`plan` pools all of them, none in rows of its own)."""
    pool = plan(body, tables, stored_avals, rows=rows)
    return pool is not None and not pool.rest


def rows(body: Body, tables: Reversal) -> int:
    """Rows of the snapshot buffers of ``body``'s loop: the machine's slots, and more where a
    ``DATA`` leaf's data (a first-order gradient's: every float leaf differentiated) share
    them (:func:`plan`)."""
    if tables.rule.pooled is None or not tables.data_rows or not _hosts(body):
        return tables.n_slots
    lin = residuals.linearization(body, *residuals.every_float(body))
    pool = plan(body, tables, lin.stored_avals)
    return tables.n_slots if pool is None else _rows_needed(tables, pool)


def lead(body: Body, tables: Tables, masks, batched: bool = False):
    """``(linearization, pool)`` of a forward sweep that keeps the data of the lead leaf
    (:attr:`._tables.Tables.lead`), linearized in the leaves ``masks`` (``(dc, dk, dx)``), in
    snapshot buffers of :func:`rows` rows."""
    dc, dk, dx = masks
    lin = residuals.linearization(body, dc, dk, dx, batched)
    return lin, plan(body, tables, lin.stored_avals, rows=rows(body, tables))


def rest_avals(pool: Pool | None, stored_avals) -> list:
    """The stored residuals kept in data rows of their own (all of them without a pool)."""
    return list(stored_avals) if pool is None else [stored_avals[j] for j in pool.rest]


def keep(pool: Pool | None, slots, rows, level, i, data):
    """Keep ``data`` (all stored residuals of one step) as data row ``i`` of a leaf at
    ``level``: the pooled ones in the snapshot buffers ``slots``, the others in row ``i`` of
    ``rows`` (their buffers, :func:`rest_avals`). Returns ``(slots, rows)``. The one writer of a
    ``DATA`` leaf's data: the reverse sweep's leaves and the forward sweep's lead leaf."""
    if pool is None:
        return slots, put_row(rows, data, i)
    slots = write(pool, slots, level, i, data)
    return slots, put_row(rows, [data[k] for k in pool.rest], i)


def fetch(pool: Pool | None, slots, rows, level, i, stored_avals) -> list:
    """All stored residuals of data row ``i`` of a leaf at ``level``, as :func:`keep` wrote
    them."""
    d = row(rows, i)
    if pool is None:
        return d
    return merge(pool, read(pool, slots, level, i), d, stored_avals)


def write(pool: Pool, slots, level, i, data) -> list:
    """``slots`` (the snapshot buffers) with the pooled residuals of ``data`` (all stored
    residuals of one step) as data row ``i`` of a leaf at ``level``."""
    row = jnp.concatenate([data[j].reshape(-1) for j in pool.pooled])
    slots, at = list(slots), 0
    for h, p, q in zip(pool.hosts, pool.p, pool.q):
        buf = slots[h]
        start = (level * p + i * q).astype(i32)
        piece = vary_as(row[at : at + q], core.typeof(buf))
        slots[h] = _write_span(buf, start, piece, p)
        at += q
    return slots


def _write_span(buf, start, piece, p: int):
    """``buf`` (rows of ``p`` elements) with ``piece`` at element ``start`` of its flattening.

    Written through a window of whole rows along the leading axis, so that XLA updates the
    buffer in place: a write into ``buf.reshape(-1)`` inside a loop makes XLA copy the whole
    buffer at every trip. The window covers the rows the piece spans: ``q / p`` rows when ``p``
    divides ``q`` (then ``start`` is a multiple of ``p`` and nothing is read), else
    ``ceil(q / p) + 1`` rows, read, updated and written back."""
    q = piece.shape[0]
    if q % p == 0:
        rows = piece.reshape((q // p, *buf.shape[1:]))
        return lax.dynamic_update_slice_in_dim(buf, rows, start // p, 0)
    first, width = _window(start, q, p, buf.shape[0])
    window = lax.dynamic_slice_in_dim(buf, first, width, 0).reshape(-1)
    window = lax.dynamic_update_slice(window, piece, (start - first * p,))
    return lax.dynamic_update_slice_in_dim(buf, window.reshape((width, *buf.shape[1:])), first, 0)


def read(pool: Pool, slots, level, i):
    """The pooled residuals of data row ``i`` of a leaf at ``level``, flattened and
    concatenated."""
    pieces = []
    for h, p, q in zip(pool.hosts, pool.p, pool.q):
        start = (level * p + i * q).astype(i32)
        pieces.append(_read_span(slots[h], start, q, p))
    return jnp.concatenate(pieces) if len(pieces) > 1 else pieces[0]


def _read_span(buf, start, q: int, p: int):
    """The ``q`` elements of ``buf`` (rows of ``p`` elements) from element ``start`` of its
    flattening, read through the window of whole rows :func:`_write_span` writes. A slice of
    ``buf.reshape(-1)`` fused into the kernel that uses it has XLA's CPU compiler split that
    kernel across threads (docs/performance.md, "Mixed in the compiled loops")."""
    if q % p == 0:
        return lax.dynamic_slice_in_dim(buf, start // p, q // p, 0).reshape(-1)
    first, width = _window(start, q, p, buf.shape[0])
    window = lax.dynamic_slice_in_dim(buf, first, width, 0).reshape(-1)
    return lax.dynamic_slice(window, (start - first * p,), (q,))


def _window(start, q: int, p: int, n_rows: int):
    """``(first, width)``: the ``width = ceil(q / p) + 1`` rows (at most ``n_rows``) from row
    ``first`` that hold the ``q`` elements from element ``start`` of the flattening of ``n_rows``
    rows of ``p`` elements (``q`` not a multiple of ``p``)."""
    width = min(q // p + 2, n_rows)
    return jnp.clip(start // p, 0, n_rows - width), width


def merge(pool: Pool, pooled_row, rest: list, avals) -> list:
    """All stored residuals of one step, from its pooled row and the others' values."""
    out: list = [None] * len(avals)
    at = 0
    for j in pool.pooled:
        size = math.prod(avals[j].shape)
        out[j] = pooled_row[at : at + size].reshape(avals[j].shape)
        at += size
    for j, v in zip(pool.rest, rest):
        out[j] = v
    return out


def held_first(slots, held):
    """The snapshot buffers ``slots`` with their rows permuted so that the held steps (``held``:
    int32[S], the step in each row, ``-1`` empty) lie in rows ``0 .. m - 1`` in ascending
    order, the empty rows after them; and ``held`` so permuted. In place: a loop of ``S`` row
    swaps, each through two rows of temporary (``4 S`` row copies), so no second buffer is
    allocated (``tests/loops/test_mixed_while.py`` checks the temp memory)."""
    s = held.shape[0]
    order = argsort(jnp.where(held < 0, jnp.iinfo(jnp.int32).max, held))  # row j gets order[j]
    iota = jnp.arange(s, dtype=i32)

    def swap(buf, j, k):
        # One gather of both rows and one scatter: XLA updates the loop's buffer in place (two
        # dynamic-slice reads and two updates made it copy the buffer).
        both = jnp.stack([j, k])
        return buf.at[both[::-1]].set(buf[both])

    def one(j, st):
        bufs, at, where = st  # at[r]: the original row now in row r; where: its inverse
        k = where[order[j]]  # where row j's content is now (k >= j)
        bufs = [swap(b, j, k) for b in bufs]
        moved = at[j]
        at = at.at[j].set(order[j]).at[k].set(moved)
        where = where.at[order[j]].set(j).at[moved].set(k)
        return bufs, at, where

    bufs, _, _ = lax.fori_loop(0, s, one, (list(slots), iota, iota))
    return bufs, held[order]
