"""What a process may use of its machine: the cores it can run on, and whether ranks outnumber them.

A rank's own CPU affinity can be one core (the launcher bound it there) while the node has
more, so the cores of a node are the union of its ranks' affinities, capped by a CPU quota
(a container's cgroup) and by the batch system's allocation (Slurm's ``SLURM_CPUS_ON_NODE``).
:func:`here` measures one process; :func:`merge` and :func:`placement` combine the ranks'
measurements into what the run report and the end summary say. Files only, no MPI.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

__all__ = ["affinity_mask", "cpu_limit", "here", "merge", "placement", "usable_cores"]


def affinity_mask() -> int:
    """This process's allowed CPUs as a bit mask (bit i: CPU i); all CPUs when the OS does not say."""
    if hasattr(os, "sched_getaffinity"):
        return sum(1 << c for c in os.sched_getaffinity(0))
    return (1 << (os.cpu_count() or 1)) - 1


@functools.lru_cache(maxsize=8)
def _cgroup_quota(root: str = "/sys/fs/cgroup", proc: str = "/proc/self/cgroup") -> float | None:
    """CPUs' worth of this process's cgroup CPU quota (v2 ``cpu.max`` or v1 ``cfs_quota_us``), or None.

    Read once per process (every farm's end asks; a script may run many farms).
    """
    paths = {"": "/"}
    try:
        with open(proc) as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for c in controllers.split(",") if controllers else [""]:
                    paths[c] = path
    except (OSError, ValueError):
        pass
    candidates = [
        (os.path.join(root, paths.get("", "/").lstrip("/"), "cpu.max"), None),  # v2: "max 100000" or "200000 100000"
        (os.path.join(root, "cpu", paths.get("cpu", "/").lstrip("/"), "cpu.cfs_quota_us"), "cpu.cfs_period_us"),
        (os.path.join(root, "cpu,cpuacct", paths.get("cpu", "/").lstrip("/"), "cpu.cfs_quota_us"), "cpu.cfs_period_us"),
    ]
    for path, period_file in candidates:
        try:
            with open(path) as f:
                words = f.read().split()
            if period_file is None:
                quota, period = words[0], words[1] if len(words) > 1 else "100000"
            else:
                with open(os.path.join(os.path.dirname(path), period_file)) as f:
                    period = f.read().strip()
                quota = words[0]
            if quota in ("max", "-1"):
                return None
            return max(float(quota) / float(period), 0.0)
        except (OSError, ValueError, IndexError, ZeroDivisionError):
            continue
    return None


def cpu_limit(environ: Any = None) -> int | None:
    """The most CPUs this process may keep busy at once on its node, beyond its affinity: the cgroup
    quota (rounded up) or Slurm's allocation on the node, whichever is lower; None when neither says."""
    env = os.environ if environ is None else environ
    limits = []
    quota = _cgroup_quota()
    if quota is not None and quota > 0:
        limits.append(max(1, math.ceil(quota - 1e-9)))
    slurm = env.get("SLURM_CPUS_ON_NODE")
    if slurm:
        try:
            limits.append(max(1, int(slurm)))
        except ValueError:
            pass
    return min(limits) if limits else None


def usable_cores() -> int:
    """Cores this process may use: its affinity, capped by :func:`cpu_limit` (what ``nlevel-mpiexec`` counts)."""
    n = bin(affinity_mask()).count("1") or 1
    limit = cpu_limit()
    return min(n, limit) if limit is not None else n


def hostname() -> str:
    """This machine's name, as :func:`socket.gethostname` gives it (read from ``os.uname`` where
    there is one: importing socket cost a farm's first call 3-7 ms)."""
    uname = getattr(os, "uname", None)
    if uname is not None:
        return str(uname().nodename)
    import socket

    return socket.gethostname()


def here() -> dict[str, Any]:
    """This rank's contribution to the placement: ``{host: {"ranks": 1, "mask": affinity, "limit": cap}}``."""
    return {hostname(): {"ranks": 1, "mask": affinity_mask(), "limit": cpu_limit()}}


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Combine two sets of ranks' placements (see :func:`nlevel.roles.ending.merge_places`)."""
    from ..roles.ending import merge_places

    return merge_places(a, b)


def placement(hosts: dict[str, Any]) -> dict[str, Any]:
    """The report's ``placement``: nodes, ranks and cores, and the nodes where ranks outnumber cores."""
    rows = []
    for h, v in sorted(hosts.items()):
        cores = bin(v["mask"]).count("1") or 1
        if v.get("limit") is not None:
            cores = min(cores, v["limit"])
        rows.append({"host": h, "ranks": v["ranks"], "cores": cores})
    return {
        "nodes": len(rows),
        "ranks": sum(r["ranks"] for r in rows),
        "cores": sum(r["cores"] for r in rows),
        "oversubscribed": [r for r in rows if r["ranks"] > r["cores"]],
    }
