"""The end of a job under ULFM: whom the master's last work keeps waiting.

The deputy's release waits for the master's last work only when some of it outlives the
master's process (a checkpoint's lock and status file, a report file): then the deputy still
watches the master, and finishes the job if it dies. Without a checkpoint the master's report
is in its own memory, and no rank waits for it (the master's is built when first read).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from ..conftest import ROOT, run_bounded
from .test_cli import BIN

SCRIPT = os.path.join(ROOT, "tests", "apps", "slow_report_script.py")


def times(tmp_path, env, checkpoint: str) -> tuple[dict[int, float], float]:
    """Each rank's return from its loop, and the end of the master's report (unix seconds)."""
    cmd = [os.path.join(BIN, "nlevel-mpiexec"), "--with-ft", "ulfm", "-n", "4", sys.executable, SCRIPT, checkpoint]
    try:
        proc = run_bounded(cmd, 120, cwd=tmp_path, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hung\n{exc.stderr}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stderr.replace("\0", "")
    returned = {int(r): float(t) for r, t in re.findall(r"RETURNED rank (\d+) at ([\d.]+)", out)}
    [reported] = [float(t) for t in re.findall(r"REPORTED at ([\d.]+)", out)]
    assert sorted(returned) == [0, 1, 2, 3], out[-3000:]
    return returned, reported


@pytest.mark.timeout(150)
def test_without_a_checkpoint_no_rank_waits_for_the_masters_report(tmp_path, mpi_env):
    """Not even the master: its report is built when the script first reads it."""
    returned, reported = times(tmp_path, mpi_env, "-")
    assert all(returned[r] < reported - 1.0 for r in (0, 1, 2, 3)), (returned, reported)


@pytest.mark.timeout(150)
def test_with_a_checkpoint_the_deputy_watches_the_master_until_its_report_is_done(tmp_path, mpi_env):
    returned, reported = times(tmp_path, mpi_env, str(tmp_path / "run.h5"))
    waited = [r for r in (1, 2, 3) if returned[r] >= reported]
    others = [r for r in (1, 2, 3) if returned[r] < reported - 1.0]
    assert len(waited) == 1 and len(others) == 2, (returned, reported)  # (the deputy alone)
