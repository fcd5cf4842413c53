"""Runs the MPI tests (tests/mpi) under mpiexec with 1, 4 and 7 processes.

Each run is bounded: a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ..conftest import BIN, ROOT, run_bounded

SIZES = [1, 4, 7]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.timeout(600)
def test_mpi_suite(size, mpi_env):
    cmd = [
        os.path.join(BIN, "nlevel-mpiexec"), "-n", str(size),
        sys.executable, "-m", "pytest", "--with-mpi", "-q", "-p", "no:cacheprovider", "-x",
        os.path.join(ROOT, "tests", "mpi"),
    ]
    try:
        proc = run_bounded(cmd, 420, cwd=ROOT, env=mpi_env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"MPI tests on {size} processes hung (killed after 420 s):\n{exc.stdout}\n{exc.stderr}")
    assert proc.returncode == 0, f"MPI tests on {size} processes failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-4000:]}"
    assert " passed" in proc.stdout
