"""CheckpointAdjoint where diffrax's own test suite found it differing from
``RecursiveCheckpointAdjoint`` (issue #19; the suite itself runs with ``make compat``).

Values against ``RecursiveCheckpointAdjoint``, derivatives against ``DirectAdjoint`` (float64,
relative error <= 1e-10): events with a root finder, an SDE on a ``VirtualBrownianTree`` (a
Runge-Kutta and an SRK solver, gradient and ``jax.jvp``), ``SaveAt(dense=True)``, ``SubSaveAt``,
a progress meter under ``jax.grad``, ``vmap`` of ``SaveAt(ts=...)`` solves, ``max_steps=None``,
and the dtypes of ``Solution``. ``test_runtime_type_checking`` runs in a fresh interpreter with
diffrax imported under jaxtyping's import hook (beartype), x64,
``jax_numpy_rank_promotion="raise"`` and ``jax_numpy_dtype_promotion="strict"``: the configuration
diffrax's suite runs in.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import lineax as lx
import numpy as np
import optimistix as optx
import pytest

from ..loops._problems import FAST_COMPILE
from ._diffrax_problems import assert_close, checkpoint_adjoint

RCA = diffrax.RecursiveCheckpointAdjoint()
DIRECT = diffrax.DirectAdjoint()
TS = jnp.linspace(0.0, 1.0, 7)


def _decay(t, y, args):
    return -args * y + 0.3 * jnp.sin(3.0 * t)


@eqx.filter_jit
def _solve(y0, k, adjoint, saveat, solver=diffrax.Tsit5(), **kw):
    return diffrax.diffeqsolve(
        diffrax.ODETerm(_decay),
        solver,
        0.0,
        1.0,
        0.1,
        y0,
        args=k,
        saveat=saveat,
        adjoint=adjoint,
        max_steps=32,
        stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6),
        **kw,
    )


def _same_values(sol, ref):
    for x, r in zip(jtu.tree_leaves(sol), jtu.tree_leaves(ref)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(r), rtol=1e-12, atol=0)


def _grad_both(loss, *args):
    """``jax.grad(loss)`` with CheckpointAdjoint and with DirectAdjoint."""
    # The suite's fast-compile options for correctness tests (tests/loops/_problems.py), both sides.
    g = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2, compiler_options=FAST_COMPILE)
    return g(*args, checkpoint_adjoint()), g(*args, DIRECT)


def test_dense_and_subsaveat():
    """``SaveAt(dense=True)`` (the dense buffers are write-only buffers of the loop) and
    ``SubSaveAt`` with an ``fn``: values, ``Solution.evaluate`` and gradients."""
    y0, k = jnp.array([1.0, -0.5]), jnp.array(0.7)
    subs = diffrax.SaveAt(
        subs=[
            diffrax.SubSaveAt(ts=TS),
            diffrax.SubSaveAt(steps=True, fn=lambda t, y, a: jnp.sum(y**2)),
        ]
    )
    dense = diffrax.SaveAt(dense=True, t1=True)
    for saveat in (dense, subs):
        _same_values(_solve(y0, k, checkpoint_adjoint(), saveat).ys, _solve(y0, k, RCA, saveat).ys)
    ts = jnp.array([0.13, 0.5, 0.91])
    np.testing.assert_allclose(
        _solve(y0, k, checkpoint_adjoint(), dense).evaluate(ts[1]),
        _solve(y0, k, RCA, dense).evaluate(ts[1]),
        rtol=1e-12,
    )

    def loss(y0, k, adjoint):
        sol = _solve(y0, k, adjoint, dense)
        a, b = _solve(y0, k, adjoint, subs).ys
        b = jnp.where(jnp.isfinite(b), b, 0.0)  # steps=True pads with inf
        return jnp.sum(jax.vmap(sol.evaluate)(ts) ** 2) + jnp.sum(a**3) + jnp.sum(b)

    assert_close(*_grad_both(loss, y0, k))


def test_event_with_root_finder():
    """A terminating event located by a root finder: the event time and state, and their
    derivatives (implicit function theorem through the root find, as for diffrax's adjoints)."""
    event = diffrax.Event(
        lambda t, y, args, **kw: y[0] - 0.25, optx.Newton(1e-10, 1e-10, optx.rms_norm)
    )

    def run(y0, k, adjoint):
        return diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, a: jnp.stack([y[1], -a * y[0]])),
            diffrax.Tsit5(),
            0.0,
            jnp.inf,
            0.05,
            y0,
            args=k,
            event=event,
            adjoint=adjoint,
            max_steps=64,
            saveat=diffrax.SaveAt(t1=True, ts=TS),
        )

    y0, k = jnp.array([1.0, 0.0]), jnp.array(2.0)
    sol, ref = jax.jit(run, static_argnums=2)(y0, k, checkpoint_adjoint()), run(y0, k, RCA)
    assert sol.event_mask and ref.event_mask
    _same_values((sol.ts, sol.ys), (ref.ts, ref.ys))

    def loss(y0, k, adjoint):
        sol = run(y0, k, adjoint)
        return sol.ts[-1] + jnp.sum(jnp.where(jnp.isfinite(sol.ys), sol.ys, 0.0) ** 2)

    assert_close(*_grad_both(loss, y0, k))


def _sde_loss(solver):
    """``loss(y0, k, adjoint)`` of an SDE solve on a ``VirtualBrownianTree`` (recomputed steps
    redraw the same increments): multiplicative noise for a Runge-Kutta solver, additive noise
    and space-time Levy area for an SRK (ShARK)."""
    additive = isinstance(solver, diffrax.AbstractSRK)
    bm = diffrax.VirtualBrownianTree(
        0.0,
        1.0,
        1e-3,
        (2,),
        key=jr.PRNGKey(0),
        levy_area=diffrax.SpaceTimeLevyArea if additive else diffrax.BrownianIncrement,
    )
    diffusion = (
        (lambda t, y, a: lx.DiagonalLinearOperator(a[1] * jnp.ones(2)))
        if additive
        else (lambda t, y, a: lx.DiagonalLinearOperator(a[1] * y))
    )
    terms = diffrax.MultiTerm(
        diffrax.ODETerm(lambda t, y, a: -a[0] * y), diffrax.ControlTerm(diffusion, bm)
    )

    def loss(y0, k, adjoint):
        sol = diffrax.diffeqsolve(
            terms, solver, 0.0, 1.0, 0.05, y0, args=(k, 0.3 * k), adjoint=adjoint, max_steps=32
        )
        return jnp.sum(sol.ys**2)

    return loss


SDE_SOLVERS = pytest.mark.parametrize(
    "solver", [diffrax.Heun(), diffrax.ShARK()], ids=["heun", "shark"]
)


@SDE_SOLVERS
def test_sde_virtual_brownian_tree_jvp(solver):
    """``jax.jvp`` against DirectAdjoint with the solver's stages as a ``lax.scan`` (an SRK's
    ``"bounded"`` kind, DirectAdjoint's default, is a checkpointed loop, a ``custom_vjp`` that
    refuses forward mode; CheckpointAdjoint runs a ``lax.scan`` wherever the step is
    transformed)."""
    y0, k, dy = jnp.array([1.0, 2.0]), jnp.array(0.5), jnp.array([1.0, -1.0])
    jvp = lambda loss, adj: jax.jvp(lambda y: loss(y, k, adj), (y0,), (dy,))
    reference = _sde_loss(
        eqx.tree_at(lambda s: s.scan_kind, solver, "lax", is_leaf=lambda x: x is None)
    )
    assert_close(
        jax.jit(jvp, static_argnums=(0, 1))(_sde_loss(solver), checkpoint_adjoint()),
        jvp(reference, DIRECT),
    )


@SDE_SOLVERS
def test_sde_virtual_brownian_tree_grad(solver):
    """Gradient against DirectAdjoint. The step's time has no derivative (the Brownian tree
    refuses one), as in RecursiveCheckpointAdjoint's loop."""
    loss, y0, k = _sde_loss(solver), jnp.array([1.0, 2.0]), jnp.array(0.5)
    assert_close(*_grad_both(loss, y0, k))


def test_progress_meter_under_grad(capfd):
    """A progress meter's state has no derivative (diffrax's meters use ``unvmap_max``, which
    has no JVP rule); the meter prints the forward solve's progress once."""

    def loss(y0, k, adjoint):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(_decay),
            diffrax.Dopri5(),
            0.0,
            1.0,
            0.1,
            y0,
            args=k,
            adjoint=adjoint,
            max_steps=16,
            progress_meter=diffrax.TextProgressMeter(),
        )
        return jnp.sum(sol.ys**2)

    capfd.readouterr()
    y0, k = jnp.array([1.0, 2.0]), jnp.array(0.5)
    assert_close(
        jax.grad(loss, argnums=(0, 1))(y0, k, checkpoint_adjoint()),
        jax.grad(loss, argnums=(0, 1))(y0, k, DIRECT),
    )
    jax.effects_barrier()
    expected = "".join(f"{p:.2f}%\n" for p in np.linspace(0, 100, 11))
    assert capfd.readouterr().out == 2 * expected  # once per solve, the forward pass only


def test_vmap_saveat_ts():
    """A batch of solves, each element stopping at its own time (a batched predicate)."""
    y0 = jnp.array([[1.0, -0.5], [0.3, 0.2], [-1.0, 2.0]])
    k = jnp.array([0.7, 1.5, 3.0])
    run = lambda adj: jax.vmap(lambda y, k: _solve(y, k, adj, diffrax.SaveAt(ts=TS)).ys)(y0, k)
    _same_values(run(checkpoint_adjoint()), run(RCA))


def test_max_steps_none():
    """No step cap: differentiable (RecursiveCheckpointAdjoint is not), the same gradient as
    with a cap."""

    def loss(y0, k, adjoint, max_steps):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(_decay),
            diffrax.Tsit5(),
            0.0,
            1.0,
            0.1,
            y0,
            args=k,
            adjoint=adjoint,
            max_steps=max_steps,
        )
        return jnp.sum(sol.ys**2)

    y0, k = jnp.array([1.0, 2.0]), jnp.array(0.5)
    g = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=(2, 3))
    assert_close(g(y0, k, checkpoint_adjoint(), None), g(y0, k, DIRECT, 16))


def _leaf_types(tree):
    return [
        (jtu.keystr(p), x.dtype, getattr(x, "weak_type", None))
        for p, x in jtu.tree_leaves_with_path(tree)
        if hasattr(x, "dtype")
    ]


def test_solution_dtypes():
    """Every leaf of ``Solution`` has RecursiveCheckpointAdjoint's dtype and weak type (x64:
    diffrax's step counters are weak int64, which strict promotion lets meet int32)."""
    y0, k = jnp.array([1.0, -0.5]), jnp.array(0.7)
    for saveat in (diffrax.SaveAt(ts=TS), diffrax.SaveAt(dense=True, steps=True)):
        sol, ref = _solve(y0, k, checkpoint_adjoint(), saveat), _solve(y0, k, RCA, saveat)
        assert _leaf_types(sol) == _leaf_types(ref)


_STRICT = textwrap.dedent("""
    import jax
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_numpy_rank_promotion", "raise")
    jax.config.update("jax_numpy_dtype_promotion", "strict")
    from jaxtyping import install_import_hook
    with install_import_hook("diffrax", "beartype.beartype"):
        import diffrax
    import jax.numpy as jnp
    import numpy as np
    from retrograde.diffrax import CheckpointAdjoint

    ts = jnp.linspace(0.0, 1.0, 7)

    def solve(adjoint, saveat, y0=jnp.array([1.0, 0.5])):
        return diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, a: -a * y), diffrax.Tsit5(), 0.0, 1.0, 0.1, y0,
            args=0.7, saveat=saveat, adjoint=adjoint, max_steps=16,
            stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-5))

    subs = [diffrax.SubSaveAt(ts=ts), diffrax.SubSaveAt(t1=True, fn=lambda t, y, a: y[0])]
    for saveat in [diffrax.SaveAt(ts=ts), diffrax.SaveAt(steps=True), diffrax.SaveAt(subs=subs)]:
        out = solve(CheckpointAdjoint(), saveat).ys
        ref = solve(diffrax.RecursiveCheckpointAdjoint(), saveat).ys
        for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)):
            np.testing.assert_allclose(a, b, rtol=1e-12)
    print("ok")
""")


def _run_strict(script: str) -> None:
    import beartype  # noqa: F401  (the test extra installs it: the type checker diffrax uses)

    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


@pytest.mark.slow  # the default run's test_runtime_type_checking_derivatives runs this script too
def test_runtime_type_checking():
    """diffrax type-checked at runtime (its ``eqxi.MaybeBuffer`` annotations accept the
    write-only buffers) in diffrax's suite configuration: ``SaveAt(ts=...)``, ``steps=True``
    and ``SubSaveAt`` solves equal RecursiveCheckpointAdjoint's."""
    _run_strict(_STRICT)


def test_runtime_type_checking_derivatives():
    """The same configuration and the same solves (``_STRICT`` runs first), then a gradient,
    ``Solution.evaluate`` of dense output (weak step counters) and a ``jax.jvp``."""
    _run_strict(
        _STRICT.replace(
            'print("ok")',
            textwrap.dedent("""
        sol = solve(CheckpointAdjoint(), diffrax.SaveAt(dense=True))
        ref = solve(diffrax.RecursiveCheckpointAdjoint(), diffrax.SaveAt(dense=True))
        np.testing.assert_allclose(sol.evaluate(0.3), ref.evaluate(0.3), rtol=1e-12)
        loss = lambda adj: lambda y0: jnp.sum(solve(adj, diffrax.SaveAt(ts=ts), y0).ys ** 2)
        y0 = jnp.array([1.0, 0.5])
        np.testing.assert_allclose(jax.grad(loss(CheckpointAdjoint()))(y0),
                                   jax.grad(loss(diffrax.DirectAdjoint()))(y0), rtol=1e-10)
        jax.jvp(loss(CheckpointAdjoint()), (y0,), (y0,))
        print("ok")
    """),
        )
    )
