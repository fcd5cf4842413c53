"""SIGUSR1 end to end (issue 34): a farm's stop is not the next farm's; a master in a long C task acts at once."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from ..conftest import ROOT, run_bounded
from .test_cli import BIN

APPS = os.path.join(ROOT, "tests", "apps")


@pytest.mark.timeout(200)
def test_one_sigusr1_stops_one_farm_not_the_next_in_the_same_script(tmp_path, mpi_env):
    cmd = [os.path.join(BIN, "nlevel-mpiexec"), "-n", "3", sys.executable, os.path.join(APPS, "two_farms.py"),
           str(tmp_path)]
    proc = run_bounded(cmd, 150, cwd=tmp_path, env=mpi_env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("farm ")]
    assert len(lines) == 2, proc.stdout + proc.stderr[-3000:]
    assert lines[0].endswith("stopped SIGUSR1") and "of 400" in lines[0] and "committed 400" not in lines[0], lines
    assert lines[1] == "farm 2: committed 100 of 100, stopped None", lines
    assert proc.returncode == 75, proc.stderr[-3000:]  # (the first farm has tasks left: resubmit, it resumes)


@pytest.mark.timeout(200)
def test_a_master_inside_a_long_c_task_stops_the_job_within_a_second(tmp_path, mpi_env):
    """Rank 0's first task runs 20 s in C (GIL released); SIGUSR1 comes 1 s into it. The others must
    stop getting tasks within about a second, not when the C task returns (before: 20 s later)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    cmd = [os.path.join(BIN, "nlevel-mpiexec"), "-n", "3", sys.executable, "-m", "nlevel.run",
           os.path.join(APPS, "c_task_app.py"), "--n", "5000", "--sleep-ms", "20", "--c-seconds", "20",
           "--levels", "2", "--checkpoint", "run.h5", "--report", "r.json", "--quiet"]
    result: dict[str, object] = {}

    def job() -> None:
        try:
            result["proc"] = run_bounded(cmd, 150, cwd=tmp_path, env={**mpi_env, "NLEVEL_TEST_LOG_DIR": str(logs)})
        except BaseException as exc:
            result["error"] = exc

    runner = threading.Thread(target=job, daemon=True)
    runner.start()
    started = logs / "c-task-started"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not started.exists() and runner.is_alive():
        time.sleep(0.05)
    assert started.exists(), result
    time.sleep(1.0)
    sent = time.time()
    for pid in _ranks_of(tmp_path):
        os.kill(pid, signal.SIGUSR1)  # (as mpiexec forwards a batch system's warning: to every rank)
    runner.join(160)
    assert "error" not in result, result.get("error")
    proc = result["proc"]
    assert proc.returncode == 75, proc.stderr[-3000:]
    ended = float((logs / "c-task-ended").read_text())
    assert ended - sent > 10, "the C task ended too soon to tell"
    starts = [float(line.split()[1]) for p in logs.glob("starts-*.log") for line in p.read_text().splitlines()]
    late = sorted(t - sent for t in starts if t > sent + 1.5)
    assert not late, f"{len(late)} tasks started after the stop, up to {late[-1]:.1f} s after SIGUSR1"


def _ranks_of(cwd) -> list[int]:
    """The job's rank processes: python processes started in ``cwd`` with OMPI_COMM_WORLD_RANK set."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/cwd") != str(cwd):
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if b"OMPI_COMM_WORLD_RANK=" in f.read():
                    out.append(int(name))
        except OSError:
            continue
    return out
