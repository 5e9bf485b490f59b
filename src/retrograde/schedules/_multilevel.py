"""Checkpointing across storage levels: ``MultiLevel`` (Disk-Revolve / H-Revolve style).

Sources: Aupy, Herrmann, Hovland & Robert, "Optimal multistage algorithm for adjoint
computation", SISC 38(3) 2016 (Disk-Revolve); Herrmann & Pallez, "H-Revolve", ACM TOMS 46(2)
2020; Stumm & Walther, SISC 31(3) 2009 (multistage heuristic).

Structure of a solution (all costs in units of one plain step times ``forward_cost``):

* ``M(n)``: reverse ``n`` steps with level 0 only: store the start on level 0 and run Revolve's
  binomial schedule with ``s0`` slots. ``M(n) = u_f t(n, s0) + w_0 (1 + stores) + r_0 (n - 1)``
  (every schedule restores exactly ``n - 1`` times), ``M(1) = 0`` (a single step is recorded
  straight away, nothing is stored).
* ``B_k(n)`` (1-D Revolve, Aupy et al.): the start is at hand *and* held on a slow level ``k``
  (every re-read costs ``r_k``), all of level 0 is free::

      B_k(n) = min( M(n),  min_{1<=j<n} u_f j + M(n - j) + r_k + B_k(j) )

* the *chain* (the forward sweep of Disk-Revolve): ``u_0`` and later states ``u_{p_i}`` are written
  to slow levels, the last segment is reversed with level 0 only, then every earlier segment is
  restored from its slow level and reversed by ``B_k``. A segment of length ``j`` on level ``k``
  costs ``seg_k(j) = w_k + u_f j + r_k + B_k(j)``; with an unlimited last level ``K-1``::

      U(n) = min( M(n),  min_j seg_{K-1}(j) + U(n - j) )

  and limited levels ``k >= 1`` add a count of held chain slots per level (a layered DP).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._actions import Action, Advance, End, Executor, Free, Record, Restore, Store, relabel
from ._base import Level, OfflineSchedule, check_steps
from ._optimum import bands, beta, optimum_table
from ._revolve import Revolve, reverse_segment, revolve_split

__all__ = ["MultiLevel"]

# Longest chain segment tabulated for the 1-D problem (its table costs O(J^2) element-operations).
_J_CAP = 8192
# Budgets for the layered DP over limited slow levels (array cells, element-operations).
_CELL_BUDGET = 4_000_000
_WORK_BUDGET = 300_000_000
_TOL = 1e-9


@dataclasses.dataclass(frozen=True)
class MultiLevel(OfflineSchedule):
    """Offline checkpointing across storage levels with slot counts and write/read costs.

    Level 0 is the fastest (e.g. device memory), later levels slower (host memory, disk); only
    the last level may be unlimited (``slots=None``). The total cost minimised is the one
    :class:`~retrograde.schedules.Stats` reports::

        plain * forward_cost + N * adjoint_cost + sum_k (writes_k * write_cost_k
                                                         + reads_k * read_cost_k)

    **Cost convention** (the one that reproduces Aupy et al.'s Disk-Revolve figures): ``u_0`` is
    at hand at the start and is not stored anywhere yet; the schedule stores it where the optimum
    says, paying that level's write cost like any other ``Store``. With memory only it goes to
    level 0 (slot 0, as in :class:`Revolve`); with a cheap enough disk it is written to disk (one
    ``w_d``) so that all level-0 slots are free for the segments. Restoring a state costs the read
    cost of the level it is restored from, also right after it was written; a one-step loop stores
    nothing.

    **Optimality.** Leading levels with level 0's costs are pooled into one set of fast slots
    (a slot is a slot). Proven-optimal cases (the dynamic programme equals the Disk-Revolve
    optimum; checked against an exhaustive DP over all recursive multi-level schedules, in which
    every segment start may go to any level or move to a faster one):

    * one pool with zero costs: Revolve (``t(N, s)`` plain evaluations);
    * a zero-cost pool plus one unlimited slow level (Disk-Revolve, Aupy et al. 2016), as long
      as no chain segment longer than 8192 steps could pay off (only when ``w + r`` is thousands
      of steps). Segment lengths are pruned with the bound that Revolve(h, s) reads its start slot
      at most ``r(h, s)`` times (checked by the tests).

    Otherwise (nonzero level-0 costs, a limited slow level, three or more distinct levels):

    * small instances (``V P N^2 / 2 <= 4e7`` for ``V`` levels and ``P`` vectors of free slots on
      the limited levels: e.g. ``N <= 1000`` with 10 fast slots and an unlimited slow level, or
      ``N <= 570`` with two levels of 10 slots) are solved exactly by
      an exhaustive DP over all recursive schedules (every segment start stored on any level with
      a free slot, or moved to a faster level, every split point tried; H-Revolve's setting);
    * larger ones get the best of (a) the chain DP above with per-level slot counts (level-0
      segments use Revolve; limited levels try all segment lengths up to 64, then a 6% grid up
      to 8192) and (b) Stumm & Walther's multistage heuristic: Revolve with all limited slots,
      the most-read slots on the fastest levels (measured gaps to the exhaustive DP:
      ``docs/choosing-a-schedule.md``).

    Every schedule is valid, and the candidates include Revolve on level 0 alone, so the cost
    never exceeds ``Revolve(levels[0].slots)``'s cost under level 0's costs.

    **Generation cost.** ``O(N)`` memory for the tables; time ``O(N |C| + J^2)`` where ``J`` is the
    longest useful chain segment and ``C`` the candidate segment lengths; limited slow levels
    multiply by their (capped) slot counts. Solutions are cached
    per ``(schedule, N)``. Streaming the actions is ``O(N)`` per unit of recomputation, like
    :class:`Revolve`.

    Args:
        levels: the storage levels, fastest first (at least one).
        forward_cost: cost of one plain step (``> 0``), the unit of the levels' costs.
        adjoint_cost: cost of one recorded step (``>= 0``); does not change the schedule.

    Example (Aupy et al.'s example: ``N = 1001``, 10 memory slots, unlimited disk):
        >>> from retrograde.schedules import Level, MultiLevel, simulate
        >>> disk = MultiLevel([Level(10), Level(None, write_cost=2, read_cost=2)])
        >>> simulate(disk, 1001).cost, MultiLevel([Level(10)]).cost(1001)
        (3246.0, 4641.0)
    """

    levels: tuple[Level, ...] = ()
    forward_cost: float = 1.0
    adjoint_cost: float = 1.0

    def __post_init__(self):
        levels = self.levels
        if isinstance(levels, Level):
            raise TypeError(
                "MultiLevel(levels=...) takes a sequence of Level; wrap a single level in a "
                "list: MultiLevel([Level(10)])."
            )
        try:
            levels = tuple(levels)
        except TypeError:
            raise TypeError(
                f"MultiLevel(levels={levels!r}) must be a sequence of Level, fastest first."
            ) from None
        if not levels:
            raise ValueError(
                "MultiLevel(levels=()) needs at least one storage level, e.g. "
                "MultiLevel([Level(10), Level(None, write_cost=2, read_cost=2)])."
            )
        for i, lvl in enumerate(levels):
            if not isinstance(lvl, Level):
                raise TypeError(f"MultiLevel(levels=...)[{i}] must be a Level, got {lvl!r}.")
            if lvl.slots is None and i != len(levels) - 1:
                raise ValueError(
                    f"MultiLevel(levels=...)[{i}] is unlimited (slots=None) but is not the last "
                    "level; only the last (slowest) level may be unlimited. Give it a slot count "
                    "or move it to the end."
                )
        object.__setattr__(self, "levels", levels)
        for name, lo, strict in (("forward_cost", 0.0, True), ("adjoint_cost", 0.0, False)):
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            ok = ok and math.isfinite(value) and (value > lo if strict else value >= lo)
            if not ok:
                bound = "> 0" if strict else ">= 0"
                raise ValueError(f"MultiLevel({name}={value!r}) must be a finite number {bound}.")

    def cost(self, n_steps: int) -> float:
        """The total cost of the schedule for ``n_steps`` steps: what ``simulate(self, n_steps)``
        reports as ``total_cost(forward_cost, adjoint_cost)``."""
        n_steps = check_steps(n_steps)
        return _solve(self.levels, float(self.forward_cost), n_steps).cost + (
            n_steps * self.adjoint_cost
        )

    def actions(self, n_steps: int) -> Iterator[Action]:
        n_steps = check_steps(n_steps)
        if n_steps:
            sol = _solve(self.levels, float(self.forward_cost), n_steps)
            if sol.exact is not None:
                yield from _emit_exact(sol, n_steps)
            elif sol.slot_map is not None:
                yield from _emit_multistage(sol, n_steps)
            else:
                yield from _emit_chain(sol, n_steps)
        yield End()


# ----------------------------------------------------------------------------------- solving


@dataclasses.dataclass
class _Solution:
    cost: float  # plain * forward_cost + transfers (recorded steps excluded)
    s0: int
    chain: list  # [(segment length, level)] in forward order
    one_d: dict  # level -> choice table of B_level (0: copy to level 0, j: split at j)
    slot_map: list | None = None  # multistage: Revolve slot -> (level, slot)
    snapshots: int = 0  # multistage: Revolve's slot count
    pool_map: list | None = None  # pooled fast slot -> (level, slot) when leading levels are merged
    front: int = 1  # levels pooled into the first (virtual) level
    exact: tuple | None = None  # tables of the exhaustive DP


def _revolve_stores(n_max: int, s0: int) -> np.ndarray:
    """Stores (after the first) that :func:`_mem` emits for ``n = 0..n_max`` steps.

    Revolve's ``reverse_segment(n, s)`` stores ``W_s(n) = 1 + W_{s-1}(n - j) + W_s(j)`` states
    (``j`` its split; ``W_1 = 0``; ``W_s(n) = n - 1`` when ``s >= n``), ``P_s(n)`` of them
    (splits with ``n - j = 1``) right before recording them; :func:`_mem` drops those, so this is
    ``W - P``. In the band ``beta(s, r-1) < n <= beta(s, r)`` the split is
    ``j = max(1, beta(s, r-2), n - beta(s-1, r))``, which lies in an earlier band, so each band is
    one vectorised step: ``O(s0 log n_max)`` numpy operations.
    """
    steps = np.arange(n_max + 1)
    w_below = np.zeros(n_max + 1, dtype=np.int64)  # s = 1: no stores
    p_below = np.zeros(n_max + 1, dtype=np.int64)
    for s in range(2, min(s0, n_max) + 1):
        w = np.maximum(steps - 1, 0)
        p = (steps >= 2).astype(np.int64)
        for r, lo, hi in bands(s, n_max):
            ns = np.arange(max(lo + 1, s + 1), min(hi, n_max) + 1)
            if not ns.size:
                continue
            q = r - 1
            beta_prev = beta(s, q - 1) if q else 0
            j = np.maximum(max(1, beta_prev), ns - beta(s - 1, q + 1))
            ok = j <= np.minimum(ns - 1, lo - 1)  # lo = beta(s, q)
            for i in np.flatnonzero(~ok):  # rare (n = beta(s, r)): the general search
                j[i] = revolve_split(int(ns[i]), s)[0]
            w[ns] = 1 + w_below[ns - j] + w[j]
            p[ns] = (ns - j == 1) + p_below[ns - j] + p[j]
        w_below, p_below = w, p
    return w_below - p_below


def _one_d(m_cost: np.ndarray, j_max: int, uf: float, rk: float) -> tuple[np.ndarray, np.ndarray]:
    """``B_k(n)`` for ``n <= j_max`` and its choices (0: copy the start to level 0)."""
    b = np.zeros(j_max + 1)
    choice = np.zeros(j_max + 1, dtype=np.int64)
    x = np.zeros(j_max + 1)  # x[j] = u_f j + r_k + B(j)
    if j_max >= 1:
        x[1] = uf + rk
    for n in range(2, j_max + 1):
        vals = x[1:n] + m_cost[n - 1 : 0 : -1]  # j = 1..n-1: x[j] + M(n - j)
        i = int(vals.argmin())
        if vals[i] < m_cost[n] - _TOL:
            b[n], choice[n] = vals[i], i + 1
        else:
            b[n] = m_cost[n]
        x[n] = uf * n + rk + b[n]
    return b, choice


@functools.lru_cache(maxsize=16)
def _solve(levels: tuple[Level, ...], uf: float, n: int) -> _Solution:
    lvl0 = levels[0]
    w0, r0 = lvl0.write_cost, lvl0.read_cost
    # Leading levels with level 0's costs are one pool of fast slots (a slot is a slot).
    front = 1
    while front < len(levels) and (levels[front].write_cost, levels[front].read_cost) == (w0, r0):
        front += 1
    pool = [lvl.slots for lvl in levels[:front]]
    s0 = min(n if None in pool else sum(pool), max(n, 1))
    pool_map = None
    if front > 1:
        pool_map = [(k, i) for k in range(front) for i in range(min(pool[k] or s0, s0))][:s0]
    steps = np.arange(n + 1)
    t0, _ = optimum_table(n, s0)
    m_cost = uf * t0.astype(float) + r0 * np.maximum(steps - 1, 0)
    if w0:
        m_cost += w0 * (1 + _revolve_stores(n, s0))
    m_cost[:2] = 0.0
    if front == len(levels) or n <= 1:
        return _Solution(float(m_cost[n]), s0, [], {}, pool_map=pool_map)

    # Candidate segment lengths and 1-D tables for each slow level.
    t1, rep1 = optimum_table(n, s0 + 1)
    lb = uf * t1.astype(float)
    ub = m_cost.copy()
    segs: dict[int, tuple[list, np.ndarray]] = {}
    one_d: dict[int, np.ndarray] = {}
    j_capped = False
    for k in range(front, len(levels)):
        wk, rk = levels[k].write_cost, levels[k].read_cost
        ubk = np.minimum(ub, lb + rk * rep1) if not (w0 or r0) else ub
        if levels[k].slots is None:
            # j is never worth a chain segment if splitting it in halves provably costs less
            # (B(j) >= u_f t(j, s0+1); B(h) <= M(h) and <= u_f t(h, s0+1) + r_k r(h, s0+1)).
            j = steps[2:n]
            prunable = lb[j] - ubk[j // 2] - ubk[j - j // 2] > wk + rk + _TOL
            keep = np.flatnonzero(~prunable)
            j_max = int(j[keep[-1]]) if keep.size else 1
        else:  # a limited level may need long segments: splitting them costs a slot
            j_max = n - 1
        if levels[k].slots is None and j_max > _J_CAP:
            j_capped = True
        j_max = max(1, min(j_max, _J_CAP, n - 1))
        b, choice = _one_d(m_cost, j_max, uf, rk)
        js = np.arange(2, j_max + 1)
        useless = b[js] - b[js // 2] - b[js - js // 2] > wk + rk + _TOL
        if levels[k].slots is not None:  # heuristic: all short lengths, then a 6% grid
            grid = np.unique(np.round(64 * 1.06 ** np.arange(120)).astype(np.int64))
            useless &= (js > 64) & ~np.isin(js, grid)
        cands = np.concatenate(([1], js[~useless])).astype(np.int64)
        segs[k] = (cands.tolist(), wk + rk + uf * cands + b[cands])
        one_d[k] = choice

    # Unlimited last level: sequential 1-D DP over the chain.
    top = len(levels) - 1
    u = m_cost.copy()
    u_choice = np.zeros(n + 1, dtype=np.int64)
    if levels[top].slots is None:
        cand, seg = segs[top]
        cj = np.asarray(cand, dtype=np.int64)
        for m in range(2, n + 1):
            p = bisect.bisect_left(cand, m)
            vals = seg[:p] + u[m - cj[:p]]
            i = int(vals.argmin())
            if vals[i] < u[m] - _TOL:
                u[m], u_choice[m] = vals[i], cj[i]

    # Limited slow levels: layered DP over how many chain slots each one holds.
    limited = [k for k in range(front, len(levels)) if levels[k].slots is not None]
    caps = [min(levels[k].slots, n - 1) for k in limited]

    def size(cs):
        cells = math.prod(c + 1 for c in cs)
        return cells * (n + 1), cells * sum(len(segs[k][0]) for k in limited) * (n + 1)

    while caps and (size(caps)[0] > _CELL_BUDGET or size(caps)[1] > _WORK_BUDGET):
        i = max(range(len(caps)), key=caps.__getitem__)
        caps[i] //= 2
    values: dict[tuple, np.ndarray] = {}
    codes: dict[tuple, np.ndarray] = {}
    zero = tuple(0 for _ in caps)
    values[zero] = u
    for vec in itertools.product(*(range(c + 1) for c in caps)):
        if vec == zero:
            continue
        a = u.copy()
        code = np.zeros(n + 1, dtype=np.int64)
        for idx, k in enumerate(limited):
            if not vec[idx]:
                continue
            pv = vec[:idx] + (vec[idx] - 1,) + vec[idx + 1 :]
            prev = values[pv]
            base = 1 + idx * (n + 1)
            better = prev < a - _TOL
            a[better], code[better] = prev[better], base
            cand, seg = segs[k]
            for jj, sg in zip(cand, seg.tolist()):
                if jj >= n:
                    break
                v = sg + prev[1 : n + 1 - jj]  # segment jj then prev(m - jj), m = jj+1..n
                tgt = a[jj + 1 :]
                better = v < tgt - _TOL
                if better.any():
                    tgt[better] = v[better]
                    code[jj + 1 :][better] = base + jj
        values[vec], codes[vec] = a, code

    vec, m = tuple(caps), n
    best = float(values[vec][m])
    chain: list[tuple[int, int]] = []
    while vec != zero and codes[vec][m]:
        c = int(codes[vec][m]) - 1
        idx, jj = divmod(c, n + 1)
        vec = vec[:idx] + (vec[idx] - 1,) + vec[idx + 1 :]
        if jj:
            chain.append((jj, limited[idx]))
            m -= jj
    while u_choice[m]:
        chain.append((int(u_choice[m]), top))
        m -= int(u_choice[m])
    sol = _Solution(best, s0, chain, one_d, pool_map=pool_map)

    if limited:
        ms = _multistage(levels, uf, n, s0)
        if ms is not None and ms.cost < sol.cost - _TOL:
            sol = ms
    proven = not (w0 or r0) and len(levels) - front == 1 and not limited and j_capped is False
    if not proven:
        vlevels = (Level(s0, w0, r0),) + levels[front:]
        ex = _exact(vlevels, uf, n)
        if ex is not None and ex.cost < sol.cost - _TOL:
            ex.pool_map, ex.front = pool_map, front
            sol = ex
    return sol


_EXACT_BUDGET = 40_000_000  # element-operations of the exhaustive DP


def _exact(vlevels: tuple[Level, ...], uf: float, n: int) -> _Solution | None:
    """Exhaustive DP over recursive schedules on any levels, when it is small enough.

    ``G(m, F, loc)``: reverse ``m`` steps whose start is at hand, held on level ``loc`` (or not
    stored yet: ``loc = None``), with ``F`` free slots per limited level. A stored start either
    moves to a faster level, or the schedule advances ``j`` steps, reverses the right part
    (``G(m - j, F, None)``), restores the start and reverses the left part (``G(j, F, loc)``).
    Work ``O(V P N^2)`` element-operations for ``V`` levels and ``P`` free-slot vectors.
    """
    nv = len(vlevels)
    limited = [k for k in range(nv) if vlevels[k].slots is not None]
    caps = {k: min(vlevels[k].slots, n) for k in limited}
    stride: dict[int, int] = {}
    size = 1
    for k in reversed(limited):
        stride[k] = size
        size *= caps[k] + 1
    if nv * size * n * n // 2 > _EXACT_BUDGET or size * (n + 1) > 2_000_000:
        return None
    idx = np.arange(size)
    free = {k: (idx // stride[k]) % (caps[k] + 1) for k in limited}
    w = [lvl.write_cost for lvl in vlevels]
    r = [lvl.read_cost for lvl in vlevels]
    g = [np.full((size, n + 1), np.inf) for _ in range(nv)]
    g_none = np.full((size, n + 1), np.inf)
    ch = [np.zeros((size, n + 1), dtype=np.int32) for _ in range(nv)]  # j > 0 split, -1-l move
    ch_none = np.zeros((size, n + 1), dtype=np.int8)
    for k in range(nv):
        g[k][:, 1] = 0.0
    g_none[:, 1] = 0.0
    jj = uf * np.arange(1, n)
    for m in range(2, n + 1):
        right = g_none[:, m - 1 : 0 : -1]  # j = 1..m-1 -> G(m - j, F, None)
        for loc in range(nv):
            vals = right + g[loc][:, 1:m] + jj[: m - 1] + r[loc]
            j = vals.argmin(axis=1)
            best = vals[idx, j]
            choice = (j + 1).astype(np.int32)
            for l2 in range(loc):
                ok = np.ones(size, dtype=bool)
                src = idx.copy()
                if l2 in stride:
                    ok &= free[l2] >= 1
                    src = src - stride[l2]
                if loc in stride:
                    ok &= free[loc] < caps[loc]
                    src = src + stride[loc]
                src = np.where(ok, src, 0)
                cand = np.where(ok, w[l2] + g[l2][src, m], np.inf)
                better = cand < best - _TOL
                best = np.where(better, cand, best)
                choice = np.where(better, -1 - l2, choice)
            g[loc][:, m], ch[loc][:, m] = best, choice
        best = np.full(size, np.inf)
        choice = np.zeros(size, dtype=np.int8)
        for loc in range(nv):
            if loc in stride:
                ok = free[loc] >= 1
                src = np.where(ok, idx - stride[loc], 0)
                cand = np.where(ok, w[loc] + g[loc][src, m], np.inf)
            else:
                cand = w[loc] + g[loc][:, m]
            better = cand < best - _TOL
            best = np.where(better, cand, best)
            choice = np.where(better, loc, choice)
        g_none[:, m], ch_none[:, m] = best, choice
    top = sum(caps[k] * stride[k] for k in limited)
    sol = _Solution(float(g_none[top, n]), 0, [], {})
    sol.exact = (ch, ch_none, stride, top, nv)
    return sol


def _multistage(levels: tuple[Level, ...], uf: float, n: int, s0: int) -> _Solution | None:
    """Revolve with every limited slot; most-read slots on the fastest levels."""
    caps = [lvl.slots for lvl in levels if lvl.slots is not None]
    total = min(sum(caps), n)
    if total <= s0:
        return None
    use = _SlotUse(total).run(Revolve(total).actions(n))
    plain, reads, writes = use.plain, use.reads, use.writes
    order = sorted(range(total), key=lambda i: (-reads[i], -writes[i], i))
    slot_map: list = [None] * total
    cost = uf * plain
    used = [0] * len(levels)
    lvl = 0
    for i in order:
        while levels[lvl].slots is not None and used[lvl] >= levels[lvl].slots:
            lvl += 1
        slot_map[i] = (lvl, used[lvl])
        used[lvl] += 1
        cost += writes[i] * levels[lvl].write_cost + reads[i] * levels[lvl].read_cost
    return _Solution(cost, 0, [], {}, slot_map, total)


class _SlotUse(Executor):
    """Plain evaluations, and writes and reads per slot, of a stream on one level."""

    def __init__(self, slots: int):
        self.plain, self.writes, self.reads = 0, [0] * slots, [0] * slots

    def advance(self, action: Advance) -> None:
        self.plain += action.stop - action.start

    def store(self, action: Store) -> None:
        self.writes[action.slot] += 1

    def restore(self, action: Restore) -> None:
        self.reads[action.slot] += 1


# ----------------------------------------------------------------------------------- emission


def _mem(a: int, n: int, s0: int, pool_map: list | None = None) -> Iterator[Action]:
    """Reverse steps ``a .. a+n-1`` with ``u_a`` at hand, using level 0 only (Revolve).

    Revolve stores the last state of a segment right before recording it (``Store(m)``,
    ``Record(m)``, ``Free(m)``); that write is useless and is dropped here. Chains repeat the
    same segment lengths, so short segments are generated once and shifted.
    """
    if n == 1:
        yield Record(a)
        return
    rel = _mem_relative(n, min(s0, n)) if n <= _SEGMENT_CACHE_STEPS else _mem_stream(n, s0)
    if pool_map is None and not a:
        yield from rel
        return
    yield from relabel(rel, a, pool_map)


_SEGMENT_CACHE_STEPS = 2048


@functools.lru_cache(maxsize=64)
def _mem_relative(n: int, s: int) -> tuple[Action, ...]:
    return tuple(_mem_stream(n, s))


def _mem_stream(n: int, s0: int) -> Iterator[Action]:
    """:func:`_mem` for ``a = 0`` and ``n >= 2``, streamed from Revolve's
    :func:`~retrograde.schedules._revolve.reverse_segment`."""
    yield Store(0, 0, 0)
    pending = None  # a Store held back until we know whether a Record of that step follows
    dropped = None
    act: Any  # dispatched on type(act), which mypy does not narrow through `t`
    for act in reverse_segment(n, min(s0, n)):
        t = type(act)
        if pending is not None:
            if t is Record and act.step == pending.step:
                dropped, pending = pending, None
                yield act
                continue
            yield pending
            pending = None
        if t is Store:
            pending = act
        elif t is Free and dropped is not None and act[:2] == dropped[:2]:
            dropped = None
        else:
            yield act
    yield Free(0, 0, 0)


def _emit_chain(sol: _Solution, n: int) -> Iterator[Action]:
    held = []
    used: dict[int, int] = {}
    pos = 0
    for length, k in sol.chain:
        slot = used.get(k, 0)
        used[k] = slot + 1
        yield Store(pos, slot, k)
        yield Advance(pos, pos + length)
        held.append((pos, length, slot, k))
        pos += length
    yield from _mem(pos, n - pos, sol.s0, sol.pool_map)
    for a, length, slot, k in reversed(held):
        yield Restore(a, slot, k)
        choice = sol.one_d[k]
        while True:
            j = int(choice[length])
            if not j:
                yield from _mem(a, length, sol.s0, sol.pool_map)
                break
            yield Advance(a, a + j)
            yield from _mem(a + j, length - j, sol.s0, sol.pool_map)
            yield Restore(a, slot, k)
            length = j
        yield Free(a, slot, k)


def _emit_multistage(sol: _Solution, n: int) -> Iterator[Action]:
    """Revolve's actions (without ``End``), its slots spread over the levels by ``slot_map``."""
    revolve = itertools.chain(
        (Store(0, 0, 0),), reverse_segment(n, sol.snapshots), (Free(0, 0, 0),)
    )
    yield from relabel(revolve, 0, sol.slot_map)


def _emit_exact(sol: _Solution, n: int) -> Iterator[Action]:
    ch, ch_none, stride, top, nv = sol.exact

    def real(vl: int, slot: int) -> tuple[int, int]:
        if vl == 0:
            return sol.pool_map[slot] if sol.pool_map is not None else (0, slot)
        return sol.front + vl - 1, slot

    free_slots: list[list[int]] = [[] for _ in range(nv)]
    used = [0] * nv

    def take(vl: int) -> int:
        if free_slots[vl]:
            return free_slots[vl].pop()
        used[vl] += 1
        return used[vl] - 1

    # Tasks: ("seg", a, m, p, cell, at_hand) with cell = [level, slot] of the start or None;
    # ("free", a, cell).
    stack: list = [("seg", 0, n, top, None, True)]
    while stack:
        task = stack.pop()
        if task[0] == "free":
            _, a, cell = task
            lvl, slot = real(*cell)
            yield Free(a, slot, lvl)
            free_slots[cell[0]].append(cell[1])
            continue
        _, a, m, p, cell, at_hand = task
        while True:
            if m == 1:
                if not at_hand:
                    lvl, slot = real(*cell)
                    yield Restore(a, slot, lvl)
                yield Record(a)
                break
            if cell is None:
                vl = int(ch_none[p, m])
                cell = [vl, take(vl)]
                lvl, slot = real(*cell)
                yield Store(a, slot, lvl)
                stack.append(("free", a, cell))
                if vl in stride:
                    p -= stride[vl]
                continue
            if not at_hand:
                lvl, slot = real(*cell)
                yield Restore(a, slot, lvl)
                at_hand = True
            c = int(ch[cell[0]][p, m])
            if c < 0:  # move the start to a faster level
                l2 = -1 - c
                old = cell[:]
                cell[:] = [l2, take(l2)]
                lvl, slot = real(*cell)
                yield Store(a, slot, lvl)
                lvl, slot = real(*old)
                yield Free(a, slot, lvl)
                free_slots[old[0]].append(old[1])
                if l2 in stride:
                    p -= stride[l2]
                if old[0] in stride:
                    p += stride[old[0]]
                continue
            yield Advance(a, a + c)
            stack.append(("seg", a, c, p, cell, False))
            a, m, cell = a + c, m - c, None
