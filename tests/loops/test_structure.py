"""The structure of the lowered derivatives: how many copies of the step, and of the binomial
machine's step, a compiled gradient or HVP holds (issue #33: compile time grows with them).

Counted in the lowered StableHLO (``jax.jit(f).lower(...).as_text()``) as the ``tanh`` ops of a
step whose only transcendental is one ``tanh``: each is a copy of the step's evaluation (a plain
step, a store or a record's recomputation). The machine's step is counted as the times it is
traced while lowering (shape-only passes included). Exact counts, no timing: a change that adds
a copy fails here and says where to look (docs/performance.md, "Compile time").
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from jax.extend import core as jax_core

import retrograde
from retrograde.loops import _machine
from retrograde.loops._placement import store_slot

N = 40
THETA = jnp.float64(0.7)
U0 = jnp.array([0.2, -0.3, 0.5])


def _scan_loss(theta, u0):
    step = lambda u, _: (u + 0.1 * jnp.tanh(theta * u), None)
    return jnp.sum(retrograde.scan(step, u0, length=N)[0] ** 2)


def _mixed_loss(theta, u0):
    """``Mixed(20, 2.0)``: its first sweep ends by linearizing its rightmost leaf, steps 31..38
    (``Tables.lead``)."""
    step = lambda u, _: (u + 0.1 * jnp.tanh(theta * u), None)
    schedule = retrograde.schedules.Mixed(20, 2.0)
    return jnp.sum(retrograde.scan(step, u0, length=N, schedule=schedule)[0] ** 2)


def _while_loss(theta, u0):
    u = retrograde.while_loop(
        lambda c: c[0] < N, lambda c: (c[0] + 1, c[1] + 0.1 * jnp.tanh(theta * c[1])), (0, u0)
    )[1]
    return jnp.sum(u**2)


def _hvp(loss):
    def hvp(theta, u0):
        return jax.jvp(lambda t: jax.grad(loss, (0, 1))(t, u0), (theta,), (jnp.float64(1.0),))[1]

    return hvp


@pytest.fixture
def machine_steps(monkeypatch):
    """Counts the traces of the binomial machine's step."""
    traces = []
    plain = _machine.step

    def counted(*args, **kwargs):
        traces.append(1)
        return plain(*args, **kwargs)

    monkeypatch.setattr(_machine, "step", counted)
    return traces


def _lowered(f):
    return jax.jit(f).lower(THETA, U0).as_text()


# (derivative, loss) -> (copies of the step, traces of the machine's step)
#   scan gradient: the forward sweep's segments loop (1); the reverse sweep's move (advance),
#     leaf forward, the leaf's last record, its records loop (4); no machine (a table of rows).
#   scan HVP: the tangent sweep's segments loop (1) besides the gradient's.
#   Mixed gradient (a lead leaf): the scan gradient's and a DATA leaf's linearized steps (1),
#     and the forward sweep's lead leaf, whose data it keeps (1): one more than without one.
#   Mixed HVP: the scan HVP's and the augmented sweep's DATA leaf (1); no lead copy (the
#     forward lays states only, which the augmented sweep shares with their tangents).
#   while_loop gradient: the forward sweep's two placement phases (table, rule) (2); the
#     reverse sweep's four (4: a PAIRS leaf's forward runs in the leaf's forward loop, one call
#     site of the step for both); the machine's step once, in the executor's moves loop.
#   while_loop HVP: the tangent sweep (1) and the augmented sweep's replay of the placement
#     (2) besides the gradient's; the machine's step once, in the augmented sweep.
CASES = {
    "scan-grad": (lambda: jax.grad(_scan_loss, (0, 1)), 6, 0),
    "scan-hvp": (lambda: _hvp(_scan_loss), 8, 0),
    "mixed-grad": (lambda: jax.grad(_mixed_loss, (0, 1)), 8, 0),
    "mixed-hvp": (lambda: _hvp(_mixed_loss), 9, 0),
    "while-grad": (lambda: jax.grad(_while_loss, (0, 1)), 6, 1),
    "while-hvp": (lambda: _hvp(_while_loss), 9, 1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_copies_of_the_step(case, machine_steps):
    make, step_copies, machine_copies = CASES[case]
    text = _lowered(make())
    assert text.count("stablehlo.tanh") == step_copies
    assert len(machine_steps) == machine_copies


def _equations(jaxpr) -> int:
    """The equations of a jaxpr, those of its sub-jaxprs (loop bodies, branches, nested
    ``jit``) included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += 1
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                if isinstance(sub, jax_core.ClosedJaxpr):
                    count += _equations(sub.jaxpr)
                elif isinstance(sub, jax_core.Jaxpr):
                    count += _equations(sub)
    return count


# (with_pairs, slots) -> jaxpr equations of one machine step (with the Revolve rule), and of the
# Online placement rule evaluated past the decision table. Before issue #33's second session:
# the step 1035 / 1137 (the largest split's table and loop forms, 492), the rule 455.
MACHINE_EQUATIONS = {(False, 16): 411, (True, 16): 499}
PLACEMENT_EQUATIONS = 259


@pytest.mark.parametrize("with_pairs, n_slots", list(MACHINE_EQUATIONS))
def test_size_of_the_machines_step(with_pairs, n_slots):
    """The binomial machine's step (the ``while_loop`` gradient's control) and the ``Online``
    rule (its forward sweep's, past the decision table) hold exactly this many jaxpr equations:
    the split is one loop, the phases select only the registers they change (a change that
    grows them fails here; docs/performance.md, "Compile time")."""
    steps = jnp.arange(n_slots, dtype=jnp.int32)
    st = _machine.init(n_slots, steps, steps, jnp.int32(3), jnp.int32(500), False)
    jaxpr = jax.make_jaxpr(lambda st: _machine.step(st, with_pairs))(st).jaxpr
    assert _equations(jaxpr) == MACHINE_EQUATIONS[with_pairs, n_slots]
    held = jnp.full((n_slots,), -1, jnp.int32)
    rule = jax.make_jaxpr(lambda n, h: store_slot(n, h, n_slots))(jnp.int32(9000), held).jaxpr
    assert _equations(rule) == PLACEMENT_EQUATIONS


def _split_in_loops(text: str) -> list[str]:
    """The kernels of loop bodies (at any depth) that XLA's CPU compiler splits across its
    thread pool (``outer_dimension_partitions`` in the compiled text's backend config)."""
    bodies = set(re.findall(r"body=%([\w.\-]+)", text))
    split, inside = [], False
    for line in text.splitlines():
        head = re.match(r"%([\w.\-]+) \(", line)
        if head:
            inside = head.group(1) in bodies
        elif inside and "outer_dimension_partitions" in line:
            split.append(line.split("=")[0].strip())
    return split


@pytest.mark.parametrize("schedule", ["Revolve", "Mixed"])
def test_no_kernel_split_in_the_reverse_sweep(schedule):
    """No kernel inside the gradient's loops is split across threads: each trip would hand half
    of it to the thread pool. A DATA leaf's reversal read its pooled data as a slice of the
    flattened snapshot buffer (``f64[44, 2000]``); fused into the VJP's kernel, that kernel was
    split in two, and ``Mixed(44, 1.0)`` was slower than Revolve (docs/performance.md, "Mixed in
    the compiled loops"). Compiled only (on a machine with one core nothing is split, and this
    holds trivially)."""
    sched = {
        "Revolve": retrograde.schedules.Revolve(44),
        "Mixed": retrograde.schedules.Mixed(44, 1.0),
    }
    step = lambda u, _: (u + 0.01 * jnp.sin(0.5 * u), None)

    def loss(u0):
        u = retrograde.scan(step, u0, length=200, schedule=sched[schedule])[0]
        return jnp.sum(u**2)

    text = jax.jit(jax.grad(loss)).lower(jnp.ones(2000)).compile().as_text()
    assert _split_in_loops(text) == []
