"""SIGUSR1 asks the job to stop early and cleanly (a batch system's "time limit is near").

Slurm's ``--signal=B:USR1@120`` plus a ``trap`` forwarding it to ``mpirun`` (which
forwards it to every rank) gives a job two minutes' warning. On it, the master stops
granting, the tasks already running finish and are committed, the checkpoint is
written, and ``python -m nlevel.run`` exits with :data:`EXIT_STOPPED` when tasks remain,
so the batch script knows to resubmit itself: the next job resumes from the checkpoint.

Every rank installs the handler (the default action of SIGUSR1 is to terminate the
process); only the master acts on it. A handler the user installed is left alone.
Pure Python, no MPI.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["EXIT_STOPPED", "install", "quiet", "requested", "request", "reset"]

#: Exit status of a job stopped by SIGUSR1 with tasks left to run (EX_TEMPFAIL: "try again").
EXIT_STOPPED = 75

_flag = threading.Event()
_installed = False


def _handler(signum: int, frame: object) -> None:
    _flag.set()


def install() -> bool:
    """Install the SIGUSR1 handler unless the program has its own; return whether ours is in place.

    Only possible from the main thread (Python's rule); elsewhere returns False.
    """
    global _installed
    if _installed:
        if _quieted[0] and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, _handler)  # a new farm in the same process
            _quieted[0] = False
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
        return False
    signal.signal(signal.SIGUSR1, _handler)
    _installed = True
    return True


def quiet() -> None:
    """The farm is over on this rank: a late SIGUSR1 (a batch system's warning) must not kill it now."""
    if _installed and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        _quieted[0] = True


_quieted = [False]


def requested() -> bool:
    """Whether a stop was asked for (SIGUSR1 arrived, or :func:`request` was called)."""
    return _flag.is_set()


def request() -> None:
    """Ask for a stop from code (what the signal handler does)."""
    _flag.set()


def reset() -> None:
    """Forget a stop request (a new farm starts clean)."""
    _flag.clear()
