"""Bad input gets an error naming the step, the callback and the leaf; a full disk names the
step and the file, and leaves nothing behind."""

from __future__ import annotations

import errno
import os
import re

import numpy as np
import pytest

import retrograde.host as rh
from retrograde import schedules as rs
from retrograde._store import _files

from . import _host_problems as P

N = 6


def _fwd(n, u, a):
    return u + 0.1 * a * np.sin(u)


def _vjp(n, u, a, b):
    return b * (1 + 0.1 * a * np.cos(u)), np.sum(b * 0.1 * np.sin(u))


FINAL = rh.Final(lambda n, u, a: 0.5 * np.sum(u**2), grad=lambda n, u, a: (u, 0.0))


def _run(forward=_fwd, vjp=_vjp, loss=FINAL, u0=None, params=1.5, **kw):
    u0 = np.ones(4) if u0 is None else u0
    kw.setdefault("schedule", rs.Revolve(3))
    return rh.value_and_grad(rh.Step(forward, vjp), loss, u0, params, N, **kw)


def _raises(exc, *fragments):
    """pytest.raises matching every fragment, in order."""
    return pytest.raises(exc, match=".*".join(re.escape(f) for f in fragments))


def test_step_outputs_are_checked():
    with _raises(ValueError, "Step.forward at step 0", "state as the scalar", "(4,)"):
        _run(forward=lambda n, u, a: float(np.sum(u)))
    with _raises(TypeError, "Step.forward at step 0 returned None", "missing `return`"):
        _run(forward=lambda n, u, a: None)
    with _raises(TypeError, "Step.forward at step 2", "dtype float32", "float64"):
        _run(forward=lambda n, u, a: u.astype(np.float32) if n == 2 else u)
    with _raises(ValueError, "Step.vjp at step 5", "state_bar of shape (2, 4)", "(4,)"):
        _run(vjp=lambda n, u, a, b: (np.stack([b, b]), 0.0))
    with _raises(
        TypeError, "Step.vjp at step 5 returned None", "missing `return`", "(state_bar, params_bar)"
    ):
        _run(vjp=lambda n, u, a, b: None)
    with _raises(TypeError, "Step.vjp at step 5", "state_bar", "dtype float32"):
        _run(vjp=lambda n, u, a, b: (b.astype(np.float32), 0.0))
    # params_bar: structure, and shape of one leaf
    params = {"a": np.float64(1.5), "w": np.ones(3)}
    fwd = lambda n, u, p: _fwd(n, u, p["a"])
    with _raises(
        TypeError, "Step.vjp at step 5", "params_bar with the structure", "structure of the params"
    ):
        _run(forward=fwd, vjp=lambda n, u, p, b: (b, {"a": 0.0}), params=params)
    with _raises(
        ValueError,
        "Step.vjp at step 5",
        "params_bar leaf ['w'] of shape (2,)",
        "params['w'] has shape (3,)",
    ):
        _run(forward=fwd, vjp=lambda n, u, p, b: (b, {"a": 0.0, "w": np.ones(2)}), params=params)
    # plain zeros for leaves and subtrees stay allowed
    _J, g = _run(forward=fwd, vjp=lambda n, u, p, b: (b, {"a": 0.0, "w": 0.0}), params=params)
    assert np.all(g.params["w"] == 0)


def test_loss_outputs_are_checked():
    with _raises(ValueError, "Final.grad at step 6", "state_bar of shape (3,)", "(4,)"):
        _run(loss=rh.Final(FINAL.f, grad=lambda n, u, a: (u[:3], 0.0)))
    with _raises(TypeError, "Running.grad at step 6", "(state_bar, params_bar)"):
        _run(loss=rh.Running(FINAL.f, grad=lambda n, u, a: u))
    with _raises(TypeError, "Final.f at step 6", "shape (4,)", "scalar"):
        _run(loss=rh.Final(lambda n, u, a: u, grad=FINAL.grad))
    s0, p = P.state0(), P.params0()
    bad = rh.Final(P.NP_FINAL.f, grad=lambda n, s, p: ({"u": s["u"], "memo": s["memo"][:2]}, 0.0))
    with _raises(
        ValueError,
        f"Final.grad at step {N}",
        "state_bar leaf ['memo'] of shape (2,)",
        "state['memo'] has shape (5,)",
    ):
        rh.value_and_grad(P.NP_STEP, bad, s0, p, N, schedule=rs.Revolve(2))


def test_caller_arguments_are_checked():
    with rh.forward(rh.Step(_fwd, _vjp), np.ones(4), 1.5, N, schedule=rs.Revolve(2)) as fp:
        with _raises(ValueError, "vjp got state_bar of shape (3,)", "(4,)"):
            fp.vjp(np.ones(3))
        with _raises(TypeError, "vjp got state_bar", "dtype int64", "float64"):
            fp.vjp(np.ones(4, dtype=np.int64))
    with _raises(TypeError, "until at step 0", "shape (4,)", "bool"):
        rh.value_and_grad(
            rh.Step(_fwd, _vjp),
            FINAL,
            np.ones(4),
            1.5,
            None,
            schedule=rs.Online(3),
            until=lambda n, u: u > 0,
        )
    with _raises(ValueError, "Step.jvp at step 0", "next_state_dot of shape (2,)"):
        rh.jvp(
            rh.Step(_fwd, _vjp, jvp=lambda n, u, a, ud, ad: (_fwd(n, u, a), ud[:2])),
            np.ones(4),
            1.5,
            3,
        )
    with _raises(ValueError, "jvp got params_dot leaf ['a'] of shape (2,)", "params['a']"):
        rh.jvp(P.jax_step, P.state0(), P.params0(), 3, params_dot={"a": np.ones(2), "c": 0.0})


def test_jax_step_outputs_are_checked():
    import jax.numpy as jnp

    with _raises(ValueError, "the JAX step", "(forward) at step 0", "state of shape (2, 4)"):
        rh.value_and_grad(
            lambda n, u, a: jnp.stack([u, u]),
            rh.Final(lambda n, u, a: 0.0),
            np.ones(4),
            1.5,
            3,
            schedule=rs.Revolve(2),
        )


# ------------------------------------------------------------------ disk
def test_disk_full_names_the_step_and_the_file_and_cleans_up(tmp_path, monkeypatch):
    calls = []
    write = _files._write_array

    def full(fd, a, offset):
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))  # the file being written
        if len(calls) == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(fd, a, offset)

    monkeypatch.setattr(_files, "_write_array", full)
    with pytest.raises(OSError) as info:
        rh.value_and_grad(
            P.NP_STEP,
            P.NP_LOSS,
            P.state0(),
            P.params0(),
            12,
            schedule=rs.StoreAll(),
            storage=rh.Disk(tmp_path),
        )
    err = info.value
    assert err.errno == errno.ENOSPC
    assert "step 1" in str(err) and "disk is full" in str(err)
    assert err.filename == calls[-1] and err.filename.startswith(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_disk_directory_must_be_a_directory(tmp_path):
    f = tmp_path / "a_file"
    f.write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file, not a directory"):
        rh.Disk(f)
    with pytest.raises(NotADirectoryError, match="is a file"):
        rh.Disk(f / "below")
    rh.Disk(tmp_path / "new" / "deeper")  # created when a run starts


class _Stream(rs.OfflineSchedule):
    """An offline schedule that streams the given actions, on one level of two slots."""

    def __init__(self, *actions):
        self._actions = actions

    @property
    def levels(self):
        return (rs.Level(2),)

    def actions(self, n_steps):
        return iter(self._actions)


@pytest.mark.parametrize(
    "actions, fragment, steps, adjoints",
    [
        ((rs.Advance(1, 3),), "Advance(start=1, stop=3): the state at hand is 0, not 1", 0, 0),
        ((rs.Store(0, 2),), "level 0 has slots 0..1", 0, 0),
        ((rs.Store(0, 0), rs.Store(0, 0)), "slot 0 still holds state 0", 0, 0),
        ((rs.Advance(0, N + 1),), f"must satisfy start < stop <= {N}", 0, 0),
        # the first sweep ends at the first Record; the driver goes on to u_N (N steps in all)
        ((rs.Advance(0, N - 2), rs.Record(N - 2)), f"the next step to record is {N - 1}", N, 0),
        ((rs.Advance(0, N - 1), rs.Record(N - 1), rs.Record(N - 2)), "state at hand is None", N, 1),
        ((rs.Advance(0, N - 1), rs.Record(N - 1), rs.End()), f"End() before step {N - 2}", N, 1),
    ],
)
def test_the_simulator_checks_every_action_before_the_driver_runs_it(
    actions, fragment, steps, adjoints
):
    """The driver executes an action only once the simulator has: an invalid one raises
    ScheduleError with the simulator's message, and runs no step (nor adjoint)."""
    calls = {"forward": 0, "vjp": 0}

    def forward(n, u, a):
        calls["forward"] += 1
        return _fwd(n, u, a)

    def vjp(n, u, a, b):
        calls["vjp"] += 1
        return _vjp(n, u, a, b)

    with _raises(rs.ScheduleError, fragment):
        _run(forward=forward, vjp=vjp, schedule=_Stream(*actions))
    assert calls == {"forward": steps, "vjp": adjoints}
    with _raises(rs.ScheduleError, fragment):  # the simulator says the same of the stream
        rs.execute(actions, N, (rs.Level(2),))


class _OnlineStoringTooMuch(rs.OnlineSchedule):
    """Stores every state, on a level of two slots: the third store is invalid."""

    @property
    def levels(self):
        return (rs.Level(2),)

    class _Run(rs.OnlineRun):
        def on_step(self, n):
            return (rs.Store(n, n, 0),)

        def reverse(self, n_steps):
            return iter(())

    def start(self):
        return self._Run()


def test_online_forward_sweeps_are_checked_too():
    with _raises(rs.ScheduleError, "Store(step=2, slot=2, level=0): level 0 has slots 0..1"):
        _run(schedule=_OnlineStoringTooMuch())
    with _raises(rs.ScheduleError, "level 0 has slots 0..1"):
        rs.simulate(_OnlineStoringTooMuch(), N)
