"""Crash-safe HDF5 checkpoint of completed task ids, written by rank 0 alone (POSIX I/O).

A restarted job calls :func:`load` and skips the ids it returns. Rank 0 hands a :class:`Writer`
what changed since its previous write (a ledger's :class:`~nlevel.roles.ledger.Changes`), which
its thread appends to the journal beside the file: a write costs what is new, not the whole
job. A :class:`Snapshot` (a new master's first write: its ledger is not the one the file was
written from) is written whole.

A checkpoint is two files: the base ``<name>`` (HDF5, below) and its journal ``<name>.journal``
(:mod:`nlevel.runtime.journal`: one checksummed record per write, each holding the ranges,
results, failure records and timeout counts that are new). Readers (:func:`read`, :func:`load`)
see the base with the journal's records applied. When the journal outgrows a fraction
(``COMPACT_FRACTION``, at least ``COMPACT_MIN`` bytes) of the base, the writer folds it in: a
new base (written whole, as below) and an empty journal, so the bytes written per write stay
proportional, amortised, to what is new.

HDF5 layout of the base (format ``FORMAT_VERSION`` = 1)::

    /  attrs  nlevel_format      int   format version of the writer (marks the file as ours)
              total              int   number of task ids of the run, ids are [0, total)
              fingerprint        str   sha256 hex of the app + parameters
              fingerprint_source str   canonical JSON that was hashed (shown in errors)
              plan               str   JSON of the hierarchy plan (informational)
              version            str   nlevel version that wrote the file (informational)
              created            str   ISO 8601 UTC time of the first write of this run
              updated            str   ISO 8601 UTC time of this write (a journal record has its own)
              n_completed        int   number of completed ids (sum of range lengths)
              journal            str   token of this base's journal: a journal whose header names
                                        another token is stale and ignored; absent in files
                                        written before journals (their journal, if any, ignored)
    /completed      (K, 2) int64   sorted, disjoint, non-adjacent half-open ranges [start, stop)
    /result_ids     (R,)   int64   ids that have a result; each lies in a completed range
    /result_values  (R,) or (R, W) float64  result of result_ids[i] (W numbers per task
                                    when the app declares W result fields)
    /failed         (F,) compound  tasks recorded failed (not committed): id, kind ("raised",
                                    "died", "timeout", "bad result"), attempts, rank, host, error,
                                    traceback; absent in files written before it existed (read
                                    as empty)
    /timeouts       (T, 2) int64   id, times a rank holding it ran past --task-timeout (they
                                    count toward its quarantine in the next run); absent when none

A journal record's JSON part: ``k``, ``r``, ``w`` and ``ndim`` (counts and shape of its arrays),
``n_completed`` (after it), ``updated``, ``failed`` (records new or replaced, as objects),
``unfailed`` (ids no longer recorded failed), ``timeouts`` ([id, count] new or changed) and
``untimed`` (ids whose count is gone); its binary part: ``k`` ranges (int64 pairs, each newly
completed), ``r`` result ids (int64) and their values (float64, ``w`` per id).

Crash safety: a base is written whole under a temporary name in the same directory
(``<name>.tmp-<pid>-<n>``), fsynced, ``os.replace``-d over the target, and the directory
fsynced, so a SIGKILL at any instant leaves either the old or the new base; its new token
makes any older journal stale. A journal is made the same way (header only), then a write
appends a record and fsyncs it before it counts as written; a kill during an append leaves a
partial last record, which readers ignore and the next writer cuts off. A compaction writes
the new base from the files on disk (base + journal) before it drops the journal. :func:`load`
removes temporaries left by a killed writer.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # (numpy.typing at run time cost a farm's first call 2 ms)
    import numpy.typing as npt

from nlevel.errors import CheckpointError
from nlevel.runtime import journal
from nlevel.runtime.identity import covers, differences, fingerprint, identity_error, start_over
from nlevel.roles.ledger import Changes, Ledger
from nlevel.roles.messages import TaskFailure

__all__ = ["COMPACT_FRACTION", "COMPACT_MIN", "FORMAT_VERSION", "RunMeta", "Snapshot", "Store", "covers",
           "differences", "fingerprint", "h5", "load", "read", "resume", "start_over",
           "stored_result_ids", "write", "write_error", "Writer"]  # (covers .. start_over: nlevel.runtime.identity)

FORMAT_VERSION = 1
#: The journal is folded into a new base when it holds more bytes than this fraction of the
#: base's ...
COMPACT_FRACTION = 0.5
#: ... and at least this many: a compaction rewrites base + journal, so between two of them
#: at least half as many bytes are appended as the next one writes (amortised, a write costs
#: a few times what is new), and loading never reads a journal much longer than the base.
COMPACT_MIN = 1 << 20

_ROOT_MARK = "nlevel_format"
_NOT_OURS = "nlevel will not overwrite it: move it away or choose another path"
_temp_counter = itertools.count()


@dataclass(frozen=True)
class RunMeta:
    """What identifies a run: a checkpoint is only reused by a run with the same meta."""

    total: int               # number of task ids; ids are [0, total)
    fingerprint: str         # sha256 hex of app + parameters, see fingerprint()
    fingerprint_source: str  # the canonical JSON that was hashed (shown in mismatch errors)
    plan: str                # JSON of the hierarchy plan (informational only)
    version: str             # nlevel version (informational only)


def _coerce(x: npt.ArrayLike, dtype: type, empty_shape: tuple[int, ...]) -> np.ndarray:
    a = np.asarray(x)
    if a.size == 0:  # [] comes in as float64 and shape (0,); give it the expected form
        return np.zeros(empty_shape, dtype)
    return a.astype(dtype, casting="same_kind", copy=False)  # refuses float ids


@dataclass(frozen=True, eq=False)
class Snapshot:
    """Completed ids and results at one instant; array-likes are converted to the dtypes below.

    Treat as immutable: a :class:`Writer` keeps a reference until the snapshot is written.

    Raises:
        TypeError: an array cannot be cast without changing kind (e.g. float ids).
    """

    completed: np.ndarray      # (K, 2) int64, sorted, disjoint, non-adjacent [start, stop)
    result_ids: np.ndarray     # (R,) int64 ids that have a result, each in a completed range
    result_values: np.ndarray  # (R,) or (R, W) float64, result_values[i] belongs to result_ids[i]
    failed: tuple[TaskFailure, ...] = ()  # tasks recorded failed, none of them completed
    timeouts: tuple[tuple[int, int], ...] = ()  # (id, times it ran past --task-timeout): they count on

    def __post_init__(self) -> None:
        object.__setattr__(self, "completed", _coerce(self.completed, np.int64, (0, 2)))
        object.__setattr__(self, "result_ids", _coerce(self.result_ids, np.int64, (0,)))
        object.__setattr__(self, "result_values", _coerce(self.result_values, np.float64, (0,)))

    @property
    def n_completed(self) -> int:
        """Number of completed ids (sum of range lengths)."""
        c = self.completed
        return int((c[:, 1] - c[:, 0]).sum()) if c.ndim == 2 and c.shape[1:] == (2,) else 0

    def ledger(self, total: int, width: int = 1) -> Ledger:
        """A ledger holding what this snapshot records (for resuming, or a new master)."""
        led = Ledger(total, map(tuple, self.completed.tolist()), self.result_ids.tolist(),
                     self.result_values.ravel().tolist(), width=width)
        for f in self.failed:
            led.fail(f)
        led.timeouts = {int(tid): int(k) for tid, k in self.timeouts}
        return led

    @staticmethod
    def empty() -> Snapshot:
        """Return a snapshot with nothing completed."""
        return Snapshot(np.zeros((0, 2), np.int64), np.zeros(0, np.int64), np.zeros(0))


def _problem(snap: Snapshot, total: int) -> str | None:
    """Describe the first way `snap` is not a valid snapshot of ids [0, total), or None."""
    c, ids, vals = snap.completed, snap.result_ids, snap.result_values
    if total < 0:
        return f"total must be >= 0, got {total}"
    if c.ndim != 2 or c.shape[1] != 2:
        return f"'completed' has shape {c.shape}, expected (K, 2)"
    if ids.ndim != 1 or vals.ndim not in (1, 2) or vals.shape[:1] != ids.shape:
        return f"'result_ids' shape {ids.shape} and 'result_values' shape {vals.shape} differ"
    starts, stops = c[:, 0], c[:, 1]
    bad = np.flatnonzero(stops <= starts)
    if bad.size:
        i = int(bad[0])
        return f"completed range {i} [{starts[i]}, {stops[i]}) is empty or reversed"
    bad = np.flatnonzero(starts[1:] <= stops[:-1])
    if bad.size:
        i = int(bad[0])
        return (f"completed ranges {i} [{starts[i]}, {stops[i]}) and {i + 1} "
                f"[{starts[i + 1]}, {stops[i + 1]}) are unsorted, overlap or touch")
    if len(c) and (starts[0] < 0 or stops[-1] > total):
        return f"completed ranges span [{starts[0]}, {stops[-1]}), outside [0, {total})"
    if ids.size:
        if not len(c):
            return f"{ids.size} result ids but no completed ranges"
        j = np.searchsorted(stops[:-1], ids, side="right")  # first range with stop > id
        outside = (ids < starts.take(j)) | (ids >= stops.take(j))
        if outside.any():
            bad = np.flatnonzero(outside)
            return f"result id {ids[bad[0]]} (index {bad[0]}) is not in a completed range"
    return None


def _temp_name(path: Path) -> Path:
    return path.with_name(f"{path.name}.tmp-{os.getpid()}-{next(_temp_counter)}")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)  # fsync through any descriptor flushes the whole inode
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _check_directory(path: Path) -> None:
    d = path.parent
    if not d.exists():
        raise CheckpointError(f"directory {d} of checkpoint {path} does not exist")
    if not d.is_dir():
        raise CheckpointError(f"{d} (where checkpoint {path} would go) is not a directory")
    probe = _temp_name(path)
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.unlink(probe)
    except OSError as e:
        raise CheckpointError(f"cannot create files in directory {d} for checkpoint {path}: "
                              f"{e}") from e


def _remove_stale_temps(path: Path) -> None:
    pattern = re.compile(re.escape(path.name) + r"\.tmp-(\d+)-\d+")
    with os.scandir(path.parent) as entries:
        for e in entries:
            m = pattern.fullmatch(e.name)
            # Our own pid may have a live Writer; any other pid's temporary is a leftover.
            if m and int(m.group(1)) != os.getpid() and e.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)


def _move_aside(path: Path) -> Path:
    """Rename the checkpoint to a free ``.bak`` name, its journal with it (``<bak>.journal``: it
    stays a checkpoint that :func:`read` reads whole)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    for n in itertools.count():
        bak = Path(f"{path}.{stamp}{f'-{n}' if n else ''}.bak")
        # (single writer, rank 0: no race with another mover)
        if not os.path.lexists(bak) and not os.path.lexists(journal.beside(bak)):
            if journal.is_journal(journal.beside(path)):
                os.rename(journal.beside(path), journal.beside(bak))
            os.rename(path, bak)
            _fsync(path.parent)
            return bak
    raise AssertionError("unreachable")


def h5() -> Any:
    """h5py, imported when a checkpoint is first read or written, or by the two ranks next in line
    to become master before they may have to take over (it costs ~0.1 s: a job without a
    checkpoint should not pay it before its first id)."""
    import h5py

    return h5py


def _failed_dtype() -> np.dtype[Any]:
    text = h5().string_dtype()
    return np.dtype([("id", np.int64), ("kind", text), ("attempts", np.int64), ("rank", np.int64),
                     ("host", text), ("error", text), ("traceback", text)])


def _failed_array(failed: tuple[TaskFailure, ...]) -> np.ndarray:
    rows = [(f.id, f.kind, f.attempts, f.rank, f.host, f.error, f.traceback) for f in failed]
    return np.array(rows, dtype=_failed_dtype())


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _read_failed(rows: np.ndarray) -> tuple[TaskFailure, ...]:
    return tuple(TaskFailure(int(r["id"]), _text(r["kind"]), _text(r["error"]), int(r["rank"]), _text(r["host"]),
                             _text(r["traceback"]), int(r["attempts"])) for r in rows)


def _foreign_journal(path: Path) -> CheckpointError:
    return CheckpointError(f"{journal.beside(path)} (beside checkpoint {path}) is not an nlevel checkpoint journal; "
                           f"{_NOT_OURS}")


def _read_base(path: Path) -> tuple[RunMeta, Snapshot, dict[str, Any], str | None]:
    """The base alone, checked, and its journal's token (None: a file written before journals)."""
    corrupt = f"checkpoint {path} is corrupt or truncated"
    try:
        is_hdf5 = h5().is_hdf5(path)
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from e
    if not is_hdf5:
        raise CheckpointError(f"checkpoint {path} is not an HDF5 file; {_NOT_OURS}")
    try:
        with h5().File(path, "r") as f:
            a = f.attrs
            if _ROOT_MARK not in a:
                raise CheckpointError(f"{path} is an HDF5 file but not an nlevel checkpoint "
                                      f"(no '{_ROOT_MARK}' attribute); {_NOT_OURS}")
            fmt = int(a[_ROOT_MARK])
            if fmt > FORMAT_VERSION:
                raise CheckpointError(f"checkpoint {path} has format {fmt}, newer than "
                                      f"{FORMAT_VERSION} which this nlevel reads; upgrade nlevel")
            meta = RunMeta(int(a["total"]), str(a["fingerprint"]), str(a["fingerprint_source"]),
                           str(a["plan"]), str(a["version"]))
            extra: dict[str, Any] = {"format": fmt, "created": str(a["created"]), "updated": str(a["updated"]),
                                     "n_completed": int(a["n_completed"]), "journal_records": 0}
            token = str(a["journal"]) if "journal" in a else None
            failed = _read_failed(f["failed"][()]) if "failed" in f else ()
            timeouts = tuple(map(tuple, f["timeouts"][()].tolist())) if "timeouts" in f else ()
            snap = Snapshot(f["completed"][()], f["result_ids"][()], f["result_values"][()], failed, timeouts)
    except CheckpointError:
        raise
    except Exception as e:  # h5py raises OSError, KeyError, ValueError, ... on damage
        raise CheckpointError(f"{corrupt} ({type(e).__name__}: {e})", start_over(path)) from e
    _check(path, snap, meta.total, extra["n_completed"])
    return meta, snap, extra, token


def _check(path: Path, snap: Snapshot, total: int, n_completed: int) -> None:
    problem = _problem(snap, total)
    if problem is None and snap.n_completed != n_completed:
        problem = f"n_completed is {n_completed} but the ranges hold {snap.n_completed}"
    if problem:
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated ({problem})", start_over(path))


def _journal_records(path: Path, token: str | None) -> list[journal.Record]:
    """The whole records of the journal of the base whose token is ``token`` ([] when there is none,
    or it is stale); a partial last record is left out.

    Raises:
        CheckpointError: something else than a journal is where the journal goes.
    """
    where = journal.beside(path)
    try:
        data = where.read_bytes()
    except FileNotFoundError:
        return []
    except OSError:
        raise _foreign_journal(path) from None  # (a directory, a file we may not read: not ours)
    try:
        head, records, _ = journal.scan(data)
    except journal.NotAJournal:
        raise _foreign_journal(path) from None
    return records if token is not None and head.get("token") == token else []


def _union(ranges: np.ndarray) -> np.ndarray:
    """Sorted, disjoint, non-adjacent ranges covering the (K, 2) ``ranges``."""
    if len(ranges) < 2:
        return ranges
    r = ranges[np.argsort(ranges[:, 0], kind="stable")]
    reach = np.maximum.accumulate(r[:, 1])
    first = np.ones(len(r), bool)
    first[1:] = r[1:, 0] > reach[:-1]
    at = np.flatnonzero(first)
    last = np.append(at[1:] - 1, len(r) - 1)
    return np.stack([r[at, 0], reach[last]], axis=1)


def _inside(ids: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """Which ``ids`` lie in the sorted, disjoint ``ranges``."""
    if not len(ranges) or not len(ids):
        return np.zeros(len(ids), bool)
    j = np.searchsorted(ranges[:-1, 1], ids, side="right")  # the first range with stop > id
    return (ids >= ranges[j, 0]) & (ids < ranges[j, 1])


def _failure(row: dict[str, Any]) -> TaskFailure:
    return TaskFailure(int(row["id"]), str(row["kind"]), str(row["error"]), int(row["rank"]), str(row["host"]),
                       str(row["traceback"]), int(row["attempts"]))


def _apply(path: Path, snap: Snapshot, extra: dict[str, Any],
           records: list[journal.Record]) -> tuple[Snapshot, dict[str, Any]]:
    """The base ``snap`` with the journal's ``records`` applied in order.

    An id is counted once however many records name it; of results for one id the first is kept
    (the base's, then the journal's in order), as the ledger does.
    """
    ranges = [snap.completed]
    ids: list[np.ndarray] = []
    values: list[np.ndarray] = []
    failed = {f.id: f for f in snap.failed}
    timeouts = dict(snap.timeouts)
    claimed, updated = extra["n_completed"], extra["updated"]
    try:
        for meta, body in records:
            k, r, w, ndim = int(meta["k"]), int(meta["r"]), int(meta["w"]), int(meta["ndim"])
            assert body is not None
            if min(k, r, w) < 0 or ndim not in (1, 2) or (ndim == 1 and w != 1) or len(body) != 8 * (2 * k + r + r * w):
                raise ValueError(f"a record describes {k} ranges and {r} results of {w} numbers, its binary part "
                                 f"holds {len(body)} bytes")
            ranges.append(np.frombuffer(body, "<i8", 2 * k).reshape(k, 2).astype(np.int64))
            ids.append(np.frombuffer(body, "<i8", r, 16 * k).astype(np.int64))
            v = np.frombuffer(body, "<f8", r * w, 8 * (2 * k + r)).astype(np.float64)
            values.append(v if ndim == 1 else v.reshape(r, w))
            for row in meta["failed"]:
                failed[int(row["id"])] = _failure(row)
            for tid in meta["unfailed"]:
                failed.pop(int(tid), None)
            for tid, n in meta["timeouts"]:
                timeouts[int(tid)] = int(n)
            for tid in meta["untimed"]:
                timeouts.pop(int(tid), None)
            claimed, updated = int(meta["n_completed"]), str(meta["updated"])
        base_values = snap.result_values
        shapes = {v.shape[1:] for v in values if len(v)} | ({base_values.shape[1:]} if len(base_values) else set())
        if len(shapes) > 1:
            raise ValueError(f"results of shapes {sorted(shapes)} in the base and its journal")
        shape = shapes.pop() if shapes else base_values.shape[1:]
        new_ids = np.concatenate(ids)
        new_values = np.concatenate([v.reshape((-1, *shape)) for v in values])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated (its journal {journal.beside(path)}: "
                              f"{type(e).__name__}: {e})", start_over(path)) from None
    keep = ~_inside(new_ids, snap.completed)  # (committed in the base: results of a second run of an id)
    if len(new_ids):
        once = np.zeros(len(new_ids), bool)
        once[np.unique(new_ids, return_index=True)[1]] = True
        keep &= once
    out = Snapshot(_union(np.concatenate(ranges)), np.concatenate([snap.result_ids, new_ids[keep]]),
                   np.concatenate([base_values.reshape((-1, *shape)), new_values[keep]]),
                   tuple(failed.values()), tuple(sorted(timeouts.items())))
    return out, {**extra, "updated": updated, "n_completed": claimed, "journal_records": len(records)}


def _read(path: Path) -> tuple[RunMeta, Snapshot, dict[str, Any]]:
    meta, snap, extra, token = _read_base(path)
    records = _journal_records(path, token)
    if records:
        snap, extra = _apply(path, snap, extra, records)
        _check(path, snap, meta.total, extra["n_completed"])
    return meta, snap, extra


def read(path: str | os.PathLike[str]) -> tuple[RunMeta, Snapshot, dict[str, Any]]:
    """Read a checkpoint without comparing it to a run (for tools and tests).

    Args:
        path: the checkpoint file.

    Returns:
        ``(meta, snapshot, extra)``: the base with its journal applied; extra holds ``format``,
        ``created`` and ``updated`` (ISO 8601 UTC strings), ``n_completed`` and
        ``journal_records`` (how many journal records were applied).

    Raises:
        CheckpointError: the file is unreadable, not HDF5, not ours, newer, or corrupt, or
            something else than a journal is where its journal goes.
    """
    return _read(Path(path))


def stored_result_ids(path: str | os.PathLike[str]) -> np.ndarray:
    """Every result id the checkpoint's files hold, repeats included: the base's, then its journal's in
    order (for audits: a repeat is a double commit, which :func:`read` would hide by keeping the first).

    Raises:
        CheckpointError, OSError, KeyError: the files are unreadable.
    """
    p = Path(path)
    with h5().File(p, "r", locking=False) as f:
        ids = [np.asarray(f["result_ids"][...], np.int64)] if "result_ids" in f else []
        token = str(f.attrs["journal"]) if "journal" in f.attrs else None
    for meta, body in _journal_records(p, token):
        assert body is not None
        ids.append(np.frombuffer(body, "<i8", int(meta["r"]), 16 * int(meta["k"])).astype(np.int64))
    return np.concatenate(ids) if ids else np.zeros(0, np.int64)


def load(path: str | os.PathLike[str], meta: RunMeta, *, fresh: bool = False) -> Snapshot:
    """Validate and read the checkpoint for the run described by `meta` (see :func:`resume`).

    Returns:
        The stored snapshot, or an empty one if there is no file (or ``fresh``).

    Raises:
        CheckpointError: as :func:`resume`.
    """
    return resume(path, meta, fresh=fresh)[1]


def resume(path: str | os.PathLike[str], meta: RunMeta, *, fresh: bool = False) -> tuple[RunMeta, Snapshot]:
    """Validate and read the checkpoint for the run described by `meta`.

    The run may resume the file when the totals agree and the file's identity covers the
    run's: the same app, and every parameter the run counts (its fingerprint's params)
    stored with the same value. The file may record more parameters than the run counts
    (a checkpoint written when the default identity held the whole command line, or an
    app that has since left an option out of its identity): those never block a resume,
    and the file keeps its identity (the returned meta carries it, so writes replace it).

    Only ``fresh=True`` changes anything on disk besides removing stale temporaries: it
    renames an existing file to ``<path>.<UTC yyyymmddTHHMMSS>[-n].bak`` (with a warning), and
    its journal to that name with ``.journal`` added.

    Args:
        path: the checkpoint file; it need not exist, but its directory must be writable.
        meta: the run that wants to resume.
        fresh: start over, keeping any existing file aside.

    Returns:
        ``(meta to write with, snapshot)``: ``meta`` itself, or it with the file's fingerprint
        when the file records more parameters; the stored snapshot, or an empty one if there
        is no file (or ``fresh``).

    Raises:
        CheckpointError: path is a directory; its directory is missing or unwritable; the
            file is not HDF5, not an nlevel checkpoint, corrupt, of a newer format, or belongs
            to a run with another identity (app, parameters) or total; something else than a
            journal is where its journal goes. The message names both
            sides and what differs; its remedies say how to keep the progress or start over.
    """
    p = Path(path)
    if p.is_dir():
        raise CheckpointError(f"checkpoint path {p} is a directory; expected an HDF5 file path")
    _check_directory(p)
    _remove_stale_temps(p)
    if journal.is_journal(journal.beside(p)) is False:  # (refused now: the writer would not replace it)
        raise _foreign_journal(p)
    if not p.exists():
        return meta, Snapshot.empty()
    if fresh:
        bak = _move_aside(p)
        warnings.warn(f"fresh start: moved the existing checkpoint {p} to {bak}", stacklevel=2)
        return meta, Snapshot.empty()
    stored, snap, _ = _read(p)
    if stored.fingerprint != meta.fingerprint:
        if not covers(stored.fingerprint_source, meta.fingerprint_source):
            raise identity_error(p, stored.fingerprint_source, meta.fingerprint_source)
        meta = RunMeta(meta.total, stored.fingerprint, stored.fingerprint_source, meta.plan, meta.version)
    if stored.total != meta.total:
        raise CheckpointError(
            f"checkpoint {p} has total {stored.total} task ids, this run has {meta.total}",
            {api: f"to keep its progress, run with total {stored.total}; {text}"
             for api, text in start_over(p).items()})
    return meta, snap


def _previous_created(path: Path, meta: RunMeta) -> str | None:
    """'created' of the file being replaced; refuses to replace a file of someone else."""
    if not path.exists():
        return None
    try:
        with h5().File(path, "r") as f:
            a = dict(f.attrs)
    except Exception as e:
        raise CheckpointError(f"refusing to replace {path}: it is not a readable nlevel checkpoint ({_why(e)})",
                              path=str(path), errno=getattr(e, "errno", None) or None) from None
    if _ROOT_MARK not in a or str(a.get("fingerprint")) != meta.fingerprint:
        raise CheckpointError(f"refusing to replace {path}: it is not a checkpoint of this run "
                              f"(fingerprint {a.get('fingerprint')}, expected {meta.fingerprint})")
    return str(a["created"]) if "created" in a else None


def _why(e: BaseException) -> str:
    """An error in one short line (h5py's OSError spans lines, naming buffers and offsets)."""
    if isinstance(e, OSError) and e.errno:
        return f"{os.strerror(e.errno)} (errno {e.errno})"
    return " ".join(f"{type(e).__name__}: {e}".split())


def write_error(path: str | os.PathLike[str], e: BaseException) -> CheckpointError:
    """The one error a failed write of checkpoint ``path`` raises: the file, the cause in a few words, its errno
    (a :class:`CheckpointError` already: the same, new, to be raised anew without its traceback)."""
    if isinstance(e, CheckpointError):
        return e.again()
    n = e.errno if isinstance(e, OSError) and e.errno else None
    return CheckpointError(f"cannot write checkpoint {os.fspath(path)}: {_why(e)}; the previous checkpoint, if any, "
                           f"is intact", path=os.fspath(path), errno=n)


def write(path: str | os.PathLike[str], meta: RunMeta, snap: Snapshot) -> None:
    """Atomically replace `path` with a checkpoint holding `meta` and `snap` (its journal, if any,
    is stale from then on, and removed).

    Keeps the ``created`` time of the file it replaces. On any error the previous file is
    intact and the temporary file is removed.

    Args:
        path: the checkpoint file.
        meta: the run.
        snap: what to store; must be valid for ``meta.total``.

    Raises:
        CheckpointError: `snap` is invalid; the existing file is not a checkpoint of this run, or
            something else than a journal is where its journal goes; or an OS error (disk full,
            permission, missing directory), named in the message.
    """
    _write_whole(Path(path), meta, snap)


def _write_whole(p: Path, meta: RunMeta, snap: Snapshot) -> tuple[str, os.stat_result]:
    """:func:`write`; returns the new base's journal token and its ``stat``."""
    problem = _problem(snap, meta.total)
    if problem:
        raise CheckpointError(f"refusing to write checkpoint {p}: {problem}")
    if journal.is_journal(journal.beside(p)) is False:
        raise CheckpointError(f"refusing to write checkpoint {p}: {journal.beside(p)} beside it is not an nlevel "
                              f"checkpoint journal; {_NOT_OURS}")
    now = _utc_now()
    created = _previous_created(p, meta) or now
    token = os.urandom(16).hex()
    tmp = _temp_name(p)
    try:
        with h5().File(tmp, "x") as f:
            f.attrs.update({_ROOT_MARK: FORMAT_VERSION, "total": meta.total,
                            "fingerprint": meta.fingerprint,
                            "fingerprint_source": meta.fingerprint_source, "plan": meta.plan,
                            "version": meta.version, "created": created, "updated": now,
                            "n_completed": snap.n_completed, "journal": token})
            # Contiguous, no gzip: 1e6 results take 10 ms vs 190 ms with gzip-1, for half the size.
            f.create_dataset("completed", data=snap.completed)
            f.create_dataset("result_ids", data=snap.result_ids)
            f.create_dataset("result_values", data=snap.result_values)
            f.create_dataset("failed", data=_failed_array(snap.failed))
            if snap.timeouts:
                f.create_dataset("timeouts", data=np.array(snap.timeouts, np.int64).reshape(-1, 2))
        _fsync(tmp)
        os.replace(tmp, p)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, Exception):
            raise write_error(p, e) from None  # (h5py's chained internals say nothing more)
        raise
    try:
        _fsync(p.parent)  # makes the rename itself durable
    except OSError as e:
        raise CheckpointError(f"wrote checkpoint {p} but cannot fsync its directory: {_why(e)}", path=str(p),
                              errno=e.errno or None) from None
    with contextlib.suppress(OSError):  # (stale now, by its token: removing it is tidiness)
        os.unlink(journal.beside(p))
    return token, os.stat(p)


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _record(changes: Changes) -> bytes:
    """``changes`` as one journal record (see the module's docstring)."""
    width = changes.width
    completed = np.array(changes.completed, np.int64).reshape(-1, 2)
    ids = np.frombuffer(changes.result_ids, np.int64) if changes.result_ids else np.zeros(0, np.int64)
    values = np.frombuffer(changes.result_values, np.float64) if changes.result_values else np.zeros(0)
    meta = {"k": len(completed), "r": len(ids), "w": width, "ndim": 1 if width == 1 else 2,
            "n_completed": changes.n_committed, "updated": _utc_now(),
            "failed": [{"id": f.id, "kind": f.kind, "attempts": f.attempts, "rank": f.rank, "host": f.host,
                        "error": f.error, "traceback": f.traceback} for f in changes.failed],
            "unfailed": list(changes.unfailed), "timeouts": [list(t) for t in changes.timeouts],
            "untimed": list(changes.untimed)}
    return journal.record(meta, (completed.astype("<i8", copy=False).tobytes(),
                                 ids.astype("<i8", copy=False).tobytes(),
                                 values.astype("<f8", copy=False).tobytes()))


def _whole_of(changes: Changes) -> Snapshot:
    """The snapshot that ``changes`` make of nothing (a run that found no checkpoint: its first write)."""
    values = np.frombuffer(changes.result_values, np.float64) if changes.result_values else np.zeros(0)
    return Snapshot(np.array(changes.completed, np.int64).reshape(-1, 2),
                    np.frombuffer(changes.result_ids, np.int64) if changes.result_ids else np.zeros(0, np.int64),
                    values if changes.width == 1 else values.reshape(-1, changes.width), changes.failed,
                    changes.timeouts)


class Store:
    """The checkpoint on disk as its one writer sees it (synchronous; :class:`Writer` runs one on
    its thread): a :class:`Snapshot` is written whole, :class:`~nlevel.roles.ledger.Changes` are
    appended to the journal, which is folded into a new base when it grows past
    ``compact_fraction`` of the base (and ``compact_min`` bytes).

    Changes apply to what the files hold: those of a ledger that was tracked (see
    :meth:`~nlevel.roles.ledger.Ledger.track`) from the state this run loaded, or from nothing
    when there was no file (the first write then makes the base). Stats: ``bytes_written``
    (every byte this store wrote, bases, journal headers and records), ``appends`` and
    ``compactions``.

    Args:
        path: the checkpoint file.
        meta: the run.
    """

    def __init__(self, path: str | os.PathLike[str], meta: RunMeta, *, compact_fraction: float = COMPACT_FRACTION,
                 compact_min: int = COMPACT_MIN) -> None:
        self.path = Path(path)
        self.meta = meta
        self.compact_fraction = compact_fraction
        self.compact_min = compact_min
        #: The file existed when this store was made: changes go onto it, never onto a new one.
        self._resumes = self.path.exists()
        self._token: str | None = None  # the base's journal token (None: the files not looked at yet)
        self._base = (0, 0, 0, 0)  # the base as written or read (device, inode, size, mtime)
        self._fd: int | None = None  # the journal, open to append (None: to be made)
        self._end = 0  # bytes of the journal that hold whole records
        self._compact_at = 0  # the journal's length from which to compact
        self._compact_floor = 0  # ... not below this, after a compaction failed
        self.bytes_written = 0
        self.appends = 0
        self.compactions = 0

    def write(self, item: Snapshot | Changes) -> None:
        """Write a whole snapshot, or append changes (nothing, when nothing changed and the file exists).

        Raises:
            CheckpointError: as :func:`write`; the base was replaced or removed by someone else
                since this store wrote or read it; or an OS error, named in the message. The
                files then hold what they held before the call.
        """
        if isinstance(item, Snapshot):
            self._whole(item)
        elif not item.empty or not (self._token is not None or self._resumes):
            self._append(item)

    def close(self) -> None:
        """Close the journal (the store opens it again if it writes again)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None

    def _forget(self) -> None:
        """Look at the files again before the next append (after an error left their state unsure)."""
        self.close()
        self._token = None

    def _whole(self, snap: Snapshot) -> None:
        self._forget()
        token, st = _write_whole(self.path, self.meta, snap)
        self._token, self._base, self._end = token, _identity(st), 0
        self._compact_floor = 0
        self._compact_at = self._threshold(st.st_size)
        self.bytes_written += st.st_size

    def _threshold(self, base_size: int) -> int:
        return max(int(self.compact_fraction * base_size), self.compact_min, self._compact_floor)

    def _open(self, changes: Changes) -> bool:
        """Look at the files before the first append; return True when that wrote ``changes`` already
        (there was no file: the base is made of them)."""
        p = self.path
        if not p.exists():
            if self._resumes:
                raise CheckpointError(f"checkpoint {p} was removed while this job ran; this job appends what is "
                                      f"new to it, and does not write it anew", path=str(p))
            self._whole(_whole_of(changes))
            return True
        try:
            with h5().File(p, "r") as f:
                a = dict(f.attrs)
            st = os.stat(p)
        except Exception as e:
            raise CheckpointError(f"refusing to append to {p}: it is not a readable nlevel checkpoint ({_why(e)})",
                                  path=str(p), errno=getattr(e, "errno", None) or None) from None
        if _ROOT_MARK not in a or str(a.get("fingerprint")) != self.meta.fingerprint:
            raise CheckpointError(f"refusing to append to {p}: it is not a checkpoint of this run "
                                  f"(fingerprint {a.get('fingerprint')}, expected {self.meta.fingerprint})")
        if "journal" not in a:  # written before journals: rewritten once, with a journal token
            self._compact()
            return False
        self._token, self._base = str(a["journal"]), _identity(st)
        self._compact_at = self._threshold(st.st_size)
        where = journal.beside(p)
        try:
            data = where.read_bytes()
        except FileNotFoundError:
            return False
        except OSError:
            raise _foreign_journal(p) from None
        try:
            head, _, end = journal.scan(data)
        except journal.NotAJournal:
            raise _foreign_journal(p) from None
        if head.get("token") == self._token:  # (else stale: replaced at the first append)
            fd = os.open(where, os.O_WRONLY)
            try:
                if len(data) > end:  # a record cut short by a kill: what follows it must be readable
                    os.ftruncate(fd, end)
                    os.fsync(fd)
            except BaseException:
                os.close(fd)
                raise
            self._fd, self._end = fd, end
        return False

    def _start_journal(self) -> None:
        """A journal with its header only, made whole under a temporary name and renamed into place."""
        assert self._token is not None
        p, where = self.path, journal.beside(self.path)
        if journal.is_journal(where) is False:
            raise _foreign_journal(p)
        head = journal.header(self._token, self.meta.fingerprint, self.meta.total)
        tmp = _temp_name(p)
        try:
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            try:
                _write_at(fd, head, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, where)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync(p.parent)
        self._fd, self._end = os.open(where, os.O_WRONLY), len(head)
        self.bytes_written += len(head)

    def _append(self, changes: Changes) -> None:
        try:
            if self._token is None and self._open(changes):
                return
            if _identity(os.stat(self.path)) != self._base:
                raise CheckpointError(f"checkpoint {self.path} was replaced since this job last wrote it (by another "
                                      f"job, or by hand); this job does not append to it", path=str(self.path))
            if self._fd is None:
                self._start_journal()
            assert self._fd is not None
            rec = _record(changes)
            try:
                _write_at(self._fd, rec, self._end)
                os.fsync(self._fd)
            except BaseException:
                try:  # (a later record must follow the last whole one)
                    os.ftruncate(self._fd, self._end)
                except OSError:
                    self._forget()  # (the next append looks again, and cuts what is left off)
                raise
        except Exception as e:
            raise write_error(self.path, e) from None
        self._end += len(rec)
        self.bytes_written += len(rec)
        self.appends += 1
        if self._end >= self._compact_at:
            try:
                self._compact()
            except Exception:  # (the journal holds everything: it stays, and is tried again when twice as long)
                self._compact_floor = 2 * self._end
                self._forget()

    def _compact(self) -> None:
        """Fold the journal into a new base, from the files (the base written whole, then the journal dropped)."""
        _, snap, _ = _read(self.path)
        self._whole(snap)
        self.compactions += 1


def _write_at(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class Writer:
    """Background writer thread for rank 0, so the server loop never blocks on disk.

    It writes what it is given through a :class:`Store`: :class:`~nlevel.roles.ledger.Changes`
    are appended (those still pending are joined into one record), a :class:`Snapshot` is
    written whole and supersedes whatever is pending. A failed write does not stop the thread,
    and what it failed to write is kept and written with the next one (then the files are
    current again): :attr:`error` is the error of the latest write, None after a success.
    Stats for the run report: ``writes`` (successful), ``failures``, ``bytes_written`` (every
    byte written), ``last_write_seconds`` (fsyncs included), ``appends`` and ``compactions``.

    Args:
        path: the checkpoint file.
        meta: the run.
        compact_fraction, compact_min: see :class:`Store`.
    """

    def __init__(self, path: str | os.PathLike[str], meta: RunMeta, *, compact_fraction: float = COMPACT_FRACTION,
                 compact_min: int = COMPACT_MIN) -> None:
        self._path = Path(path)
        self._meta = meta
        self._store = Store(path, meta, compact_fraction=compact_fraction, compact_min=compact_min)
        self._cond = threading.Condition()
        self._whole: Snapshot | None = None  # pending: a snapshot to write whole, ...
        self._changes: Changes | None = None  # ... then changes to append
        self._due = False  # something was submitted since the thread last took what is pending
        self._closed = False
        self._error: CheckpointError | None = None
        self.writes = 0
        self.failures = 0
        self.last_write_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="nlevel-checkpoint", daemon=True)
        self._thread.start()

    @property
    def error(self) -> CheckpointError | None:
        """The error of the latest write, or None when it succeeded."""
        return self._error

    @property
    def bytes_written(self) -> int:
        """Bytes written so far (bases, journal headers and records)."""
        return self._store.bytes_written

    @property
    def appends(self) -> int:
        """Records appended to the journal so far."""
        return self._store.appends

    @property
    def compactions(self) -> int:
        """Times the journal was folded into a new base."""
        return self._store.compactions

    def submit(self, item: Snapshot | Changes) -> None:
        """Queue `item` for writing without blocking (see the class).

        Raises:
            RuntimeError: the writer is closed.
        """
        with self._cond:
            if self._closed:
                raise RuntimeError(f"checkpoint writer for {self._path} is closed")
            self._put(item)
            self._due = True
            self._cond.notify()

    def close(self, final: Snapshot | Changes | None = None) -> None:
        """Finish pending writes, stop the thread, then write `final` synchronously (with what
        an earlier write failed to write).

        Safe to call again; a later call only writes its `final`.

        Raises:
            CheckpointError: when the latest write failed (the files hold an older state).
        """
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        with self._cond:
            if final is not None:
                self._put(final)
            whole, changes = self._take()
        if whole is not None or changes is not None:
            self._write(whole, changes)
        self._store.close()
        if self._error is not None:
            raise self._error

    def discard(self) -> None:
        """Drop anything not yet written and stop the thread (the checkpoint is not this job's any more);
        a write under way finishes. Later :meth:`submit` and :meth:`close` calls raise or do nothing."""
        with self._cond:
            self._whole = self._changes = None
            self._closed = True
            self._cond.notify()
        self._thread.join()
        with self._cond:
            self._whole = self._changes = None
        self._store.close()

    def _put(self, item: Snapshot | Changes) -> None:
        if isinstance(item, Snapshot):
            self._whole, self._changes = item, None
        else:
            self._changes = item if self._changes is None else self._changes.then(item)

    def _take(self) -> tuple[Snapshot | None, Changes | None]:
        out = self._whole, self._changes
        self._whole = self._changes = None
        self._due = False
        return out

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due and not self._closed:
                    self._cond.wait()
                if not self._due:
                    return
                whole, changes = self._take()
            self._write(whole, changes)

    def _write(self, whole: Snapshot | None, changes: Changes | None) -> None:
        t0 = time.perf_counter()
        try:
            if whole is not None:
                self._store.write(whole)
                whole = None
            if changes is not None:
                self._store.write(changes)
        except Exception as e:
            self._error = write_error(self._path, e)
            self.failures += 1
            with self._cond:  # kept, ahead of what came since (unless a whole snapshot came: it holds all)
                if self._whole is None:
                    if whole is not None:
                        self._whole = whole
                    if changes is not None:
                        self._changes = changes if self._changes is None else changes.then(self._changes)
            return
        self._error = None
        self.writes += 1
        self.last_write_seconds = time.perf_counter() - t0
