"""Issue 34: liveness is a heartbeat, not a task time, end to end.

A user's own ``get_task_id`` loop (tests/apps/heavy_tail.py) with tasks far longer than a lease,
4 ranks on 2 cores, default settings: nobody is killed, nothing is quarantined, every id runs
once. And the other side of the promise: a process that stops (SIGSTOP) is still found within
``--lease`` + 2 s.
"""

from __future__ import annotations

import os
import sys

import pytest

from ..conftest import ROOT
from .test_cli import BIN, completed_ids
from .test_ft_cli import run_and_collect

SCRIPT = os.path.join(ROOT, "tests", "apps", "heavy_tail.py")


def run_script(tmp_path, env, n, total, long, ft, timeout=150, extra_env=None):
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    launcher = [os.path.join(BIN, "nlevel-mpiexec"), *(["--with-ft", "ulfm"] if ft else []), "-n", str(n)]
    cmd = [*launcher, sys.executable, SCRIPT, str(total), "run.h5", "r.json", *(f"{k}:{v}" for k, v in long.items())]
    return run_and_collect(cmd, tmp_path, {**env, "NLEVEL_TEST_LOG_DIR": str(logs), **(extra_env or {})}, timeout,
                           "heavy_tail.py")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("ft", [False, True], ids=["no-ulfm", "ulfm"])
def test_tasks_far_longer_than_a_lease_kill_nobody(tmp_path, mpi_env, ft):
    """Tasks of 12 and 9 s (the default lease: 5 s) among 200 of 50 ms: the shape of a docking screen."""
    proc, report, runs = run_script(tmp_path, mpi_env, 4, 200, {30: 12.0, 150: 9.0}, ft)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "killed" not in proc.stderr and "hung" not in proc.stderr, proc.stderr[-3000:]
    assert report is not None and report["complete"] and not report["failed_tasks"], report
    assert not report["failures"] and not report["dead_ranks"], report["failures"]
    assert completed_ids(tmp_path / "run.h5") == set(range(200))
    assert sorted(runs) == list(range(200)) and set(runs.values()) == {1}, [i for i, k in runs.items() if k > 1]
    # the task times are per task: the tail is there (a per-range mean would have hidden it)
    tasks = report["tasks"]
    assert tasks["max"] >= 11_900 and tasks["p50"] < 100, tasks  # (ms)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("how", ["hang", "gil"], ids=["sigstop", "task-holds-the-gil"])
def test_a_process_that_stops_beating_is_killed_within_its_lease(tmp_path, mpi_env, how):
    """SIGSTOP, or a task that holds the GIL for ever (no thread of the process runs): found by the
    parent's lease (default 5 s) within the lease + 2 s, killed, and the job goes on (ULFM)."""
    from .test_ft_cli import run_job

    proc, report, runs = run_job(tmp_path, mpi_env, 4, ["--n", "300", "--how", how, "--die-rank", "2",
                                                         "--die-after", "15", "--levels", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["complete"] and report["dead_ranks"] == [2]
    [f] = report["failures"]
    assert f["how"] == "lease expired (hung)" and 5000 <= f["silent_ms"] <= 7000, f
    assert completed_ids(tmp_path / "run.h5") == set(range(300))


@pytest.mark.timeout(200)
def test_without_ulfm_a_stopped_process_ends_the_job_within_its_lease(tmp_path, mpi_env):
    import time

    from .test_ft_cli import run_job

    t0 = time.monotonic()
    proc, report, runs = run_job(tmp_path, mpi_env, 4, ["--n", "300", "--how", "hang", "--die-rank", "2",
                                                         "--die-after", "15", "--levels", "2"], ft=False)
    wall = time.monotonic() - t0
    assert proc.returncode != 0 and "rank 2 was silent for a lease" in proc.stderr, proc.stderr[-3000:]
    assert wall < 5 + 2 + 10, wall  # (the lease, its margin, and MPI's start and end on 2 cores)
