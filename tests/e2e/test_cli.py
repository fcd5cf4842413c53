"""End-to-end: ``python -m nlevel.run`` under mpiexec, as a user runs it."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import nlevel.runtime.checkpoint as ckpt

from ..conftest import BIN, run_bounded

APP = "tests.apps.logging_app"


def nlevel_run(n, args, cwd, env, timeout=120, ft=False):
    cmd = [os.path.join(BIN, "nlevel-mpiexec"), *(["--with-ft", "ulfm"] if ft else []), "-n", str(n), sys.executable,
           "-m", "nlevel.run", *args]
    try:
        return run_bounded(cmd, timeout, cwd=cwd, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(args)} on {n} processes hung:\n{exc.stdout}\n{exc.stderr}")


def executions(log_dir) -> list[int]:
    out: list[int] = []
    for name in os.listdir(log_dir):
        with open(os.path.join(log_dir, name)) as f:
            out += [int(line) for line in f if line.strip()]
    return out


def pids_with_env(marker: str) -> list[int]:
    """Processes whose environment contains ``marker`` (how to find a job's ranks from outside)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def kill_job(job: subprocess.Popen, marker: str) -> None:
    """SIGKILL every process of the job at once: launcher and ranks."""
    for pid in pids_with_env(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.killpg(job.pid, signal.SIGKILL)
    job.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while pids_with_env(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pids_with_env(marker), "job processes survived SIGKILL"


def completed_ids(path) -> set[int]:
    _, snap, _ = ckpt.read(path)
    return {i for a, b in snap.completed.tolist() for i in range(a, b)}


def sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.timeout(180)
def test_seven_processes_three_levels_run_every_task_once(tmp_path, mpi_env):
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {**mpi_env, "NLEVEL_TEST_LOG_DIR": str(logs)}
    proc = nlevel_run(7, [APP, "--levels", "3", "--n", "3000", "--checkpoint", "run.h5", "--report", "r.json"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    ran = executions(logs)
    assert sorted(ran) == list(range(3000))
    assert completed_ids(tmp_path / "run.h5") == set(range(3000))
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["complete"] and report["committed"] == 3000 and report["recomputed"] == 0
    assert report["plan"]["levels"] == 3 and report["hierarchy"]["region_masters"] >= 1
    assert report["failures"] == []
    for level in ("slave", "region-master L1"):
        parts = report["requests"][level]
        assert {"total", "message", "wait", "dispose"} <= set(parts) and parts["total"]["count"] > 0
    assert report["tasks"]["count"] == 3000
    assert "3000/3000 tasks committed" in proc.stdout
    _, snap, _ = ckpt.read(tmp_path / "run.h5")
    results = dict(zip(snap.result_ids.tolist(), snap.result_values.tolist()))
    assert results == {i: i * 0.5 for i in range(3000)}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("ft", [False, True], ids=["mpiexec", "ulfm"])  # (the README's fault table: "the same")
def test_sigkill_of_the_whole_job_then_the_same_command_resumes(tmp_path, mpi_env, ft):
    logs1, logs2 = tmp_path / "logs1", tmp_path / "logs2"
    logs1.mkdir()
    logs2.mkdir()
    args = [APP, "--n", "800", "--sleep-ms", "8", "--checkpoint", "run.h5", "--checkpoint-interval", "0.1", "--quiet"]
    cmd = [os.path.join(BIN, "nlevel-mpiexec"), *(["--with-ft", "ulfm"] if ft else []), "-n", "4", sys.executable,
           "-m", "nlevel.run", *args]
    job = subprocess.Popen(
        cmd, cwd=tmp_path, env={**mpi_env, "NLEVEL_TEST_LOG_DIR": str(logs1)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )
    ckpt_path = tmp_path / "run.h5"
    deadline = time.monotonic() + 60
    at_kill: set[int] = set()
    try:
        while time.monotonic() < deadline and job.poll() is None:
            if ckpt_path.exists():
                try:
                    if len(completed_ids(ckpt_path)) >= 200:
                        break
                except Exception:
                    pass
            time.sleep(0.02)
    finally:
        kill_job(job, f"NLEVEL_TEST_LOG_DIR={logs1}")
    at_kill = completed_ids(ckpt_path)  # must be readable: the guarantee under test
    assert 200 <= len(at_kill) < 800, f"kill did not land mid-run ({len(at_kill)} committed)"

    proc = nlevel_run(4, args, tmp_path, {**mpi_env, "NLEVEL_TEST_LOG_DIR": str(logs2)}, ft=ft)
    assert proc.returncode == 0, proc.stderr
    second = executions(logs2)
    assert not set(second) & at_kill, "a task recorded as complete ran again"
    assert len(second) == len(set(second))
    assert set(second) | at_kill == set(range(800))
    assert completed_ids(ckpt_path) == set(range(800))


def run_bad(tmp_path, mpi_env, args, n=2, env_extra=None):
    proc = nlevel_run(n, args, tmp_path, {**mpi_env, **(env_extra or {})})
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr


@pytest.mark.timeout(120)
def test_not_an_hdf5_file_is_refused_and_kept(tmp_path, mpi_env):
    target = tmp_path / "notes.h5"
    target.write_text("my precious notes\n")
    err = run_bad(tmp_path, mpi_env, ["--checkpoint", str(target), "--tasks", "10"])
    assert "not an HDF5 file" in err and str(target) in err
    assert target.read_text() == "my precious notes\n"


@pytest.mark.timeout(120)
def test_directory_as_checkpoint(tmp_path, mpi_env):
    err = run_bad(tmp_path, mpi_env, ["--checkpoint", str(tmp_path), "--tasks", "10"])
    assert "is a directory" in err


@pytest.mark.timeout(180)
def test_checkpoint_of_other_parameters_is_refused_then_fresh_keeps_it_aside(tmp_path, mpi_env):
    ok = nlevel_run(2, ["--checkpoint", "run.h5", "--tasks", "40", "--task-min", "0.1", "--quiet"], tmp_path, mpi_env)
    assert ok.returncode == 0, ok.stderr
    before = sha(tmp_path / "run.h5")
    err = run_bad(tmp_path, mpi_env, ["--checkpoint", "run.h5", "--tasks", "40", "--task-min", "0.2"])
    assert '"task_min": 0.1' in err and '"task_min": 0.2' in err
    assert "they differ in: task_min: 0.1 in the checkpoint, 0.2 in this run" in err
    assert "add --fresh" in err and "fresh=True" not in err  # the remedy this command has
    assert sha(tmp_path / "run.h5") == before
    # How a task waits is not part of the run: --busy (and --report) may change on a resume.
    again = nlevel_run(2, ["--checkpoint", "run.h5", "--tasks", "40", "--task-min", "0.1", "--busy",
                           "--report", "other.json"], tmp_path, mpi_env)
    assert again.returncode == 0, again.stderr
    assert "(0 this run, 40 from the checkpoint" in again.stdout
    before = sha(tmp_path / "run.h5")  # (the resumed run wrote it again)
    fresh = nlevel_run(
        2, ["--checkpoint", "run.h5", "--tasks", "40", "--task-min", "0.2", "--quiet", "--fresh"], tmp_path, mpi_env
    )
    assert fresh.returncode == 0, fresh.stderr
    backups = [p for p in os.listdir(tmp_path) if p.startswith("run.h5.") and p.endswith(".bak")]
    assert len(backups) == 1 and sha(tmp_path / backups[0]) == before


@pytest.mark.timeout(120)
def test_truncated_checkpoint(tmp_path, mpi_env):
    ok = nlevel_run(2, ["--checkpoint", "run.h5", "--tasks", "20", "--task-min", "0", "--quiet"], tmp_path, mpi_env)
    assert ok.returncode == 0, ok.stderr
    data = (tmp_path / "run.h5").read_bytes()
    (tmp_path / "run.h5").write_bytes(data[: len(data) // 2])
    err = run_bad(tmp_path, mpi_env, ["--checkpoint", "run.h5", "--tasks", "20", "--task-min", "0"])
    assert "corrupt or truncated" in err
    assert len((tmp_path / "run.h5").read_bytes()) == len(data) // 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args,n,env,message", [
    (["--levels", "3", "--regions", "2", "--tasks", "5"], 3, None, "needs at least 4 processes"),
    (["no.such.app"], 2, None, "APP 'no.such.app' cannot be imported"),
    (["tests.apps.no_do_job"], 2, None, "lacks do_job"),
    (["tests.apps.negative_total"], 2, None, "total must be a non-negative integer, got -3"),
    (["--poll-max", "abc"], 2, None, "--poll-max must be a number (s), got 'abc'"),
    (["--tasks", "-4"], 2, None, "--tasks must be >= 0, got -4"),
    ([], 2, {"NLEVEL_LEVELS": "x"}, "NLEVEL_LEVELS must be an integer, got 'x'"),
])
def test_bad_input_is_one_clear_line(tmp_path, mpi_env, args, n, env, message):
    err = run_bad(tmp_path, mpi_env, args, n=n, env_extra=env)
    assert message in err
    assert len([line for line in err.splitlines() if line.startswith("nlevel: error:")]) == 1, err


@pytest.mark.timeout(120)
def test_vector_results_are_committed_and_handed_to_finish(tmp_path, mpi_env):
    proc = nlevel_run(4, ["tests.apps.vector_app", "--checkpoint", "v.h5", "--quiet"], tmp_path, mpi_env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads((tmp_path / "finish.json").read_text())
    assert sorted(got["ids"]) == list(range(60))
    assert all(v == [2.0 * i, float(i) ** 2] for i, v in zip(got["ids"], got["values"]))
    _, snap, _ = ckpt.read(tmp_path / "v.h5")
    assert snap.result_values.shape == (60, 2)


@pytest.mark.timeout(180)
def test_auto_plan_switches_mid_run_on_seven_processes(tmp_path, mpi_env):
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {**mpi_env, "NLEVEL_TEST_LOG_DIR": str(logs)}
    args = [APP, "--n", "5000", "--sleep-ms", "1", "--levels", "auto", "--force-replan", "0.4@3x2",
            "--checkpoint", "run.h5", "--report", "r.json", "--quiet"]
    proc = nlevel_run(7, args, tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert sorted(executions(logs)) == list(range(5000))  # executed once each, across the switch
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["complete"] and report["recomputed"] == 0
    assert [p["levels"] for p in report["plan_history"]][:2] == [2, 3]
    assert report["plan"]["levels"] in (2, 3)
    measured = [d for d in report["decisions"] if "chosen" in d]
    assert measured, report["decisions"]
    for d in measured:  # every measured decision carries its inputs (the paper's) and its reason
        assert {"lambda_hat", "sigma2_hat", "samples", "mu", "rho", "messages", "claims"} <= set(d)
        assert "verdict" in d["messages"] and d["samples"] >= 1
        assert d["mu"] > 0 and d["reason"] and "current_predicted" in d


@pytest.mark.timeout(240)
@pytest.mark.parametrize("ft", [False, True], ids=["mpiexec", "ulfm"])  # (the README's fault table: "the same")
def test_sigusr1_stops_with_status_75_then_the_same_command_resumes(tmp_path, mpi_env, ft):
    """A batch system's warning (SIGUSR1 to the launcher): checkpoint, stop, exit 75; resume later."""
    logs1, logs2 = tmp_path / "logs1", tmp_path / "logs2"
    logs1.mkdir()
    logs2.mkdir()
    args = [APP, "--levels", "3", "--n", "1200", "--sleep-ms", "10", "--checkpoint", "run.h5", "--report", "r.json", "--quiet"]
    cmd = [os.path.join(BIN, "nlevel-mpiexec"), *(["--with-ft", "ulfm"] if ft else []), "-n", "5", sys.executable,
           "-m", "nlevel.run", *args]
    job = subprocess.Popen(cmd, cwd=tmp_path, env={**mpi_env, "NLEVEL_TEST_LOG_DIR": str(logs1)},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and job.poll() is None:
            if (tmp_path / "run.h5").exists() and len(completed_ids(tmp_path / "run.h5")) >= 100:
                break
            time.sleep(0.05)
        sent = time.monotonic()
        job.send_signal(signal.SIGUSR1)
        out, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 75, err
    assert time.monotonic() - sent < 20
    stopped = completed_ids(tmp_path / "run.h5")
    assert 100 <= len(stopped) < 1200
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["stopped"] == "SIGUSR1" and not report["complete"] and report["committed"] == len(stopped)
    first = executions(logs1)
    assert len(first) == len(set(first)) and set(first) == stopped  # every task that ran was committed

    proc = nlevel_run(5, args, tmp_path, {**mpi_env, "NLEVEL_TEST_LOG_DIR": str(logs2)}, ft=ft)
    assert proc.returncode == 0, proc.stderr
    second = executions(logs2)
    assert not set(second) & stopped and len(second) == len(set(second))
    assert completed_ids(tmp_path / "run.h5") == set(range(1200))
