"""The binomial reversal, generated inside a compiled program as a stream of macro-actions.

The in-graph twin of :func:`retrograde.schedules.reverse_held`: reverse the segments
``[p_0, p_1), ..., [p_{m-1}, N)`` between held snapshots, last first, each by Revolve with its
own slot and every free slot at the time (a segment's slot is freed once it is done). State:
a few int32 registers, a task stack of ``S + 2`` entries and the free list (``O(S)`` integers for
``S`` slots), so nothing here grows with ``N``. Each int32 vector has at most ``S + 2`` entries,
so up to ``S = MAX_SMALL_SLOTS`` every buffer is within ``SMALL_BUFFER_BYTES`` (:mod:`._xla_cpu`)
and a loop body of the machine's step runs in order (docs/performance.md, "The XLA CPU executor
rule").

Each :func:`step` emits one :class:`Action`:

- ``MOVE``: restore slot ``restore`` (if ``>= 0``), advance from ``start`` to ``stop``, then store
  the state in slot ``store`` (if ``>= 0``); no step is recorded.
- ``LEAF``: reverse ``[start, stop)`` at once, recording every step: restore slot ``restore``
  (if ``>= 0``); for ``n = first .. stop - 2`` store ``u_n`` in slot ``idx[n - start]`` and
  advance; then record ``stop - 1`` from the state at hand if ``fresh`` (else from its slot
  ``idx[stop - 1 - start]``), and the others down to ``start`` from slots ``idx``
  (:func:`leaf_slots`). A leaf is a task that Revolve reverses with no step run plainly twice
  (``n <= s + 1``, every state stored), a single step, or the run of one-step segments that ends
  the loop (``first = stop - 1``: their states are held already).
- ``DATA``: reverse ``[start, stop)`` from the steps' data (mixed checkpointing): restore slot
  ``restore`` (if ``>= 0``); evaluate steps ``start .. stop - 2`` keeping each one's data
  (:mod:`._residuals`) in the leaf's data row ``n - start``; record ``stop - 1`` from the state at
  hand; then reverse the others, last first, each from its data row, with no evaluation
  (``first = stop - 1``: no state is stored; ``fresh = 1``, or ``_tables.LINEARIZED`` when the
  forward sweep kept the data already: no evaluation but the record). ``store``: the leaf's level,
  ``S - s`` for a task of ``s`` slots (``S`` for a segment with no slot). When the slots are
  taken lowest first and every split stores (as from :func:`init` after stores in slots ``0,
  1, ...``), slots ``0 .. level - 1`` are held and every slot from ``level`` on is free while
  the leaf runs: its data may share their memory (:mod:`._pool`).
- ``DONE``: nothing is left.

With ``with_pairs`` (static), a two-step task also takes along the run of two-step segments
directly below it on the stack (``[a, a + 2)`` with ``u_a`` held), which the Online rule places
where a loop ends, as far as the free slots allow (``w - 1`` of them for ``w`` segments):

- ``PAIRS``: reverse ``[start, stop)``, ``w = (stop - start) / 2`` two-step segments, at once:
  for each, lowest first, restore ``u_a`` from its slot and advance one step, storing ``u_{a+1}``
  in a free slot (the last one stays at hand); then record every step, as a leaf does, from the
  slots ``idx`` (:func:`leaf_slots`). The evaluations of ``w`` leaves in one macro-action, and
  the free slots grow as the segments are done, so a run of ``m`` takes ``O(log m)`` of them.

So a reversal's per-step work runs in plain loops (a leaf's forward and its records); the
machine runs once per split, per leaf and per recomputation of a one-slot segment.

Which segments are leaves, of which kind, and where a segment is split is a :class:`Rule`:
:data:`REVOLVE` (every segment of ``n <= s + 1`` steps a ``LEAF``, the largest optimal split
otherwise) unless the schedule's class registered another (:func:`._tables.register_rule`), e.g.
one whose short segments are ``DATA`` leaves (mixed checkpointing). Segments with one slot are
recomputed step by step whatever the rule.

Integers are int32; binomials saturate at ``2**24`` (the step count must stay below that).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax, tree_util

from ..schedules import largest_split as _py_largest_split
from ._binomial import largest_split

i32 = jnp.int32

MOVE, LEAF, DONE, PAIRS, DATA = 0, 1, 2, 3, 4
# Phases: the trailing leaf, take a task, work on it, recompute a one-slot segment step by step,
# record the last step of a split whose right part is one step, done.
P_TRAIL, P_POP, P_TASK, P_S1, P_LAST, P_DONE = 0, 1, 2, 3, 4, 5
# Leaf slot kinds: the task's own slot, then free slots; a window of held slots; or two-step
# segments, their held slots interleaved with free ones.
L_FREE, L_HELD, L_PAIRS = 0, 1, 2

# The scalar registers travel packed in one int32 vector: a loop carrying the machine copies and
# selects one small array per step instead of a dozen scalars (each its own XLA thunk).
REGISTERS = (
    "a",
    "b",
    "s",
    "slot_a",
    "at_hand",
    "k",
    "adv",
    "phase",
    "sp",
    "fp",
    "lkind",
    "lbase",
    "taken",
)
_FLAGS = ("at_hand", "adv")


class Rule(NamedTuple):
    """How the machine reverses a task: a segment of ``n`` steps with ``s`` slots, its own (which
    holds its start) and the free ones. Each function comes twice: in the graph, on int32
    scalars, and in Python (the twin that writes the machine's actions into a table when
    tracing, :func:`._tables._machine_rows`), which must agree everywhere.

    Attributes:
        leaf: ``(n, s, s_max) -> kind``: ``LEAF`` (store every state, ``n <= s + 1`` needed),
            ``DATA`` (reverse from data, ``n - 1 <= data_rows``) or ``-1`` (not a leaf: split
            it, or with ``s == 1`` recompute it step by step). ``s_max``: the most slots a task
            holds, the machine's slots plus one (static); ``s_max - 1 - s`` is the task's level
            when slots are taken lowest first.
        split: ``(n, s, s_max) -> j``: the first split of a task that is not a leaf, ``s >= 2``
            (``s >= 1`` with ``split_one_slot``), ``1 <= j < n``; ``None`` for a rule that runs
            only as rows (its reversal must fit in ``_tables.ROW_LIMIT`` of them).
        py_leaf, py_split: the same in Python.
        state_slots: ``slots -> S``: the slots for states, of the ``slots`` the schedule may
            hold on its first level (``max_slots``, data included).
        data_rows: ``S -> rows``: the most data rows a ``DATA`` leaf fills (static).
        split_one_slot: whether a task with one slot (its own) is split by ``split(n, 1,
            s_max)`` (static): restore, advance to ``m``, reverse ``[m, b)`` at once as a leaf
            with no slot (one step recorded, or ``DATA``), then go on with ``[a, m)``.
            Otherwise (Revolve) it is recomputed step by step.
        relinearized: ``(stores, N) -> steps``: where the schedule's first sweep ends by
            linearizing a run (its rightmost leaf, from the last store), the run's length, else
            ``0`` (``stores``: ``binomial_stores(N)``): a forward sweep that keeps their data
            writes them (``_tables.Tables.lead``), one that keeps states only has the reversal
            linearize them again.
        pooled: ``level -> rows``: the most data rows of a ``DATA`` leaf at ``level``, for a
            rule whose slots are taken lowest first (every slot from a leaf's level on is free
            while it runs), so that its data may share the free slots' memory (:mod:`._pool`);
            ``None``: data rows of their own.
    """

    leaf: Callable
    split: Callable | None
    py_leaf: Callable
    py_split: Callable
    state_slots: Callable
    data_rows: Callable
    split_one_slot: bool = False
    relinearized: Callable = lambda stores, n: 0
    pooled: Callable | None = None


REVOLVE = Rule(
    leaf=lambda n, s, s_max: jnp.where(n <= s + 1, LEAF, -1),
    split=largest_split,
    py_leaf=lambda n, s, s_max: LEAF if n <= s + 1 else -1,
    py_split=lambda n, s, s_max: _py_largest_split(n, s),
    state_slots=lambda slots: slots,
    data_rows=lambda n_slots: 0,
)


class Task(NamedTuple):
    """The task stack, one int32 vector per field (entry ``i`` is the ``i``-th task from the
    bottom): reverse ``[a, b)`` from ``u_a`` in ``slot``; when the task is taken off the stack,
    first return ``release`` to the free list (``-1``: nothing), the slot of the segment above it,
    whose reversal is done by then."""

    a: object
    b: object
    slot: object
    release: object


class Action(NamedTuple):
    """One macro-action (int32 scalars); see the module docstring."""

    kind: object
    restore: object
    start: object
    stop: object
    first: object  # LEAF: the first state to store and advance from
    store: object  # MOVE: the slot to store into, or -1; DATA: the leaf's level (see DATA)
    fresh: object  # LEAF: whether u_{stop-1} is the state at hand (else it is in its slot)


def init(n_slots: int, steps, slots, n_held, n_steps, at_hand: bool):
    """The machine reversing ``n_steps`` steps from held snapshots.

    Args:
        n_slots: the schedule's slots ``S`` (static).
        steps: int32[S], the held steps, ascending (the first ``n_held`` valid).
        slots: int32[S], the slot holding each held step.
        n_held: the number of held snapshots ``m`` (traced).
        n_steps: ``N`` (traced).
        at_hand: whether the state at hand is ``u_{N-1}`` (after a forward sweep that stopped
            there; it is then not also held), else nothing is at hand.
    """
    depth = n_slots + 2
    idx = jnp.arange(n_slots, dtype=i32)
    valid = idx < n_held
    # The trailing leaf: u_{N-1} at hand, then held steps down to N - T, one per slot (steps - idx
    # is constant along a run of consecutive steps).
    hand = jnp.asarray(n_steps > 0).astype(i32) if at_hand else i32(0)
    tail = jnp.sum(valid & (steps - idx == n_steps - hand - n_held), dtype=i32)
    trail = tail + hand
    n_seg = n_held - tail  # segments left for the stack
    last_end = n_steps - trail
    # Stack bottom-up: segment 0, 1, ..., n_seg - 1 (taken first); each releases the slot of the
    # one above it.
    is_seg = idx < n_seg
    ends = jnp.where(idx + 1 < n_seg, jnp.roll(steps, -1), last_end)
    release = jnp.where(idx + 1 < n_seg, jnp.roll(slots, -1), -1)
    pad = jnp.zeros((depth - n_slots,), i32)
    stack = Task(
        *(jnp.concatenate([jnp.where(is_seg, v, 0), pad]) for v in (steps, ends, slots, release))
    )
    # Free slots: every slot but those of the stacked segments.
    used = jnp.zeros((n_slots,), bool).at[jnp.where(is_seg, slots, n_slots)].set(True, mode="drop")
    # Unused first, highest first: a split takes the lowest free slot (the top of the list).
    order = argsort(jnp.where(used, n_slots + idx, n_slots - 1 - idx))
    n_free = n_slots - n_seg
    free = jnp.where(jnp.arange(n_slots, dtype=i32) < n_free, order, 0)
    regs = dict(
        a=last_end,
        b=n_steps,
        s=i32(1),
        slot_a=i32(0),
        at_hand=False,
        adv=False,
        phase=jnp.where(trail > 0, P_TRAIL, P_POP),
        sp=n_seg - 1,
        fp=n_free,
        lkind=i32(L_HELD),
        lbase=n_seg,
        k=hand,
        taken=i32(0),
    )
    return _pack(regs, stack=stack, free=free, held=slots)


def vector(values):
    """int32 scalars as one vector, built as a sum of the scalars times unit vectors: XLA fuses
    that into one kernel, where ``jnp.stack`` compiles to a kernel per scalar and a
    concatenation (each a thunk of the loop body it runs in)."""
    unit = np.eye(len(values), dtype=np.int32)  # constants: nothing for XLA to hoist
    return sum(jnp.asarray(v).astype(i32) * unit[k] for k, v in enumerate(values))


def _pack(regs, **arrays):
    return dict(arrays, regs=vector([regs[k] for k in REGISTERS]))


def _unpack(st):
    regs = {k: st["regs"][i] for i, k in enumerate(REGISTERS)}
    regs.update({k: regs[k] != 0 for k in _FLAGS})
    return regs


def done(st):
    """Whether the reversal is complete."""
    return st["regs"][REGISTERS.index("phase")] == P_DONE


def leaf_slots(st, with_pairs=False):
    """int32[S + 1]: the slot of each state of the leaf just emitted (entry ``i`` holds
    ``u_{start + i}``; the last state's entry is unused when it is at hand). ``with_pairs``
    (static): also for ``PAIRS`` leaves, whose ``2 w`` states take ``2 w - 1 <= S`` slots."""
    r = _unpack(st)
    n_slots = st["free"].shape[0]
    i = jnp.arange(n_slots + 1, dtype=i32)
    fp = r["fp"] - r["taken"]  # the free list as the leaf found it (before its releases)
    own = where(i == 0, r["slot_a"], _take(st["free"], fp - i))
    held = _take(st["held"], r["lbase"] + i)
    out = where(r["lkind"] == L_HELD, held, own)
    if not with_pairs:
        return out
    # PAIRS: segment q from the top (q = 0 the task's own) holds u_a in its slot; u_{a+1} of
    # the p-th from the bottom goes to the free slot fp - 1 - p.
    q, p = r["taken"] - i // 2, i // 2
    seg = _take(st["stack"].slot, r["lbase"] - (q - 1))
    pairs = where(i % 2 == 0, where(q == 0, r["slot_a"], seg), _take(st["free"], fp - 1 - p))
    return where(r["lkind"] == L_PAIRS, pairs, out)


def _action(kind, restore=-1, start=0, stop=0, first=0, store=-1, fresh=False):
    return Action(
        *(jnp.asarray(v).astype(i32) for v in (kind, restore, start, stop, first, store, fresh))
    )


def step(st, with_pairs=False, rule: Rule = REVOLVE):
    """Emit the next action. Returns ``(new_state, action)``. With ``with_pairs`` (static), a
    two-step leaf takes the run of two-step segments below it along, as a ``PAIRS`` leaf (see
    the module docstring). ``rule`` (static): leaves and splits (:class:`Rule`)."""
    r = _unpack(st)
    stack, free = st["stack"], st["free"]
    phase = r["phase"]
    top = _read(stack, r["sp"])

    # Take the next task off the stack; its release returns a slot to the free list, where a
    # split in the same step may take it again.
    frees = (r["sp"] >= 0) & (top.release >= 0)
    fp_pop = r["fp"] + frees.astype(i32)
    popped = dict(
        r,
        a=top.a,
        b=top.b,
        slot_a=top.slot,
        s=fp_pop + 1,
        at_hand=False,
        fp=fp_pop,
        sp=r["sp"] - 1,
        phase=where(r["sp"] < 0, P_DONE, P_TASK),
    )
    popping = phase == P_POP
    regs = select(popping, popped, r)
    free = _write(free, r["fp"], top.release, popping & frees)

    task_out, splits = _task(regs, free, rule)
    new, action = dict(regs, phase=i32(P_DONE)), _action(DONE)
    for k, out in (
        (P_TRAIL, _trail(regs)),
        (P_TASK, task_out),
        (P_S1, _s1_split(regs, free.shape[0]) if rule.split_one_slot else _s1(regs)),
        (P_LAST, _last(regs)),
    ):
        new, action = select(regs["phase"] == k, out, (new, action))
    new = dict(new, taken=i32(0))
    if with_pairs:
        new, action, free = _pairs(regs, new, action, stack, free)
    # A split pushes its left part, which releases the right part's slot when taken.
    pushed = (regs["phase"] == P_TASK) & splits
    entry = Task(regs["a"], action.stop, regs["slot_a"], action.store)
    stack = Task(*(_write(col, regs["sp"] + 1, v, pushed) for col, v in zip(stack, entry)))
    return _pack(new, stack=stack, free=free, held=st["held"]), action


def _pairs(r, new, action, stack, free):
    """Make a two-step leaf taken off the stack (``r``: the registers it was taken with) a
    ``PAIRS`` leaf over the run of two-step segments below it (stack entries ``sp - i``, each
    releasing the slot of the one above), as many as the free slots allow. Returns ``(new,
    action, free)``: the segments taken off the stack and all their slots but the lowest one's
    back in the free list (that one is released when the next task is popped, as for any
    segment)."""
    sp, fp = r["sp"], r["fp"]
    i = jnp.arange(stack.a.shape[0], dtype=i32)
    seg = _take(stack, sp - i)  # each releases the slot of the segment above it
    ok = (sp - i >= 0) & (seg.release >= 0) & (seg.b - seg.a == 2)
    below = jnp.sum(jnp.cumprod(ok.astype(i32)), dtype=i32)
    two = (r["phase"] == P_TASK) & (action.kind == LEAF) & (action.stop - action.start == 2)
    taken = where(two, jnp.minimum(below, fp), 0)  # a free slot for each but the top one
    b = action.stop
    pairs = _action(PAIRS, start=b - 2 * (taken + 1), stop=b, first=b - 1, fresh=True)
    action = select(taken > 0, pairs, action)
    free = free.at[where(i < taken, fp + i, free.shape[0])].set(seg.release, mode="drop")
    new = dict(
        new,
        taken=taken,
        sp=new["sp"] - taken,
        fp=new["fp"] + taken,
        lkind=where(taken > 0, L_PAIRS, new["lkind"]),
        lbase=where(taken > 0, sp, new["lbase"]),
    )
    return new, action, free


def _trail(r):
    """The run of one-step segments that ends the loop: every state held or at hand (``k``);
    record them all."""
    new = dict(r, phase=i32(P_POP), lkind=i32(L_HELD), k=i32(0))
    return new, _action(LEAF, start=r["a"], stop=r["b"], first=r["b"] - 1, fresh=r["k"])


def _task(r, free, rule: Rule):
    a, b, s, slot_a, at_hand = r["a"], r["b"], r["s"], r["slot_a"], r["at_hand"]
    n = b - a
    restore = where(at_hand, -1, slot_a)
    n_slots = free.shape[0]
    s_max = n_slots + 1  # a task holds at most every slot plus its own
    kind = rule.leaf(n, s, s_max)
    leafy = kind >= 0  # Revolve's rule: every state stored, n <= s + 1 (one step included)
    one_slot = (s == 1) & ~leafy
    if rule.split_one_slot:  # one slot: split too, the right part a leaf with no slot (P_S1)
        trivial = leafy | (r["phase"] != P_TASK)
        j = lax.cond(trivial, lambda: i32(1), lambda: rule.split(n, s, s_max))
    else:  # one slot: recompute step by step (P_S1)
        trivial = leafy | one_slot | (r["phase"] != P_TASK)
        j = lax.cond(trivial, lambda: i32(1), lambda: rule.split(n, jnp.maximum(s, 2), s_max))
    m = a + j
    s1_stop = m if rule.split_one_slot else b - 1
    last = m == b - 1  # the right part is one step: advance, then record it (no snapshot)
    new_slot = _read(free, r["fp"] - 1)
    splits = ~leafy & ~one_slot & ~last
    # A one-step leaf whose state is in its slot records from there (no restore).
    leaf = _action(
        LEAF,
        restore=where(n == 1, -1, restore),
        start=a,
        stop=b,
        first=a,
        fresh=(n > 1) | at_hand,
    )
    data = _action(
        DATA, restore=restore, start=a, stop=b, first=b - 1, store=n_slots - s, fresh=True
    )
    leaf = select(kind == DATA, data, leaf)
    move = _action(
        MOVE,
        restore=restore,
        start=a,
        stop=where(one_slot, s1_stop, m),
        store=where(splits, new_slot, -1),
    )
    new = dict(
        r,
        phase=where(leafy, P_POP, where(one_slot, P_S1, where(last, P_LAST, P_TASK))),
        k=where(one_slot, s1_stop, where(last, m, r["k"])),
        adv=one_slot,
        at_hand=splits,
        a=where(splits, m, a),
        s=where(splits, s - 1, s),
        slot_a=where(splits, new_slot, slot_a),
        fp=where(splits, r["fp"] - 1, r["fp"]),
        sp=where(splits, r["sp"] + 1, r["sp"]),
        lkind=i32(L_FREE),
    )
    return (new, select(leafy, leaf, move)), splits


def _s1(r):
    """A segment with one slot: for k = b - 1 down to a, restore, advance to k, record k."""
    a, k = r["a"], r["k"]
    move = _action(MOVE, restore=where(r["at_hand"], -1, r["slot_a"]), start=a, stop=k)
    leaf = _action(LEAF, start=k, stop=k + 1, first=k, fresh=True)
    recorded = r["adv"]
    new = dict(
        r,
        at_hand=False,
        adv=~recorded,
        k=where(recorded, k - 1, k),
        phase=where(recorded & (k - 1 < a), P_POP, P_S1),
        lkind=i32(L_FREE),
    )
    return new, select(recorded, leaf, move)


def _s1_split(r, n_slots):
    """A segment with one slot, split (:attr:`Rule.split_one_slot`): after the move to ``k``,
    reverse ``[k, b)`` at once from the state at hand (one step recorded, or a ``DATA`` leaf
    with no slot: level ``S``), then go on with ``[a, k)``."""
    k, b = r["k"], r["b"]
    one = _action(LEAF, start=k, stop=k + 1, first=k, fresh=True)
    data = _action(DATA, start=k, stop=b, first=b - 1, store=n_slots, fresh=True)
    new = dict(r, b=k, at_hand=False, adv=False, phase=i32(P_TASK), lkind=i32(L_FREE))
    return new, select(b - k == 1, one, data)


def _last(r):
    """Record the one-step right part of a split, then go on with the left part."""
    k = r["k"]
    new = dict(r, b=k, at_hand=False, phase=i32(P_TASK), lkind=i32(L_FREE))
    return new, _action(LEAF, start=k, stop=k + 1, first=k, fresh=True)


def argsort(x):
    """The stable argsort of a vector, int32 (``jnp.argsort`` sorts int64 indices under x64:
    buffers twice as large, over ``SMALL_BUFFER_BYTES`` from 65 entries)."""
    return lax.sort((x, lax.iota(i32, x.shape[0])), num_keys=1, is_stable=True)[1]


def _read(x, i):
    """``x[i]`` with ``i`` clamped into range (``x`` an array or a :class:`Task`)."""
    return tree_util.tree_map(
        lambda v: lax.dynamic_index_in_dim(v, jnp.clip(i, 0, v.shape[0] - 1), 0, keepdims=False), x
    )


def _take(x, i):
    """``x[i]`` for an index vector ``i``, clamped into range (``x`` an array or a
    :class:`Task`)."""
    return tree_util.tree_map(lambda v: v[jnp.clip(i, 0, v.shape[0] - 1)], x)


def _write(x, i, v, pred):
    """``x`` with ``x[i] = v`` where ``pred`` (``i`` clamped; in place, no copy of ``x``)."""
    i = jnp.clip(i, 0, x.shape[0] - 1)
    old = lax.dynamic_index_in_dim(x, i, 0, keepdims=False)
    return lax.dynamic_update_index_in_dim(x, where(pred, v, old), i, 0)


def select(pred, a, b):
    """``a`` where ``pred`` else ``b``, leaf by leaf (pytrees of the same structure); a leaf that
    is the same value on both sides (a register a phase leaves as it is) is not selected."""
    return tree_util.tree_map(lambda x, y: where(pred, x, y), a, b)


def where(pred, x, y):
    """``x`` where ``pred`` else ``y``, for the machine's int32 and bool values: one
    ``lax.select`` where both sides have one type and shape (no ``jnp.where`` wrapper, no
    promotion), nothing where they are the same value (a register a phase leaves as it is)."""
    if x is y:
        return x
    x, y = (v if hasattr(v, "dtype") else np.asarray(v, _PY_TYPES[type(v)]) for v in (x, y))
    if x.dtype == y.dtype and x.shape == y.shape and np.shape(pred) in ((), x.shape):
        return lax.select(pred, x, y)
    return jnp.where(pred, x, y)


_PY_TYPES = {int: np.int32, bool: np.bool_}
