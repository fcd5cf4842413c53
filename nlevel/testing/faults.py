"""Find a running nlevel job's rank processes and kill them by role, with real signals.

Nothing here hooks into the library and nothing imports MPI: a job is recognised by a
marker in its environment (``NLEVEL_INJECT_JOB=<id>``, or any ``NAME=VALUE`` the caller
set), each process's rank is read from ``/proc/PID/environ`` (``OMPI_COMM_WORLD_RANK``,
else ``PMIX_RANK`` / ``PMI_RANK``; the launcher has none and is never a victim), and roles
come from the same arithmetic the library uses (:func:`nlevel.model.hierarchy.build`), so the
harness and the library agree on who is master, region-master and slave — also after
failures, where each block is led by its lowest surviving rank.

:func:`inject` waits for a job's ranks and kills victims as a :class:`Schedule` says;
:func:`kill_job` ends a whole job. Launching a job and the command line are in
:mod:`nlevel.testing.inject`, checking a finished run in :mod:`nlevel.testing.audit`.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from nlevel.model.hierarchy import Role, build
from nlevel.model.plan import Plan

__all__ = [
    "MARKER_VAR", "RANK_VARS", "ROLES", "SIGNALS", "Kill", "Schedule",
    "marker_entry", "marked_pids", "find_ranks", "plan_of", "roles", "candidates", "new_leader",
    "committed", "kill", "inject", "kill_job",
]

#: The environment variable the harness sets on a job it launches (value: a job id).
MARKER_VAR = "NLEVEL_INJECT_JOB"
#: Where a rank is read from, first found wins (Open MPI, PMIx, MPICH/Hydra).
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
#: Roles a victim can be chosen by. ``new-leader`` = the rank that leads the previous
#: victim's block once that victim is dead (the first victim is then a region-master).
ROLES = ("slave", "region-master", "master", "new-leader", "any")
SIGNALS = {"KILL": signal.SIGKILL, "STOP": signal.SIGSTOP, "TERM": signal.SIGTERM, "SEGV": signal.SIGSEGV}


def marker_entry(marker: str) -> str:
    """Return the environment entry that marks a job: ``marker`` itself if it is
    ``NAME=VALUE``, else ``NLEVEL_INJECT_JOB=<marker>``."""
    return marker if "=" in marker else f"{MARKER_VAR}={marker}"


# ---------------------------------------------------------------- process discovery

def _environ(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:  # gone, zombie, or not ours to read
        return []


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # comm may hold spaces and parentheses: the fields after the last ')' are fixed.
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def marked_pids(marker: str) -> list[int]:
    """Return every live process whose environment holds the job's marker (launcher included)."""
    entry = marker_entry(marker).encode()
    me = os.getpid()
    return [int(p) for p in os.listdir("/proc")
            if p.isdigit() and int(p) != me and entry in _environ(int(p))]


def find_ranks(marker: str) -> dict[int, int]:
    """Return ``{rank: pid}`` of the job's rank processes.

    A process is a rank when its environment holds the marker and one of
    :data:`RANK_VARS`. When a rank started children (they inherit its environment), the
    one whose parent is not of the same rank is the rank itself.

    Args:
        marker: ``NAME=VALUE`` or a job id (see :func:`marker_entry`).
    """
    entry = marker_entry(marker).encode()
    me = os.getpid()
    by_rank: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == me:
            continue
        env = _environ(int(p))
        if entry not in env:
            continue
        values = dict(e.split(b"=", 1) for e in env if b"=" in e)
        for var in RANK_VARS:
            raw = values.get(var.encode())
            if raw is not None and raw.strip().isdigit():
                by_rank.setdefault(int(raw), []).append(int(p))
                break
    out: dict[int, int] = {}
    for rank, pids in by_rank.items():
        roots = [p for p in pids if _ppid(p) not in pids]
        out[rank] = min(roots or pids)
    return out


# ---------------------------------------------------------------- roles

def plan_of(levels: int, regions: Sequence[int] = ()) -> Plan:
    """Return the :class:`Plan` of ``--levels`` / ``--regions`` (2 levels need no regions)."""
    return Plan(levels=levels, regions=tuple(regions))


def roles(size: int, plan: Plan, failed: frozenset[int] = frozenset()) -> dict[int, str]:
    """Return ``{rank: role}`` of the live ranks (``master``, ``region-master``, ``slave``)
    once ``failed`` are dead, by the library's own rule."""
    h = build(size, plan, failed)
    return {n.rank: n.role.value for n in h.nodes if n.role is not Role.DEAD}


def new_leader(size: int, plan: Plan, victim: int,
               failed: frozenset[int] = frozenset()) -> int | None:
    """Return the rank that leads ``victim``'s block once ``victim`` is dead, or None.

    For the master this is the new master (the lowest survivor); for a region-master, the
    lowest surviving rank of its region; a slave leads nothing (None).
    """
    before = build(size, plan, failed)
    after = build(size, plan, failed | {victim})
    node = before[victim]
    if node.role is Role.MASTER:
        return next((n.rank for n in after.nodes if n.role is Role.MASTER), None)
    if node.role is not Role.REGION or node.parent is None:
        return None
    # The successor becomes a child of the victim's parent in the victim's place.
    fresh = set(after[node.parent].children) - set(before[node.parent].children)
    return min(fresh) if fresh else None


def candidates(size: int, plan: Plan, role: str, failed: frozenset[int] = frozenset()) -> list[int]:
    """Return the live ranks that hold ``role`` once ``failed`` are dead (``any``: all live)."""
    live = roles(size, plan, failed)
    if role == "any":
        return sorted(live)
    if role not in ("slave", "region-master", "master"):
        raise ValueError(f"role must be slave, region-master, master or any; got {role!r}")
    return sorted(r for r, x in live.items() if x == role)


# ---------------------------------------------------------------- killing

@dataclass
class Kill:
    """One signal sent: when (unix time), to whom, and what its role was at that moment."""

    time: float
    rank: int
    pid: int
    role: str
    signal: str
    committed: int | None = None  # committed ids in the checkpoint just before, when known
    note: str = ""


def kill(pid: int, sig: str) -> bool:
    """Send ``SIG<sig>`` to ``pid``; return False when it is already gone."""
    try:
        os.kill(pid, SIGNALS[sig])
        return True
    except ProcessLookupError:
        return False


def committed(checkpoint: str | os.PathLike[str]) -> int | None:
    """Return how many ids the checkpoint records as done, or None while it is unreadable."""
    from nlevel.runtime import checkpoint as ckpt  # h5py: only when a checkpoint trigger is used
    from nlevel.errors import CheckpointError
    try:
        return int(ckpt.read(checkpoint)[2]["n_completed"])
    except (CheckpointError, OSError, KeyError):
        return None


@dataclass
class Schedule:
    """When and whom to kill.

    Attributes:
        role: ``slave``, ``region-master``, ``master``, ``any`` or ``new-leader`` (the first
            victim is then a region-master, or the master if the plan has no region-master,
            and each next victim is the rank that took over the previous one's block).
        count: How many victims. Each is chosen among the holders of ``role`` given the
            earlier victims are dead (so a second ``region-master`` may be the newly elected one).
        signal: ``KILL``, ``STOP``, ``TERM`` or ``SEGV``.
        after: Seconds to wait once every rank is up (or once ``after_committed`` is met).
        after_committed: Wait until the checkpoint records at least this many ids.
        spacing: Seconds between victims.
        then_new_leader: If set, that many seconds after the last victim also kill the rank
            that leads the first victim's block now (the newly elected leader).
        seed: Seed of the random choices (victims among holders of the role).
    """

    role: str = "slave"
    count: int = 1
    signal: str = "KILL"
    after: float = 0.0
    after_committed: int | None = None
    spacing: float = 0.0
    then_new_leader: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}; got {self.role!r}")
        if self.signal not in SIGNALS:
            raise ValueError(f"signal must be one of {', '.join(SIGNALS)}; got {self.signal!r}")
        if self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")
        if self.after < 0 or self.spacing < 0:
            raise ValueError(f"after and spacing must be >= 0, got {self.after}, {self.spacing}")


def _wait_for(cond: Callable[[], bool], timeout: float, alive: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout
    delay = 0.005
    while time.monotonic() < deadline:
        if cond():
            return True
        if not alive():
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return False


def inject(marker: str, size: int, plan: Plan, schedule: Schedule, *,
           checkpoint: str | os.PathLike[str] | None = None, timeout: float = 120.0,
           alive: Callable[[], bool] = lambda: True, dead: frozenset[int] = frozenset(),
           log: Callable[[str], None] = lambda s: None) -> list[Kill]:
    """Wait for the job's ranks, then kill victims as ``schedule`` says.

    Args:
        marker: the job's marker (see :func:`marker_entry`).
        size: the job's number of ranks.
        plan: the job's plan (for roles).
        schedule: when and whom.
        checkpoint: the job's checkpoint (needed by ``schedule.after_committed``).
        timeout: give up (no kill) when the ranks and the trigger are not there within this
            many seconds in all.
        alive: returns False once the job has ended (stops waiting early).
        dead: ranks already dead (an earlier injection): not waited for, roles without them.
        log: receives one line per event.

    Returns:
        The kills made (empty if the job ended or timed out first).

    Raises:
        ValueError: ``after_committed`` without a checkpoint, or as many victims as ranks.
    """
    if schedule.after_committed is not None and checkpoint is None:
        raise ValueError("after_committed needs the job's checkpoint path")
    extra = 1 if schedule.then_new_leader is not None else 0
    if schedule.count + extra + len(dead) >= size:
        raise ValueError(f"{schedule.count + extra} victims of {size - len(dead)} live ranks "
                         f"leaves no survivor")
    rng = random.Random(schedule.seed)
    pids: dict[int, int] = {}
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    def all_up() -> bool:
        pids.update(find_ranks(marker))
        return set(range(size)) - dead <= set(pids)

    if not _wait_for(all_up, left(), alive):
        log(f"inject: only ranks {sorted(pids)} of {size} appeared; no kill")
        return []
    done: int | None = None
    if schedule.after_committed is not None:
        assert checkpoint is not None
        target = schedule.after_committed

        def enough() -> bool:
            nonlocal done
            done = committed(checkpoint)
            return done is not None and done >= target

        if not _wait_for(enough, left(), alive):
            log(f"inject: the checkpoint never reached {target} committed; no kill")
            return []
    if schedule.after and not _wait_for(lambda: False, schedule.after, alive) and not alive():
        return []

    kills: list[Kill] = []
    failed = frozenset(dead)

    def strike(rank: int, role: str, note: str = "") -> None:
        nonlocal failed
        pid = pids.get(rank) or find_ranks(marker).get(rank)
        if pid is None:
            log(f"inject: rank {rank} has no process; skipped")
            return
        at = time.time()
        if kill(pid, schedule.signal):
            kills.append(Kill(at, rank, pid, role, schedule.signal, done, note))
            log(f"inject: SIG{schedule.signal} rank {rank} ({role}, pid {pid}) at {at:.3f}")
        failed = failed | {rank}

    def pick(role: str) -> tuple[int, str] | None:
        if role == "new-leader":
            if kills:
                succ = new_leader(size, plan, kills[-1].rank, failed - {kills[-1].rank})
                return (succ, "new-leader") if succ is not None else None
            role = "region-master" if candidates(size, plan, "region-master", failed) else "master"
        pool = candidates(size, plan, role, failed)
        if not pool:
            return None
        r = rng.choice(pool)
        return r, roles(size, plan, failed)[r]

    for i in range(schedule.count):
        if i and schedule.spacing:
            time.sleep(schedule.spacing)
        chosen = pick(schedule.role)
        if chosen is None:
            log(f"inject: no live {schedule.role} left for victim {i + 1}")
            break
        strike(*chosen)
    if schedule.then_new_leader is not None and kills:
        first = kills[0]
        time.sleep(schedule.then_new_leader)
        succ = new_leader(size, plan, first.rank, failed - {first.rank})
        # After more victims, the block's leader is its lowest survivor now.
        while succ is not None and succ in failed:
            succ = new_leader(size, plan, succ, failed - {succ})
        if succ is not None:
            strike(succ, "new-leader", f"leads rank {first.rank}'s block")
    return kills


def kill_job(job: subprocess.Popen[Any] | None, marker: str, *, grace: float = 10.0) -> bool:
    """SIGKILL a whole job: the launcher's process group and every marked process.

    Returns:
        True when no marked process is left after ``grace`` seconds.
    """
    for pid in marked_pids(marker):
        kill(pid, "KILL")  # SIGKILL also ends a SIGSTOPped process
    if job is not None:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            job.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + grace
    while marked_pids(marker) and time.monotonic() < deadline:
        for pid in marked_pids(marker):
            kill(pid, "KILL")
        time.sleep(0.05)
    return not marked_pids(marker)
