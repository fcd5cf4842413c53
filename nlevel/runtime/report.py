"""The run report: what the farm decided and measured, as a JSON-ready dict. Pure Python."""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from typing import Any

from .._version import __version__
from ..config import Config
from ..model.hierarchy import Hierarchy, build
from ..roles.core import TIMELINE_BIN
from ..roles.ledger import Ledger
from ..roles.messages import FailureRecord
from ..stats import RequestTimes, Summary
from . import machine
from .signals import EXIT_STOPPED

__all__ = ["build_report", "merge_stats", "write_json", "format_summary", "oversubscription_note"]

#: The report lists every rank's row in jobs of up to this many ranks (beyond, none).
ROWS_MAX = 4096

def _level_name(level: int, levels: int) -> str:
    if level == 0:
        return "master"
    return "slave" if level == levels - 1 else f"region-master L{level}"


def merge_stats(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Combine two ranks' mergeable statistics (the reduction op of the run report)."""
    tasks = Summary()
    for t in (a["tasks"], b["tasks"]):
        if t is not None:
            tasks.merge(t)
    requests: dict[int, RequestTimes] = {}
    for side in (a["requests"], b["requests"]):
        for level, rt in side.items():
            requests.setdefault(level, RequestTimes()).merge(rt)
    return {
        "tasks": tasks,
        "requests": requests,
        "unexpected": a["unexpected"] + b["unexpected"],
        "failures": a.get("failures", []) + b.get("failures", []),
        "timeline": {**a.get("timeline", {}), **b.get("timeline", {})},
        "hosts": machine.merge(a.get("hosts", {}), b.get("hosts", {})),
    }


def timeline(per_rank: dict[int, dict[int, int]], bin_s: float) -> dict[str, Any]:
    """The servers' requests served per time bin, as the report stores it (``t0``: wall time of bin 0)."""
    if not per_rank:
        return {"bin_s": bin_s, "t0": None, "served": {}}
    first = min(min(bins) for bins in per_rank.values())
    last = max(max(bins) for bins in per_rank.values())
    return {
        "bin_s": bin_s,
        "t0": first * bin_s,
        "served": {str(r): [bins.get(b, 0) for b in range(first, last + 1)] for r, bins in sorted(per_rank.items())},
    }


def station_facts(st: Any, totals: dict[str, Any], left: set[int]) -> dict[str, Any]:
    """What the report takes from the station that ends the job (the master's, or that of the rank
    that finished a dead master's release): dead and drained ranks, plans and the planner's
    decisions, why the job stopped, the servers' timeline; and ``lost``, one failure record for
    each death whose own record was lost.

    ``totals``: the ranks' merged statistics; ``left``: ranks that exited after their release
    (deaths to ULFM, not failures).
    """
    # (drained ranks leave by dying under ULFM: their records are left out of the failures)
    recorded = {f["rank"] for f in totals["failures"]} | set(st.drained)
    lost = sorted(set(st.failed) - recorded - left)
    first = build(st.size, st.plans[0]) if lost else None
    records = []
    for r in lost:
        assert first is not None
        # Its record was made by the rank that recovered from it, which died too (a master and
        # its successor killed close together): the death is still told.
        records.append(FailureRecord(
            r, first[r].role.value, first[r].level, "died; the record of its recovery was lost with the rank "
            "that made it (which died too)", -1, 0.0, 0).to_dict() | {"detected_at": None})
    return {
        "lost": records,
        "dead_ranks": sorted(set(st.failed) - left),
        "timeline": timeline(totals.get("timeline", {}), TIMELINE_BIN),
        "drained": [{"rank": r, "requested_at": t0} for r, t0 in sorted(st.drained.items())],
        "plan_history": [p.to_dict() for p in st.plans],
        "stopped": (st.stop_reason or "SIGUSR1") if st.stopped else None,
        "user_errors": [{"rank": r, "error": why} for r, why in st.user_errors.items()],
        "decisions": st.planner.report() if st.planner is not None else [],
    }


def failed_tasks(ledger: Ledger, output: str = "") -> list[dict[str, Any]]:
    """The ids recorded failed, as the report lists them (and the release tells every rank); with
    ``output`` (``--task-output``), each one's output files (:func:`nlevel.runtime.output.files_of`)."""
    out: list[dict[str, Any]] = [
        {"id": f.id, "kind": f.kind, "attempts": f.attempts, "rank": f.rank, "host": f.host, "error": f.error,
         "traceback": f.traceback} for _, f in sorted(ledger.failed.items())]
    if output:
        from .output import files_of

        for f in out:
            f["output"] = files_of(output, int(f["id"]))
    return out


def exit_status(*, complete: bool, stopped: bool, left: int, error: bool) -> int:
    """The job's exit status: 0 when every id is committed (and the checkpoint written), 75 when
    it stopped early (SIGUSR1, a task past its limit without ULFM) with ``left`` ids neither
    committed nor failed (the same command resumes them), else 1 (failed ids, the checkpoint could
    not be written, or ``error``: that, or an error in the program on some rank, see
    :class:`~nlevel.roles.events.UserError`). Stopped with nothing left is 1: a resume would have
    nothing to do."""
    if complete and not error:
        return 0
    if stopped and left > 0 and not error:
        return EXIT_STOPPED
    return 1


def ledger_status(ledger: Ledger, *, stopped: bool, error: bool) -> int:
    """:func:`exit_status` of a job whose master holds ``ledger``."""
    return exit_status(complete=ledger.complete(), stopped=stopped, left=ledger.undecided, error=error)


def failed_lines(failed: list[dict[str, Any]]) -> str:
    """One stderr line per failed id (of :func:`failed_tasks`), naming where it failed and why."""
    out = []
    for f in failed:
        where = f" on rank {f['rank']}" + (f" ({f['host']})" if f.get("host") else "") if f.get("rank", -1) >= 0 else ""
        files = f"; output: {', '.join(f['output'])}" if f.get("output") else ""
        out.append(f"nlevel: task {f['id']} FAILED ({f['kind']}{where}): {f['error']}{files}\n")
    return "".join(out)


def build_report(
    *,
    config: Config,
    hierarchy: Hierarchy,
    rows: list[dict[str, Any]],
    totals: dict[str, Any],
    ledger: Ledger,
    started: float,
    wall: float,
    checkpoint: str | None,
    writer: Any = None,
    failures: list[dict[str, Any]] | None = None,
    app: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Merge every rank's statistics into the report.

    ``rows`` are the ranks' few numbers (gathered), ``totals`` their statistics merged
    with :func:`merge_stats`. ``requests`` is keyed by the level of the rank asking (a slave at level 2 asks a
    region-master at level 1): each entry splits the request time into message, wait
    and dispose parts, in milliseconds. ``overhead`` counts every rank, serve-only ones
    included: ``1 - sum(task time) / (size * wall)``.
    """
    tasks: Summary = totals["tasks"] if totals["tasks"] is not None else Summary()
    by_level: dict[int, RequestTimes] = totals["requests"]
    unexpected = totals["unexpected"]
    per_rank = rows
    size = hierarchy.size
    levels = hierarchy.plan.levels
    busy = tasks.total
    report: dict[str, Any] = {
        "nlevel_version": __version__,
        "started": _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": wall,
        "size": size,
        "app": app or {},
        "config": config.to_dict(),
        "plan": hierarchy.plan.to_dict(),
        "hierarchy": hierarchy.summary(),
        "total": ledger.total,
        "committed": ledger.n_committed,
        "committed_this_run": ledger.commits,
        "resumed_from_checkpoint": ledger.resumed,
        "recomputed": ledger.recomputed,
        "unexpected_completions": unexpected,
        "complete": ledger.complete(),
        "failures": failures or [],
        "failed_tasks": failed_tasks(ledger, config.task_output),
        "tasks": {"run": tasks.n, **tasks.to_dict(1e3)},
        "task_time_sum_s": busy,
        "overhead": (1.0 - busy / (size * wall)) if wall > 0 and size else 0.0,
        "overhead_workers": (1.0 - busy / (hierarchy.workers() * wall)) if wall > 0 and hierarchy.workers() else 0.0,
        "requests": {
            _level_name(level, levels): {"level": level, **rt.to_dict()} for level, rt in sorted(by_level.items())
        },
        "per_rank": per_rank if size <= ROWS_MAX else [],
        "placement": machine.placement(totals["hosts"]) if totals.get("hosts") else None,
        "checkpoint": None,
    }
    if checkpoint is not None:
        report["checkpoint"] = {
            "path": checkpoint,
            "writes": getattr(writer, "writes", None),
            "bytes_written": getattr(writer, "bytes_written", None),
            "last_write_s": getattr(writer, "last_write_seconds", None),
        }
    return report


def master_wrote(path: str | os.PathLike[str], job: str) -> bool:
    """Whether ``path`` holds the report of job ``job`` written by its master.

    A deputy that finished the release of a master it took for dead (see the ``written_by``
    field) must not replace that master's report: the master may only have exited right
    after releasing it, its report written. The job's id (every rank has it from the set-up)
    tells this job's report from an earlier run's on the same path; a file's modification time
    could not (a shared file system stamps it with the file server's clock).
    """
    try:
        with open(path) as f:
            report = json.load(f)
        return isinstance(report, dict) and report.get("job") == job and "written_by" not in report
    except (OSError, ValueError, TypeError):
        return False


def write_json(path: str | os.PathLike[str], report: dict[str, Any]) -> None:
    """Write ``report`` to ``path`` atomically (temp file + rename): a kill never leaves half a report."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; a report is an ordinary file
        with os.fdopen(fd, "w") as f:
            json.dump(report, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def oversubscription_note(placement: dict[str, Any] | None) -> str:
    """One line saying why the overhead is high when ranks outnumber cores ("" when they do not)."""
    over = (placement or {}).get("oversubscribed") or []
    if not over:
        return ""
    if (placement or {}).get("nodes", 1) == 1:
        r = over[0]
        where = f"{r['ranks']} processes on {r['cores']} core{'s' if r['cores'] != 1 else ''} ({r['host']})"
        fix = f"run -n {r['cores']} (one process per core)"
    else:
        r = max(over, key=lambda x: x["ranks"] / x["cores"])
        where = (f"more processes than cores on {len(over)} of {placement['nodes']} nodes "  # type: ignore[index]
                 f"(e.g. {r['host']}: {r['ranks']} on {r['cores']})")
        fix = "place at most one process per core"
    return (f"note: {where}: oversubscribed, so processes wait for a core and the overhead counts that wait, "
            f"not only nlevel's cost; {fix} to measure it")


def format_summary(report: dict[str, Any]) -> str:
    """Return the few lines printed at the end of ``python -m nlevel.run``."""
    tasks = report["tasks"]
    lines = [
        f"nlevel: {report['committed']}/{report['total']} tasks committed "
        f"({report['committed_this_run']} this run, {report['resumed_from_checkpoint']} from the checkpoint, "
        f"{report['recomputed']} recomputed) on {report['size']} processes in {report['wall_s']:.2f} s",
        f"  plan: {report['plan']['levels']} levels, {report['hierarchy']['region_masters']} region-masters, "
        f"{report['hierarchy']['workers']} workers ({report['plan']['reason']})",
    ]
    switches = len(report.get("plan_history", [])) - 1
    decisions = report.get("decisions", [])
    if decisions or switches > 0:
        last = next((d for d in reversed(decisions) if "poisson" in d), None)
        line = f"  auto: {len(decisions)} decision(s), {switches} switch(es)"
        if last is not None:
            fit = last["poisson"]
            line += (
                f"; last: lambda {fit['rate_per_s']:,.0f}/s ({fit['verdict']}, dispersion {fit['dispersion']:.2f}), "
                f"mu {last['mu_per_s']:,.0f}/s, rho {last['rho_measured']:.2f}"
            )
        lines.append(line)
    if tasks.get("count"):
        lines.append(
            f"  task time: mean {tasks['mean']:.3f} ms, p50 {tasks['p50']:.3f}, p99 {tasks['p99']:.3f}, "
            f"max {tasks['max']:.3f} ms; overhead {100 * report['overhead']:.1f}% of {report['size']} x wall"
        )
    teams = report.get("teams")
    if teams:
        left = teams.get("left") or []
        lines.append(f"  teams: {len(teams['teams'])} of {teams['ranks_per_task']} ranks (farm rank i leads team i)"
                     + (f"; rank(s) {', '.join(map(str, left))} in no team" if left else ""))
    note = oversubscription_note(report.get("placement"))
    if note:
        lines.append(f"  {note}")
    for name, parts in report["requests"].items():
        if parts["total"].get("count"):
            lines.append(
                f"  requests from {name}s: {parts['total']['count']}, p50 {parts['total']['p50'] * 1e3:.1f} us, "
                f"mean {parts['total']['mean'] * 1e3:.1f} us = claim {parts['message']['mean'] * 1e3:.1f} "
                f"+ wait {parts['wait']['mean'] * 1e3:.1f} + dispose {parts['dispose']['mean'] * 1e3:.1f} us"
            )
    if report.get("failures"):
        lines.append(f"  survived {len(report['failures'])} process failure(s): " + ", ".join(
            f"rank {f['rank']} ({f['role']}, {f['requeued']} requeued, recovered in {f['recovery_ms']} ms"
            + (f" after waiting {f['waited_ms']} ms for another death to be found" if f.get("waited_ms") else "") + ")"
            for f in report["failures"][:5]) + (" ..." if len(report["failures"]) > 5 else ""))
    failed = report.get("failed_tasks") or []
    if failed:
        lines.append(f"  {len(failed)} task(s) FAILED (recorded in the checkpoint's /failed; "
                     f"python -m nlevel.run ... --retry-failed or Farm(..., retry_failed=True) runs them again):")
        for f in failed[:20]:
            where = f" on rank {f['rank']}" + (f" ({f['host']})" if f.get("host") else "") if f.get("rank", -1) >= 0 else ""
            lines.append(f"    task {f['id']} {f['kind']}{where} after {f['attempts']} attempt(s): {f['error']}"
                         + (f" (output: {', '.join(f['output'])})" if f.get("output") else ""))
        if len(failed) > 20:
            lines.append(f"    ... and {len(failed) - 20} more (see the report's failed_tasks)")
    if not report["complete"]:
        then = "fix it, then the same command resumes" if report.get("user_errors") else "the same command resumes"
        why = f" (stopped: {report['stopped']}; {then})" if report.get("stopped") else ""
        lines.append(f"  INCOMPLETE: {report['total'] - report['committed']} tasks not committed{why}")
    return "\n".join(lines)
