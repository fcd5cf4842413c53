"""Crash-safe HDF5 checkpoint of completed task ids, written by rank 0 alone (POSIX I/O).

A restarted job calls :func:`load` and skips the ids it returns; rank 0 hands snapshots to a
:class:`Writer`, whose thread rewrites the whole file each time.

HDF5 layout (format ``FORMAT_VERSION`` = 1)::

    /  attrs  nlevel_format      int   format version of the writer (marks the file as ours)
              total              int   number of task ids of the run, ids are [0, total)
              fingerprint        str   sha256 hex of the app + parameters
              fingerprint_source str   canonical JSON that was hashed (shown in errors)
              plan               str   JSON of the hierarchy plan (informational)
              version            str   nlevel version that wrote the file (informational)
              created            str   ISO 8601 UTC time of the first write of this run
              updated            str   ISO 8601 UTC time of this write
              n_completed        int   number of completed ids (sum of range lengths)
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

Crash safety: :func:`write` builds the file under a temporary name in the same directory
(``<name>.tmp-<pid>-<n>``), fsyncs it, ``os.replace``-s it over the target and fsyncs the
directory, so a SIGKILL at any instant leaves either the old or the new file. :func:`load`
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
from nlevel.runtime.identity import covers, differences, fingerprint, identity_error, start_over
from nlevel.roles.ledger import Ledger
from nlevel.roles.messages import TaskFailure

__all__ = ["FORMAT_VERSION", "RunMeta", "Snapshot", "covers", "differences", "fingerprint", "h5", "load", "read",
           "resume", "start_over", "write", "write_error", "Writer"]  # (covers .. start_over: from nlevel.runtime.identity)

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
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    for n in itertools.count():
        bak = Path(f"{path}.{stamp}{f'-{n}' if n else ''}.bak")
        if not os.path.lexists(bak):  # single writer (rank 0): no race with another mover
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


def _read(path: Path) -> tuple[RunMeta, Snapshot, dict[str, Any]]:
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
            extra = {"format": fmt, "created": str(a["created"]), "updated": str(a["updated"]),
                     "n_completed": int(a["n_completed"])}
            failed = _read_failed(f["failed"][()]) if "failed" in f else ()
            timeouts = tuple(map(tuple, f["timeouts"][()].tolist())) if "timeouts" in f else ()
            snap = Snapshot(f["completed"][()], f["result_ids"][()], f["result_values"][()], failed, timeouts)
    except CheckpointError:
        raise
    except Exception as e:  # h5py raises OSError, KeyError, ValueError, ... on damage
        raise CheckpointError(f"{corrupt} ({type(e).__name__}: {e})", start_over(path)) from e
    problem = _problem(snap, meta.total)
    if problem is None and snap.n_completed != extra["n_completed"]:
        problem = f"n_completed is {extra['n_completed']} but the ranges hold {snap.n_completed}"
    if problem:
        raise CheckpointError(f"{corrupt} ({problem})", start_over(path))
    return meta, snap, extra


def read(path: str | os.PathLike[str]) -> tuple[RunMeta, Snapshot, dict[str, Any]]:
    """Read a checkpoint without comparing it to a run (for tools and tests).

    Args:
        path: the checkpoint file.

    Returns:
        ``(meta, snapshot, extra)``; extra holds ``format``, ``created`` and ``updated``
        (ISO 8601 UTC strings) and ``n_completed``.

    Raises:
        CheckpointError: the file is unreadable, not HDF5, not ours, newer, or corrupt.
    """
    return _read(Path(path))


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
    renames an existing file to ``<path>.<UTC yyyymmddTHHMMSS>[-n].bak`` (with a warning).

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
            to a run with another identity (app, parameters) or total. The message names both
            sides and what differs; its remedies say how to keep the progress or start over.
    """
    p = Path(path)
    if p.is_dir():
        raise CheckpointError(f"checkpoint path {p} is a directory; expected an HDF5 file path")
    _check_directory(p)
    _remove_stale_temps(p)
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
    """Atomically replace `path` with a checkpoint holding `meta` and `snap`.

    Keeps the ``created`` time of the file it replaces. On any error the previous file is
    intact and the temporary file is removed.

    Args:
        path: the checkpoint file.
        meta: the run.
        snap: what to store; must be valid for ``meta.total``.

    Raises:
        CheckpointError: `snap` is invalid; the existing file is not a checkpoint of this run;
            or an OS error (disk full, permission, missing directory), named in the message.
    """
    p = Path(path)
    problem = _problem(snap, meta.total)
    if problem:
        raise CheckpointError(f"refusing to write checkpoint {p}: {problem}")
    now = _utc_now()
    created = _previous_created(p, meta) or now
    tmp = _temp_name(p)
    try:
        with h5().File(tmp, "x") as f:
            f.attrs.update({_ROOT_MARK: FORMAT_VERSION, "total": meta.total,
                            "fingerprint": meta.fingerprint,
                            "fingerprint_source": meta.fingerprint_source, "plan": meta.plan,
                            "version": meta.version, "created": created, "updated": now,
                            "n_completed": snap.n_completed})
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


class Writer:
    """Background writer thread for rank 0, so the server loop never blocks on disk.

    Only the newest pending snapshot is written. A failed write does not stop the thread
    (a later one may succeed, and then the file on disk is current again): :attr:`error`
    is the error of the latest write, None after a success. Stats for the run report:
    ``writes`` (successful), ``failures``, ``bytes_written`` (sum of file sizes) and
    ``last_write_seconds`` (fsyncs included).

    Args:
        path: the checkpoint file.
        meta: the run.
    """

    def __init__(self, path: str | os.PathLike[str], meta: RunMeta) -> None:
        self._path = Path(path)
        self._meta = meta
        self._cond = threading.Condition()
        self._pending: Snapshot | None = None
        self._closed = False
        self._error: CheckpointError | None = None
        self.writes = 0
        self.failures = 0
        self.bytes_written = 0
        self.last_write_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="nlevel-checkpoint", daemon=True)
        self._thread.start()

    @property
    def error(self) -> CheckpointError | None:
        """The error of the latest write, or None when it succeeded."""
        return self._error

    def submit(self, snap: Snapshot) -> None:
        """Queue `snap` for writing without blocking; replaces any snapshot still pending.

        Raises:
            RuntimeError: the writer is closed.
        """
        with self._cond:
            if self._closed:
                raise RuntimeError(f"checkpoint writer for {self._path} is closed")
            self._pending = snap
            self._cond.notify()

    def close(self, final: Snapshot | None = None) -> None:
        """Finish pending writes, stop the thread, then write `final` synchronously.

        Safe to call again; a later call only writes its `final`.

        Raises:
            CheckpointError: when the latest write failed (the file holds an older state).
        """
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        if final is not None:
            self._write(final)
        if self._error is not None:
            raise self._error

    def discard(self) -> None:
        """Drop any snapshot not yet written and stop the thread (the checkpoint is not this job's any more);
        a write under way finishes. Later :meth:`submit` and :meth:`close` calls raise or do nothing."""
        with self._cond:
            self._pending = None
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                snap, self._pending = self._pending, None
            if snap is None:
                return
            self._write(snap)

    def _write(self, snap: Snapshot) -> None:
        t0 = time.perf_counter()
        try:
            write(self._path, self._meta, snap)
            size = self._path.stat().st_size
        except Exception as e:
            self._error = write_error(self._path, e)
            self.failures += 1
            return
        self._error = None
        self.writes += 1
        self.bytes_written += size
        self.last_write_seconds = time.perf_counter() - t0
