"""Teams end to end (issue 36): ``python -m nlevel.run --ranks-per-task k`` under mpiexec, as a user runs it.

The shipped example's results against the serial answer; under ULFM a member SIGKILLed mid-task
(the task runs again on another team, every id committed once), a leader SIGKILLed (its members
leave, nothing hangs), a member that hangs (``--task-timeout`` for the whole team, with and
without ULFM); per-task output files named for a failed task by the report and ``nlevel.status``;
GPUs from a fake list; bad input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from ..conftest import BIN, ROOT, run_bounded
from .test_cli import completed_ids

APP = os.path.join(ROOT, "tests", "apps", "team_app.py")


def run(tmp_path, env, n, args, ft=False, timeout=180, app=APP, extra_env=None):
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    launcher = [os.path.join(BIN, "nlevel-mpiexec"), *(["--with-ft", "ulfm"] if ft else []), "-n", str(n)]
    cmd = [*launcher, sys.executable, "-m", "nlevel.run", app, "--checkpoint", "run.h5", "--report", "r.json",
           "--quiet", *args]
    try:
        proc = run_bounded(cmd, timeout, cwd=tmp_path,
                           env={**env, "NLEVEL_TEST_LOG_DIR": str(logs), **(extra_env or {})})
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hung: {' '.join(args)}\n{exc.stderr}")
    report = json.loads((tmp_path / "r.json").read_text()) if (tmp_path / "r.json").exists() else None
    return proc, report


def executions(tmp_path) -> dict[int, list[tuple[int, int, int, str]]]:
    """World rank -> (task id, team size, team rank, devices) of each execution."""
    out = {}
    for name in os.listdir(tmp_path / "logs"):
        if name.startswith("exec-"):
            rows = [line.split() for line in (tmp_path / "logs" / name).read_text().splitlines()]
            out[int(name[5:-4])] = [(int(a), int(b), int(c), d) for a, b, c, d in rows]
    return out


def runs_per_team(tmp_path) -> Counter[int]:
    """How many times each id ran, counted once per team (its team rank 0)."""
    return Counter(tid for rows in executions(tmp_path).values() for tid, _, me, _ in rows if me == 0)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n,k", [(4, 2), (7, 3)])
def test_the_shipped_example_gives_the_serial_answer(tmp_path, mpi_env, n, k):
    """apps/team_pi: each task an Allreduce over its team; every result equals the one-process answer."""
    sys.path.insert(0, ROOT)
    from apps.team_pi import serial

    proc, report = run(tmp_path, mpi_env, n, ["--ranks-per-task", str(k), "--tasks", "12", "--samples", "30000",
                                             "--out", "pi.json"], app="apps.team_pi")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["complete"] and report["teams"]["ranks_per_task"] == k
    got = json.loads((tmp_path / "pi.json").read_text())
    assert got["ids"] == list(range(12))
    assert [(p, h) for p, h in zip(got["pi"], got["hits"])] == [serial(i, 30000, 12, 2024) for i in range(12)]
    if n % k:  # (7 ranks, k = 3: one rank left over, said once)
        assert proc.stderr.count("in no team of 3") == 1 and report["teams"]["left"] == [6]


@pytest.mark.timeout(300)
def test_a_member_killed_mid_task_fails_that_attempt_and_the_task_runs_on_another_team(tmp_path, mpi_env):
    proc, report = run(tmp_path, mpi_env, 6, ["--ranks-per-task", "2", "--n", "60", "--die-task", "20"], ft=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["complete"] and report["committed"] == 60
    assert completed_ids(tmp_path / "run.h5") == set(range(60))
    runs = runs_per_team(tmp_path)
    assert runs[20] == 2 and all(c == 1 for t, c in runs.items() if t != 20), runs
    leaders = {r: [t for t, _, me, _ in rows if me == 0] for r, rows in executions(tmp_path).items()}
    assert len([r for r, ids in leaders.items() if 20 in ids]) == 2  # two teams ran it
    lost = [f for f in report["failures"] if f["role"] == "team"]
    assert len(lost) == 1 and "lost a process" in lost[0]["how"]
    assert report["dead_ranks"] == []  # (the farm's ranks all lived: the leader served on)
    assert "the team cannot run its tasks any more" in proc.stderr


@pytest.mark.timeout(300)
def test_a_leader_killed_mid_task_lets_its_member_leave_and_nothing_hangs(tmp_path, mpi_env):
    proc, report = run(tmp_path, mpi_env, 6, ["--ranks-per-task", "2", "--n", "60", "--die-task", "20",
                                             "--who", "leader"], ft=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["complete"] and completed_ids(tmp_path / "run.h5") == set(range(60))
    assert len(report["dead_ranks"]) == 1
    assert "this process leaves the job" in proc.stderr


@pytest.mark.timeout(300)
def test_a_member_that_hangs_is_caught_by_the_task_timeout_of_its_team_under_ulfm(tmp_path, mpi_env):
    proc, report = run(tmp_path, mpi_env, 6, ["--ranks-per-task", "2", "--n", "40", "--hang-task", "15",
                                             "--task-timeout", "2"], ft=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["complete"] and completed_ids(tmp_path / "run.h5") == set(range(40))
    assert "ran task 15 past --task-timeout 2 s" in proc.stderr
    assert runs_per_team(tmp_path)[15] == 2


@pytest.mark.timeout(300)
def test_a_member_that_hangs_stops_the_job_without_ulfm_and_the_same_command_resumes(tmp_path, mpi_env):
    args = ["--ranks-per-task", "2", "--n", "40", "--hang-task", "15", "--task-timeout", "2"]
    proc, report = run(tmp_path, mpi_env, 4, args)
    assert proc.returncode == 75, proc.stderr[-3000:]
    assert report["stopped"] == "task timeout" and 15 not in completed_ids(tmp_path / "run.h5")
    proc, report = run(tmp_path, mpi_env, 4, args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert completed_ids(tmp_path / "run.h5") == set(range(40))


@pytest.mark.timeout(300)
def test_each_task_has_its_own_output_and_a_failed_task_names_its_files(tmp_path, mpi_env):
    """The member raises before the task's Allreduce, where its leader waits: under ULFM the team's
    communicator is revoked, the leader's Allreduce fails, and the task fails once, with the member's error."""
    proc, report = run(tmp_path, mpi_env, 4, ["--ranks-per-task", "2", "--n", "10", "--say", "--raise-task", "4",
                                             "--always", "--on-task-error", "skip", "--task-output", "out"], ft=True)
    assert proc.returncode == 1, proc.stderr[-3000:]
    out = tmp_path / "out"
    assert sorted(os.listdir(out)) == sorted(f"{t}{m}.{e}" for t in range(10) for m in ("", ".1") for e in ("out", "err"))
    assert (out / "3.out").read_text().splitlines() == ["task 3 says hello from team rank 0", "task 3 C-level stdout 0"]
    assert (out / "3.1.err").read_text() == "task 3 C-level stderr 1\n"
    assert "ValueError: task 4 is broken on team rank 1" in (out / "4.1.err").read_text()  # (its traceback, too)
    assert "says hello" not in proc.stdout  # (the job's own output has nlevel's lines only)
    [failed] = report["failed_tasks"]
    assert failed["id"] == 4 and "team member 1" in failed["error"]
    assert str(out / "4.1.err") in failed["output"] and str(out / "4.err") in failed["output"]
    assert f"output: {out / '4.1.err'}" in proc.stderr  # (the end's line of the failed task)
    status = run_bounded([sys.executable, "-m", "nlevel.status", "run.h5"], 60, cwd=tmp_path, env=mpi_env)
    assert f"task 4 (raised) output: {out / '4.1.err'}" in status.stdout, status.stdout


@pytest.mark.timeout(300)
def test_each_team_gets_its_own_gpus_from_a_fake_list(tmp_path, mpi_env):
    proc, report = run(tmp_path, mpi_env, 5, ["--ranks-per-task", "2", "--gpus-per-task", "2", "--n", "12"],
                       extra_env={"NLEVEL_GPUS": "0,1,2,3"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = {r: {d for *_, d in rows} for r, rows in executions(tmp_path).items()}
    assert seen == {0: {"0,1"}, 1: {"0,1"}, 2: {"2,3"}, 3: {"2,3"}}  # (rank 4: left over, no task)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("args,env,said", [
    (["--ranks-per-task", "0"], {}, "--ranks-per-task must be an integer >= 1, got '0'"),
    (["--ranks-per-task", "5"], {}, "ranks_per_task 5 is larger than the job's 4 process(es); expected 1 to 4"),
    (["--gpus-per-task", "-1"], {}, "--gpus-per-task must be an integer >= 0, got '-1'"),
    (["--ranks-per-task", "2", "--gpus-per-task", "2"], {"NLEVEL_GPUS": "0,1"},
     "node vm has 2 GPU(s) (CUDA_VISIBLE_DEVICES=0,1) for 2 team(s) there: 4 needed"),
    (["--task-output", "afile"], {}, "is a file; expected a directory"),
    (["--task-output", "afile/sub"], {}, "is not a directory"),
    (["--task-output", "/proc/nlevel-out"], {}, "cannot be created"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_on_disk(tmp_path, mpi_env, args, env, said):
    if "vm" in said:
        said = said.replace("vm", os.uname().nodename)
    (tmp_path / "afile").write_text("mine\n")
    proc, report = run(tmp_path, mpi_env, 4, ["--n", "10", *args], extra_env=env)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("nlevel: error")]
    assert len(errors) == 1 and said in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["afile", "logs"] and (tmp_path / "afile").read_text() == "mine\n"
    assert os.listdir(tmp_path / "logs") == []
