"""Plan a checkpointing schedule for a memory (and disk) budget.

:func:`plan` lists the schedules that reverse ``N`` steps within a budget, with their cost in step
evaluations and their peak memory, cheapest first; the first row is the recommendation. The
command line ``python -m retrograde plan`` prints the same table (see :mod:`retrograde.__main__`).

Cost convention (as everywhere in retrograde): *plain* evaluations run the step without recording
(the first sweep and recomputations); *recorded* evaluations run the step with its adjoint,
exactly ``N`` of them. Storing every state costs ``N - 1`` plain plus ``N`` recorded evaluations,
``2N - 1`` in all, and the *overhead* of a schedule is its cost divided by that. A snapshot slot
holds one state; the slot holding the initial state counts.

Given the size of one step's adjoint data (``data_size``), the table also has a ``Mixed`` row
(mixed checkpointing: slots may hold that data, and steps are then reversed from it with no
forward evaluation); its *linearized* evaluations are forward evaluations that keep the data.

Pure Python: no JAX is imported. Counts come from closed forms for ``StoreAll``, ``Revolve``,
``Periodic`` and ``RecomputeAll`` (instant for any ``N``) and from
:func:`~retrograde.schedules.simulate` for the other schedules.

Example:
    >>> from retrograde.planner import plan
    >>> rows = plan(10_000, memory="2GiB", state_size="10MiB")
    >>> rows[0].name, rows[0].plain, rows[0].memory_slots
    ('Revolve(204)', 19794, 204)
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from .schedules import (
    Level,
    Mixed,
    MultiLevel,
    Online,
    Periodic,
    RecomputeAll,
    Revolve,
    Schedule,
    Stats,
    StoreAll,
    check_snapshots,
    check_steps,
    revolve_optimum,
    simulate,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "Row",
    "plan",
    "plan_with_notes",
    "parse_size",
    "format_size",
    "format_table",
    "plot_schedule",
]

#: Largest ``N`` for which ``MultiLevel`` is planned and simulated for the table (seconds).
MULTILEVEL_LIMIT = 200_000
#: Largest ``N * s`` for which ``Online(s)`` is simulated for the table (about a second).
ONLINE_LIMIT = 200_000
#: Largest ``N`` for which ``Mixed`` is simulated for the table (under a second with data of
#: one state; other data sizes also plan by a dynamic program, see ``Mixed``).
MIXED_LIMIT = 200_000


@dataclasses.dataclass(frozen=True)
class Row:
    """One schedule that fits the budget, and what it costs for ``n_steps`` steps.

    Attributes:
        name: a short label, e.g. ``"Revolve(20)"``.
        schedule: the schedule itself (pass it to ``simulate`` or to a checkpointed loop).
        n_steps: the step count ``N`` planned for.
        plain: plain evaluations (first sweep and recomputations).
        recorded: recorded evaluations (``N``, less the steps a ``Mixed`` row reverses from
            data).
        writes, reads: snapshot stores and restores on the disk level (``0`` without disk).
        cost: ``plain + linearized + recorded + disk_writes * disk_write_cost + disk_reads *
            disk_read_cost`` in units of one step evaluation.
        memory_slots, disk_slots: peak slots used in memory and on disk (for ``Mixed``, states
            and step data together).
        memory_bytes, disk_bytes: the same in bytes, or ``None`` when no state size was given
            (for ``Mixed``, the peak of states and data weighed by their sizes).
        recommended: ``True`` for the cheapest row (the first one).
        host_slots, host_writes, host_reads, host_bytes: the same for a host-RAM level (rows
            planned with ``host_memory``; then ``disk_*`` count the disk level alone and
            ``memory_*`` the device level).
        linearized: forward evaluations that keep a step's adjoint data (``Mixed`` rows).

    Example:
        >>> from retrograde.planner import plan
        >>> plan(1000, snapshots=10)[0].schedule
        Revolve(snapshots=10)
    """

    name: str
    schedule: Schedule
    n_steps: int
    plain: int
    recorded: int
    cost: float
    memory_slots: int
    disk_slots: int = 0
    disk_writes: int = 0
    disk_reads: int = 0
    memory_bytes: int | None = None
    disk_bytes: int | None = None
    recommended: bool = False
    host_slots: int = 0
    host_writes: int = 0
    host_reads: int = 0
    host_bytes: int | None = None
    linearized: int = 0

    @property
    def evaluations(self) -> int:
        """Plain, linearized and recorded evaluations."""
        return self.plain + self.linearized + self.recorded

    @property
    def overhead(self) -> float:
        """``cost / (2N - 1)``: the cost relative to storing every state (``1.0`` is the best)."""
        return self.cost / max(2 * self.n_steps - 1, 1)


# ---------------------------------------------------------------------------------------------
# Sizes
# ---------------------------------------------------------------------------------------------

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int | float, name: str = "size") -> int:
    """Parse a size in bytes: ``"2GiB"``, ``"500MB"``, ``"10 MiB"``, ``"1e9"``, ``4096``.

    Decimal units (kB, MB, GB, TB, PB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB, PiB)
    powers of 1024; a bare number is bytes. The result is rounded down to whole bytes and must be
    at least one byte.

    >>> parse_size("2GiB"), parse_size("500MB"), parse_size("1e9")
    (2147483648, 500000000, 1000000000)

    Example:
        >>> from retrograde.planner import format_size
        >>> format_size(10 * 2**20)
        '10 MiB'
    """
    if isinstance(text, bool):
        raise TypeError(f"{name} must be a size such as '2GiB' or a number of bytes, got {text!r}.")
    if isinstance(text, (int, float)):
        value, unit = float(text), ""
        if isinstance(text, int):
            value = text  # exact for huge ints
    elif isinstance(text, str):
        match = _SIZE.match(text)
        if match is None:
            raise ValueError(
                f"{name}={text!r} is not a size; write a number with an optional unit, "
                "e.g. '2GiB', '500MB', '10MiB' or '1e9' (bytes)."
            )
        value, unit = float(match.group(1)), match.group(2)
    else:
        raise TypeError(f"{name} must be a size such as '2GiB' or a number of bytes, got {text!r}.")
    if unit.lower() not in _UNITS:
        raise ValueError(
            f"{name}={text!r}: unknown unit {unit!r}; use B, kB, MB, GB, TB (powers of 1000) or "
            "KiB, MiB, GiB, TiB (powers of 1024)."
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name}={text!r} must be a finite size.")
    scale = _UNITS[unit.lower()]
    size = int(value * scale) if isinstance(value, float) else value * scale
    if size < 1:
        raise ValueError(f"{name}={text!r} must be at least one byte.")
    return size


def format_size(n_bytes: int | float) -> str:
    """Human-readable size in binary units: ``format_size(2**31) == '2 GiB'``."""
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            break
        value /= 1024
    if unit == "B" or value == int(value) or value >= 100:
        text = f"{value:.0f}"
    else:
        text = f"{value:.3g}"
    return f"{text} {unit}"


# ---------------------------------------------------------------------------------------------
# Closed forms for the simple schedules
# ---------------------------------------------------------------------------------------------


def periodic_counts(n_steps: int, every: int) -> tuple[int, int]:
    """``(plain, peak_slots)`` of ``Periodic(every)`` for ``n_steps`` steps, in closed form.

    The forward sweep runs to the start of the last segment; each segment is then recomputed
    once, storing its inner states: ``plain = every * (c - 1) + N - c`` with ``c = ceil(N / every)``
    segments.
    """
    n, k = n_steps, every
    if n == 0:
        return 0, 0
    c = -(-n // k)
    last = n - k * (c - 1)
    plain = k * (c - 1) + n - c
    peak = c + max(last - 2, 0)
    if c >= 2:
        peak = max(peak, c - 1 + max(k - 2, 0))
    return plain, peak


def _best_periodic(n_steps: int, slots: int) -> int | None:
    """The ``every`` with the fewest plain evaluations whose peak fits in ``slots``, or ``None``."""
    n = n_steps
    top = min(n, slots + 2)  # peak >= every - 1, so larger periods never fit
    best: tuple[int, int, int] | None = None  # (plain, peak, every)

    def consider(k: int) -> bool:
        nonlocal best
        plain, peak = periodic_counts(n, k)
        if peak > slots:
            return False
        if best is None or (plain, peak) < best[:2]:
            best = (plain, peak, k)
        return True

    if top <= 100_000:
        for k in range(1, top + 1):
            consider(k)
    else:
        # The cost 2N - k - N/k is concave in k: the fitting extremes are the candidates.
        for k in range(1, top + 1):
            if consider(k):
                break
        for k in range(top, 0, -1):
            if consider(k):
                break
    return None if best is None else best[2]


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------


def _check_cost(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name}={value!r} must be a non-negative number (in units of one step).")
    if not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be finite.")
    return float(value)


def _budget(snapshots, memory, state_size, disk) -> tuple[int, int, int | None]:
    """Resolve the budget into (memory slots, disk slots, state size in bytes or None)."""
    size = None if state_size is None else parse_size(state_size, "state_size")
    if snapshots is not None and memory is not None:
        raise ValueError("Give either snapshots=... or memory=... (with state_size=...), not both.")
    if snapshots is not None:
        slots = check_snapshots(snapshots, "snapshots")
    elif memory is not None:
        if size is None:
            raise ValueError(
                "memory=... needs state_size=... (the bytes of one stored state) to count slots."
            )
        mem = parse_size(memory, "memory")
        slots = mem // size
        if slots < 1:
            raise ValueError(
                f"memory={memory!r} holds no state of state_size={state_size!r}: at least one "
                "slot (the initial state) is needed. Raise memory or shrink the state."
            )
    else:
        raise ValueError("Give a budget: snapshots=... (slots), or memory=... with state_size=....")
    return slots, _level_slots(disk, "disk", size, state_size), size


def _mixed(n: int, slots: int, memory, size: int | None, data_size) -> tuple[str, Mixed]:
    """The ``Mixed`` schedule of the budget (``slots``, or ``memory`` bytes of states of ``size``
    bytes) for one step's adjoint data of ``data_size`` (bytes with ``size``, else states)."""
    if size is None:
        if isinstance(data_size, bool) or not isinstance(data_size, (int, float)):
            raise TypeError(
                f"data_size={data_size!r}: without state_size=..., give the size of one step's "
                "adjoint data in states (a number such as 1.5), or give state_size=... too."
            )
        schedule = Mixed(slots, data_size)
    else:
        data = parse_size(data_size, "data_size")
        if memory is not None:
            schedule = Mixed.from_bytes(parse_size(memory, "memory"), size, data)
        else:
            schedule = Mixed(slots, Fraction(data, size))
    return f"Mixed({slots}, data {float(schedule.data_size):.3g})", schedule


def _row_from_stats(name, schedule, stats, disk_write_cost, disk_read_cost) -> dict:
    writes = sum(stats.writes[1:])
    reads = sum(stats.reads[1:])
    return dict(
        name=name,
        schedule=schedule,
        plain=stats.plain,
        recorded=stats.recorded,
        cost=stats.plain + stats.recorded + writes * disk_write_cost + reads * disk_read_cost,
        memory_slots=stats.peak_slots[0],
        disk_slots=sum(stats.peak_slots[1:]),
        disk_writes=writes,
        disk_reads=reads,
    )


def _multilevel(slots: int, disk_slots: int | None, write: float, read: float) -> MultiLevel:
    """Memory (``slots``) plus disk (``disk_slots``, ``None`` for unlimited)."""
    return MultiLevel(
        (
            Level(slots, name="memory"),
            Level(disk_slots, write_cost=write, read_cost=read, name="disk", storage="disk"),
        )
    )


#: Default cost of moving one state to or from host RAM, in step evaluations.
HOST_COST = 0.5


def _level_slots(budget, name: str, size, state_size) -> int:
    """Slots of a slower level (disk, host RAM) for the budget ``name=budget`` (0 without it)."""
    if budget is None:
        return 0
    if size is None:
        raise ValueError(f"{name}=... needs state_size=... (the bytes of one stored state).")
    slots = parse_size(budget, name) // size
    if slots < 1:
        raise ValueError(
            f"{name}={budget!r} holds no state of state_size={state_size!r}; raise {name} or "
            "drop it."
        )
    return slots


def _offload_row(
    n: int,
    slots: int,
    host_slots: int,
    host: tuple[float, float],
    disk_slots: int,
    disk: tuple[float, float],
) -> dict:
    """The ``MultiLevel`` row over a device level, a host level and (with ``disk_slots``) a disk
    level. An unlimited disk is planned first: when its peak fits, it is at least as cheap."""
    levels = [Level(slots, name="device"), Level(host_slots, *host, name="host", storage="host")]
    best = None
    for limit in (None, disk_slots) if disk_slots else (0,):
        extra = [Level(limit, *disk, name="disk", storage="disk")] if limit != 0 else []
        schedule = MultiLevel((*levels, *extra))
        stats = simulate(schedule, n)
        fits = not extra or stats.peak_slots[2] <= disk_slots
        if fits and (best is None or stats.cost < best[1].cost):
            best = (schedule, stats)
        if fits:
            break
    schedule, stats = best
    disk_level = len(stats.levels) == 3
    name = f"MultiLevel({slots} dev, {host_slots} host" + (
        f", {disk_slots} disk)" if disk_level else ")"
    )
    return dict(
        name=name,
        schedule=schedule,
        plain=stats.plain,
        recorded=stats.recorded,
        cost=stats.cost,
        memory_slots=stats.peak_slots[0],
        host_slots=stats.peak_slots[1],
        host_writes=stats.writes[1],
        host_reads=stats.reads[1],
        disk_slots=stats.peak_slots[2] if disk_level else 0,
        disk_writes=stats.writes[2] if disk_level else 0,
        disk_reads=stats.reads[2] if disk_level else 0,
    )


def _best_multilevel(n: int, slots: int, disk_slots: int, write: float, read: float):
    """``(schedule, stats)`` of the cheapest memory-plus-disk schedule within ``disk_slots``.

    The schedule for an unlimited disk is tried first: when its peak disk use fits, it is at
    least as cheap as any schedule restricted to ``disk_slots``.
    """
    schedule = _multilevel(slots, None, write, read)
    stats = simulate(schedule, n)
    if sum(stats.peak_slots[1:]) <= disk_slots:
        return schedule, stats
    schedule = _multilevel(slots, disk_slots, write, read)
    return schedule, simulate(schedule, n)


def plan(
    n_steps: int,
    snapshots: int | None = None,
    memory: str | int | None = None,
    state_size: str | int | None = None,
    disk: str | int | None = None,
    *,
    disk_write_cost: float = 2.0,
    disk_read_cost: float = 2.0,
    host_memory: str | int | None = None,
    host_write_cost: float = HOST_COST,
    host_read_cost: float = HOST_COST,
    data_size: str | int | float | None = None,
) -> list[Row]:
    """The schedules that reverse ``n_steps`` steps within a budget, cheapest first.

    Args:
        n_steps: the number of steps ``N >= 1``.
        snapshots: the number of snapshot slots in memory (the initial state's slot included).
        memory: alternatively a memory budget (bytes, or a size such as ``"2GiB"``); then
            ``snapshots = floor(memory / state_size)``.
        state_size: bytes of one stored state (or a size such as ``"10MiB"``); needed with
            ``memory`` or ``disk``, and turns slot counts into bytes.
        disk: an optional disk budget; adds a memory-plus-disk ``MultiLevel`` row with
            ``floor(disk / state_size)`` disk slots.
        disk_write_cost, disk_read_cost: the cost of writing/reading one state to/from disk, in
            units of one step evaluation.
        host_memory: an optional host-RAM budget beside ``memory`` (then device memory) for
            the compiled JAX loops: adds a ``MultiLevel`` row with a device level, a host level
            of ``floor(host_memory / state_size)`` slots (``storage="host"``) and, with
            ``disk``, a disk level (``storage="disk"``), ready for ``retrograde.scan``.
        host_write_cost, host_read_cost: the cost of moving one state to/from host RAM, in step
            evaluations (measure them with ``python -m retrograde calibrate``).
        data_size: the size of the data one step's adjoint needs (in JAX, the residuals
            ``jax.vjp`` keeps): in bytes (or a size such as ``"15MiB"``) when ``state_size`` is
            given, else in states (a number such as ``1.5``). Adds a ``Mixed`` row: the same
            memory budget, slots holding states or step data (``N <= MIXED_LIMIT``).

    Returns:
        A list of :class:`Row`, sorted by cost (ties: less memory first); ``rows[0]`` is the
        recommended schedule and has ``recommended=True``. Schedules that need more memory than
        the budget (e.g. ``StoreAll`` with fewer than ``N - 1`` slots) are left out.

    Cost: instant for any ``N`` for the closed-form schedules. ``MultiLevel`` (``N <=
    MULTILEVEL_LIMIT``) and ``Online`` (``N * s <= ONLINE_LIMIT``) are simulated, which takes up
    to a few seconds; beyond those sizes their rows are left out.

    Example:
        >>> [r.name for r in plan(1000, snapshots=10)][:1]
        ['Revolve(10)']

    Example:
        >>> from retrograde.planner import plan_with_notes
        >>> rows, notes = plan_with_notes(1000, snapshots=10)
        >>> rows[0].recommended
        True

    Example, with one step's adjoint data as large as a state:
        >>> best = plan(1000, snapshots=20, data_size=1)[0]
        >>> best.name, best.plain, best.linearized, best.recorded, best.evaluations
        ('Mixed(20, data 1)', 1823, 924, 76, 2823)
    """
    return plan_with_notes(
        n_steps,
        snapshots,
        memory,
        state_size,
        disk,
        disk_write_cost=disk_write_cost,
        disk_read_cost=disk_read_cost,
        host_memory=host_memory,
        host_write_cost=host_write_cost,
        host_read_cost=host_read_cost,
        data_size=data_size,
    )[0]


def plan_with_notes(
    n_steps: int,
    snapshots: int | None = None,
    memory: str | int | None = None,
    state_size: str | int | None = None,
    disk: str | int | None = None,
    *,
    disk_write_cost: float = 2.0,
    disk_read_cost: float = 2.0,
    host_memory: str | int | None = None,
    host_write_cost: float = HOST_COST,
    host_read_cost: float = HOST_COST,
    data_size: str | int | float | None = None,
) -> tuple[list[Row], list[str]]:
    """:func:`plan`, plus one line per schedule left out saying why."""
    n = check_steps(n_steps)
    if n < 1:
        raise ValueError(f"n_steps={n}: plan a loop of at least one step.")
    w = _check_cost(disk_write_cost, "disk_write_cost")
    r = _check_cost(disk_read_cost, "disk_read_cost")
    host = (
        _check_cost(host_write_cost, "host_write_cost"),
        _check_cost(host_read_cost, "host_read_cost"),
    )
    slots, disk_slots, size = _budget(snapshots, memory, state_size, disk)
    host_slots = _level_slots(host_memory, "host_memory", size, state_size)

    def nbytes(k: int) -> str:
        return f" ({format_size(k * size)})" if size is not None else ""

    rows: list[dict] = []
    notes: list[str] = []
    # Store everything: N - 1 slots.
    if n - 1 <= slots:
        rows.append(
            dict(
                name="StoreAll()",
                schedule=StoreAll(),
                plain=n - 1,
                recorded=n,
                cost=2 * n - 1,
                memory_slots=n - 1,
            )
        )
    else:
        notes.append(f"StoreAll() needs {n - 1:,} slots{nbytes(n - 1)}; the budget has {slots:,}.")
    # Revolve, with no more slots than it can use.
    s = max(1, min(slots, n - 1))
    if 1 < s < n - 1:  # with N - 1 slots Revolve is StoreAll
        t = revolve_optimum(n, s)
        rows.append(
            dict(
                name=f"Revolve({s})",
                schedule=Revolve(s),
                plain=t,
                recorded=n,
                cost=t + n,
                memory_slots=min(s, n),
            )
        )
    # Periodic with the best period that fits.
    every = _best_periodic(n, slots)
    if every is not None and 1 < every < n:
        plain, peak = periodic_counts(n, every)
        rows.append(
            dict(
                name=f"Periodic({every})",
                schedule=Periodic(every),
                plain=plain,
                recorded=n,
                cost=plain + n,
                memory_slots=peak,
            )
        )
    elif every is None and n > 2:
        k = max(1, math.isqrt(n))
        need = min(periodic_counts(n, kk)[1] for kk in (k, k + 1))
        notes.append(f"Periodic needs at least {need:,} slots{nbytes(need)} for N = {n:,}.")
    # Memory plus disk.
    if disk_slots:
        if n > MULTILEVEL_LIMIT:
            notes.append(f"MultiLevel is planned only up to N = {MULTILEVEL_LIMIT:,} here.")
        else:
            schedule, stats = _best_multilevel(n, slots, disk_slots, w, r)
            rows.append(
                _row_from_stats(
                    f"MultiLevel({slots} mem, {disk_slots} disk)", schedule, stats, w, r
                )
            )
    # Device plus host (plus disk), for the compiled loops.
    if host_slots:
        if n > MULTILEVEL_LIMIT:
            notes.append(f"MultiLevel is planned only up to N = {MULTILEVEL_LIMIT:,} here.")
        else:
            rows.append(_offload_row(n, slots, host_slots, host, disk_slots, (w, r)))
    # Mixed checkpointing, when the size of a step's adjoint data is known.
    if data_size is not None:
        mixed = _mixed(n, slots, memory, size, data_size)
        if n > MIXED_LIMIT:
            notes.append(f"{mixed[0]} is simulated only up to N = {MIXED_LIMIT:,} here.")
        else:
            name, schedule = mixed
            try:
                stats = simulate(schedule, n)
            except ValueError as err:  # a dynamic program over its limit
                notes.append(f"{name}: {err}")
            else:
                row = _row_from_stats(name, schedule, stats, w, r)
                row["linearized"] = stats.linearized
                row["cost"] += stats.linearized
                if size is not None:
                    row["memory_bytes"] = round(stats.peak_memory[0] * size)
                rows.append(row)
    # Online (for loops whose step count is not known in advance), for comparison.
    if s > 1:
        if n * s > ONLINE_LIMIT:
            notes.append(
                f"Online({s}) (unknown N) is simulated only for N * s <= {ONLINE_LIMIT:,}."
            )
        else:
            schedule = Online(s)
            stats = simulate(schedule, n)
            rows.append(_row_from_stats(f"Online({s})", schedule, stats, w, r))
    # Recompute everything from the initial state: one slot.
    t = n * (n - 1) // 2
    rows.append(
        dict(
            name="RecomputeAll()",
            schedule=RecomputeAll(),
            plain=t,
            recorded=n,
            cost=t + n,
            memory_slots=1,
        )
    )

    rows.sort(
        key=lambda row: (
            row["cost"],
            row["memory_slots"],
            row.get("host_slots", 0),
            row.get("disk_slots", 0),
        )
    )
    out = []
    for i, row in enumerate(rows):
        if size is not None:
            row.setdefault("memory_bytes", row["memory_slots"] * size)
            row["disk_bytes"] = row.get("disk_slots", 0) * size
            row["host_bytes"] = row.get("host_slots", 0) * size
        out.append(Row(n_steps=n, recommended=(i == 0), **row))
    return out, notes


def _fmt_int(value: int) -> str:
    return f"{value:,}"


def format_table(rows: Sequence[Row], *, disk: bool | None = None) -> str:
    """Render rows as a plain-text table; the recommended row is marked with ``*``.

    Columns: plain (with a ``Mixed`` row, linearized), recorded and total evaluations; with disk
    (or host), the cost including
    transfers; the overhead (cost over ``2N - 1``); peak memory slots (and bytes when the state
    size is known); with host, peak host slots and bytes; with disk, peak disk slots and bytes.
    """
    if disk is None:
        disk = any(row.disk_slots for row in rows)
    host = any(row.host_slots for row in rows)
    mixed = any(row.linearized for row in rows)
    has_bytes = any(row.memory_bytes is not None for row in rows)
    header = ["", "schedule", "plain"] + (["linearized"] if mixed else []) + ["recorded", "total"]
    if disk or host:
        header.append("cost")
    header += ["overhead", "slots"]
    if has_bytes:
        header.append("peak memory")
    if host:
        header += ["host slots", "peak host"]
    if disk:
        header += ["disk slots", "peak disk"]
    lines = []
    for row in rows:
        cells = [
            "*" if row.recommended else "",
            row.name,
            _fmt_int(row.plain),
            *([_fmt_int(row.linearized)] if mixed else []),
            _fmt_int(row.recorded),
            _fmt_int(row.evaluations),
        ]
        if disk or host:
            cells.append(
                f"{row.cost:,.1f}" if row.cost != int(row.cost) else _fmt_int(int(row.cost))
            )
        cells += [
            f"{row.overhead:.3f}" if row.overhead < 1000 else f"{row.overhead:,.0f}",
            _fmt_int(row.memory_slots),
        ]
        if has_bytes:
            cells.append(format_size(row.memory_bytes) if row.memory_bytes is not None else "-")
        if host:
            cells += [
                _fmt_int(row.host_slots),
                format_size(row.host_bytes) if row.host_bytes else "-",
            ]
        if disk:
            cells += [
                _fmt_int(row.disk_slots),
                format_size(row.disk_bytes) if row.disk_bytes else "-",
            ]
        lines.append(cells)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *lines)]
    left = {0, 1}

    def render(cells):
        return "  ".join(
            str(c).ljust(w) if i in left else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([render(header), rule] + [render(c) for c in lines])


def plot_schedule(
    schedule: Schedule, n_steps: int, path: str | os.PathLike | None, **kwargs: Any
) -> tuple[Figure, Stats]:
    """Draw ``schedule`` for ``n_steps`` steps as a step-versus-time picture; see
    :func:`retrograde.plot.plot_schedule`.

    Example: ``plot_schedule(Revolve(5), 60, "schedule.png")`` writes the picture (plain sweeps
    grey, recorded steps red, stores and restores coloured by level).
    """
    from .plot import plot_schedule as _plot

    return _plot(schedule, n_steps, path, **kwargs)
