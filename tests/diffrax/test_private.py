"""The private equinox/diffrax names ``retrograde.diffrax`` relies on (``_private.py``) are there,
and do what the adapter assumes, for the installed versions; a failure names the versions and
the range ``pyproject.toml`` pins."""

from __future__ import annotations

import diffrax
import equinox as eqx
import equinox.internal as eqxi
import jax.numpy as jnp
import pytest
from jaxtyping import Array, Float

from retrograde.diffrax import _private
from retrograde.diffrax._adjoint import _stage_kinds
from retrograde.diffrax._buffers import wrap

VERSIONS = f"equinox {eqx.__version__}, diffrax {diffrax.__version__}"
PINNED = "the equinox and diffrax ranges pinned in pyproject.toml"


def test_equinox_buffer_class():
    from equinox.internal._loop import common

    assert _private.Buffer is common._Buffer, f"{VERSIONS}: _Buffer moved; see {PINNED}"
    buf = common._Buffer(jnp.zeros(3), True, None, False)
    assert eqxi.buffer_at_set(buf, 1, 2.0).__class__ is common._Buffer, VERSIONS


def test_maybe_buffer_annotation_accepts_retrograde_buffers():
    """diffrax's ``eqxi.MaybeBuffer[...]`` fields, checked at runtime, accept a write-only buffer
    of the annotated shape and reject one of another dtype."""
    hint = eqxi.MaybeBuffer[Float[Array, " times"]]
    assert isinstance(wrap(jnp.zeros(4)), hint), f"{VERSIONS}: see {PINNED}"
    assert not isinstance(wrap(jnp.zeros(4, int)), hint)
    assert isinstance(jnp.zeros(4), hint)


class _Marker(Exception):
    pass


class _CaptureStep(diffrax.AbstractAdjoint):
    """An adjoint whose loop hands diffrax's step function, its initial state and the solver it
    closes over to ``check`` (inside the trace), then stops the solve."""

    check: object

    def loop(self, *, solver, throw, passed_solver_state, passed_controller_state, **kwargs):
        def outer(cond_fun, body_fun, init_val, **_):
            self.check(body_fun, init_val, solver)
            raise _Marker("done")

        return self._loop(**kwargs, solver=solver, inner_while_loop=None, outer_while_loop=outer)


class _RaisingSolver(diffrax.Tsit5):
    def step(self, *args, **kwargs):
        raise _Marker("the replaced solver")


def test_step_closes_over_the_solver():
    """``with_replaced`` finds the solver in diffrax's step closure: the rebuilt step calls the
    other solver (CheckpointAdjoint's first-order step is diffrax's step with the fast stage
    loops, built this way)."""

    def check(body, init, solver):
        rebuilt = _private.with_replaced(body, solver, _RaisingSolver())
        assert rebuilt is not None, f"{VERSIONS}: diffrax's step no longer closes over the solver"
        with pytest.raises(_Marker, match="replaced solver"):
            rebuilt(init)
        body(init)  # the original is untouched
        assert _private.with_replaced(body, object(), solver) is None

    with pytest.raises(_Marker, match="done"):
        diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, a: -y),
            diffrax.Tsit5(),
            0.0,
            1.0,
            0.1,
            jnp.ones(2),
            adjoint=_CaptureStep(check),
            max_steps=8,
        )


def test_stage_kinds():
    assert _stage_kinds(diffrax.Tsit5()) == ("bounded", "checkpointed")
    assert _stage_kinds(diffrax.ShARK()) == ("lax", "checkpointed")
    assert _stage_kinds(diffrax.Tsit5(scan_kind="lax")) is None
    assert _stage_kinds(diffrax.Euler()) is None
