"""The data of a step: the residuals its VJP keeps, split off the traced body.

Mixed checkpointing (``Linearize``/``Reverse``, :mod:`retrograde.schedules`) keeps, instead of a
state, the data one step's adjoint needs, and reverses the step from it with no forward
evaluation. In JAX that data is what ``jax.vjp`` keeps: :func:`linearization` splits the step
``(consts, carry, x) -> (carry, y)`` as ``jax.linearize`` and ``lax.scan``'s partial-evaluation
rule do, by partially evaluating its JVP with the primal inputs known and the tangents unknown:

- the *known* part ``(consts, carry, x) -> (carry, y, residuals)`` evaluates the step once and
  keeps the residuals (a callback in the step runs there, once);
- the *linear* part ``(residuals, tangents) -> tangent outputs`` is linear in the tangents; its
  transpose is the step's VJP from the residuals alone.

Each residual is one of: a const of the loop (read from the consts, never stored), a row of
``xs`` (read from ``xs``), loop-invariant (computed from the consts alone, once per sweep), or
*stored*: only these go into a data slot. :attr:`Linearization.data_bytes` is their size, and
:func:`data_size` that size relative to a state's (the snapshot leaves of the carry).

Traced unbatched, as the sweeps are (a batched loop runs its program under ``jax.vmap``).
"""

from __future__ import annotations

import math
import weakref
from typing import NamedTuple

import jax
from jax.extend import core as jex_core

from .._jax_private import ad, core, pe
from ._batch_levels import summed_vjp
from ._body import Body, cut, is_float
from ._slots import vary_as, zeros

Mask = tuple[bool, ...]

#: Where a residual comes from: a const, a row of xs, loop-invariant, or stored per step.
CONST, X, INVARIANT, STORED = "const", "x", "invariant", "stored"


class Source(NamedTuple):
    """Where a residual of the linear part is read from: ``kind``, and ``at``: the index of the
    const, ``x`` leaf, invariant or stored residual."""

    kind: str
    at: int


def nbytes(avals) -> int:
    """Bytes of arrays of these abstract values."""
    return sum(math.prod(a.shape) * a.dtype.itemsize for a in avals)


class Linearization:
    """A step split into its known part (the step and its residuals) and its linear part.

    ``dc``, ``dk``, ``dx``: which leaves of consts, carry and x are differentiated (float leaves
    only); cotangents come for those, and for every float carry and ``y`` output.

    Attributes:
        stored_avals: the abstract values of the stored residuals (one data slot holds one each).
        data_bytes: their size in bytes.
        sources: per residual of the linear part, where it is read from (:class:`Source`).
    """

    def __init__(self, step, nc: int, nk: int, nx: int, dc: Mask, dk: Mask, dx: Mask):
        self.nc, self.nk, self.nx = nc, nk, nx
        self.dc, self.dk, self.dx = dc, dk, dx
        out_avals = step.out_avals
        self.n_out = len(out_avals)
        self.float_out = [is_float(a) for a in out_avals]
        jvp, out_nz = ad.jvp_jaxpr(step, [*dc, *dk, *dx], instantiate=self.float_out)
        assert list(out_nz) == self.float_out, (out_nz, self.float_out)
        n_in, n_t = len(step.in_avals), sum(dc) + sum(dk) + sum(dx)
        known, linear, out_uk, _ = pe.partial_eval_jaxpr_nounits(
            jvp, [False] * n_in + [True] * n_t, [False] * self.n_out + [True] * sum(out_nz)
        )
        assert not any(out_uk[: self.n_out]), "a primal output depends on a tangent"
        self.known, self.linear = known, linear
        self.tangent_avals = linear.in_avals[len(linear.in_avals) - n_t :]
        self.sources, self.invariant, stored = _classify(known, nc, nk, self.n_out)
        self.stored_avals = [v.aval for v in stored]
        self.data_bytes = nbytes(self.stored_avals)
        self._run_known = jex_core.jaxpr_as_fun(known)
        self._run_linear = jex_core.jaxpr_as_fun(linear)
        self._run_invariant = jex_core.jaxpr_as_fun(self.invariant)
        self._stored_at = [i for i, s in enumerate(self.sources) if s.kind == STORED]
        self._first: dict[
            int, int
        ] = {}  # position of a stored residual's first occurrence (duplicates share)
        for i in self._stored_at:
            self._first.setdefault(self.sources[i].at, i)

    def work(self) -> Work:
        """What the step's roles compute, estimated from the jaxprs (:func:`jaxpr_work`):
        equations that only read the consts are not counted (computed once per sweep)."""
        jaxpr = self.known.jaxpr
        outs = jaxpr.outvars
        carry, res = outs[: self.nk], outs[self.n_out :]
        stored = [outs[self.n_out + i] for i in self._stored_at]
        varying = _varying(jaxpr, self.nc)
        transpose = jaxpr_work(self.linear.jaxpr)
        return Work(
            advance=jaxpr_work(jaxpr, carry, varying),
            record=jaxpr_work(jaxpr, res, varying) + transpose,
            linearize=jaxpr_work(jaxpr, [*carry, *stored], varying),
            transpose=transpose,
        )

    def invariants(self, consts) -> list:
        """The loop-invariant residuals (from the consts alone): computed once per sweep."""
        return list(self._run_invariant(*consts[: self.nc]))

    def linearize(self, consts, carry, x):
        """Evaluate the step keeping its data: ``(carry, y, stored)``, the stored residuals
        (one evaluation of the step)."""
        out = self._run_known(*consts, *carry, *x)
        new, res = out[: self.n_out], out[self.n_out :]
        stored = [res[self._first[j]] for j in range(len(self.stored_avals))]
        return list(new[: self.nk]), list(new[self.nk :]), stored

    def vjp(self, consts, x, invariants, stored, cotangents, sums=None):
        """The step's VJP from its data: ``cotangents`` over the float carry outputs, then the
        float ``y`` outputs; returns the cotangents of the differentiated consts, carry and x
        leaves ``(dc, dk, dx)`` (no evaluation of the step), each consts cotangent summed over
        the vmap axes ``sums[i]`` (as :func:`._batch_levels.summed_vjp`: under ``vmap``, one
        product contracting over the batch, not one per element and a sum)."""
        picks = {CONST: consts, X: x, INVARIANT: invariants, STORED: stored}
        res = [picks[s.kind][s.at] for s in self.sources]
        run, n_t = self._run_linear, len(self.tangent_avals)
        # The transpose as the VJP of the linear part at zero tangents, typed as the tangents
        # are (inside ``jax.shard_map``, their varying mesh axes: ``jax.linear_transpose`` takes
        # only shapes); the linear part's evaluation at zero is dead code. Cotangents are typed as
        # its outputs (a seed may vary over fewer mesh axes, e.g. a replicated one).
        outs = self.linear.out_avals
        n_c = sum(self.dc)
        sums = [()] * n_c if sums is None else list(sums)
        cts = summed_vjp(
            lambda *a: list(run(*a[n_t:], *a[:n_t])),
            zeros(self.tangent_avals),
            res,
            [vary_as(c, a) for c, a in zip(cotangents, outs)],
            [*sums, *[()] * (n_t - n_c)],
        )
        dc, dk, dx = cut(cts, [n_c, sum(self.dk), sum(self.dx)])
        return list(dc), list(dk), list(dx)


def _classify(known, nc: int, nk: int, n_out: int):
    """The residuals of the known part ``known`` (its outputs after the first ``n_out``): each
    one's :class:`Source`, the closed jaxpr ``consts -> invariant residuals`` and the stored
    residuals' variables (one per distinct variable)."""
    jaxpr = known.jaxpr
    invars = jaxpr.invars
    position = {v: i for i, v in enumerate(invars)}
    varies = _varying(jaxpr, nc)
    sources: list[Source] = []
    invariant: list = []
    stored: list = []
    for v in jaxpr.outvars[n_out:]:
        i = position.get(v) if isinstance(v, jex_core.Var) else None
        if i is not None and i < nc:
            sources.append(Source(CONST, i))
        elif i is not None and i >= nc + nk:
            sources.append(Source(X, i - nc - nk))
        elif i is None and not (isinstance(v, jex_core.Var) and v in varies):
            sources.append(Source(INVARIANT, len(invariant)))
            invariant.append(v)
        else:  # a carry input (the state's leaf) or computed from the state
            if v not in stored:
                stored.append(v)
            sources.append(Source(STORED, stored.index(v)))
    return sources, _slice(known, invariant, nc), stored


def _varying(jaxpr, nc: int) -> set:
    """Variables that change from step to step: the carry and x inputs (after the ``nc``
    consts), and whatever an equation computes from them or with an effect (a callback's result
    is never hoisted)."""
    varies = set(jaxpr.invars[nc:])
    for eqn in jaxpr.eqns:
        if eqn.effects or any(isinstance(v, jex_core.Var) and v in varies for v in eqn.invars):
            varies.update(eqn.outvars)
    return varies


class Work(NamedTuple):
    """Estimated work of one step in each role (:func:`jaxpr_work` units): ``advance`` (the
    next state only), ``record`` (the residuals, then the transpose: a recorded step's next
    state is dead code), ``linearize`` (the next state and the stored residuals) and
    ``transpose`` (the VJP from stored residuals)."""

    advance: float
    record: float
    linearize: float
    transpose: float


# Mixed is chosen by default only where its estimated work is at most this fraction of
# Revolve's: its data rows are written and read, and its leaves have more control.
MIXED_MARGIN = 0.85


def mixed_pays(work: Work, n: int, e_mixed: int, e_revolve: int) -> bool:
    """Whether a mixed schedule making ``e_mixed`` evaluations of ``n`` steps does less work than
    a state-only one making ``e_revolve``, the step's roles costing ``work``: the state-only
    schedule's ``(e_revolve - n) A + n R`` against at most ``(e_mixed - n) A + n (L + T)``
    (every reversed step linearized), within :data:`MIXED_MARGIN`. A recorded step computes only
    what its VJP needs, so fewer evaluations pay where the residuals cost about what the step
    does (an implicit solve), not where they are a small part of it."""
    ours = (e_mixed - n) * work.advance + n * (work.linearize + work.transpose)
    theirs = (e_revolve - n) * work.advance + n * work.record
    return e_mixed < e_revolve and ours <= MIXED_MARGIN * theirs


# Elementwise primitives that cost many arithmetic operations per element.
_TRANSCENDENTAL = frozenset(
    "sin cos tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh exp exp2 log log1p expm1 "
    "logistic pow erf erfc erf_inv lgamma digamma igamma igammac bessel_i0e bessel_i1e "
    "random_gamma_grad polygamma zeta".split()
)
TRANSCENDENTAL_WEIGHT = 10


def jaxpr_work(jaxpr, outvars=None, counted=None) -> float:
    """A static estimate of the arithmetic of ``jaxpr`` (a ``Jaxpr``) for ``outvars`` (all its
    outputs by default): the equations they need (dead code is not counted) and, with
    ``counted`` (a set of variables), only those whose outputs are in it. Per equation: the
    elements of its outputs, times :data:`TRANSCENDENTAL_WEIGHT` for transcendental functions,
    ``2 K`` for a ``dot_general`` contracting ``K`` elements per output; a ``scan`` counts its
    body ``length`` times, a ``while`` loop once (its trip count is unknown), a ``cond`` its
    largest branch, and a call (``pjit``, ``custom_jvp_call``, ...) what it calls."""
    if outvars is None:
        outvars = jaxpr.outvars
    needed = {v for v in outvars if isinstance(v, jex_core.Var)}
    total = 0.0
    for eqn in reversed(jaxpr.eqns):
        if not any(v in needed for v in eqn.outvars) and not eqn.effects:
            continue
        needed.update(v for v in eqn.invars if isinstance(v, jex_core.Var))
        if counted is not None and not any(v in counted for v in eqn.outvars):
            continue
        total += _eqn_work(eqn)
    return total


def _eqn_work(eqn) -> float:
    name, params = eqn.primitive.name, eqn.params
    size = sum(math.prod(getattr(v.aval, "shape", ())) for v in eqn.outvars)
    if name == "scan":
        return params["length"] * jaxpr_work(params["jaxpr"].jaxpr)
    if name == "while":
        return jaxpr_work(params["body_jaxpr"].jaxpr) + jaxpr_work(params["cond_jaxpr"].jaxpr)
    if name == "cond":
        return max(jaxpr_work(b.jaxpr) for b in params["branches"])
    inner = [p for p in params.values() if isinstance(p, (jex_core.Jaxpr, jex_core.ClosedJaxpr))]
    if inner:
        return sum(jaxpr_work(getattr(j, "jaxpr", j)) for j in inner)
    if name == "dot_general":
        (contract, _), _ = params["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        return 2.0 * size * math.prod(lhs[d] for d in contract)
    return size * (TRANSCENDENTAL_WEIGHT if name in _TRANSCENDENTAL else 1)


def _slice(known, outvars, nc: int):
    """The closed jaxpr ``consts -> outvars`` of the equations of ``known`` these need (none
    with an effect: :func:`_classify` counts their results as varying)."""
    jaxpr = known.jaxpr
    needed = {v for v in outvars if isinstance(v, jex_core.Var)}
    eqns = []
    for eqn in reversed(jaxpr.eqns):
        if any(v in needed for v in eqn.outvars):
            eqns.append(eqn)
            needed.update(v for v in eqn.invars if isinstance(v, jex_core.Var))
    sliced = jaxpr.replace(
        invars=jaxpr.invars[:nc], outvars=list(outvars), eqns=eqns[::-1], effects=core.no_effects
    )
    return jex_core.ClosedJaxpr(sliced, known.consts)


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def linearization(body: Body, dc: Mask, dk: Mask, dx: Mask, batched: bool = False):
    """The :class:`Linearization` of the step ``body`` executes (``body.executed``), for the
    leaves selected by the masks (memoised per body)."""
    per_body = _CACHE.setdefault(body, {})
    key = (dc, dk, dx, batched)
    if key not in per_body:
        per_body[key] = Linearization(body.executed(batched), body.nc, body.nk, body.nx, dc, dk, dx)
    return per_body[key]


def every_float(body: Body) -> tuple[Mask, Mask, Mask]:
    """Masks selecting every float leaf of consts, carry and x."""
    return tuple(  # type: ignore[return-value]
        tuple(is_float(a) for a in avals)
        for avals in (body.const_avals, body.carry_avals, body.x_avals)
    )


def data_size(body: Body, consts: bool = True) -> float:
    """The data of one step of ``body`` in states: the bytes of its stored residuals when every
    float leaf is differentiated (a first-order gradient; with ``consts=False``, every float
    leaf but the consts), over the bytes of a state (the carry leaves a snapshot holds).
    ``inf`` for a state of no bytes with some data."""
    dc, dk, dx = every_float(body)
    lin = linearization(body, dc if consts else (False,) * len(dc), dk, dx)
    state = nbytes(body.snapshot_avals)
    if state == 0:
        return 0.0 if lin.data_bytes == 0 else math.inf
    return lin.data_bytes / state


def whole_data_size(body: Body, slots: int) -> float | None:
    """:func:`data_size` rounded up to whole states (a data size the band rule plans), or
    ``None`` where the step keeps no data or more than ``slots`` states of it."""
    d = data_size(body)
    return float(math.ceil(d - 1e-9)) if 0 < d <= slots else None


def measure(f, init, x=None, consts: bool = False) -> float:
    """The data size (:func:`data_size`) of the step of ``retrograde.scan(f, init, xs)``, ``x``
    one row of ``xs``: ``f(carry, x) -> (carry, y)``, traced once (its closed-over arrays are
    its consts), for a gradient in the carry and ``xs``, and with ``consts=True`` in the
    closed-over arrays too (parameters): a step keeps more data for their cotangents."""
    closed = jax.make_jaxpr(f)(init, x)
    nk, nx = len(jax.tree_util.tree_leaves(init)), len(jax.tree_util.tree_leaves(x))
    jaxpr = pe.convert_constvars_jaxpr(closed.jaxpr)
    body = Body(jex_core.ClosedJaxpr(jaxpr, ()), len(closed.consts), nk, nx)
    return data_size(body, consts)
