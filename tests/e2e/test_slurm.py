"""slurm/'s batch scripts on a real one-node Slurm (started by .ci/slurm), as a user submits them.

The session fixture starts munged, slurmctld and slurmd with ``.ci/slurm up`` unless they
already run, and stops what it started at the end. Where Slurm cannot be started (not
root, no apt-get, no network to the package index) the tests that need it are skipped
with the reason; ``NLEVEL_REQUIRE_SLURM=1`` turns that skip into a failure (CI).

Timeouts bound each test's body (``func_only``): the fixture's start, which on a fresh
machine installs the packages, is bounded by its own (900 s).

The host has 2 cores, so jobs ask for 4 tasks with ``--overcommit`` and the job
environment turns off core binding; the scripts themselves carry no such setting.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections import Counter

import pytest

import nlevel.runtime.checkpoint as ckpt

from ..conftest import BIN, ROOT

CI_SLURM = os.path.join(ROOT, ".ci", "slurm")
SCRIPTS = os.path.join(ROOT, "slurm")
APP = "tests.apps.logging_app"
SLURM_DIR = os.environ.get("NLEVEL_SLURM_DIR", "/tmp/nlevel-slurm")
SLURM_CONF = os.path.join(SLURM_DIR, "slurm.conf")
# Four ranks on two cores: --overcommit lets Slurm place them.
SBATCH_OPTS = ["--ntasks=4", "--overcommit"]


def _ci_slurm(action: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "NLEVEL_SLURM_DIR": SLURM_DIR}
    return subprocess.run([CI_SLURM, action], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def slurm():
    """A running one-node Slurm: SLURM_CONF for its clients. Skips, with the reason, where none can run."""
    started = False
    if _ci_slurm("status", 30).returncode != 0:
        try:
            up = _ci_slurm("up", 900)  # a fresh machine installs slurm-wlm and munge first
            reason = (up.stderr.strip().splitlines() or [f"exit status {up.returncode}"])[-1]
        except subprocess.TimeoutExpired:
            up, reason = None, ".ci/slurm up did not finish in 900 s"
        if up is None or up.returncode != 0:
            message = f"cannot start a local Slurm: {reason}"
            if os.environ.get("NLEVEL_REQUIRE_SLURM") == "1":
                pytest.fail(message + " (NLEVEL_REQUIRE_SLURM=1)")
            pytest.skip(message)
        started = True
    yield SLURM_CONF
    if started:
        _ci_slurm("down", 120)


@pytest.fixture
def job_env(slurm, tmp_path):
    """The environment jobs are submitted with (sbatch exports it into the job)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    env = dict(os.environ)
    env.update(
        SLURM_CONF=slurm,
        VENV=os.path.dirname(BIN),
        PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""),
        NLEVEL_TTY="0",
        NLEVEL_TEST_LOG_DIR=str(logs),
        # This machine, not the scripts: root, and more ranks than cores (no binding,
        # waiting ranks yield their core).
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        PRTE_MCA_hwloc_default_binding_policy="none",
        OMPI_MCA_mpi_yield_when_idle="1",
        # A marker to find this test's ranks in /proc.
        NLEVEL_SLURM_TEST=uuid.uuid4().hex,
    )
    for name in [k for k in env if k.startswith(("SBATCH_", "SLURM_")) and k != "SLURM_CONF"]:
        del env[name]  # a test run inside a Slurm job must not pass its own job's settings on
    return env


def sbatch(script: str, args: list[str], cwd, env, opts=()) -> str:
    """Submit ``slurm/<script>`` with ``args``; return the job id."""
    cmd = ["sbatch", "--parsable", *SBATCH_OPTS, *opts, "--output", "job-%j.out", os.path.join(SCRIPTS, script), *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
    return proc.stdout.strip().split(";")[0]


def job_info(job_id: str, env) -> dict[str, str]:
    """``scontrol show job`` as a dict (finished jobs stay visible: MinJobAge=3600)."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return dict(re.findall(r"(\w+)=(\S*)", out.stdout))


FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


def wait_job(job_id: str, env, timeout: float, on_poll=None) -> dict[str, str]:
    """Wait until the job has ended for good; return its final ``scontrol`` fields."""
    deadline = time.monotonic() + timeout
    info: dict[str, str] = {}
    while time.monotonic() < deadline:
        info = job_info(job_id, env)
        if info.get("JobState") in FINAL:
            return info
        if on_poll:
            on_poll(info)
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], env=env, timeout=30)
    pytest.fail(f"job {job_id} did not end in {timeout} s: {info}")


def output(cwd, job_id: str) -> str:
    path = os.path.join(cwd, f"job-{job_id}.out")
    return open(path).read() if os.path.exists(path) else ""


def executions(log_dir) -> dict[int, list[int]]:
    """Per rank, the task ids it ran (tests/apps/logging_app.py writes exec-<rank>.log)."""
    out: dict[int, list[int]] = {}
    for name in os.listdir(log_dir):
        with open(os.path.join(log_dir, name)) as f:
            out[int(name[5:-4])] = [int(line) for line in f if line.strip()]
    return out


def completed_ids(path) -> set[int]:
    _, snap, _ = ckpt.read(path)
    return {i for a, b in snap.completed.tolist() for i in range(a, b)}


def all_runs(log_dir) -> list[int]:
    return [i for ids in executions(log_dir).values() for i in ids]


@pytest.mark.slow  # a job on the local Slurm
@pytest.mark.timeout(240, func_only=True)
def test_plain_run_commits_every_task_once_then_resubmission_resumes(tmp_path, job_env):
    logs = job_env["NLEVEL_TEST_LOG_DIR"]
    args = [APP, "--n", "2000", "--report", "r.json"]
    job = sbatch("run.sbatch", args, tmp_path, job_env)
    info = wait_job(job, job_env, 180)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), output(tmp_path, job)
    assert sorted(all_runs(logs)) == list(range(2000))
    assert len(executions(logs)) == 4  # one rank per Slurm task
    assert completed_ids(tmp_path / "nlevel.h5") == set(range(2000))
    assert "2000/2000 tasks committed" in output(tmp_path, job)

    again = sbatch("run.sbatch", args, tmp_path, job_env)  # the same command: nothing runs again
    info = wait_job(again, job_env, 180)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), output(tmp_path, again)
    assert sorted(all_runs(logs)) == list(range(2000))
    assert json.loads((tmp_path / "r.json").read_text())["resumed_from_checkpoint"] == 2000


@pytest.mark.slow  # a job on the local Slurm
@pytest.mark.timeout(180, func_only=True)
def test_system_mpi_script_launches_with_srun_pmix(tmp_path, job_env):
    """srun --mpi=pmix direct launch, as with a site's MPI (here the wheel's Open MPI; no module)."""
    logs = job_env["NLEVEL_TEST_LOG_DIR"]
    # The wheel's PMIx lacks the gds/psec components Slurm names: use ones it has.
    env = {**job_env, "MPI_MODULE": "", "LAUNCH": "srun", "PMIX_MCA_gds": "hash", "PMIX_MCA_psec": "native"}
    job = sbatch("system-mpi.sbatch", [APP, "--n", "1000", "--report", "r.json"], tmp_path, env)
    info = wait_job(job, job_env, 150)
    out = output(tmp_path, job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), out
    assert "srun with Open MPI" in out  # the script names the MPI library mpi4py loaded
    assert sorted(all_runs(logs)) == list(range(1000))
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["size"] == 4 and report["complete"]  # one world of 4 ranks, not 4 singletons


@pytest.mark.slow  # a job on the local Slurm
@pytest.mark.timeout(900, func_only=True)
def test_time_limit_stops_requeues_and_the_next_run_resumes_without_rerunning(tmp_path, job_env):
    """A 3-minute limit with USR1 60 s before it, which Slurm sends 90 to 120 s into each run
    (it checks limits every 30 s and may signal up to 60 s early; measured here). Shorter
    limits leave a loaded host's ranks, which take up to 30 s to start, almost no time.

    The work (2000 x 240 ms on 4 ranks, 120 s at best) cannot finish before the first
    USR1, so at least one run stops with 75 and requeues. While the requeued job waits
    (cred_expire, 10 s in .ci/slurm's cluster), the test moves that run's execution logs
    aside and reads the checkpoint.
    """
    logs = job_env["NLEVEL_TEST_LOG_DIR"]
    env = {**job_env, "MAX_RESTARTS": "20"}
    args = [APP, "--n", "2000", "--sleep-ms", "240", "--checkpoint-interval", "0.5", "--report", "r.json"]
    job = sbatch("resume.sbatch", args, tmp_path, env, opts=["--time=3", "--signal=B:USR1@60"])
    ckpt_path = tmp_path / "nlevel.h5"
    runs: list[tuple[list[int], set[int]]] = []  # per ended run: (ids it ran, ids committed at its end)

    def end_of_run(info):
        if info.get("JobState") == "PENDING" and int(info.get("Restarts", 0)) > len(runs):
            saved = tmp_path / f"logs-run{len(runs)}"
            os.rename(logs, saved)
            os.mkdir(logs)
            runs.append((all_runs(saved), completed_ids(ckpt_path) if ckpt_path.exists() else set()))

    info = wait_job(job, env, 840, on_poll=end_of_run)
    out = output(tmp_path, job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), out
    runs.append((all_runs(logs), completed_ids(ckpt_path)))
    restarts = int(info["Restarts"])
    assert restarts >= 1, f"the job never hit its time limit:\n{out}"
    assert len(runs) == restarts + 1, out
    clean = out.count("stopped before the time limit, checkpoint written; requeueing")
    early = out.count("a rank died of USR1 while starting or ending")
    assert clean >= 1 and clean + early == restarts, out
    committed: set[int] = set()
    for k, (ran, at_end) in enumerate(runs):
        assert not set(ran) & committed, f"run {k + 1} ran tasks committed by an earlier run"
        if not early:  # every run stopped cleanly: it ran exactly what it committed
            assert len(ran) == len(set(ran)) and set(ran) == at_end - committed, f"run {k + 1}"
        committed = at_end
    assert committed == set(range(2000))
    if not early:
        assert sorted(i for ran, _ in runs for i in ran) == list(range(2000))
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["complete"] and report["resumed_from_checkpoint"] > 0


def pids_with_env(*markers: str) -> list[int]:
    """Processes whose environment holds every one of ``markers`` (ranks, found from outside)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except OSError:
                continue
            if all(m.encode() in environ for m in markers):
                found.append(int(entry))
    return found


@pytest.mark.slow  # a job on the local Slurm
@pytest.mark.timeout(300, func_only=True)
def test_fault_tolerant_run_survives_a_killed_rank(tmp_path, job_env):
    logs = job_env["NLEVEL_TEST_LOG_DIR"]
    n = 2000
    args = [APP, "--n", str(n), "--sleep-ms", "10", "--checkpoint-interval", "0.2", "--report", "r.json"]
    job = sbatch("ft.sbatch", args, tmp_path, job_env, opts=["--time=3"])
    marker = f"NLEVEL_SLURM_TEST={job_env['NLEVEL_SLURM_TEST']}"
    victim_rank = 2  # a slave in every plan: rank 0 is the master
    deadline = time.monotonic() + 120
    killed = None
    while time.monotonic() < deadline and killed is None:
        assert job_info(job, job_env)["JobState"] in ("PENDING", "RUNNING", "CONFIGURING"), output(tmp_path, job)
        ckpt_path = tmp_path / "nlevel.h5"
        try:
            started = ckpt_path.exists() and len(completed_ids(ckpt_path)) >= 200
        except Exception:  # a checkpoint being replaced; try again
            started = False
        if started:
            pids = pids_with_env(marker, f"OMPI_COMM_WORLD_RANK={victim_rank}")
            assert len(pids) == 1, f"expected one process of rank {victim_rank}, found {pids}"
            os.kill(pids[0], signal.SIGKILL)
            killed = pids[0]
        time.sleep(0.05)
    assert killed, f"the job did not commit 200 tasks in 120 s:\n{output(tmp_path, job)}"
    info = wait_job(job, job_env, 150)
    out = output(tmp_path, job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), out
    assert completed_ids(tmp_path / "nlevel.h5") == set(range(n))
    runs = executions(logs)
    everywhere = Counter(i for ids in runs.values() for i in ids)
    assert set(everywhere) == set(range(n))
    # Only the tasks the killed rank had in hand may run twice, once more elsewhere.
    survivors = Counter(i for rank, ids in runs.items() if rank != victim_rank for i in ids)
    assert max(survivors.values()) == 1, "a task ran twice on surviving ranks"
    assert set(i for i, c in everywhere.items() if c > 1) <= set(runs.get(victim_rank, []))
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["complete"] and [f["rank"] for f in report["failures"]] == [victim_rank], report["failures"]
    assert "survived 1 process failure(s): rank 2" in out


@pytest.mark.timeout(120, func_only=True)
@pytest.mark.parametrize("script,args,knobs,message", [
    ("run.sbatch", ["missing_app.py"], {}, "APP 'missing_app.py' not found"),
    ("run.sbatch", ["no.such.module"], {}, "APP 'no.such.module' is neither a .py file nor an importable module"),
    ("run.sbatch", [APP], {"VENV": "/nonexistent/venv"}, "VENV '/nonexistent/venv' has no bin/python"),
    ("run.sbatch", [APP], {"CHECKPOINT": "/nonexistent/dir/run.h5"}, "directory /nonexistent/dir does not exist"),
    ("resume.sbatch", [APP], {"MAX_RESTARTS": "x"}, "MAX_RESTARTS must be a whole number, got 'x'"),
    ("ft.sbatch", [APP], {"MPIRUN": "no-such-mpirun"}, "MPIRUN 'no-such-mpirun' not found"),
    ("system-mpi.sbatch", [APP], {"MPI_MODULE": "openmpi"}, "MPI_MODULE 'openmpi' given but there is no 'module' command"),
    ("system-mpi.sbatch", [APP], {"MPI_MODULE": "", "LAUNCH": "aprun"}, "LAUNCH must be srun or mpirun, got 'aprun'"),
])
@pytest.mark.slow  # a job on the local Slurm
def test_bad_input_fails_the_job_with_one_clear_line(tmp_path, job_env, script, args, knobs, message):
    job = sbatch(script, args, tmp_path, {**job_env, **knobs})
    info = wait_job(job, job_env, 60)
    out = output(tmp_path, job)
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "2:0"), out
    errors = [line for line in out.splitlines() if line.startswith("nlevel-slurm: error:")]
    assert len(errors) == 1 and message in errors[0], out


@pytest.mark.timeout(30)
@pytest.mark.parametrize("script", ["run.sbatch", "resume.sbatch", "ft.sbatch", "system-mpi.sbatch"])
def test_scripts_refuse_to_run_outside_a_slurm_job(script):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(["bash", os.path.join(SCRIPTS, script), APP], env=env, capture_output=True, text=True, timeout=20)
    assert proc.returncode == 2
    assert proc.stderr.startswith("nlevel-slurm: error: not inside a Slurm job; submit with: sbatch"), proc.stderr
    assert len(proc.stderr.splitlines()) == 1


@pytest.mark.timeout(60)
def test_resume_script_forwards_usr1_to_the_launcher_and_requeues_on_75(tmp_path):
    """The shell side of resume.sbatch, with a stand-in mpirun: no Slurm needed."""
    started = tmp_path / "started"
    fake = tmp_path / "fake-mpirun"
    fake.write_text(
        "#!/bin/bash\n"
        # (the trap before the file that says it started: a USR1 sent in between killed this
        # stand-in, and its sleep held the pipe open past the test's timeout: CI at 63cf3e9)
        "trap 'echo \"launcher got USR1\"; kill $!; exit 75' USR1\n"
        "sleep 30 &\n"
        f'echo "launched: $*" > {started}\n'
        "wait\n"
    )
    fake.chmod(0o755)
    # A stand-in scontrol that refuses the requeue (as a site with JobRequeue=0 does).
    (tmp_path / "bin").mkdir()
    requeued = tmp_path / "requeued"
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.write_text(f'#!/bin/bash\necho "$*" > {requeued}\nexit 1\n')
    scontrol.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(SLURM_JOB_ID="4242", SLURM_NTASKS="4", SLURM_JOB_NODELIST="node1", VENV=os.path.dirname(BIN),
               MPIRUN=str(fake), PATH=str(tmp_path / "bin") + os.pathsep + env["PATH"])
    proc = subprocess.Popen(["bash", os.path.join(SCRIPTS, "resume.sbatch"), APP, "--n", "10"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert started.exists(), proc.communicate(timeout=10)
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert started.read_text().strip() == f"launched: python -m nlevel.run --checkpoint nlevel.h5 {APP} --n 10"
    assert "launcher got USR1" in out
    assert "stopped before the time limit, checkpoint written; requeueing job 4242" in out
    assert requeued.read_text().strip() == "requeue 4242"
    assert err.strip().splitlines()[-1] == "nlevel-slurm: error: scontrol requeue failed; resubmit this script to resume"
    assert proc.returncode == 75
