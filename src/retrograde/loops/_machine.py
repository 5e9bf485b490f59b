"""Binomial reversal generated inside a compiled program, for step counts known only at run time.

:func:`revolve_rows` is the in-graph twin of :func:`retrograde.schedules._revolve._reverse`: a state
machine whose every call emits the next action ``(opcode, a, b)`` (opcodes of
:mod:`retrograde.loops._plan`, plus ``NOP``) of the optimal reversal of the segments between held
snapshots, using a fixed-size task stack (``O(s)`` integers). Each segment is reversed, right to
left, with its own snapshot plus every free slot at the time; a segment's snapshot is freed once
it is done, so earlier segments get more slots.

Integers are int32; binomials saturate at ``2**24`` (the step count must stay below that).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax, tree_util

from ._plan import ADVANCE, RECORD, RESTORE, STORE

NOP = 4
CAP = 1 << 24
# Task kinds on the stack.
T_SEGMENT, T_FREE = 0, 1
# Phases.
P_POP, P_TASK, P_STORE, P_S1, P_DONE = 0, 1, 2, 3, 4

i32 = jnp.int32


def _next_beta(b, s, q, minimum=jnp.minimum):
    """beta(s, q) from beta(s, q - 1) = b, exactly, saturating at CAP (``minimum=min`` for
    Python integers)."""
    b = minimum(b, CAP)
    return minimum((b // q) * (s + q) + ((b % q) * (s + q)) // q, CAP)


def repetition(n, s):
    """r(n, s): the smallest r with beta(s, r) >= n; and beta(s, r)."""

    def cond(st):
        r, b = st
        return b < n

    def body(st):
        r, b = st
        r = r + 1
        return r, _next_beta(b, s, r)

    return lax.while_loop(cond, body, (i32(0), i32(1)))


@functools.cache
def _beta_table(s_max: int, r_max: int):
    """``beta(s, r)`` for ``s = 0 .. s_max`` (rows) and ``r = 0 .. r_max`` (columns), by the same
    saturating recurrence as the loop (built at trace time, in NumPy)."""
    table = np.ones((s_max + 1, r_max + 1), np.int64)
    for s in range(s_max + 1):
        for r in range(1, r_max + 1):
            table[s, r] = _next_beta(int(table[s, r - 1]), s, r, minimum=min)
    table.flags.writeable = False
    return table


def _table_depth(s_max: int) -> int:
    """How many repetition numbers the tables hold for slot counts up to ``s_max``: enough for
    every segment of a run of 20000 steps with ``Online(s)``, ``s >= 4`` (few runs need more;
    those fall back to the loops)."""
    return 16 if s_max >= 8 else 48


def split(n, s, s_max: int | None = None):
    """In-graph :func:`retrograde.schedules._revolve.revolve_split` (returns j only).

    With ``s_max`` (static, ``s <= s_max``): read off a trace-time table of ``beta(s, q)`` for
    ``q`` up to ``_table_depth(s_max)``: every candidate ``q`` at once, no loop; the loops below
    run only when the segment needs a larger ``q``."""
    if s_max is None:
        return _split_loop(n, s)
    q_max = _table_depth(s_max)
    table = jnp.asarray(_beta_table(s_max, q_max + 1).astype(np.int32))
    row = lax.dynamic_index_in_dim(table, jnp.clip(s, 0, s_max), 0, keepdims=False)
    row1 = lax.dynamic_index_in_dim(table, jnp.clip(s - 1, 0, s_max), 0, keepdims=False)
    q = jnp.arange(q_max + 1, dtype=i32)
    b_q = row[: q_max + 1]  # beta(s, q)
    b_prev = jnp.concatenate([jnp.zeros((1,), i32), row[:q_max]])  # beta(s, q - 1)
    b_right = row1[1:]  # beta(s - 1, q + 1)
    r = jnp.sum(b_q < n, dtype=i32)  # r(n, s), when <= q_max
    lo = jnp.maximum(jnp.maximum(1, b_prev), n - b_right)
    ok = (q >= jnp.maximum(r - 1, 0)) & (lo <= jnp.minimum(n - 1, b_q - 1))
    j = jnp.sum(jnp.where(q == jnp.argmax(ok), lo, 0), dtype=i32)
    return lax.cond(jnp.any(ok) & (r <= q_max), lambda: j, lambda: _split_loop(n, s))


def _split_loop(n, s):
    r, _ = repetition(n, s)
    q0 = jnp.maximum(r - 1, 0)

    # beta(s, q0 - 1), beta(s, q0), beta(s - 1, q0 + 1) by running the recurrences from 0.
    def init_body(q, st):
        bp, bq, br = st
        qq = q + 1
        return bq, _next_beta(bq, s, qq), _next_beta(br, s - 1, qq + 1)

    # At q = 0: beta(s, -1) = 0, beta(s, 0) = 1, beta(s - 1, 1) = s.
    bp, bq, br = lax.fori_loop(0, q0, init_body, (i32(0), i32(1), jnp.minimum(s, CAP)))

    def cond(st):
        q, bp, bq, br = st
        lo = jnp.maximum(jnp.maximum(1, bp), n - br)
        return lo > jnp.minimum(n - 1, bq - 1)

    def body(st):
        q, bp, bq, br = st
        q = q + 1
        return q, bq, _next_beta(bq, s, q), _next_beta(br, s - 1, q + 1)

    q, bp, bq, br = lax.while_loop(cond, body, (q0, bp, bq, br))
    return jnp.maximum(jnp.maximum(1, bp), n - br)


def init_state(n_slots: int, segments_start, segment_slots, n_segments, n_steps, first_at_hand):
    """Machine state for reversing ``[p_0, p_1), ..., [p_{m-1}, n_steps)``.

    Args:
        n_slots: total slots ``S`` (static).
        segments_start: int32[S], the held snapshot steps ``p_i`` (sorted; first ``m`` valid).
        segment_slots: int32[S], the slot holding ``p_i``.
        n_segments: ``m`` (traced int).
        n_steps: ``N`` (traced int).
        first_at_hand: whether ``u_{p_{m-1}}`` is already the current state.
    """
    depth = 2 * n_slots + 4
    stack = jnp.zeros((depth, 4), i32)  # kind, a, b, slot
    idx = jnp.arange(n_slots, dtype=i32)
    ends = jnp.where(idx + 1 < n_segments, jnp.roll(segments_start, -1), n_steps)
    # Stack bottom-up: seg_0, free(p_1), seg_1, free(p_2), ..., seg_{m-1} (popped first).
    # Entry 2i is segment i, entry 2i - 1 frees p_i (i >= 1).
    seg_rows = jnp.stack(
        [jnp.full_like(idx, T_SEGMENT), segments_start, ends, segment_slots], axis=1
    )
    free_rows = jnp.stack(
        [jnp.full_like(idx, T_FREE), segments_start, segments_start, segment_slots], axis=1
    )
    valid = idx < n_segments
    stack = stack.at[2 * idx].set(jnp.where(valid[:, None], seg_rows, 0))
    stack = stack.at[jnp.maximum(2 * idx - 1, 0)].set(
        jnp.where(((idx >= 1) & valid)[:, None], free_rows, stack[jnp.maximum(2 * idx - 1, 0)])
    )
    # Free slots: those not holding a segment start.
    used = jnp.zeros((n_slots,), bool).at[jnp.where(valid, segment_slots, n_slots)].set(
        True, mode="drop"
    )
    order = jnp.argsort(used, stable=True)  # unused first
    n_free = n_slots - n_segments
    free = jnp.where(jnp.arange(n_slots) < n_free, order, 0).astype(i32)
    regs = dict(
        a=i32(0), b=i32(0), s=i32(1), slot_a=i32(0), at_hand=jnp.bool_(False), k=i32(0),
        adv=jnp.bool_(False), m=i32(0),
        phase=i32(P_POP), sp=(2 * n_segments - 2).astype(i32),
        stack=stack, free=free, fp=n_free.astype(i32),
        first=jnp.asarray(first_at_hand, bool),
    )
    return _pack(regs)


# The scalar registers travel packed in one int32 vector: a loop carrying the machine then copies
# and selects one small array per action instead of a dozen scalars (each its own XLA thunk).
REGISTERS = ("a", "b", "s", "slot_a", "at_hand", "k", "adv", "m", "phase", "sp", "fp", "first")
_FLAGS = ("at_hand", "adv", "first")


def _pack(st):
    regs = jnp.stack([jnp.asarray(st[k]).astype(i32) for k in REGISTERS])
    return dict(regs=regs, stack=st["stack"], free=st["free"])


def _unpack(st):
    regs = {k: st["regs"][i] for i, k in enumerate(REGISTERS)}
    regs.update({k: regs[k] != 0 for k in _FLAGS})
    return dict(regs, stack=st["stack"], free=st["free"])


def phase(st):
    """The machine's phase (``P_DONE`` once the reversal is complete)."""
    return st["regs"][REGISTERS.index("phase")]


def step(st):
    """Emit one action. Returns ``(new_state, (op, a, b))``; ``op = NOP`` when nothing to do.

    ``(RECORD, a, b)`` records step ``a`` from the state at hand (``b == 0``) or from slot
    ``b - 1`` (a restore and a record in one action)."""
    st, action = _step(_unpack(st))
    return _pack(st), action


def _step(st):
    phase = st["phase"]
    top = _read(st["stack"], st["sp"])  # the task ``pop`` takes
    below = _read(st["stack"], st["sp"] - 1)  # the segment under a slot release
    top_frees = (st["sp"] >= 0) & (top[0] == T_FREE)  # ``pop`` returns a slot to the pool
    last_free = _read(st["free"], st["fp"] - 1)  # the slot ``store`` takes
    store_last = st["m"] == st["b"] - 1  # ``store``'s right part is one step: nothing pushed

    def pop(st):
        """The registers after taking the next task off the stack (no action of its own)."""
        # A slot release is always directly above a segment task (both are pushed together, and
        # ``init_state`` lays them so): the release and that segment are popped in one step.
        sp = st["sp"]
        done = sp < 0
        task = jnp.where(top_frees, below, top)
        kind, a, b, slot = task[0], task[1], task[2], task[3]
        # A freed slot goes back to the pool (written by ``step``).
        fp = st["fp"] + top_frees.astype(i32)
        # A segment task takes every free slot plus its own.
        seg = (kind == T_SEGMENT) & ~done & (~top_frees | (sp >= 1))
        sp = sp - jnp.where(done, 0, jnp.where(top_frees, 2, 1))
        at_hand = st["first"]
        new = dict(
            st, fp=fp, sp=sp,
            phase=jnp.where(seg, P_TASK, jnp.where(sp < 0, P_DONE, P_POP)).astype(i32),
            a=jnp.where(seg, a, st["a"]), b=jnp.where(seg, b, st["b"]),
            slot_a=jnp.where(seg, slot, st["slot_a"]),
            s=jnp.where(seg, fp + 1, st["s"]),
            at_hand=jnp.where(seg, at_hand, st["at_hand"]),
            first=jnp.where(seg, False, st["first"]),
        )
        return new

    def task(st):
        a, b, s = st["a"], st["b"], st["s"]
        n = b - a
        at_hand = st["at_hand"]
        restore = ~at_hand
        one = n == 1
        s1 = (s == 1) & ~one
        trivial = restore | one | s1 | (st["phase"] != P_TASK)
        s_max = st["free"].shape[0] + 1  # a task holds at most every slot, plus one
        j = lax.cond(trivial, lambda: i32(1), lambda: split(n, jnp.maximum(s, 2), s_max))
        m = a + j
        # A one-step task whose state is in a slot records it from there in one action
        # (RECORD with b = slot + 1) instead of a RESTORE followed by a RECORD.
        restore = restore & ~one
        op = jnp.where(
            restore & ~s1, RESTORE, jnp.where(one, RECORD, jnp.where(s1, NOP, ADVANCE))
        )
        from_slot = jnp.where(at_hand, 0, st["slot_a"] + 1)
        arg_b = jnp.where(
            op == RESTORE, st["slot_a"],
            jnp.where(op == ADVANCE, m, jnp.where(op == RECORD, from_slot, 0)),
        )
        phase = jnp.where(
            restore & ~s1, P_TASK,
            jnp.where(one, P_POP, jnp.where(s1, P_S1, P_STORE)),
        )
        new = dict(
            st, phase=phase.astype(i32), at_hand=at_hand | (restore & ~s1), m=m,
            k=jnp.where(s1, b - 1, st["k"]), adv=jnp.bool_(False),
        )
        return new, (op.astype(i32), a, arg_b.astype(i32))

    def store(st):
        # The right part is one step: record it without a snapshot (as the Python generator).
        return _select(store_last, record_last(st), store_new(st))

    def record_last(st):
        new = dict(st, b=st["m"], at_hand=jnp.bool_(False), phase=i32(P_TASK))
        return new, (i32(RECORD), st["m"], i32(0))

    def store_new(st):
        slot = last_free
        fp = st["fp"] - 1
        sp = st["sp"]
        # Pushes the right part and the release of its slot (written by ``step``); the left part
        # is pushed with at_hand False (first=False at pop time).
        new = dict(
            st, fp=fp, sp=sp + 2, a=st["m"], s=st["s"] - 1, slot_a=slot,
            at_hand=jnp.bool_(True), phase=i32(P_TASK),
        )
        return new, (i32(STORE), st["m"], slot)

    def s1(st):
        a, k = st["a"], st["k"]
        at_hand, adv = st["at_hand"], st["adv"]
        restore = ~at_hand & ~adv
        advance = ~restore & ~adv & (k > a)
        record = ~restore & ~advance
        op = jnp.where(restore, RESTORE, jnp.where(advance, ADVANCE, RECORD))
        arg_a = jnp.where(record, k, a)
        arg_b = jnp.where(restore, st["slot_a"], jnp.where(advance, k, 0))
        k_next = jnp.where(record, k - 1, k)
        new = dict(
            st,
            at_hand=jnp.where(restore, True, jnp.where(record, False, at_hand)),
            adv=jnp.where(advance, True, jnp.where(record, False, adv)),
            k=k_next,
            phase=jnp.where(record & (k_next < a), P_POP, P_S1).astype(i32),
        )
        return new, (op.astype(i32), arg_a, arg_b.astype(i32))

    def done(st):
        return st, (i32(NOP), i32(0), i32(0))

    # Every phase is evaluated and the results selected, without a conditional: the machine runs
    # once per action, and a conditional would copy the whole state out of its branch each time.
    # (Only ``task``'s ``split`` loop runs under a cond, and only in its own phase.)
    # The stack and the free list are not selected (a full copy per action) but written in place,
    # at one guarded index each: the slot that ``pop`` frees, the two rows ``store`` pushes.
    # A pop emits nothing of its own: the segment it takes is started in the same step (the
    # action phases then run from the popped registers).
    regs = {k: v for k, v in st.items() if k not in ("stack", "free")}
    popped = pop(st)
    regs = _select(phase == P_POP, {k: popped[k] for k in regs}, regs)
    start = dict(regs, stack=st["stack"], free=st["free"])
    out = done(regs)
    for k, phase_fn in ((P_S1, s1), (P_STORE, store), (P_TASK, task)):
        new, action = phase_fn(start)
        out = _select(regs["phase"] == k, ({k2: new[k2] for k2 in regs}, action), out)
    regs, action = out
    sp, fp = st["sp"], st["fp"]
    free = _write(st["free"], fp, top[3], (phase == P_POP) & top_frees)
    pushed = (phase == P_STORE) & ~store_last
    stack = _write(st["stack"], sp + 1,
                   jnp.stack([i32(T_SEGMENT), st["a"], st["m"], st["slot_a"]]), pushed)
    stack = _write(stack, sp + 2, jnp.stack([i32(T_FREE), st["m"], st["m"], last_free]), pushed)
    return dict(regs, stack=stack, free=free), action


def _read(x, i):
    """``x[i]`` with ``i`` clamped into range."""
    return lax.dynamic_index_in_dim(x, jnp.clip(i, 0, x.shape[0] - 1), 0, keepdims=False)


def _write(x, i, v, pred):
    """``x`` with ``x[i] = v`` where ``pred`` (``i`` clamped; in place, no copy of ``x``)."""
    i = jnp.clip(i, 0, x.shape[0] - 1)
    old = lax.dynamic_index_in_dim(x, i, 0, keepdims=False)
    return lax.dynamic_update_index_in_dim(x, jnp.where(pred, v, old), i, 0)


def _select(pred, a, b):
    """``a`` where ``pred`` else ``b``, leaf by leaf (pytrees of the same structure)."""
    return tree_util.tree_map(lambda x, y: jnp.where(pred, x, y), a, b)
