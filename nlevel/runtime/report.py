"""The run report: what the farm decided and measured, as a JSON-ready dict. Pure Python."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from .._version import __version__
from ..config import Config
from ..model.hierarchy import Hierarchy, build
from ..stats import TIMELINE_BIN, TIMELINE_MAX
from ..roles.ledger import Ledger
from ..roles.messages import FailureRecord
from ..stats import RequestTimes, Summary
from . import machine
from .signals import EXIT_STOPPED

__all__ = ["build_report", "write_json", "format_summary", "oversubscription_note"]

#: The report lists every rank's row in jobs of up to this many ranks (beyond, none).
ROWS_MAX = 4096

def _level_name(level: int, levels: int) -> str:
    if level == 0:
        return "master"
    return "slave" if level == levels - 1 else f"region-master L{level}"


def timeline(per_rank: dict[int, Any], bin_s: float) -> dict[str, Any]:
    """The servers' requests served per time bin, as the report stores it (``t0``: wall time of bin 0).

    ``per_rank``: each server's ``(seconds per bin, {bin: served})`` (a bare dict: ``bin_s`` each).
    The report's bins are the widest any server kept, widened further so that the span holds at
    most :data:`~nlevel.stats.TIMELINE_MAX` of them.
    """
    rows = {r: (v if isinstance(v, tuple) else (bin_s, v)) for r, v in per_rank.items() if v}
    rows = {r: (w, bins) for r, (w, bins) in rows.items() if bins}
    if not rows:
        return {"bin_s": bin_s, "t0": None, "served": {}}
    width = max(w for w, _ in rows.values())  # (every width is bin_s times a power of two)

    def scaled(w: float, k: int) -> int:
        return k // max(1, round(width / w))

    while True:
        first = min(scaled(w, min(bins)) for w, bins in rows.values())
        last = max(scaled(w, max(bins)) for w, bins in rows.values())
        if last - first < TIMELINE_MAX:
            break
        width *= 2
    served: dict[str, list[int]] = {}
    for r, (w, bins) in sorted(rows.items()):
        dense = [0] * (last - first + 1)
        for k, n in bins.items():
            dense[scaled(w, k) - first] += n
        served[str(r)] = dense
    return {"bin_s": width, "t0": first * width, "served": served}


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
    first = build(st.size, st.plans[0], node_sizes=st.hierarchy.node_sizes) if lost else None
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
        # (the planner keeps its start, its switches and the last few others: this many were made)
        "decisions_made": st.planner.made if st.planner is not None else 0,
    }


#: Failed ids the report lists one by one (with traceback); the rest are counted by kind and error.
FAILED_LISTED = 1000
#: Failed ids stderr names one line each at the end of a job.
FAILED_LINES = 20


def failed_tasks(ledger: Ledger, output: str = "") -> list[dict[str, Any]]:
    """The ids recorded failed, as the report lists them (and the release tells every rank): the
    first :data:`FAILED_LISTED` (the checkpoint's ``/failed`` keeps every one); with ``output``
    (``--task-output``), each one's output files (:func:`nlevel.runtime.output.files_of`)."""
    out: list[dict[str, Any]] = []
    for _, f in sorted(ledger.failed.items()):
        if len(out) == FAILED_LISTED:
            break
        out.append({"id": f.id, "kind": f.kind, "attempts": f.attempts, "rank": f.rank, "host": f.host,
                    "error": f.error, "traceback": f.traceback})
    if output and out:
        from .output import files_of

        files = files_of(output, [int(row["id"]) for row in out])  # (one look at the directory for them all)
        for row in out:
            row["output"] = files[int(row["id"])]
    return out


def failed_summary(ledger: Ledger) -> dict[str, Any]:
    """Every failed id counted: in all, and per kind and error (a million tasks that raised the same
    error are one line here, and :func:`failed_tasks` lists the first of them)."""
    by: dict[tuple[str, str], int] = {}
    for f in ledger.failed.values():
        key = (f.kind, f.error)
        by[key] = by.get(key, 0) + 1
    top = sorted(by.items(), key=lambda kv: -kv[1])[:50]
    return {"count": len(ledger.failed), "listed": min(len(ledger.failed), FAILED_LISTED),
            "by_error": [{"kind": k, "error": e, "ids": n} for (k, e), n in top]}


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


def failed_lines(failed: list[dict[str, Any]], count: int | None = None) -> str:
    """One stderr line per failed id (of :func:`failed_tasks`), naming where it failed and why: the
    first :data:`FAILED_LINES`, then one line for the rest (``count``: every failed id)."""
    out = []
    for f in failed[:FAILED_LINES]:
        where = f" on rank {f['rank']}" + (f" ({f['host']})" if f.get("host") else "") if f.get("rank", -1) >= 0 else ""
        files = f"; output: {', '.join(f['output'])}" if f.get("output") else ""
        out.append(f"nlevel: task {f['id']} FAILED ({f['kind']}{where}): {f['error']}{files}\n")
    more = (len(failed) if count is None else count) - min(len(failed), FAILED_LINES)
    if more > 0:
        out.append(f"nlevel: and {more:,} more failed tasks (the report lists the first {FAILED_LISTED:,} and counts "
                   f"the rest by error; the checkpoint's /failed holds every one)\n")
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
    with :func:`~nlevel.roles.ending.merge_stats`. ``requests`` is keyed by the level of the rank asking (a slave at level 2 asks a
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
        "started": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(started)),  # (ISO 8601; datetime cost 4 ms)
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
        "failed_summary": failed_summary(ledger),
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
            "appends": getattr(writer, "appends", None),  # (writes that appended what was new to the journal)
            "compactions": getattr(writer, "compactions", None),  # (the journal folded into a new base)
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


def _create_temp(path: str) -> tuple[int, str]:
    """A new temporary file beside ``path``, with an ordinary file's mode: 0666 less the umask, which
    the kernel applies (reading the umask means setting it, process-wide: never from a thread)."""
    while True:
        tmp = f"{path}.{os.getpid()}-{os.urandom(6).hex()}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:
            continue


def write_json(path: str | os.PathLike[str], report: dict[str, Any]) -> None:
    """Write ``report`` to ``path`` atomically (temp file + rename): a kill never leaves half a report."""
    path = os.fspath(path)
    fd, tmp = _create_temp(path)
    try:
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
        line = f"  auto: {report.get('decisions_made') or len(decisions)} decision(s), {switches} switch(es)"
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
            f"rank {f['rank']}" + (f" on {f['host']}" if f.get("host") else "")
            + f" ({f['role']}, {f['requeued']} requeued, recovered in {f['recovery_ms']} ms"
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
