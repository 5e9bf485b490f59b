"""The classic step-versus-time picture of a checkpointing schedule (matplotlib, Agg backend).

x is time, counted in step evaluations (plain and recorded alike); y is the step index. Plain
evaluations are thin lines going up, recorded evaluations (step plus adjoint) a thick line going
down from ``N`` to ``0``, every snapshot store a dot at the stored step, colored by storage
level, and (for up to 2000 steps) every restore a dotted jump in that level's color. Drawing uses line collections, so even long schedules render in seconds.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from .schedules import (
    Advance,
    End,
    Free,
    OfflineSchedule,
    OnlineSchedule,
    Record,
    Restore,
    Schedule,
    ScheduleError,
    Store,
    execute,
)
from .schedules._base import check_steps

__all__ = ["plot_schedule", "schedule_stream"]

#: Above this many steps the picture is refused: it would take long and show nothing more.
PLOT_LIMIT = 1_000_000

_LEVEL_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown")


def schedule_stream(schedule: Schedule, n_steps: int) -> Iterator:
    """The full action stream of ``schedule`` for ``n_steps`` steps, offline or online.

    For an online schedule this plays its protocol: ``on_step(n)`` then ``Advance(n, n + 1)`` for
    every step, then ``reverse(n_steps)``.

    Example: ``list(schedule_stream(Revolve(3), 10))`` equals ``list(Revolve(3).actions(10))``.
    """
    if isinstance(schedule, OnlineSchedule):
        run = schedule.start()
        for n in range(n_steps):
            for action in run.on_step(n):
                if type(action) not in (Store, Free):
                    raise ScheduleError(f"on_step({n}) returned {action}; only Store/Free allowed.")
                yield action
            yield Advance(n, n + 1)
        yield from run.reverse(n_steps)
    elif isinstance(schedule, OfflineSchedule):
        yield from schedule.actions(n_steps)
    else:
        raise TypeError(f"schedule must be a Schedule such as Revolve(10), got {schedule!r}.")


def _label(schedule: Schedule) -> str:
    text = repr(schedule)
    return text if len(text) <= 60 else type(schedule).__name__


def plot_schedule(
    schedule: Schedule,
    n_steps: int,
    path: str | os.PathLike | None = None,
    *,
    title: str | None = None,
    figsize: tuple[float, float] = (10.0, 6.0),
    dpi: int = 120,
):
    """Draw ``schedule`` reversing ``n_steps`` steps, and save it to ``path`` (PNG, SVG, PDF).

    The schedule is validated while it is drawn (an invalid one raises
    :class:`~retrograde.schedules.ScheduleError`), and the title gives ``N``, the slots and the
    evaluation counts.

    Args:
        schedule: any offline or online schedule.
        n_steps: the number of steps ``N`` (at most ``PLOT_LIMIT``).
        path: where to save the figure; ``None`` to only return it.
        title: replaces the default title.
        figsize, dpi: figure size in inches and resolution.

    Returns:
        ``(figure, stats)``: the matplotlib figure and the schedule's
        :class:`~retrograde.schedules.Stats`.

    Cost: one pass over the schedule's actions; about a second per 10^5 steps.

    Example:
        >>> from retrograde.schedules import Revolve
        >>> from retrograde.plot import plot_schedule
        >>> fig, stats = plot_schedule(Revolve(4), 40, "revolve.png")  # doctest: +SKIP
    """
    if not isinstance(schedule, (OfflineSchedule, OnlineSchedule)):
        raise TypeError(f"schedule must be a Schedule such as Revolve(10), got {schedule!r}.")
    n_steps = check_steps(n_steps)
    if n_steps > PLOT_LIMIT:
        raise ValueError(
            f"n_steps={n_steps} is too many to draw (at most {PLOT_LIMIT}); plot a shorter loop "
            "with the same number of slots to see the pattern."
        )
    # The Agg canvas is used directly (no pyplot): no GUI backend and no global state.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    levels = schedule.levels
    advances: list[tuple[tuple[int, int], tuple[int, int]]] = []
    rec_t: list[float] = []
    rec_n: list[float] = []
    stores: list[list[tuple[int, int]]] = [[] for _ in levels]
    restores: list[tuple[tuple[int, int], tuple[int, int]]] = []
    restore_colors: list[str] = []
    clock = 0
    state = 0

    def drawn() -> Iterator:
        nonlocal clock, state
        for action in schedule_stream(schedule, n_steps):
            kind = type(action)
            if kind is Advance:
                a, b = action
                advances.append(((clock, a), (clock + b - a, b)))
                clock += b - a
                state = b
            elif kind is Record:
                n = action.step
                if rec_t and rec_t[-1] != clock:  # recomputation in between: break the line
                    rec_t.append(float("nan"))
                    rec_n.append(float("nan"))
                if not rec_t or rec_t[-1] != clock:
                    rec_t.append(clock)
                    rec_n.append(n + 1)
                rec_t.append(clock + 1)
                rec_n.append(n)
                clock += 1
                state = n
            elif kind is Store:
                if 0 <= action.level < len(stores):
                    stores[action.level].append((clock, action.step))
            elif kind is Restore:
                if action.step != state:
                    restores.append(((clock, state), (clock, action.step)))
                    restore_colors.append(_LEVEL_COLORS[action.level % len(_LEVEL_COLORS)])
                state = action.step
            yield action

    stats = execute(drawn(), n_steps, levels)

    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    big = n_steps > 2000
    thin = 0.6 if big else 1.0
    if restores and not big:
        ax.add_collection(
            LineCollection(restores, colors=restore_colors, linewidths=0.8, linestyles=":",
                           alpha=0.6, zorder=1)
        )
    if advances:
        ax.add_collection(LineCollection(advances, colors="0.35", linewidths=thin, zorder=2))
    if rec_t:
        ax.plot(rec_t, rec_n, color="tab:red", linewidth=2.5, solid_capstyle="butt", zorder=3)
    # Stores: dots on top for small N; otherwise small dots under the recorded line.
    few = n_steps <= 300
    marker = max(2.5, min(6.0, 300.0 / max(n_steps, 1))) if few else 1.5
    for k, points in enumerate(stores):
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, linestyle="none", marker="o", markersize=marker, markeredgewidth=0,
                    color=_LEVEL_COLORS[k % len(_LEVEL_COLORS)], zorder=4 if few else 2.5)

    handles = [
        Line2D([], [], color="0.35", linewidth=1.0, label=f"plain evaluation ({stats.plain:,})"),
        Line2D([], [], color="tab:red", linewidth=2.5,
               label=f"recorded evaluation ({stats.recorded:,})"),
    ]
    for k, level in enumerate(levels):
        name = level.name or f"level {k}"
        handles.append(
            Line2D([], [], linestyle="none", marker="o", color=_LEVEL_COLORS[k % len(_LEVEL_COLORS)],
                   label=f"store to {name} ({stats.writes[k]:,}, peak {stats.peak_slots[k]:,} slots)")
        )
    ax.legend(handles=handles, loc="upper right", fontsize=8, framealpha=0.9)
    ax.set_xlim(0, max(clock, 1))
    ax.set_ylim(0, max(n_steps, 1) * 1.02)
    ax.set_xlabel("time (step evaluations)")
    ax.set_ylabel("step")
    ax.grid(True, color="0.93", zorder=0)
    slots = "+".join(f"{p:,}" for p in stats.peak_slots)
    ax.set_title(
        title
        or (
            f"{_label(schedule)}: N = {n_steps:,}, slots = {slots}\n"
            f"plain {stats.plain:,} + recorded {stats.recorded:,} = "
            f"{stats.evaluations:,} evaluations"
            + (f", cost {stats.cost:,.6g} with transfers" if stats.cost != stats.evaluations else "")
        ),
        fontsize=10,
    )
    fig.tight_layout()
    if path is not None:
        fig.savefig(os.fspath(path))
    return fig, stats
