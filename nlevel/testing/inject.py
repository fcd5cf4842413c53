"""Fault injection from outside: kill a running nlevel job's processes with real signals.

Finding and killing the ranks is :mod:`nlevel.testing.faults`, checking a finished run
:mod:`nlevel.testing.audit`; this module launches a job with a marker, injects, waits,
and is the command line. Its names include theirs, so one import serves a test.

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
import os
import random
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from nlevel.model.plan import Plan

from .audit import audit, blast_radius, committed_ids, executions, percentile
from .faults import (
    MARKER_VAR,
    RANK_VARS,
    ROLES,
    SIGNALS,
    Kill,
    Schedule,
    candidates,
    committed,
    find_ranks,
    inject,
    kill,
    kill_job,
    marked_pids,
    marker_entry,
    new_leader,
    plan_of,
    roles,
)

__all__ = [
    "MARKER_VAR", "RANK_VARS", "ROLES", "SIGNALS", "Kill", "Schedule", "RunResult",
    "marker_entry", "marked_pids", "find_ranks", "plan_of", "roles", "candidates", "new_leader",
    "committed", "kill", "inject", "kill_job", "command", "run", "executions", "committed_ids",
    "percentile", "blast_radius", "audit", "main",
]


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
