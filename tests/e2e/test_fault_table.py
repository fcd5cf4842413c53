"""The README's fault table, the rows no other test held: each is a fixed case, not a random draw.

Every row of that table and the tests that hold it are listed in docs/development.md
("The fault table, row by row"). Here:

* "Python raises or exits mid-job", without ULFM: ``MPI_Abort`` of the job (non-zero exit, bounded),
  the checkpoint kept, and the same command resumes;
* "A task that raises", by default (``--on-task-error abort``): the job stops with the traceback,
  rank and host, without ULFM; under ULFM that process alone;
* "An exception inside ``get_task_id``": with and without ULFM;
* "a process dies while the farm is set up" and "before ``MPI_Init`` returns", without ULFM: the job
  fails (exit != 0) and does not hang.

"master and deputy die together" is in tests/e2e/test_faults.py (``master-deputy-together-*``)
and tests/unit/test_farm_inprocess.py (both deaths on the same step).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from nlevel.config import SETTINGS

from ..conftest import ROOT, run_bounded
from .test_cli import BIN, completed_ids
from .test_ft_cli import run_job

INSIDE = os.path.join(ROOT, "tests", "apps", "inside_get_task_id.py")
EARLY = os.path.join(ROOT, "tests", "apps", "early_death.py")


def launch(tmp_path, env, n, script_args, ft, timeout=120):
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    cmd = [os.path.join(BIN, "nlevel-mpiexec"), *(["--with-ft", "ulfm"] if ft else []), "-n", str(n),
           sys.executable, *script_args]
    try:
        return run_bounded(cmd, timeout, cwd=tmp_path, env={**env, "NLEVEL_TEST_LOG_DIR": str(logs)})
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hung: {' '.join(script_args)}\n{exc.stderr}")


def executions(tmp_path) -> Counter[int]:
    runs: Counter[int] = Counter()
    for name in os.listdir(tmp_path / "logs"):
        if name.startswith("exec-"):
            runs.update(int(x) for x in (tmp_path / "logs" / name).read_text().split())
    return runs


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["exit", "raise"])
def test_without_ulfm_a_rank_that_raises_or_exits_mid_job_aborts_the_job_and_the_same_command_resumes(
        tmp_path, mpi_env, how):
    """README: "Python raises or exits mid-job | MPI_Abort of the job". (Task 300 fails the first time only.)"""
    args = ["--n", "400", "--how", how, "--die-task", "300", "--sleep-ms", "5", "--levels", "2",
            "--checkpoint-interval", "0.1"]
    first, _, _ = run_job(tmp_path, mpi_env, 4, args, ft=False)
    assert first.returncode != 0, first.stderr[-3000:]
    assert "MPI_ABORT was invoked" in first.stderr, first.stderr[-3000:]
    assert ": unhandled exception in the task loop; aborting the job (the checkpoint keeps what was committed)" \
        in first.stderr, first.stderr[-3000:]
    kept = completed_ids(tmp_path / "run.h5")  # (readable: the abort never leaves half a file)
    assert 0 < len(kept) < 400
    second, report, runs = run_job(tmp_path, mpi_env, 4, args, ft=False)
    assert second.returncode == 0, second.stderr[-3000:]
    assert report["complete"] and report["resumed_from_checkpoint"] == len(kept)
    assert completed_ids(tmp_path / "run.h5") == set(range(400))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ft", [False, True], ids=["mpiexec", "ulfm"])
def test_by_default_a_task_that_raises_stops_the_job_with_its_traceback_rank_and_host(tmp_path, mpi_env, ft):
    """README: "A task that raises aborts the job by default": no --on-task-error given. Under ULFM the
    rank that raised kills itself and the others carry on (its ids, task 50's too, run elsewhere)."""
    assert SETTINGS["on_task_error"].default == "abort"
    proc, report, runs = run_job(tmp_path, mpi_env, 4, ["--n", "200", "--how", "raise", "--die-task", "50",
                                                         "--levels", "2"], ft=ft)
    err = proc.stderr
    assert "ValueError: task 50 is broken" in err and "Traceback (most recent call last)" in err, err[-3000:]
    assert "unhandled exception in the task loop" in err and " on " in err.split("unhandled")[0][-60:], err[-3000:]
    if not ft:
        assert proc.returncode != 0 and "aborting the job" in err and "MPI_ABORT was invoked" in err, err[-3000:]
        assert not (tmp_path / "run.h5").exists() or 50 not in completed_ids(tmp_path / "run.h5")
    else:
        assert proc.returncode == 0 and "killing this process; the others carry on without it" in err, err[-3000:]
        assert report["complete"] and len(report["dead_ranks"]) == 1 and report["failed_tasks"] == []
        assert completed_ids(tmp_path / "run.h5") == set(range(200)) and runs[50] == 2


@pytest.mark.timeout(200)
@pytest.mark.parametrize("ft", [False, True], ids=["mpiexec", "ulfm"])
def test_an_exception_inside_get_task_id_ends_the_job_or_that_process_never_a_hang(tmp_path, mpi_env, ft):
    """README: "An exception inside get_task_id aborts the job with the rank, host and traceback instead of
    leaving the others waiting" (under ULFM: that process alone, and the others finish the job)."""
    proc = launch(tmp_path, {**mpi_env, "RAISE_RANK": "1", "RAISE_AT": "3"}, 4, [INSIDE, "2000", "run.h5"], ft)
    err = proc.stderr
    then = "killing this process; the others carry on without it" if ft else "aborting the job"
    assert "nlevel: rank 1 on " in err and f": error inside get_task_id; {then}" in err, err[-3000:]
    assert "RuntimeError: injected inside get_task_id" in err, err[-3000:]
    if ft:
        assert proc.returncode == 0, err[-3000:]
        assert completed_ids(tmp_path / "run.h5") == set(range(2000))
        assert set(executions(tmp_path)) == set(range(2000))
    else:
        assert proc.returncode != 0 and "MPI_ABORT was invoked on rank 1" in err, err[-3000:]


@pytest.mark.timeout(200)
def test_without_ulfm_a_death_during_set_up_fails_the_job_not_a_hang(tmp_path, mpi_env):
    """README: "a process dies while the farm is set up | the job fails (exit != 0)"."""
    proc, _, runs = run_job(tmp_path, mpi_env, 4, ["--n", "300", "--levels", "2", "--die-rank", "2",
                                                   "--die-in-setup", "window"], ft=False, timeout=120)
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert not runs  # (nothing ran)


@pytest.mark.timeout(200)
def test_without_ulfm_a_death_before_mpi_init_ends_the_job_not_a_hang(tmp_path, mpi_env):
    """README: "a process dies or stops before MPI_Init returns | Open MPI ends the job (exit != 0); nothing ran"."""
    proc = launch(tmp_path, {**mpi_env, "EARLY_RANK": "2", "EARLY_HOW": "KILL"}, 4, [EARLY, "300", "run.h5"], False)
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert not executions(tmp_path) and not (tmp_path / "run.h5").exists()
