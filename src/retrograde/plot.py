"""The classic step-versus-time picture of a checkpointing schedule (matplotlib, Agg backend).

x is time, counted in step evaluations (plain and recorded alike); y is the step index. Plain
evaluations are thin lines going up, recorded evaluations (step plus adjoint) a thick line going
down from ``N`` to ``0``, every snapshot store a dot at the stored step, colored by storage
level, and (for up to 2000 steps) every restore a dotted jump in that level's color. Mixed
schedules add two strokes: a ``Linearize`` (an evaluation that keeps the step's adjoint data) is
a green line going up, a ``Reverse`` (the adjoint from that data, no evaluation) a purple line
going down; each takes one unit of time, like a recorded step. Drawing uses line collections,
so even long schedules render in seconds.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .schedules import (
    Advance,
    Executor,
    Linearize,
    OfflineSchedule,
    OnlineSchedule,
    Record,
    Restore,
    Reverse,
    Schedule,
    Simulator,
    Stats,
    Store,
    check_steps,
    schedule_stream,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_schedule", "schedule_stream"]

#: Above this many steps the picture is refused: it would take long and show nothing more.
PLOT_LIMIT = 1_000_000

_LEVEL_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown")
_LINEARIZE, _REVERSE = "tab:green", "tab:purple"


class _Picture(Executor):
    """The lines and dots of the picture, one action at a time (after the simulator has proven
    the action valid). ``clock`` counts evaluations; ``pen`` is the step the picture is at."""

    def __init__(self, n_levels: int):
        self.advances: list[tuple[tuple[int, int], tuple[int, int]]] = []
        self.rec_t: list[float] = []
        self.rec_n: list[float] = []
        self.stores: list[list[tuple[int, int]]] = [[] for _ in range(n_levels)]
        self.restores: list[tuple[tuple[int, int], tuple[int, int]]] = []
        self.restore_colors: list[str] = []
        self.linearized: list[tuple[tuple[int, int], tuple[int, int]]] = []
        self.reversed: list[tuple[tuple[int, int], tuple[int, int]]] = []
        self.clock = 0
        self.pen = 0

    def advance(self, action: Advance) -> None:
        a, b = action
        self.advances.append(((self.clock, a), (self.clock + b - a, b)))
        self.clock += b - a
        self.pen = b

    def record(self, action: Record) -> None:
        n, t = action.step, self.clock
        if self.rec_t and self.rec_t[-1] != t:  # recomputation in between: break the line
            self.rec_t.append(float("nan"))
            self.rec_n.append(float("nan"))
        if not self.rec_t or self.rec_t[-1] != t:
            self.rec_t.append(t)
            self.rec_n.append(n + 1)
        self.rec_t.append(t + 1)
        self.rec_n.append(n)
        self.clock += 1
        self.pen = n

    def store(self, action: Store) -> None:
        self.stores[action.level].append((self.clock, action.step))

    def linearize(self, action: Linearize) -> None:
        n, t = action.step, self.clock
        self.linearized.append(((t, n), (t + 1, n + 1)))
        self.clock += 1
        self.pen = n + 1

    def reverse(self, action: Reverse) -> None:
        n, t = action.step, self.clock
        self.reversed.append(((t, n + 1), (t + 1, n)))
        self.clock += 1
        self.pen = n

    def restore(self, action: Restore) -> None:
        if action.step != self.pen:
            self.restores.append(((self.clock, self.pen), (self.clock, action.step)))
            self.restore_colors.append(_LEVEL_COLORS[action.level % len(_LEVEL_COLORS)])
        self.pen = action.step


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
) -> tuple[Figure, Stats]:
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

    Cost: one pass over the schedule's actions, then drawing them.

    Example (``plot_schedule(Revolve(4), 40, "revolve.png")`` also saves the picture):
        >>> from retrograde.schedules import Mixed, Revolve
        >>> from retrograde.plot import plot_schedule
        >>> fig, stats = plot_schedule(Revolve(4), 40)
        >>> stats.plain, stats.recorded, stats.peak_slots
        (104, 40, (4,))
        >>> fig, stats = plot_schedule(Mixed(4), 40)
        >>> stats.plain, stats.linearized, stats.recorded, stats.reversed
        (81, 23, 17, 23)
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
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.collections import LineCollection
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "retrograde.plot.plot_schedule needs matplotlib, which is not installed: install the "
            "extra with pip install 'retrograde[plot]'."
        ) from e

    levels = schedule.levels
    sim, pic = Simulator.for_schedule(schedule, n_steps), _Picture(len(levels))
    for action in schedule_stream(schedule, n_steps):
        sim.execute(action)  # raises ScheduleError if the schedule is invalid
        pic.execute(action)
    stats = sim.stats()
    advances, rec_t, rec_n, stores = pic.advances, pic.rec_t, pic.rec_n, pic.stores
    restores, restore_colors, clock = pic.restores, pic.restore_colors, pic.clock

    fig = Figure(figsize=figsize, dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    big = n_steps > 2000
    thin = 0.6 if big else 1.0
    if restores and not big:
        ax.add_collection(
            LineCollection(
                restores, colors=restore_colors, linewidths=0.8, linestyles=":", alpha=0.6, zorder=1
            )
        )
    if advances:
        ax.add_collection(LineCollection(advances, colors="0.35", linewidths=thin, zorder=2))
    if rec_t:
        ax.plot(rec_t, rec_n, color="tab:red", linewidth=2.5, solid_capstyle="butt", zorder=3)
    if pic.linearized:
        ax.add_collection(
            LineCollection(pic.linearized, colors=_LINEARIZE, linewidths=1.8 * thin, zorder=2.8)
        )
    if pic.reversed:
        ax.add_collection(
            LineCollection(pic.reversed, colors=_REVERSE, linewidths=2.5, zorder=3, capstyle="butt")
        )
    # Stores: dots on top for small N; otherwise small dots under the recorded line.
    few = n_steps <= 300
    marker = max(2.5, min(6.0, 300.0 / max(n_steps, 1))) if few else 1.5
    for k, points in enumerate(stores):
        if points:
            xs, ys = zip(*points)
            ax.plot(
                xs,
                ys,
                linestyle="none",
                marker="o",
                markersize=marker,
                markeredgewidth=0,
                color=_LEVEL_COLORS[k % len(_LEVEL_COLORS)],
                zorder=4 if few else 2.5,
            )

    handles = [
        Line2D([], [], color="0.35", linewidth=1.0, label=f"plain evaluation ({stats.plain:,})"),
        Line2D(
            [],
            [],
            color="tab:red",
            linewidth=2.5,
            label=f"recorded evaluation ({stats.recorded:,})",
        ),
    ]
    if stats.linearized or stats.reversed:
        handles += [
            Line2D(
                [],
                [],
                color=_LINEARIZE,
                linewidth=1.8,
                label=f"linearized evaluation, data kept ({stats.linearized:,})",
            ),
            Line2D(
                [],
                [],
                color=_REVERSE,
                linewidth=2.5,
                label=f"reversed from data ({stats.reversed:,})",
            ),
        ]
    for k, level in enumerate(levels):
        name = level.name or f"level {k}"
        handles.append(
            Line2D(
                [],
                [],
                linestyle="none",
                marker="o",
                color=_LEVEL_COLORS[k % len(_LEVEL_COLORS)],
                label=f"store to {name} ({stats.writes[k]:,}, peak {stats.peak_slots[k]:,} slots)",
            )
        )
    ax.legend(handles=handles, loc="upper right", fontsize=8, framealpha=0.9)
    ax.set_xlim(0, max(clock, 1))
    ax.set_ylim(0, max(n_steps, 1) * 1.02)
    ax.set_xlabel(
        "time (step evaluations; a reverse from data counts one)"
        if stats.reversed
        else "time (step evaluations)"
    )
    ax.set_ylabel("step")
    ax.grid(True, color="0.93", zorder=0)
    slots = "+".join(f"{p:,}" for p in stats.peak_slots)
    ax.set_title(
        title
        or (
            f"{_label(schedule)}: N = {n_steps:,}, slots = {slots}\n"
            f"plain {stats.plain:,} + "
            + (f"linearized {stats.linearized:,} + " if stats.linearized else "")
            + f"recorded {stats.recorded:,} = {stats.evaluations:,} evaluations"
            + (
                f", cost {stats.cost:,.6g} with transfers"
                if stats.cost != stats.evaluations
                else ""
            )
        ),
        fontsize=10,
    )
    fig.tight_layout()
    if path is not None:
        fig.savefig(os.fspath(path))
    return fig, stats
