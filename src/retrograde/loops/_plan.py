"""Compile a schedule's action stream into tables that a compiled loop can execute.

The forward sweep of an offline schedule (the actions before its first ``Record``) must advance
monotonically from step 0 to step ``N - 1``; it becomes a list of (step, slot) store points. The
whole stream (without ``Free`` and ``End``, which need no work on a device) becomes rows
``(opcode, a, b)``:

======== =========================== ===========================
opcode   action                       a, b
======== =========================== ===========================
0        Advance(a, b)                start, stop
1        Store(step, slot)            step, global slot
2        Restore(step, slot)          step, global slot
3        Record(step)                 step, 0
======== =========================== ===========================

Slots of all storage levels are numbered consecutively (all levels live in device memory here).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ..schedules import Advance, End, Free, OfflineSchedule, Record, Restore, Schedule, Store

ADVANCE, STORE, RESTORE, RECORD = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """Tables for one schedule and step count.

    Attributes:
        length: number of steps ``N``.
        n_slots: snapshot slots needed on the device (all levels together).
        store_steps, store_slots: the forward sweep's store points, sorted by step (int32).
        rows: int32 array ``(R, 3)`` of the whole stream; ``first_record`` indexes its first
            ``Record`` row, where the reverse part starts.
        plain: plain evaluations of the whole schedule; ``forward_plain`` of its forward part.
    """

    length: int
    n_slots: int
    store_steps: np.ndarray
    store_slots: np.ndarray
    rows: np.ndarray
    first_record: int
    plain: int
    forward_plain: int


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
def compile_plan(schedule: OfflineSchedule, length: int) -> Plan:
    """Build the tables for ``schedule`` and ``length`` steps (cached)."""
    actions = list(schedule.actions(length))
    # Number the slots of all levels consecutively.
    top: dict[int, int] = {}
    for act in actions:
        if type(act) in (Store, Restore, Free):
            top[act.level] = max(top.get(act.level, -1), act.slot)
    offset, base = {}, 0
    for level in sorted(top):
        offset[level] = base
        base += top[level] + 1
    n_slots = max(base, 1)

    rows, store_points = [], []
    first_record, plain, forward_plain, at = None, 0, 0, 0
    for act in actions:
        kind = type(act)
        if kind is Advance:
            rows.append((ADVANCE, act.start, act.stop))
            plain += act.stop - act.start
        elif kind is Store:
            rows.append((STORE, act.step, offset[act.level] + act.slot))
        elif kind is Restore:
            rows.append((RESTORE, act.step, offset[act.level] + act.slot))
        elif kind is Record:
            rows.append((RECORD, act.step, 0))
        elif kind in (Free, End):
            continue
        if first_record is None:
            if kind is Record:
                first_record = len(rows) - 1
                forward_plain = plain
            elif kind is Advance:
                if act.start != at:
                    raise ValueError(f"{schedule!r}: its first sweep must advance from step 0 on.")
                at = act.stop
            elif kind is Store:
                store_points.append((act.step, offset[act.level] + act.slot))
            else:
                raise ValueError(
                    f"{schedule!r}: its first sweep (before the first Record) must only advance "
                    f"and store, but it has {act}."
                )
    if length and (first_record is None or at != length - 1):
        raise ValueError(f"{schedule!r}: the first sweep must end at step {length - 1}.")
    table = np.asarray(rows if rows else np.zeros((0, 3)), dtype=np.int32).reshape(-1, 3)
    pts = np.asarray(store_points, dtype=np.int32).reshape(-1, 2)
    return Plan(
        length=length,
        n_slots=n_slots,
        store_steps=pts[:, 0].copy(),
        store_slots=pts[:, 1].copy(),
        rows=table,
        first_record=first_record or 0,
        plain=plain,
        forward_plain=forward_plain,
    )
