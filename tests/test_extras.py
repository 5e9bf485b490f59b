"""Optional dependencies: ``retrograde[diffrax]`` and ``retrograde[plot]`` say so when missing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_missing_diffrax_names_the_extra():
    out = _run("""
        import sys
        sys.modules["diffrax"] = None  # as if not installed
        try:
            import retrograde.diffrax
        except ImportError as e:
            print(e)
        """)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "pip install 'retrograde[diffrax]'" in out.stdout


def test_missing_matplotlib_names_the_extra():
    out = _run("""
        import sys
        sys.modules["matplotlib"] = None
        from retrograde.plot import plot_schedule
        from retrograde.schedules import Revolve
        try:
            plot_schedule(Revolve(2), 5, None)
        except ImportError as e:
            print(e)
        """)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "pip install 'retrograde[plot]'" in out.stdout


def test_core_imports_need_no_extra():
    """``retrograde``, its schedules, planner, command line, loops and host driver import without
    diffrax, equinox and matplotlib."""
    out = _run("""
        import sys
        for name in ("diffrax", "equinox", "matplotlib"):
            sys.modules[name] = None
        import retrograde, retrograde.planner, retrograde.plot, retrograde.__main__
        import retrograde.loops, retrograde.host
        print("ok")
        """)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
