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

Lifetime: a store is released by the reverse sweep that reads it, when it ends; a store that no
reverse sweep reads is released when the forward sweep's handle is garbage collected (eager
execution), and a compiled program whose snapshots nothing reads does not lay them (the dead-code
rules of the loop primitives drop them). A program aborted by an exception leaves its stores
open (their files unnamed): :func:`release_offloaded` frees them.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive

from .._jax_private import batching, callback, core, dispatch, effects, mlir
from .._store import Snapshot, SnapshotError, Store, level_storage
from ..schedules import Level
from . import _machine as machine

__all__ = ["Layout", "Offload", "OffloadStats", "Segments", "offload_stats", "release_offloaded"]

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


# ----------------------------------------------------------------------------- layout


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the slots of a compiled loop live.

    Slot ``k`` (as numbered in a :class:`~._tables.Tables`) is slot ``slot[k]`` of the
    schedule's level ``level[k]``; slots ``0 .. n_device - 1`` are in device memory, the others
    (the *offloaded* slots, ``j = k - n_device``) in host stores.
    """

    levels: tuple[Level, ...]
    level: tuple[int, ...]
    slot: tuple[int, ...]
    n_device: int

    @property
    def n_offloaded(self) -> int:
        return len(self.level) - self.n_device

    def describe(self, j: int) -> str:
        """``"slot 3 of level 1 (disk)"`` for offloaded slot ``j``."""
        k = self.n_device + j
        lvl = self.levels[self.level[k]]
        label = lvl.name or lvl.storage
        return f"slot {self.slot[k]} of level {self.level[k]} ({label})"


def offloaded(level: Level) -> bool:
    """Whether the compiled loops keep this level outside device memory."""
    return level.storage != "device"


def two_level(schedule) -> Layout | None:
    """The layout of ``Online(snapshots, slow=...)``: ``snapshots`` device slots (level 0) and
    the slow level's slots, offloaded (level 1); ``None`` for a one-level ``Online``."""
    slow = getattr(schedule, "slow", None)
    if slow is None:
        return None
    d, h = schedule.snapshots, slow.slots
    return Layout(tuple(schedule.levels), (0,) * d + (1,) * h, tuple(range(d)) + tuple(range(h)), d)


# ----------------------------------------------------------------------------- statistics


@dataclasses.dataclass
class OffloadStats:
    """Transfers to and from host stores since the last reset, per schedule level index.

    Attributes:
        writes, reads: snapshots stored and restored (one per snapshot, whatever the batch).
        bytes_written, bytes_read: their bytes.
        write_seconds, read_seconds: time spent in the transfers (copying, hashing, file I/O).
        open_stores: stores open now (runs whose snapshots await their reverse sweep).
        held_bytes: bytes the open stores hold now (in RAM or in their files).
        device_writes, device_reads: device-slot stores and restores, counted only while
            counting is switched on (``count_device=True``; for tests).

    Example: ``retrograde.loops.offload_stats(reset=True)`` before a gradient, then
    ``offload_stats().writes`` is ``{1: 12, 2: 3}`` for 12 host and 3 disk writes.
    """

    writes: dict = dataclasses.field(default_factory=dict)
    reads: dict = dataclasses.field(default_factory=dict)
    bytes_written: dict = dataclasses.field(default_factory=dict)
    bytes_read: dict = dataclasses.field(default_factory=dict)
    write_seconds: dict = dataclasses.field(default_factory=dict)
    read_seconds: dict = dataclasses.field(default_factory=dict)
    device_writes: dict = dataclasses.field(default_factory=dict)
    device_reads: dict = dataclasses.field(default_factory=dict)
    open_stores: int = 0
    held_bytes: int = 0


_LOCK = threading.RLock()
_STATS = OffloadStats()
_RUNS: dict[int, _Run] = {}
_IDS = itertools.count(1)
#: Count device-slot stores and restores too (a trace-time switch; tests set it).
count_device = False


def _add(table: dict, level: int, value) -> None:
    table[level] = table.get(level, 0) + value


def offload_stats(reset: bool = False) -> OffloadStats:
    """A copy of the transfer counters (see :class:`OffloadStats`); ``reset`` zeroes them after.

    Example:
        >>> import retrograde
        >>> retrograde.loops.offload_stats(reset=True).open_stores
        0
    """
    with _LOCK:
        copies: dict[str, Any] = {
            f.name: dict(getattr(_STATS, f.name))
            for f in dataclasses.fields(_STATS)
            if f.type == "dict"
        }
        out = dataclasses.replace(_STATS, **copies)
        out.open_stores = len(_RUNS)
        out.held_bytes = sum(run.nbytes for run in _RUNS.values())
        if reset:
            for f in dataclasses.fields(_STATS):
                if f.type == "dict":
                    getattr(_STATS, f.name).clear()
    return out


def release_with(handle) -> None:
    """Release the store behind ``handle`` (a concrete int32 array) when that array is garbage
    collected, unless the reverse sweep that reads it released it first."""
    weakref.finalize(handle, _close, int(np.asarray(handle)))


def release_offloaded() -> int:
    """Release every open store (their RAM and temporary files); returns how many were open.

    Stores are released by the reverse sweeps that read them. Call this after a compiled program
    was aborted by an exception (its stores stay open otherwise, until the process exits): a
    reverse sweep that still needed one of them then raises :class:`SnapshotError`.
    """
    with _LOCK:
        runs = list(_RUNS.values())
        _RUNS.clear()
    for run in runs:
        run.close()
    return len(runs)


# ----------------------------------------------------------------------------- stores


class _Run:
    """The stores of one run of a forward sweep, one per offloaded level (a store of
    :mod:`retrograde._store`, as the host driver's), and the snapshot held in each slot."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self.stores: dict[int, Store] = {}
        self.held: dict[tuple[int, int], Snapshot] = {}  # (level, slot) -> its snapshot

    def level(self, j):
        """``(level, slot, store)`` of offloaded slot ``j``."""
        k = self.layout.n_device + j
        lvl = self.layout.level[k]
        store = self.stores.get(lvl)
        if store is None:
            spec = self.layout.levels[lvl]
            label = f"level {lvl} ({spec.name or spec.storage})"
            store = self.stores[lvl] = level_storage(spec, unnamed=True).open(label)
        return lvl, self.layout.slot[k], store

    def write(self, j, step, arrays) -> int:
        """Store ``arrays`` (the state ``u_step``) in offloaded slot ``j``; its level. The slot
        reads as empty until the write completes."""
        lvl, slot, store = self.level(j)
        old = self.held.pop((lvl, slot), None)
        if old is not None:
            store.free(old)
        self.held[(lvl, slot)] = store.put(step, arrays)
        return lvl

    def read(self, j):
        """``(level, step, arrays)`` held in offloaded slot ``j`` (``step`` ``None``: empty); the
        arrays are read-only (they are copied to the device)."""
        lvl, slot, store = self.level(j)
        snap = self.held.get((lvl, slot))
        if snap is None:
            return lvl, None, None
        return lvl, snap.step, store.get(snap, copy=False)

    @property
    def nbytes(self):
        return sum(s.nbytes for s in self.stores.values())

    def close(self):
        stores = list(self.stores.values())
        self.stores.clear()
        self.held.clear()
        for store in stores:
            store.close()


def _run_of(handle, what: str) -> _Run:
    with _LOCK:
        run = _RUNS.get(int(handle))
    if run is None:
        raise SnapshotError(
            f"retrograde: cannot {what}: the host snapshots of this loop's forward sweep were "
            "released, because the reverse sweep that reads them already ran (a function "
            "returned by jax.vjp or jax.linearize, when its loop keeps snapshots on the host or "
            "on disk, reverses once; call jax.vjp again), or by release_offloaded()."
        )
    return run


def _open(layout: Layout) -> int:
    global _IDS
    run = _Run(layout)
    with _LOCK:
        handle = next(_IDS)
        if handle >= 2**31 - 1:  # int32 handles: start over (older stores are long released)
            _IDS = itertools.count(1)
            handle = next(_IDS)
        _RUNS[handle] = run
    return handle


def _close(handle: int) -> None:
    with _LOCK:
        run = _RUNS.pop(int(handle), None)
    if run is not None:
        run.close()


def _put(handle, j, step, arrays) -> None:
    run = _run_of(handle, f"store the snapshot of step {int(step)}")
    start = time.perf_counter()
    try:
        lvl = run.write(int(j), int(step), arrays)
    except BaseException:
        _close(handle)  # the run cannot go on: release what it holds now
        raise
    seconds = time.perf_counter() - start
    with _LOCK:
        _add(_STATS.writes, lvl, 1)
        _add(_STATS.bytes_written, lvl, sum(a.nbytes for a in arrays))
        _add(_STATS.write_seconds, lvl, seconds)


def _get(handle, j, step, avals):
    step = int(step)
    run = _run_of(handle, f"restore the snapshot of step {step}")
    start = time.perf_counter()
    try:
        lvl, held, arrays = run.read(int(j))
    except BaseException:
        _close(handle)
        raise
    if held != step:
        _close(handle)
        where = run.layout.describe(int(j))
        raise SnapshotError(
            f"retrograde: the snapshot of step {step} is missing from {where}: "
            + ("the slot is empty." if held is None else f"it holds step {held}.")
        )
    for i, (a, aval) in enumerate(zip(arrays, avals)):
        if a.shape != aval.shape or a.dtype != aval.dtype:
            _close(handle)
            raise SnapshotError(
                f"retrograde: the snapshot of step {step} in {run.layout.describe(int(j))} has "
                f"leaf {i} of {a.dtype}{list(a.shape)}, but the reverse sweep expects "
                f"{aval.dtype}{list(aval.shape)}."
            )
    seconds = time.perf_counter() - start
    with _LOCK:
        _add(_STATS.reads, lvl, 1)
        _add(_STATS.bytes_read, lvl, sum(a.nbytes for a in arrays))
        _add(_STATS.read_seconds, lvl, seconds)
    return tuple(arrays)


def _count_device(kind: str, layout: Layout, k) -> None:
    table = _STATS.device_writes if kind == "write" else _STATS.device_reads
    with _LOCK:
        _add(table, layout.level[int(k)], 1)


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
    _put(h, j, n, u)
    return ()


def _close_results(h) -> tuple[()]:
    _close(h)
    return ()


mlir.register_lowering(
    open_p, _lowering(lambda avals, layout: lambda: (np.int32(_open(layout)),)), cacheable=False
)
mlir.register_lowering(
    put_p,
    _lowering(lambda avals, layout: _put_results, lambda n_args: 3 + (n_args - 3) // 2),
    cacheable=False,
)
mlir.register_lowering(
    get_p,
    _lowering(lambda avals, layout: lambda h, j, n: _get(h, j, n, avals), lambda n_args: 3),
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
            jax.debug.callback(lambda k: _count_device(kind, layout, k), k, ordered=False)

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
