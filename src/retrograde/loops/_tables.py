"""What a compiled loop needs of an offline schedule, for a step count known when tracing.

A :class:`Tables` holds the forward sweep's store points and, for the reverse sweep, either nothing
(schedules whose reversal is the binomial one between those stores,
:meth:`~retrograde.schedules.OfflineSchedule.binomial_stores`: the in-graph machine of
:mod:`._machine` generates it, so the tables have ``O(stores)`` integers and are built without
enumerating the schedule's actions), or a table of the machine's macro-actions: for a binomial
reversal of at most ``ROW_LIMIT`` macro-actions, the machine's own, generated in Python when
tracing (so the compiled loop reads a row per macro-action instead of running the machine, whose
twenty-odd scalar kernels cost more than a small step); for any other
offline schedule (e.g. ``MultiLevel``), translated from the schedule's action stream, one row per
restore, advance, store and record, which costs ``O(actions)`` to build.

Slots of all storage levels are numbered consecutively, those in device memory first; the
others (levels with ``storage="host"`` or ``"disk"``) follow and live in host stores
(:mod:`._offload`, described by the tables' :class:`~._offload_runs.Layout`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from ..schedules import (
    Advance,
    Executor,
    Free,
    Linearize,
    OfflineSchedule,
    Record,
    Restore,
    Reverse,
    Schedule,
    Store,
)
from ._binomial import CAP
from ._machine import DATA, LEAF, MOVE, REVOLVE, Rule
from ._offload_runs import Layout, offloaded

#: A ``DATA`` action's ``fresh`` when its steps' data are in its rows already (kept by the
#: forward sweep, :attr:`Tables.lead`): its last state at hand, no evaluation keeping data.
LINEARIZED = 2


@dataclasses.dataclass(frozen=True, eq=False)
class Tables:
    """The tables for one schedule and step count.

    Attributes:
        length: number of steps ``N``.
        n_slots: snapshot slots on the device (all device levels together).
        store_steps, store_slots: the forward sweep's stores, ascending (int32).
        rows: ``None`` for the binomial reversal; else int32 ``(R, 7)``: the reverse sweep as the
            machine's actions (fields of :class:`._machine.Action`).
        offload: ``None`` if every slot is a device slot; else where each slot lives: slot
            numbers ``n_slots`` and above (in ``store_slots`` and ``rows``) are offloaded.
        free_order, leaves: with ``rows`` from the machine, where its leaves keep their
            states (``None`` for rows whose leaves record one step at hand): the free slots
            are always a prefix of ``free_order``, and per row ``(own, f)`` says that the
            leaf's state ``u_{start + i}`` is in slot ``own`` for ``i = 0`` and
            ``free_order[f - i]`` after (the free slots, last first), or in slot ``f + i``
            if ``own < 0`` (the trailing leaf, over held steps).
        data_rows: the data rows a ``DATA`` leaf may fill (its length less one; ``0``: the
            schedule reverses no step from data).
        rule: the machine's leaves and splits, for the binomial reversal (``rows`` from the
            machine, or ``None``): :func:`register_rule`.
        lead: ``None``, or ``(start, level)`` when the schedule's first sweep ends by
            linearizing steps ``start .. N - 2`` (its rightmost leaf, ``[start, N)``, reversed
            from data; ``level``: the leaf's, ``-1`` for data rows of their own): a forward
            sweep that keeps their data (:func:`._forward_sweep.forward` with ``lead``) writes
            it into the rows that leaf reads, and the reverse sweep starts with
            :meth:`lead_action` (no evaluation but the record of ``N - 1``), then the actions
            of :meth:`after_lead`.
        relinearized: the steps a reverse sweep evaluates again when its forward kept states
            only (the snapshots an HVP's augmented sweep shares): it stores the state the run
            starts from and the first ``DATA`` leaf linearizes the run from it (``N - 1 -
            start`` with a ``lead``). A compiled gradient evaluates the step ``evaluations + 1``
            times (:class:`~retrograde.schedules.Stats`; the ``1``: the forward sweep's last
            step, for ``u_N``), plus ``relinearized`` where the forward kept no data.
        lead_rows: with ``rows`` and a ``lead``: the leading rows that reverse ``[start, N)``
            (what :meth:`lead_action` replaces).
    """

    length: int
    n_slots: int
    store_steps: np.ndarray
    store_slots: np.ndarray
    rows: np.ndarray | None
    offload: Layout | None = None
    free_order: np.ndarray | None = None
    leaves: np.ndarray | None = None
    data_rows: int = 0
    relinearized: int = 0
    rule: Rule = REVOLVE
    lead: tuple[int, int] | None = None
    lead_rows: int = 0

    def lead_action(self) -> np.ndarray:
        """The ``DATA`` leaf ``[start, N)`` whose data the forward sweep kept: no restore (its
        last state ``u_{N-1}`` is at hand), ``fresh = LINEARIZED`` (no evaluation keeping
        data), its rows at its level."""
        assert self.lead is not None
        start, level = self.lead
        n = self.length
        return np.asarray([DATA, -1, start, n, n - 1, level, LINEARIZED], np.int32)

    @property
    def held(self):
        """The held snapshots after the forward sweep, for :func:`._machine.init`: ``(steps,
        slots, count)`` padded to ``n_slots`` entries."""
        pad = self.n_slots - len(self.store_steps)
        steps = np.concatenate([self.store_steps, np.zeros(pad, np.int32)])
        slots = np.concatenate([self.store_slots, np.zeros(pad, np.int32)])
        return steps, slots, len(self.store_steps)


def check_offline(schedule: Schedule, where: str) -> OfflineSchedule:
    if not isinstance(schedule, Schedule):
        raise TypeError(
            f"{where}: schedule must be a retrograde.schedules schedule such as Revolve(10), "
            f"got {schedule!r}."
        )
    if not isinstance(schedule, OfflineSchedule):
        raise ValueError(
            f"{where}: {schedule!r} is an online schedule, for loops whose step count is unknown; "
            "this loop has a fixed number of steps, so use an offline schedule (Revolve, "
            "StoreAll, RecomputeAll, Periodic, MultiLevel), or retrograde.while_loop."
        )
    return schedule


_RULES: dict[type, Any] = {}


def register_rule(kind: type, rule) -> None:
    """Reverse the schedules of class ``kind`` by the machine with ``rule(schedule)`` (a
    :class:`._machine.Rule`) instead of Revolve's: for an offline schedule whose
    ``binomial_stores`` are not ``None``, the forward sweep stores ``binomial_stores(N)``, and
    the segments between the stores are split and made leaves (``LEAF`` or ``DATA``) by the
    rule; its ``actions(N)`` must be what the machine then does (Python twin:
    :func:`_machine_rows`). For an ``Online`` subclass, ``while_loop`` reverses the segments
    between the snapshots it placed by the rule."""
    _RULES[kind] = rule
    tables_for.cache_clear()


def machine_rule(schedule: Schedule) -> Rule:
    """The rule the machine reverses ``schedule`` by (:func:`register_rule`; else Revolve's):
    between the stores of an offline schedule's ``binomial_stores``, or between the snapshots
    ``Online`` placed in a ``while_loop`` (its ``snapshots`` are the state slots, its rule's
    ``data_rows`` come in addition)."""
    for kind in type(schedule).__mro__:
        if kind in _RULES:
            return _RULES[kind](schedule)
    return REVOLVE


@functools.lru_cache(maxsize=128)
def tables_for(schedule: OfflineSchedule, length: int) -> Tables:
    """Build the tables for ``schedule`` and ``length`` steps (cached)."""
    stores = schedule.binomial_stores(length)
    if stores is not None:
        # More slots than N - 1 are never used by a binomial reversal.
        rule = machine_rule(schedule)
        slots = rule.state_slots(schedule.max_slots(length)[0])
        if rule is REVOLVE:  # its leaves' levels depend on slots beyond N - 1 otherwise
            slots = min(slots, length - 1)
        n_slots = max(1, len(stores), slots)
        steps = np.asarray(stores, np.int32)
        relinearized = rule.relinearized(tuple(stores), length)
        tables = Tables(
            length,
            n_slots,
            steps,
            np.arange(len(steps), dtype=np.int32),
            None,
            data_rows=rule.data_rows(n_slots),
            relinearized=relinearized,
            rule=rule,
            # the rightmost leaf [q, N), q the last store (slot and level len(stores) - 1)
            lead=(length - 1 - relinearized, len(stores) - 1) if relinearized else None,
        )
        rows = _machine_rows(tables)
        if rows is None and rule.split is None:
            raise ValueError(
                f"{schedule!r} over {length} steps: its reversal has more than {ROW_LIMIT} "
                "macro-actions, and this schedule's reversal runs only read off a table of "
                "them (its leaf sizes have no in-graph split rule: a data_size below 1 or "
                "fractional). Use a whole data_size, shorter loops, or Revolve."
            )
        if rows is None:
            if length >= CAP:
                raise ValueError(
                    f"{schedule!r} over {length} steps: its reversal has more than {ROW_LIMIT} "
                    f"macro-actions, so it runs the in-graph machine, whose int32 binomials "
                    f"allow at most {CAP - 1} steps. Use the default schedule (its reversal is "
                    "read off a table) or more snapshots."
                )
            return tables
        tables = dataclasses.replace(tables, rows=rows[0], free_order=rows[1], leaves=rows[2])
        return _with_lead_rows(tables)
    return _with_lead_rows(_row_tables(schedule, length))


def _with_lead_rows(tables: Tables) -> Tables:
    """``tables`` with ``lead_rows``: the leading rows that reverse the lead leaf ``[start,
    N)`` (leaves within it, e.g. the trailing record of ``N - 1`` and a ``DATA`` leaf); no
    ``lead`` where they do not cover it alone (the forward then keeps states only)."""
    if tables.lead is None or tables.rows is None:
        return tables
    start, k = tables.lead[0], 0
    covered: set[int] = set()
    rows = tables.rows
    while k < len(rows) and rows[k][0] in (LEAF, DATA) and rows[k][2] >= start:
        covered.update(range(int(rows[k][2]), int(rows[k][3])))
        k += 1
    if covered != set(range(start, tables.length)):
        return dataclasses.replace(tables, lead=None)
    return dataclasses.replace(tables, lead_rows=k)


# A binomial reversal of at most this many macro-actions is read off a table; a longer one runs
# the in-graph machine.
ROW_LIMIT = 1 << 14


def _machine_rows(tables: Tables):
    """``(rows, free_order, leaves)``: the macro-actions the machine (:mod:`._machine`) emits
    after the forward sweep of ``tables``, generated here in Python (its twin, tested equal;
    ``O(rows + S)`` time and memory), or ``None`` past ``ROW_LIMIT`` rows. See :class:`Tables`
    for the leaves' slots."""
    n, s = tables.length, tables.n_slots
    if n < 2:
        return None
    p = [int(v) for v in tables.store_steps]  # held in slots 0, 1, ...
    m = len(p)
    # The trailing leaf: u_{N-1} at hand and the held steps just below it, one per slot.
    tail = sum(1 for i, q in enumerate(p) if q - i == n - 1 - m)
    n_seg = m - tail
    last_end = n - tail - 1
    # Slots are taken from the top of the free list (the lowest free slot) and given back in
    # reverse order, and the segments' slots are released last first: so the free list is
    # always a prefix of this.
    order = list(range(s - 1, 0, -1))
    free = order[: s - n_seg]
    # The task stack: (segment start, end, slot) and slot releases, the last segment on top.
    stack: list[tuple] = []
    for i in range(n_seg):
        if i:
            stack.append(("free", i))
        stack.append((p[i], p[i + 1] if i + 1 < n_seg else last_end, i))
    rows: list[tuple[int, ...]] = []
    leaves: list[tuple[int, int]] = []

    def emit(row, own=0, f=None):
        if len(rows) >= ROW_LIMIT:
            raise OverflowError
        rows.append(row)
        leaves.append((own, len(free) if f is None else f))

    try:  # the trailing leaf's states are held in slots n_seg, n_seg + 1, ...
        emit((LEAF, -1, last_end, n, n - 1, -1, 1), own=-1, f=n_seg)
        while stack:
            if stack[-1][0] == "free":
                free.append(stack.pop()[1])
            a, b, slot_a = stack.pop()
            _reverse_task(a, b, slot_a, free, stack, emit, tables.rule, s)
    except OverflowError:
        return None
    return (
        np.asarray(rows, np.int32).reshape(-1, 7),
        np.asarray(order or [0], np.int32),
        np.asarray(leaves, np.int32).reshape(-1, 2),
    )


def _reverse_task(a, b, slot_a, free, stack, emit, rule: Rule, n_slots: int):
    """Emit the machine's actions for one task: reverse ``[a, b)`` from its slot ``slot_a`` with
    the free slots (pushing the left parts of splits and their slot releases), by ``rule``, of
    ``n_slots`` slots in all."""
    at_hand = False
    while True:
        n, s = b - a, len(free) + 1
        restore = -1 if at_hand else slot_a
        kind = rule.py_leaf(n, s, n_slots + 1)
        if kind == DATA:  # a leaf reversed from data, at level S - s
            emit((DATA, restore, a, b, b - 1, n_slots - s, 1), slot_a)
            return
        if kind == LEAF:  # a leaf: every state stored, in its own slot then free ones
            emit((LEAF, -1 if n == 1 else restore, a, b, a, -1, int(n > 1 or at_hand)), slot_a)
            return
        if s == 1 and rule.split_one_slot:  # split; the right part a leaf with no slot
            m = a + rule.py_split(n, 1, n_slots + 1)
            emit((MOVE, restore, a, m, 0, -1, 0))
            if b - m == 1:
                emit((LEAF, -1, m, b, m, -1, 1), slot_a)
            else:
                emit((DATA, -1, m, b, b - 1, n_slots, 1), slot_a)
            b, at_hand = m, False
            continue
        if s == 1:  # one slot: for k = b - 1 down to a, restore, advance to k, record k
            for k in range(b - 1, a - 1, -1):
                emit((MOVE, restore, a, k, 0, -1, 0))
                emit((LEAF, -1, k, k + 1, k, -1, 1), slot_a)
                restore = slot_a
            return
        m = a + rule.py_split(n, s, n_slots + 1)
        if m == b - 1:  # the right part is one step: advance and record it
            emit((MOVE, restore, a, m, 0, -1, 0))
            emit((LEAF, -1, m, m + 1, m, -1, 1), slot_a)
            b, at_hand = m, False
            continue
        new = free.pop()
        emit((MOVE, restore, a, m, 0, new, 0))
        stack.append((a, m, slot_a))
        stack.append(("free", new))
        a, slot_a, at_hand = m, new, True


_KINDS = (Advance, Store, Restore, Free, Record, Linearize, Reverse)


def _row_tables(schedule: OfflineSchedule, length: int) -> Tables:
    actions = [a for a in schedule.actions(length) if type(a) in _KINDS]
    # Number the slots of all levels consecutively, device levels first.
    top: dict[int, int] = {}
    act: Any  # a Store or a Restore where read (mypy does not narrow `type(act) in (...)`)
    for act in actions:
        if type(act) in (Store, Restore):
            top[act.level] = max(top.get(act.level, -1), act.slot)
    levels = schedule.levels
    far = {level for level in top if offloaded(levels[level])}
    near = sorted(set(top) - far)
    slots = [(lv, i) for lv in near for i in range(top[lv] + 1)]
    n_near = len(slots)
    n_slots = max(n_near, 1)
    slots += [(0, -1)] * (n_slots - len(slots))  # an unused device slot if all are offloaded
    offset = {}
    for lv in near + sorted(far):
        offset[lv] = len(slots) if lv in far else sum(top[m] + 1 for m in near if m < lv)
        if lv in far:
            slots += [(lv, i) for i in range(top[lv] + 1)]
    layout = None
    if far:
        layout = Layout(
            tuple(levels), tuple(lv for lv, _ in slots), tuple(i for _, i in slots), n_slots
        )

    # The first sweep: advance monotonically from step 0 to N - 1, storing on the way; it may
    # end with a run of linearized steps [run, at) (the first leaf reversed from data).
    stores, at, k, run = [], 0, 0, None
    held: dict[int, int] = {}  # slot -> the step it holds at the end of the first sweep
    while k < len(actions) and type(actions[k]) not in (Record, Reverse):
        act = actions[k]
        if type(act) is Advance and act.start == at and run is None:
            at = act.stop
        elif type(act) is Store and run is None:
            stores.append((act.step, offset[act.level] + act.slot))
            held[stores[-1][1]] = act.step
        elif type(act) is Free:
            if act.level in offset:
                held.pop(offset[act.level] + act.slot, None)
        elif type(act) is Linearize and act.step == at:
            run, at = at if run is None else run, at + 1
        else:
            raise ValueError(
                f"{schedule!r}: its first sweep (before the first Record or Reverse) must only "
                f"advance from step 0 on and store, then possibly linearize the steps up to the "
                f"end, but it has {act}."
            )
        k += 1
    if length and at != length - 1 and not (run is not None and at == length):
        raise ValueError(f"{schedule!r}: the first sweep must end at step {length - 1}.")

    pending, relinearized, lead = None, 0, None
    if run is not None:
        if layout is not None:
            raise ValueError(
                f"{schedule!r}: a compiled loop reverses steps from their data only with every "
                "slot in device memory (no level with storage='host' or 'disk')."
            )
        # The compiled forward sweep keeps u_run (the first leaf linearizes again from it): in
        # the slot the first sweep stored it in, else in a device slot free at its end (the
        # first leaf is the reverse sweep's first action), else in a slot of its own.
        where = {step: slot for slot, step in held.items()}
        if run not in where:
            free = [slot for slot in range(n_near) if slot not in held]
            where[run] = free[0] if free else n_near
            stores.append((run, where[run]))
            n_slots = max(n_slots, where[run] + 1)
        pending = (run, at, where[run])
        relinearized = min(at, length - 1) - run
        lead = (run, -1) if relinearized else None
    translated = _Rows(offset, pending).run(actions[k:])
    translated.finish(schedule)
    pts = np.asarray(stores, np.int32).reshape(-1, 2)
    return Tables(
        length,
        n_slots,
        pts[:, 0].copy(),
        pts[:, 1].copy(),
        np.asarray(_merge_moves(translated.rows), np.int32).reshape(-1, 7),
        layout,
        data_rows=translated.data_rows,
        relinearized=relinearized,
        lead=lead,
    )


class _Rows(Executor):
    """The reverse sweep as the machine's rows, the slots of level ``l`` from ``offset[l]`` on.

    Steps reversed from data come as leaves: a run of ``Linearize`` of consecutive steps
    ``a .. b - 1`` from the state at hand, then ``Record(b - 1)`` (or ``Reverse(b - 1)``, the
    run's last step reversed at once: as many evaluations as recording it from ``u_{b-1}``), then
    ``Reverse`` of ``b - 2`` down to ``a``, with nothing else between them (``Free`` aside): one
    ``DATA`` row, whose data rows are the leaf's own (the schedule's data slots are not read).
    ``pending``: the first sweep's run ``(a, b, slot of u_a)``, if it ended with one.
    """

    def __init__(self, offset: dict[int, int], pending: tuple[int, int, int] | None = None):
        self.offset = offset
        self.rows: list[tuple[int, ...]] = []
        self.linearized = pending  # linearized steps [a, b), u_a restored from a slot (-1: at hand)
        self.due: list[int] = []  # steps still to reverse from the data of the last leaf
        self.data_rows = 0

    def _idle(self, act) -> None:
        """Raise unless no leaf reversed from data is under way."""
        if self.linearized is not None or self.due:
            what = (
                f"steps {self.due[-1]}..{self.due[0]} are still to be reversed from their data"
                if self.due
                else f"steps {self.linearized[0]}..{self.linearized[1] - 1} were linearized"
            )
            raise ValueError(
                f"{act}: {what}. A compiled loop reverses steps from their data as a leaf: "
                "Linearize of consecutive steps from the state at hand, Record (or Reverse) of the "
                "last, then Reverse of the others, last first, with nothing else between them."
            )

    def restore(self, act: Restore) -> None:
        self._idle(act)
        self.rows.append((MOVE, self.offset[act.level] + act.slot, act.step, act.step, 0, -1, 0))

    def advance(self, act: Advance) -> None:
        self._idle(act)
        self.rows.append((MOVE, -1, act.start, act.stop, 0, -1, 0))

    def store(self, act: Store) -> None:
        self._idle(act)
        self.rows.append((MOVE, -1, act.step, act.step, 0, self.offset[act.level] + act.slot, 0))

    def record(self, act: Record) -> None:  # a one-step leaf from the state at hand
        if self.linearized is not None and not self.due and act.step == self.linearized[1]:
            self._data_leaf(act.step + 1)
            return
        self._idle(act)
        self.rows.append((LEAF, -1, act.step, act.step + 1, act.step, -1, 1))

    def linearize(self, act: Linearize) -> None:
        if self.linearized is not None and not self.due and act.step == self.linearized[1]:
            self.linearized = (self.linearized[0], act.step + 1, self.linearized[2])
            return
        self._idle(act)
        self.linearized = (act.step, act.step + 1, -1)

    def reverse(self, act: Reverse) -> None:
        if self.due and act.step == self.due[-1]:
            self.due.pop()
            return
        if self.linearized is not None and not self.due and act.step == self.linearized[1] - 1:
            self._data_leaf(act.step + 1)
            return
        self._idle(act)
        raise ValueError(f"{act}: the step was not linearized in the leaf being reversed.")

    def _data_leaf(self, stop: int) -> None:
        """The ``DATA`` row of the run ``[a, stop)`` (its last step recorded from the state at
        hand); a restore just before it becomes the row's own."""
        start, _, restore = self.linearized
        prev = self.rows[-1] if self.rows else None
        if (
            restore < 0
            and prev is not None
            and prev[0] == MOVE
            and prev[2] == prev[3] == start
            and prev[5] < 0
        ):
            restore = self.rows.pop()[1]
        self.rows.append((DATA, restore, start, stop, stop - 1, -1, 1))
        self.data_rows = max(self.data_rows, stop - 1 - start)
        self.linearized, self.due = None, list(range(start, stop - 1))

    def finish(self, schedule) -> None:
        """Raise if the stream ended inside a leaf reversed from data."""
        if self.linearized is not None or self.due:
            raise ValueError(f"{schedule!r}: its actions end inside a leaf reversed from data.")


def _merge_moves(rows):
    """Fuse consecutive moves that chain (the first stores nothing, the second restores nothing
    and starts where the first stops) into one: a MOVE restores, advances, then stores."""
    out: list[Any] = []
    for row in rows:
        prev = out[-1] if out else None
        if (
            prev is not None
            and row[0] == MOVE
            and prev[0] == MOVE
            and prev[5] < 0
            and row[1] < 0
            and row[2] == prev[3]
        ):
            out[-1] = (MOVE, prev[1], prev[2], row[3], 0, row[5], 0)
            continue
        out.append(row)
    return out


def _register_mixed() -> None:
    from ..schedules import Mixed, Online
    from ._mixed_machine import mixed_rule, online_rule

    register_rule(Mixed, mixed_rule)
    register_rule(Online, online_rule)


_register_mixed()
