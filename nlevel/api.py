"""The user's API: :func:`get_task_id` and the :class:`Farm` behind it.

```python
from nlevel import get_task_id
while (task_id := get_task_id(total, "run.h5", comm)) >= 0:
    do_job(task_id)
```

or, to attach a result to each task (committed together with its completion, once):

```python
from nlevel import Farm
with Farm(total, "run.h5") as farm:
    for task_id in farm:
        farm.complete(score(task_id))
```

This module does no MPI itself: the runtime does (:mod:`nlevel.runtime.farm`). A call
that has an id in hand returns it without entering the runtime: the runtime hands the
loop a range of ids at a time (one id for long tasks, more for short ones, sized from the
measured task time) and hears back when the range is done (under fault tolerance, after each
piece of a little over 10 ms of tasks: a survivor then answers a recovery between two tasks).
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from typing import Any, Callable, Iterator, Sequence

from .config import Config
from .errors import ConfigError, NlevelError
from .roles.events import Ran
from .roles.messages import Result, TaskFailure
from .roles.results import as_result, describe, shown

# The farm's machinery, MPI's modules excepted, is imported with nlevel: a farm's first call then
# pays for its set-up, not for imports (python -X importtime; docs/development.md). The runtime's
# MPI modules (farm, transport, window) are left to that call: importing mpi4py initialises MPI,
# which `import nlevel` must not do. tests/unit/test_first_call.py holds the first call to that.
from .runtime import costs as _costs, identity as _identity, pids as _pids, rank as _rank, report as _report  # noqa: F401

__all__ = ["Farm", "get_task_id"]

_clock = time.perf_counter


class Farm:
    """Hands out the task ids ``0 .. total - 1`` over the ranks of ``comm``, each committed exactly once.

    Creating a Farm is collective over ``comm``: every rank must create it with the same
    ``total``. Iterate it to get ids; :meth:`complete` attaches a number to the current
    task. Leaving the ``with`` block (or exhausting the iterator) ends the farm on this
    rank: unstarted ids go back to be run elsewhere, and the call returns when the whole
    job is finished. An exception inside the ``with`` block aborts the job (no rank may
    hang waiting for one that died; under fault tolerance this rank dies and the others go
    on), except an error :meth:`complete` raised: that one stops the job once, cleanly, and
    is raised on to the caller (see :meth:`complete`).

    Args:
        total: Number of tasks (ids ``0 .. total - 1``).
        checkpoint: Path of the HDF5 checkpoint (None: no checkpoint). Completed ids
            recorded there are not run again.
        comm: An mpi4py communicator (default ``MPI.COMM_WORLD``).
        fingerprint: What identifies the run in its checkpoint, beside ``total``: None (the
            main script's file name), a name, or a dict of the parameters that change what a
            task computes (``{"seed": 3, "model": "v2"}``; an ``"app"`` key replaces the file
            name). Leave out what does not (output directories, log paths, job ids): only
            what is given here can block a resume. A checkpoint of another identity is refused,
            naming both and what differs.
        fresh: Start over even if the checkpoint has progress; the old file is kept aside
            (renamed ``<checkpoint>.<UTC time>.bak``).
        retry_failed: Run again the ids the checkpoint records as failed or quarantined
            (``/failed``), with the ids not yet done; a record is cleared when its id
            succeeds and replaced when it fails again. Default: they are left out.
        config: Settings (default: ``NLEVEL_*`` variables, then defaults).
        result_fields: Names of the numbers :meth:`complete` takes per task (e.g. ``("score",)``
            or ``("score", "evaluations")``); default: one number, unnamed.

    Raises:
        ConfigError, PlanError, CheckpointError: on every rank alike, naming the bad value. A
            ConfigError too when made off the main thread while SIGUSR1 would kill the process
            (see :func:`nlevel.install_signal_handler`). A checkpoint that cannot be written is a
            CheckpointError at the farm's end, on every rank alike.
    """

    def __init__(
        self,
        total: int,
        checkpoint: str | os.PathLike[str] | None = None,
        comm: Any = None,
        *,
        fingerprint: dict[str, Any] | str | None = None,
        fresh: bool = False,
        config: Config | None = None,
        result_fields: Sequence[str] | None = None,
        retry_failed: bool = False,
    ) -> None:
        from .runtime import signals
        from .runtime.farm import FarmRuntime

        if result_fields is not None and (
            isinstance(result_fields, str) or not result_fields or not all(isinstance(f, str) for f in result_fields)
        ):
            raise ConfigError(f"result_fields must be a non-empty sequence of names, got {result_fields!r}")
        self.result_fields = tuple(result_fields) if result_fields is not None else None
        if not isinstance(retry_failed, bool):
            raise ConfigError(f"retry_failed must be True or False, got {retry_failed!r}")
        signals.check_thread()  # SIGUSR1: stop cleanly (checkpoint, then exit); never the default "terminate"
        rt = self._rt = FarmRuntime(total, checkpoint, comm, fingerprint, fresh, config, self.result_fields,
                                    retry_failed=retry_failed)
        self.total: int = rt.total
        self.rank: int = rt.rank
        self.size: int = rt.size
        self.config: Config = rt.config
        self.report: dict[str, Any] | None = None
        # The range in hand: ids [_lo, _cur) ran, _cur is the next to hand out, _stop ends the range.
        self._lo = self._cur = self._stop = 0
        # Under fault tolerance the loop runs its hand in pieces of a little over `Runner.piece`
        # seconds of tasks (each one a look: at least the runner's `look` apart), so that a rank busy
        # with a long range still hears its messages between two tasks (a survivor asked what it
        # holds after a death: the recovery waited for its whole range, 25-45 ms of 5 ms tasks).
        # The first piece is one task: it measures how many make a piece.
        self._piece = 1
        self._started_at = 0.0
        self._t = 0.0  # when the task in hand started (one clock read per task)
        self._times: list[float] = []  # each task's seconds since the last range was reported
        self._broke = False  # the user's code left `for task_id in farm` (what follows is not a task)
        self._results: list[tuple[int, Result]] = []
        self._failed: list[TaskFailure] = []
        self._completed = -1  # the id complete() (or fail()) was last called for ...
        self._completed_by = ""  # ... and which of the two
        self._width = len(self.result_fields) if self.result_fields else 1
        # The last error complete() raised (an error in the program): left unhandled out of the
        # with block, it stops the job once, cleanly (see _stop_for), instead of aborting it.
        self._misuse: BaseException | None = None
        self._closed = False
        self._progress_started = False
        rt.runner.current_task = self._current_task
        atexit.register(self._exit_guard)  # the farm runs: leaving mid-job must not hang the others

    # -- iteration ------------------------------------------------------------------------------
    def next(self) -> int:
        """Report the current task finished and return the next id, or -1 when this rank is done."""
        cur = self._cur
        if cur < self._stop:
            t = _clock()
            self._times.append(t - self._t)
            self._t = t
            self._cur = cur + 1
            return cur
        return self._next_range()

    def _current_task(self) -> tuple[int, float] | None:
        """The task the user's code runs now and since when (for ``--task-timeout``), or None."""
        cur, stop = self._cur, self._stop  # (read from the runtime's pulse thread: each read is whole)
        if self._closed or self._broke or cur <= self._lo or cur > stop:
            return None
        return cur - 1, self._t

    def _next_range(self) -> int:
        if self._closed:
            return -1
        rt = self._rt
        if not self._progress_started:
            self._progress_started = True
            if rt.progress is not None:
                rt.progress.start()
        ran = self._ran(self._stop)
        piece = rt.runner.piece
        if piece and ran is not None and ran.busy > 0:
            self._piece = int(piece * ran.tasks / ran.busy) + 1
        hand = rt.next_range(ran)
        if hand is None:
            self._finish()
            return -1
        a, b = hand  # (what is left of the hand after the last piece, or a new range)
        self._started_at = self._t = _clock()
        self._lo, self._cur, self._stop = a, a + 1, min(b, a + self._piece) if piece else b
        self._completed = -1  # (an id can come back to a rank after a failure: its new run is a new task)
        return a

    def _ran(self, upto: int) -> Ran | None:
        """What ran of the hand, ids ``[_lo, upto)``: a :class:`Ran` for the runtime (None when nothing)."""
        lo = self._lo
        n = upto - lo
        now = _clock()
        times = self._times
        if upto > lo and self._cur == upto:
            times.append(now - self._t)  # (the last task of the piece ends now)
        self._times = []
        if not self._failed:  # (the common case, on the path between two tasks: one range ran)
            if n <= 0:
                return None
            busy = now - self._started_at
            results: tuple[tuple[int, Result], ...] = ()
            if self._results:
                results = tuple(self._results)
                self._results = []
            self._lo = upto
            return Ran(((lo, upto),), results, (), n, busy, max(times) if times else busy / n, times=tuple(times))
        busy = now - self._started_at
        failed = tuple(self._failed)
        done: list[tuple[int, int]] = []
        start = lo
        for f in sorted(failed, key=lambda f: f.id):
            if start < f.id:
                done.append((start, f.id))
            start = f.id + 1
        if start < upto:
            done.append((start, upto))
        ran_results = tuple(self._results)
        self._results = []
        self._failed = []
        self._lo = upto
        return Ran(tuple(done), ran_results, failed, max(n, 0), busy,
                   max(times) if times else busy / max(n, 1), times=tuple(times))

    def __iter__(self) -> Iterator[int]:
        try:
            while (tid := self.next()) >= 0:
                yield tid
        finally:
            # A `break` out of the loop (the generator closed): the code after it is not a task, and
            # must not be taken for one past --task-timeout.
            self._broke = True

    def __enter__(self) -> Farm:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
            self.close()
            return
        if self._closed and isinstance(exc, NlevelError):
            return  # the job's end was reached (every rank released); its error goes to the caller, no abort
        if exc is not None and exc is self._misuse:
            if not self._closed:
                self._stop_for(self._misuse)
            return  # (the error goes on to the caller; after the job's end nothing is left to stop)
        _abort_job(self.rank, "unhandled exception in the task loop", exc_type, exc, tb, self._rt.ft)

    def _stop_for(self, exc: BaseException) -> None:
        """An error :meth:`complete` raised left the user's loop: an error in the program, not in a task.

        Not a death (under fault tolerance each rank that made the same mistake would die in
        turn, every successive master with it): the job stops once, through the master, which
        says why once; the tasks running elsewhere finish and are committed, and the other ranks
        leave their loops as after a stop, without an error. This rank ends its part like any
        other, then the error goes on to its caller; every process ends with exit status 1.
        """
        self._rt.runner.user_error(f"{type(exc).__name__}: {exc}")
        self.close()

    # -- the current task ---------------------------------------------------------------------
    def complete(self, result: float | Sequence[float] | None = None) -> None:
        """Mark the current task finished, with a result committed together with it, once.

        Without ``complete`` the next iteration reports the task finished anyway; it
        matters when leaving the loop early: a task not completed is given back and
        runs elsewhere.

        Args:
            result: None, or the task's result: with ``n`` result fields a sequence of exactly
                ``n`` numbers, and with one field (or none given) also a bare number. A number is an
                ``int``, a ``float`` or a numpy integer or floating scalar (not a bool) that fits a
                float64; it is stored as a float64, NaN and ±inf as they are.

        Raises:
            ValueError: the result is not that (the message names the task, what was expected and why).
            RuntimeError: no task is in hand (before the first id, after the loop), or ``complete``
                (or :meth:`fail`) was already called for this task: "complete() already called for task 1".

        Either is an error in the program, raised here on the calling rank, and the call is
        void (the task stays uncompleted). Left unhandled out of the ``with`` block it stops
        the job once, cleanly: the master says why, the tasks running elsewhere finish and are
        committed, no other rank raises, and every process ends with exit status 1.
        """
        tid = self._cur - 1
        problem = self._not_in_hand(tid, "complete")
        if problem:
            raise self._misused(RuntimeError(problem))
        if result is not None:
            try:
                value = as_result(result, self._width)
            except ValueError as exc:
                want = describe(self._width, self.result_fields)
                raise self._misused(ValueError(f"result of task {tid} must be {want}, got {shown(result)}: {exc}")) \
                    from None
            self._results.append((tid, value))
        self._completed, self._completed_by = tid, "complete"

    def _not_in_hand(self, tid: int, call: str) -> str:
        """Why ``call`` (complete or fail) cannot take task ``tid``: none is in hand, or it was done; "" if it can."""
        if self._closed or tid < self._lo:
            return f"{call}() called with no task in hand (before the loop's first id, or after the loop ended)"
        if self._completed == tid:
            return f"{self._completed_by}() already called for task {tid}"
        return ""

    def _misused(self, exc: BaseException) -> BaseException:
        self._misuse = exc
        return exc

    def fail(self, failure: TaskFailure | str) -> None:
        """The current task raised: the master retries it elsewhere or records it failed.

        Args:
            failure: What happened (a :class:`~nlevel.roles.messages.TaskFailure`, or the error text).

        Raises:
            RuntimeError: as :meth:`complete` (no task in hand, or this task completed or failed already).
        """
        tid = self._cur - 1
        problem = self._not_in_hand(tid, "fail")
        if problem:
            raise self._misused(RuntimeError(problem))
        if isinstance(failure, str):
            from .runtime.transport import host

            failure = TaskFailure(tid, "raised", failure.strip().splitlines()[-1] if failure.strip() else "error",
                                  self.rank, host(), failure)
        self._failed.append(failure)
        self._completed, self._completed_by = tid, "fail"

    # -- the end ----------------------------------------------------------------------------------
    def close(self) -> None:
        """End the farm on this rank; returns when the job is finished on every rank.

        Ids in hand not yet run go back; the current task counts as finished only if
        :meth:`complete` (or :meth:`fail`) was called for it.
        """
        if self._closed:
            return
        cur = self._cur
        current = cur - 1
        upto = cur if (current >= self._lo and self._completed == current) else max(self._lo, current)
        unstarted = ((upto, self._stop),) if upto < self._stop else ()
        self._rt.leave(unstarted, self._ran(upto))
        self._stop = self._cur = upto
        self._finish()

    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        rt = self._rt
        try:
            rt.end()
        finally:
            self.report = rt.report
            if rt.exit_code is None:
                # Over, and nothing to do at exit: the guard would keep this farm (its ledger, its
                # windows' memory) alive until the interpreter ends, one per farm the process ran.
                atexit.unregister(self._exit_guard)

    def _exit_guard(self) -> None:
        """At interpreter exit: a rank leaving mid-job must not hang the others; after failures, skip MPI_Finalize."""
        misuse = self._misuse
        if not self._closed and getattr(sys, "last_value", None) is misuse and misuse is not None:
            try:
                self._stop_for(misuse)  # (a loop without a with block, left by the error complete() raised)
            except Exception:
                pass  # (then as any exit in the middle of the job, below)
        if not self._closed:
            sys.stderr.write(f"nlevel: rank {self.rank}: the process is exiting in the middle of the job\n")
            _die(self._rt.ft)
        elif self._rt.exit_code is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            from .runtime.launch import record_exit

            if getattr(sys, "last_value", None) is not None:  # the script ends on an unhandled error: not a success
                self._rt.exit_code = max(1, self._rt.exit_code)
            record_exit(self._rt.exit_code)  # (under ULFM mpiexec itself returns 0 whatever the ranks' statuses)
            if not self._rt.ft and not self._rt.failed:
                # mpiexec ends the job at the first non-zero exit: what the others still had to say
                # (the error a rank raised, the master's report) is out first (MPI_Finalize waits for all).
                from .runtime import transport

                transport.finalize()
            os._exit(self._rt.exit_code)  # MPI_Finalize may hang after failures (see MPI_NOTES)

    # -- what the job did ---------------------------------------------------------------------
    def results(self) -> tuple[Any, Any] | None:
        """The master (rank 0 unless it died): (ids, values) of every committed result; else None.

        ``values`` has shape ``(n,)``, or ``(n, len(result_fields))``.
        """
        return self._rt.results()

    @property
    def committed(self) -> int | None:
        """Ids committed so far (the master; None elsewhere)."""
        ledger = self._rt.ledger
        return ledger.n_committed if ledger is not None else None

    @property
    def failed(self) -> tuple[int, ...]:
        """Ranks that died during the run (fault-tolerant runs; known after the end)."""
        return self._rt.failed

    @property
    def ft(self) -> bool:
        """Whether the farm survives dead processes (ULFM)."""
        return self._rt.ft

    @property
    def started(self) -> float:
        """When this rank's farm was made (unix seconds)."""
        return self._rt.started

    @property
    def job(self) -> str:
        """This job's id, the same on every rank (the report's ``job``; a resumed run has a new one)."""
        return self._rt.job

    def agree_status(self, status: int) -> int:
        """The worst of every surviving rank's ``status`` (collective; after the farm ended)."""
        return self._rt.agree_status(status)

    def hold_deputy(self) -> None:
        """Before the end: keep the master's deputy watching it after the end, until :meth:`release_deputy`.

        For a caller that writes the report (:attr:`report`) to a file after the end: a
        master that dies or hangs before the file is written is then replaced by its deputy,
        which writes the report instead. Without fault tolerance, once a rank was given up
        (its task past ``task_timeout``), every other rank waits until then: each process ends
        on its own with the job's status, and mpiexec would end the master at the first one.
        """
        self._rt.hold_deputy = True

    def on_forced_end(self, write: Callable[[dict[str, Any]], None]) -> None:
        """For a caller that writes the report (:attr:`report`) to a file after the end: ``write(report)``
        is called instead when this process has to end the job from inside a task that never
        returns (the last rank left, e.g. a one-process job, past ``task_timeout``).

        The call comes from nlevel's server thread, the checkpoint written; the process then
        exits with the job's status (``os._exit``), so the code after the loop does not run.
        """
        self._rt.on_forced_end = write

    def release_deputy(self) -> None:
        """After the end (see :meth:`hold_deputy`): the master's last work is done; the ranks waiting for it may go."""
        self._rt.release_deputy()

    def set_exit_code(self, code: int) -> None:
        """After failures the process must end with ``os._exit(code)`` (MPI_Finalize may hang)."""
        self._rt.exit_code = code
        atexit.unregister(self._exit_guard)  # (once, whether or not the end unregistered it)
        atexit.register(self._exit_guard)


def _abort_job(rank: int, what: str, exc_type: Any, exc: Any, tb: Any, ft: bool = False) -> None:
    """Print the error with rank and host, then end: the whole job, or under fault tolerance this process alone.

    No rank may hang on it: under fault tolerance this process dies by SIGKILL, which the
    others detect (an ordinary exit would leave them waiting, see MPI_NOTES).
    """
    import traceback  # (here: a farm that ends well never needs it)

    from .runtime.transport import host

    then = "killing this process; the others carry on without it" if ft else (
        "aborting the job (the checkpoint keeps what was committed)")
    sys.stderr.write(f"nlevel: rank {rank} on {host()}: {what}; {then}\n")
    traceback.print_exception(exc_type, exc, tb, file=sys.stderr)
    _die(ft)


def _die(ft: bool) -> None:
    """End this process so that no other rank hangs: SIGKILL itself (fault tolerant), else abort the job."""
    from .runtime import transport

    sys.stdout.flush()
    sys.stderr.flush()
    if ft:
        transport.kill_self()
    transport.abort(1)


_active: dict[int, Farm] = {}
# The farm of the last call and its communicator: a call that has an id in hand returns it at once.
_last_comm: Any = None
_last_farm: Farm | None = None


def get_task_id(total: int, checkpoint_file: str | os.PathLike[str] | None = None, comm: Any = None, *,
                fingerprint: dict[str, Any] | str | None = None, retry_failed: bool = False) -> int:
    """Return the next task id for this rank, or a negative number when there is none left.

    The first call on a communicator sets the farm up (collectively: every rank must
    call it, with the same ``total``). Each later call reports the previous task as
    finished. After a negative return every rank has left the loop and the farm is
    closed; calling again starts a new farm.

    Args:
        total: Number of tasks; ids are ``0 .. total - 1``.
        checkpoint_file: HDF5 file recording completed ids (None: no checkpoint).
            Ids it records as completed are never handed out again.
        comm: An mpi4py communicator (default ``MPI.COMM_WORLD``).
        fingerprint: What identifies the run beside ``total`` (see :class:`Farm`): by default
            the script's file name, so a resume with other arguments (an output directory, a
            job id) goes on; pass the parameters that change what a task computes. Read by
            the call that sets the farm up.
        retry_failed: Run again the ids the checkpoint records as failed (see :class:`Farm`).
            Read by the call that sets the farm up.

    Returns:
        A task id in ``[0, total)``, or -1.

    Raises:
        ConfigError, PlanError, CheckpointError: bad input, the same on every rank.
    """
    farm = _last_farm
    if farm is not None and comm is _last_comm and total == farm.total:
        cur = farm._cur
        if cur < farm._stop:
            t = _clock()
            farm._times.append(t - farm._t)
            farm._t = t
            farm._cur = cur + 1
            return cur
    return _get_task_id(total, checkpoint_file, comm, fingerprint, retry_failed)


def _get_task_id(total: int, checkpoint_file: Any, comm: Any, fingerprint: Any = None,
                 retry_failed: bool = False) -> int:
    global _last_comm, _last_farm, last_report
    from .runtime import transport

    c = comm if comm is not None else transport.world()
    key = transport.comm_key(c)
    farm = _active.get(key)
    if farm is None:
        farm = Farm(total, checkpoint_file, c, fingerprint=fingerprint, retry_failed=retry_failed)
        _active[key] = farm
    elif isinstance(total, bool) or not isinstance(total, int) or total != farm.total:
        raise ConfigError(f"get_task_id called with total={total!r} while a farm with total={farm.total} is running")
    _last_comm, _last_farm = comm, farm
    try:
        tid = farm.next()
    except NlevelError:
        raise
    except BaseException as exc:  # get_task_id has no with-block: abort here rather than hang the others
        _abort_job(farm.rank, "error inside get_task_id", type(exc), exc, exc.__traceback__, farm._rt.ft)
        raise
    if tid < 0:
        del _active[key]
        _last_comm, _last_farm = None, None
        if farm.report is not None:
            last_report = farm.report
    return tid


#: The report of the last farm that :func:`get_task_id` finished on this rank (rank 0 only).
last_report: dict[str, Any] | None = None
