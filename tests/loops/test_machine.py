"""The in-graph schedule machinery against the pure-Python schedules.

``_machine`` generates the binomial reversal inside a compiled program as macro-actions; here they
are expanded into the schedule action vocabulary and executed by the simulator, which proves
them valid (every restore finds its state, every record has its state at hand) and counts them.
``_placement`` is the ``Online`` forward rule in ``jax.numpy``; ``_binomial`` the Revolve
quantities it and the machine share.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from retrograde.loops import _binomial as B
from retrograde.loops import _machine as M
from retrograde.loops import _offload
from retrograde.loops._binomial import COST_CAP, _optimum_table, optimum
from retrograde.loops._placement import store_slot
from retrograde.loops._sources import RowSource
from retrograde.loops._tables import tables_for
from retrograde.schedules import (
    Advance,
    End,
    Free,
    Level,
    Linearize,
    Online,
    Periodic,
    RecomputeAll,
    Record,
    Restore,
    Reverse,
    Revolve,
    Store,
    StoreAll,
    default_schedule,
    execute,
    largest_split,
    online_decisions,
    online_store_slot,
    online_targets,
    revolve_optimum,
    simulate,
    thinning_slot,
)
from retrograde.schedules._optimum import beta, repetition

CAPACITY = 3000


@functools.partial(jax.jit, static_argnums=(0, 5, 6, 7))
def _run(n_slots, steps, slots, n_held, n, at_hand, with_pairs=False, rule=M.REVOLVE):
    """Every action of the machine (by ``rule``), with the slots of each leaf."""
    state = M.init(n_slots, steps, slots, n_held, n, at_hand)
    acts = jnp.full((CAPACITY, 7), -1, jnp.int32)
    idxs = jnp.full((CAPACITY, n_slots + 1), -1, jnp.int32)

    def go(c):
        return ~M.done(c[0]) & (c[3] < CAPACITY)

    def one(c):
        st, acts, idxs, i = c
        st, a = M.step(st, with_pairs, rule)
        return (
            st,
            acts.at[i].set(jnp.stack(a)),
            idxs.at[i].set(M.leaf_slots(st, with_pairs)),
            i + 1,
        )

    _, acts, idxs, count = jax.lax.while_loop(go, one, (state, acts, idxs, jnp.int32(0)))
    return acts, idxs, count


def expand(acts, idxs, held, far=None, data=0):
    """Macro-actions as schedule actions; ``held`` maps each slot to the step it holds. With
    ``far``, restores from slots ``far`` and above are from slot ``slot - far`` of level 1 (the
    offloaded slots of ``Online(s, slow=...)``). A ``DATA`` leaf keeps its steps' data in slots
    ``data``, ``data + 1``, ..."""
    held, out = dict(held), []

    def store(step, slot):
        if held.get(slot) == step:  # a leaf rewrites its own slot's state: nothing new
            return
        if slot in held:
            out.append(Free(held[slot], slot, 0))
        out.append(Store(step, slot, 0))
        held[slot] = step

    for (kind, restore, a, b, first, st, fresh), idx in zip(acts, idxs):
        if kind == M.DONE:
            break
        if restore >= 0:
            far_slot = far is not None and restore >= far
            out.append(Restore(a, restore - far if far_slot else restore, int(far_slot)))
        if kind == M.MOVE:
            if b > a:
                out.append(Advance(a, b))
            if st >= 0:
                store(b, st)
            continue
        if kind == M.DATA:  # linearize, record the last step, reverse the others from data
            out += [Linearize(k, data + k - a, 0) for k in range(a, b - 1)] + [Record(b - 1)]
            for k in range(b - 2, a - 1, -1):
                out += [Reverse(k, data + k - a, 0), Free(k, data + k - a, 0)]
            continue
        if kind == M.PAIRS:  # from each u_a (held), lowest first, advance and store u_{a+1}
            for k in range(a, b, 2):
                out += [Restore(k, idx[k - a], 0), Advance(k, k + 1)]
                if k + 1 < b - 1:
                    store(k + 1, idx[k + 1 - a])
        for k in range(first, b - 1):
            store(k, idx[k - a])
            out.append(Advance(k, k + 1))
        for k in range(b - 1, a - 1, -1):
            if k < b - 1 or not fresh:
                out.append(Restore(k, idx[k - a], 0))
            out.append(Record(k))
    return out + [End()]


def machine_stats(n, n_slots, held, at_hand, with_pairs=False, rule=M.REVOLVE):
    """Run the machine (by ``rule``) from ``held`` ({slot: step}; with ``at_hand``, ``u_{n-1}``
    is the state at hand) and simulate what it does, the forward sweep included."""
    pairs = sorted((p, k) for k, p in held.items())
    pad = n_slots - len(pairs)
    steps = jnp.asarray([p for p, _ in pairs] + [0] * pad, jnp.int32)
    slots = jnp.asarray([k for _, k in pairs] + [0] * pad, jnp.int32)
    acts, idxs, count = (
        np.asarray(v) for v in _run(n_slots, steps, slots, len(pairs), n, at_hand, with_pairs, rule)
    )
    assert count < CAPACITY
    forward, at = [], 0
    for p, k in pairs:
        if p > at:
            forward.append(Advance(at, p))
        forward.append(Store(p, k, 0))
        at = p
    end = n - 1 if at_hand else n  # a while loop runs to u_N before it reverses
    if n and at < end:
        forward.append(Advance(at, end))
    start = dict((k, p) for p, k in pairs)
    level = Level(n_slots + rule.data_rows(n_slots))  # data slots after the state slots
    actions = forward + expand(acts[:count], idxs[:count], start, data=n_slots)
    return execute(actions, n, (level,)), int(count)


SCHEDULES = [
    Revolve(1),
    Revolve(2),
    Revolve(3),
    Revolve(5),
    Revolve(16),
    StoreAll(),
    RecomputeAll(),
    Periodic(3),
    Periodic(7),
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=repr)
def test_machine_executes_binomial_schedules_exactly(schedule):
    """From the stores of a schedule's forward sweep, the machine makes exactly the schedule's
    evaluations (Revolve's are the proven optimum), and every action is valid."""
    for n in (0, 1, 2, 3, 4, 7, 20, 57, 200):
        stores = schedule.binomial_stores(n)
        n_slots = max(1, len(stores), min(schedule.max_slots(n)[0], n - 1))
        stats, count = machine_stats(n, n_slots, dict(enumerate(stores)), at_hand=True)
        want = simulate(schedule, n)
        assert (stats.plain, stats.recorded) == (want.plain, want.recorded), (n, schedule)
        assert count <= 3 * n + 2  # macro-actions: at most a few per recorded step


def test_store_all_is_one_leaf():
    """Storing every state, the whole reversal is one leaf: a single record run."""
    _, count = machine_stats(500, 499, {k: k for k in range(499)}, at_hand=True)
    assert count == 2  # the leaf, then DONE


@pytest.mark.parametrize("s", [1, 2, 4, 8, 40])
def test_machine_reverses_online_placements(s):
    """From the snapshots ``Online(s)`` places (no state at hand), the machine makes exactly the
    evaluations of the Python online reversal, also with ``PAIRS`` leaves (as ``while_loop``
    runs it), which make fewer macro-actions."""
    for n in (1, 2, 5, 30, 257, 700):
        held = [-1] * s
        for step in range(n):
            k = online_store_slot(step, held, s)
            if k >= 0:
                held[k] = step
        held = {k: p for k, p in enumerate(held) if p >= 0}
        want = simulate(Online(s), n)
        stats, count = machine_stats(n, s, held, False)
        assert (stats.plain, stats.recorded) == (want.plain, want.recorded), (n, s)
        stats, fewer = machine_stats(n, s, held, False, with_pairs=True)
        assert (stats.plain, stats.recorded) == (want.plain, want.recorded), (n, s)
        assert fewer <= count
        if (s, n) == (40, 700):  # 17 two-step segments end this loop: 1 + 2 + 4 + 8 + 2
            assert fewer == count - 12


def test_pairs_leaves_take_runs_of_two_step_segments():
    """A two-step task takes the two-step segments below it along, up to the first that is
    longer and as far as the free slots allow; their slots return to the free list, where a
    later leaf finds them."""
    n_slots = 10
    # Segments of 10, 2, 2, 2, 1, 2, 2, 2, 2 steps; one free slot.
    held = dict(enumerate([0, 10, 12, 14, 16, 17, 19, 21, 23]))
    for at_hand in (False, True):
        stats, count = machine_stats(25, n_slots, held, at_hand, with_pairs=True)
        want, plain_count = machine_stats(25, n_slots, held, at_hand)
        assert (stats.plain, stats.recorded) == (want.plain, want.recorded)
        assert count < plain_count


@settings(max_examples=40, deadline=None)
@given(
    hst.sampled_from([6, 12]),
    hst.lists(hst.sampled_from([1, 2, 2, 2, 3, 5, 9]), min_size=1, max_size=12),
    hst.booleans(),
    hst.randoms(),
)
def test_pairs_leaves_from_any_held_snapshots(n_slots, lengths, at_hand, rnd):
    """From any held snapshots (segments of random lengths, many of two steps, in any slots,
    any number of free slots), ``PAIRS`` leaves make exactly the evaluations of the machine
    without them, every action valid (the simulator checks each restore's slot)."""
    lengths = lengths[:n_slots]
    starts = np.cumsum([0] + lengths[:-1]).tolist()
    n = sum(lengths)
    held = dict(zip(rnd.sample(range(n_slots), len(starts)), starts))
    at_hand = at_hand and lengths[-1] > 1  # u_{N-1} at hand is never also held
    stats, count = machine_stats(n, n_slots, held, at_hand, with_pairs=True)
    want, plain_count = machine_stats(n, n_slots, held, at_hand)
    assert (stats.plain, stats.recorded) == (want.plain, want.recorded)
    assert count <= plain_count


def _values(jaxpr):
    """Every value a jaxpr computes or reads as a constant, nested jaxprs included."""
    yield from jaxpr.constvars
    for eqn in jaxpr.eqns:
        yield from eqn.outvars
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _values(sub)


@functools.partial(jax.jit, static_argnums=0)
def _run_segments(n_device, held, n):
    """Every action of ``_offload.Segments`` (the two-level reversal), with each leaf's slots."""
    source = _offload.Segments(n_device, held, n)
    acts = jnp.full((CAPACITY, 7), -1, jnp.int32)
    idxs = jnp.full((CAPACITY, n_device + 1), -1, jnp.int32)

    def go(c):
        return (c[4] != M.DONE) & (c[3] < CAPACITY)

    def one(c):
        st, acts, idxs, i, _ = c
        st, a = source.step(st)
        return (
            st,
            acts.at[i].set(jnp.stack(a)),
            idxs.at[i].set(source.leaf_slots(st)),
            i + 1,
            a.kind,
        )

    init = (source.state, acts, idxs, jnp.int32(0), jnp.int32(M.MOVE))
    _, acts, idxs, count, _ = jax.lax.while_loop(go, one, init)
    return acts, idxs, count


@pytest.mark.parametrize("d, h", [(1, 1), (1, 4), (2, 3), (4, 9)])
def test_segments_reverse_as_the_two_level_schedule(d, h):
    """The in-graph two-level reversal (``_offload.Segments``: each segment's start restored
    from its offloaded slot into device slot 0, then the machine with the ``d`` device slots),
    from the snapshots the thinning rule places, makes the evaluations and the slow level's
    reads of its Python twin (``Online(d, slow=...)``'s reversal, ``reverse_segments``), and
    every action is valid."""
    sched = Online(d, slow=Level(h, 1.0, 1.0, storage="host"))
    for n in (1, 2, 3, 6, 17, 64, 250):
        held = [-1] * h
        for step in range(n):
            k = thinning_slot(step, held, h)
            if k >= 0:
                held[k] = step
        forward = list(sched.start().forward(lambda step: step < n))
        acts, idxs, count = (
            np.asarray(v) for v in _run_segments(d, jnp.asarray(held, jnp.int32), n)
        )
        assert 0 < count < CAPACITY and acts[count - 1, 0] == M.DONE
        got = execute(forward + expand(acts[:count], idxs[:count], {}, far=d), n, sched.levels)
        want = simulate(sched, n)
        assert (got.plain, got.recorded) == (want.plain, want.recorded), (n, d, h)
        assert (got.writes[1], got.reads[1]) == (want.writes[1], want.reads[1]), (n, d, h)


def test_binomials_match_python():
    """The int32 binomials of the compiled loops (``_binomial``: the saturating table, the
    repetition number and the ``Online`` targets) against their Python homes (``_optimum``,
    ``online_targets``), over every step count up to 1500 and slot counts up to 40."""
    table = B.beta_table(40, 48)
    assert table.tolist() == [[min(beta(s, r), B.CAP) for r in range(49)] for s in range(41)]
    cases = [(n, s) for s in (1, 2, 3, 5, 8, 40) for n in range(1501)]
    ns, ss = (jnp.asarray(v, jnp.int32) for v in zip(*cases))
    r, b = (np.asarray(v).tolist() for v in jax.jit(jax.vmap(B.repetition))(ns, ss))
    want = [repetition(n, s) for n, s in cases]
    assert r == [w[0] for w in want]
    assert b == [min(w[1], B.CAP) for w in want]
    for s in (1, 3, 40):
        got = np.asarray(jax.jit(jax.vmap(lambda n: B.targets(n, s)))(ns[:1501]))
        assert got.tolist() == [list(online_targets(n, s)) for n in range(1501)], s


@pytest.mark.parametrize("x64", [False, True])
def test_machine_values_fit_in_512_bytes(x64):
    """Every array the machine's step computes or reads (its state, stack, the split's
    binomials, actions, leaf slots), and the sort that lays out its held snapshots, is at most
    512 bytes for ``S = 126`` slots, also under x64: XLA's CPU runtime then runs a body of these
    kernels in order (docs/performance.md)."""
    n_slots = 126

    def run(held, n):
        order = M.argsort(jnp.where(held < 0, jnp.iinfo(jnp.int32).max, held))
        st = M.init(n_slots, held[order], order, jnp.sum(held >= 0, dtype=jnp.int32), n, False)
        st, act = M.step(st, True)
        return st, act, M.leaf_slots(st, True)

    with jax.enable_x64(x64):
        jaxpr = jax.make_jaxpr(run)(jnp.zeros(n_slots, jnp.int32), jnp.int32(5)).jaxpr
    sizes = [(v.aval.size * v.aval.dtype.itemsize, str(v.aval)) for v in _values(jaxpr)]
    assert len(sizes) > 100
    assert max(sizes)[0] <= 512, max(sizes)


@pytest.mark.parametrize("s, steps", [(1, 250), (2, 250), (4, 250), (8, 250), (40, 700)])
def test_placement_matches_online_rule(s, steps):
    """The in-graph rule (what a while loop evaluates beyond its decision table) and the table
    itself make the decisions of the Python rule at every step."""
    rule = jax.jit(lambda n, h: store_slot(n, h, s))
    table = online_decisions(s, steps)
    held = [-1] * s
    for n in range(steps):
        want = online_store_slot(n, held, s)
        assert int(rule(n, jnp.asarray(held, jnp.int32))) == want == table[n], (n, held)
        if want >= 0:
            held[want] = n


def test_optimum_elementwise_matches_closed_form():
    """The vectorised in-graph Revolve optimum, against the Python closed form (saturating)."""
    pairs = [
        (n, s)
        for n in (0, 1, 2, 3, 7, 50, 400, 5000, 46341, 46342, 10**6)
        for s in (1, 2, 3, 9, 40, 90)
    ]
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
    grid = [(n, s) for s in (1, 2, 3, 5, 7) for n in range(0, 1300)] + [
        (n, s) for s in (8, 9, 40, 90) for n in range(0, 3000)
    ]
    for group in ([g for g in grid if g[1] < 8], [g for g in grid if g[1] >= 8]):
        ns = jnp.asarray([n for n, _ in group], jnp.int32)
        s_static = np.asarray([s for _, s in group])
        got, fits = (np.asarray(v) for v in jax.jit(lambda n: _optimum_table(n, s_static))(ns))
        want = np.asarray([min(revolve_optimum(n, s), COST_CAP) for n, s in group])
        assert fits.mean() > 0.9
        assert (got[fits] == want[fits]).all()
        got = np.asarray(jax.jit(lambda n: optimum(n, s_static))(ns)).tolist()
        assert got == want.tolist()


@pytest.mark.parametrize("s_max", [5, 40])
def test_split_largest_matches_python(s_max):
    """The in-graph largest optimal split (one loop over the repetition number) against the
    Python rule, over every segment length up to 3000 and every slot
    count up to ``s_max``; the Python rule against the brute-force optimum."""
    cases = [(n, s) for s in range(2, s_max + 1) for n in range(s + 2, 3001, 3 if s > 3 else 1)]
    cases += [(10**6, 2), (10**6, 3), (200_000, 5)]
    ns, ss = (jnp.asarray(v, jnp.int32) for v in zip(*cases))
    got = jax.jit(jax.vmap(lambda n, s: B.largest_split(n, s, s_max)))(ns, ss)
    assert np.asarray(got).tolist() == [largest_split(n, s) for n, s in cases]
    for s in range(2, min(s_max, 8) + 1):
        for n in range(s + 2, 200):
            costs = [j + revolve_optimum(n - j, s - 1) + revolve_optimum(j, s) for j in range(1, n)]
            best = min(costs)
            assert largest_split(n, s) == max(j for j, c in enumerate(costs, 1) if c == best)


def test_split_with_many_slots():
    """The largest split with many slots (one loop over the repetition number, no table of
    ``S`` rows) equals the Python rule, up to ``S = 14141``."""
    cases = [
        (n, s)
        for s in (1023, 1024, 1500, 5791, 5792, 14141)
        for n in (s + 2, 3 * s, min(s * s // 2, B.CAP - 1), 10**7)
    ]
    ns, ss = (jnp.asarray(v, jnp.int32) for v in zip(*cases))
    got = jax.jit(jax.vmap(lambda n, s: B.largest_split(n, s)))(ns, ss)
    assert np.asarray(got).tolist() == [largest_split(n, s) for n, s in cases]


@pytest.mark.parametrize("schedule", SCHEDULES + [Revolve(44)], ids=repr)
def test_row_tables_are_the_machines_actions(schedule):
    """The Python twin that writes the machine's macro-actions into a table when tracing (for
    reversals of at most ``ROW_LIMIT`` of them) emits exactly the machine's actions, and its
    leaves keep their states in the machine's slots (every slot a leaf reads)."""
    for n in (2, 7, 57, 1000):
        tables = tables_for(schedule, n)
        assert tables.rows is not None, (schedule, n)
        steps, slots, count = tables.held
        acts, idxs, k = (
            np.asarray(v)
            for v in _run(tables.n_slots, jnp.asarray(steps), jnp.asarray(slots), count, n, True)
        )
        assert acts[k - 1, 0] == M.DONE
        k = int(k) - 1
        assert tables.rows.tolist() == acts[:k].tolist(), (schedule, n)
        source = RowSource(tables)
        # Jitted: eagerly, each of its operations compiles on its own (3 s a table, not 0.4 s).
        got = np.asarray(jax.jit(jax.vmap(source.leaf_slots))(jnp.arange(1, k + 1)))
        for row, mine, theirs in zip(acts[:k], got, idxs[:k]):
            if row[0] == M.LEAF:
                read = row[3] - row[2] - row[6]  # the last state of a fresh leaf is at hand
                assert mine[:read].tolist() == theirs[:read].tolist(), (schedule, n, row)


def test_long_reversals_run_the_machine():
    """Past ``ROW_LIMIT`` macro-actions the tables hold no rows (the compiled loop runs the
    machine); the default schedule's rows stay ``O(S)`` at ``N = 10**8``."""
    assert tables_for(Revolve(3), 20_000).rows is None
    with pytest.raises(ValueError, match="at most 16777215 steps"):
        tables_for(Revolve(3), B.CAP)
    big = tables_for(default_schedule(10**8), 10**8)
    assert big.rows is not None and len(big.rows) < 2 * big.n_slots
