"""Slurm across the emulated nodes: ``slurmctld`` on the first node, one ``slurmd`` per node.

Each ``slurmd`` runs in its node's namespaces, so it has the node's host name (its
``NodeName``) and address, and the jobs it starts run there: ``sbatch -N 3`` spans three
"machines", and Open MPI's ``mpirun`` in the batch script starts its daemons on the other nodes
with ``srun`` (PRRTE's plm/slurm), as on a real allocation. Authentication is a ``munged`` of
the cluster's own (its own key and socket, under the cluster's state directory): a host's
munge and a one-node test Slurm (``.ci/slurm``) are left alone. Clients run on a node (the
nodes' addresses are reachable only from the nodes) with ``SLURM_CONF`` set::

    python -m nlevel.testing.cluster slurm up        # (the cluster must be up; again: restarts what is down)
    python -m nlevel.testing.cluster exec node1 env SLURM_CONF=/run/nlevel-cluster/slurm/slurm.conf sinfo -N
    python -m nlevel.testing.cluster slurm down

The packages (Debian's ``slurm-wlm`` and ``munge``) are installed by ``.ci/slurm install``.
Nothing here imports MPI.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

from . import Cluster, ClusterError, _alive

__all__ = ["TOOLS", "unavailable", "conf_path", "up", "down", "running", "env"]

#: The programs the Slurm of the cluster needs (Debian: slurm-wlm, munge).
TOOLS = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "munged", "mungekey")
PORT = 6817  # slurmctld's; slurmd's is PORT + 1 (on each node's own address)


def unavailable() -> str | None:
    """Why Slurm cannot run on the cluster here (one line), or None."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return (f"Slurm across the emulated nodes needs {', '.join(missing)} (Debian's slurm-wlm and munge: "
                f"`.ci/slurm install`)")
    return None


def _dir(cluster: Cluster) -> str:
    return os.path.join(cluster.where, "slurm")


def conf_path(cluster: Cluster) -> str:
    """The cluster's ``slurm.conf`` (clients need ``SLURM_CONF`` set to it)."""
    return os.path.join(_dir(cluster), "slurm.conf")


def env(cluster: Cluster, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``SLURM_CONF`` for the cluster's Slurm."""
    out = dict(os.environ if base is None else base)
    out["SLURM_CONF"] = conf_path(cluster)
    return out


def _conf(cluster: Cluster, where: str) -> str:
    nodes = "\n".join(f"NodeName={n.name} NodeAddr={n.address} CPUs={os.cpu_count() or 1} RealMemory=1000 "
                      f"State=UNKNOWN" for n in cluster.nodes)
    head = cluster.head
    return f"""# Slurm across the emulated cluster, written by nlevel.testing.cluster.slurm.
ClusterName=nlevel-cluster
SlurmctldHost={head.name}({head.address})
SlurmctldPort={PORT}
SlurmdPort={PORT + 1}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# The cluster's own munged; a requeued job waits cred_expire seconds before it starts again.
AuthInfo=socket={where}/munge/socket,cred_expire=10
StateSaveLocation={where}/state
SlurmdSpoolDir={where}/spool/%n
SlurmctldPidFile={where}/slurmctld.pid
SlurmdPidFile={where}/slurmd-%n.pid
SlurmctldLogFile={where}/slurmctld.log
SlurmdLogFile={where}/slurmd-%n.log
# No cgroups in the emulation: processes are tracked by their parents, nothing is bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
KillWait=10
MinJobAge=3600
InactiveLimit=0
# A node whose slurmd is gone is DOWN after this long (its jobs end as NODE_FAIL meanwhile).
SlurmctldTimeout=30
SlurmdTimeout=30
{nodes}
PartitionName=nodes Nodes={",".join(n.name for n in cluster.nodes)} Default=YES MaxTime=INFINITE State=UP
"""


def _pid(path: str, name: str) -> int | None:
    """The pid in ``path`` if it is a live process called ``name``."""
    try:
        with open(path) as f:
            pid = int(f.read().strip())
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except (OSError, ValueError):
        return None
    return pid if comm == name and _alive(pid) else None


def _daemons(cluster: Cluster) -> dict[str, tuple[str, str, str]]:
    """Every daemon: label -> (node, pid file, program name)."""
    where = _dir(cluster)
    out = {"munged": (cluster.head.name, os.path.join(where, "munge", "munged.pid"), "munged"),
           "slurmctld": (cluster.head.name, os.path.join(where, "slurmctld.pid"), "slurmctld")}
    for n in cluster.nodes:
        out[f"slurmd {n.name}"] = (n.name, os.path.join(where, f"slurmd-{n.name}.pid"), "slurmd")
    return out


def _states(cluster: Cluster) -> dict[str, str]:
    """Each node's state as ``sinfo`` says it, asked on the head node ({} when slurmctld does not answer)."""
    out = cluster.exec(cluster.head, ["sinfo", "-h", "-N", "-o", "%N %T"], env=env(cluster), timeout=30)
    if out.returncode:
        return {}
    return dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)


def running(cluster: Cluster) -> bool:
    """Whether every daemon runs and every node is usable."""
    if any(_pid(pid, name) is None for _, pid, name in _daemons(cluster).values()):
        return False
    states = _states(cluster)
    return len(states) == len(cluster.nodes) and all(
        s.rstrip("*").startswith(("idle", "mixed", "allocated", "completing")) for s in states.values())


def up(cluster: Cluster, wait: float = 60.0) -> str:
    """Start (or restart what is down of) Slurm on the cluster; return the ``slurm.conf`` path.

    Raises:
        ClusterError: the packages are missing, a daemon does not start, or a node is not
            usable within ``wait`` seconds (the message names the log to read).
    """
    reason = unavailable()
    if reason:
        raise ClusterError(reason)
    where = _dir(cluster)
    for sub in ("munge", "state", "spool", *(os.path.join("spool", n.name) for n in cluster.nodes)):
        os.makedirs(os.path.join(where, sub), exist_ok=True)
    os.chmod(where, 0o755)  # (munged checks that its socket's directories are reachable by all)
    os.chmod(os.path.join(where, "munge"), 0o755)
    key = os.path.join(where, "munge", "munge.key")
    if not os.path.exists(key):
        made = subprocess.run(["mungekey", "--create", f"--keyfile={key}"], capture_output=True, text=True, timeout=30)
        if made.returncode:
            raise ClusterError(f"mungekey could not create {key}: {made.stderr.strip()}")
    conf = conf_path(cluster)
    with open(conf + ".new", "w") as f:
        f.write(_conf(cluster, where))
    os.replace(conf + ".new", conf)
    daemons = _daemons(cluster)
    fresh = _pid(daemons["slurmctld"][1], "slurmctld") is None
    commands = {
        "munged": ["munged", f"--socket={where}/munge/socket", f"--key-file={key}",
                   f"--pid-file={where}/munge/munged.pid", f"--log-file={where}/munge/munged.log",
                   f"--seed-file={where}/munge/munged.seed"],
        # (-c: a clean start, no jobs of an earlier cluster)
        "slurmctld": ["slurmctld", *(["-c"] if fresh else []), "-f", conf],
    }
    for label, (node, pid, name) in daemons.items():
        if _pid(pid, name) is not None:
            continue
        cmd = commands.get(label, ["slurmd", "-f", conf])
        out = cluster.exec(node, cmd, env=env(cluster), timeout=60)
        if out.returncode:
            log = os.path.join(where, "munge", "munged.log") if name == "munged" else \
                os.path.join(where, f"{name}{'-' + node if name == 'slurmd' else ''}.log")
            raise ClusterError(f"{label} did not start on {node}: {(out.stderr or out.stdout).strip()[-300:]} "
                               f"(log: {log})")
    end = time.monotonic() + wait
    states: dict[str, str] = {}
    while time.monotonic() < end:
        states = _states(cluster)
        if len(states) == len(cluster.nodes) and all(
                s.rstrip("*").startswith(("idle", "mixed", "allocated")) for s in states.values()):
            return conf
        for node, state in states.items():
            if state.rstrip("*").startswith(("down", "drain")):
                cluster.exec(cluster.head, ["scontrol", "update", f"nodename={node}", "state=resume"],
                             env=env(cluster), timeout=30)
        time.sleep(0.5)
    seen = states or "slurmctld does not answer"
    raise ClusterError(f"the cluster's Slurm nodes are not usable after {wait:g} s ({seen}; logs: "
                       f"{where}/slurmctld.log, {where}/slurmd-NODE.log)")


def down(cluster: Cluster) -> list[str]:
    """Cancel every job and stop every daemon of the cluster's Slurm (by their pid files); returns what was stopped."""
    daemons = _daemons(cluster)
    if _pid(daemons["slurmctld"][1], "slurmctld") is not None:
        cluster.exec(cluster.head, ["scancel", "--full", "--quiet", "--user=root"], env=env(cluster), timeout=30)
    stopped = []
    for label in sorted(daemons, key=lambda k: k == "munged"):  # (munged last: slurmctld talks to it as it ends)
        _, pid_file, name = daemons[label]
        pid = _pid(pid_file, name)
        if pid is None:
            continue
        os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < end:
            time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        stopped.append(label)
    return stopped
