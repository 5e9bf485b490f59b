"""The ``make compat`` machinery (``compat/``): the pytest plugin substitutes what it should and
only there, and ``docs/drop-in.md``'s exceptions table parses. (The suites themselves are not
run here: ``make compat``.)"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "compat"))

import run as compat_run  # noqa: E402

SUITE = textwrap.dedent("""
    import diffrax
    import jax
    import jax.numpy as jnp
    from jax import lax

    SCAN = lax.scan  # a module-level table, as in JAX's suite

    def test_scan():
        c, ys = SCAN(lambda c, x: (c + x, 2 * c), 0.0, jnp.arange(4.0))
        assert float(c) == 6.0 and ys.tolist() == [0.0, 0.0, 2.0, 6.0]
        assert lax.scan is SCAN

    def test_while_loop():
        assert int(lax.while_loop(lambda i: i < 5, lambda i: i + 1, 0)) == 5
        g = jax.grad(lambda x: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * x),
                                              (0, 1.0))[1])(2.0)
        assert float(g) == 12.0

    def test_fori_loop():
        assert float(lax.fori_loop(0, 3, lambda i, c: c + i, 0.0)) == 3.0

    def solve(**kw):
        return diffrax.diffeqsolve(diffrax.ODETerm(lambda t, y, a: -y), diffrax.Euler(), 0.0,
                                   1.0, 0.5, 1.0, max_steps=4, **kw).ys

    def test_default_adjoint():
        solve()
        solve(adjoint=diffrax.RecursiveCheckpointAdjoint(checkpoints=2))

    def test_other_adjoint():
        solve(adjoint=diffrax.DirectAdjoint())
""")


def _run_suite(tmp_path, substitute, schedule="default"):
    (tmp_path / "test_suite.py").write_text(SUITE)
    report = tmp_path / f"{substitute}.jsonl"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "compat"), str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "retrograde_compat",
            f"--retrograde-substitute={substitute}",
            f"--retrograde-schedule={schedule}",
            f"--retrograde-report={report}",
            "test_suite.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in report.read_text().splitlines()]
    return {
        r["nodeid"].split("::")[-1]: (r["outcome"], r["exercised"])
        for r in records
        if r["when"] == "call"
    }


@pytest.mark.parametrize(
    "substitute,schedule",
    [("scan", "revolve2"), ("while_loop", "online2"), ("fori_loop", "storeall")],
)
def test_lax_substitution(tmp_path, substitute, schedule):
    """``jax.lax.<loop>`` is retrograde's in the test module (module-level tables included) and
    only there: retrograde's own loops, which run ``lax.while_loop``, do not recurse. (The
    while loop's gradient fails with lax's own loop.)"""
    called = _run_suite(tmp_path, substitute, schedule)
    calls = 2 if substitute == "while_loop" else 1  # test_while_loop calls it twice
    assert called[f"test_{substitute}"] == ("passed", calls)
    assert called["test_default_adjoint"] == ("passed", 0)
    assert called["test_while_loop"][0] == ("passed" if substitute == "while_loop" else "failed")


def test_diffrax_substitution(tmp_path):
    """The default adjoint, and RecursiveCheckpointAdjoint, become CheckpointAdjoint; others
    stay."""
    called = _run_suite(tmp_path, "diffrax")
    assert called["test_default_adjoint"] == ("passed", 2)
    assert called["test_other_adjoint"] == ("passed", 0)
    assert called["test_scan"] == ("passed", 0)


def test_exceptions_table():
    """Every row of docs/drop-in.md's table has a run, a test pattern and a reason."""
    rows = compat_run.parse_exceptions()
    assert all(run and test and reason for run, test, reason in rows)
    assert (
        compat_run.listed_reason(
            [("jax/*", "*::testScan*", "why")],
            "jax/scan/default",
            "tests/x.py::T::testScanJaxpr[1]",
        )
        == "why"
    )
    assert (
        compat_run.listed_reason([("diffrax", "*::a", "why")], "jax/scan/default", "t::a") is None
    )


CRASHING = textwrap.dedent("""
    import os

    def test_before():
        pass

    def test_crash():
        os.abort()

    def test_after():
        pass
""")


def test_crash_is_recorded_and_the_file_resumed(tmp_path, monkeypatch):
    """A test that kills the pytest process is recorded as failed (naming the exit status), and
    the tests after it still run, in a new process."""
    (tmp_path / "test_crashing.py").write_text(CRASHING)
    run = compat_run.Run("jax", "scan", "default", tmp_path, ["test_crashing.py"])
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    compat_run.execute(run, argparse.Namespace(timeout=300, pytest_args=[]), tmp_path)
    calls = {r["nodeid"].split("::")[-1]: r for r in run.records if r["when"] == "call"}
    assert calls["test_before"]["outcome"] == "passed"
    assert calls["test_after"]["outcome"] == "passed"
    assert calls["test_crash"]["outcome"] == "failed"
    assert "crashed" in calls["test_crash"]["message"]
    assert run.returncode == 0  # the resumed process finished
