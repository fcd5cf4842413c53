"""Processes on this host by pid *and start time*: a pid is reused once its process is gone.

A pid alone does not name a process for long: once it exits (and is reaped), the kernel may
give its number to any new process. So a process nlevel means to look at or kill is named by
its pid and the time it started (``/proc/<pid>/stat``'s ``starttime``, in clock ticks since
boot), and :func:`kill` signals it only while that pair still holds, through a pidfd where
Linux has one (no window between the check and the signal). Where /proc is missing the start
time is None and only the pid is checked. Pure Python, no MPI.
"""

from __future__ import annotations

import os
import signal

__all__ = ["alive", "kill", "same", "started", "state"]


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (None where unknown)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError, UnicodeDecodeError):
        return None


def state(pid: int) -> str | None:
    """The process's state letter (``R``, ``S``, ``T``, ``Z``...; None where unknown)."""
    fields = _stat(pid)
    return fields[0] if fields else None


def started(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux; None where unknown)."""
    fields = _stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (another user's counts; a zombie does not).

    A job killed as a whole leaves its ranks as zombies until someone reaps them, and in a
    container whose init does not reap, that can be for ever: ``kill(pid, 0)`` still succeeds.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    return state(pid) not in ("Z", "X")


def same(pid: int, born: int | None) -> bool:
    """Whether the process that started at ``born`` (see :func:`started`) still runs as ``pid``
    (``born`` None: whether some process runs as ``pid``)."""
    if not alive(pid):
        return False
    return born is None or started(pid) in (born, None)


def kill(pid: int, born: int | None, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to the process that started at ``born`` as ``pid``; False (nothing sent) when
    it is gone, whatever process has its number now.

    With a pidfd (Linux 5.3+) the process is pinned before its start time is checked, so the
    signal cannot reach a process that took the pid in between.
    """
    fd = -1
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = -1
    try:
        if not same(pid, born):
            return False
        if fd >= 0:
            try:
                signal.pidfd_send_signal(fd, sig)
            except ProcessLookupError:
                return False
            return True
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True
    finally:
        if fd >= 0:
            os.close(fd)
