"""Rank 0's progress display: a tqdm bar on a terminal, plain periodic lines otherwise."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, TextIO

from tqdm import tqdm

__all__ = ["Progress", "stdout_is_terminal"]


def stdout_is_terminal(stream: TextIO | None = None) -> bool:
    """Whether the user is watching a terminal (not a log file) on rank 0's stdout.

    Open MPI gives every rank a pseudo-terminal even when ``mpiexec``'s own output goes
    to a file, so the rank's ``isatty()`` is not the answer. ``NLEVEL_TTY=0|1`` (set by
    ``nlevel-mpiexec`` from its own stdout) decides; else, under Open MPI, the stdout of
    the launcher process that started this rank (Linux /proc); else ``isatty()``.
    """
    flag = os.environ.get("NLEVEL_TTY")
    if flag in ("0", "1"):
        return flag == "1"
    stream = stream if stream is not None else sys.stdout
    if not getattr(stream, "isatty", lambda: False)():
        return False
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        try:
            fd = os.open(f"/proc/{os.getppid()}/fd/1", os.O_WRONLY | os.O_NOCTTY)
        except OSError:
            return True
        try:
            return os.isatty(fd)
        finally:
            os.close(fd)
    return True


class Progress:
    """Shows done/total, rate, ETA and the plan, polling ``count()`` from a thread.

    Args:
        total: Tasks in the run.
        count: Returns how many are committed (read without locking: an int).
        plan: One-line plan description shown beside the bar.
        interval: Seconds between plain lines when ``stream`` is not a terminal.
        initial: Tasks already committed by an earlier run (not counted in the rate).
        stream: Where to write (default stdout).
    """

    def __init__(
        self,
        total: int,
        count: Callable[[], int],
        plan: str,
        interval: float = 10.0,
        initial: int = 0,
        stream: TextIO | None = None,
    ) -> None:
        self.total = total
        self.count = count
        self.plan = plan
        self.interval = interval
        self.initial = initial
        self.stream = stream if stream is not None else sys.stdout
        self.tty = stdout_is_terminal(self.stream)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: tqdm | None = None

    def start(self) -> None:
        """Start showing progress (idempotent)."""
        if self._thread is not None:
            return
        self._t0 = time.monotonic()
        if self.tty:
            self._bar = tqdm(
                total=self.total, initial=self.initial, file=self.stream, unit="task", dynamic_ncols=True, smoothing=0.1
            )
            self._bar.set_postfix_str(self.plan, refresh=False)
        self._thread = threading.Thread(target=self._run, name="nlevel-progress", daemon=True)
        self._thread.start()

    def line(self, done: int, elapsed: float) -> str:
        """Return one plain progress line."""
        run = done - self.initial
        rate = run / elapsed if elapsed > 0 else 0.0
        left = self.total - done
        eta = f"{left / rate:.0f} s" if rate > 0 else "?"
        pct = 100.0 * done / self.total if self.total else 100.0
        return f"nlevel: {done}/{self.total} tasks ({pct:.1f}%), {rate:.1f} tasks/s, ETA {eta} [{self.plan}]"

    def _run(self) -> None:
        next_line = time.monotonic() + self.interval
        while not self._stop.wait(0.25):
            if self._bar is not None:
                self._bar.update(self.count() - self._bar.n)
            elif time.monotonic() >= next_line:
                print(self.line(self.count(), time.monotonic() - self._t0), file=self.stream, flush=True)
                next_line += self.interval

    def close(self) -> None:
        """Show the final state and stop."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        if self._bar is not None:
            self._bar.update(self.count() - self._bar.n)
            self._bar.close()
        self._thread = None
