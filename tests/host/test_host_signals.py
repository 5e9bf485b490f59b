"""Nothing left behind: SIGTERM/SIGHUP during a disk run remove its directory and then take their
usual effect; a directory of a killed process (SIGKILL) is found and removed by
``remove_stale`` / ``retrograde clean``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import weakref

import numpy as np
import pytest

import retrograde.host as rh
from retrograde import schedules as rs
from retrograde.__main__ import main
from retrograde._store import _cleanup

from .. import _signals

# A child that starts a disk run and sleeps in step 5 (after printing READY).
CHILD = textwrap.dedent("""
    import signal, sys, time
    import numpy as np
    import retrograde.host as rh
    from retrograde import schedules as rs

    directory, handler = sys.argv[1], sys.argv[2]
    if handler == "exit3":
        signal.signal(signal.SIGTERM, lambda s, f: sys.exit(3))

    def fwd(n, u, a):
        if n == 5:
            print("READY", flush=True)
            time.sleep(120)
        return u * a

    step = rh.Step(fwd, lambda n, u, a, b: (b * a, float(np.sum(b * u))))
    loss = rh.Final(lambda n, u, a: float(np.sum(u)), grad=lambda n, u, a: (np.ones(3), 0.0))
    rh.value_and_grad(step, loss, np.ones(3), 1.1, 10, schedule=rs.StoreAll(),
                      storage=rh.Disk(directory))
""")


def _start_child(tmp_path, handler="default"):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    with _signals.defaults():
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path), handler],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    line = proc.stdout.readline()
    if line.strip() != "READY":
        proc.kill()
        raise AssertionError(f"child did not start: {line!r} {proc.stderr.read()[-2000:]}")
    (sub,) = list(tmp_path.iterdir())
    assert sub.name.startswith(f"retrograde-p{proc.pid}-")
    assert len(list(sub.glob("*.snap"))) == 6  # u_0 .. u_5
    return proc, sub


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_signal_removes_the_directory_then_takes_its_usual_effect(sig, tmp_path):
    signum = getattr(signal, sig)
    proc, _ = _start_child(tmp_path)
    proc.send_signal(signum)
    assert proc.wait(timeout=60) == -signum  # killed by the signal, as without retrograde
    assert list(tmp_path.iterdir()) == []


def test_signal_chains_to_a_python_handler(tmp_path):
    proc, _ = _start_child(tmp_path, "exit3")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 3  # the handler's sys.exit unwound the run, which cleaned up
    assert list(tmp_path.iterdir()) == []


def test_sigkill_leaves_a_directory_that_clean_removes(tmp_path, capsys):
    proc, sub = _start_child(tmp_path)
    proc.kill()
    proc.wait(timeout=60)
    assert sub.is_dir()  # SIGKILL cannot be caught
    owner = json.loads((sub / "owner").read_text())
    assert owner["pid"] == proc.pid
    # a directory of a running process, of another host, and one without an owner are kept
    with rh.forward(
        lambda n, u, a: u * a, np.ones(2), 1.0, 3, schedule=rs.StoreAll(), storage=rh.Disk(tmp_path)
    ) as fp:
        (live,) = [d for d in tmp_path.iterdir() if d != sub]
        other = tmp_path / "retrograde-p1-other"
        other.mkdir()
        (other / "owner").write_text(json.dumps({"host": "elsewhere", "pid": 1}))
        bare = tmp_path / "retrograde-bare"
        bare.mkdir()
        seen = {d.path: d.action for d in rh.remove_stale(tmp_path, dry_run=True)}
        assert seen == {
            str(sub): "stale",
            str(live): "running",
            str(other): "other host",
            str(bare): "no owner record",
        }
        assert sub.is_dir()
        assert main(["clean", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert f"removed        {sub}  (process {proc.pid}" in out
        assert not sub.exists() and live.is_dir() and other.is_dir() and bare.is_dir()
        fp.vjp(np.ones(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["retrograde-bare", "retrograde-p1-other"]


@_signals.defaults()
def test_handlers_installed_only_during_a_disk_run_and_restored(tmp_path):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    with rh.forward(lambda n, u, a: u * a, np.ones(2), 1.0, 3, schedule=rs.StoreAll()):
        assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]  # RAM only
    with rh.forward(
        lambda n, u, a: u * a, np.ones(2), 1.0, 3, schedule=rs.StoreAll(), storage=rh.Disk(tmp_path)
    ):
        assert signal.getsignal(signal.SIGTERM) is _cleanup.on_signal
        assert signal.getsignal(signal.SIGHUP) is _cleanup.on_signal
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_python_handler_that_returns_lets_the_run_go_on(tmp_path):
    """A handler that only notes the signal (graceful shutdown): the run keeps its snapshots."""
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))

    def fwd(n, u, a):
        if n == 3 and not seen:
            os.kill(os.getpid(), signal.SIGTERM)
        return u * a

    try:
        step = rh.Step(fwd, lambda n, u, a, b: (b * a, float(np.sum(b * u))))
        loss = rh.Final(lambda n, u, a: float(np.sum(u)), grad=lambda n, u, a: (np.ones(2), 0.0))
        J, _g = rh.value_and_grad(
            step, loss, np.ones(2), 1.1, 6, schedule=rs.Revolve(2), storage=rh.Disk(tmp_path)
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [signal.SIGTERM]
    assert J == pytest.approx(2 * 1.1**6)
    assert list(tmp_path.iterdir()) == []


def test_disk_run_in_a_thread(tmp_path):
    """Signal handlers can only be set from the main thread: a run in another thread works
    without them."""
    before = signal.getsignal(signal.SIGTERM)
    out = []

    def run():
        with rh.forward(
            lambda n, u, a: u * a,
            np.ones(2),
            1.0,
            3,
            schedule=rs.StoreAll(),
            storage=rh.Disk(tmp_path),
        ) as fp:
            out.append(signal.getsignal(signal.SIGTERM))
            out.append(fp.vjp(np.ones(2)))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert out[0] == before
    assert list(tmp_path.iterdir()) == []


def _fork(child):
    """Run ``child()`` in a forked process that ends with ``os._exit(0)``; its wait status."""
    pid = os.fork()
    if pid == 0:
        try:
            child()
        finally:
            os._exit(0)
    return os.waitpid(pid, 0)[1]


@pytest.mark.filterwarnings("ignore:.*fork.*:RuntimeWarning", "ignore::DeprecationWarning")
def test_a_forked_child_leaves_the_parents_snapshots_alone(tmp_path):
    """A child forked during a run (a multiprocessing worker, say) that is terminated, runs the
    exit hooks or closes the stores it inherited does not remove the parent's snapshots."""
    status = []

    def fwd(n, u, a):
        if n == 2 and not status:
            status.append(_fork(lambda: os.kill(os.getpid(), signal.SIGTERM)))
            status.append(_fork(weakref.finalize._exitfunc))  # what atexit runs
        return u * a

    step = rh.Step(fwd, lambda n, u, a, b: (b * a, float(np.sum(b * u))))
    loss = rh.Final(lambda n, u, a: float(np.sum(u)), grad=lambda n, u, a: (np.ones(2), 0.0))
    _J, g = rh.value_and_grad(
        step, loss, np.ones(2), 1.1, 6, schedule=rs.Revolve(2), storage=rh.Disk(tmp_path)
    )
    assert os.WIFSIGNALED(status[0]) and os.WTERMSIG(status[0]) == signal.SIGTERM
    assert os.WIFEXITED(status[1])
    assert g.params == pytest.approx(2 * 6 * 1.1**5)
    assert list(tmp_path.iterdir()) == []

    store = rh.Disk(tmp_path).open()
    snap = store.put(0, [np.arange(3.0)], None)
    assert os.WIFEXITED(_fork(store.close))
    np.testing.assert_array_equal(store.get(snap)[0], np.arange(3.0))
    store.close()
    assert list(tmp_path.iterdir()) == []
