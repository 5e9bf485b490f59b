"""Benchmark of ``retrograde.host``: a NumPy heat equation with a hand-written adjoint.

State: ``--size`` float64 values (default 1M = 8 MiB); ``--steps`` steps (default 2000). Step:
explicit diffusion with a cubic sink and a source field ``q`` (the parameters),
``u <- u + R lap(u) - DT C u^3 + q``, updated in place. Loss ``J = 0.5 |u_N|^2``; the gradient
is taken with respect to ``q`` (8 MiB as well).

Rows (each in its own subprocess; peak RSS is that process's own ``VmHWM``, read from
``/proc/self/status``, minus its RSS after imports and the problem's arrays):

* forward only: the plain loop, no gradient (the baseline for time and memory);
* StoreAll: every state in RAM (skipped if it would not fit in the available memory);
* Revolve(20) in RAM;
* MultiLevel: 5 RAM slots + 50 disk slots (write/read costs measured on this machine);
* pyrevolve ``MemoryRevolver`` with 20 checkpoints (if ``pyrevolve`` is installed; it is not a
  dependency of retrograde: ``pip install pyrevolve``).

The retrograde rows print their peak against the plan: the schedule's RAM slots (the most it
holds at once, ``schedule.max_slots(N)`` of its RAM levels) plus 2 states (the state at hand and
the cotangent) plus the gradient of ``q`` (one state here). Their adjoint writes its result into
the state it is handed, as the aliasing contract of ``retrograde.host`` allows (pyrevolve reuses
that buffer, so its row uses an adjoint that allocates).

``--closures K`` instead runs ``value_and_grad`` K times (default 100), each time with a new JAX
step closure capturing a ``--closure-mib`` MiB array (default 64), and prints the process's RSS:
it stays flat once the first calls have compiled.

Usage: ``python benchmarks/host.py [--steps 2000] [--size 1000000] [--rows a,b,...]``,
``python benchmarks/host.py --closures 100 [--closure-mib 64]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

R, DT, C = 0.2, 0.01, 0.5
ROWS = ["forward", "storeall", "revolve", "multilevel", "pyrevolve"]


# ----------------------------------------------------------------------------- the problem
class Heat:
    """In-place explicit heat step with a cubic sink, ``u <- (1 - 2R) u + R (u_l + u_r)
    - DT C u^3 + s`` (zero outside the grid); ``s`` is the source per step (the parameters).
    Preallocated work arrays (touched here, so that they count in the baseline); about 23 memory
    passes of the state per step, 20 per adjoint."""

    def __init__(self, size: int):
        self.w = np.empty(size)
        self.t = np.empty(size)
        self.w.fill(0.0)
        self.t.fill(0.0)

    @staticmethod
    def neighbours(u, out):
        np.add(u[:-2], u[2:], out=out[1:-1])
        out[0] = u[1]
        out[-1] = u[-2]
        return out

    def forward(self, n, u, s):
        w, t = self.w, self.t
        self.neighbours(u, w)
        np.multiply(u, u, out=t)
        t *= u
        t *= -DT * C
        u *= 1 - 2 * R
        w *= R
        u += w
        u += t
        u += s
        return u

    def vjp(self, n, u, s, lam):
        t = self.t
        out = self.neighbours(lam, np.empty_like(lam))
        out *= R
        np.multiply(u, u, out=t)
        t *= lam
        t *= -3 * DT * C
        out += t
        np.multiply(lam, 1 - 2 * R, out=t)
        out += t
        return out, lam

    def vjp_into_state(self, n, u, s, lam):
        """The same adjoint, written into ``u`` (which retrograde never reads again)."""
        t = self.t
        np.multiply(u, u, out=t)
        t *= lam
        t *= -3 * DT * C
        out = self.neighbours(lam, u)  # u is no longer needed
        out *= R
        out += t
        np.multiply(lam, 1 - 2 * R, out=t)
        out += t
        return out, lam


def problem(size):
    x = np.linspace(0.0, 1.0, size)
    u0 = np.sin(np.pi * x) + 0.2 * np.sin(7 * np.pi * x)
    q = 0.5 * DT * np.cos(3 * np.pi * x)
    return u0, q


def checksum(g):
    """A fixed linear functional of the gradient, to compare rows."""
    v = np.cos(np.arange(g.size) * 0.001)
    return float(np.dot(g, v))


# ----------------------------------------------------------------------------- one row
def vmhwm_mib():
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def measure_costs(heat, u0, q, tmpdir):
    """Disk write/read cost of one state, in units of one step, measured here."""
    import jax

    import retrograde.host as rh

    u = u0.copy()
    t0 = time.perf_counter()
    for n in range(5):
        heat.forward(n, u, q)
    t_step = (time.perf_counter() - t0) / 5
    store = rh.Disk(tmpdir).open()
    _leaves, treedef = jax.tree_util.tree_flatten(u)
    t0 = time.perf_counter()
    snaps = [store.put(i, [u + i], treedef) for i in range(3)]
    t_w = (time.perf_counter() - t0) / 3
    t0 = time.perf_counter()
    for s in snaps:
        store.get(s)
    t_r = (time.perf_counter() - t0) / 3
    store.close()
    return max(0.1, round(t_w / t_step, 1)), max(0.1, round(t_r / t_step, 1))


def run_row(row, steps, size, snapshots):
    if row == "pyrevolve":
        import pyrevolve as pr
    elif row != "forward":
        import retrograde.host as rh
        from retrograde import schedules as rs
    u0, q = problem(size)
    heat = Heat(size)
    out = {"row": row, "base_mib": vmhwm_mib()}  # after imports and the problem's arrays
    t0 = time.perf_counter()
    if row == "forward":
        u = u0.copy()
        for n in range(steps):
            heat.forward(n, u, q)
        out["J"] = 0.5 * float(np.dot(u, u))
        out["evals"] = steps
    elif row == "pyrevolve":

        class WS:
            u = u0.copy()
            prev = np.empty(size)
            lam = None
            qbar = np.zeros(size)
            evals = 0

        class Ckp(pr.Checkpoint):
            dtype = np.float64
            size = u0.size

            def get_data(self, timestep):
                return [WS.u]

            def get_data_location(self, timestep):
                return [WS.u]

        class Fwd(pr.Operator):
            def apply(self, t_start, t_end):
                for n in range(t_start, t_end):
                    WS.prev[:] = WS.u
                    heat.forward(n, WS.u, q)
                    WS.evals += 1

        class Rev(pr.Operator):
            def apply(self, t_start, t_end):
                for n in range(t_end - 1, t_start - 1, -1):
                    WS.lam, qb = heat.vjp(n, WS.prev, q, WS.lam)
                    WS.qbar += qb

        rev = pr.MemoryRevolver(Ckp(), Fwd(), Rev(), snapshots, steps)
        rev.apply_forward()
        out["J"] = 0.5 * float(np.dot(WS.u, WS.u))
        WS.lam = WS.u.copy()
        rev.apply_reverse()
        out["grad"] = checksum(WS.qbar)
        out["evals"] = WS.evals
    else:
        step = rh.Step(heat.forward, heat.vjp_into_state)
        loss = rh.Final(lambda n, u, q: 0.5 * float(np.dot(u, u)), grad=lambda n, u, q: (u, 0.0))
        storage = rh.Memory()
        if row == "storeall":
            sched = rs.StoreAll()
        elif row == "revolve":
            sched = rs.Revolve(snapshots)
        elif row == "multilevel":
            tmp = tempfile.mkdtemp(prefix="retrograde-bench-")
            w, r = measure_costs(heat, u0, q, tmp)
            out["disk_costs"] = (w, r)
            sched = rs.MultiLevel(
                [rs.Level(5, name="memory"), rs.Level(50, write_cost=w, read_cost=r, name="disk")]
            )
            storage = {"memory": rh.Memory(), "disk": rh.Disk(tmp)}
            t0 = time.perf_counter()
        else:
            raise SystemExit(f"unknown row {row!r}; choose from {ROWS}")
        ram = [i for i, lvl in enumerate(sched.levels) if "disk" not in (lvl.name or "")]
        out["ram_slots"] = sum(sched.max_slots(steps)[i] for i in ram)
        J, g = rh.value_and_grad(
            step, loss, u0, q, steps, schedule=sched, storage=storage, progress=False
        )
        out["J"] = J
        stats = rs.simulate(sched, steps)
        out["evals"] = stats.plain + 1 + steps
        out["grad"] = checksum(g.params)
        if row == "multilevel":
            os.rmdir(tmp)
    out["time"] = time.perf_counter() - t0
    out["vmhwm_mib"] = vmhwm_mib()
    print("RESULT " + json.dumps(out), flush=True)


def vmrss_mib():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def closures(calls: int, mib: float):
    """``calls`` gradients, each with a new JAX step closure capturing ``mib`` MiB; RSS after
    each (the closures, what they capture and their compiled code must not accumulate)."""
    import gc

    import jax
    import jax.numpy as jnp

    import retrograde.host as rh
    from retrograde import schedules as rs

    jax.config.update("jax_enable_x64", True)
    size = int(mib * 2**20 / 8)
    loss = rh.Final(lambda n, u, a: jnp.sum(u**2))

    def make(seed):
        big = np.random.default_rng(seed).standard_normal(size)

        def step(n, u, a):  # captures all of big, uses a few values of it
            return u + 0.01 * a * jnp.sin(u + 1e-3 * big[: u.shape[0]])

        return step

    print(
        f"# retrograde.host: {calls} value_and_grad calls, each with a new JAX step closure "
        f"capturing {mib:g} MiB; python {sys.version.split()[0]}, jax {jax.__version__}"
    )
    print("| call | RSS (MiB) | since call 5 (MiB) | in captured arrays |")
    print("|---|---|---|---|")
    rss, ref = [], None
    for i in range(1, calls + 1):
        rh.value_and_grad(make(i), loss, np.ones(8), 1.5, 20, schedule=rs.Revolve(3))
        gc.collect()
        rss.append(vmrss_mib())
        if i == 5:
            ref = rss[-1]
        if i in (1, 2, 5) or i % 10 == 0 or i == calls:
            growth = "" if ref is None else f"{rss[-1] - ref:+.0f}"
            states = "" if ref is None else f"{(rss[-1] - ref) / mib:+.2f}"
            print(f"| {i} | {rss[-1]:.0f} | {growth} | {states} |", flush=True)
    if ref is not None:
        print(
            f"\nRSS after call 5: {ref:.0f} MiB; largest afterwards {max(rss[4:]):.0f} MiB "
            f"({(max(rss[4:]) - ref) / mib:+.2f} captured arrays)."
        )
    return 0


# ----------------------------------------------------------------------------- the table
def mem_available_mib():
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("inf")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--size", type=int, default=1_000_000)
    ap.add_argument("--snapshots", type=int, default=20)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument(
        "--closures",
        type=int,
        metavar="K",
        help="instead: K value_and_grad calls, each with a new JAX step closure",
    )
    ap.add_argument(
        "--closure-mib",
        type=float,
        default=64.0,
        help="MiB captured by each closure (with --closures; default 64)",
    )
    ap.add_argument("--row", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.row:
        return run_row(args.row, args.steps, args.size, args.snapshots)
    if args.closures:
        return closures(args.closures, args.closure_mib)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    state_mib = args.size * 8 / 2**20
    print(
        f"# retrograde.host benchmark: NumPy heat step, state {state_mib:.1f} MiB "
        f"({args.size} float64), N = {args.steps}, python {sys.version.split()[0]}"
    )
    results = {}
    for row in rows:
        if row == "storeall":
            need = state_mib * args.steps * 1.1 + 1024
            if need > 0.8 * mem_available_mib():
                results[row] = {
                    "skipped": f"needs ~{need / 1024:.1f} GiB, "
                    f"{mem_available_mib() / 1024:.1f} GiB available"
                }
                continue
        if row == "pyrevolve":
            try:
                import pyrevolve  # noqa: F401
            except ImportError:
                results[row] = {"skipped": "pyrevolve not installed (pip install pyrevolve)"}
                continue
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--row",
            row,
            "--steps",
            str(args.steps),
            "--size",
            str(args.size),
            "--snapshots",
            str(args.snapshots),
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stdout, stderr = proc.communicate()
        # per-child peak RSS: wait4 already reaped it inside communicate, so use the child's own
        # VmHWM (identical to ru_maxrss on Linux) reported in its RESULT line.
        line = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            results[row] = {"skipped": f"failed (rc {proc.returncode}): {stderr.strip()[-300:]}"}
            continue
        results[row] = json.loads(line[-1][7:])
        r = results[row]
        print(f"  {row}: {r['time']:.1f} s, peak RSS {r['vmhwm_mib']:.0f} MiB", flush=True)

    labels = {
        "forward": "forward only (no gradient)",
        "storeall": "StoreAll, RAM",
        "revolve": f"Revolve({args.snapshots}), RAM",
        "multilevel": "MultiLevel 5 RAM + 50 disk",
        "pyrevolve": f"pyrevolve MemoryRevolver({args.snapshots})",
    }
    base = results.get("forward", {})
    ref_grad = next((r["grad"] for r in results.values() if "grad" in r), None)
    print()
    print(
        "| row | time (s) | time / forward | peak RSS (MiB) | peak - baseline (MiB) "
        "| in states | RAM slots | plan (states) | step evaluations | gradient agrees |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        r = results.get(row, {})
        name = labels.get(row, row)
        if "skipped" in r:
            print(f"| {name} | skipped: {r['skipped']} | | | | | | | | |")
            continue
        t_ratio = r["time"] / base["time"] if base.get("time") else float("nan")
        extra = r["vmhwm_mib"] - r["base_mib"]
        agree = ""
        if "grad" in r and ref_grad is not None:
            agree = (
                "yes"
                if abs(r["grad"] - ref_grad) <= 1e-9 * max(1.0, abs(ref_grad))
                else (f"NO ({r['grad']:.12g} vs {ref_grad:.12g})")
            )
        note = (
            f" (disk w/r cost {r['disk_costs'][0]}/{r['disk_costs'][1]} steps)"
            if "disk_costs" in r
            else ""
        )
        slots = r.get("ram_slots")
        plan = "" if slots is None else f"{slots} + 2 + 1 = {slots + 3}"
        print(
            f"| {name}{note} | {r['time']:.1f} | {t_ratio:.2f} | {r['vmhwm_mib']:.0f} "
            f"| {extra:.0f} | {extra / state_mib:.1f} | {'' if slots is None else slots} "
            f"| {plan} | {r['evals']} | {agree} |"
        )
    print(
        "\nplan: the schedule's RAM slots + 2 states (at hand, cotangent) + the gradient of q "
        "(1 state); peak and baseline are RSS, which also holds allocator slack."
    )
    if (
        "revolve" in results
        and "pyrevolve" in results
        and "time" in results["pyrevolve"]
        and "time" in results["revolve"]
    ):
        print(
            f"\nretrograde Revolve / pyrevolve time ratio: "
            f"{results['revolve']['time'] / results['pyrevolve']['time']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
