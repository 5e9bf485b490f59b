"""Run under ``mpirun -n P python tests/host/mpi_heat.py``: a distributed heat equation.

Each rank owns a block of a 1-D grid; a step exchanges one halo cell with each neighbour
(Dirichlet zero outside the global grid) and applies ``u += dt (D lap(u) - k u^3)``; the
hand-written adjoint exchanges halos of the cotangent the same way (the Laplacian is symmetric).
Every rank follows the same schedule and keeps its own snapshots (disk files named by rank).
Rank 0 gathers the gradient and compares it with a serial run on the whole grid.
Prints ``MPI OK <size>`` on success, exits non-zero on failure.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI

import retrograde.host as rh
from retrograde import schedules as rs
from retrograde._store import OWNER_FILE

DT, D, LOCAL, N = 0.1, 0.9, 6, 40


def make_step(comm):
    rank = comm.Get_rank() if comm is not None else 0
    size = comm.Get_size() if comm is not None else 1
    left = rank - 1 if rank > 0 else MPI.PROC_NULL
    right = rank + 1 if rank < size - 1 else MPI.PROC_NULL

    def lap(u):
        lg, rg = np.zeros(1), np.zeros(1)
        if comm is not None:
            comm.Sendrecv(np.ascontiguousarray(u[-1:]), dest=right, recvbuf=lg, source=left)
            comm.Sendrecv(np.ascontiguousarray(u[:1]), dest=left, recvbuf=rg, source=right)
        g = np.concatenate([lg, u, rg])
        return g[:-2] - 2 * g[1:-1] + g[2:]

    def forward(n, u, k):
        u += DT * (D * lap(u) - k * u**3)  # in place
        return u

    def vjp(n, u, k, ub):
        return ub + DT * (D * lap(ub) - 3 * k * u**2 * ub), -DT * u**3 * ub

    return rh.Step(forward, vjp)


LOSS = (
    rh.Running(lambda n, u, k: 0.01 * np.sum(u**2), grad=lambda n, u, k: (0.02 * u, 0.0)),
    rh.Final(lambda n, u, k: np.sum(np.sin(u)), grad=lambda n, u, k: (np.cos(u), 0.0)),
)


def main() -> int:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    x = np.linspace(0, 1, LOCAL * size)
    u_glob = np.sin(np.pi * x) + 0.3 * x
    k_glob = 0.5 + 0.5 * x**2
    sl = slice(rank * LOCAL, (rank + 1) * LOCAL)
    step = make_step(comm)
    directory = sys.argv[1] if len(sys.argv) > 1 else None
    ok = True
    results = []
    schedules = [
        rs.Revolve(4),
        rs.MultiLevel(
            [
                rs.Level(2, name="memory"),
                rs.Level(4, write_cost=1, read_cost=1, name="disk", storage="disk"),
            ]
        ),
    ]
    for sched in schedules:
        storage = {
            i: rh.Disk(directory, comm=comm) if i == len(sched.levels) - 1 else rh.Memory()
            for i in range(len(sched.levels))
        }
        with rh.forward(
            step, u_glob[sl], k_glob[sl], N, schedule=sched, loss=LOSS, storage=storage
        ) as fp:
            disk = fp._stores[-1]
            names = [nm for nm in os.listdir(disk.path) if nm != OWNER_FILE]
            if not names or not all(nm.startswith(f"r{rank}-step") for nm in names):
                print(f"rank {rank}: bad snapshot names {names}", flush=True)
                ok = False
            if not os.path.basename(disk.path).startswith(f"retrograde-r{rank}-"):
                print(f"rank {rank}: bad directory {disk.path}", flush=True)
                ok = False
            g = fp.vjp()
            J = comm.allreduce(fp.value)
            path = disk.path
        if os.path.exists(path):
            print(f"rank {rank}: {path} not removed", flush=True)
            ok = False
        results.append(
            (
                J,
                comm.gather(np.asarray(g.params), root=0),
                comm.gather(np.asarray(g.state0), root=0),
            )
        )
    if rank == 0:
        J_ref, g_ref = rh.value_and_grad(
            make_step(None), LOSS, u_glob, k_glob, N, schedule=rs.StoreAll()
        )
        for J, gk, gu in results:
            gk, gu = np.concatenate(gk), np.concatenate(gu)
            if not (
                np.isclose(J, J_ref, rtol=1e-12)
                and np.allclose(gk, g_ref.params, rtol=1e-11, atol=1e-14)
                and np.allclose(gu, g_ref.state0, rtol=1e-11, atol=1e-14)
            ):
                print(
                    f"mismatch: J {J} vs {J_ref}; |dk| {np.abs(gk - g_ref.params).max()}; "
                    f"|du0| {np.abs(gu - g_ref.state0).max()}",
                    flush=True,
                )
                ok = False
    ok = comm.allreduce(ok, op=MPI.LAND)
    if rank == 0 and ok:
        print(f"MPI OK {size}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
