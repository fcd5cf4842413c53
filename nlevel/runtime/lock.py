"""One checkpoint, one job: the lock file ``RUN.h5.lock`` beside the checkpoint.

The master of a job with a checkpoint holds the lock for the whole run. It is a small JSON
file (host, pid, job id, start time, heartbeat, heartbeat interval, and a random token that
names this job's lock) that:

* is **created atomically** with ``open(O_CREAT | O_EXCL)``: of two jobs that create it at
  once, exactly one succeeds. That is the only file-system guarantee the lock relies on,
  and it holds on local file systems, on NFS version 3 and later (exclusive create is part
  of the protocol; NFSv2 had no such guarantee) and on Lustre and GPFS. No ``flock`` or
  ``fcntl`` lock is used: those are not reliable across NFS clients;
* is **refreshed** by the master's heartbeat (:meth:`Lock.beat`, every :data:`HEARTBEAT_S`
  seconds at most), which sets the file's modification time (``futimens`` on the file it
  opened and found its job's token in: never a file another job put in its place, and
  never a write of the name, which could replace another job's lock), then checks that
  the name still leads to that file. The heartbeat a reader sees is the later of the
  file's ``heartbeat`` field and its modification time;
* is **removed** at a clean end (:meth:`Lock.release`), and kept when the job dies.

A lock taken over by another job (its heartbeat had stopped long enough, see below) is
lost for good: :meth:`Lock.beat` returns why, and the job stops cleanly without writing the
checkpoint again. A take-over moves the lock aside (``rename``, atomic) and looks again at
what it moved: a lock whose heartbeat came back meanwhile is put back.

A second job on the same checkpoint is refused at once (:class:`LockHeld`, one line naming
the file and the holder). A lock left by a job that no longer runs is taken over with one
line saying so: on the same host when its process is gone; on another host (whose
processes cannot be seen from here) when its heartbeat is older than ``stale_factor``
heartbeat intervals. A file that is not an nlevel lock is never touched
(:class:`ForeignLock`).

A new master (the old one died under ULFM) takes the lock over from its own job with
:func:`adopt`: the token, passed to every rank at set-up, shows that the lock is its job's.

Pure file logic, no MPI: clock, host, pid and the "is this process alive" test are
parameters, so the rules are unit-tested in one process.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from ..errors import CheckpointError
from . import pids
from .machine import hostname

__all__ = ["HEARTBEAT_S", "STALE_FACTOR", "Holder", "Lock", "LockHeld", "ForeignLock", "lock_path", "job_id",
           "read_holder", "adopt"]

HEARTBEAT_S = 5.0
"""Seconds between two refreshes of the lock file (the master refreshes it at most this often)."""

STALE_FACTOR = 10.0
"""A lock of another host whose heartbeat is older than this many heartbeat intervals is left over."""

_MAGIC = "nlevel-lock"
_CREATING_GRACE_S = 1.0  # an empty lock this young is being written by its creator: read it again


class LockHeld(CheckpointError):
    """Another job that still runs holds the checkpoint's lock."""


class ForeignLock(CheckpointError):
    """The lock file exists but is not an nlevel lock; nothing was deleted."""


def lock_path(checkpoint: str | os.PathLike[str]) -> str:
    """The lock file of ``checkpoint``: ``<checkpoint>.lock``."""
    return os.fspath(checkpoint) + ".lock"


def job_id(env: dict[str, str] | None = None) -> str | None:
    """The batch system's job id (Slurm, PBS, LSF), or None outside a batch job."""
    env = dict(os.environ) if env is None else env
    return next((env[k] for k in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID") if env.get(k)), None)


def _iso(t: float | None) -> str:
    if t is None:
        return "?"
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


pid_alive = pids.alive  # (a process of this host: alive, not a zombie)
_pid_started = pids.started  # (its start time: tells a reused pid apart)


@dataclass(frozen=True)
class Holder:
    """Who a lock file names.

    Attributes:
        host, pid: The master's process.
        job_id: The batch job id (None outside a batch job).
        started: When the job took the lock (seconds since the epoch).
        heartbeat: Its last refresh (seconds since the epoch).
        interval: Its heartbeat interval (seconds).
        token: The random name of this lock (the same for every master of one job).
        pid_started: The process's start time in ticks since boot (None where unknown).
    """

    host: str
    pid: int
    job_id: str | None
    started: float
    heartbeat: float
    interval: float
    token: str
    pid_started: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The lock file's content (``started``/``heartbeat`` as seconds; ISO text beside them for people)."""
        return {"format": _MAGIC, "host": self.host, "pid": self.pid, "job_id": self.job_id,
                "started": self.started, "started_utc": _iso(self.started), "heartbeat": self.heartbeat,
                "heartbeat_interval": self.interval, "token": self.token, "pid_started": self.pid_started}

    def describe(self) -> str:
        """``host H, pid P, job id J, since T`` for messages."""
        return (f"host {self.host}, pid {self.pid}, job id {self.job_id or '-'}, "
                f"since {_iso(self.started)}")


def read_holder(path: str) -> Holder | None:
    """The holder named by lock file ``path``; None when there is no such file.

    Its heartbeat is the later of the file's ``heartbeat`` field and its modification time
    (what :meth:`Lock.beat` refreshes).

    Raises:
        ForeignLock: the file is not an nlevel lock (naming the file and why).
    """
    deadline = time.monotonic() + _CREATING_GRACE_S
    while True:
        try:
            with open(path, "rb") as f:
                raw = f.read(65536)
                mtime = os.fstat(f.fileno()).st_mtime
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ForeignLock(f"cannot read the lock file {path} ({exc}); nothing was deleted") from None
        if raw or time.monotonic() >= deadline:
            break
        time.sleep(0.05)  # created (O_EXCL) but not yet written by its job
    return _holder(path, raw, mtime)


def _holder(path: str, raw: bytes, mtime: float) -> Holder:
    try:
        d = json.loads(raw)
        if not isinstance(d, dict) or d.get("format") != _MAGIC:
            raise ValueError("no 'format': 'nlevel-lock'")
        ps = d.get("pid_started")
        return Holder(host=str(d["host"]), pid=int(d["pid"]), job_id=None if d.get("job_id") is None else str(d["job_id"]),
                      started=float(d["started"]), heartbeat=max(float(d["heartbeat"]), mtime),
                      interval=float(d["heartbeat_interval"]), token=str(d["token"]),
                      pid_started=None if ps is None else int(ps))
    except (ValueError, KeyError, TypeError) as exc:
        raise ForeignLock(f"{path} exists and is not an nlevel lock file ({exc if raw else 'it is empty'}); "
                          f"nlevel will not touch it: remove it if no job uses the checkpoint") from None


def stale(h: Holder, *, now: float, host: str, alive: Callable[[int], bool] = pid_alive,
          started_of: Callable[[int], int | None] = _pid_started, stale_factor: float = STALE_FACTOR) -> str | None:
    """Why ``h``'s job no longer runs (None: it may still run, the lock is held).

    Same host: its process is gone (or the pid now names another process). Another host:
    its heartbeat is older than ``stale_factor`` of its intervals.
    """
    if h.host == host:
        if not alive(h.pid):
            return f"pid {h.pid} is gone"
        if h.pid_started is not None:
            now_started = started_of(h.pid)
            if now_started is not None and now_started != h.pid_started:
                return f"pid {h.pid} is now another process"
        return None
    age = now - h.heartbeat
    limit = stale_factor * max(h.interval, 0.1)
    if age > limit:
        return f"its last heartbeat was {age:.0f} s ago (stale after {limit:.0f} s)"
    return None


class Lock:
    """The checkpoint's lock, held by this process (the job's master).

    Use :meth:`acquire` (a new job) or :func:`adopt` (a new master of a running job).

    Args:
        path: The lock file.
        holder: What the file says.
        clock: Wall clock (seconds since the epoch).
        log: Where lines for the user go.
    """

    def __init__(self, path: str, holder: Holder, *, clock: Callable[[], float] = time.time,
                 log: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.holder = holder
        self.clock = clock
        self.log = log or _stderr
        self.lost: str | None = None  # why this process no longer holds the lock (taken over by another job)
        self.released = False

    @classmethod
    def acquire(cls, checkpoint: str | os.PathLike[str], *, interval: float = HEARTBEAT_S,
                stale_factor: float = STALE_FACTOR, host: str | None = None, pid: int | None = None,
                job: str | None = None, clock: Callable[[], float] = time.time,
                alive: Callable[[int], bool] = pid_alive, started_of: Callable[[int], int | None] = _pid_started,
                log: Callable[[str], None] | None = None) -> Lock:
        """Take the lock of ``checkpoint`` for a new job, or refuse.

        Args:
            checkpoint: The checkpoint path (the lock is ``<checkpoint>.lock``).
            interval: Heartbeat interval in seconds (written into the lock).
            stale_factor: Another host's lock is left over after this many intervals without a heartbeat.
            host, pid, job: This process (default: the host name, ``os.getpid()``, :func:`job_id`).
            clock, alive, started_of: The wall clock and the process tests (parameters for tests).
            log: Where the take-over line goes (default: stderr).

        Returns:
            The lock, held.

        Raises:
            LockHeld: a job that still runs holds it (the message names the file and the holder).
            ForeignLock: the file is not an nlevel lock (nothing deleted).
            CheckpointError: the lock cannot be created (e.g. a read-only directory), naming it.
        """
        path = lock_path(checkpoint)
        log = log or _stderr
        host = host if host is not None else hostname()
        pid = pid if pid is not None else os.getpid()
        job = job if job is not None else job_id()
        for _ in range(5):
            now = clock()
            me = Holder(host, pid, job, now, now, float(interval), os.urandom(16).hex(), started_of(pid))
            if _create(path, me):
                return cls(path, me, clock=clock, log=log)
            old = read_holder(path)
            if old is None:
                continue  # removed between our create and our read: try again
            why = stale(old, now=clock(), host=host, alive=alive, started_of=started_of, stale_factor=stale_factor)
            if why is None:
                beat = f", heartbeat {max(0.0, clock() - old.heartbeat):.0f} s ago" if old.host != host else ""
                raise LockHeld(f"checkpoint {os.fspath(checkpoint)} is in use by another job ({old.describe()}{beat}; "
                               f"lock file {path}); wait for it to end or use another checkpoint")
            if _remove_if_same(path, old, lambda h: stale(h, now=clock(), host=host, alive=alive, started_of=started_of,
                                                          stale_factor=stale_factor) is not None):
                log(f"nlevel: taking over the lock {path} left by a job that no longer runs "
                    f"({old.describe()}: {why})")
        raise CheckpointError(f"cannot take the lock {path}: other jobs keep creating and removing it")

    def beat(self, force: bool = False) -> str | None:
        """Refresh the heartbeat (at most once per interval unless ``force``); never raises.

        Returns:
            None while the lock is this job's; once it is not (removed, or another job took it
            over), why, for good.
        """
        if self.released:
            return None
        if self.lost is not None:
            return self.lost
        now = self.clock()
        if not force and now - self.holder.heartbeat < self.holder.interval:
            return None
        lost, trouble = _touch(self.path, self.holder.token, now)
        if lost:
            self.lost = lost  # (the caller says it, and stops the job)
            return lost
        if trouble:  # (a read-only remount, a server that does not answer: the next beat tries again)
            self.log(f"nlevel: cannot refresh the lock {self.path} ({trouble})")
        else:
            self.holder = _replace_holder(self.holder, heartbeat=now)
        return None

    def release(self) -> None:
        """Remove the lock file if it is still this job's (a clean end)."""
        if self.released:
            return
        self.released = True
        try:
            current = read_holder(self.path)
        except CheckpointError:
            return
        if current is not None and current.token == self.holder.token:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def adopt(checkpoint: str | os.PathLike[str], token: str, *, host: str | None = None, pid: int | None = None,
          clock: Callable[[], float] = time.time, log: Callable[[str], None] | None = None) -> Lock | None:
    """A new master takes over its own job's lock (``token``: the lock's, told at set-up).

    Returns:
        The lock, now naming this process; None if the file names another job (said in one
        line) or is foreign. A missing file is created again.
    """
    path = lock_path(checkpoint)
    log = log or _stderr
    host = host if host is not None else hostname()
    pid = pid if pid is not None else os.getpid()
    try:
        old = read_holder(path)
    except CheckpointError as exc:
        log(f"nlevel: new master: {exc}")
        return None
    now = clock()
    if old is None:
        me = Holder(host, pid, job_id(), now, now, HEARTBEAT_S, token, _pid_started(pid))
        if not _create(path, me):
            log(f"nlevel: new master: the lock {path} was created by another job meanwhile")
            return None
        return Lock(path, me, clock=clock, log=log)
    if old.token != token:
        log(f"nlevel: new master: the lock {path} names another job ({old.describe()}); not taking it")
        return None
    # Rename it aside (atomic: a job taking it over at once moves it, or finds it moved), check
    # what was moved, then create the new one exclusively: never a write over another job's lock.
    me = _replace_holder(old, host=host, pid=pid, heartbeat=now, pid_started=_pid_started(pid))
    aside = f"{path}.adopt-{hostname()}-{os.getpid()}"
    try:
        os.rename(path, aside)
    except OSError as exc:
        log(f"nlevel: new master: cannot take the lock {path} over ({exc.strerror or exc})")
        return None
    try:
        moved = read_holder(aside)
    except CheckpointError:
        moved = None
    if moved is None or moved.token != token:
        _put_back(aside, path)
        log(f"nlevel: new master: the lock {path} was taken over by another job meanwhile; not taking it")
        return None
    try:
        created = _create(path, me)
    except CheckpointError as exc:
        _put_back(aside, path)
        log(f"nlevel: new master: {exc}")
        return None
    try:
        os.unlink(aside)
    except OSError:
        pass
    if not created:
        log(f"nlevel: new master: the lock {path} was created by another job meanwhile")
        return None
    return Lock(path, me, clock=clock, log=log)


def _replace_holder(h: Holder, **changes: Any) -> Holder:
    return Holder(**{**h.__dict__, **changes})


def _payload(h: Holder) -> bytes:
    return (json.dumps(h.to_json(), indent=1) + "\n").encode()


def _create(path: str, h: Holder) -> bool:
    """Create ``path`` holding ``h`` if it does not exist (O_CREAT|O_EXCL); False if it exists."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError as exc:
        raise CheckpointError(f"cannot create the lock file {path} ({exc.strerror or exc}); "
                              f"the checkpoint's directory must be writable") from exc
    try:
        os.write(fd, _payload(h))
        os.utime(fd, (h.heartbeat, h.heartbeat))  # (the heartbeat lives in the file's time from now on)
        os.fsync(fd)
    except OSError as exc:  # (a full file system: an empty lock would read as foreign to the next job)
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        raise CheckpointError(f"cannot write the lock file {path} ({exc.strerror or exc}); "
                              f"the checkpoint's file system must have room") from exc
    os.close(fd)
    return True


def _touch(path: str, token: str, now: float) -> tuple[str, str]:
    """The heartbeat: set the lock's modification time to ``now``, if it is still ``token``'s.

    Returns ``(lost, trouble)``: why the lock is no longer the job's ("" while it is), and an
    error that left it unrefreshed this time ("" when it was refreshed).
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return "the file was removed", ""
    except OSError as exc:
        return "", exc.strerror or str(exc)
    try:
        try:
            raw = os.read(fd, 65536)
            mine = os.fstat(fd)
            held = _holder(path, raw, mine.st_mtime)
        except ForeignLock as exc:
            return f"it is not an nlevel lock any more: {exc}", ""
        except OSError as exc:
            return "", exc.strerror or str(exc)
        if held.token != token:
            return f"it now names {held.describe()}", ""
        trouble = ""
        try:
            os.utime(fd, (now, now))  # (this file: whatever the name leads to now)
        except OSError as exc:
            trouble = exc.strerror or str(exc)
        try:
            there = os.stat(path)
        except FileNotFoundError:
            return "the file was removed", ""
        except OSError as exc:
            return "", exc.strerror or str(exc)
        if (there.st_dev, there.st_ino) != (mine.st_dev, mine.st_ino):
            try:
                now_held = read_holder(path)
                who = f"it now names {now_held.describe()}" if now_held is not None else "the file was removed"
            except CheckpointError as exc:
                who = f"it was replaced by a file that is not an nlevel lock ({exc})"
            return who, ""
        return "", trouble
    finally:
        os.close(fd)


def _put_back(aside: str, path: str) -> None:
    """Put a lock moved aside back (fails quietly if a third job created one meanwhile)."""
    try:
        os.link(aside, path)
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            raise
    os.unlink(aside)


def _remove_if_same(path: str, old: Holder, still_stale: Callable[[Holder], bool]) -> bool:
    """Remove a left-over lock, unless another job took it over first or its own came back; True if removed.

    The lock is first renamed to a name of this process's own (``rename`` is atomic: of two
    jobs taking over at once, one moves it), then checked: if what was moved is not the lock
    judged stale (another job replaced it meanwhile), or its heartbeat came back
    (``still_stale`` says no: a job that was slow, not gone), it is put back.
    """
    aside = f"{path}.stale-{hostname()}-{os.getpid()}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    try:
        moved = read_holder(aside)
    except CheckpointError:
        moved = None
    if moved is None or moved.token != old.token or not still_stale(moved):
        _put_back(aside, path)
        return False
    os.unlink(aside)
    return True


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
