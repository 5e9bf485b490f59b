"""Snapshot slots outside the compiled program's memory: host RAM and disk, inside compiled loops.

A level with ``storage="host"`` or ``"disk"`` (:class:`~retrograde.schedules.Level`) keeps its
snapshots in a *store* of the Python process, opened per run of a forward sweep and released
when the reverse sweep that reads it ends. The compiled program reaches it through four
primitives lowered to host callbacks (the mechanism of ``jax.experimental.io_callback``):

==========================  ====================================================================
``open_p()``                a new store; returns its handle (int32), which travels with the
                            snapshots (an output of the forward primitive, an input of the
                            adjoint)
``put_p(h, j, n, *u)``      copy the state ``u = u_n`` into offloaded slot ``j`` of store ``h``
``get_p(h, j, n, *like)``   the state ``u_n`` held in slot ``j`` (shaped like ``like``)
``close_p(h)``              release the store (a later read raises :class:`SnapshotError`)
==========================  ====================================================================

Ordering: the primitives carry one *ordered* effect (:class:`OffloadEffect`), so JAX threads a
token through them, the loops and conditionals around them and consecutive compiled programs:
they run in program order and XLA removes none. Batching: a batched ``put_p`` hands the whole
block of the batch to one call and ``get_p`` returns it (its ``like`` operands, the state at
hand, say which leaves are batched), so a batched loop makes one transfer per snapshot, never
one per batch element. Snapshots are a cache: nothing is differentiated through them (the loop
primitives' rules never see these primitives, which only appear inside their lowerings).

Stores (one per offloaded level and run) are those of :mod:`retrograde._store`, which the host
driver uses too, opened from ``level_storage(level, unnamed=True)``: host RAM holds a private
NumPy copy of each snapshot; disk writes each snapshot into a region of one
``tempfile.TemporaryFile`` (no name in the file system, so nothing can be left behind, whatever
ends the process; a rewritten slot reuses the space), each leaf with its blake2b digest, verified
on every read. Both share a leaf that did not change since the last snapshot stored. A slot being
rewritten reads as empty until the write completes. A read names the step it expects: a slot
holding another step is an error, never a silent substitute.

Sharded states: a callback's placement is JAX's (``callback._callback_op_sharding``). In a program
that ``jax.jit`` partitions (shardings, no manual axes) it runs once, on device 0, with the global
value: each ``put_p`` gathers the state onto device 0 (and so into process 0 across processes) and
each ``get_p`` scatters it back; the store is process 0's. Inside ``shard_map`` (every mesh axis
manual) it runs on every device with its own piece: ``open_p`` returns each device its own
handle, so every device has its own store and moves only its piece.

Lifetime: a store is released by the reverse sweep that reads it, when it ends; a store that no
reverse sweep reads is released when the forward sweep's handle is garbage collected (eager
execution), and a compiled program whose snapshots nothing reads does not lay them (the dead-code
rules of the loop primitives drop them). A program aborted by an exception leaves its stores
open (their files unnamed): :func:`release_offloaded` frees them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive

from .._jax_private import batching, callback, core, dispatch, effects, mlir
from . import _machine as machine
from ._offload_runs import (
    Layout,
    close_run,
    count_device_access,
    get_snapshot,
    open_run,
    put_snapshot,
)

__all__ = [
    "Offload",
    "Segments",
    "stored_effects",
    "tags_of",
    "thinning_slot",
    "unread_snapshots_dce",
]

i32 = jnp.int32


# ----------------------------------------------------------------------------- the effect


class OffloadEffect(effects.Effect):
    """The ordered effect of the snapshot transfers to and from host stores."""

    def __str__(self):
        return "RetrogradeOffload"


EFFECT = OffloadEffect()
effects.lowerable_effects.add_type(OffloadEffect)
effects.control_flow_allowed_effects.add_type(OffloadEffect)
effects.ordered_effects.add_type(OffloadEffect)
# Allowed in a program partitioned over several devices (as io_callback's ordered effect is):
# under jax.jit each transfer then runs once, on device 0, with the global state; inside
# shard_map, on every device with its own piece (see "Sharded states" in the module docstring).
effects.shardable_ordered_effects.add_type(OffloadEffect)

#: Count device-slot stores and restores too (a trace-time switch; tests set it).
count_device = False


# ----------------------------------------------------------------------------- primitives

open_p = Primitive("retrograde_offload_open")
put_p = Primitive("retrograde_offload_put")
get_p = Primitive("retrograde_offload_get")
close_p = Primitive("retrograde_offload_close")
for _p in (open_p, put_p, get_p, close_p):
    _p.multiple_results = True
    _p.def_impl(lambda *args, _p=_p, **params: dispatch.apply_primitive(_p, *args, **params))
    dispatch.prim_requires_devices_during_lowering.add(_p)

_HANDLE = core.ShapedArray((), jnp.int32)


def _untagged(tag):
    """The value a tag stands for: a tag is an empty array ``(0, *shape)`` whose batching is the
    batching of the stored snapshots of one leaf."""
    return tag.update(shape=tag.shape[1:])


open_p.def_effectful_abstract_eval(lambda *, layout: ([_HANDLE], {EFFECT}))
put_p.def_effectful_abstract_eval(lambda *args, layout: ([], {EFFECT}))
get_p.def_effectful_abstract_eval(
    lambda h, j, n, *tags, layout: ([_untagged(t) for t in tags], {EFFECT})
)
close_p.def_effectful_abstract_eval(lambda h: ([], {EFFECT}))


def _lowering(make_callback, n_operands=lambda n_args: n_args):
    """A lowering that calls ``make_callback(avals_out, **params)`` on the host with the first
    ``n_operands(len(args))`` operands (the tags are for typing only), threading the effect's
    token."""

    def rule(ctx, *args, **params):
        n = n_operands(len(args))
        operands, avals_in = list(args[:n]), list(ctx.avals_in[:n])
        fun = make_callback(ctx.avals_out, **params)
        sharding = callback._callback_op_sharding(
            ctx.module_context.axis_context, None, ctx.avals_out
        )
        result, token, _ = callback.emit_python_callback(
            ctx.replace(avals_in=avals_in),
            fun,
            ctx.tokens_in.get(EFFECT),
            operands,
            avals_in,
            ctx.avals_out,
            has_side_effect=True,
            returns_token=True,
            sharding=sharding,
        )
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(mlir.TokenSet({EFFECT: token})))
        return result

    return rule


def _put_results(h, j, n, *u) -> tuple[()]:
    put_snapshot(h, j, n, u)
    return ()


def _close_results(h) -> tuple[()]:
    close_run(h)
    return ()


mlir.register_lowering(
    open_p, _lowering(lambda avals, layout: lambda: (np.int32(open_run(layout)),)), cacheable=False
)
mlir.register_lowering(
    put_p,
    _lowering(lambda avals, layout: _put_results, lambda n_args: 3 + (n_args - 3) // 2),
    cacheable=False,
)
mlir.register_lowering(
    get_p,
    _lowering(lambda avals, layout: lambda h, j, n: get_snapshot(h, j, n, avals), lambda n_args: 3),
    cacheable=False,
)
mlir.register_lowering(close_p, _lowering(lambda avals: _close_results), cacheable=False)


def _unbatched_index(dims):
    if any(d is not None for d in dims[:3]):
        raise NotImplementedError(
            "retrograde: an offloaded snapshot's slot and step must be the same for every batch "
            "element (they come from the schedule's tables)."
        )


def _put_batched(data, args, dims, *, layout):
    """One call stores the whole batch. A snapshot is stored with its tag's batching: a leaf
    batched where its tag is not holds the same value in every batch element (the stored
    snapshots of that leaf are not batched, so nothing the sweep reads from varies along that
    axis): its first element is stored; a leaf unbatched where its tag is batched is broadcast."""
    _unbatched_index(dims)
    n = (len(args) - 3) // 2
    values, tags = args[3 : 3 + n], args[3 + n :]
    dv, dt = dims[3 : 3 + n], dims[3 + n :]
    out = []
    for v, d, _t, e in zip(values, dv, tags, dt):
        if d is not None and e is None:
            v = lax.index_in_dim(v, 0, d, keepdims=False)
        elif d is None and e is not None:
            v = jnp.broadcast_to(v, (data.size, *v.shape))
        elif d is not None:
            v = jnp.moveaxis(v, d, 0)
        out.append(v)
    tags = [t if e is None else jnp.moveaxis(t, e, 1) for t, e in zip(tags, dt)]
    return put_p.bind(*args[:3], *out, *tags, layout=layout), []


def _get_batched(args, dims, *, layout):
    _unbatched_index(dims)
    tags = [t if d is None else jnp.moveaxis(t, d, 1) for t, d in zip(args[3:], dims[3:])]
    outs = get_p.bind(*args[:3], *tags, layout=layout)
    return outs, [None if d is None else 0 for d in dims[3:]]


batching.fancy_primitive_batchers[put_p] = _put_batched
batching.primitive_batchers[get_p] = _get_batched


# ----------------------------------------------------------------------------- trace-time access


def tags_of(values) -> list:
    """Tags for the snapshots ``values`` (see :func:`_untagged`): empty, batched as they are."""
    return [lax.slice_in_dim(jnp.expand_dims(v, 0), 0, 0, axis=0) for v in values]


class Offload:
    """The offloaded slots of one run, inside a compiled sweep: slot numbers ``k >= n_device``
    are offloaded slot ``k - n_device`` of the store ``handle``; smaller ones are device slots.

    ``tags`` (:func:`tags_of` the forward sweep's carry) say how the stored snapshots are
    batched: a reverse sweep's state may be batched along more axes (a ``vmap`` of cotangents),
    along which the snapshots do not vary. Each transfer is a conditional on ``k`` (the
    schedule's tables make it unbatched), so a device slot costs no host call.
    """

    def __init__(self, layout: Layout, handle, tags=None, n_device: int | None = None):
        self.layout = layout
        self.handle = handle
        self.tags = tags
        self.n_device = layout.n_device if n_device is None else n_device

    @classmethod
    def open(cls, layout: Layout, n_device: int | None = None) -> Offload:
        """A new store (for a forward sweep that lays the snapshots)."""
        (handle,) = open_p.bind(layout=layout)
        return cls(layout, handle, None, n_device)

    def close(self) -> None:
        """Release the store (after the reverse sweep's last read)."""
        close_p.bind(self.handle)

    def fetch(self, k, cur, step):
        """``(k_device, cur)``: ``cur`` replaced by the state ``u_step`` of offloaded slot ``k``
        if ``k`` is one; ``k_device`` is ``k`` for a device slot, else ``-1``."""
        far = k >= self.n_device
        tags = self.tags if self.tags is not None else tags_of(cur)
        cur = lax.cond(
            far,
            lambda c: get_p.bind(self.handle, k - self.n_device, step, *tags, layout=self.layout),
            lambda c: list(c),
            list(cur),
        )
        self._count("read", k)
        return jnp.where(far, -1, k), cur

    def keep(self, k, values, step, pred=True):
        """Store ``values`` (the state ``u_step``) in offloaded slot ``k`` if ``k`` is one (and
        ``pred``); returns ``k`` for a device slot, else ``-1``."""
        far = (k >= self.n_device) & pred
        tags = self.tags if self.tags is not None else tags_of(values)
        lax.cond(
            far,
            lambda v: put_p.bind(
                self.handle, k - self.n_device, step, *v, *tags, layout=self.layout
            ),
            lambda v: [],
            list(values),
        )
        self._count("write", jnp.where(pred, k, -1))
        return jnp.where(far, -1, k)

    def _count(self, kind, k):
        if not count_device or self.n_device == 0:
            return
        layout = self.layout

        def count(k):
            jax.debug.callback(lambda k: count_device_access(kind, layout, k), k, ordered=False)

        lax.cond((k >= 0) & (k < self.n_device), count, lambda k: None, k)


def unread_snapshots_dce(used_outputs, eqn, n_kept: int, effects):
    """The dead-code rule of a forward primitive (params ``save``, ``plan``, ``batch_levels``) whose
    outputs from ``n_kept`` on are its snapshots: offloaded snapshots that nothing reads (a
    forward-mode program) are not laid, so no store is opened (it would stay open, unread);
    ``effects``: the primitive's effects without ``save``."""
    params = eqn.params
    if params["save"] and params["plan"].offload is not None and not any(used_outputs[n_kept:]):
        levels = tuple(
            dataclasses.replace(lv, out_axes=lv.out_axes[:n_kept]) for lv in params["batch_levels"]
        )
        eqn = eqn.replace(
            params=dict(params, save=False, batch_levels=levels),
            outvars=eqn.outvars[:n_kept],
            effects=effects,
        )
        used_outputs = used_outputs[:n_kept]
    if not any(used_outputs) and not eqn.effects:
        return [False] * len(eqn.invars), None
    return [True] * len(eqn.invars), eqn


def stored_effects(layout: Layout | None) -> set:
    """The effects a sweep with this layout adds."""
    return {EFFECT} if layout is not None else set()


# ----------------------------------------------------------------------------- two-level Online


def thinning_slot(n, held):
    """The jnp twin of :func:`retrograde.schedules.thinning_slot` (int32; ``held``:
    int32[h] steps per slot, ``-1`` empty): the slot for ``u_n``, or ``-1``."""
    h = held.shape[0]
    powers = jnp.left_shift(i32(1), jnp.arange(31, dtype=i32))
    spacing = powers[jnp.argmax(n // powers <= h - 1)]
    big = jnp.iinfo(jnp.int32).max
    key = jnp.where(held < 0, -1, jnp.where(held % spacing != 0, held, big))
    k = jnp.argmin(key).astype(i32)
    return jnp.where((n % spacing == 0) & (key[k] < big), k, -1)


class Segments:
    """Macro-actions (:mod:`._machine`) reversing the segments between offloaded snapshots, last
    first: for each, a ``MOVE`` restoring its start ``u_a`` from its offloaded slot into device
    slot 0, then the binomial machine reversing ``[a, b)`` with the ``n_device`` device slots
    (the start's included). The Python twin is ``Online(snapshots, slow=...)``'s reversal.

    ``held``: int32[H], the step held in each offloaded slot (``-1`` empty); ``n_steps``: ``N``.
    State: the segment index and the machine (``O(n_device)`` integers).
    """

    with_pairs = False  # no PAIRS leaves (see _sources.BinomialSource)
    with_data = False  # no DATA leaves
    control_apart = True  # the machine's step, as _sources.BinomialSource's
    first: jax.Array | None = None  # the first action is read as the others are

    def __init__(self, n_device: int, held, n_steps):
        big = jnp.iinfo(jnp.int32).max
        self.order = jnp.argsort(jnp.where(held < 0, big, held)).astype(i32)
        self.steps = held[self.order]
        self.count = jnp.sum(held >= 0, dtype=i32)
        self.n_device, self.n_steps = n_device, n_steps
        self.state = (self.count - 1, jnp.bool_(True), self._machine(self.count - 1))

    def _segment(self, i):
        h = self.steps.shape[0]
        a = self.steps[jnp.clip(i, 0, h - 1)]
        b = jnp.where(i + 1 < self.count, self.steps[jnp.clip(i + 1, 0, h - 1)], self.n_steps)
        return a, b

    def _machine(self, i):
        a, b = self._segment(i)
        valid = i >= 0
        d = self.n_device
        steps = jnp.zeros((d,), i32).at[0].set(a)
        return machine.init(
            d,
            steps,
            jnp.zeros((d,), i32),
            jnp.where(valid, 1, 0).astype(i32),
            jnp.where(valid, b, 0).astype(i32),
            at_hand=False,
        )

    def step(self, st):
        i, pending, ms = st
        ms_next, act = machine.step(ms)
        switch = ~pending & (act.kind == machine.DONE) & (i > 0)
        j = jnp.where(switch, i - 1, i)
        a, _ = self._segment(j)
        restore = machine.Action(
            *(
                jnp.asarray(v, i32)
                for v in (
                    machine.MOVE,
                    self.n_device + self.order[jnp.maximum(j, 0)],
                    a,
                    a,
                    0,
                    0,
                    0,
                )
            )
        )
        emit = (pending & (i >= 0)) | switch
        ms = machine.select(switch, self._machine(j), machine.select(pending, ms, ms_next))
        act = machine.select(emit, restore, act)
        return (j, jnp.bool_(False), ms), act

    def leaf_slots(self, st):
        return machine.leaf_slots(st[2])
