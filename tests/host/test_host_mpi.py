"""Distributed state under MPI: every rank follows the same schedule with its own snapshots.

Runs ``mpirun -n 2 python tests/host/mpi_heat.py``; skipped (with the reason) when mpi4py or an
``mpirun`` launcher is missing. Install with ``apt-get install -y openmpi-bin libopenmpi-dev`` and
``pip install -e '.[mpi]'``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("mpi_heat.py")


def _launcher():
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip(
            "mpi4py is not installed (pip install -e '.[mpi]' after installing an MPI, "
            "e.g. apt-get install -y openmpi-bin libopenmpi-dev)"
        )
    exe = shutil.which("mpirun") or shutil.which("mpiexec")
    if exe is None:
        pytest.skip("no mpirun/mpiexec on PATH (apt-get install -y openmpi-bin libopenmpi-dev)")
    try:
        version = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"{exe} --version failed: {e}")
    args = [exe, "-n", "2"]
    if "Open MPI" in version or "OpenRTE" in version:
        args.append("--oversubscribe")  # CI machines may have fewer than 2 free cores
    return args


def test_two_ranks_same_schedule_own_snapshots(tmp_path):
    args = _launcher()
    env = dict(os.environ)
    # Open MPI refuses to run as root without these (CI runs as root); harmless otherwise.
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    env.setdefault("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe")
    proc = subprocess.run(
        [*args, sys.executable, str(SCRIPT), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "MPI OK 2" in proc.stdout, out[-4000:]
    assert list(tmp_path.iterdir()) == []  # every rank removed its directory
