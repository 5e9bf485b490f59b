"""Benchmark of offloaded levels inside ``retrograde.scan``: device slots alone against device +
host RAM and device + disk, at equal device memory (issue #21).

State: ``--state-mib`` MiB of float64 (default 64); ``--steps`` steps (default 2000); step
``u <- u (1 - 1e-3 theta) + 1e-4 u^2`` (memory-bound, a few passes of the state); loss
``sum(u_N)``; the gradient with respect to ``theta`` and ``u_0`` under ``jax.jit``.

Rows, each in its own subprocess (peak RSS is that process's own maximum resident set, minus its
RSS once the problem's arrays exist and the program is compiled):

* ``Revolve(D)``: ``--device-slots`` D slots in device memory (default 8);
* ``MultiLevel(D + H host)``: the same device slots plus ``--host-slots`` H slots in host RAM;
* ``MultiLevel(D + H disk)``: the same device slots plus H slots on disk (an unnamed temporary
  file in ``--directory``).

The levels' write and read costs (in steps) are measured first on this machine: one step's time
and ``retrograde calibrate``'s wall-clock time per transfer (printed first). Each row prints the
evaluations executed (counted by a callback in the step) against ``simulate``, the transfers to
the slow level and the time each took inside the store (copy into the store, checksum, file
I/O, from ``offload_stats``; a host read is handed to XLA, which copies it: that copy is in the
calibrated time, not here), the compiled gradient's ``temp_size_in_bytes`` in states, the run's
wall time and its peak RSS. On the CPU backend device memory
is host RAM too: the device slots count in the RSS, the host slots as well, the disk slots not.

Usage: ``python benchmarks/offload.py [--steps 2000] [--state-mib 64] [--device-slots 8]
[--host-slots 16] [--markdown]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import print_table


def _schedule(row, device, slots, costs, directory):
    from retrograde.schedules import Level, MultiLevel, Revolve

    if row == "revolve":
        return Revolve(device)
    storage = "host" if row == "host" else "disk"
    w, r = costs[storage]
    return MultiLevel(
        [
            Level(device, name="device"),
            Level(
                slots,
                w,
                r,
                name=storage,
                storage=storage,
                directory=directory if storage == "disk" else None,
            ),
        ]
    )


def _status(key):
    """A field of ``/proc/self/status`` in bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak():
    """Reset the peak RSS to the current RSS (so that compilation does not count); returns it."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return _status("VmRSS")


def _child(args):
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    import retrograde
    from retrograde.schedules import simulate

    costs = json.loads(args.costs)
    schedule = _schedule(args.child, args.device_slots, args.host_slots, costs, args.directory)
    calls = [0]

    def tick():
        calls[0] += 1

    def loss(theta, u0):
        def step(u, _):
            jax.debug.callback(tick, ordered=False)
            return u * (1 - 1e-3 * theta) + 1e-4 * u * u, None

        u, _ = retrograde.scan(step, u0, None, length=args.steps, schedule=schedule)
        return jnp.sum(u)

    u0 = jnp.full((args.state_mib * 2**20 // 8,), 0.5)
    t = time.perf_counter()
    compiled = jax.jit(jax.grad(loss, (0, 1))).lower(0.5, u0).compile()
    compile_s = time.perf_counter() - t
    temp = compiled.memory_analysis().temp_size_in_bytes
    base = _reset_peak()
    retrograde.loops.offload_stats(reset=True)
    t = time.perf_counter()
    jax.block_until_ready(compiled(0.5, u0))
    jax.effects_barrier()
    run_s = time.perf_counter() - t
    peak = _status("VmHWM")
    st = retrograde.loops.offload_stats()
    stats = simulate(schedule, args.steps)
    print(
        json.dumps(
            dict(
                name=repr(schedule)
                if args.child == "revolve"
                else f"MultiLevel({args.device_slots} device + {args.host_slots} {args.child})",
                evaluations=calls[0],
                expected=stats.plain + 1 + args.steps,
                plain=stats.plain,
                writes=st.writes.get(1, 0),
                reads=st.reads.get(1, 0),
                sim_writes=list(stats.writes),
                sim_reads=list(stats.reads),
                write_ms=1e3 * st.write_seconds.get(1, 0.0) / max(st.writes.get(1, 0), 1),
                read_ms=1e3 * st.read_seconds.get(1, 0.0) / max(st.reads.get(1, 0), 1),
                temp=temp,
                compile_s=compile_s,
                run_s=run_s,
                rss=max(peak - base, 0),
            )
        )
    )


def _costs(state_mib, directory):
    """Write and read costs of host and disk in steps: calibrate's times over one step's."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    from retrograde.loops._calibrate import calibrate

    u = jnp.full((state_mib * 2**20 // 8,), 0.5)
    step = jax.jit(lambda u: u * (1 - 1e-3 * 0.5) + 1e-4 * u * u)
    u = jax.block_until_ready(step(step(u)))  # compiled for both input placements
    t = time.perf_counter()
    for _ in range(10):
        u = step(u)
    jax.block_until_ready(u)
    step_s = (time.perf_counter() - t) / 10
    rows = calibrate(state_mib * 2**20, repeats=4, directory=directory)
    costs = {r.storage: (r.write_seconds / step_s, r.read_seconds / step_s) for r in rows}
    return step_s, rows, costs


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--state-mib", type=int, default=64)
    p.add_argument("--device-slots", type=int, default=8)
    p.add_argument("--host-slots", type=int, default=16)
    p.add_argument("--directory", default=None)
    p.add_argument("--rows", default="revolve,host,disk")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--costs", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return _child(args)

    directory = args.directory or tempfile.gettempdir()
    step_s, transfers, costs = _costs(args.state_mib, directory)
    print(f"state {args.state_mib} MiB, N = {args.steps}; one step {step_s * 1e3:.1f} ms")
    for t in transfers:
        print(
            f"  {t.storage}: write {t.write_seconds * 1e3:.1f} ms "
            f"({costs[t.storage][0]:.2f} steps), read {t.read_seconds * 1e3:.1f} ms "
            f"({costs[t.storage][1]:.2f} steps)"
        )
    results = []
    for row in args.rows.split(","):
        cmd = [
            sys.executable,
            __file__,
            "--child",
            row,
            "--costs",
            json.dumps(costs),
            "--steps",
            str(args.steps),
            "--state-mib",
            str(args.state_mib),
            "--device-slots",
            str(args.device_slots),
            "--host-slots",
            str(args.host_slots),
            "--directory",
            directory,
        ]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"row {row} failed:\n{out.stderr[-4000:]}")
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"  done: {results[-1]['name']} in {results[-1]['run_s']:.0f} s", flush=True)
    mib = 2**20
    state = args.state_mib * mib
    header = [
        "schedule",
        "evaluations",
        "(simulate)",
        "slow writes",
        "slow reads",
        "in-store ms/write",
        "in-store ms/read",
        "temp (states)",
        "peak RSS",
        "run (s)",
    ]
    rows = []
    for r in results:
        rows.append(
            [
                r["name"],
                f"{r['evaluations']:,}",
                f"{r['expected']:,}",
                f"{r['writes']:,}" if r["sim_writes"][1:] else "-",
                f"{r['reads']:,}" if r["sim_reads"][1:] else "-",
                f"{r['write_ms']:.1f}" if r["writes"] else "-",
                f"{r['read_ms']:.1f}" if r["reads"] else "-",
                f"{r['temp'] / state:.1f}",
                f"{r['rss'] / mib:,.0f} MiB",
                f"{r['run_s']:.0f}",
            ]
        )
    print_table(
        f"Gradient of {args.steps} steps of a {args.state_mib} MiB state, "
        f"{args.device_slots} device slots ({args.device_slots * args.state_mib} MiB), "
        f"{args.host_slots} host or disk slots",
        header,
        rows,
        args.markdown,
    )


if __name__ == "__main__":
    main()
