"""Check a finished run against nlevel's promise, from outside the library.

Reads what the run left: the exec logs an app wrote (one line per execution, as
``tests/apps/logging_app.py`` writes them), the checkpoint's completion record and the
run report, and compares them with the kills made (:class:`nlevel.testing.faults.Kill`):
every id committed once, re-executions only where a process died, every failure reported.
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan

from .faults import Kill

__all__ = ["executions", "committed_ids", "percentile", "blast_radius", "audit"]


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


def checkpoint_doubles(checkpoint: str | os.PathLike[str]) -> int | None:
    """Ids whose result the checkpoint records more than once (None: unreadable): a double commit.

    (The report's ``recomputed`` counts completions *reported* for ids already committed: after
    a master's death the survivors report again what they had sent it, by design; the ledger
    keeps the first.)
    """
    import numpy as np

    from nlevel.errors import CheckpointError
    from nlevel.runtime import checkpoint as ckpt

    try:
        ids = ckpt.stored_result_ids(checkpoint)  # (the base's and its journal's, repeats kept)
    except (OSError, KeyError, CheckpointError):
        return None
    return int(len(ids) - len(np.unique(ids)))


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
          kills: Sequence[Kill], size: int | None = None, plan: Plan | None = None,
          also_dead: Sequence[int] = ()) -> dict[str, Any]:
    """Check a finished run against the promise, from outside the library.

    Args:
        total: task ids are ``[0, total)``.
        log_dirs: directories of the exec logs (several when a run was resumed).
        checkpoint: the run's checkpoint.
        report: the run report (``--report``), if any.
        kills: the kills made.
        size, plan: the job's; when given, an id may run twice on any rank below a dead
            server (see :func:`blast_radius`), else only if one run was on a killed rank.
        also_dead: ranks that died without a kill from outside (a task's ``os._exit``, its
            time limit): as the report names them; they widen the radius like the killed.

    Returns:
        A dict: ``lost`` (ids not committed in the checkpoint), ``double_commits`` (ids
        whose result the checkpoint holds twice: :func:`checkpoint_doubles`), ``re_reported``
        (the report's ``recomputed``: completions reported again, kept once), ``never_ran`` (committed ids no log shows running),
        ``re_executed`` (executions beyond the first), ``re_executed_elsewhere`` (ids run
        twice though no run was on a killed rank or below one: never allowed), ``bound`` (sum of the
        report's ``failures[].held``, None when the report does not give it),
        ``unreported`` (killed ranks missing from ``failures``) and ``failures`` (per
        kill: role, signal, ``reported_role`` (the report's, e.g. ``starting``), ``detect_ms`` =
        detected_at - kill time, ``recovery_ms`` and ``waited_ms`` as reported, ``kill_to_recovered_ms``).
    """
    from nlevel.errors import CheckpointError
    try:
        done = committed_ids(checkpoint)
        readable = True
    except (CheckpointError, OSError):
        done, readable = set(), False
    runs = executions(log_dirs)
    dead = {k.rank for k in kills}
    victims = [k.rank for k in kills] + list(also_dead)
    radius = blast_radius(size, plan, victims) if size and plan else set(victims)
    reports = (report or {}).get("failures") or []
    held = [f.get("held") for f in reports]
    bound = sum(int(h if isinstance(h, int) else len(h)) for h in held) \
        if reports and all(h is not None for h in held) else (0 if report and not reports else None)
    matched = []
    by_rank = {int(f["rank"]): f for f in reports if "rank" in f}
    for k in kills:
        f = by_rank.get(k.rank)
        row: dict[str, Any] = {"rank": k.rank, "role": k.role, "signal": k.signal, "reported_role": None,
                               "detect_ms": None, "recovery_ms": None, "waited_ms": None, "kill_to_recovered_ms": None}
        if f is not None:
            row["reported_role"] = f.get("role")  # ("starting": it died before MPI was up; the job started again)
            if f.get("detected_at") is not None:
                row["detect_ms"] = (float(f["detected_at"]) - k.time) * 1e3
            if f.get("recovered_at") is not None:
                row["kill_to_recovered_ms"] = (float(f["recovered_at"]) - k.time) * 1e3
            row["recovery_ms"] = f.get("recovery_ms")
            row["waited_ms"] = f.get("waited_ms")  # (the recovery waited for another death to be found first)
        matched.append(row)
    re_executed = sum(len(r) - 1 for r in runs.values())
    return {
        "total": total,
        "checkpoint_readable": readable,
        "committed": len(done),
        "lost": total - len(done & set(range(total))),
        "double_commits": checkpoint_doubles(checkpoint) if readable else None,
        "re_reported": (report or {}).get("recomputed"),
        "executed_ids": len(runs),
        "never_ran": len(done - set(runs)),
        "re_executed": re_executed,
        "re_executed_elsewhere": sorted(i for i, r in runs.items() if len(r) > 1 and not radius & set(r)),
        "bound": bound,
        "within_bound": None if bound is None else re_executed <= bound,
        "unreported": sorted(dead - set(by_rank)),
        "failures": matched,
    }
