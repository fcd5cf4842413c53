"""``python -m nlevel.testing.cluster COMMAND``: the emulated cluster's command line (see the package)."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from typing import Sequence

from . import BRIDGE, DEFAULT_DIR, DEFAULT_SUBNET, DIR_VAR, Cluster, ClusterError, _alive, _dir, down, load, stale, up
from . import __doc__ as cluster_doc

__all__ = ["main", "status_text"]


def status_text(cluster: Cluster) -> str:
    """The nodes, their links and processes, one line each."""
    lines = [f"cluster in {cluster.where}: {len(cluster.nodes)} nodes on {BRIDGE} ({cluster.subnet}.0/24)"
             + (f", owned by pid {cluster.owner}" if cluster.owner and _alive(cluster.owner) else "")]
    for n in cluster.nodes:
        try:
            with open(f"/sys/class/net/{n.link}/operstate") as f:
                link = f.read().strip()
        except OSError:
            link = "missing"
        state = "up" if _alive(n.keeper) else "DEAD (keeper gone: run `up` again)"
        procs = cluster.pids(n)
        stopped = sum(1 for p in procs if _state(p) == "T")
        lines.append(f"  {n.name:8} {n.address:15} node {state}, link {link}, {len(procs)} processes"
                     + (f" ({stopped} stopped)" if stopped else ""))
    return "\n".join(lines)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return "?"


def _need(where: str | None) -> Cluster:
    cluster = load(where)
    if cluster is None:
        raise ClusterError(f"no cluster in {_dir(where)}: start one with `python -m nlevel.testing.cluster up`")
    return cluster


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m nlevel.testing.cluster COMMAND``; returns the exit status (2: bad input or no cluster)."""
    p = argparse.ArgumentParser(prog="python -m nlevel.testing.cluster", description=(cluster_doc or "").split("\n\n")[0])
    p.add_argument("--dir", help=f"the state directory (default ${DIR_VAR} or {DEFAULT_DIR})")
    sub = p.add_subparsers(dest="command", required=True)
    u = sub.add_parser("up", help="make a fresh cluster (a previous or stale one is removed)")
    u.add_argument("--nodes", type=int, default=3)
    u.add_argument("--subnet", default=DEFAULT_SUBNET, help="first three numbers of a private /24")
    d = sub.add_parser("down", help="remove the cluster, its processes, namespaces and links")
    d.add_argument("--force", action="store_true", help="even if a running test session owns it")
    sub.add_parser("status", help="the nodes, their links and processes")
    e = sub.add_parser("exec", help="run a command on a node")
    e.add_argument("node")
    e.add_argument("cmd", nargs=argparse.REMAINDER)
    for name, what in (("kill", "SIGKILL every process of a node"), ("freeze", "SIGSTOP every process of a node"),
                       ("thaw", "SIGCONT every process of a node"), ("cut", "take a node's link down"),
                       ("mend", "bring a node's link up"), ("pids", "list a node's processes")):
        sub.add_parser(name, help=what).add_argument("node")
    m = sub.add_parser("mpiexec", help="run nlevel-mpiexec across the nodes, from the first node")
    m.add_argument("--per-node", type=int, default=2, help="ranks per node (default 2)")
    m.add_argument("--nodes", help="comma-separated node names (default all)")
    m.add_argument("--plain", action="store_true", help="the venv's mpiexec, not nlevel-mpiexec")
    m.add_argument("args", nargs=argparse.REMAINDER, help="mpiexec options and the program (after --)")
    sl = sub.add_parser("slurm", help="Slurm across the nodes: slurmctld on the first, a slurmd on each")
    sl.add_argument("action", choices=("up", "down", "status"))
    a = sub.add_parser("args", help="print the mpiexec options for the cluster")
    a.add_argument("--per-node", type=int, default=2)
    a.add_argument("--nodes")
    ns = p.parse_args(argv)
    try:
        if ns.command == "up":
            print(status_text(up(ns.nodes, ns.dir, ns.subnet)))
            return 0
        if ns.command == "down":
            removed = down(ns.dir, force=ns.force)
            print("removed: " + ", ".join(removed) if removed else "no cluster")
            return 0
        cluster = _need(ns.dir)
        if ns.command == "status":
            print(status_text(cluster))
            return 0 if not stale(cluster) else 1
        if ns.command in ("exec", "mpiexec"):
            rest = list(ns.cmd if ns.command == "exec" else ns.args)
            if rest[:1] == ["--"]:
                rest = rest[1:]
            if not rest:
                raise ClusterError(f"{ns.command}: no command given")
            if ns.command == "exec":
                cmd = [*cluster.enter(ns.node), *rest]
            else:
                nodes = ns.nodes.split(",") if ns.nodes else None
                cmd = cluster.mpiexec(rest, ns.per_node, nodes, plain=ns.plain)
            sys.stdout.flush()
            return subprocess.call(cmd)
        if ns.command == "slurm":
            from . import slurm

            if ns.action == "up":
                print(f"SLURM_CONF={slurm.up(cluster)} (clients run on a node: "
                      f"python -m nlevel.testing.cluster exec node1 env SLURM_CONF=... sinfo -N)")
            elif ns.action == "down":
                stopped = slurm.down(cluster)
                print("stopped: " + ", ".join(stopped) if stopped else "no Slurm daemon was running")
            else:
                ok = slurm.running(cluster)
                print(f"Slurm on the cluster: {'running' if ok else 'not running'} (SLURM_CONF={slurm.conf_path(cluster)})")
                return 0 if ok else 1
            return 0
        if ns.command == "args":
            print(shlex.join(cluster.mpiexec_args(ns.per_node, ns.nodes.split(",") if ns.nodes else None)))
            return 0
        node = cluster.node(ns.node)
        if ns.command == "pids":
            print(" ".join(map(str, cluster.pids(node))))
        elif ns.command == "cut":
            cluster.cut(node)
        elif ns.command == "mend":
            cluster.mend(node)
        else:
            done = {"kill": cluster.kill, "freeze": cluster.freeze, "thaw": cluster.thaw}[ns.command](node)
            print(f"{ns.command}: {node.name}: {len(done)} processes" + (f" ({' '.join(map(str, done))})" if done else ""))
        return 0
    except ClusterError as exc:
        print(f"cluster: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
