"""The checkpoint's files as they lie on disk, and what its readers and writers share.

Owns the format (``FORMAT_VERSION``, the marks of a file that is ours), what identifies a run
(:class:`RunMeta`), what a checkpoint holds (:class:`Snapshot`) and the first way one is invalid,
the conversions of failure records to and from the base's HDF5 and a journal record's JSON, the
range helpers that apply a journal's records, h5py imported on first use, and the names of
temporaries (made by the writers, removed when a killed writer left them) with the fsync that
makes a file or a rename durable. The readers are :mod:`~nlevel.runtime.checkpoint_read`, the
writers :mod:`~nlevel.runtime.checkpoint_write`; callers import from :mod:`nlevel.runtime.checkpoint`.

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
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # (numpy.typing at run time cost a farm's first call 2 ms)
    import numpy.typing as npt

from nlevel.errors import CheckpointError
from nlevel.runtime import journal
from nlevel.roles.ledger import Ledger
from nlevel.roles.messages import TaskFailure

FORMAT_VERSION = 1

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


def _remove_stale_temps(path: Path) -> None:
    pattern = re.compile(re.escape(path.name) + r"\.tmp-(\d+)-\d+")
    with os.scandir(path.parent) as entries:
        for e in entries:
            m = pattern.fullmatch(e.name)
            # Our own pid may have a live Writer; any other pid's temporary is a leftover.
            if m and int(m.group(1)) != os.getpid() and e.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)


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


def _failure(row: dict[str, Any]) -> TaskFailure:
    return TaskFailure(int(row["id"]), str(row["kind"]), str(row["error"]), int(row["rank"]), str(row["host"]),
                       str(row["traceback"]), int(row["attempts"]))


def _foreign_journal(path: Path) -> CheckpointError:
    return CheckpointError(f"{journal.beside(path)} (beside checkpoint {path}) is not an nlevel checkpoint journal; "
                           f"{_NOT_OURS}")


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
