"""Two CPU processes joined by ``jax.distributed`` (loopback only), 2 devices each, one mesh over
the 4: gradients of ``retrograde.scan`` (``Revolve(4)``), of a ``CheckpointAdjoint`` diffrax solve
and of a scan with host and disk levels, over a state sharded across both processes, equal their
unbounded-memory references (``jax.lax.scan``, ``diffrax.DirectAdjoint``; float64, 1e-12).

Both processes run ``tests/distributed/two_processes.py`` (its docstring says what each
computes); they are started once for the module, killed if they outlive the timeout, and their
output is shown on any failure.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROCESSES = 2
DEVICES_PER_PROCESS = 2
TIMEOUT = 240  # seconds, for both processes together (about 20 s on two idle cores)
RTOL = 1e-12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = dict(os.environ)
    # Each process has its own devices (the test process's conftest.py forces 8).
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES_PER_PROCESS}"
    env["JAX_ENABLE_X64"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *sys.path])
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _run(procs, deadline):
    """Wait for every process; stop early when one fails (the others would wait for it)."""
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
            return
        time.sleep(0.2)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    disk = tmp_path_factory.mktemp("disk_level")
    logs = tmp_path_factory.mktemp("logs")
    port = _free_port()
    procs, files = [], []
    try:
        for i in range(PROCESSES):
            files.append(open(logs / f"process{i}.txt", "w+"))
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.distributed.two_processes"]
                    + [str(i), str(PROCESSES), str(port), str(disk)],
                    cwd=ROOT,
                    env=_env(),
                    stdout=files[i],
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        _run(procs, time.monotonic() + TIMEOUT)
    finally:
        for p in procs:  # only the processes this fixture started
            if p.poll() is None:
                p.kill()
            p.wait()
        outputs = []
        for f in files:
            f.seek(0)
            outputs.append(f.read())
            f.close()
    shown = "\n".join(
        f"--- process {i} (exit {p.returncode}):\n{outputs[i][-6000:]}" for i, p in enumerate(procs)
    )
    if any(p.returncode != 0 for p in procs):
        pytest.fail(f"a process failed (or was killed after {TIMEOUT} s):\n{shown}")
    parsed = []
    for out in outputs:
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert lines, f"no RESULT line:\n{shown}"
        parsed.append(json.loads(lines[-1][len("RESULT ") :]))
    assert list(disk.iterdir()) == [], "the disk level left files behind"
    return parsed, shown


def test_every_process_sees_the_global_mesh(results):
    parsed, shown = results
    for r in parsed:
        assert r["devices"] == [DEVICES_PER_PROCESS, PROCESSES * DEVICES_PER_PROCESS], shown


@pytest.mark.parametrize("what", ["scan", "diffrax", "offload"])
def test_gradient_matches_reference(results, what):
    parsed, shown = results
    for i, r in enumerate(parsed):
        err = r[what]["err"]
        assert err <= RTOL, f"process {i}, {what}: relative error {err:.2e} > {RTOL}\n{shown}"


def test_offloaded_snapshots_are_released(results):
    """Host and disk levels in a program partitioned by ``jax.jit``: JAX runs each host callback
    once, on device 0, with the global state (docs/distributed.md): process 0 makes
    every transfer, of the whole state, and every store is closed at the end."""
    parsed, shown = results
    writes = [r["offload"]["writes"] for r in parsed]
    assert writes[0].get("1", 0) > 0 and writes[0].get("2", 0) > 0, shown
    assert writes[1] == {}, shown
    stored = parsed[0]["offload"]["bytes_written"]
    from .two_processes import D

    assert stored["1"] == writes[0]["1"] * D * 8, shown  # the global state each time
    assert all(r["offload"]["open_stores"] == 0 for r in parsed), shown
