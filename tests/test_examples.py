"""The short examples in examples/ run to completion (each in its own process, in a temporary
directory so that pictures they write land there).

Slow: together they take a couple of minutes on 2 CPU cores (mostly XLA compilation).
``examples/demo.py`` (``make demo``) and the benchmarks are not run here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = [
    "scan_basics.py",
    "while_loop.py",
    "higher_order.py",
    "planner.py",
    "pyadjoint_heat.py",
    "sharded_heat.py",
]
TIMEOUT_S = 300


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_ENABLE_X64")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert proc.stdout.strip(), f"{name} printed nothing"


def test_examples_exist():
    for name in EXAMPLES + ["demo.py"]:
        assert (ROOT / "examples" / name).is_file(), name
