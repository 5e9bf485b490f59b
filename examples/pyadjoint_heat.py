"""A checkpointed pyadjoint tape: a 1D heat equation with a delayed reaction.

    u_{n+1} = u_n + dt A u_n + dt r u_n (1 - u_{n-d}),     J = sum_n dt <u_{n+1}, u_{n+1}>

on 24 points (``A`` the Dirichlet Laplacian), ``N = 50`` steps of ``dt = 5e-4``, delay ``d = 5``
steps (the history before ``t = 0`` is ``u_0``). The state is the mutable, Firedrake-like ``Vec``
of ``pyadjoint_vec.py``; the past states sit in a ring of ``d + 1`` vectors, each refilled by
``assign`` (a delegated checkpoint, as Firedrake's ``Function.assign`` leaves), so step ``n``
reads a value made ``d`` steps earlier: a long-range read that a checkpoint must hold.

The loop is taped as usual with ``tape.timestepper``; the one line that differs from an unchecked
tape is ``retrograde.pyadjoint.enable_checkpointing(Revolve(4))``. Then, with the control the
reaction rate ``r``: ``J``, ``dJ/dr`` against central finite differences at a new ``r``, a
second-order Taylor test (``pyadjoint.taylor_test`` with the gradient and the Hessian: rate ~3),
the same for the initial condition ``u_0`` as the control, and the steps recomputed.

    python examples/pyadjoint_heat.py     # about 2 seconds; exit status 1 if a check fails
"""

from __future__ import annotations

import contextlib
import io
import os
import sys

import numpy as np
import pyadjoint as pa

import retrograde.pyadjoint as rp
from retrograde.schedules import Revolve, simulate

sys.path.insert(0, os.path.dirname(__file__))
from pyadjoint_vec import Vec, evolve, inner, matvec

K, N, DT, D = 24, 50, 5e-4, 5
H_R, H_U = 100.0, 1.0  # Taylor test directions (pyadjoint perturbs by 0.01 h ... 0.00125 h)
A = (np.eye(K) * -2 + np.eye(K, k=1) + np.eye(K, k=-1)) * (K + 1) ** 2  # dt/dx^2 = 0.3125


def f(u, v, lag, r):
    return u + DT * v + DT * r * u * (1 - lag)


def df(u, v, lag, r):
    return [1 + DT * r * (1 - lag), DT, -DT * r * u, DT * u * (1 - lag)]


def d2f(u, v, lag, r):
    return [
        [0, 0, -DT * r, DT * (1 - lag)],
        [0, 0, 0, 0],
        [-DT * r, 0, 0, -DT * u],
        [DT * (1 - lag), 0, -DT * u, 0],
    ]


def heat(u0: Vec, r, tape=None):
    """J for the initial condition ``u0`` and rate ``r`` (taped in steps when ``tape`` is given)."""
    u, v = Vec(np.zeros(K)), Vec(np.zeros(K))
    u.assign(u0)
    ring = [Vec(np.zeros(K)) for _ in range(D + 1)]
    for w in ring:
        w.assign(u0)  # the history before t = 0
    J = 0.0
    for n in range(N) if tape is None else tape.timestepper(iter(range(N))):
        ring[n % (D + 1)].assign(u)  # u_n, read again at step n + d
        lag = ring[(n + 1) % (D + 1)]  # u_{n-d}
        matvec(v, A, u)
        evolve(u, f, df, d2f, [u, v, lag, r])
        J = J + inner(u, u, DT)
    return J


def taylor2(rf, m, h) -> float:
    """pyadjoint's second-order Taylor test at ``m`` in direction ``h`` (its printing muted)."""
    rf(m)
    dJdm = h._ad_dot(rf.derivative())
    Hm = h._ad_dot(rf.hessian(h))
    with contextlib.redirect_stdout(io.StringIO()):
        return pa.taylor_test(rf, m, h, dJdm=dJdm, Hm=Hm)


def main() -> int:
    pa.continue_annotation()
    x = np.linspace(0, 1, K + 2)[1:-1]
    tape = pa.Tape()
    with pa.set_working_tape(tape):
        manager = rp.enable_checkpointing(Revolve(4))  # instead of tape.enable_checkpointing(...)
        u0, r = Vec(0.5 + 0.4 * np.sin(np.pi * x)), pa.AdjFloat(40.0)
        J = heat(u0, r, tape)
        rf = pa.ReducedFunctional(J, pa.Control(r))
        print(
            f"{len(tape.get_blocks())} blocks in {N} steps, delay {D} steps; "
            f"J(r = 40) = {float(J):.10f}"
        )

        r1 = 55.0  # a new control: the tape is re-evaluated, then differentiated
        before = (manager.counts.steps, manager.counts.recorded)
        J1 = float(rf(pa.AdjFloat(r1)))
        mid = (manager.counts.steps, manager.counts.recorded)
        g = float(rf.derivative())
        after = (manager.counts.steps, manager.counts.recorded)
        with pa.stop_annotating():
            h = 1e-4
            fd = (float(heat(u0, r1 + h)) - float(heat(u0, r1 - h))) / (2 * h)
        err = abs(g - fd) / abs(fd)
        print(
            f"J(r = {r1}) = {J1:.10f}; dJ/dr = {g:.10f}, central differences {fd:.10f}: "
            f"relative error {err:.1e} ({'ok' if err < 1e-6 else 'WRONG'})"
        )

        rate = taylor2(rf, pa.AdjFloat(r1), pa.AdjFloat(H_R))
        print(f"Taylor test in r, second order: rate {rate:.2f} (expected ~3)")

        rf(pa.AdjFloat(r1))  # back at r1 (the Taylor test left r perturbed)
        rf0 = pa.ReducedFunctional(J, pa.Control(u0))
        rate0 = taylor2(rf0, Vec(u0.data), Vec(H_U * np.cos(3 * x)))
        print(f"Taylor test in u_0, second order: rate {rate0:.2f} (expected ~3)")

    stats = simulate(Revolve(4), N)
    print(
        f"steps recomputed by rf(r): {mid[0] - before[0]} (one forward sweep); "
        f"by rf.derivative(): "
        f"{after[0] - mid[0]} plain + {after[1] - mid[1]} recorded (simulate(Revolve(4), {N}): "
        f"{stats.plain - (N - 1)} + {stats.recorded}); in all: {manager.counts}"
    )
    return 0 if err < 1e-6 and min(rate, rate0) > 2.8 else 1


if __name__ == "__main__":
    sys.exit(main())
