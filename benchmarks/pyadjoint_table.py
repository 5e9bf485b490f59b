"""The table of docs/pyadjoint.md: issue #31's loop under pyadjoint's schedules and retrograde's.

The loop has 9 steps; step 3k makes a value ``w = u*u`` that step 3k+2 reads (a long-range read),
and ``J`` sums the state over the steps. It runs on two pyadjoint types:

(a) pyadjoint's immutable ``AdjFloat``: ``u <- 0.9 u + 0.05 u^2``, and ``u <- u + 0.5 w u`` at
    steps 3k+2, from ``u_0 = m``;
(b) the mutable, Firedrake-like ``Vec`` of ``examples/pyadjoint_vec.py`` (assigned in place, a
    delegated checkpoint per ``assign``, in-place recompute): 6 points, ``w.assign(u)`` at steps
    3k, ``u <- u + 0.05 A u + 0.1 p u^2`` (``A`` the 1D Laplacian), ``u <- u + 0.3 w u`` at steps
    3k+2, ``J = sum inner(u, u)``, control the scalar ``p``.

Each schedule gets a fresh tape and the same calls as a user's: ``rf.derivative()`` at the taped
control ``m = 0.7``; ``rf(1.3)`` then ``rf.derivative()``; ``rf.tlm(1.0)``; ``rf.hessian(1.0)``.
pyadjoint's schedules (checkpoint_schedules) go through ``tape.enable_checkpointing(...)`` on a
tape with disk checkpointing configured (``pyadjoint_vec.DiskPackage`` as tape package data, as
Firedrake's ``enable_disk_checkpointing()``), retrograde's through
``retrograde.pyadjoint.enable_checkpointing(...)`` (its disk level: retrograde's checksummed
files). References: central
finite differences (Richardson-extrapolated) for the gradients and the Hessian, the unchecked
tape for the tangent. "right?" is "yes" when all four are within 1e-6 relative of the
reference; an exception is shown as its class name.

    python benchmarks/pyadjoint_table.py           # writes the table into docs/pyadjoint.md
    python benchmarks/pyadjoint_table.py --print   # only prints it (--quick, for make bench, too)

About 5 seconds on one core.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import checkpoint_schedules as cs  # noqa: E402
import numpy as np  # noqa: E402
import pyadjoint as pa  # noqa: E402
from pyadjoint_vec import DiskPackage, Vec, evolve, inner, matvec, react  # noqa: E402

import retrograde.pyadjoint as rp  # noqa: E402
from retrograde.schedules import (  # noqa: E402
    Level,
    Mixed,
    MultiLevel,
    Online,
    RecomputeAll,
    Revolve,
    StoreAll,
)

from _common import write_between_markers  # noqa: E402

DOC = ROOT / "docs" / "pyadjoint.md"
START, END = "<!-- pyadjoint-table:start -->", "<!-- pyadjoint-table:end -->"
M0, M1, N, TOL = 0.7, 1.3, 9, 1e-6
DISK = None  # a temporary directory for disk snapshots, set by main()
COLUMNS = ["gradient at m = 0.7", "gradient at m = 1.3", "tlm at 1.3", "Hessian at 1.3"]


def scalar_loop(m, tape=None):
    """(a): the loop on ``AdjFloat``."""
    u, J, w = m, 0.0, None
    for n in range(N) if tape is None else tape.timestepper(iter(range(N))):
        if n % 3 == 0:
            w = u * u
        u = 0.9 * u + 0.05 * u**2
        if n % 3 == 2:
            u = u + 0.5 * w * u
        J = J + u
    return J


K = 6
A = np.eye(K) * -2 + np.eye(K, k=1) + np.eye(K, k=-1)


def vec_loop(p, tape=None):
    """(b): the loop on the mutable ``Vec``."""
    u, w, v, J = Vec(np.linspace(0.2, 0.8, K)), Vec(np.zeros(K)), Vec(np.zeros(K)), 0.0
    for n in range(N) if tape is None else tape.timestepper(iter(range(N))):
        if n % 3 == 0:
            w.assign(u)
        matvec(v, A, u)
        react(u, v, p)
        if n % 3 == 2:
            evolve(
                u,
                lambda u, w: u + 0.3 * w * u,
                lambda u, w: [1 + 0.3 * w, 0.3 * u],
                lambda u, w: [[0, 0.3], [0.3, 0]],
                [u, w],
            )
        J = J + inner(u, u)
    return J


def pyadjoint_schedules():
    """(label, enable(tape)) for pyadjoint's own manager and checkpoint_schedules."""
    rows = [
        ("Revolve(9, 2)", lambda: cs.Revolve(N, 2)),
        ("MultistageCheckpointSchedule(9, 2, 0)", lambda: cs.MultistageCheckpointSchedule(N, 2, 0)),
        ("HRevolve(9, 2, 1)", lambda: cs.HRevolve(N, 2, 1)),
        ("TwoLevelCheckpointSchedule(3, 2)", lambda: cs.TwoLevelCheckpointSchedule(3, 2)),
        ("MixedCheckpointSchedule(9, 2)", lambda: cs.MixedCheckpointSchedule(N, 2)),
        ("SingleMemoryStorageSchedule()", lambda: cs.SingleMemoryStorageSchedule()),
        ("DiskRevolve(9, 2)", lambda: cs.DiskRevolve(N, 2)),
    ]

    def enable(tape, make):  # disk configured, as Firedrake's enable_disk_checkpointing() does
        tape._package_data["vec"] = DiskPackage(DISK)
        tape.enable_checkpointing(make())

    return [
        (f"pyadjoint `{name}`", lambda tape, make=make: enable(tape, make)) for name, make in rows
    ]


def retrograde_schedules():
    """(label, enable(tape)) for ``retrograde.pyadjoint.enable_checkpointing``."""
    disk = MultiLevel(
        [Level(1), Level(None, write_cost=1, read_cost=1, storage="disk", directory=DISK)]
    )
    rows = [
        ("Revolve(2)", Revolve(2), None),
        ("Revolve(2)`, `n_steps=9", Revolve(2), N),
        ("StoreAll()", StoreAll(), None),
        ("Online(2)", Online(2), None),
        ("RecomputeAll()", RecomputeAll(), None),
        (
            'MultiLevel([Level(1), Level(None, write_cost=1, read_cost=1, storage="disk")])`, '
            "`n_steps=9",
            disk,
            N,
        ),
        ("Mixed(2)`, `n_steps=9", Mixed(2), N),
    ]
    return [
        (
            f"retrograde `{name}`",
            lambda tape, s=s, ns=ns: rp.enable_checkpointing(s, tape=tape, n_steps=ns),
        )
        for name, s, ns in rows
    ]


def evaluate(loop, enable=None):
    """The four columns on a fresh tape (``enable(tape)`` before taping; none: unchecked)."""
    tape = pa.Tape()
    calls = [
        lambda rf: rf.derivative(),
        lambda rf: (rf(pa.AdjFloat(M1)), rf.derivative())[1],
        lambda rf: rf.tlm(pa.AdjFloat(1.0)),
        lambda rf: rf.hessian(pa.AdjFloat(1.0)),
    ]
    with pa.set_working_tape(tape):
        try:
            if enable is not None:
                enable(tape)
            m = pa.AdjFloat(M0)
            rf = pa.ReducedFunctional(loop(m, tape), pa.Control(m))
        except Exception as e:  # noqa: BLE001 - the table shows it
            return [type(e).__name__] * 4
        out = []
        for call in calls:
            try:
                out.append(float(call(rf)))
            except Exception as e:  # noqa: BLE001
                out.append(type(e).__name__)
    return out


def reference(loop):
    """Finite differences (gradients, Hessian) and the unchecked tape (tangent)."""

    def f(x):
        with pa.stop_annotating():
            return float(loop(pa.AdjFloat(x)))

    d1 = lambda x, h: (f(x + h) - f(x - h)) / (2 * h)
    d2 = lambda x, h: (f(x + h) - 2 * f(x) + f(x - h)) / h**2
    rich = lambda d, x, h: (4 * d(x, h / 2) - d(x, h)) / 3  # Richardson: O(h^4)
    ref = [rich(d1, M0, 1e-3), rich(d1, M1, 1e-3), None, rich(d2, M1, 1e-3)]
    tape = evaluate(loop)
    ref[2] = tape[2]
    for name, r, t in zip(COLUMNS, ref, tape):
        if not isinstance(t, float) or abs(t - r) > TOL * abs(r):
            sys.exit(f"the unchecked tape's {name} ({t}) disagrees with finite differences ({r})")
    return ref


def table(loop, title):
    """The markdown table of one loop."""
    ref = reference(loop)
    lines = [
        f"**{title}**",
        "",
        "| schedule | " + " | ".join(COLUMNS) + " | right? |",
        "|---|" + "---:|" * len(COLUMNS) + "---|",
        "| reference (finite differences / unchecked tape) | "
        + " | ".join(f"{r:.8g}" for r in ref)
        + " | |",
    ]
    for label, enable in pyadjoint_schedules() + retrograde_schedules():
        got = evaluate(loop, enable)
        wrong = [
            c
            for c, g, r in zip(COLUMNS, got, ref)
            if not isinstance(g, float) or abs(g - r) > TOL * abs(r)
        ]
        cells = [f"{g:.8g}" if isinstance(g, float) else f"`{g}`" for g in got]
        verdict = "yes" if not wrong else "**no**: " + ", ".join(wrong)
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {verdict} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--print", action="store_true", help="print the table, do not write the doc")
    p.add_argument("--quick", action="store_true", help="as --print (for make bench)")
    args = p.parse_args()
    global DISK
    warnings.filterwarnings("ignore", message="Numba not available")  # checkpoint_schedules
    pa.continue_annotation()
    tmp = tempfile.TemporaryDirectory(prefix="pyadjoint-table-")
    DISK = tmp.name
    versions = ", ".join(f"{d} {md.version(d)}" for d in ("pyadjoint-ad", "checkpoint_schedules"))
    section = "\n\n".join(
        [
            f'Generated by `python benchmarks/pyadjoint_table.py` ({versions}); "right?": each '
            f"value within {TOL:g} relative of the reference, exceptions by class name. "
            "pyadjoint's rows have disk checkpointing configured (tape package data, as "
            "Firedrake's `enable_disk_checkpointing()` does).",
            table(scalar_loop, "(a) pyadjoint's immutable `AdjFloat`"),
            table(vec_loop, "(b) a mutable Firedrake-like type (`Vec`, examples/pyadjoint_vec.py)"),
        ]
    )
    tmp.cleanup()
    print(section)
    if not (args.print or args.quick):
        write_between_markers(DOC, START, END, section)
        print(f"\nwritten into {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
