"""The in-graph schedule machinery equals its pure-Python twin, action by action.

``_machine`` generates the binomial reversal inside a compiled program (for run-time step
counts); ``_placement`` is the ``Online`` forward rule in ``jax.numpy``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrograde.loops import _machine as M
from retrograde.loops._placement import store_slot
from retrograde.schedules import Advance, Record, Restore, Revolve, Store
from retrograde.schedules._online import online_store_slot

OPS = {Advance: M.ADVANCE, Store: M.STORE, Restore: M.RESTORE, Record: M.RECORD}
CAPACITY = 4000


def python_rows(n, s):
    """Revolve's actions as (op, step, stop-or-None), without the initial Store(0) and Frees."""
    rows = []
    for act in list(Revolve(s).actions(n))[1:]:
        op = OPS.get(type(act))
        if op is None:
            continue
        rows.append((op, act[0], act[1] if op == M.ADVANCE else None))
    return rows


@jax.jit
def machine_rows(n, starts, slots, n_seg):
    state = M.init_state(starts.shape[0], starts, slots, n_seg, n, True)
    buf = jnp.full((CAPACITY, 3), -1, jnp.int32)

    def go(c):
        return (M.phase(c[0]) != M.P_DONE) & (c[2] < CAPACITY) & (c[3] < 4 * CAPACITY)

    def one(c):
        st, buf, i, it = c
        st, (op, a, b) = M.step(st)
        keep = op != M.NOP
        buf = jnp.where(keep, buf.at[i].set(jnp.stack([op, a, b])), buf)
        return st, buf, i + keep.astype(jnp.int32), it + 1

    _, buf, i, _ = jax.lax.while_loop(go, one, (state, buf, jnp.int32(0), jnp.int32(0)))
    return buf, i


@pytest.mark.parametrize("s", [1, 2, 3, 5, 8])
def test_machine_reproduces_revolve(s):
    zeros = jnp.zeros(s, jnp.int32)
    for n in (1, 2, 3, 7, 20, 57, 200):
        buf, count = machine_rows(n, zeros, zeros, 1)
        got = []
        for o, a, b in np.asarray(buf)[: int(count)]:
            if o == M.RECORD and b > 0:  # a record from slot b - 1: restore, then record
                got.append((M.RESTORE, int(a), None))
            got.append((int(o), int(a), int(b) if o == M.ADVANCE else None))
        assert got == python_rows(n, s), (n, s)


@pytest.mark.parametrize("s, steps", [(1, 250), (2, 250), (4, 250), (8, 250), (40, 700)])
def test_placement_matches_online_rule(s, steps):
    rule = jax.jit(lambda n, h: store_slot(n, h, s))
    held = [-1] * s
    for n in range(steps):
        want = online_store_slot(n, held, s)
        assert int(rule(n, jnp.asarray(held, jnp.int32))) == want, (n, held)
        if want >= 0:
            held[want] = n


def test_optimum_elementwise_matches_closed_form():
    """The vectorised in-graph Revolve optimum, against the Python closed form (saturating)."""
    from retrograde.loops._placement import COST_CAP, optimum
    from retrograde.schedules import revolve_optimum

    pairs = [(n, s) for n in (0, 1, 2, 3, 7, 50, 400, 5000, 46341, 46342, 10**6) for s in (1, 2, 3, 9, 40, 90)]
    ns, ss = (jnp.asarray(v, jnp.int32) for v in zip(*pairs))
    want = [min(revolve_optimum(n, s), COST_CAP) for n, s in pairs]
    # Traced slot counts: the loop over the repetition number.
    assert np.asarray(jax.jit(optimum)(ns, ss)).tolist() == want
    # Static slot counts (as in the placement rule): the trace-time table, falling back to the
    # loop when a repetition number outgrows it (n = 10**6 with 2 or 3 slots).
    s_static = np.asarray(ss)
    assert np.asarray(jax.jit(lambda n: optimum(n, s_static))(ns)).tolist() == want
    # The table alone, wherever it reaches (every repetition number up to 16 for s >= 8, 48
    # below), entry by entry and between entries.
    from retrograde.loops._placement import _optimum_table

    grid = [(n, s) for s in (1, 2, 3, 5, 7) for n in range(0, 1300)] + [
        (n, s) for s in (8, 9, 40, 90) for n in range(0, 3000)
    ]
    for group in ([g for g in grid if g[1] < 8], [g for g in grid if g[1] >= 8]):
        ns, s_static = jnp.asarray([n for n, _ in group], jnp.int32), np.asarray([s for _, s in group])
        got, fits = (np.asarray(v) for v in jax.jit(lambda n: _optimum_table(n, s_static))(ns))
        want = np.asarray([min(revolve_optimum(n, s), COST_CAP) for n, s in group])
        assert fits.mean() > 0.9
        assert (got[fits] == want[fits]).all()
        got = np.asarray(jax.jit(lambda n: optimum(n, s_static))(ns)).tolist()
        assert got == want.tolist()


@pytest.mark.parametrize("s_max", [5, 40])
def test_split_table_matches_revolve_split(s_max):
    """The in-graph split, table-driven (with its loop fallback for long segments), against
    the Python rule, over every segment length up to 2000 and every slot count up to ``s_max``."""
    from retrograde.loops._machine import split
    from retrograde.schedules._revolve import revolve_split

    cases = [(n, s) for s in range(2, s_max + 1) for n in range(2, 2001, 3 if s > 3 else 1)]
    ns, ss = (jnp.asarray(v, jnp.int32) for v in zip(*cases))
    got = jax.jit(jax.vmap(lambda n, s: split(n, s, s_max)))(ns, ss)
    want = [revolve_split(n, s)[0] for n, s in cases]
    assert np.asarray(got).tolist() == want
