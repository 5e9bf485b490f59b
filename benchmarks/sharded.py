"""Checkpointed loops across devices: gradient time and per-device memory on 4 CPU devices.

The loss of ``examples/sharded_heat.py`` (a periodic heat equation with a nonlinear reaction;
each of 4 forced CPU devices holds a block of ``LOCAL`` float64 cells, a step exchanges one halo
cell with each neighbour by ``lax.ppermute``, the loss is a ``lax.psum``) over ``N = 10,000``
steps, and its gradient in ``(theta, u0)`` compiled inside the same ``jax.shard_map`` with each
loop:

- ``jax.lax.scan`` (the reference: every step's residuals stored);
- ``lax.scan`` of ``jax.checkpoint(step)`` (one local state per step);
- nested remat: ``jax.checkpoint`` of an inner ``lax.scan`` inside an outer ``lax.scan``,
  sqrt(N) x sqrt(N) (``_common.nested_remat``);
- ``retrograde.scan`` with the default schedule (``Revolve(140)`` at ``N = 10,000``);
- ``retrograde.scan`` with ``Revolve(s)``, ``s`` the largest whose memory fits the nested
  remat's (found by compiling);
- memory only (not timed): ``retrograde.scan`` with ``Revolve(8)``, and with the same 8 device
  slots beside 16 in host RAM (``MultiLevel``, ``storage="host"``).

Memory is XLA's ``temp_size_in_bytes`` of the compiled gradient
(``jax.jit(f).lower(...).compile().memory_analysis()``), which for a program partitioned over
several devices is one device's (the program is the same on each): shown in MiB, in local states
(``LOCAL * 8`` bytes, one device's block) and, for retrograde, in local states minus the ``s``
device slots (the constant of "``s`` local states plus a constant"). Time is the median wall
time of the compiled gradients called in turn (``_common.time_round_robin``), over
``jax.lax.scan``'s. Every gradient is compared with ``jax.lax.scan``'s (relative error column).
A second table gives the memory of the same loops under ``jax.jit`` with the state sharded by a
``NamedSharding`` (the halo taken from the global array, which XLA's partitioner turns into the
same exchange; host callbacks then run on device 0 with the global state).

    python benchmarks/sharded.py               # LOCAL = 1024, 5 repeats; a few minutes on 2 cores
    python benchmarks/sharded.py --quick       # LOCAL = 256, 2 repeats (for make bench)
    python benchmarks/sharded.py --markdown    # the tables as markdown
    python benchmarks/sharded.py --write-doc   # also writes the memory tables into
                                               # docs/distributed.md (memory is load-independent)
"""

from __future__ import annotations

import os

# 4 CPU devices, set before JAX is imported (unless the caller chose a device count already)
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    ).strip()

import argparse
import datetime as dt
import functools
import statistics
import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import retrograde  # noqa: E402
from retrograde.schedules import Level, MultiLevel, Revolve  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import sharded_heat as heat  # noqa: E402

from _common import (  # noqa: E402
    largest_fitting,
    nested_remat,
    nested_shape,
    prepare,
    print_table,
    temp_bytes,
    time_round_robin,
    write_between_markers,
)

DOC = ROOT / "docs" / "distributed.md"
START, END = "<!-- sharded-table:start -->", "<!-- sharded-table:end -->"
DEVICES = heat.DEVICES
MiB = 2**20


def loops(n: int, s_mem: int | None):
    """Name -> (s or None, a drop-in for ``jax.lax.scan``)."""
    default = retrograde.default_schedule(n)
    out = {
        "jax.lax.scan": (None, lax.scan),
        "lax.scan of jax.checkpoint(step)": (
            None,
            lambda f, init, xs, length: lax.scan(jax.checkpoint(f), init, xs, length=length),
        ),
        "nested remat ({} x {})".format(*nested_shape(n)): (
            None,
            lambda f, init, xs, length: (nested_remat(f, init, length), None),
        ),
        f"retrograde.scan, default (Revolve({default.snapshots}))": (
            default.snapshots,
            functools.partial(retrograde.scan, schedule=default),
        ),
    }
    if s_mem is not None:
        out[f"retrograde.scan, Revolve({s_mem}) (nested remat's memory)"] = (
            s_mem,
            functools.partial(retrograde.scan, schedule=Revolve(s_mem)),
        )
    return out


def offload_loops(device_slots: int = 8, host_slots: int = 16):
    """Memory only (not timed): ``Revolve(device_slots)`` and the same device slots with a host
    level of ``host_slots`` beside them: name -> (device slots, scan)."""
    host = MultiLevel(
        [Level(device_slots), Level(host_slots, write_cost=0.5, read_cost=0.5, storage="host")]
    )
    return {
        f"retrograde.scan, Revolve({device_slots})": (
            device_slots,
            functools.partial(retrograde.scan, schedule=Revolve(device_slots)),
        ),
        f"retrograde.scan, {device_slots} device + {host_slots} host slots (MultiLevel)": (
            device_slots,
            functools.partial(retrograde.scan, schedule=host),
        ),
    }


def shard_map_gradient(mesh, n):
    """``scan -> gradient(theta, u0)`` of the example's loss inside ``shard_map``."""
    return lambda scan: jax.grad(
        heat.sharded(mesh, functools.partial(heat.loss, scan, n_steps=n)), (0, 1)
    )


def jit_gradient(n):
    """``scan -> gradient(theta, u0)`` of the same steps on the global state (under ``jit``, a
    ``NamedSharding`` on ``u0`` partitions it)."""

    def periodic(u):
        return jnp.concatenate([u[-1:], u, u[:1]])

    def make(scan):
        def loss(theta, u0):
            dx = 1.0 / u0.shape[0]
            step = lambda u, _: (heat.step(theta, u, dx, halo=periodic), None)
            u, _ = scan(step, u0, None, length=n)
            return dx * jnp.sum(u**2)

        return jax.grad(loss, (0, 1))

    return make


def rel_err(got, ref) -> float:
    return max(
        float(jnp.max(jnp.abs(g - r)) / jnp.max(jnp.abs(r)))
        for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(ref))
    )


def memory_rows(make, args, n, local_bytes, repeats):
    """Compile every loop's gradient (``make(scan)``) and run it once; with ``repeats``, time
    the loops of :func:`loops` (not the host level's). Returns one dict per loop."""
    nested_name = "nested remat ({} x {})".format(*nested_shape(n))
    nested_temp = temp_bytes(make(loops(n, None)[nested_name][1]), args)
    s_mem = largest_fitting(
        lambda s: make(functools.partial(retrograde.scan, schedule=Revolve(s))),
        args,
        nested_temp,
        local_bytes,
    )
    timed = loops(n, s_mem)
    compiled, rows = {}, {}
    for name, (s, scan) in {**timed, **offload_loops()}.items():
        c, out, compile_s, temp = prepare(make(scan), *args)
        if name in timed:
            compiled[name] = c
        rows[name] = dict(s=s, temp=temp, out=out, compile_s=compile_s)
    jax.effects_barrier()  # the host level's last transfers
    ref = rows["jax.lax.scan"]
    for r in rows.values():
        r["err"] = rel_err(r["out"], ref["out"])
    if repeats:
        times = time_round_robin(compiled, args, repeats)
        for name, t in times.items():
            rows[name]["time"] = statistics.median(t)
    return rows


def table_rows(rows, local_bytes, timed):
    ref = rows["jax.lax.scan"]
    out = []
    for name, r in rows.items():
        states = r["temp"] / local_bytes
        row = [
            name,
            f"{r['temp'] / MiB:.2f}",
            f"{states:,.1f}",
            "" if r["s"] is None else f"{states - r['s']:.1f}",
            f"{r['temp'] / ref['temp']:.4f}",
        ]
        if timed:
            t = r.get("time")
            row += ["", ""] if t is None else [f"{t:.2f}", f"{t / ref['time']:.2f}"]
        row.append("-" if r is ref else f"{r['err']:.1e}")
        out.append(row)
    return out


HEADER = ["gradient", "MiB / device", "local states", "minus s", "memory / lax.scan's"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10_000, help="N (default 10,000)")
    ap.add_argument("--local", type=int, default=None, help="cells per device (1024; 256 quick)")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (5; 2 with --quick)")
    ap.add_argument("--quick", action="store_true", help="smaller blocks, fewer repeats")
    ap.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    ap.add_argument("--no-jit", action="store_true", help="skip the jax.jit memory table")
    ap.add_argument(
        "--write-doc", action="store_true", help=f"write the memory tables into {DOC.name}"
    )
    args = ap.parse_args()
    local = args.local or (256 if args.quick else 1024)
    repeats = args.repeats or (2 if args.quick else 5)
    n = args.steps
    if jax.device_count() < DEVICES:
        print(f"needs {DEVICES} devices, found {jax.device_count()} (XLA_FLAGS set earlier?)")
        return 1
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("x",))
    local_bytes = local * 8
    theta, u0 = jnp.float64(heat.THETA), heat.initial_state(local)
    u0 = jax.device_put(u0, NamedSharding(mesh, P("x")))
    what = (
        f"N = {n:,} steps, {DEVICES} CPU devices of {local} float64 cells, "
        f"a local state of {local_bytes / 1024:g} KiB"
    )

    rows = memory_rows(shard_map_gradient(mesh, n), (theta, u0), n, local_bytes, repeats)
    title = f"Inside jax.shard_map: gradient, {what}; median of {repeats} rounds"
    print_table(
        title,
        [*HEADER, "time (s)", "time / lax.scan's", "rel. error"],
        table_rows(rows, local_bytes, True),
        args.markdown,
    )
    doc = [
        f"Inside `jax.shard_map` ({what}), per device:",
        "",
        "| " + " | ".join([*HEADER, "rel. error"]) + " |",
        "|:---|" + "---:|" * len(HEADER),
    ]
    doc += ["| " + " | ".join(r) + " |" for r in table_rows(rows, local_bytes, False)]

    if not args.no_jit:
        jrows = memory_rows(jit_gradient(n), (theta, u0), n, local_bytes, 0)
        title = f"Under jax.jit, u0 sharded by a NamedSharding: gradient, {what}"
        print_table(
            title, [*HEADER, "rel. error"], table_rows(jrows, local_bytes, False), args.markdown
        )
        doc += [
            "",
            "Under `jax.jit`, `u0` sharded by a `NamedSharding` (same steps on the global state), "
            "per device:",
            "",
            "| " + " | ".join([*HEADER, "rel. error"]) + " |",
            "|:---|" + "---:|" * len(HEADER),
        ]
        doc += ["| " + " | ".join(r) + " |" for r in table_rows(jrows, local_bytes, False)]

    if args.write_doc:
        command = " ".join(["python benchmarks/sharded.py", *sys.argv[1:]])
        when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
        head = (
            f"Generated by `{command}` on {when} (jax {jax.__version__}, CPU); "
            "do not edit by hand. Memory is XLA's `temp_size_in_bytes` of the compiled gradient, "
            "one device's; \"minus s\": local states less the schedule's `s` device slots; "
            "rel. error: the gradient against `jax.lax.scan`'s."
        )
        write_between_markers(DOC, START, END, "\n".join([head, "", *doc]))
        print(f"\nwritten into {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
