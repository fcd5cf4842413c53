"""Fault tolerance end to end: real processes, real signals, ``mpiexec --with-ft ulfm``.

The victim chooses its own death here (tests/apps/dying_app.py: sys.exit, an exception,
a segfault, MemoryError, SIGSTOP at its N-th task), so each case is deterministic; the
harness that kills from outside by role is tests/e2e/test_faults.py. Every case checks the
promise: every id committed exactly once (checkpoint), the exit status, and the report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter

import pytest

from ..conftest import ROOT, run_bounded
from .test_cli import BIN, completed_ids

APP = os.path.join(ROOT, "tests", "apps", "dying_app.py")
LOGGING_APP = os.path.join(ROOT, "tests", "apps", "logging_app.py")


def run_job(tmp_path, env, n, args, ft=True, timeout=150, app=APP):
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    launcher = [os.path.join(BIN, "nlevel-mpiexec"), *(["--with-ft", "ulfm"] if ft else []), "-n", str(n)]
    cmd = [*launcher, sys.executable, "-m", "nlevel.run", app, "--checkpoint", "run.h5", "--report", "r.json",
           "--quiet", *args]
    return run_and_collect(cmd, tmp_path, {**env, "NLEVEL_TEST_LOG_DIR": str(logs)}, timeout, " ".join(args))


def run_and_collect(cmd, tmp_path, env, timeout, what):
    """Run a job bounded (a hang fails the test); return (process, the report r.json or None, how
    often each id ran: the exec-* logs under $NLEVEL_TEST_LOG_DIR)."""
    logs = tmp_path / "logs"
    try:
        proc = run_bounded(cmd, timeout, cwd=tmp_path, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hung: {what}\n{exc.stderr}")
    report = json.loads((tmp_path / "r.json").read_text()) if (tmp_path / "r.json").exists() else None
    runs: Counter[int] = Counter()
    for name in os.listdir(logs):
        if name.startswith("exec-"):
            runs.update(int(x) for x in (logs / name).read_text().split())
    return proc, report, runs


@pytest.mark.timeout(200)
@pytest.mark.parametrize("how", ["exit", "raise", "segfault", "memory"])
def test_a_python_level_death_is_a_detected_failure_not_a_hang(tmp_path, mpi_env, how):
    proc, report, runs = run_job(tmp_path, mpi_env, 4, ["--n", "200", "--how", how, "--die-rank", "2",
                                                         "--die-after", "10", "--levels", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["complete"] and report["dead_ranks"] == [2]
    assert [f["rank"] for f in report["failures"]] == [2] and report["failures"][0]["role"] == "slave"
    assert completed_ids(tmp_path / "run.h5") == set(range(200))
    again = [i for i, k in runs.items() if k > 1]
    assert len(again) <= report["failures"][0]["held"], again  # only what the dead rank held ran twice


@pytest.mark.timeout(200)
@pytest.mark.parametrize("how", ["KILL", "STOP", "KILL-MID", "KILL-REPORT"])
def test_a_master_that_dies_after_releasing_the_job_is_reported_by_its_deputy(tmp_path, mpi_env, how):
    """Issue 14: the master's death between its release and its report file; the deputy writes the report.

    KILL-REPORT: the master's end was done and only the file was left to write (its deputy
    was released before the file was written, and nobody wrote one).
    """
    proc, report, runs = run_job(tmp_path, mpi_env, 4, ["--n", "200", "--levels", "2",
                                                         "--die-task", "-1", "--master-after-release", how])
    assert (tmp_path / "logs" / "master-released").exists()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report is not None, proc.stderr[-3000:]
    assert report["complete"] and report["committed"] == 200
    assert report["written_by"]["rank"] == 1, report.get("written_by")
    assert len(report["job"]) == 32  # (the job's id, every rank's: how a deputy tells this job's report)
    assert [f["rank"] for f in report["failures"]] == [0] and report["failures"][0]["role"] == "master"
    assert completed_ids(tmp_path / "run.h5") == set(range(200))
    assert max(runs.values()) == 1  # the job was over: nothing ran again


@pytest.mark.timeout(200)
@pytest.mark.parametrize("step,rank", [("options", 2), ("dup", 0), ("window", 3), ("window", 0), ("places", 5)])
def test_a_death_during_set_up_is_survived_not_a_hang(tmp_path, mpi_env, step, rank):
    """Issue 14: a rank SIGKILLed inside the first collectives; the others shrink and set up again."""
    proc, report, runs = run_job(tmp_path, mpi_env, 7, ["--n", "300", "--levels", "3", "--regions", "2",
                                                         "--die-rank", str(rank), "--die-in-setup", step])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["complete"] and report["committed"] == 300
    dead = [f["rank"] for f in report["failures"]]
    assert all(f["how"] == "died during set-up" for f in report["failures"]) and rank in dead, proc.stderr[-3000:]
    if dead != [rank]:
        # Open MPI itself crashed in another rank, in the Comm_dup of the set-up after the death
        # (a backtrace through PMPI_Comm_dup and ompi_comm_activate: CI at 6158852, then 1 in 60
        # runs by hand); survived the same way, and listed. Any other extra death fails here.
        assert "PMPI_Comm_dup" in proc.stderr and "End of error message" in proc.stderr, proc.stderr[-3000:]
    assert report["user_ranks"] == [r for r in range(7) if r not in dead]
    assert f"rank(s) {', '.join(map(str, dead))} of the job died while the farm was being set up" in proc.stderr
    assert completed_ids(tmp_path / "run.h5") == set(range(300))
    assert max(runs.values()) == 1  # nothing had run: nothing runs twice


@pytest.mark.timeout(200)
def test_a_death_while_the_roles_are_built_is_survived_not_a_hang(tmp_path, mpi_env):
    """Under ULFM a rank builds its roles while the agreement that closes the set-up goes round
    (``transport.Agreement``): a death then is a death during set-up (the agreement failed) or
    the run's first (it had passed); either way the job completes and nothing runs twice."""
    proc, report, runs = run_job(tmp_path, mpi_env, 7, ["--n", "300", "--levels", "3", "--regions", "2",
                                                         "--die-rank", "4", "--die-in-setup", "roles"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["complete"] and report["committed"] == 300
    assert [f["rank"] for f in report["failures"]] == [4], report["failures"]
    assert completed_ids(tmp_path / "run.h5") == set(range(300))
    assert max(runs.values()) == 1  # nothing had run on the dead rank: nothing runs twice


@pytest.mark.timeout(200)
def test_a_raising_task_is_retried_then_recorded_failed(tmp_path, mpi_env):
    proc, report, runs = run_job(tmp_path, mpi_env, 4, ["--n", "120", "--how", "raise", "--die-task", "50",
                                                         "--poison", "--on-task-error", "retry", "--task-retries", "2",
                                                         "--levels", "3", "--regions", "2"], ft=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert not report["complete"] and report["committed"] == 119
    [failed] = report["failed_tasks"]
    assert failed["id"] == 50 and failed["attempts"] == 3
    assert failed["error"] == "ValueError: task 50 is broken" and failed["rank"] >= 0 and failed["host"]  # (as data)
    assert runs[50] == 3


@pytest.mark.timeout(200)
def test_a_task_that_raises_once_succeeds_on_retry(tmp_path, mpi_env):
    proc, report, runs = run_job(tmp_path, mpi_env, 3, ["--n", "100", "--how", "raise", "--die-task", "30",
                                                         "--on-task-error", "retry"], ft=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["complete"] and report["failed_tasks"] == [] and runs[30] == 2


@pytest.mark.timeout(240)
@pytest.mark.parametrize("rank", [2, 0], ids=["slave", "master"])
def test_a_hung_process_is_killed_when_its_lease_expires(tmp_path, mpi_env, rank):
    """SIGSTOP: MPI sees nothing; the parent's lease (the deputy's, for the master) finds it."""
    proc, report, runs = run_job(tmp_path, mpi_env, 4, ["--n", "300", "--how", "hang", "--die-rank", str(rank),
                                                         "--die-after", "15", "--levels", "2", "--lease", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["complete"] and report["dead_ranks"] == [rank]
    assert completed_ids(tmp_path / "run.h5") == set(range(300))
    assert any(f"rank {rank} " in line and "silent for a lease" in line and line.endswith("killed it")
               for line in proc.stderr.splitlines()), proc.stderr[-3000:]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("ft,switch", [(True, False), (False, False), (False, True)],
                         ids=["ulfm", "no-ulfm", "no-ulfm-then-switch"])
def test_drain_takes_ranks_out_of_a_live_job(tmp_path, mpi_env, ft, switch):
    """``then-switch``: the job switches plans (``--levels auto``, forced at 60 %) after the drain: the
    new plan is laid out without the drained ranks (issue 14), on every rank. (Without ULFM: under it
    the drained ranks leave by exiting, a failure, after which the job keeps its plan.)"""
    logs = tmp_path / "logs"
    logs.mkdir()
    launcher = [os.path.join(BIN, "nlevel-mpiexec"), *(["--with-ft", "ulfm"] if ft else []), "-n", "6"]
    plan = ["--levels", "auto", "--force-replan", "0.6@3x2"] if switch else ["--levels", "3", "--regions", "2"]
    cmd = [*launcher, sys.executable, "-m", "nlevel.run", LOGGING_APP, "--n", "4000", "--sleep-ms", "10",
           *plan, "--checkpoint", "run.h5", "--report", "r.json", "--quiet"]
    job = subprocess.Popen(cmd, cwd=tmp_path, env={**mpi_env, "NLEVEL_TEST_LOG_DIR": str(logs)},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and job.poll() is None:
            done = sum(len(p.read_text().split()) for p in logs.iterdir())
            if (tmp_path / "run.h5.control").is_dir() and done > 300:
                break
            time.sleep(0.1)
        drain = subprocess.run([sys.executable, "-m", "nlevel.drain", "run.h5", "--count", "2"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=60)
        out, err = job.communicate(timeout=150)
    finally:
        if job.poll() is None:
            job.kill()
    assert drain.returncode == 0, drain.stderr
    assert "ranks [4, 5] are leaving the job" in drain.stdout
    assert job.returncode == 0, err[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["complete"] and [d["rank"] for d in report["drained"]] == [4, 5] and report["failures"] == []
    runs: Counter[int] = Counter()
    for p in logs.iterdir():
        runs.update(int(x) for x in p.read_text().split())
    assert set(runs) == set(range(4000)) and max(runs.values()) == 1
    assert completed_ids(tmp_path / "run.h5") == set(range(4000))
    tail = {int(x) for p in logs.iterdir() if p.name in ("exec-4.log", "exec-5.log") for x in p.read_text().split()}
    assert len(tail) < 2 * 4000 / 6  # they stopped early
    if switch:
        assert [p["levels"] for p in report["plan_history"]] == [2, 3]
        assert report["hierarchy"]["workers"] == 4  # (0, 1, 2, and 3 alone in its block)
        assert report["hierarchy"]["master_children"] == 3


def test_drain_refuses_clearly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "nlevel.drain", str(tmp_path / "run.h5"), "--count", "2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "does not exist; is a job with checkpoint" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "nlevel.drain", "run.h5", "--ranks", "a,b"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--ranks must be rank numbers like 5,6, got 'a,b'" in proc.stderr


def _failed_in_checkpoint(path):
    from nlevel.runtime import checkpoint as ckpt

    return {f.id: f for f in ckpt.read(path)[1].failed}


@pytest.mark.timeout(300)
def test_retry_failed_runs_only_the_failed_ids_again_and_clears_their_records(tmp_path, mpi_env):
    """Issue 14 point 6: a failed id stays out of a resume, and --retry-failed runs just it again."""
    base = ["--n", "120", "--how", "raise", "--die-task", "50", "--on-task-error", "skip", "--levels", "2"]
    proc, report, runs = run_job(tmp_path, mpi_env, 3, [*base, "--poison"], ft=False)
    assert proc.returncode == 1 and [f["id"] for f in report["failed_tasks"]] == [50], proc.stderr[-3000:]
    assert set(_failed_in_checkpoint(tmp_path / "run.h5")) == {50} and runs[50] == 1
    # A plain resume leaves it out.
    proc, report, runs = run_job(tmp_path, mpi_env, 3, [*base, "--poison"], ft=False)
    assert proc.returncode == 1 and runs[50] == 1 and report["committed_this_run"] == 0, proc.stderr[-3000:]
    # Retried and failing again: run once more, recorded again (this run's record).
    proc, report, runs = run_job(tmp_path, mpi_env, 3, [*base, "--poison", "--retry-failed"], ft=False)
    assert proc.returncode == 1 and runs[50] == 2, proc.stderr[-3000:]
    assert "retrying 1 failed task(s) recorded in run.h5: 50" in proc.stderr
    assert set(_failed_in_checkpoint(tmp_path / "run.h5")) == {50} and sum(runs.values()) == 121
    # Retried and succeeding (the task breaks only the first time without --poison): committed, record gone.
    proc, report, runs = run_job(tmp_path, mpi_env, 3, [*base, "--retry-failed"], ft=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["complete"] and report["failed_tasks"] == [] and report["committed_this_run"] == 1
    assert runs[50] == 3 and sum(runs.values()) == 122  # only id 50 ran again
    assert completed_ids(tmp_path / "run.h5") == set(range(120)) and _failed_in_checkpoint(tmp_path / "run.h5") == {}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("how", ["KILL", "STOP"])
def test_a_rank_lost_before_mpi_init_makes_the_launcher_start_again_not_hang(tmp_path, mpi_env, how):
    """Issue 14: Open MPI's start-up fence waits for ever for a process dead (or stopped) before MPI_Init under ULFM."""
    logs = tmp_path / "logs"
    logs.mkdir()
    cmd = [os.path.join(BIN, "nlevel-mpiexec"), "--with-ft", "ulfm", "-n", "4", sys.executable,
           os.path.join(ROOT, "tests", "apps", "early_death.py"), "300", "run.h5"]
    env = {**mpi_env, "NLEVEL_TEST_LOG_DIR": str(logs), "EARLY_RANK": "2", "EARLY_HOW": how}
    try:
        proc = run_bounded(cmd, 150, cwd=tmp_path, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hung\n{exc.stderr}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    what = "was stopped (and killed)" if how == "STOP" else "died"
    assert "nlevel-mpiexec: rank 2 (pid " in proc.stderr and f") {what} before MPI was up" in proc.stderr
    assert "starting the job again (attempt 2 of 3)" in proc.stderr
    assert "nlevel: started again by nlevel-mpiexec (attempt 2): rank(s) 2 died before MPI was up" in proc.stderr
    assert completed_ids(tmp_path / "run.h5") == set(range(300))
    runs: Counter[int] = Counter()
    for name in os.listdir(logs):
        if name.startswith("exec-"):
            runs.update(int(x) for x in (logs / name).read_text().split())
    assert set(runs) == set(range(300)) and max(runs.values()) == 1  # nothing had run before the second start


@pytest.mark.timeout(100)
def test_no_start_again_when_asked_for_none(tmp_path, mpi_env):
    logs = tmp_path / "logs"
    logs.mkdir()
    cmd = [os.path.join(BIN, "nlevel-mpiexec"), "--start-retries", "0", "--with-ft", "ulfm", "-n", "3",
           sys.executable, os.path.join(ROOT, "tests", "apps", "early_death.py"), "100", "run.h5"]
    env = {**mpi_env, "NLEVEL_TEST_LOG_DIR": str(logs), "EARLY_RANK": "1", "EARLY_HOW": "KILL"}
    proc = run_bounded(cmd, 60, cwd=tmp_path, env=env)
    assert proc.returncode == 1
    assert "giving up after 1 attempt(s) (--start-retries 0)" in proc.stderr
    assert not (tmp_path / "run.h5").exists()  # nothing ran, nothing written
