"""``python -m nlevel.status RUN.h5 [--json]``: look at a job from outside, through its files.

It shows done/total, the failed and quarantined ids, the run's identity, the plan and why,
when the checkpoint was last written, whether a running job holds it now (and since when),
and the rate and ETA while it runs. Three files feed it, all optional but the checkpoint:

* the checkpoint (``RUN.h5``): opened read-only without HDF5's file lock, attributes and the
  small ``/failed`` dataset only, then the JSON parts of its journal's records (``RUN.h5.journal``:
  their counts, time and failure records; the arrays are skipped). The writer replaces the
  file with ``os.replace`` and only appends to the journal, so an open reader keeps reading a
  whole (old) file and the writer never waits for it; a file that vanishes between two calls
  (``--fresh`` moved it aside) is tried once more.
* the job's own record, ``RUN.h5.control/status.json``: written by rank 0 (:class:`Recorder`)
  every few seconds with the plan running now and why, the model's state, and the rate
  measured over the last half minute. Why a record and not two reads of the checkpoint:
  one read answers at once (two reads must wait for two writes, which ``--checkpoint-every``
  may space minutes apart); the plan and the model's state are not in the checkpoint; and
  the rate is the job's own, over its recent past, not a guess from two instants.
* the lock, ``RUN.h5.lock`` (JSON: host, pid, job id, start, heartbeat), when the job holds
  one: read tolerantly (any of the usual key spellings, times as ISO text or seconds).

A job is "running" when the lock or the record names a process that is alive (same host)
or whose heartbeat is recent (another host: :func:`stopped_after` three missed refreshes,
counted on the record's 2 s heartbeat when the record and the lock name one process).
Reading changes nothing on disk.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

from .._version import __version__
from .control import control_dir
from .report import write_json
from .pids import alive as _pid_alive
from .machine import hostname

__all__ = ["Recorder", "assemble", "format_status", "main", "read_checkpoint", "read_json", "read_lock", "record_path",
           "status", "stopped_after"]

RECORD = "status.json"
_JOB_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID", "JOB_ID")
_QUARANTINED = ("died", "timeout")  # recorded failed because processes died holding them, or they hung
_FILES_SHOWN = 10  # failed tasks whose output files (--task-output) the status names


def record_path(checkpoint: str | os.PathLike[str]) -> str:
    """Where the job's status record of ``checkpoint`` is."""
    return os.path.join(control_dir(checkpoint), RECORD)


# ---------------------------------------------------------------- the job's side: the record


class Recorder:
    """Rank 0 writes the status record every ``interval`` seconds from a thread (best effort: never fails the job).

    Args:
        checkpoint: The run's checkpoint path (the record goes in its control directory).
        state: Returns the live state: ``committed``, ``total``, ``resumed``, ``size`` and the
            model's (:func:`nlevel.runtime.progress.model_state`); called from the thread.
        interval: Seconds between records.
        window: Seconds over which the rate is measured.
    """

    def __init__(self, checkpoint: str, state: Callable[[], dict[str, Any]], interval: float = 2.0,
                 window: float = 30.0) -> None:
        self.path = record_path(checkpoint)
        self.checkpoint = os.path.abspath(checkpoint)
        self.state = state
        self.interval = interval
        self.window = window
        self.started = time.time()
        self.job = next((os.environ[v] for v in _JOB_VARS if os.environ.get(v)), None)
        self._samples: collections.deque[tuple[float, int]] = collections.deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Write the first record and start the thread (idempotent)."""
        if self._thread is not None:
            return
        self.write()
        self._thread = threading.Thread(target=self._run, name="nlevel-status", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()

    def close(self, **final: Any) -> None:
        """Stop the thread and write the last record, with ``final`` added (e.g. ``finished=True``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.write(**final)

    def rate(self, now: float, committed: int) -> float | None:
        """Tasks per second over the last ``window`` seconds (None until two samples a second apart)."""
        self._samples.append((now, committed))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window:
            self._samples.popleft()
        t0, c0 = self._samples[0]
        return (committed - c0) / (now - t0) if now - t0 >= 1.0 else None

    def write(self, **extra: Any) -> None:
        """Write one record now (errors are swallowed: the record is a convenience, the checkpoint is the truth)."""
        try:
            state = dict(self.state())
            now = time.time()
            committed, total = int(state.pop("committed", 0)), int(state.pop("total", 0))
            rate = self.rate(now, committed)
            record = {
                "nlevel_version": __version__, "checkpoint": self.checkpoint, "host": hostname(),
                "pid": os.getpid(), "job_id": self.job, "started": self.started, "updated": now,
                "interval": self.interval, "committed": committed, "total": total,
                "resumed": state.pop("resumed", None), "size": state.pop("size", None),
                "task_output": state.pop("task_output", None), "rate_per_s": rate,
                "eta_s": (total - committed) / rate if rate else None, "model": state, "finished": False, **extra,
            }
            write_json(self.path, record)  # (atomic: a reader never sees half a record)
        except Exception:  # noqa: BLE001 (a full disk or a removed directory must not stop the job)
            pass


# ---------------------------------------------------------------- reading, without disturbing the job


def read_checkpoint(path: str) -> dict[str, Any]:
    """The checkpoint's attributes and failed tasks, read-only and without a file lock.

    Returns:
        ``total``, ``n_completed``, ``created``, ``updated``, ``identity``, ``plan`` (the first
        plan, JSON), ``version``, ``format`` and ``failed`` (id, kind, attempts, rank, host, error).

    Raises:
        FileNotFoundError: there is no such file (after one retry).
        ValueError: the file is not an nlevel checkpoint, or cannot be read (named in the message).
    """
    import h5py

    for attempt in (0, 1):
        try:
            try:
                f = h5py.File(path, "r", locking=False)  # never take (or wait for) a lock on the job's file
            except TypeError:  # an h5py without the argument
                f = h5py.File(path, "r")
            with f:
                a = f.attrs
                if "nlevel_format" not in a:
                    raise ValueError(f"{path} is an HDF5 file but not an nlevel checkpoint")
                out = {
                    "format": int(a["nlevel_format"]), "total": int(a["total"]), "n_completed": int(a["n_completed"]),
                    "created": _text(a.get("created")), "updated": _text(a.get("updated")),
                    "identity": _text(a.get("fingerprint_source")), "plan": _text(a.get("plan")),
                    "version": _text(a.get("version")),
                }
                rows = f["failed"][()] if "failed" in f else []
                failed = {
                    int(r["id"]): {"id": int(r["id"]), "kind": _text(r["kind"]), "attempts": int(r["attempts"]),
                                   "rank": int(r["rank"]), "host": _text(r["host"]), "error": _text(r["error"])}
                    for r in rows
                }
                token = _text(a.get("journal")) if "journal" in a else None
            if token is not None:
                _journal_into(out, failed, path, token)
            out["failed"] = list(failed.values())
            return out
        except FileNotFoundError:
            if attempt == 0:
                time.sleep(0.05)  # moved aside (or replaced) between two calls: once more
                continue
            raise
        except ValueError:
            raise
        except OSError as exc:
            if not os.path.exists(path):
                if attempt == 0:
                    time.sleep(0.05)
                    continue
                raise FileNotFoundError(path) from exc
            raise ValueError(f"cannot read {path} as an nlevel checkpoint ({exc})") from exc
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{path} is not a readable nlevel checkpoint (missing {exc})") from exc
    raise FileNotFoundError(path)


def _journal_into(out: dict[str, Any], failed: dict[int, dict[str, Any]], path: str, token: str) -> None:
    """Apply the JSON parts of the journal of the checkpoint read into ``out`` and ``failed`` (when it is
    the journal of that base: a stale one, or none, changes nothing)."""
    from . import journal

    try:
        with open(journal.beside(path), "rb") as f:
            head, metas = journal.scan_file(f)
    except (OSError, journal.NotAJournal):
        return  # (none, or not ours: the base alone is what the files say for sure)
    if head.get("token") != token:
        return
    for m in metas:
        for row in m.get("failed", ()):
            failed[int(row["id"])] = {k: row[k] for k in ("id", "kind", "attempts", "rank", "host", "error")}
        for tid in m.get("unfailed", ()):
            failed.pop(int(tid), None)
        out["n_completed"], out["updated"] = int(m["n_completed"]), _text(m.get("updated"))


def read_json(path: str) -> dict[str, Any] | None:
    """A small JSON file (the record, the lock), or None if it is absent, half-written or not an object."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_lock(path: str) -> dict[str, Any] | None:
    """The lock file (:func:`read_json`), its heartbeat the later of its ``heartbeat`` field and the
    file's modification time (what the job's heartbeat refreshes, see nlevel.runtime.lock)."""
    lock = read_json(path)
    if lock is not None:
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            return lock
        beat = _seconds(lock.get("heartbeat"))
        lock["heartbeat"] = mtime if beat is None else max(beat, mtime)
    return lock


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else "" if x is None else str(x)


def _first(d: dict[str, Any] | None, *keys: str) -> Any:
    return next((d[k] for k in keys if d and d.get(k) not in (None, "")), None)


def _seconds(x: Any) -> float | None:
    """A time as seconds since the epoch, from seconds or ISO 8601 text (None if it is neither)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    if isinstance(x, str) and x:
        try:
            t = datetime.fromisoformat(x.replace("Z", "+00:00"))
        except ValueError:
            try:
                return float(x)
            except ValueError:
                return None
        return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()
    return None


def stopped_after(interval: float) -> float:
    """Seconds after which a heartbeat refreshed every ``interval`` s has stopped: three missed
    refreshes and 2 s for clocks of different hosts (the heartbeat's time is the writer's)."""
    return 3 * interval + 2.0


def _holder(src: dict[str, Any] | None, kind: str, now: float, this_host: str,
            alive: Callable[[int], bool]) -> dict[str, Any] | None:
    """Who a lock or record names, and whether that process runs now."""
    if not src:
        return None
    host = _first(src, "host", "hostname", "node")
    pid = _first(src, "pid", "process")
    try:
        pid = int(pid) if pid is not None else None
    except (TypeError, ValueError):
        pid = None
    beat = _seconds(_first(src, "heartbeat", "heartbeat_at", "beat", "updated", "time"))
    since = _seconds(_first(src, "started", "start", "start_time", "since", "created"))
    every = _seconds(_first(src, "heartbeat_interval", "interval", "heartbeat_s")) or 10.0
    if host == this_host and pid is not None:
        running = alive(pid)
        how = "process alive" if running else "process gone"
    elif beat is not None:
        age = now - beat
        running = age <= stopped_after(every)
        how = f"heartbeat {age:.0f} s ago" if running else \
            f"heartbeat stopped {age:.0f} s ago (expected every {every:g} s)"
    else:
        running, how = False, "no heartbeat"
    return {"from": kind, "host": host, "pid": pid, "job_id": _first(src, "job_id", "jobid", "job", "slurm_job_id"),
            "since": since, "heartbeat": beat, "running": running, "how": how}


def assemble(path: str, ck: dict[str, Any] | None, record: dict[str, Any] | None, lock: dict[str, Any] | None, *,
             now: float, this_host: str, alive: Callable[[int], bool] = _pid_alive) -> dict[str, Any]:
    """The status from what was read (pure): the dict ``--json`` prints and :func:`format_status` shows."""
    holders = [h for h in (_holder(lock, "lock", now, this_host, alive), _holder(record, "record", now, this_host, alive))
               if h is not None]
    if len(holders) == 2 and (holders[0]["host"], holders[0]["pid"]) == (holders[1]["host"], holders[1]["pid"]) \
            and holders[1]["heartbeat"] is not None and not (record or {}).get("finished"):
        holders = holders[1:]  # (one process: its record, refreshed every 2 s by a thread, tells sooner than its lock)
    running = next((h for h in holders if h["running"]), None)
    rec = record if record and record.get("checkpoint") in (None, os.path.abspath(path)) else None
    total = ck["total"] if ck else (rec or {}).get("total")
    done = ck["n_completed"] if ck else None
    out: dict[str, Any] = {"checkpoint": path, "exists": ck is not None, "total": total, "done": done}
    if ck:
        failed = ck["failed"]
        out["failed"] = sorted((f for f in failed if f["kind"] not in _QUARANTINED), key=lambda f: f["id"])
        out["quarantined"] = sorted((f for f in failed if f["kind"] in _QUARANTINED), key=lambda f: f["id"])
        where = (rec or {}).get("task_output")
        if where and (out["failed"] or out["quarantined"]):  # (the files of the first few, from --task-output)
            from .output import files_of

            out["task_output"] = where
            shown = (out["failed"] + out["quarantined"])[:_FILES_SHOWN]
            files = files_of(where, [int(f["id"]) for f in shown])
            for f in shown:
                f["output"] = files[int(f["id"])]
        out["identity"] = ck["identity"]
        out["written"] = {"updated": ck["updated"], "created": ck["created"], "version": ck["version"]}
        updated = _seconds(ck["updated"])
        out["written"]["age_s"] = now - updated if updated is not None else None
    rec_at = _seconds((rec or {}).get("updated"))
    every = _seconds((rec or {}).get("interval")) or 2.0
    live = (running is not None and rec is not None and not rec.get("finished") and rec_at is not None
            and now - rec_at <= 3 * every + 10)  # the record of the job that runs, not of an earlier one
    model = (rec or {}).get("model") or {}
    if model.get("plan"):
        out["plan"] = {"now": model.get("plan"), "why": model.get("reason"), "levels": model.get("levels"),
                       "decisions": model.get("decisions"), "rho": model.get("rho"),
                       "predicted_overhead": model.get("predicted"), "measured_overhead": model.get("measured"),
                       "as_of": rec.get("updated") if rec else None}
    elif ck and ck.get("plan"):
        try:
            first = json.loads(ck["plan"])
        except ValueError:
            first = {}
        out["plan"] = {"first": first, "why": first.get("reason") if isinstance(first, dict) else None}
    out["running"] = running is not None
    out["holder"] = running or (holders[0] if holders else None)
    if live and rec is not None and rec_at is not None:
        age = now - rec_at
        committed = rec.get("committed")
        out["live"] = {"committed": committed, "rate_per_s": rec.get("rate_per_s"),
                       "eta_s": max(0.0, rec["eta_s"] - age) if isinstance(rec.get("eta_s"), (int, float)) else None,
                       "as_of_s": age, "size": rec.get("size")}
        if isinstance(committed, int) and (done is None or committed > done):
            out["done_live"] = committed  # committed in the job, not yet in the file
    if rec and rec.get("finished"):
        out["finished"] = {"complete": rec.get("complete"), "at": rec.get("updated")}
    return out


def status(path: str) -> dict[str, Any]:
    """Read everything about the run of checkpoint ``path`` (see :func:`assemble`).

    Raises:
        FileNotFoundError: neither the checkpoint nor the job's record exists.
        ValueError: the file is not an nlevel checkpoint.
    """
    record = read_json(record_path(path))
    lock = read_lock(os.fspath(path) + ".lock")
    try:
        ck = read_checkpoint(path)
    except FileNotFoundError:
        if record is None and lock is None:
            raise
        ck = None  # a job that started but has not written its first checkpoint yet
    return assemble(path, ck, record, lock, now=time.time(), this_host=hostname())


# ---------------------------------------------------------------- showing it


def _when(t: Any, now: float) -> str:
    s = _seconds(t)
    if s is None:
        return "unknown"
    stamp = datetime.fromtimestamp(s, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{stamp} ({_ago(now - s)})"


def _ago(dt: float) -> str:
    if dt < 0:
        return "in the future"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if dt >= size:
            return f"{dt / size:.1f} {unit} ago" if dt < 10 * size else f"{dt / size:.0f} {unit} ago"
    return f"{dt:.0f} s ago"


def _ids(rows: list[dict[str, Any]], limit: int = 12) -> str:
    ids = [str(r["id"]) for r in rows[:limit]]
    return ", ".join(ids) + (f" ... ({len(rows) - limit} more)" if len(rows) > limit else "")


def _duration(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return f"{s:.0f} s"


def format_status(st: dict[str, Any], now: float | None = None) -> str:
    """The lines ``python -m nlevel.status`` prints."""
    now = time.time() if now is None else now
    path, total = st["checkpoint"], st.get("total")
    done = st.get("done_live", st.get("done"))
    lines = []
    if done is not None and total is not None:
        pct = 100.0 * done / total if total else 100.0
        extra = ""
        if "done_live" in st:
            extra = f" ({st['done']} in the file)" if st.get("done") is not None else " (no checkpoint written yet)"
        lines.append(f"{path}: {done}/{total} tasks done ({pct:.1f}%){extra}")
    else:
        lines.append(f"{path}: no checkpoint written yet" + (f" ({total} tasks)" if total is not None else ""))
    if st.get("exists"):
        failed, quarantined = st.get("failed", []), st.get("quarantined", [])
        if failed or quarantined:
            lines.append(f"  failed: {len(failed)}" + (f" ({_ids(failed)})" if failed else "")
                         + f"; quarantined: {len(quarantined)}" + (f" ({_ids(quarantined)})" if quarantined else ""))
            shown = [f for f in failed + quarantined if f.get("output")]
            for f in shown:
                lines.append(f"    task {f['id']} ({f['kind']}) output: {', '.join(f['output'])}")
            if shown and len(failed) + len(quarantined) > len(shown):
                lines.append(f"    (the others' files: {st.get('task_output')}/<id>.out and .err)")
        else:
            lines.append("  failed: none; quarantined: none")
        lines.append(f"  run: {st.get('identity')}")
        w = st["written"]
        lines.append(f"  last written: {_when(w['updated'], now)}; created {_when(w['created'], now)}")
    plan = st.get("plan") or {}
    if "now" in plan:
        model = [f"{plan['now']}"]
        if plan.get("rho") is not None:
            model.append(f"rho {plan['rho']:.2f} (busiest server)")
        over = [f"{k} {100 * plan[v]:.1f}%" for k, v in (("predicted", "predicted_overhead"),
                                                          ("measured", "measured_overhead")) if plan.get(v) is not None]
        if over:
            model.append("overhead " + ", ".join(over))
        lines.append(f"  plan: {'; '.join(model)}")
        if plan.get("why"):
            lines.append(f"    why: {plan['why']}")
    elif "first" in plan:
        first = plan["first"] if isinstance(plan["first"], dict) else {}
        lines.append(f"  plan at the start: {first.get('levels', '?')} levels"
                     + (f", regions {first.get('regions')}" if first.get("regions") else "")
                     + (f" ({plan['why']})" if plan.get("why") else ""))
    h = st.get("holder")
    if st.get("running") and h:
        who = f"pid {h['pid']} on {h['host']}" if h.get("pid") is not None else f"a process on {h.get('host')}"
        job = f", job {h['job_id']}" if h.get("job_id") else ""
        since = f", since {_when(h['since'], now)}" if h.get("since") is not None else ""
        lines.append(f"  running: yes, {who}{job}{since} ({h['how']}, from its {h['from']})")
        live = st.get("live")
        if live and live.get("rate_per_s"):
            eta = f", ETA {_duration(live['eta_s'])}" if live.get("eta_s") is not None else ""
            lines.append(f"  rate: {live['rate_per_s']:,.1f} tasks/s over the last half minute{eta} "
                         f"(as of {live['as_of_s']:.0f} s ago)")
        elif live is not None:
            lines.append("  rate: not measured yet")
    else:
        why = ""
        if h:
            why = f" (its {h['from']} names pid {h.get('pid')} on {h.get('host')}: {h['how']})"
        fin = st.get("finished")
        end = ""
        if fin:
            end = f"; the last job {'finished every task' if fin.get('complete') else 'ended with tasks left'} " \
                  f"{_ago(now - (_seconds(fin.get('at')) or now))}"
        lines.append(f"  running: no job holds it now{why}{end}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m nlevel.status``: 0 when the status was shown, 2 for a file that cannot be read."""
    p = argparse.ArgumentParser(prog="python -m nlevel.status", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", metavar="RUN.h5", help="the run's checkpoint file")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    args = p.parse_args(argv)
    path = args.checkpoint
    if os.path.isdir(path):
        print(f"nlevel.status: error: {path!r} is a directory; expected a run's checkpoint file (.h5)", file=sys.stderr)
        return 2
    try:
        st = status(path)
    except FileNotFoundError:
        print(f"nlevel.status: error: no checkpoint {path!r} (and no job record beside it); expected the "
              f"--checkpoint file of a run", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"nlevel.status: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(st, indent=1, default=str) if args.json else format_status(st))
    return 0
