"""Choosing a schedule: the planner, from Python and from the command line.

    python examples/planner.py      # a few seconds; writes planner_schedule.png

The question the planner answers: "my loop has N steps, one state is X bytes and I can spend Y
bytes (and maybe Z bytes of disk) on snapshots; which schedule, and at what recomputation cost?"
The same from a shell:

    python -m retrograde plan --steps 10000 --memory 2GiB --state-size 10MiB
    python -m retrograde plan --steps 10000 --snapshots 50 --plot schedule.png
    python -m retrograde plan --steps 100000 --memory 1GiB --state-size 10MiB --disk 50GiB \\
        --disk-write-cost 3 --disk-read-cost 2

(``retrograde plan`` once installed; ``--schedule revolve|periodic|multilevel|online|...`` picks
the schedule to draw with ``--plot``.)
"""

import subprocess
import sys

from retrograde.planner import format_size, format_table, plan, plot_schedule
from retrograde.schedules import Revolve, revolve_optimum, simulate

# 1. A budget in slots: rows sorted by cost, rows[0] recommended.
rows = plan(10_000, snapshots=50)
print(format_table(rows))
best = rows[0]
print(
    f"\nrecommended: {best.name}: {best.plain:,} plain + {best.recorded:,} recorded evaluations, "
    f"{best.overhead:.2f}x the cost of storing every state"
)

# 2. A budget in bytes, with a disk level: the planner turns sizes into slots.
rows = plan(
    10_000, memory="200MiB", state_size="10MiB", disk="20GiB", disk_write_cost=3, disk_read_cost=2
)
print()
print(format_table(rows))
r = rows[0]
print(
    f"\n{r.name}: {r.memory_slots} memory slots ({format_size(r.memory_bytes)}), "
    f"{r.disk_slots} disk slots, {r.disk_writes} disk writes, {r.disk_reads} disk reads"
)

# 3. The schedule object is what the loops take: retrograde.scan(..., schedule=rows[0].schedule)
#    or retrograde.host.value_and_grad(..., schedule=...). simulate() proves and counts it.
stats = simulate(Revolve(50), 10_000)
print(
    f"\nsimulate(Revolve(50), 10000): plain {stats.plain:,} = revolve_optimum "
    f"{revolve_optimum(10_000, 50):,}; peak slots {stats.peak_slots}"
)

# 4. A picture of a schedule (steps on one axis, time on the other).
fig, st = plot_schedule(Revolve(5), 40, "planner_schedule.png")
print(f"wrote planner_schedule.png: Revolve(5) for N = 40, {st.plain} plain evaluations")

# 5. The command line (the same table, as text).
out = subprocess.run(
    [
        sys.executable,
        "-m",
        "retrograde",
        "plan",
        "--steps",
        "10000",
        "--memory",
        "2GiB",
        "--state-size",
        "10MiB",
    ],
    capture_output=True,
    text=True,
    check=True,
).stdout
print("\n$ python -m retrograde plan --steps 10000 --memory 2GiB --state-size 10MiB")
print(out)
