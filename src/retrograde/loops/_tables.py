"""What a compiled loop needs of an offline schedule, for a step count known when tracing.

A :class:`Tables` holds the forward sweep's store points and, for the reverse sweep, either nothing
(schedules whose reversal is the binomial one between those stores,
:meth:`~retrograde.schedules.OfflineSchedule.binomial_stores`: the in-graph machine of
:mod:`._machine` generates it, so the tables have ``O(stores)`` integers and are built without
enumerating the schedule's actions), or a table of the machine's macro-actions translated from
the schedule's action stream (any other offline schedule, e.g. ``MultiLevel``): one row per
restore, advance, store and record, which costs ``O(actions)`` to build.

Slots of all storage levels are numbered consecutively, those in device memory first; the
others (levels with ``storage="host"`` or ``"disk"``) follow and live in host stores
(:mod:`._offload`, described by the tables' :class:`~._offload.Layout`).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ..schedules import Advance, Executor, OfflineSchedule, Record, Restore, Schedule, Store
from ._machine import LEAF, MOVE
from ._offload import Layout, offloaded


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
    """

    length: int
    n_slots: int
    store_steps: np.ndarray
    store_slots: np.ndarray
    rows: np.ndarray | None
    offload: Layout | None = None

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


@functools.lru_cache(maxsize=128)
def tables_for(schedule: OfflineSchedule, length: int) -> Tables:
    """Build the tables for ``schedule`` and ``length`` steps (cached)."""
    stores = schedule.binomial_stores(length)
    if stores is not None:
        # More slots than N - 1 are never used by a binomial reversal.
        n_slots = max(1, len(stores), min(schedule.max_slots(length)[0], length - 1))
        steps = np.asarray(stores, np.int32)
        return Tables(length, n_slots, steps, np.arange(len(steps), dtype=np.int32), None)
    return _row_tables(schedule, length)


def _row_tables(schedule: OfflineSchedule, length: int) -> Tables:
    actions = [a for a in schedule.actions(length) if type(a) in (Advance, Store, Restore, Record)]
    # Number the slots of all levels consecutively, device levels first.
    top: dict[int, int] = {}
    for act in actions:
        if type(act) in (Store, Restore):
            top[act.level] = max(top.get(act.level, -1), act.slot)
    levels = schedule.levels
    far = {level for level in top if offloaded(levels[level])}
    near = sorted(set(top) - far)
    slots = [(lv, i) for lv in near for i in range(top[lv] + 1)]
    n_slots = max(len(slots), 1)
    slots += [(0, -1)] * (n_slots - len(slots))  # an unused device slot if all are offloaded
    offset = {}
    for lv in near + sorted(far):
        offset[lv] = len(slots) if lv in far else sum(top[m] + 1 for m in near if m < lv)
        if lv in far:
            slots += [(lv, i) for i in range(top[lv] + 1)]
    layout = None
    if far:
        layout = Layout(tuple(levels), tuple(lv for lv, _ in slots), tuple(i for _, i in slots),
                        n_slots)

    # The first sweep: advance monotonically from step 0 to N - 1, storing on the way.
    stores, at, k = [], 0, 0
    while k < len(actions) and type(actions[k]) is not Record:
        act = actions[k]
        if type(act) is Advance and act.start == at:
            at = act.stop
        elif type(act) is Store:
            stores.append((act.step, offset[act.level] + act.slot))
        else:
            raise ValueError(
                f"{schedule!r}: its first sweep (before the first Record) must only advance from "
                f"step 0 on and store, but it has {act}."
            )
        k += 1
    if length and at != length - 1:
        raise ValueError(f"{schedule!r}: the first sweep must end at step {length - 1}.")

    rows = _Rows(offset).run(actions[k:]).rows
    pts = np.asarray(stores, np.int32).reshape(-1, 2)
    return Tables(length, n_slots, pts[:, 0].copy(), pts[:, 1].copy(),
                  np.asarray(_merge_moves(rows), np.int32).reshape(-1, 7), layout)


class _Rows(Executor):
    """The reverse sweep as the machine's rows, the slots of level ``l`` from ``offset[l]`` on."""

    def __init__(self, offset: dict[int, int]):
        self.offset = offset
        self.rows: list[tuple[int, ...]] = []

    def restore(self, act: Restore) -> None:
        self.rows.append((MOVE, self.offset[act.level] + act.slot, act.step, act.step, 0, -1, 0))

    def advance(self, act: Advance) -> None:
        self.rows.append((MOVE, -1, act.start, act.stop, 0, -1, 0))

    def store(self, act: Store) -> None:
        self.rows.append((MOVE, -1, act.step, act.step, 0, self.offset[act.level] + act.slot, 0))

    def record(self, act: Record) -> None:  # a one-step leaf from the state at hand
        self.rows.append((LEAF, -1, act.step, act.step + 1, act.step, -1, 1))


def _merge_moves(rows):
    """Fuse consecutive moves that chain (the first stores nothing, the second restores nothing
    and starts where the first stops) into one: a MOVE restores, advances, then stores."""
    out = []
    for row in rows:
        prev = out[-1] if out else None
        if (prev is not None and row[0] == MOVE and prev[0] == MOVE and prev[5] < 0
                and row[1] < 0 and row[2] == prev[3]):
            out[-1] = (MOVE, prev[1], prev[2], row[3], 0, row[5], 0)
            continue
        out.append(row)
    return out
