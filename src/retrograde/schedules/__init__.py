"""Checkpointing schedules in pure Python (no JAX is imported here).

A schedule describes how to reverse ``N`` steps of ``u_{n+1} = step(u_n)`` with a bounded number
of stored states, as a stream of actions (:mod:`retrograde.schedules._actions`: the vocabulary,
and :class:`Executor`, the one way to execute them). :func:`simulate` executes a schedule
symbolically (:class:`Simulator`), proves it valid and counts its cost.
"""

from ._actions import (
    Action,
    Advance,
    End,
    Executor,
    Free,
    Linearize,
    Record,
    Restore,
    Reverse,
    ScheduleError,
    Store,
    relabel,
)
from ._base import (
    Level,
    OfflineSchedule,
    OnlineRun,
    OnlineSchedule,
    Schedule,
    check_snapshots,
    check_steps,
    exact_size,
    schedule_stream,
)
from ._default import default_schedule, default_snapshots
from ._mixed import Mixed, band_rule_applies, mixed_optimum, mixed_split
from ._multilevel import MultiLevel
from ._online import (
    Online,
    online_decisions,
    online_store_slot,
    online_targets,
    online_totals,
    reverse_held_mixed,
    reverse_segments,
    segment_cost,
    thinning_slot,
    thinning_spacing,
)
from ._optimum import beta, repetition_number, revolve_optimum
from ._revolve import Revolve, binomial_reversal, largest_split, reverse_held, revolve_split
from ._simple import Periodic, RecomputeAll, StoreAll
from ._simulate import Simulator, Stats, execute, simulate

__all__ = [
    "Action",
    "Advance",
    "End",
    "Free",
    "Linearize",
    "Reverse",
    "Record",
    "Restore",
    "Store",
    "Executor",
    "ScheduleError",
    "relabel",
    "schedule_stream",
    "Level",
    "OfflineSchedule",
    "OnlineRun",
    "OnlineSchedule",
    "Schedule",
    "check_steps",
    "check_snapshots",
    "exact_size",
    "beta",
    "repetition_number",
    "revolve_optimum",
    "Revolve",
    "binomial_reversal",
    "reverse_held",
    "revolve_split",
    "largest_split",
    "Periodic",
    "RecomputeAll",
    "StoreAll",
    "Online",
    "online_decisions",
    "online_store_slot",
    "online_targets",
    "online_totals",
    "reverse_held_mixed",
    "reverse_segments",
    "segment_cost",
    "thinning_slot",
    "thinning_spacing",
    "MultiLevel",
    "Mixed",
    "mixed_optimum",
    "band_rule_applies",
    "mixed_split",
    "default_schedule",
    "default_snapshots",
    "Simulator",
    "Stats",
    "execute",
    "simulate",
]
