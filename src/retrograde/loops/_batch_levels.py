"""Batching of the loop primitives: a batched primitive runs its unbatched program under
``jax.vmap``.

The batching rule of a loop primitive does not rewrite its body: it appends a :class:`BatchLevel`
(the vmap's size, axis name and the batch axis of every input and output) to the primitive's
``batch_levels`` parameter. The lowering applies the levels, innermost first, as ``jax.vmap`` of the
unbatched program (:func:`vmapped`). JAX then batches only what depends on a batched input,
through its own rules for the program's loops and conditionals: an unbatched closed-over weight
stays unbatched and a matrix-vector product with it becomes one matrix-matrix product, carry
leaves that never meet a batched value stay unbatched, and collectives over the vmap's axis name
(``lax.psum(x, "i")`` in a step) bind to it.

Differentiation rules see a batched primitive as ``vmap`` of an unbatched one: its JVP is the
``vmap`` of the unbatched JVP (:func:`jvp_rule`), its transpose the ``vmap`` of the unbatched
transpose, where the cotangent of an input that was not batched is summed over the batch
(:func:`transpose_rule`). Both peel the outermost level and recurse, so the unbatched rules are
the only rules written per primitive.

A primitive may sum some outputs over vmap axes inside its own program (its ``sums``
parameter, one tuple of axis names per output it can sum: :data:`summers`): such an output is
the ``lax.psum`` over those names of what the unbatched program computes, so it leaves the level
unbatched. The transpose rule asks for it where it would sum a cotangent over the batch after
the primitive (:func:`transpose_rule`): a reverse sweep then accumulates a parameter's
cotangent as one value, each step's VJP taken of the batched step so that it contracts over the
batch (:func:`summed_vjp`), as ``jax.lax.scan``'s batched transpose does, instead of one
accumulator per example summed at the end.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive

from .._jax_private import ad, batching, config, core, mlir
from ._body import Body
from ._slots import vary_as


@dataclasses.dataclass(frozen=True)
class BatchLevel:
    """One ``jax.vmap`` of a primitive's program.

    Attributes:
        size: the batch size.
        name: the vmap's axis name: the user's, or a private one (collectives of the program
            itself reduce over it, see :func:`names`).
        spmd_name: the ``spmd_axis_name`` of the user's vmap, if any.
        in_axes, out_axes: the batch axis of each input and output (``None``: not batched).
    """

    size: int
    name: Hashable
    spmd_name: Hashable | tuple | None
    in_axes: tuple[int | None, ...]
    out_axes: tuple[int | None, ...]


class _Private:
    """A private axis name for a vmap the user did not name."""

    _ids = itertools.count()

    def __init__(self):
        self.id = next(self._ids)

    def __repr__(self):
        return f"retrograde_batch_{self.id}"


def names(batch_levels: Sequence[BatchLevel]) -> tuple:
    """The axis names of the levels: a reduction over them makes a value unbatched."""
    return tuple(level.name for level in batch_levels)


def vmapped(fun: Callable, batch_levels: Sequence[BatchLevel]) -> Callable:
    """``fun`` (a function of the primitive's inputs returning the list of its outputs) under
    every level, innermost first."""
    for level in batch_levels:
        fun = jax.vmap(
            fun,
            in_axes=level.in_axes,
            out_axes=list(level.out_axes),
            axis_size=level.size,
            axis_name=level.name,
            spmd_axis_name=level.spmd_name,
        )
    return fun


def batched_avals(avals, batch_levels: Sequence[BatchLevel]) -> list:
    """The abstract values of a primitive's outputs: the unbatched ones with every level's batch
    axis inserted."""
    avals = list(avals)
    for level in batch_levels:
        avals = [
            a if d is None else _with_axis(a, d, level.size) for a, d in zip(avals, level.out_axes)
        ]
    return avals


def _with_axis(aval, d, size):
    shape = list(aval.shape)
    shape.insert(d, size)
    return aval.update(shape=tuple(shape))


def _without_axis(aval, d):
    if d is None:
        return aval
    shape = list(aval.shape)
    del shape[d]
    return aval.update(shape=tuple(shape))


def axis_data(level: BatchLevel):
    return batching.AxisData(level.name, level.size, level.spmd_name, None)


def batcher(prim, out_axes: Callable):
    """Register the batching rule of ``prim``: append a level. ``out_axes(axis_data, dims,
    **params)`` returns the batch axis (0 or ``None``) of each output."""

    def rule(data, args, dims, *, batch_levels, **params):
        if all(d is None for d in dims) and not _names_axis(params, data.name):
            # nothing of this vmap reaches the primitive
            outs = prim.bind(*args, batch_levels=batch_levels, **params)
            return outs, [None] * len(outs)
        name = data.name if data.name is not core.no_axis_name else _Private()
        data = batching.AxisData(name, data.size, data.spmd_name, None)
        outs = tuple(out_axes(data, dims, **params))
        level = BatchLevel(data.size, name, data.spmd_name, tuple(dims), outs)
        return prim.bind(*args, batch_levels=(*batch_levels, level), **params), list(outs)

    batching.fancy_primitive_batchers[prim] = rule


def _names_axis(params, name) -> bool:
    """Whether a program among ``params`` (a :class:`~._body.Body`'s step, second step or
    predicate, a jaxpr, and the loops and conditionals nested in them) names the vmap's axis
    ``name``, e.g. in ``lax.axis_index(name)`` or ``lax.psum(x, name)``: then the primitive is
    batched even when no input is, as ``jax.lax``'s loops are. Cost: one pass over the programs'
    equations."""
    if name is core.no_axis_name:
        return False
    if any(name in names for names in params.get("sums", ())):
        return True
    bodies = [v for v in params.values() if isinstance(v, Body)]
    programs = [p.jaxpr for b in bodies for p in (b.jaxpr, b.fast, b.guard) if p is not None]
    programs += core.jaxprs_in_params(params)
    for jaxpr in programs:
        for eqn in jaxpr.eqns:
            for key in ("axis_name", "axes"):
                named = eqn.params.get(key)
                if named is not None and name in (named if isinstance(named, tuple) else (named,)):
                    return True
            if _names_axis(eqn.params, name):
                return True
    return False


def _placeholder():
    """What a vmapped rule returns where the unbatched rule gives a symbolic zero or nothing."""
    return jnp.zeros((0,), jnp.float32)


def jvp_rule(unbatched: Callable):
    """The JVP rule of a primitive with ``batch_levels``: ``vmap`` of ``unbatched(primals, tangents,
    **params)`` (tangents may be ``ad.Zero``), peeling the outermost level."""

    def rule(primals, tangents, *, batch_levels, **params):
        if not batch_levels:
            return unbatched(primals, tangents, batch_levels=(), **params)
        level, inner = batch_levels[-1], batch_levels[:-1]
        nz = [type(t) is not ad.Zero for t in tangents]
        out_nz: list[bool] = []

        def f(primals, tangents_nz):
            it = iter(tangents_nz)
            ts = [
                next(it) if m else ad.Zero(core.typeof(p).to_tangent_aval())
                for m, p in zip(nz, primals)
            ]
            po, to = rule(primals, ts, batch_levels=inner, **params)
            out_nz[:] = [type(t) is not ad.Zero for t in to]
            return list(po), [_placeholder() if type(t) is ad.Zero else t for t in to]

        axes_in = list(level.in_axes)
        fun = jax.vmap(
            f,
            in_axes=(axes_in, [d for d, m in zip(axes_in, nz) if m]),
            out_axes=(list(level.out_axes), list(level.out_axes)),
            axis_size=level.size,
            axis_name=level.name,
            spmd_axis_name=level.spmd_name,
        )
        po, to = fun(list(primals), [t for t, m in zip(tangents, nz) if m])
        to = [
            t if m else ad.Zero(core.typeof(p).to_tangent_aval()) for t, m, p in zip(to, out_nz, po)
        ]
        return po, to

    return rule


# A primitive's rule that makes its program sum output ``k`` of ``eqn`` over the vmap axis
# ``name`` (an equation with the name added to its ``sums`` parameter), or ``None`` where it
# cannot. Registered by the primitives whose programs can (the reverse sweeps, for the
# cotangents of their consts).
summers: dict[Any, Callable[[Any, int, Hashable], Any]] = {}


def sum_over(x, names: Sequence[Hashable]):
    """``x`` summed over the vmap axes ``names`` (none: ``x``): one unbatched value.

    Bound without JAX's varying-axes check, as :func:`._slots.any_over` is (``names`` are vmap
    axes, which that check would look up among the mesh axes inside ``jax.shard_map``); the
    result gets ``x``'s varying mesh axes back."""
    if not names:
        return x
    with config._check_vma(False):
        out = lax.psum(x, tuple(names))
    return vary_as(out, core.typeof(x))


def summed_vjp(
    fun: Callable, primals: Sequence, others: Sequence, cts: Sequence, sums: Sequence, effects=()
) -> list:
    """The VJP of ``fun`` (a function of the arrays ``primals`` then ``others``, returning a list
    of arrays; it closes over no traced value) in ``primals``, at ``(primals, others)`` along
    ``cts``, the cotangent of ``primals[i]`` summed over the vmap axes ``sums[i]`` (as
    :func:`sum_over`). ``effects``: ``fun``'s.

    Under the ``vmap`` of one of those axes, the VJP is taken of the batched ``fun`` (its
    batching rule, :func:`_summed_vjp_batch`), as ``jax.lax.scan``'s batched transpose is: the
    cotangent of an unbatched input summed over the batch comes out of one product that
    contracts over the batch (``W @ h`` per element gives ``W``'s cotangent as one matrix
    product), not one product per element and then a sum over the batch, which XLA's CPU
    backend runs as a slow reduction over the major axis."""
    primals, others, cts = list(primals), list(others), list(cts)
    if not any(sums):
        _, pullback = jax.vjp(lambda *p: list(fun(*p, *others)), *primals)
        return list(pullback(cts))
    return summed_vjp_p.bind(
        *primals,
        *others,
        *cts,
        fun=fun,
        n=(len(primals), len(others)),
        sums=tuple(tuple(s) for s in sums),
        effects=frozenset(effects),
    )


def _summed_vjp(args, fun, n, sums, effects):
    """:func:`summed_vjp`, unbatched: the VJP, then each cotangent summed."""
    n_p, n_o = n
    others = args[n_p : n_p + n_o]
    _, pullback = jax.vjp(lambda *p: list(fun(*p, *others)), *args[:n_p])
    return [sum_over(g, s) for g, s in zip(pullback(list(args[n_p + n_o :])), sums)]


summed_vjp_p = Primitive("retrograde_summed_vjp")
summed_vjp_p.multiple_results = True
summed_vjp_p.def_impl(lambda *args, **params: _summed_vjp(args, **params))
summed_vjp_p.def_effectful_abstract_eval(
    lambda *avals, fun, n, sums, effects: (list(avals[: n[0]]), set(effects))
)
mlir.register_lowering(
    summed_vjp_p,
    mlir.lower_fun(lambda *args, **params: _summed_vjp(args, **params), multiple_results=True),
)


def _summed_vjp_batch(data, args, dims, *, fun, n, sums, effects):
    """Batch :func:`summed_vjp` over the vmap ``data``: the VJP of ``fun`` under ``vmap``, with
    the inputs summed over this axis that are not batched left unbatched (their cotangents come
    out summed over the batch) and every other differentiated input batched (its cotangent per
    element)."""
    n_p, n_o = n
    here = [data.name in s for s in sums]
    rest = [tuple(a for a in s if a != data.name) for s in sums]

    def batched(x, d):
        if d is None:
            return jnp.broadcast_to(x, (data.size, *jnp.shape(x)))
        return jnp.moveaxis(x, d, 0)

    shared = [d is None and h for d, h in zip(dims[:n_p], here)]
    primals = [x if sh else batched(x, d) for x, d, sh in zip(args[:n_p], dims[:n_p], shared)]
    others = args[n_p : n_p + n_o]
    cts = [batched(c, d) for c, d in zip(args[n_p + n_o :], dims[n_p + n_o :])]
    fun_b = jax.vmap(
        lambda *z: list(fun(*z)),
        in_axes=[None if sh else 0 for sh in shared] + list(dims[n_p : n_p + n_o]),
        out_axes=0,
        axis_size=data.size,
        axis_name=data.name,
        spmd_axis_name=data.spmd_name,
    )
    _, pullback = jax.vjp(lambda *p: fun_b(*p, *others), *primals)
    out = []
    for g, h, sh, r in zip(pullback(cts), here, shared, rest):
        if h and not sh:  # a batched input: its elements' cotangents, summed
            g = jnp.sum(g, axis=0)
        out.append(sum_over(g, r))
    return out, [None if h else 0 for h in here]


batching.fancy_primitive_batchers[summed_vjp_p] = _summed_vjp_batch


def _sum_in_place(jaxpr, summed: Sequence[bool], name) -> tuple[Any, list[bool]]:
    """``jaxpr`` with each output ``k`` where ``summed[k]`` summed over the vmap axis ``name`` by
    the primitive that computes it, where that primitive can (:data:`summers`) and nothing
    else reads the output. Returns the new jaxpr and which outputs it sums."""
    eqns = list(jaxpr.eqns)
    made = {v: i for i, e in enumerate(eqns) for v in e.outvars}
    reads = collections.Counter(
        v for e in eqns for v in e.invars if isinstance(v, core.Var)
    ) + collections.Counter(v for v in jaxpr.outvars if isinstance(v, core.Var))
    done = [False] * len(jaxpr.outvars)
    for k, (v, s) in enumerate(zip(jaxpr.outvars, summed)):
        if not s or not isinstance(v, core.Var) or v not in made or reads[v] != 1:
            continue
        i = made[v]
        rule = summers.get(eqns[i].primitive)
        new = rule(eqns[i], eqns[i].outvars.index(v), name) if rule is not None else None
        if new is not None:
            eqns[i], done[k] = new, True
    return jaxpr.replace(eqns=eqns), done


def transpose_rule(unbatched: Callable, output_sums: Callable | None = None):
    """The transpose rule of a primitive with ``batch_levels``: ``vmap`` of ``unbatched(cts, *args,
    **params)``, peeling the outermost level (``output_sums(params)``: the vmap axes its program
    sums each output over, if it can, see :data:`summers`); the cotangent of an output without a
    batch axis is shared out equally over the batch (or passed whole to each element, where the
    primitive's program sums that output over the level), and that of a linear input without
    one is summed.

    That sum is asked of the primitive computing the input's cotangent where it can make it
    (:data:`summers`; e.g. ``adj_p``'s consts cotangents): the unbatched rule is traced once,
    per element, and its equations rewritten to sum in their own programs, so a reverse sweep
    carries one unbatched cotangent of an unbatched parameter instead of one per element.
    Elsewhere the elements' cotangents are summed after the ``vmap``. Cost: one trace of the
    unbatched rule and one pass over its equations."""

    def rule(cts, *args, batch_levels, **params):
        if not batch_levels:
            return unbatched(cts, *args, batch_levels=(), **params)
        level, inner = batch_levels[-1], batch_levels[:-1]
        undef = [ad.is_undefined_primal(a) for a in args]
        in_avals = [
            _without_axis(a.aval, d) if u else None for a, u, d in zip(args, undef, level.in_axes)
        ]
        cts = list(cts)
        ct_nz = [type(c) is not ad.Zero for c in cts]
        out_avals = [
            _without_axis(c.aval, d) if not m else None
            for c, m, d in zip(cts, ct_nz, level.out_axes)
        ]
        got: list[bool] = []

        def f(defined, cts_nz):
            it_d, it_c = iter(defined), iter(cts_nz)
            full = [
                ad.UndefinedPrimal(aval) if u else next(it_d) for u, aval in zip(undef, in_avals)
            ]
            cts_full = [next(it_c) if m else ad.Zero(aval) for m, aval in zip(ct_nz, out_avals)]
            res = rule(cts_full, *full, batch_levels=inner, **params)
            res = [r for r, u in zip(res, undef) if u]
            got[:] = [r is not None and type(r) is not ad.Zero for r in res]
            return [r if g else _placeholder() for r, g in zip(res, got)]

        # An output without a batch axis is one value that every element computes alike (its
        # inputs are unbatched, or a collective over the axis made it so): its cotangent is
        # shared out equally, so that the elements' contributions add up to it once. One the
        # program sums over the axis (``sums``) is the sum of the elements' values: each gets
        # the cotangent whole.
        sums = output_sums(params) if output_sums is not None else [()] * len(cts)
        whole = [level.name in names for names in sums]
        shared = [
            c if d is not None or w else jnp.broadcast_to(c / level.size, (level.size, *c.shape))
            for c, d, m, w in zip(cts, level.out_axes, ct_nz, whole)
            if m
        ]
        ct_axes = [
            None if d is None and w else (0 if d is None else d)
            for d, m, w in zip(level.out_axes, ct_nz, whole)
            if m
        ]
        defined = [a for a, u in zip(args, undef) if not u]
        d_axes = [d for d, u in zip(level.in_axes, undef) if not u]
        u_axes = [d for d, u in zip(level.in_axes, undef) if u]
        closed = jax.make_jaxpr(f)(
            [_without_axis(core.typeof(a), d) for a, d in zip(defined, d_axes)],
            [_without_axis(core.typeof(c), d) for c, d in zip(shared, ct_axes)],
        )
        jaxpr, done = _sum_in_place(
            closed.jaxpr, [d is None and g for d, g in zip(u_axes, got)], level.name
        )
        fun = jax.vmap(
            lambda defined, cts_nz: core.eval_jaxpr(jaxpr, closed.consts, *defined, *cts_nz),
            in_axes=(d_axes, ct_axes),
            out_axes=[None if dn else 0 for dn in done],
            axis_size=level.size,
            axis_name=level.name,
            spmd_axis_name=level.spmd_name,
        )
        res = fun(defined, shared)
        out: list[Any] = []
        it = iter(zip(res, got, u_axes, done))
        for u in undef:
            if not u:
                out.append(None)
                continue
            r, g, d, dn = next(it)
            if not g:
                out.append(None)
            elif dn:
                out.append(r)
            elif d is None:
                out.append(jnp.sum(r, axis=0))
            else:
                out.append(jnp.moveaxis(r, 0, d))
        return out

    return rule
