"""Loops taped with pyadjoint for the adapter's tests (``examples/pyadjoint_vec.py`` types)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyadjoint as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from pyadjoint_vec import RECOMPUTES, DiskPackage, Vec, evolve, inner, matvec, react

__all__ = [
    "RECOMPUTES",
    "DiskPackage",
    "Vec",
    "adjfloat_loop",
    "vec_loop",
    "Derivatives",
    "derivatives",
    "finite_differences",
    "react",
    "uniform_loop",
    "poison",
]

K = 5
A = np.eye(K) * -2 + np.eye(K, k=1) + np.eye(K, k=-1)


def _iterate(tape, n_steps):
    return range(n_steps) if tape is None else tape.timestepper(iter(range(n_steps)))


def adjfloat_loop(m, tape=None, n_steps=9):
    """The issue's loop on ``AdjFloat``: step 3k makes ``w``, step 3k+2 reads it; J summed."""
    u, J, w = m, 0.0, None
    for n in _iterate(tape, n_steps):
        if n % 3 == 0:
            w = u * u
        u = 1.1 * u + 0.1 * u**2 - 0.05 * u**3
        if n % 3 == 2:
            u = u + 0.5 * w * u
        J = J + u
    return J


def vec_loop(p, tape=None, n_steps=9, change_at=None):
    """A Firedrake-like loop on :class:`Vec`: in-place updates, a delegated ``assign``
    (``w`` made at step 3k, read at 3k+2), a multistep read (``prev``, the state two steps
    back), a solve whose adjoint reads its output, and, at ``change_at``, a parameter field
    ``q`` assigned anew mid-run."""
    u = Vec(np.linspace(0.2, 0.8, K))
    w, v, prev, q = Vec(np.zeros(K)), Vec(np.zeros(K)), Vec(u.data), Vec(np.full(K, 0.3))
    older = Vec(u.data)
    J = 0.0
    for n in _iterate(tape, n_steps):
        if n % 3 == 0:
            w.assign(u)
        if change_at is not None and n == change_at:
            q.assign(Vec(np.full(K, 0.1)))
        matvec(v, A, u)
        older.assign(prev)
        prev.assign(u)
        evolve(
            u,
            lambda u, v, p, q, o: u + 0.05 * v + 0.1 * p * u * u * q + 0.02 * o,
            lambda u, v, p, q, o: [
                1 + 0.2 * p * u * q,
                0.05,
                0.1 * u * u * q,
                0.1 * p * u * u,
                0.02,
            ],
            lambda u, v, p, q, o: [
                [0.2 * p * q, 0, 0.2 * u * q, 0.2 * p * u, 0],
                [0, 0, 0, 0, 0],
                [0.2 * u * q, 0, 0, 0.1 * u * u, 0],
                [0.2 * p * u, 0, 0.1 * u * u, 0, 0],
                [0, 0, 0, 0, 0],
            ],
            [u, v, p, q, older],
        )
        if n % 3 == 2:  # a solve: its adjoint linearises at its output
            evolve(
                u,
                lambda u, w: u * np.exp(0.3 * w),
                lambda u, w, out: [np.exp(0.3 * w), 0.3 * out],
                lambda u, w: [
                    [0, 0.3 * np.exp(0.3 * w)],
                    [0.3 * np.exp(0.3 * w), 0.09 * u * np.exp(0.3 * w)],
                ],
                [u, w],
                uses_output=True,
            )
        J = J + inner(u, u, 0.5)
    return J


def uniform_loop(p, tape, n_steps):
    """Two counted blocks per step, and one more (the functional) in the last."""
    u, v = Vec(np.linspace(0.2, 0.8, 5)), Vec(np.zeros(5))
    for _ in tape.timestepper(iter(range(n_steps))):
        matvec(v, A, u)
        react(u, v, p)
    return inner(u, u)


def poison(tape):
    """Every live ``Vec`` on ``tape`` filled with NaN: a read of a live object shows."""
    for block in tape.get_blocks():
        for bv in list(block.get_outputs()) + list(block.get_dependencies()):
            if isinstance(bv.output, Vec):
                bv.output.data[...] = np.nan


def poisoned_derivatives(schedule, n_steps=None) -> list[float]:
    """``vec_loop`` taped under ``schedule``, every live object poisoned after taping
    (:func:`poison`), then: grad, grad again, J at 1.3, grad, tlm and Hessian there."""
    import retrograde.pyadjoint as rp

    tape = pa.Tape()
    with pa.set_working_tape(tape):
        rp.enable_checkpointing(schedule, n_steps=n_steps)
        p = pa.AdjFloat(0.7)
        rf = pa.ReducedFunctional(vec_loop(p, tape), pa.Control(p))
        poison(tape)
        return [
            float(rf.derivative()),
            float(rf.derivative()),
            float(rf(pa.AdjFloat(1.3))),
            float(rf.derivative()),
            float(rf.tlm(pa.AdjFloat(1.0))),
            float(rf.hessian(pa.AdjFloat(1.0))),
        ]


class Derivatives(tuple):
    """(grad at p0, grad again, J at p1, grad at p1, tlm at p1, Hessian at p1, grad again)."""


def derivatives(loop, schedule=None, n_steps=None, p0=0.7, p1=1.3, tape_n=9, **kw):
    """Tape ``loop`` (under ``schedule`` with retrograde's manager; ``None``: unchecked), then
    the derivatives that pyadjoint users take, in the order that exposes stale values."""
    import retrograde.pyadjoint as rp

    tape = pa.Tape()
    with pa.set_working_tape(tape):
        manager = None if schedule is None else rp.enable_checkpointing(schedule, n_steps=n_steps)
        p = pa.AdjFloat(p0)
        J = loop(p, tape, tape_n, **kw)
        rf = pa.ReducedFunctional(J, pa.Control(p))
        out = [
            float(rf.derivative()),
            float(rf.derivative()),
            float(rf(pa.AdjFloat(p1))),
            float(rf.derivative()),
            float(rf.tlm(pa.AdjFloat(1.0))),
            float(rf.hessian(pa.AdjFloat(1.0))),
            float(rf.derivative()),
        ]
    return np.array(out), manager, tape


def finite_differences(loop, p, h=1e-6, **kw):
    """Central differences of ``loop``'s J and of its gradient (for the Hessian)."""
    with pa.stop_annotating():

        def J(x):
            return float(loop(pa.AdjFloat(x), **kw))

        g = (J(p + h) - J(p - h)) / (2 * h)
        H = (J(p + 1e-4) - 2 * J(p) + J(p - 1e-4)) / 1e-8
    return g, H
