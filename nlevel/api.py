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

# The farm's machinery is imported with nlevel: a farm's first call then pays for its set-up, not
# for imports (python -X importtime; docs/development.md). The runtime's MPI modules (farm,
# transport, window) come too when the script has initialised MPI already (one that passes its
# communicator has): they spare the first call 2.2 ms (this machine, bytecode cached). Otherwise
# they are left to that call: importing mpi4py initialises MPI, and transport marks this process
# past MPI_Init for nlevel-mpiexec, neither of which `import nlevel` may do.
# tests/unit/test_first_call.py holds the first call to that.
from .runtime import costs as _costs, identity as _identity, pids as _pids, rank as _rank, report as _report  # noqa: F401

_mpi = sys.modules.get("mpi4py.MPI")
if _mpi is not None and _mpi.Is_initialized() and not _mpi.Is_finalized():
    from .runtime import farm as _farm  # noqa: F401

__all__ = ["Farm", "get_task_id", "get_team"]

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
        ranks_per_task: Processes per task (default: the config's ``ranks_per_task``, 1). With
            ``k > 1`` the ranks form teams of ``k`` (inside a node when it holds them); every
            rank of a team runs the same loop and gets the same ids, and :attr:`team` is the
            team's own communicator. The team's first rank (its leader) takes part in the farm;
            its result is the one committed (see :meth:`complete`). Ranks in no team (the
            world's size is not a multiple of ``k``) are named in one warning; their loop has
            no id. The same value on every rank.
        gpus_per_task: GPUs per task (default: the config's, 0): each team (or rank) gets its own
            from its node's list, set in ``CUDA_VISIBLE_DEVICES`` (or the allocation's variable)
            here, before the first task.
        task_output: A directory (default: the config's, none): each task's stdout and stderr
            (fd 1 and 2, Python's and C's) go to ``DIR/<id>.out`` and ``DIR/<id>.err`` while it runs.

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
        ranks_per_task: int | None = None,
        gpus_per_task: int | None = None,
        task_output: str | os.PathLike[str] | None = None,
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
        config, teams = _teams(comm, config, ranks_per_task, gpus_per_task, task_output)
        self._teams = teams
        rt: Any
        if teams is None or teams.is_leader:
            try:
                rt = FarmRuntime(total, checkpoint, teams.farm_comm if teams is not None else comm, fingerprint, fresh,
                                 config, self.result_fields, retry_failed=retry_failed)
            except BaseException as exc:
                if teams is not None:
                    from .runtime.teams import portable

                    teams.tell(("error", portable(exc)))
                raise
            if teams is not None:
                teams.poll_max = rt.config.poll_max
                teams.tell(("ok", {"total": rt.total, "config": rt.config, "job": rt.job, "started": rt.started,
                                   "ft": rt.ft}))
        else:
            from .runtime.teams import Follower

            rt = Follower(teams)
        self._rt = rt
        self.total: int = rt.total
        self.rank: int = rt.rank if teams is None else teams.rank
        self.size: int = rt.size if teams is None else teams.job.Get_size()
        self.config: Config = rt.config
        self._report: dict[str, Any] | None = None
        self._report_due = False  # (the farm ended: the report is read from the runtime when asked for)
        self._team_facts: dict[str, Any] | None = None
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
        self._output: Any = None  # the per-task output files (task_output)
        self._in_hand = -1  # a team's leader: the id its team runs now (-1: none)
        if teams is not None:
            self._team_setup(teams)
        if isinstance(rt, FarmRuntime):
            rt.runner.current_task = self._current_task
        atexit.register(self._exit_guard)  # the farm runs: leaving mid-job must not hang the others

    def _team_setup(self, teams: Any) -> None:
        """Teams, GPUs or per-task output: the loop's calls go through :meth:`_lead_next` or :meth:`_follow_next`."""
        from .runtime.output import TaskOutput
        from .runtime.teams import register_last_words

        if teams.output and teams.index is not None:
            from .runtime.output import console

            self._output = TaskOutput(teams.output, "" if teams.member <= 0 else f".{teams.member}")
            if teams.is_leader:  # (nlevel's own lines stay out of the tasks' files)
                self._rt.port.stream = console(2)
                if self._rt.progress is not None:
                    self._rt.progress.stream = console(1)
        cfg = self.config
        if teams.rank == 0 and teams.wire is not None and cfg.on_task_error != "abort" and not cfg.task_timeout:
            stops = ("the team's communicator is revoked, which ends MPI's own collectives, not every library's"
                     if cfg.ft else "without ULFM nothing can end them")
            sys.stderr.write(f"nlevel: warning: on_task_error {cfg.on_task_error} with teams of {teams.lay.k}: a task "
                             f"that raises on some ranks of its team only can leave the others waiting in its "
                             f"collectives ({stops}); set a task_timeout\n")
        if teams.is_leader:
            self.next = self._lead_next  # type: ignore[method-assign]
            register_last_words(teams)
            if teams.wire is not None and teams.ft:
                self._rt.runner.watch = teams.check
        else:
            self.next = self._follow_next  # type: ignore[method-assign]
            teams.start_watch()

    @property
    def report(self) -> dict[str, Any] | None:
        """The run report, on the master once the farm has ended (None elsewhere and before): what
        ``python -m nlevel.run --report`` writes. Built when first read (the master's end does not wait for it)."""
        if self._report_due:
            self._report_due = False
            report = self._rt.report
            if report is not None and self._team_facts is not None:
                report["teams"] = self._team_facts
            self._report = report
        return self._report

    @report.setter
    def report(self, value: dict[str, Any] | None) -> None:
        self._report_due, self._report = False, value

    def _reports(self) -> bool:
        """Whether this farm has a report (without building it)."""
        if not self._report_due:
            return self._report is not None
        return bool(getattr(self._rt, "has_report", False))

    @property
    def team(self) -> Any:
        """This rank's team communicator (an mpi4py communicator of ``ranks_per_task`` ranks, for the
        user's own communication in a task; ``MPI.COMM_SELF`` for tasks of one rank; None on a rank in no team)."""
        teams = self._teams
        if teams is None:
            from .runtime.transport import self_comm

            return self_comm()
        return teams.team

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

    def _lead_next(self) -> int:
        """:meth:`next` of a team's leader (or of a rank with GPUs or per-task output): the team's
        closing collective ends the task in hand, then the next id goes to the team."""
        teams = self._teams
        out = self._output
        if out is not None:
            out.end()
        if self._in_hand >= 0 and teams.wire is not None and not self._close_team_task():
            return -1
        tid = Farm.next(self)
        self._in_hand = tid
        if tid >= 0:
            if teams.wire is not None:
                teams.announce(tid, renew=teams.spoilt)
            if out is not None:
                out.start(tid)
        return tid

    def _close_team_task(self) -> bool:
        """The team's closing collective for the task in hand (the leader's current task lasts until it
        returns); a member's failure fails the task. Returns False when the loop is over here: the team
        broke (a death under ULFM) or a member left the loop."""
        from .runtime.teams import ERROR, FAILED, LEFT, TeamBroken

        tid, self._in_hand = self._in_hand, -1
        try:
            said = self._teams.close_task()
        except TeamBroken as exc:
            self._team_broke(tid, str(exc))
            return False
        over = False
        mine = next((f for f in self._failed if f.id == tid), None)
        if mine is not None and "REVOKED" in mine.error and any(code == FAILED for _, code, _ in said):
            self._failed.remove(mine)  # (a member's error revoked the team's communicator: its error says why)
            self._completed = -1
        for j, code, text in said:
            if code == FAILED and self._teams.ft:
                self._teams.spoilt = True  # (it revoked the team's communicator: a new one before the next task)
            if code == FAILED and not (self._completed == tid and self._completed_by == "fail"):
                from .runtime.transport import host

                error, detail = text
                rank = self._teams.lay.teams[self._teams.index][j]
                self._results = [r for r in self._results if r[0] != tid]
                self._failed.append(TaskFailure(tid, "raised", f"team member {j} (rank {rank}): {error}",
                                                self._rt.rank, host(), detail))
                self._completed, self._completed_by = tid, "fail"
            elif code == ERROR:
                self._rt.runner.user_error(text)
                over = True
            elif code == LEFT:
                over = True
        if over:
            self.close()
            return False
        return True

    def _team_broke(self, tid: int, why: str) -> None:
        """A process of this leader's team died (ULFM): the task in hand fails as a death, the loop ends here."""
        from .runtime.teams import record_loss
        from .runtime.transport import host

        self._teams.broke(why)
        if not self._closed:
            record_loss(self._rt, self._teams, tid, why)
        if tid >= 0 and not self._closed:
            self._results = [r for r in self._results if r[0] != tid]
            self._failed = [f for f in self._failed if f.id != tid]
            self._failed.append(TaskFailure(tid, "team", why, self._rt.rank, host()))
            self._completed, self._completed_by = tid, "fail"
        self._in_hand = -1
        self.close()

    def _follow_next(self) -> int:
        """:meth:`next` of a team's member (the leader's ids, through the team's collectives) or of a rank in no
        team (no id: it waits for the job's end)."""
        if self._closed:
            return -1
        out = self._output
        if out is not None:
            out.end()
        teams = self._teams
        if teams.wire is None:  # left over
            self._end_follower()
            return -1
        code: int | None = None
        text: Any = None
        if self._stop > self._lo:  # (a task in hand)
            from .runtime.teams import FAILED, OK

            code = OK
            if self._failed:
                code, text = FAILED, (self._failed[-1].error, self._failed[-1].traceback)
        try:
            tid = teams.next_id(code, text)
        except Exception as exc:
            from .runtime.teams import TeamBroken

            if not isinstance(exc, TeamBroken):
                raise
            teams.leave(str(exc))
            raise
        if tid < 0:
            self._end_follower()
            return -1
        self._lo, self._cur, self._stop = tid, tid + 1, tid + 1
        self._completed, self._failed = -1, []
        if out is not None:
            out.start(tid)
        return tid

    def _end_follower(self) -> None:
        """A follower: the job is over (its leader's -1): take the job's end as the leader saw it."""
        self._lo = self._stop = self._cur
        self._closed = True
        try:
            self._rt.ended(self._teams.end())
            if self._rt.exit_code is None:
                atexit.unregister(self._exit_guard)  # (nothing to do at exit: see _finish)
        except Exception as exc:
            from .runtime.teams import TeamBroken

            if isinstance(exc, TeamBroken):
                self._teams.leave(str(exc))
            raise

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
        if self._team_lost(exc):
            return True  # type: ignore[return-value]  # (a death in the team: the loop is over here, not the program)
        if exc is not None and exc is self._misuse:
            if not self._closed:
                self._stop_for(self._misuse)
            return  # (the error goes on to the caller; after the job's end nothing is left to stop)
        _abort_job(self.rank, "unhandled exception in the task loop", exc_type, exc, tb, self._rt.ft)

    def _team_lost(self, exc: BaseException) -> bool:
        """Under ULFM, an exception in a team's task after a process of the team died (the user's collective
        on :attr:`team` failed): the task fails as a death, and this rank's loop is over (a leader
        serves on until the job's end; a member leaves the job)."""
        from .runtime.teams import TeamBroken
        from .runtime.transport import broken

        teams = self._teams
        if teams is None or not teams.ft or teams.wire is None or self._closed:
            return False
        if not (isinstance(exc, TeamBroken) or teams.is_broken or broken(teams.wire)):
            return False
        why = str(exc) if isinstance(exc, TeamBroken) else f"a process of team {teams.index} died ({exc!r})"
        if teams.is_leader:
            self._team_broke(self._in_hand, why)
            return True
        teams.leave(why)
        return True

    def _stop_for(self, exc: BaseException) -> None:
        """An error :meth:`complete` raised left the user's loop: an error in the program, not in a task.

        Not a death (under fault tolerance each rank that made the same mistake would die in
        turn, every successive master with it): the job stops once, through the master, which
        says why once; the tasks running elsewhere finish and are committed, and the other ranks
        leave their loops as after a stop, without an error. This rank ends its part like any
        other, then the error goes on to its caller; every process ends with exit status 1.
        """
        why = f"{type(exc).__name__}: {exc}"
        if self._teams is not None and not self._teams.is_leader:
            self._rt.error = why  # (its leader stops the job, told at the team's closing collective)
        else:
            self._rt.runner.user_error(why)
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
            if self._teams is None or self._teams.is_leader:  # (a member's result is not committed: the leader's is)
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
                                  self._rt.rank, host(), failure)
        elif self._teams is not None and failure.rank != self._rt.rank and self._rt.rank >= 0:
            from dataclasses import replace

            failure = replace(failure, rank=self._rt.rank)  # (the farm's rank: the leader's, not the world's)
        self._failed.append(failure)
        self._completed, self._completed_by = tid, "fail"
        if self._teams is not None:
            self._teams.spoil()  # (under ULFM: the team's other ranks may wait in the task's collectives)

    # -- the end ----------------------------------------------------------------------------------
    def close(self) -> None:
        """End the farm on this rank; returns when the job is finished on every rank.

        Ids in hand not yet run go back; the current task counts as finished only if
        :meth:`complete` (or :meth:`fail`) was called for it.
        """
        if self._closed:
            return
        teams = self._teams
        if teams is not None:
            if self._output is not None:
                self._output.end()
            if not teams.is_leader:
                self._close_follower()
                return
            if self._in_hand >= 0 and teams.wire is not None and not self._close_team_task():
                return  # (the team broke, or a member left: closed meanwhile)
        cur = self._cur
        current = cur - 1
        upto = cur if (current >= self._lo and self._completed == current) else max(self._lo, current)
        unstarted = ((upto, self._stop),) if upto < self._stop else ()
        self._rt.leave(unstarted, self._ran(upto))
        self._stop = self._cur = upto
        self._finish()

    def _close_follower(self) -> None:
        """A member leaves the loop: its leader hears so at the closing collective (and ends its loop), then the end."""
        from .runtime.teams import ERROR, LEFT, TeamBroken

        teams = self._teams
        if teams.wire is None:
            self._end_follower()
            return
        code: int | None = LEFT if self._stop > self._lo else None
        text: Any = None
        if self._rt.error:
            code, text = ERROR, self._rt.error
        try:
            while teams.next_id(code, text) >= 0:  # (ids the leader sent before it heard)
                code, text = LEFT, None
        except TeamBroken as exc:
            teams.leave(str(exc))
        self._end_follower()

    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        rt = self._rt
        try:
            rt.end()
        finally:
            self._report_due = True
            if self._teams is not None:
                self._teams.finish({"code": rt.exit_code, "released": rt.released_code, "failed": rt.failed})
                if getattr(rt, "has_report", False):  # (the master: its report names the teams)
                    self._team_facts = self._teams.describe()
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
        teams = self._teams
        if teams is not None:  # (every rank of the user's communicator, followers too)
            rt = self._rt
            return teams.agree(max(status, rt.released_code), local=bool(rt.ft or rt.failed))
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
# The farm of the last call, its communicator and its key in _active: a call that has an id in hand
# returns it at once, one that needs the next range goes to the runtime without a look-up.
_last_comm: Any = None
_last_farm: Farm | None = None
_last_key = 0


def get_task_id(total: int, checkpoint_file: str | os.PathLike[str] | None = None, comm: Any = None, *,
                fingerprint: dict[str, Any] | str | None = None, retry_failed: bool = False,
                ranks_per_task: int | None = None) -> int:
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
        ranks_per_task: Processes per task (see :class:`Farm`): every rank of a team gets the
            same ids; :func:`get_team` is the team's communicator. Read by the call that sets the farm up.

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
        return _next_of(farm, _last_key)  # (the same farm's next range: no look-up)
    return _get_task_id(total, checkpoint_file, comm, fingerprint, retry_failed, ranks_per_task)


def _get_task_id(total: int, checkpoint_file: Any, comm: Any, fingerprint: Any = None,
                 retry_failed: bool = False, ranks_per_task: int | None = None) -> int:
    global _last_comm, _last_farm, _last_key
    from .runtime import transport

    c = comm if comm is not None else transport.world()
    key = transport.comm_key(c)
    farm = _active.get(key)
    if farm is None:
        farm = Farm(total, checkpoint_file, c, fingerprint=fingerprint, retry_failed=retry_failed,
                    ranks_per_task=ranks_per_task)
        _active[key] = farm
    elif isinstance(total, bool) or not isinstance(total, int) or total != farm.total:
        raise ConfigError(f"get_task_id called with total={total!r} while a farm with total={farm.total} is running")
    # (a call that has an id in hand returns it at once: not in teams, whose every id is a collective)
    _last_comm, _last_farm, _last_key = (comm, farm, key) if farm._teams is None else (None, None, 0)
    return _next_of(farm, key)


def _next_of(farm: Farm, key: int) -> int:
    """The next id of ``farm`` (the farm on the communicator of ``key``), out of the runtime; its end when negative."""
    global _last_comm, _last_farm, _reported
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
        if farm._reports():
            _reported = farm
    return tid


def get_team(comm: Any = None) -> Any:
    """The team communicator of this rank in the farm :func:`get_task_id` runs on ``comm`` (see :attr:`Farm.team`).

    Raises:
        RuntimeError: no farm runs on ``comm`` (call it after :func:`get_task_id` returned an id).
    """
    from .runtime import transport

    farm = _active.get(transport.comm_key(comm if comm is not None else transport.world()))
    if farm is None:
        raise RuntimeError("get_team() called with no farm running on this communicator; call it inside the "
                           "get_task_id loop")
    return farm.team


def _teams(comm: Any, config: Config | None, ranks_per_task: Any, gpus_per_task: Any,
           task_output: Any) -> tuple[Config | None, Any]:
    """The settings with the Farm's arguments applied, and the teams (None: one rank per task, no
    GPUs, no per-task output; then the farm's set-up is as it always was)."""
    if config is None and ranks_per_task is None and gpus_per_task is None and task_output is None \
            and not any(os.environ.get(v) for v in ("NLEVEL_RANKS_PER_TASK", "NLEVEL_GPUS_PER_TASK",
                                                     "NLEVEL_TASK_OUTPUT")):
        return config, None
    try:
        cfg = config if config is not None else Config.from_env()
    except NlevelError:
        return config, None  # (rank 0 says what is wrong with the settings, at the farm's set-up)
    changes = {name: value for name, value in (("ranks_per_task", ranks_per_task), ("gpus_per_task", gpus_per_task),
                                               ("task_output", task_output)) if value is not None}
    if "task_output" in changes and isinstance(changes["task_output"], os.PathLike):
        changes["task_output"] = os.fspath(changes["task_output"])
    if cfg.task_output and not os.path.isabs(cfg.task_output):
        changes["task_output"] = os.path.abspath(cfg.task_output)  # (the report and the status name its files)
    if changes:
        cfg = cfg.with_(**changes)
    from .runtime.teams import form, wanted

    if not wanted(cfg):
        return cfg if config is not None or changes else config, None
    return cfg, form(comm, cfg)


_reported: Farm | None = None  # the last farm get_task_id finished that has a report (see last_report)


def __getattr__(name: str) -> Any:
    """``last_report``: the report of the last farm that :func:`get_task_id` finished on this rank
    (rank 0 only; None before the first), built when first read (see :attr:`Farm.report`)."""
    if name == "last_report":
        return _reported.report if _reported is not None else None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
