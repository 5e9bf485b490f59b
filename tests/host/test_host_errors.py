"""Bad input gets an error naming the step, the callback and the leaf; a full disk names the
step and the file, and leaves nothing behind."""

from __future__ import annotations

import errno
import re

import numpy as np
import pytest

import retrograde.host as rh
from retrograde import schedules as rs
from retrograde.host import _storage

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
    with _raises(TypeError, "Step.vjp at step 5 returned None", "missing `return`",
                 "(state_bar, params_bar)"):
        _run(vjp=lambda n, u, a, b: None)
    with _raises(TypeError, "Step.vjp at step 5", "state_bar", "dtype float32"):
        _run(vjp=lambda n, u, a, b: (b.astype(np.float32), 0.0))
    # params_bar: structure, and shape of one leaf
    params = {"a": np.float64(1.5), "w": np.ones(3)}
    fwd = lambda n, u, p: _fwd(n, u, p["a"])  # noqa: E731
    with _raises(TypeError, "Step.vjp at step 5", "params_bar with the structure",
                 "structure of the params"):
        _run(forward=fwd, vjp=lambda n, u, p, b: (b, {"a": 0.0}), params=params)
    with _raises(ValueError, "Step.vjp at step 5", "params_bar leaf ['w'] of shape (2,)",
                 "params['w'] has shape (3,)"):
        _run(forward=fwd, vjp=lambda n, u, p, b: (b, {"a": 0.0, "w": np.ones(2)}),
             params=params)
    # plain zeros for leaves and subtrees stay allowed
    J, g = _run(forward=fwd, vjp=lambda n, u, p, b: (b, {"a": 0.0, "w": 0.0}), params=params)
    assert np.all(g.params["w"] == 0)


def test_loss_outputs_are_checked():
    with _raises(ValueError, "Final.grad at step 6", "state_bar of shape (3,)", "(4,)"):
        _run(loss=rh.Final(FINAL.f, grad=lambda n, u, a: (u[:3], 0.0)))
    with _raises(TypeError, "Running.grad at step 6", "(state_bar, params_bar)"):
        _run(loss=rh.Running(FINAL.f, grad=lambda n, u, a: u))
    with _raises(TypeError, "Final.f at step 6", "shape (4,)", "scalar"):
        _run(loss=rh.Final(lambda n, u, a: u, grad=FINAL.grad))
    s0, p = P.state0(), P.params0()
    bad = rh.Final(P.NP_FINAL.f, grad=lambda n, s, p: ({"u": s["u"], "memo": s["memo"][:2]},
                                                        0.0))
    with _raises(ValueError, f"Final.grad at step {N}", "state_bar leaf ['memo'] of shape (2,)",
                 "state['memo'] has shape (5,)"):
        rh.value_and_grad(P.NP_STEP, bad, s0, p, N, schedule=rs.Revolve(2))


def test_caller_arguments_are_checked():
    with rh.forward(rh.Step(_fwd, _vjp), np.ones(4), 1.5, N, schedule=rs.Revolve(2)) as fp:
        with _raises(ValueError, "vjp got state_bar of shape (3,)", "(4,)"):
            fp.vjp(np.ones(3))
        with _raises(TypeError, "vjp got state_bar", "dtype int64", "float64"):
            fp.vjp(np.ones(4, dtype=np.int64))
    with _raises(TypeError, "until at step 0", "shape (4,)", "bool"):
        rh.value_and_grad(rh.Step(_fwd, _vjp), FINAL, np.ones(4), 1.5, None,
                          schedule=rs.Online(3), until=lambda n, u: u > 0)
    with _raises(ValueError, "Step.jvp at step 0", "next_state_dot of shape (2,)"):
        rh.jvp(rh.Step(_fwd, _vjp, jvp=lambda n, u, a, ud, ad: (_fwd(n, u, a), ud[:2])),
               np.ones(4), 1.5, 3)
    with _raises(ValueError, "jvp got params_dot leaf ['a'] of shape (2,)", "params['a']"):
        rh.jvp(P.jax_step, P.state0(), P.params0(), 3,
               params_dot={"a": np.ones(2), "c": 0.0})


def test_jax_step_outputs_are_checked():
    import jax.numpy as jnp

    with _raises(ValueError, "the JAX step", "(forward) at step 0", "state of shape (2, 4)"):
        rh.value_and_grad(lambda n, u, a: jnp.stack([u, u]), rh.Final(lambda n, u, a: 0.0),
                          np.ones(4), 1.5, 3, schedule=rs.Revolve(2))


# ------------------------------------------------------------------ disk
def test_disk_full_names_the_step_and_the_file_and_cleans_up(tmp_path, monkeypatch):
    calls = []
    write = _storage._write_bytes

    def full(fh, a):
        calls.append(fh.name)
        if len(calls) == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(fh, a)

    monkeypatch.setattr(_storage, "_write_bytes", full)
    with pytest.raises(OSError) as info:
        rh.value_and_grad(P.NP_STEP, P.NP_LOSS, P.state0(), P.params0(), 12,
                          schedule=rs.StoreAll(), storage=rh.Disk(tmp_path))
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
