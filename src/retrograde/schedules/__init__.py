"""Checkpointing schedules in pure Python (no JAX is imported here).

A schedule describes how to reverse ``N`` steps of ``u_{n+1} = step(u_n)`` with a bounded number
of stored states. :func:`simulate` executes a schedule symbolically, proves it valid and counts
its cost. See :mod:`retrograde.schedules._actions` for the action vocabulary.
"""

from ._actions import Action, Advance, End, Free, Record, Restore, Store
from ._base import Level, OfflineSchedule, OnlineRun, OnlineSchedule, Schedule
from ._optimum import beta, repetition_number, revolve_optimum
from ._revolve import Revolve, binomial_reversal
from ._simple import Periodic, RecomputeAll, StoreAll
from ._simulate import ScheduleError, Stats, execute, simulate
from ._online import Online
from ._multilevel import MultiLevel

__all__ = [
    "Action", "Advance", "End", "Free", "Record", "Restore", "Store",
    "Level", "OfflineSchedule", "OnlineRun", "OnlineSchedule", "Schedule",
    "beta", "repetition_number", "revolve_optimum",
    "Revolve", "binomial_reversal", "Periodic", "RecomputeAll", "StoreAll", "Online", "MultiLevel",
    "ScheduleError", "Stats", "execute", "simulate",
]
