"""slurm/'s batch scripts on a Slurm that spans the emulated nodes (nlevel.testing.cluster.slurm).

slurmctld runs on node1 and one slurmd on each node, in the node's namespaces (its own host name
and address): ``sbatch -N 3`` gives the job three "machines", and mpirun in the batch script
starts its daemons on node2 and node3 through ``srun``. Jobs are submitted from node1 (the nodes'
addresses are reachable only from the nodes), with the environment a user's shell would pass on.

The packages come from ``.ci/slurm install`` (Debian's slurm-wlm and munge); where they cannot be
installed the tests are skipped with the reason, or fail under ``NLEVEL_REQUIRE_SLURM=1`` or
``NLEVEL_REQUIRE_CLUSTER=1`` (.ci/run sets both).
"""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from nlevel.testing.cluster import ClusterError
from nlevel.testing.cluster import slurm as cluster_slurm

from ..conftest import BIN, ROOT
from ..e2e.test_cli import completed_ids

SCRIPTS = os.path.join(ROOT, "slurm")
APP = "tests.apps.where_app"
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED"}


def _required() -> bool:
    return any(os.environ.get(v) == "1" for v in ("NLEVEL_REQUIRE_SLURM", "NLEVEL_REQUIRE_CLUSTER")) \
        or os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="module")
def slurm(cluster):
    """Slurm on the cluster's nodes, started for this module and stopped after it."""
    if cluster_slurm.unavailable() is not None:
        try:
            subprocess.run([os.path.join(ROOT, ".ci", "slurm"), "install"], capture_output=True, text=True,
                           timeout=900)
        except subprocess.TimeoutExpired:
            pass
    try:
        conf = cluster_slurm.up(cluster)
    except ClusterError as exc:
        if _required():
            pytest.fail(f"Slurm across the emulated nodes cannot run: {exc}", pytrace=False)
        pytest.skip(f"no Slurm across the emulated nodes: {exc}")
    yield conf
    cluster_slurm.down(cluster)


@pytest.fixture
def job_env(slurm, tmp_path):
    """What a user's shell passes to sbatch (sbatch exports it into the job)."""
    (tmp_path / "logs").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SBATCH_", "SLURM_"))}
    env.update(
        SLURM_CONF=slurm,
        VENV=os.path.dirname(BIN),
        PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""),
        NLEVEL_TTY="0",
        NLEVEL_TEST_LOG_DIR=str(tmp_path / "logs"),
        # This machine, not the scripts: root, three "nodes" of two ranks on two cores, no UCX device.
        OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        PRTE_ALLOW_RUN_AS_ROOT="1", PRTE_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        PRTE_MCA_hwloc_default_binding_policy="none", OMPI_MCA_mpi_yield_when_idle="1", OMPI_MCA_osc="^ucx",
    )
    return env


def sbatch(cluster, script, args, tmp_path, env, nodes=3, opts=()):
    """Submit ``slurm/<script>`` from node1 over ``nodes`` nodes, two tasks each; return the job id."""
    cmd = ["sbatch", "--parsable", f"--nodes={nodes}", f"--ntasks={2 * nodes}", f"--chdir={tmp_path}",
           f"--output={tmp_path}/job-%j.out", *opts, os.path.join(SCRIPTS, script), *args]
    out = cluster.exec("node1", cmd, env=env, timeout=60)
    assert out.returncode == 0, f"sbatch failed: {out.stderr}"
    return out.stdout.strip().split(";")[0]


def job_info(cluster, job, env):
    out = cluster.exec("node1", ["scontrol", "-o", "show", "job", job], env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    return dict(re.findall(r"(\w+)=(\S*)", out.stdout))


def wait_job(cluster, job, env, timeout, on_poll=None):
    deadline = time.monotonic() + timeout
    info = {}
    while time.monotonic() < deadline:
        info = job_info(cluster, job, env)
        if info.get("JobState") in FINAL:
            return info
        if on_poll is not None:
            on_poll()
        time.sleep(0.5)
    cluster.exec("node1", ["scancel", job], env=env, timeout=30)
    pytest.fail(f"job {job} did not end in {timeout} s: {info}")


def output(tmp_path, job):
    path = tmp_path / f"job-{job}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def where_ran(tmp_path) -> tuple[dict[int, int], set[tuple[int, str]]]:
    """How often each id ran, and (rank, host) of every rank that ran one (where_app's logs)."""
    runs: dict[int, int] = {}
    ranks = set()
    for path in (tmp_path / "logs").iterdir():
        for line in path.read_text().splitlines():
            task, rank, _, host = line.split()
            runs[int(task)] = runs.get(int(task), 0) + 1
            ranks.add((int(rank), host))
    return runs, ranks


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", ["run.sbatch", "ft.sbatch"])
def test_sbatch_runs_one_job_across_three_nodes(cluster, job_env, tmp_path, script):
    job = sbatch(cluster, script, [APP, "--n", "600", "--report", "r.json"], tmp_path, job_env)
    info = wait_job(cluster, job, job_env, 240)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, output(tmp_path, job)[-3000:])
    assert "on node[1-3]" in output(tmp_path, job)
    assert completed_ids(tmp_path / "nlevel.h5") == set(range(600))
    runs, ranks = where_ran(tmp_path)
    assert set(runs) == set(range(600)) and max(runs.values()) == 1
    # Slurm placed two tasks on each node, in order; each rank ran where it was placed.
    assert {host for _, host in ranks} == {"node1", "node2", "node3"}
    assert all(host == f"node{rank // 2 + 1}" for rank, host in ranks), ranks


@pytest.mark.timeout(420)
def test_under_slurm_a_lost_node_fails_the_job_honestly_and_the_job_on_two_nodes_resumes(cluster, job_env, tmp_path):
    """node3 crashes (every process, its slurmd too) under ft.sbatch: PRRTE ends the whole job and its
    mpirun returns 0; the script's launcher (nlevel-mpiexec) makes that a failure, so Slurm does not say
    COMPLETED. The same script on two nodes resumes from the checkpoint and finishes."""
    args = [APP, "--n", "6000", "--sleep-ms", "3", "--report", "r.json", "--checkpoint-interval", "0.5"]
    job = sbatch(cluster, "ft.sbatch", args, tmp_path, job_env)
    log = tmp_path / "logs" / "exec-4.log"  # (node3's first rank)
    lost: list[float] = []

    def crash_node3():
        if not lost and log.exists() and len(log.read_text().splitlines()) >= 300:
            cluster.kill("node3")
            lost.append(time.monotonic())

    try:
        info = wait_job(cluster, job, job_env, 240, on_poll=crash_node3)
        assert lost, f"the job ended before node3 could be lost: {info}\n{output(tmp_path, job)[-3000:]}"
        took = time.monotonic() - lost[0]
        assert info["JobState"] != "COMPLETED" and info["ExitCode"] != "0:0", (info, output(tmp_path, job)[-3000:])
        assert "nlevel-mpiexec: every process of the job ended before the job did" in output(tmp_path, job)
        # Slurm itself waits SlurmdTimeout (30 s here) for node3's slurmd before it ends the job.
        assert took < 90, took
        done = completed_ids(tmp_path / "nlevel.h5") if (tmp_path / "nlevel.h5").exists() else set()
        assert len(done) < 6000
        again = sbatch(cluster, "ft.sbatch", args, tmp_path, job_env, nodes=2, opts=["--exclude=node3"])
        info = wait_job(cluster, again, job_env, 240)
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, output(tmp_path, again)[-3000:])
        assert "on node[1-2]" in output(tmp_path, again)
        assert completed_ids(tmp_path / "nlevel.h5") == set(range(6000))
        runs, _ = where_ran(tmp_path)
        assert set(runs) == set(range(6000))
    finally:
        cluster_slurm.up(cluster)  # (node3's slurmd again, for whatever runs next)
