"""Command line: ``python -m retrograde plan ...`` (also installed as ``retrograde``).

Examples::

    python -m retrograde plan --steps 10000 --snapshots 20
    python -m retrograde plan --steps 1e5 --memory 2GiB --state-size 10MiB --plot schedule.png
    python -m retrograde plan --steps 1e5 --memory 2GiB --state-size 10MiB --disk 50GiB
    python -m retrograde plan --steps 1e5 --state-size 1GiB --memory 16GiB --host-memory 500GiB
    python -m retrograde calibrate --state-size 64MiB --step-time 0.02
    python -m retrograde clean /scratch/me --dry-run

``plan`` prints the schedules that fit the budget, cheapest first, and marks the recommended
one with ``*``; ``--plot`` draws the recommended (or ``--schedule``-chosen) schedule.
``--host-memory`` adds a device + host (+ disk) plan for the compiled JAX loops (``--memory`` is
then device memory). ``calibrate`` measures the cost of moving one state to host RAM and disk
and back inside a compiled program. ``clean`` removes snapshot directories of
``retrograde.host`` runs whose process was killed.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from collections.abc import Sequence

__all__ = ["main", "build_parser"]

_SCHEDULE_CHOICES = (
    "storeall",
    "revolve",
    "periodic",
    "multilevel",
    "online",
    "recomputeall",
    "mixed",
)


def _steps(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a step count; write an integer such as 10000 or 1e6"
        ) from None
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number of steps >= 1")
    return int(value)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{value} is too few: at least one slot (the one holding the initial state)"
        )
    return value


def _size(text: str) -> int:
    from .planner import parse_size

    try:
        return parse_size(text, "size")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).replace("size=", "", 1)) from None


def _cost(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a non-negative number of steps")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``retrograde`` command (subcommands: ``plan``, ``calibrate``,
    ``clean``)."""
    parser = argparse.ArgumentParser(
        prog="retrograde",
        description="Checkpointed differentiation of long time-stepping loops.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser(
        "plan",
        help="list the checkpointing schedules that fit a memory budget, cheapest first",
        description=(
            "List the schedules that reverse --steps steps within a memory (and disk) budget, "
            "cheapest first; the recommended one is marked '*'. Costs are in step evaluations: "
            "plain (no recording: first sweep and recomputations) plus recorded (step with "
            "its adjoint, exactly N). Overhead = cost / (2N - 1), the cost of storing every "
            "state. Sizes: 2GiB, 500MB, 10MiB, 1e9 (bytes)."
        ),
    )
    p.add_argument(
        "--steps",
        "-n",
        type=_steps,
        required=True,
        metavar="N",
        help="number of time steps N (e.g. 10000 or 1e6)",
    )
    p.add_argument(
        "--snapshots",
        "-s",
        type=_positive_int,
        metavar="S",
        help="snapshot slots in memory, the initial state's included",
    )
    p.add_argument(
        "--memory",
        type=_size,
        metavar="SIZE",
        help="memory budget for snapshots (needs --state-size); slots = memory // state size",
    )
    p.add_argument(
        "--state-size",
        type=_size,
        metavar="SIZE",
        help="bytes of one stored state (the loop carry)",
    )
    p.add_argument(
        "--data-size",
        metavar="SIZE",
        help="size of the data one step's adjoint needs (its residuals): bytes with "
        "--state-size (e.g. 15MiB), else states (e.g. 1.5); adds a mixed-checkpointing row",
    )
    p.add_argument(
        "--disk",
        type=_size,
        metavar="SIZE",
        help="disk budget for a memory-plus-disk schedule (needs --state-size)",
    )
    p.add_argument(
        "--disk-write-cost",
        type=_cost,
        default=2.0,
        metavar="STEPS",
        help="cost of writing one state to disk, in step evaluations (default 2)",
    )
    p.add_argument(
        "--disk-read-cost",
        type=_cost,
        default=2.0,
        metavar="STEPS",
        help="cost of reading one state from disk, in step evaluations (default 2)",
    )
    p.add_argument(
        "--host-memory",
        type=_size,
        metavar="SIZE",
        help="host-RAM budget for the compiled JAX loops (needs --state-size); "
        "--memory is then device memory",
    )
    p.add_argument(
        "--host-write-cost",
        type=_cost,
        default=0.5,
        metavar="STEPS",
        help="cost of moving one state to host RAM, in step evaluations (default 0.5;"
        " measure it with 'retrograde calibrate')",
    )
    p.add_argument(
        "--host-read-cost",
        type=_cost,
        default=0.5,
        metavar="STEPS",
        help="cost of moving one state back from host RAM (default 0.5)",
    )
    p.add_argument(
        "--plot",
        metavar="FILE",
        help="draw the chosen schedule, step versus time, into FILE (.png, .svg, .pdf)",
    )
    p.add_argument(
        "--schedule",
        choices=_SCHEDULE_CHOICES,
        type=str.lower,
        help="the schedule to draw with --plot (default: the recommended one)",
    )
    p.set_defaults(handler=functools.partial(_plan, plan_parser=p))
    k = sub.add_parser(
        "calibrate",
        help="measure the cost of moving one state to host RAM and disk inside compiled loops",
        description=(
            "Time the transfers of one state of --state-size bytes (float64) to host RAM and to "
            "disk and back, inside one compiled program, as the offloaded levels of "
            "retrograde.scan make them. With --step-time (seconds per step of your loop), "
            "prints the costs in step evaluations for 'retrograde plan'."
        ),
    )
    k.add_argument(
        "--state-size",
        type=_size,
        required=True,
        metavar="SIZE",
        help="bytes of one stored state (the loop carry)",
    )
    k.add_argument(
        "--repeats",
        type=_positive_int,
        default=4,
        metavar="R",
        help="states written and read back per level (default 4)",
    )
    k.add_argument(
        "--directory",
        metavar="DIR",
        help="where the disk level's temporary file goes (default: the system's "
        "temporary directory)",
    )
    k.add_argument(
        "--step-time",
        type=float,
        metavar="SECONDS",
        help="seconds per step of your loop, to express the costs in steps",
    )
    k.set_defaults(handler=_calibrate)
    c = sub.add_parser(
        "clean",
        help="remove snapshot directories left by killed retrograde.host runs",
        description=(
            "Remove the retrograde-* snapshot directories in DIRECTORY whose process, on this "
            "host, no longer runs (killed with SIGKILL, aborted). Directories of running "
            "processes and of other hosts are kept."
        ),
    )
    c.add_argument(
        "directories",
        nargs="*",
        metavar="DIRECTORY",
        help="where the Disk(directory=...) snapshots were (default: the system's "
        "temporary directory)",
    )
    c.add_argument("--dry-run", "-n", action="store_true", help="list them; remove nothing")
    c.set_defaults(handler=_clean)
    return parser


def _clean(args: argparse.Namespace) -> int:
    """List (and remove) the stale snapshot directories: ``retrograde.host.remove_stale``."""
    from .host import remove_stale

    for directory in args.directories or [None]:
        for d in remove_stale(directory, dry_run=args.dry_run):
            owner = "" if d.pid is None else f"  (process {d.pid} on {d.host})"
            print(f"{d.action:<14} {d.path}{owner}")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    """Print the measured transfer times (and costs in steps): ``loops.calibrate``."""
    from .loops._calibrate import calibrate
    from .planner import format_size

    rows = calibrate(args.state_size, repeats=args.repeats, directory=args.directory)
    print(
        f"Moving one state of {format_size(args.state_size)} inside a compiled program "
        f"({args.repeats} writes and reads per level):"
    )
    for row in rows:
        line = (
            f"  {row.storage:<5} write {row.write_seconds * 1e3:9.2f} ms  "
            f"read {row.read_seconds * 1e3:9.2f} ms"
        )
        if args.step_time:
            line += (
                f"   = {row.write_seconds / args.step_time:.3g} / "
                f"{row.read_seconds / args.step_time:.3g} steps"
            )
        print(line)
    if args.step_time:
        host, disk = rows[0], rows[1]
        print(
            f"retrograde plan ... --host-write-cost {host.write_seconds / args.step_time:.3g} "
            f"--host-read-cost {host.read_seconds / args.step_time:.3g} "
            f"--disk-write-cost {disk.write_seconds / args.step_time:.3g} "
            f"--disk-read-cost {disk.read_seconds / args.step_time:.3g}"
        )
    return 0


def _plan(args: argparse.Namespace, plan_parser: argparse.ArgumentParser) -> int:
    """Print the plan table (and draw the chosen schedule); errors go through ``plan_parser``."""
    from .planner import format_size, format_table, plan_with_notes

    if args.snapshots is None and args.memory is None:
        plan_parser.error("give a budget: --snapshots S, or --memory SIZE with --state-size SIZE")
    if args.snapshots is not None and args.memory is not None:
        plan_parser.error("--snapshots and --memory are alternatives; give one of them")
    if args.memory is not None and args.state_size is None:
        plan_parser.error("--memory needs --state-size (the bytes of one stored state)")
    if args.disk is not None and args.state_size is None:
        plan_parser.error("--disk needs --state-size (the bytes of one stored state)")
    if args.host_memory is not None and args.state_size is None:
        plan_parser.error("--host-memory needs --state-size (the bytes of one stored state)")
    if args.host_memory is not None and args.host_memory < args.state_size:
        plan_parser.error(
            f"--host-memory {format_size(args.host_memory)} holds no state of --state-size "
            f"{format_size(args.state_size)}"
        )
    if args.memory is not None and args.memory < args.state_size:
        plan_parser.error(
            f"--memory {format_size(args.memory)} holds no state of --state-size "
            f"{format_size(args.state_size)}; at least one slot is needed"
        )
    if args.disk is not None and args.disk < args.state_size:
        plan_parser.error(
            f"--disk {format_size(args.disk)} holds no state of --state-size "
            f"{format_size(args.state_size)}"
        )
    if args.schedule is not None and args.plot is None:
        plan_parser.error("--schedule chooses the schedule to draw; give --plot FILE too")
    data_size = args.data_size
    if data_size is not None:
        if args.state_size is not None:
            try:
                data_size = _size(data_size)
            except argparse.ArgumentTypeError as err:
                plan_parser.error(f"--data-size {args.data_size}: {err}")
        else:
            try:
                data_size = float(data_size)
            except ValueError:
                plan_parser.error(
                    f"--data-size {data_size}: without --state-size, give the size of one "
                    "step's adjoint data in states (a number such as 1.5)"
                )
            if not (math.isfinite(data_size) and data_size > 0):
                plan_parser.error(f"--data-size {args.data_size} must be a positive number")

    rows, notes = plan_with_notes(
        args.steps,
        snapshots=args.snapshots,
        memory=args.memory,
        state_size=args.state_size,
        disk=args.disk,
        disk_write_cost=args.disk_write_cost,
        disk_read_cost=args.disk_read_cost,
        host_memory=args.host_memory,
        host_write_cost=args.host_write_cost,
        host_read_cost=args.host_read_cost,
        data_size=data_size,
    )
    n = args.steps
    chosen = None
    if args.plot is not None:  # check the plot request before printing anything
        from .plot import PLOT_LIMIT

        if n > PLOT_LIMIT:
            plan_parser.error(f"--plot draws at most {PLOT_LIMIT:,} steps; --steps is {n:,}")
        chosen = rows[0]
        if args.schedule is not None:
            matches = [r for r in rows if r.name.lower().startswith(args.schedule)]
            if not matches:
                plan_parser.error(
                    f"--schedule {args.schedule}: no such schedule fits the budget; choose one of "
                    + ", ".join(r.name.split("(")[0].lower() for r in rows)
                )
            chosen = matches[0]
    slots = args.snapshots if args.snapshots is not None else args.memory // args.state_size
    budget = f"{slots:,} {'device' if args.host_memory is not None else 'memory'} slots"
    if args.state_size is not None:
        budget += f" of {format_size(args.state_size)} ({format_size(slots * args.state_size)})"
    if args.host_memory is not None:
        host_slots = args.host_memory // args.state_size
        budget += (
            f", {host_slots:,} host slots ({format_size(host_slots * args.state_size)}, "
            f"write {args.host_write_cost:g}, read {args.host_read_cost:g} steps)"
        )
    if args.disk is not None:
        disk_slots = args.disk // args.state_size
        budget += (
            f", {disk_slots:,} disk slots ({format_size(disk_slots * args.state_size)}, "
            f"write {args.disk_write_cost:g}, read {args.disk_read_cost:g} steps)"
        )
    print(f"Reversing N = {n:,} steps with {budget}.")
    print()
    print(format_table(rows))
    print()
    best = rows[0]
    print(f"* recommended: {best.name}, {best.overhead:.3f}x the cost of storing every state.")
    for note in notes:
        print(f"  left out: {note}")

    if chosen is not None:
        from .plot import plot_schedule

        plot_schedule(chosen.schedule, n, args.plot)
        print(f"Drew {chosen.name} for N = {n:,} into {args.plot}.")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``retrograde`` command line with ``argv`` (default: ``sys.argv[1:]``).

    Returns the exit status; errors in the arguments exit with status 2 and a message naming
    the flag.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
