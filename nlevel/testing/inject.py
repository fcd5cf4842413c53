"""Fault injection from outside: kill a running nlevel job's processes with real signals.

Nothing here hooks into the library and nothing imports MPI: a job is recognised by a
marker in its environment (``NLEVEL_INJECT_JOB=<id>``, or any ``NAME=VALUE`` the caller
set), each process's rank is read from ``/proc/PID/environ`` (``OMPI_COMM_WORLD_RANK``,
else ``PMIX_RANK`` / ``PMI_RANK``; the launcher has none and is never a victim), and roles
come from the same arithmetic the library uses (:func:`nlevel.model.hierarchy.build`), so the
harness and the library agree on who is master, region-master and slave — also after
failures, where each block is led by its lowest surviving rank.

Usable as a library (tests, ``bench/soak.py``) and by hand::

    # inject into a job you started with NLEVEL_INJECT_JOB=j1 in its environment
    python -m nlevel.testing.inject --job-marker j1 --size 8 --levels 3 --regions 2 \\
        --role region-master --count 1 --signal KILL --after 1.5 --log kills.json

    # launch the job with the marker, inject, wait (killing it on a hang), summarise
    python -m nlevel.testing.inject run --size 8 --levels 3 --regions 2 --role slave \\
        --after-committed 500 --ft ulfm --timeout 60 --log kills.json -- \\
        tests/apps/logging_app.py --n 2000 --sleep-ms 5 --checkpoint run.h5 --report r.json

Times in the kill log are ``time.time()`` (unix seconds), comparable with the report's
``failures[].detected_at`` / ``recovered_at``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from nlevel.model.hierarchy import Role, build
from nlevel.model.plan import Plan

__all__ = [
    "MARKER_VAR", "RANK_VARS", "ROLES", "SIGNALS", "Kill", "Schedule", "RunResult",
    "marker_entry", "find_ranks", "plan_of", "roles", "candidates", "new_leader",
    "committed", "kill", "inject", "kill_job", "command", "run", "executions", "committed_ids",
    "percentile", "blast_radius", "audit", "main",
]

#: The environment variable the harness sets on a job it launches (value: a job id).
MARKER_VAR = "NLEVEL_INJECT_JOB"
#: Where a rank is read from, first found wins (Open MPI, PMIx, MPICH/Hydra).
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
#: Roles a victim can be chosen by. ``new-leader`` = the rank that leads the previous
#: victim's block once that victim is dead (the first victim is then a region-master).
ROLES = ("slave", "region-master", "master", "new-leader", "any")
SIGNALS = {"KILL": signal.SIGKILL, "STOP": signal.SIGSTOP, "TERM": signal.SIGTERM}


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
        signal: ``KILL``, ``STOP`` or ``TERM``.
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


# ---------------------------------------------------------------- launch + inject

@dataclass
class RunResult:
    """What happened to one job launched by :func:`run`."""

    marker: str
    command: list[str]
    returncode: int | None      # None when the job hung and was killed
    hung: bool
    started_at: float
    ended_at: float
    kills: list[Kill] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    report: dict[str, Any] | None = None
    leftover: list[int] = field(default_factory=list)  # ranks still alive after the launcher exited

    @property
    def wall(self) -> float:
        """Seconds from launch to exit (or to the hang's kill)."""
        return self.ended_at - self.started_at

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-able summary (the kill log; output tails, not the report)."""
        d = asdict(self)
        d.pop("report")
        d["stdout"], d["stderr"] = self.stdout[-4000:], self.stderr[-4000:]
        return d


def _launcher() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "nlevel-mpiexec")
    return here if os.access(here, os.X_OK) else "nlevel-mpiexec"


def command(size: int, app_args: Sequence[str], plan: Plan, ft: str | None = None) -> list[str]:
    """Return the ``nlevel-mpiexec ... python -m nlevel.run`` command of a job."""
    cmd = [_launcher()]
    if ft:
        cmd += ["--with-ft", ft]
    cmd += ["-n", str(size), sys.executable, "-m", "nlevel.run", *app_args,
            "--levels", str(plan.levels)]
    if plan.regions:
        cmd += ["--regions", ",".join(map(str, plan.regions))]
    return cmd


def run(size: int, plan: Plan, app_args: Sequence[str], schedule: Schedule | None, *,
        ft: str | None = None, cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None, checkpoint: str | os.PathLike[str] | None = None,
        report: str | os.PathLike[str] | None = None, timeout: float = 120.0,
        marker: str | None = None, log: Callable[[str], None] = lambda s: None) -> RunResult:
    """Launch an nlevel job with a marker, inject ``schedule`` (None: no fault), wait.

    A job still running ``timeout`` seconds after launch counts as hung: the harness kills
    its process group and every marked process (stopped victims included), always.

    Args:
        size: ranks.
        plan: levels and regions (added to the command as ``--levels`` / ``--regions``).
        app_args: APP and its options and nlevel.run's other options.
        schedule: the faults.
        ft: ``"ulfm"`` for ``--with-ft ulfm``; None for plain mpiexec.
        cwd, env: of the job (``env`` defaults to this process's).
        checkpoint: the checkpoint path as the job sees it relative to ``cwd`` (for triggers).
        report: the report path (relative to ``cwd``), read back into the result.
        timeout: seconds from launch before the job counts as hung.
        marker: the job id (a fresh one by default).
        log: receives one line per event.
    """
    marker = marker or f"inject-{uuid.uuid4().hex[:12]}"
    job_env = dict(os.environ if env is None else env)
    key, _, value = marker_entry(marker).partition("=")
    job_env[key] = value
    cmd = command(size, app_args, plan, ft)
    ck = os.path.join(cwd or ".", checkpoint) if checkpoint is not None else None
    started = time.time()
    deadline = time.monotonic() + timeout
    job = subprocess.Popen(cmd, cwd=cwd, env=job_env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    kills: list[Kill] = []
    hung = False
    out = err = ""
    leftover: list[int] = []
    try:
        if schedule is not None:
            kills = inject(marker, size, plan, schedule, checkpoint=ck,
                           timeout=max(1.0, deadline - time.monotonic()),
                           alive=lambda: job.poll() is None, log=log)
        try:
            out, err = job.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung = True
            log(f"run: job {marker} still running after {timeout:.0f} s: killed as hung")
    finally:
        ended = time.time()
        if hung or job.poll() is None:
            kill_job(job, marker)
            try:
                out, err = job.communicate(timeout=10)
            except (subprocess.TimeoutExpired, ValueError):
                pass  # a grandchild still holds the pipes, or they are closed already
        else:
            leftover = sorted(find_ranks(marker))
            if leftover:
                log(f"run: ranks {leftover} outlived the job; killed")
            kill_job(None, marker)  # e.g. a STOPped victim the job left behind
    rep: dict[str, Any] | None = None
    if report is not None:
        path = os.path.join(cwd or ".", report)
        try:
            with open(path) as f:
                rep = json.load(f)
            if rep is not None and os.path.getmtime(path) < started:
                rep = None  # a previous run's report
        except (OSError, ValueError):
            rep = None
    return RunResult(marker, cmd, None if hung else job.returncode, hung, started, ended,
                     kills, out, err, rep, leftover)


# ---------------------------------------------------------------- checking a run

def executions(log_dirs: Sequence[str | os.PathLike[str]]) -> dict[int, list[int]]:
    """Return ``{task id: [rank of each execution]}`` from ``exec-<rank>.log`` files (one id
    a line, as ``tests/apps/logging_app.py`` writes them) in ``log_dirs``."""
    out: dict[int, list[int]] = {}
    for d in log_dirs:
        for name in sorted(os.listdir(d)):
            if not (name.startswith("exec-") and name.endswith(".log")):
                continue
            rank = int(name[5:-4])
            with open(os.path.join(d, name)) as f:
                for line in f:
                    if line.strip():
                        out.setdefault(int(line), []).append(rank)
    return out


def committed_ids(checkpoint: str | os.PathLike[str]) -> set[int]:
    """Return the ids the checkpoint records as done (raises CheckpointError when unreadable)."""
    from nlevel.runtime import checkpoint as ckpt
    snap = ckpt.read(checkpoint)[1]
    return {i for a, b in snap.completed.tolist() for i in range(a, b)}


def percentile(xs: Sequence[float], q: float) -> float | None:
    """Return the nearest-rank ``q``-th percentile of ``xs`` (None when empty)."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def blast_radius(size: int, plan: Plan, victims: Sequence[int]) -> set[int]:
    """Return the victims and every rank below each of them when it died.

    Ranks in a dead server's subtree may legitimately run an id twice: their completions
    may have been waiting at the dead server to be forwarded upward.
    """
    out: set[int] = set()
    failed: frozenset[int] = frozenset()
    for v in victims:
        h = build(size, plan, failed - {v})
        stack = [v]
        while stack:
            r = stack.pop()
            out.add(r)
            stack.extend(h[r].children)
        failed = failed | {v}
    return out


def audit(total: int, log_dirs: Sequence[str | os.PathLike[str]],
          checkpoint: str | os.PathLike[str], report: dict[str, Any] | None,
          kills: Sequence[Kill], size: int | None = None, plan: Plan | None = None) -> dict[str, Any]:
    """Check a finished run against the promise, from outside the library.

    Args:
        total: task ids are ``[0, total)``.
        log_dirs: directories of the exec logs (several when a run was resumed).
        checkpoint: the run's checkpoint.
        report: the run report (``--report``), if any.
        kills: the kills made.
        size, plan: the job's; when given, an id may run twice on any rank below a dead
            server (see :func:`blast_radius`), else only if one run was on a killed rank.

    Returns:
        A dict: ``lost`` (ids not committed in the checkpoint), ``double_commits`` (the
        report's ``recomputed``), ``never_ran`` (committed ids no log shows running),
        ``re_executed`` (executions beyond the first), ``re_executed_elsewhere`` (ids run
        twice though no run was on a killed rank or below one: never allowed), ``bound`` (sum of the
        report's ``failures[].held``, None when the report does not give it),
        ``unreported`` (killed ranks missing from ``failures``) and ``failures`` (per
        kill: role, signal, ``detect_ms`` = detected_at - kill time, ``recovery_ms`` as
        reported, ``kill_to_recovered_ms``).
    """
    from nlevel.errors import CheckpointError
    try:
        done = committed_ids(checkpoint)
        readable = True
    except (CheckpointError, OSError):
        done, readable = set(), False
    runs = executions(log_dirs)
    dead = {k.rank for k in kills}
    radius = blast_radius(size, plan, [k.rank for k in kills]) if size and plan else dead
    reports = (report or {}).get("failures") or []
    held = [f.get("held") for f in reports]
    bound = sum(int(h if isinstance(h, int) else len(h)) for h in held) \
        if reports and all(h is not None for h in held) else (0 if report and not reports else None)
    matched = []
    by_rank = {int(f["rank"]): f for f in reports if "rank" in f}
    for k in kills:
        f = by_rank.get(k.rank)
        row: dict[str, Any] = {"rank": k.rank, "role": k.role, "signal": k.signal,
                               "detect_ms": None, "recovery_ms": None, "kill_to_recovered_ms": None}
        if f is not None:
            if f.get("detected_at") is not None:
                row["detect_ms"] = (float(f["detected_at"]) - k.time) * 1e3
            if f.get("recovered_at") is not None:
                row["kill_to_recovered_ms"] = (float(f["recovered_at"]) - k.time) * 1e3
            row["recovery_ms"] = f.get("recovery_ms")
        matched.append(row)
    re_executed = sum(len(r) - 1 for r in runs.values())
    return {
        "total": total,
        "checkpoint_readable": readable,
        "committed": len(done),
        "lost": total - len(done & set(range(total))),
        "double_commits": (report or {}).get("recomputed"),
        "executed_ids": len(runs),
        "never_ran": len(done - set(runs)),
        "re_executed": re_executed,
        "re_executed_elsewhere": sorted(i for i, r in runs.items() if len(r) > 1 and not radius & set(r)),
        "bound": bound,
        "within_bound": None if bound is None else re_executed <= bound,
        "unreported": sorted(dead - set(by_rank)),
        "failures": matched,
    }


# ---------------------------------------------------------------- CLI

def _schedule_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", type=int, required=True, help="the job's number of ranks")
    p.add_argument("--levels", type=int, default=2, help="the job's --levels [default 2]")
    p.add_argument("--regions", default="", help="the job's --regions, e.g. 2 or 2,2")
    p.add_argument("--role", default="slave", choices=ROLES, help="victims' role [default slave]")
    p.add_argument("--count", type=int, default=1, help="number of victims [default 1]")
    p.add_argument("--signal", default="KILL", choices=sorted(SIGNALS), help="[default KILL]")
    p.add_argument("--after", type=float, default=0.0,
                   help="seconds after every rank is up (or after --after-committed) [default 0]")
    p.add_argument("--after-committed", type=int, default=None, metavar="K",
                   help="wait until the checkpoint records >= K committed ids")
    p.add_argument("--checkpoint", default=None, help="the job's checkpoint (for --after-committed)")
    p.add_argument("--dead", default="", help="ranks already dead (earlier injections), e.g. 0,5")
    p.add_argument("--spacing", type=float, default=0.0, help="seconds between victims [default 0]")
    p.add_argument("--then-new-leader", type=float, default=None, metavar="SECONDS",
                   help="then kill the new leader of the first victim's block this much later")
    p.add_argument("--random", action="store_true",
                   help="add a uniformly random 0..--after delay instead of exactly --after")
    p.add_argument("--seed", type=int, default=None, help="seed of the random choices")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="give up (inject) / count the job as hung (run) after this long [default 120 s]")
    p.add_argument("--log", default=None, help="write the kills as JSON here")


def _schedule(a: argparse.Namespace) -> Schedule:
    after = a.after
    if a.random:
        after = random.Random(a.seed).uniform(0.0, a.after)
    return Schedule(a.role, a.count, a.signal, after, a.after_committed, a.spacing,
                    a.then_new_leader, a.seed)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m nlevel.testing.inject [run] ...``; returns the exit status.

    Without ``run``: inject into a running job found by ``--job-marker``; exit 0 when at
    least one victim was killed. With ``run``: launch, inject, wait; exit with the job's
    status, or 124 when it hung.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)
    if argv[:1] == ["run"]:
        p = argparse.ArgumentParser(prog="python -m nlevel.testing.inject run",
                                    description="Launch an nlevel job with a marker and kill some of its ranks.")
        _schedule_args(p)
        p.add_argument("--ft", default=None, help="mpiexec --with-ft value, e.g. ulfm")
        p.add_argument("--report", default=None, help="the job's --report path, summarised")
        p.add_argument("--no-fault", action="store_true", help="launch without killing anything")
        p.add_argument("app_args", nargs=argparse.REMAINDER,
                       help="-- APP [options] for python -m nlevel.run")
        a = p.parse_args(argv[1:])
        app_args = a.app_args[1:] if a.app_args[:1] == ["--"] else a.app_args
        if a.checkpoint and "--checkpoint" not in app_args:
            app_args += ["--checkpoint", a.checkpoint]
        if a.report and "--report" not in app_args:
            app_args += ["--report", a.report]
        plan = plan_of(a.levels, _ints(a.regions))
        res = run(a.size, plan, app_args, None if a.no_fault else _schedule(a), ft=a.ft,
                  checkpoint=a.checkpoint, report=a.report, timeout=a.timeout, log=say)
        summary = res.to_json()
        if res.report is not None:
            summary["report"] = {k: res.report.get(k) for k in
                                 ("complete", "committed", "recomputed", "failures", "wall_s")}
        if a.log:
            with open(a.log, "w") as f:
                json.dump(summary, f, indent=1)
        say(f"run: exit {res.returncode}{' (hung, killed)' if res.hung else ''} after "
            f"{res.wall:.1f} s, {len(res.kills)} kill(s)")
        return 124 if res.hung else int(res.returncode or 0)

    p = argparse.ArgumentParser(prog="python -m nlevel.testing.inject",
                                description="Kill ranks of a running nlevel job, chosen by role.")
    p.add_argument("--job-marker", required=True,
                   help=f"NAME=VALUE in the job's environment, or a value of {MARKER_VAR}")
    _schedule_args(p)
    a = p.parse_args(argv)
    plan = plan_of(a.levels, _ints(a.regions))
    kills = inject(a.job_marker, a.size, plan, _schedule(a), checkpoint=a.checkpoint,
                   timeout=a.timeout, dead=frozenset(_ints(a.dead)), log=say)
    if a.log:
        with open(a.log, "w") as f:
            json.dump({"marker": a.job_marker, "kills": [asdict(k) for k in kills]}, f, indent=1)
    return 0 if kills else 1


if __name__ == "__main__":
    sys.exit(main())
