"""SIGUSR1 asks the job to stop early and cleanly (a batch system's "time limit is near").

Slurm's ``--signal=B:USR1@120`` plus a ``trap`` forwarding it to ``mpirun`` (which
forwards it to every rank) gives a job two minutes' warning. On it, the master stops
granting, the tasks already running finish and are committed, the checkpoint is
written, and ``python -m nlevel.run`` exits with :data:`EXIT_STOPPED` when tasks remain,
so the batch script knows to resubmit itself: the next job resumes from the checkpoint.

Every rank installs the handler (the default action of SIGUSR1 is to terminate the
process); only the master acts on it. A handler the user installed is left alone.

**Heard while the main thread is in C.** Python runs a signal's handler in the main thread,
between two bytecodes: a master whose main thread is inside a long C call (a docking
library, numpy, a ``ctypes`` call) would hear it only when the call returns. So
:func:`install` also gives Python a wake-up file descriptor (``signal.set_wakeup_fd``): the
C-level handler writes the signal's number into a pipe at once, whichever thread the
signal reached, and :func:`requested`, which the master's server thread asks, reads it. A
task that holds the GIL in C blocks every Python thread, this one too: only the heartbeat
lease of the master's watchers ends that. (A program that has its own wake-up fd, such as
an asyncio loop with signal handlers, keeps it: there, the handler alone hears SIGUSR1.)

**One farm at a time.** A stop request belongs to the farm it stops: each farm's end forgets
it (:func:`reset`), so a script's next farm starts clean. A SIGUSR1 between two farms stops
the next one at once (the time limit is near).

**The main thread only.** Python lets only the main thread install a handler. A ``Farm`` made
in another thread works when the handler is in place already (made earlier by a farm in the
main thread, ``python -m nlevel.run``, or :func:`install` called from the main thread) or
when the program set SIGUSR1's disposition itself (a handler, ``SIG_IGN``); otherwise a
SIGUSR1 would kill the process, and the farm refuses to start with a :class:`ConfigError`
saying so (:func:`check_thread`). (A ``sigwait`` thread cannot replace the handler: it hears a
signal only if every thread of the process blocks it, and MPI's own threads are made before
nlevel runs.) Pure Python, no MPI.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time

from ..errors import ConfigError

__all__ = ["EXIT_STOPPED", "check_thread", "install", "requested", "request", "reset"]

#: Exit status of a job stopped by SIGUSR1 with tasks left to run (EX_TEMPFAIL: "try again").
EXIT_STOPPED = 75

#: Seconds between two reads of the wake-up pipe by :func:`requested` (its callers ask every step).
LOOK = 0.05

_flag = threading.Event()
_installed = False
_wake_read = -1  # the read end of the wake-up pipe (-1: none)
_looked = 0.0


def _handler(signum: int, frame: object) -> None:
    _flag.set()


def _ignore_at_exit() -> None:
    """At interpreter exit Python puts the default action back for every signal it handles: SIGUSR1's
    would kill a process that is only ending (Slurm's warning to a job finishing). Ignore it instead."""
    if threading.current_thread() is threading.main_thread():
        try:
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        except (ValueError, OSError):
            pass


def _wake_up() -> None:
    """Give Python a wake-up pipe (main thread), unless the program has one of its own."""
    global _wake_read
    if _wake_read >= 0:
        return
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    try:
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        old = None
    if old != -1:  # (another's: put it back; our handler alone hears SIGUSR1 then)
        if old is not None:
            signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)
        return
    _wake_read = r


def install() -> bool:
    """Install the SIGUSR1 handler unless the program has its own; return whether ours is in place.

    Only possible from the main thread (Python's rule); elsewhere it returns whether ours
    was installed earlier. Safe to call again.
    """
    global _installed
    if _installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
        return False
    signal.signal(signal.SIGUSR1, _handler)
    _installed = True
    _wake_up()
    atexit.register(_ignore_at_exit)
    return True


def check_thread() -> None:
    """For a farm about to start: install the handler, or refuse when SIGUSR1 would kill the process.

    Raises:
        ConfigError: made off the main thread while SIGUSR1 has its default action (the
            handler cannot be installed from there), naming the thread and the remedies.
    """
    if install():
        return
    if threading.current_thread() is threading.main_thread():
        return  # (the program's own handler)
    if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
        return  # (the program chose: its handler, or SIG_IGN)
    raise ConfigError(
        f"a Farm made in thread {threading.current_thread().name!r}, not the main thread, cannot install "
        f"nlevel's SIGUSR1 handler (Python allows it only in the main thread), and a SIGUSR1 (a batch "
        f"system's time-limit warning) would kill this process; call nlevel.install_signal_handler() in the "
        f"main thread before starting this thread, or set SIGUSR1's handler yourself (signal.SIG_IGN to ignore it)")


def _read_wake_up() -> None:
    while True:
        try:
            got = os.read(_wake_read, 512)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return
        if not got:
            return
        if signal.SIGUSR1 in got:
            _flag.set()


def requested() -> bool:
    """Whether a stop was asked for (SIGUSR1 arrived, or :func:`request` was called).

    Any thread may ask: a SIGUSR1 is seen within :data:`LOOK` seconds of a call, even while
    the main thread is inside a long C call (see the module's docstring).
    """
    global _looked
    if _flag.is_set():
        return True
    if _wake_read >= 0:
        now = time.monotonic()
        if now - _looked >= LOOK:
            _looked = now
            _read_wake_up()
    return _flag.is_set()


def request() -> None:
    """Ask for a stop from code (what the signal handler does)."""
    _flag.set()


def reset() -> None:
    """Forget a stop request (the farm it stopped is over: the next one starts clean)."""
    if _wake_read >= 0:
        _read_wake_up()  # (a signal already in the pipe was this farm's)
    _flag.clear()
