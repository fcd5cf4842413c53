"""An emulated cluster on one Linux machine: N "nodes" as namespaces on a bridge, Open MPI across them.

Each node is a network namespace (``nlc-node1`` ...) joined to a Linux bridge (``nlc-br``)
by a veth pair (host side ``nlc-node1``, node side ``eth0``, address ``10.77.0.<i>/24``),
plus a UTS namespace (its own host name, ``node1``) and a mount namespace (the cluster's
``/etc/hosts`` bound over the machine's, which is never written; a ``/dev/shm`` of its own,
as a real node has). A small keeper process (``sleep infinity``) holds each node's
namespaces; every process started on the node joins them with ``nsenter -t KEEPER``. The file
systems are otherwise shared, like a cluster's shared home: a checkpoint written on one node
is read on another. There is no PID namespace: a node's processes are found by their network
namespace (as ``ip netns pids`` finds them), and the tests read ``/proc`` as usual.

Open MPI starts its daemons (``prted``) on the other nodes through a *launch agent* in place of
ssh: PRRTE runs ``AGENT [options] HOST COMMAND`` (``--prtemca plm_ssh_agent``), and the
agent runs COMMAND in HOST's namespaces with a login-like environment (ssh forwards none of
the caller's). ``mpiexec`` itself runs on the first node, as on a real allocation where
``mpirun`` runs on its first node: losing that node loses the job's launcher.

Command line (root; the state lives in ``/run/nlevel-cluster``, or ``$NLEVEL_CLUSTER_DIR``)::

    python -m nlevel.testing.cluster up --nodes 3     # (again: a fresh cluster; a stale one is removed)
    python -m nlevel.testing.cluster status
    python -m nlevel.testing.cluster exec node2 hostname
    python -m nlevel.testing.cluster mpiexec --per-node 2 -- --with-ft ulfm python -m nlevel.run --tasks 600
    python -m nlevel.testing.cluster kill node3       # SIGKILL every process of the node (its prted too)
    python -m nlevel.testing.cluster freeze node3     # SIGSTOP them; thaw: SIGCONT
    python -m nlevel.testing.cluster cut node3        # its link down; mend: up again
    python -m nlevel.testing.cluster down

``mpiexec`` runs ``nlevel-mpiexec`` (``--plain``: the venv's ``mpiexec``) on the first node with
the options of :meth:`Cluster.mpiexec_args`. Nothing here imports MPI.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

__all__ = [
    "DIR_VAR", "DEFAULT_DIR", "PREFIX", "ClusterError", "Node", "Cluster",
    "unavailable", "up", "down", "load", "stale",
]

#: The environment variable naming the cluster's state directory.
DIR_VAR = "NLEVEL_CLUSTER_DIR"
DEFAULT_DIR = "/run/nlevel-cluster"
#: Every network namespace and link the cluster makes starts with this (``down`` removes them all).
PREFIX = "nlc-"
BRIDGE = PREFIX + "br"
DEFAULT_SUBNET = "10.77.0"  # /24: node i is .i
_TOOLS = ("ip", "nsenter", "unshare", "setsid", "mount", "hostname", "sleep")


class ClusterError(RuntimeError):
    """The cluster cannot be made or used; the message is one line saying why."""


@dataclass(frozen=True)
class Node:
    """One emulated node: its host name, address, network namespace, host-side link and keeper's pid."""

    name: str
    address: str
    netns: str
    link: str
    keeper: int


def unavailable() -> str | None:
    """Why no cluster can be made here (one line), or None when it can."""
    if not sys.platform.startswith("linux"):
        return f"the emulated cluster needs Linux namespaces; this is {sys.platform}"
    if os.geteuid() != 0:
        return f"the emulated cluster needs root (network namespaces, a bridge); running as uid {os.geteuid()}"
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        return f"the emulated cluster needs {', '.join(missing)} (iproute2, util-linux) on PATH"
    try:
        probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True,
                               text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create namespaces: {exc}"
    if probe.returncode:
        return f"cannot create namespaces: {probe.stderr.strip() or 'unshare exited ' + str(probe.returncode)}"
    return None


def _dir(where: str | None) -> str:
    return where or os.environ.get(DIR_VAR) or DEFAULT_DIR


def _run(cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)
    if check and proc.returncode:
        raise ClusterError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip() or 'exit ' + str(proc.returncode)}")
    return proc


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


class Cluster:
    """A running emulated cluster, read from its state directory (:func:`load`, :func:`up`)."""

    def __init__(self, where: str, nodes: Sequence[Node], subnet: str, owner: int | None) -> None:
        self.where = where
        self.nodes = list(nodes)
        self.subnet = subnet
        self.owner = owner

    # ------------------------------------------------------------ naming and entering

    @property
    def agent(self) -> str:
        """The launch agent for PRRTE (``--prtemca plm_ssh_agent``)."""
        return os.path.join(self.where, "agent")

    @property
    def enter_script(self) -> str:
        """``ENTER NODE COMMAND...`` runs COMMAND on NODE (in the current directory, with this environment)."""
        return os.path.join(self.where, "enter")

    @property
    def head(self) -> Node:
        """The node ``mpiexec`` runs on (the first)."""
        return self.nodes[0]

    def node(self, name: str | int) -> Node:
        """The node called ``name`` (``node2``, or its number ``2``).

        Raises:
            ClusterError: no such node.
        """
        text = str(name)
        for n in self.nodes:
            if text in (n.name, n.name[len("node"):], n.netns, n.address):
                return n
        raise ClusterError(f"no node {text!r} in the cluster; its nodes are {', '.join(n.name for n in self.nodes)}")

    def enter(self, node: str | int | Node) -> list[str]:
        """The argument list that runs a command (appended) on ``node``."""
        n = node if isinstance(node, Node) else self.node(node)
        return [self.enter_script, n.name]

    def exec(self, node: str | int | Node, cmd: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` on ``node`` and wait (``subprocess.run`` with ``capture_output`` and ``text``)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run([*self.enter(node), *cmd], **kwargs)  # type: ignore[call-overload]

    # ------------------------------------------------------------ faults

    def pids(self, node: str | int | Node) -> list[int]:
        """Every process of ``node`` but its keeper: those in its network namespace."""
        n = node if isinstance(node, Node) else self.node(node)
        return [p for p in _netns_pids(n.netns) if p != n.keeper]

    def signal(self, node: str | int | Node, sig: int) -> list[int]:
        """Send ``sig`` to every process of ``node`` (its keeper spared), sweeping until no new one
        appears (a process may start children meanwhile). Returns the pids signalled."""
        done: list[int] = []
        for _ in range(20):
            fresh = [p for p in self.pids(node) if p not in done]
            if not fresh:
                break
            for pid in fresh:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            done += fresh
        return done

    def kill(self, node: str | int | Node, wait: float = 10.0) -> list[int]:
        """SIGKILL every process of ``node`` (its ``prted`` and ranks: the node crashes), and wait
        until they are gone. The node stays up: new processes can be started on it."""
        done = self.signal(node, signal.SIGKILL)
        end = time.monotonic() + wait
        while any(_alive(p) for p in done) and time.monotonic() < end:
            time.sleep(0.02)
        return done

    def freeze(self, node: str | int | Node) -> list[int]:
        """SIGSTOP every process of ``node``: a node that hangs (its TCP connections stay open)."""
        return self.signal(node, signal.SIGSTOP)

    def thaw(self, node: str | int | Node) -> list[int]:
        """SIGCONT every process of ``node``."""
        return self.signal(node, signal.SIGCONT)

    def cut(self, node: str | int | Node) -> None:
        """Take ``node``'s link down: its processes run on and reach nobody (nothing is refused: packets are lost)."""
        n = node if isinstance(node, Node) else self.node(node)
        _run(["ip", "link", "set", n.link, "down"])

    def mend(self, node: str | int | Node) -> None:
        """Bring ``node``'s link up again."""
        n = node if isinstance(node, Node) else self.node(node)
        _run(["ip", "link", "set", n.link, "up"])

    # ------------------------------------------------------------ MPI across the nodes

    def mpiexec_args(self, per_node: int = 2, nodes: Sequence[str | int] | None = None) -> list[str]:
        """Open MPI's ``mpiexec`` options that run ``per_node`` ranks on each node (every node, or
        ``nodes``): the host list, the launch agent, and TCP on the cluster's subnet only."""
        if per_node < 1:
            raise ClusterError(f"ranks per node must be >= 1, got {per_node}")
        chosen = [self.node(n) for n in nodes] if nodes else self.nodes
        net = f"{self.subnet}.0/24"
        return [
            "--host", ",".join(f"{n.name}:{per_node}" for n in chosen),
            "--prtemca", "plm_ssh_agent", self.agent,
            # (each daemon started from the launcher: no daemon calls the agent on another node)
            "--prtemca", "plm_ssh_no_tree_spawn", "1",
            "--prtemca", "oob_tcp_if_include", net,
            "--mca", "btl", "tcp,self",
            "--mca", "btl_tcp_if_include", net,
            # (no UCX device here: the wheel's osc/ucx prints an error at every window's creation)
            "--mca", "osc", "^ucx",
        ]

    def mpiexec(self, args: Sequence[str], per_node: int = 2, nodes: Sequence[str | int] | None = None,
                plain: bool = False, python: str | None = None, env: Mapping[str, str] | None = None) -> list[str]:
        """The command that runs ``nlevel-mpiexec`` (``plain``: the venv's ``mpiexec``) on the head node
        across the nodes, with ``args`` (mpiexec options, then the program) after the cluster's options.
        ``PYTHONPATH``, when set in ``env`` (the command's environment, default this process's), is
        passed on to every rank (``-x``): the daemons, started as ssh would start them, pass none of
        the caller's environment on (the other nodes' ranks would import another copy of nlevel)."""
        python = python or sys.executable
        forward = ["-x", "PYTHONPATH"] if (os.environ if env is None else env).get("PYTHONPATH") else []
        if plain:
            launcher = [os.path.join(os.path.dirname(python), "mpiexec")]
        else:
            launcher = [python, "-m", "nlevel.runtime.launch"]
        return [*self.enter(self.head), *launcher, *self.mpiexec_args(per_node, nodes), *forward, *args]

    def to_json(self) -> dict[str, object]:
        return {"subnet": self.subnet, "owner": self.owner,
                "nodes": [n.__dict__ for n in self.nodes]}


# ---------------------------------------------------------------- discovery

def _netns_pids(netns: str) -> list[int]:
    """The pids of every process in network namespace ``netns`` (``ip netns pids``, without a fork)."""
    try:
        st = os.stat(f"/run/netns/{netns}")
    except OSError:
        return []
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            ns = os.stat(f"/proc/{name}/ns/net")
        except OSError:
            continue
        if (ns.st_ino, ns.st_dev) == (st.st_ino, st.st_dev):
            out.append(int(name))
    return out


def _ours(kind: str) -> list[str]:
    """Our network namespaces (``netns``) or links (``link``), found by the prefix."""
    if kind == "netns":
        try:
            return sorted(n for n in os.listdir("/run/netns") if n.startswith(PREFIX))
        except OSError:
            return []
    try:
        return sorted(n for n in os.listdir("/sys/class/net") if n.startswith(PREFIX))
    except OSError:
        return []


def load(where: str | None = None) -> Cluster | None:
    """The cluster whose state is in ``where`` (default ``$NLEVEL_CLUSTER_DIR`` or /run/nlevel-cluster),
    or None when there is none."""
    where = _dir(where)
    try:
        with open(os.path.join(where, "state.json")) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    nodes = [Node(**n) for n in data["nodes"]]
    return Cluster(where, nodes, data["subnet"], data.get("owner"))


def stale(cluster: Cluster | None) -> bool:
    """Whether a cluster's state is incomplete (a keeper or namespace gone): only good for removal."""
    if cluster is None:
        return bool(_ours("netns") or _ours("link"))
    return any(not _alive(n.keeper) or not os.path.exists(f"/run/netns/{n.netns}") for n in cluster.nodes)


# ---------------------------------------------------------------- up and down

_ENTER = """#!/bin/sh
# ENTER NODE COMMAND...: run COMMAND on an emulated node of the cluster in {where}
# (its network, host name and mount namespaces, held by the node's keeper process).
node=$1; shift
pid=$(cat "{where}/$node.pid" 2>/dev/null) || {{ echo "enter: no node '$node' in the cluster in {where}" >&2; exit 255; }}
exec nsenter -t "$pid" --net --uts --mount --wd="$PWD" -- "$@"
"""

_AGENT = """#!/bin/sh
# PRRTE's launch agent for the emulated cluster in {where} (--prtemca plm_ssh_agent):
# called as `AGENT [ssh options] HOST COMMAND`, runs COMMAND through a shell on HOST with a
# login-like environment (ssh forwards none of the caller's variables). Like an ssh client,
# the agent itself stays where it was started (the launcher's node) until COMMAND ends, and
# exits 255 when COMMAND is killed (a node lost under it), as ssh does when its link drops.
while [ $# -gt 0 ]; do
  case "$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;  # (ssh options that take a value)
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
"{where}/enter" "$host" env -i HOME="${{HOME:-/root}}" USER="${{USER:-root}}" LOGNAME="${{LOGNAME:-root}}" \\
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/sh -c "$*"
status=$?
[ "$status" -gt 128 ] && exit 255
exit "$status"
"""

# The keeper: a node's first process. It makes the node's host name, hosts file and /dev/shm,
# writes its pid, and sleeps while the node lives.
_KEEPER = """set -e
hostname "$1"
mount --bind "$2/hosts" /etc/hosts
mount -t tmpfs -o mode=1777 nlc-shm /dev/shm
echo $$ > "$2/$1.pid.new"
mv "$2/$1.pid.new" "$2/$1.pid"
exec sleep infinity
"""


def up(nodes: int = 3, where: str | None = None, subnet: str = DEFAULT_SUBNET, owner: int | None = None) -> Cluster:
    """Make a cluster of ``nodes`` nodes (a stale or previous one is removed first) and return it.

    Args:
        nodes: How many nodes (1 to 250).
        where: The state directory (default ``$NLEVEL_CLUSTER_DIR`` or /run/nlevel-cluster).
        subnet: The first three numbers of the private /24 the nodes get addresses in.
        owner: A process that owns the cluster while it lives (a test session): no other ``up``
            or ``down`` removes it meanwhile, unless forced.

    Raises:
        ClusterError: when namespaces cannot be made here, the subnet is in use, or a live
            owner holds the cluster.
    """
    if not 1 <= nodes <= 250:
        raise ClusterError(f"nodes must be between 1 and 250, got {nodes}")
    parts = subnet.split(".")
    if len(parts) != 3 or not all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
        raise ClusterError(f"subnet must be the first three numbers of an IPv4 /24 (like 10.77.0), got {subnet!r}")
    reason = unavailable()
    if reason:
        raise ClusterError(reason)
    where = _dir(where)
    down(where, owner=owner)
    used = _run(["ip", "-o", "-4", "addr", "show"]).stdout
    if f" {subnet}." in used:
        raise ClusterError(f"the subnet {subnet}.0/24 is already used on this machine: choose another (--subnet)")
    os.makedirs(where, mode=0o755, exist_ok=True)
    names = [f"node{i}" for i in range(1, nodes + 1)]
    with open(os.path.join(where, "hosts"), "w") as f:
        f.write("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n")
        f.writelines(f"{subnet}.{i} {name}\n" for i, name in enumerate(names, 1))
    for name, text in (("enter", _ENTER), ("agent", _AGENT)):
        path = os.path.join(where, name)
        with open(path, "w") as f:
            f.write(text.format(where=where))
        os.chmod(path, 0o755)
    made: list[Node] = []
    try:
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        _run(["ip", "link", "set", BRIDGE, "up"])
        for i, name in enumerate(names, 1):
            netns, link, address = PREFIX + name, PREFIX + name, f"{subnet}.{i}"
            _run(["ip", "netns", "add", netns])
            _run(["ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", netns])
            _run(["ip", "link", "set", link, "master", BRIDGE, "up"])
            _run(["ip", "-n", netns, "addr", "add", f"{address}/24", "dev", "eth0"])
            _run(["ip", "-n", netns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", netns, "link", "set", "lo", "up"])
            made.append(Node(name, address, netns, link, _start_keeper(where, name, netns)))
        cluster = Cluster(where, made, subnet, owner)
        tmp = os.path.join(where, "state.json.new")
        with open(tmp, "w") as f:
            json.dump(cluster.to_json(), f, indent=1)
        os.replace(tmp, os.path.join(where, "state.json"))
    except BaseException:
        down(where, force=True)
        raise
    _wait_reachable(cluster)
    return cluster


def _start_keeper(where: str, name: str, netns: str) -> int:
    pidfile = os.path.join(where, f"{name}.pid")
    if os.path.exists(pidfile):
        os.unlink(pidfile)
    # setsid -f: the keeper leaves this process's session and is nobody's child here (no zombie
    # waits for us when it is killed, and a test's session kill does not end the node).
    log = os.path.join(where, f"{name}.log")
    with open(log, "w") as err:  # (a file, not a pipe: the keeper keeps its stderr open for ever)
        subprocess.run(
            ["setsid", "-f", "nsenter", f"--net=/run/netns/{netns}", "--", "unshare", "--uts", "--mount",
             "--propagation", "private", "--", "sh", "-c", _KEEPER, "keeper", name, where],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, timeout=30)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            with open(pidfile) as f:
                return int(f.read())
        except (OSError, ValueError):
            time.sleep(0.02)
    with open(log) as f:
        said = " ".join(f.read().split())
    raise ClusterError(f"node {name} did not start within 10 s: {said or 'no pid file ' + pidfile}")


def _wait_reachable(cluster: Cluster, timeout: float = 20.0) -> None:
    """Wait until the head node reaches every node's address (a bridge port learns for a moment)."""
    probe = ("import socket,sys\n"
             "s=socket.socket(); s.settimeout(1)\n"
             "try: s.connect((sys.argv[1], 9))\n"
             "except ConnectionRefusedError: pass\n")  # (refused = the node answered)
    end = time.monotonic() + timeout
    for n in cluster.nodes[1:]:
        while True:
            if cluster.exec(cluster.head, [sys.executable, "-c", probe, n.address], timeout=30).returncode == 0:
                break
            if time.monotonic() > end:
                raise ClusterError(f"node {n.name} ({n.address}) is not reachable from {cluster.head.name}")
            time.sleep(0.1)


def down(where: str | None = None, force: bool = False, owner: int | None = None) -> list[str]:
    """Remove the cluster: kill every process of its nodes, delete its namespaces, links and
    state. Also removes what a killed run left (found by the ``nlc-`` prefix). Idempotent.

    Args:
        force: Remove it even if a live process other than ``owner`` owns it.
        owner: The caller's own claim (:func:`up`'s ``owner``).

    Returns:
        What was removed, for the log.

    Raises:
        ClusterError: a live process other than ``owner`` owns the cluster (and not ``force``).
    """
    where = _dir(where)
    cluster = load(where)
    if (cluster is not None and not force and cluster.owner and cluster.owner != owner
            and cluster.owner != os.getpid() and _alive(cluster.owner)):
        raise ClusterError(f"the cluster in {where} belongs to a running process (pid {cluster.owner}); "
                           f"`python -m nlevel.testing.cluster down --force` removes it anyway")
    removed: list[str] = []
    for netns in _ours("netns"):
        for _ in range(20):  # (SIGKILL, then wait: a namespace with processes in it outlives its name)
            pids = _netns_pids(netns)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        _run(["ip", "netns", "del", netns], check=False)
        removed.append(f"netns {netns}")
    for link in _ours("link"):
        _run(["ip", "link", "del", link], check=False)
        removed.append(f"link {link}")
    end = time.monotonic() + 10  # (a deleted namespace's veth ends go asynchronously)
    while _ours("link") and time.monotonic() < end:
        time.sleep(0.05)
    if os.path.isdir(where) and os.path.exists(os.path.join(where, "enter")):
        shutil.rmtree(where, ignore_errors=True)
        removed.append(f"state {where}")
    return removed
