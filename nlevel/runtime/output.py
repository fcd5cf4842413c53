"""Each task's own output files (``--task-output DIR``).

While a task runs, this process's file descriptors 1 and 2 point at the task's files, so
everything the task prints goes there: Python's ``print`` and ``sys.stderr``, C and Fortran
libraries, child processes that inherit them. Each task writes ``DIR/<id>.out`` and
``DIR/<id>.err`` (a team's other members ``DIR/<id>.<j>.out`` and ``.err``, ``j`` their rank in
the team), first under a name of its own (``DIR/<id>.out.<host>-<pid>``), renamed when the task
ends: the files of an id are those of its last attempt that ended, and an attempt killed
mid-task leaves its partial output under its own name beside them.

nlevel's own messages (progress, failures) go to the job's output meanwhile: the runtime
writes them to :func:`console` streams, duplicates of the descriptors taken before the first task.
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
import tempfile
from typing import TextIO

__all__ = ["TaskOutput", "check_dir", "files_of", "console"]

_console: dict[int, TextIO] = {}


def console(fd: int) -> TextIO:
    """A stream on the job's own descriptor ``fd`` (1 or 2) as it was before any task redirected it."""
    stream = _console.get(fd)
    if stream is None:
        stream = _console[fd] = open(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace")
    return stream


def check_dir(path: str) -> str:
    """Why ``path`` cannot hold task output ("" when it can): a file, or a place this process cannot write.

    Nothing is left on disk: the directory, or for a missing one its nearest existing parent, is
    probed with a temporary file, removed at once.
    """
    where = os.path.abspath(path)
    if os.path.exists(where) and not os.path.isdir(where):
        return f"task_output {path!r} is a file; expected a directory (existing, or one nlevel can create)"
    probe = where
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        return f"task_output {path!r}: {probe!r} is not a directory; expected a directory nlevel can create"
    try:  # (a file of a unique name where the directory is, or would be made: ranks probing at once never clash)
        fd, name = tempfile.mkstemp(prefix=".nlevel-probe-", dir=probe)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        if probe == where:
            return f"task_output {path!r} is not writable ({exc.strerror}); expected a directory this process can write"
        return (f"task_output {path!r} cannot be created in {probe!r} ({exc.strerror}); expected a directory "
                f"this process can write")
    return ""


def files_of(directory: str, ids: list[int]) -> dict[int, list[str]]:
    """The output files of each task of ``ids`` in ``directory``, from one look at it: those there
    (final and partial), or, for an id with none there (another node's disk), the names its last
    attempt writes."""
    wanted = set(ids)
    found: dict[int, list[str]] = {}
    try:
        with os.scandir(directory) as entries:
            for e in entries:
                head = e.name.split(".", 1)[0]
                if head.isdigit() and int(head) in wanted and "." in e.name:
                    found.setdefault(int(head), []).append(os.path.join(directory, e.name))
    except OSError:
        pass  # (not there, or not readable here: the names below)
    return {i: sorted(found[i]) if i in found else [os.path.join(directory, f"{i}.out"),
                                                   os.path.join(directory, f"{i}.err")] for i in ids}


def _flush_c() -> None:
    """Flush C's stdio buffers (a C library's printf to a file is block-buffered)."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


class TaskOutput:
    """Points fd 1 and 2 at one task's files while it runs.

    Args:
        directory: Where the files go (created if missing).
        suffix: ``""`` for a team's leader (or a task of one rank), ``".<j>"`` for member ``j``.
    """

    def __init__(self, directory: str, suffix: str = "") -> None:
        self.dir = os.path.abspath(directory)
        os.makedirs(self.dir, exist_ok=True)
        self.suffix = suffix
        self.tag = f"{socket.gethostname()}-{os.getpid()}"
        console(1), console(2)  # (taken before the first task: nlevel's messages keep the job's output)
        self._saved = (os.dup(1), os.dup(2))  # the job's own descriptors, put back after each task
        self._files: list[tuple[str, str]] = []
        self.task = -1

    def start(self, tid: int) -> None:
        """Task ``tid`` starts: fd 1 and 2 go to its files (the previous task's are closed first)."""
        self.end()
        sys.stdout.flush()
        sys.stderr.flush()
        _flush_c()
        files = []
        for fd, ext in ((1, "out"), (2, "err")):
            final = os.path.join(self.dir, f"{tid}{self.suffix}.{ext}")
            part = f"{final}.{self.tag}"
            f = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
            files.append((part, final))
        self._files, self.task = files, tid

    def end(self) -> None:
        """The task in hand ended: fd 1 and 2 back to the job's output, its files renamed to their final names."""
        if not self._files:
            return
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass  # (a closed or broken stream: the task's business; fd 1 and 2 go back all the same)
        _flush_c()
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for part, final in self._files:
            try:
                os.replace(part, final)
            except OSError as exc:  # (the directory went away: the task's result stands, its output is lost)
                console(2).write(f"nlevel: could not keep the output of task {self.task} ({final}): {exc}\n")
        self._files = []
        self.task = -1
