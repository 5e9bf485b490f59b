"""Write-only buffers on plain arrays, and the bounded inner loop used inside a solver step.

Diffrax's step writes its outputs (``SaveAt`` values, dense output) with
``eqxi.buffer_at_set(buf, i, x, pred=p)``, or ``buf.at[i].set(x)`` inside its save loop. On a
plain array the former *reads* ``buf[i]`` (``where(p, x, buf[i])``), which a checkpointed loop
that stores buffers once (not in every snapshot) must never see. :class:`WriteOnly` wraps a plain
array for the duration of one step and turns every write into a pure scatter:
``buf.at[where(p, i, len(buf))].set(x, mode="drop")`` -- a false predicate writes out of bounds
and is dropped, so nothing is read. The loops themselves only ever see plain arrays.

Every such write is a :func:`~retrograde.diffrax._write_once.write_once`: diffrax writes each row
of a save buffer at most once, into a buffer that starts constant, so the reverse pass reads each
row's cotangent and leaves the buffer's cotangent alone (no O(buffer) zeroing per step).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from .._jax_private import core, pe
from ..loops._slots import vary_as
from ._private import Buffer
from ._write_once import write_once

__all__ = ["WriteOnly", "bounded_while_loop", "is_write_only", "unwrap", "wrap"]


def _scalar_index(item):
    if isinstance(item, tuple):
        if len(item) != 1:
            return None
        item = item[0]
    if isinstance(item, slice) or item is Ellipsis or item is None:
        return None
    if jnp.ndim(item) != 0:
        return None
    return item


def _write(array, item, x, pred, kwargs):
    """``array.at[item].set(x)`` where ``pred`` holds; no read of ``array``. A scalar index is
    written with ``unique_indices=True`` (one row: trivially unique), whose JVP is a plain scatter
    of the tangent (the general scatter JVP builds operand-sized masks)."""
    if kwargs:
        raise NotImplementedError(
            f"retrograde.diffrax: buffer writes with keyword arguments {sorted(kwargs)} are not "
            "supported."
        )
    i = _scalar_index(item)
    if i is None:
        if pred is True:
            return array.at[item].set(x)
        raise NotImplementedError(
            "retrograde.diffrax: a predicated buffer write needs a scalar index on the leading "
            f"axis, got {item!r}."
        )
    i = jnp.asarray(i)
    if pred is not True:
        i = jnp.where(jnp.asarray(pred), i, jnp.asarray(array.shape[0], i.dtype))
    x = jnp.broadcast_to(jnp.asarray(x, array.dtype), array.shape[1:])
    return write_once(array, i.astype(jnp.int32)[None], x[None])


class WriteOnly(Buffer):
    """A plain array seen as a write-once buffer: supports ``.at[i].set(x, pred=p)`` (a pure
    scatter, dropped when ``p`` is false) and, for diffrax's bookkeeping, ``shape``/``dtype``.

    ``_pred`` (inherited) is an extra predicate anded into every write: the inner bounded loop
    sets it to "this iteration is live", so finished iterations write nothing.
    """

    def __getitem__(self, item):
        # Diffrax never reads a buffer inside the step; a read would see values that a
        # once-stored buffer does not hold at this step.
        raise RuntimeError(
            "retrograde.diffrax: a save buffer was read inside the solver step. Buffers are "
            "write-only inside CheckpointAdjoint's loops."
        )

    @property
    def at(self):
        return _WriteOnlyAt(self)

    def _op(self, pred, item, x, op, kwargs, makes_false_steps):  # pragma: no cover
        raise NotImplementedError


class _WriteOnlyAt:
    def __init__(self, buffer: WriteOnly):
        self._buffer = buffer

    def __getitem__(self, item):
        return _WriteOnlyItem(self._buffer, item)


class _WriteOnlyItem:
    def __init__(self, buffer: WriteOnly, item):
        self._buffer = buffer
        self._item = item

    def set(self, x, *, pred=True, **kwargs):
        buf = self._buffer
        own = buf._pred
        if own is True:
            full = pred
        elif pred is True:
            full = own
        else:
            full = jnp.logical_and(own, pred)
        array = _write(buf._array, self._item, x, full, kwargs)
        return WriteOnly(array, buf._pred, None, False)

    def get(self, **kwargs):
        raise RuntimeError(
            "retrograde.diffrax: a save buffer was read inside the solver step. Buffers are "
            "write-only inside CheckpointAdjoint's loops."
        )


def is_write_only(x) -> bool:
    return isinstance(x, WriteOnly)


def wrap(array, pred=True) -> WriteOnly:
    return WriteOnly(array, pred, None, False)


def unwrap(tree):
    """Replace every :class:`WriteOnly` in ``tree`` by its plain array."""
    return jtu.tree_map(lambda x: x._array if is_write_only(x) else x, tree, is_leaf=is_write_only)


# --------------------------------------------------------------------------------------------
# A bounded while loop: differentiable in every mode (it is lax.scan + lax.cond), memory
# bounded by ``max_steps`` of *this* loop (e.g. the number of SaveAt times), never by the
# solver's max_steps. Used for the loops diffrax nests inside one solver step.
# --------------------------------------------------------------------------------------------


def _select(pred, new, old):
    if pred is True:
        return new
    return jnp.where(pred, new, old)


class _Recorder(Buffer):
    """Stands for a buffer inside one iteration of :func:`bounded_while_loop`: it records the one
    write ``(index, value, pred)`` the iteration makes, instead of carrying the buffer through
    the loop. (A buffer carried through a ``scan`` would count as read by the outer step.)
    ``_array`` is the buffer itself, there only for diffrax's type annotations (never read or
    written); ``_record`` is the write, or None."""

    _record: Any = None

    def __getitem__(self, item):
        raise RuntimeError(
            "retrograde.diffrax: a save buffer was read inside an inner loop of the solver step."
        )

    @property
    def at(self):
        return _RecorderAt(self)

    def _op(self, pred, item, x, op, kwargs, makes_false_steps):  # pragma: no cover
        raise NotImplementedError


class _RecorderAt:
    def __init__(self, rec):
        self._rec = rec

    def __getitem__(self, item):
        return _RecorderItem(self._rec, item)


class _RecorderItem:
    def __init__(self, rec, item):
        self._rec = rec
        self._item = item

    def set(self, x, *, pred=True, **kwargs):
        rec = self._rec
        if kwargs:
            raise NotImplementedError(
                f"retrograde.diffrax: buffer writes with keyword arguments {sorted(kwargs)} are "
                "not supported."
            )
        if rec._record is not None:
            raise NotImplementedError(
                "retrograde.diffrax: an inner-loop iteration wrote the same buffer twice."
            )
        i = _scalar_index(self._item)
        if i is None:
            raise NotImplementedError(
                "retrograde.diffrax: an inner-loop buffer write needs a scalar index on the "
                f"leading axis, got {self._item!r}."
            )
        array = rec._array
        x = jnp.broadcast_to(jnp.asarray(x, array.dtype), array.shape[1:])
        return _Recorder(array, rec._pred, None, False, (jnp.asarray(i, jnp.int32), x, pred))


def bounded_while_loop(
    cond_fun, body_fun, init_val, *, max_steps: int, buffers=None, first_order=False, **_
):
    """``lax.while_loop`` semantics, stopping after ``max_steps`` iterations, differentiable in
    every mode, its memory bounded by ``max_steps`` of *this* loop.

    Buffers (``buffers(init_val)``, and leaves that already are :class:`WriteOnly`) are not
    carried: each iteration's single write ``buf.at[i].set(x, pred=p)`` becomes one row of a
    ``(max_steps, ...)`` stack, and the buffer gets one scatter after the loop (rows of iterations
    that did not write point out of bounds, each to its own index, and are dropped). The buffer
    is never read. The rest of the carry decides how the loop runs:

    - **Integer carry** (every non-buffer leaf is an integer or boolean, as in diffrax's
      ``SaveAt(ts=...)`` loop, whose carry is two indices): the carry has no derivative, so a
      plain ``lax.while_loop`` runs the iterations that happen and records the carry each one
      starts from; then the body is evaluated once, vectorised (``vmap``) over the recorded
      carries, for the rows it writes: ``k`` rows for the smallest tier ``k`` in 2, 4, 8, ...,
      ``max_steps`` that covers the iterations run (a ``switch``; nothing when none ran). The
      cost follows the iterations actually run, within a factor of two.
    - **Otherwise**: ``lax.cond(any live, lax.scan of max_steps masked iterations, skip)``.
      Iterations past the end are masked, not skipped: a ``cond`` per iteration would make JAX
      store the values the body closes over once per iteration when differentiating, while a
      plain ``scan`` hoists such loop-invariant residuals.

    With ``first_order`` (the loop of a step that is only executed or reverse-differentiated
    once, never transformed further: ``while_loop``'s ``first_order_body_fun``), an integer carry
    runs as :func:`_replayed_once` instead: the body once per iteration that happens, each
    evaluating its row, in one ``lax.while_loop``, and a ``custom_vjp`` whose reverse pass is
    one loop over the same iterations. The body is then traced into the program twice (the loop
    and its VJP), not once per tier, and evaluates exactly the rows written; neither ``jvp`` nor
    a second derivative goes through it.

    Under ``vmap`` with a batched predicate each element is masked by its own predicate.
    """
    if not isinstance(max_steps, int) or max_steps < 0:
        raise ValueError(f"bounded_while_loop: max_steps must be an int >= 0, got {max_steps!r}.")
    if max_steps == 0:
        return init_val
    loop = _Loop(cond_fun, body_fun, init_val, max_steps, buffers)
    if loop.dyn and not any(jnp.issubdtype(d.dtype, jnp.inexact) for d in loop.dyn):
        dyn_final, rows = _replayed_once(loop) if first_order else _replayed(loop)
    else:
        dyn_final, rows = _masked(loop)
    return loop.finish(dyn_final, rows)


class _Loop:
    """The carry of an inner loop split into its dynamic leaves (``dyn``: arrays that are not
    buffers), its buffers (``bufs``) and static leaves; one iteration as a function of ``dyn``."""

    def __init__(self, cond_fun, body_fun, init_val, max_steps, buffers):
        leaves, self.treedef = jtu.tree_flatten(init_val, is_leaf=is_write_only)
        buffer_ids = set()
        if buffers is not None:
            buffer_ids = {id(b) for b in jtu.tree_leaves(buffers(init_val), is_leaf=is_write_only)}
        is_buf = [is_write_only(x) or id(x) in buffer_ids for x in leaves]
        self.was_wrapped = [is_write_only(x) for x in leaves]
        self.outer_pred = [x._pred if is_write_only(x) else True for x in leaves]
        self.plain = [x._array if is_write_only(x) else x for x in leaves]
        self.dyn_idx = [
            k for k, x in enumerate(self.plain) if eqx.is_array_like(x) and not is_buf[k]
        ]
        self.buf_idx = [k for k in range(len(self.plain)) if is_buf[k]]
        self.dyn = [jnp.asarray(self.plain[k]) for k in self.dyn_idx]
        self.bufs = [jnp.asarray(self.plain[k]) for k in self.buf_idx]
        self.cond_fun, self.body_fun, self.max_steps = cond_fun, body_fun, max_steps
        self.row_shapes = jax.eval_shape(lambda d: self.step(d, True, jnp.int32(0))[1], self.dyn)

    def rebuild(self, dyn_vals):
        out = list(self.plain)
        for k, v in zip(self.dyn_idx, dyn_vals):
            out[k] = v
        for k, b in zip(self.buf_idx, self.bufs):
            # equinox annotates the predicate as a bool array; a Python bool stands for one
            out[k] = _Recorder(b, True, None, False)  # type: ignore[arg-type]
        return jtu.tree_unflatten(self.treedef, out)

    def live(self, dyn_vals):
        return jnp.asarray(self.cond_fun(self.rebuild(dyn_vals)), bool)

    def step(self, dyn_vals, ok, j):
        """One iteration from ``dyn_vals``: ``(new dyn, rows)``, a row ``(value, index)`` (or
        None) per buffer; the index is out of bounds (``len(buffer) + j``) unless ``ok`` and the
        write's own predicate hold."""
        out = self.body_fun(self.rebuild(dyn_vals))
        out_leaves, out_tree = jtu.tree_flatten(out, is_leaf=lambda x: isinstance(x, Buffer))
        if out_tree != self.treedef:  # type: ignore[operator]  # jaxlib: PyTreeDef untyped
            raise TypeError(
                "retrograde.diffrax: an inner loop's body changed the structure of its carry "
                f"from {self.treedef} to {out_tree}."
            )
        new_dyn = [jnp.asarray(out_leaves[k], d.dtype) for k, d in zip(self.dyn_idx, dyn_vals)]
        rows: list[Any] = []
        for k, b in zip(self.buf_idx, self.bufs):
            rec = out_leaves[k]
            if not isinstance(rec, _Recorder):
                raise TypeError("retrograde.diffrax: an inner loop replaced a buffer.")
            if rec._record is None:  # this buffer is never written by the body
                rows.append(None)
                continue
            i, x, p = rec._record
            write = ok if p is True else jnp.logical_and(ok, p)
            rows.append((x, jnp.where(write, i, b.shape[0] + j)))
        return new_dyn, rows

    def out_of_bounds(self, b):
        """``max_steps`` distinct row indices past the end of buffer ``b`` (dropped writes)."""
        return b.shape[0] + jnp.arange(self.max_steps, dtype=jnp.int32)

    def no_rows(self):
        """The rows of a loop that runs no iteration: all out of bounds."""
        return [
            None
            if r is None
            else (
                vary_as(jnp.zeros((self.max_steps, *r[0].shape), r[0].dtype), r[0]),
                vary_as(self.out_of_bounds(b), r[1]),
            )
            for r, b in zip(self.row_shapes, self.bufs)
        ]

    def finish(self, dyn_final, rows):
        """The final carry: ``dyn_final``, and each buffer with its rows scattered in."""
        out = list(self.plain)
        for k, v in zip(self.dyn_idx, dyn_final):
            out[k] = v
        for k, b, r in zip(self.buf_idx, self.bufs, rows):
            if r is None:
                out[k] = b
                continue
            vals, idx = r
            p = self.outer_pred[k]
            if p is not True:
                idx = jnp.where(p, idx, self.out_of_bounds(b))
            out[k] = write_once(b, idx, vals)
        out = [wrap(v, self.outer_pred[k]) if self.was_wrapped[k] else v for k, v in enumerate(out)]
        return jtu.tree_unflatten(self.treedef, out)


def _masked(loop: _Loop):
    """``cond(any live, scan of max_steps iterations, each masked by the predicate)``."""

    def one(dyn_vals, j):
        live = loop.live(dyn_vals)
        new_dyn, rows = loop.step(dyn_vals, live, j)
        return [_select(live, n, d) for n, d in zip(new_dyn, dyn_vals)], rows

    def run(dyn_vals):
        return jax.lax.scan(one, dyn_vals, jnp.arange(loop.max_steps, dtype=jnp.int32))

    def skip(dyn_vals):
        return list(dyn_vals), loop.no_rows()

    return jax.lax.cond(eqxi.unvmap_any(loop.live(loop.dyn)), run, skip, loop.dyn)


def _replayed(loop: _Loop):
    """For a carry without derivatives: a ``lax.while_loop`` over the iterations that happen,
    recording the carry each starts from, then the rows of all of them in one ``vmap``."""
    m = loop.max_steps

    def go_on(c):
        j, d, _ = c
        return (j < m) & loop.live(d)

    def advance(c):
        j, d, seen = c
        seen = [s.at[j].set(x) for s, x in zip(seen, d)]
        return j + 1, loop.step(d, True, j)[0], seen

    # Rows past the last iteration are evaluated (and dropped) at the initial carry, a carry the
    # body is meant to see, rather than at zeros.
    seen0 = [jnp.broadcast_to(d, (m, *d.shape)) for d in loop.dyn]
    n, dyn_final, seen = jax.lax.while_loop(go_on, advance, (jnp.int32(0), list(loop.dyn), seen0))

    def rows_of(d, j):
        return loop.step(d, j < n, j)[1]

    def evaluate(k):
        """The rows of the first ``k`` recorded carries, padded to ``m`` with dropped rows."""

        def run(seen):
            head = [s[:k] for s in seen]
            rows = jax.vmap(rows_of)(head, jnp.arange(k, dtype=jnp.int32))
            return [
                None if r is None else _pad(r, m, loop.out_of_bounds(b))
                for r, b in zip(rows, loop.bufs)
            ]

        # Rematerialised: differentiating a ``switch`` makes every branch output every branch's
        # residuals (zeros or copies, each step); recomputing the rows keeps only the inputs.
        return jax.checkpoint(run)

    def skip(seen):
        return loop.no_rows()

    # Evaluate the rows of the iterations that ran, rounded up to a tier (2, 4, 8, ..., m), not
    # always all m: a step typically saves a few of many save times.
    tiers = _tiers(m)
    most = eqxi.unvmap_max(n)
    tier = jnp.where(most > 0, 1 + sum((most > k).astype(jnp.int32) for k in tiers[:-1]), 0)
    branches = [skip] + [evaluate(k) for k in tiers]
    return dyn_final, jax.lax.switch(tier, branches, seen)


def _replayed_once(loop: _Loop):
    """:func:`_replayed` for a step that is executed or reverse-differentiated, never
    transformed further: one ``lax.while_loop`` runs the iterations that happen, each writing its
    row (``loop.step``'s rows, a value and an index) into a stack of ``max_steps`` rows, whose
    other rows are dropped writes (:meth:`_Loop.no_rows`). Its derivative is a ``custom_vjp``:
    a loop over the same iterations, each taking the VJP of its row's values in the floats the
    body closes over (the integer carry has none). Cost: the rows actually written, once
    forward and once reverse; one copy of the body in each loop."""
    m = loop.max_steps
    n_dyn = len(loop.dyn)

    def live(d):
        return loop.live(list(d))

    def one(d, j):
        """Iteration ``j`` from carry ``d``: the new carry, the rows' values and indices."""
        new, rows = loop.step(list(d), True, j)
        return new, [r[0] for r in rows if r is not None], [r[1] for r in rows if r is not None]

    live_c, live_consts = _hoisted(live, loop.dyn)
    one_c, one_consts = _hoisted(one, loop.dyn, jnp.int32(0))
    n_live = len(live_consts)
    floats = [jnp.issubdtype(jnp.result_type(c), jnp.inexact) for c in one_consts]
    written = [r is not None for r in loop.row_shapes]

    def run(consts, dyn):
        cl, cs = consts[:n_live], consts[n_live:]
        empty = [r for r in loop.no_rows() if r is not None]

        def go_on(c):
            return (c[0] < m) & live_c(c[1], *cl)

        def advance(c):
            j, d, seen, vals, idx = c
            seen = [s.at[j].set(x) for s, x in zip(seen, d)]
            new, v, i = one_c(d, j, *cs)
            vals = [a.at[j].set(x) for a, x in zip(vals, v)]
            idx = [a.at[j].set(x) for a, x in zip(idx, i)]
            return j + 1, new, seen, vals, idx

        seen0 = [jnp.broadcast_to(d, (m, *d.shape)) for d in dyn]
        init = (jnp.int32(0), list(dyn), seen0, [v for v, _ in empty], [i for _, i in empty])
        return jax.lax.while_loop(go_on, advance, init)

    @jax.custom_vjp
    def rows_loop(consts, dyn):
        return run(consts, dyn)

    def fwd(consts, dyn):
        out = run(consts, dyn)
        return out, (consts, out[0], out[2])

    def bwd(res, ct):
        consts, n, seen = res
        cs = consts[n_live:]
        ct_vals = ct[3]

        diff = [c for c, f in zip(cs, floats) if f]

        def values(d, j, *c):
            it = iter(c)
            return one_c(d, j, *[next(it) if f else x for x, f in zip(cs, floats)])[1]

        def back(j, acc):
            d = [s[j] for s in seen]
            _, pull = jax.vjp(lambda *c: values(d, j, *c), *diff)
            return [a + g for a, g in zip(acc, pull([v[j] for v in ct_vals]))]

        acc = iter(jax.lax.fori_loop(0, n, back, [jnp.zeros_like(c) for c in diff]))
        out = [None] * n_live + [next(acc) if f else None for f in floats]
        return out, [None] * n_dyn

    rows_loop.defvjp(fwd, bwd)
    _, dyn_final, _, vals, idx = rows_loop([*live_consts, *one_consts], list(loop.dyn))
    it = iter(zip(vals, idx))
    return dyn_final, [next(it) if w else None for w in written]


def _hoisted(fun, *example):
    """``(f, consts)``: ``fun`` traced at ``example``'s types, every value it closes over (traced
    or not) made an argument, ``f(*args, *consts) == fun(*args)``. (``jax.closure_convert``
    keeps integer tracers closed over, which a ``custom_vjp``'s reverse rule, traced later, must
    not see.)"""
    closed, shape = jax.make_jaxpr(fun, return_shape=True)(*example)
    jaxpr = pe.convert_constvars_jaxpr(closed.jaxpr)
    out_tree = jtu.tree_structure(shape)
    n_args = len(jtu.tree_leaves(example))

    n_consts = len(closed.consts)

    def f(*args_consts):
        cut = len(args_consts) - n_consts
        flat = jtu.tree_leaves(args_consts[:cut])
        assert len(flat) == n_args
        return jtu.tree_unflatten(out_tree, core.eval_jaxpr(jaxpr, (), *args_consts[cut:], *flat))

    return f, list(closed.consts)


def _tiers(m: int) -> list[int]:
    """Row counts ``2, 4, 8, ...`` below ``m``, then ``m``."""
    out, k = [], 2
    while k < m:
        out.append(k)
        k *= 2
    return out + [m]


def _pad(row, m, dropped):
    """Rows ``(values[k], indices[k])`` padded to ``m``: zeros written at dropped indices."""
    vals, idx = row
    k = vals.shape[0]
    if k == m:
        return vals, idx
    pad = jnp.zeros((m - k, *vals.shape[1:]), vals.dtype)
    return jnp.concatenate([vals, pad]), jnp.concatenate([idx, dropped[k:]])
