"""Writing a checkpoint, by rank 0 alone (POSIX I/O): a base written whole, or records appended.

:func:`write` replaces the base with a whole :class:`~nlevel.runtime.checkpoint_format.Snapshot`.
A :class:`Store` is the files as their one writer sees them: it appends
:class:`~nlevel.roles.ledger.Changes` to the journal and folds the journal into a new base
(read back through :mod:`~nlevel.runtime.checkpoint_read`) when it outgrows ``COMPACT_FRACTION``
of the base and ``COMPACT_MIN`` bytes. A :class:`Writer` runs a store on its own thread, so the
server loop never blocks on disk. A failed write raises one
:class:`~nlevel.errors.CheckpointError` (:func:`write_error`). Callers import from
:mod:`nlevel.runtime.checkpoint`.

Crash safety: a base is written whole under a temporary name in the same directory
(``<name>.tmp-<pid>-<n>``), fsynced, ``os.replace``-d over the target, and the directory
fsynced, so a SIGKILL at any instant leaves either the old or the new base; its new token
makes any older journal stale. A journal is made the same way (header only), then a write
appends a record and fsyncs it before it counts as written; a kill during an append leaves a
partial last record, which readers ignore and the next writer cuts off. A compaction writes
the new base from the files on disk (base + journal) before it drops the journal.
:func:`~nlevel.runtime.checkpoint_read.load` removes temporaries left by a killed writer.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from nlevel.errors import CheckpointError
from nlevel.runtime import journal
from nlevel.runtime.checkpoint_format import (_NOT_OURS, _ROOT_MARK, FORMAT_VERSION, RunMeta, Snapshot,
                                              _failed_array, _foreign_journal, _fsync, _problem, _temp_name, h5)
from nlevel.runtime.checkpoint_read import _read
from nlevel.roles.ledger import Changes

#: The journal is folded into a new base when it holds more bytes than this fraction of the
#: base's ...
COMPACT_FRACTION = 0.5
#: ... and at least this many: a compaction rewrites base + journal, so between two of them
#: at least half as many bytes are appended as the next one writes (amortised, a write costs
#: a few times what is new), and loading never reads a journal much longer than the base.
COMPACT_MIN = 1 << 20


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


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
    """``changes`` as one journal record (see :mod:`~nlevel.runtime.checkpoint_format`)."""
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
