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

This module does no MPI itself: the transport does (see :mod:`nlevel.runtime.transport`).
"""

from __future__ import annotations

import atexit
import os
import sys
import time
import traceback
from typing import Any, Iterator, Sequence

from ._version import __version__
from .config import Config
from .errors import ConfigError, NlevelError
from .model.hierarchy import Hierarchy, build
from .roles.messages import Result
from .roles.station import TIMELINE_BIN
from .runtime import checkpoint as ckpt
from .runtime import control, signals
from .runtime.node import Node
from .runtime.report import build_report, merge_stats, timeline

__all__ = ["Farm", "get_task_id"]


def _check_total(total: Any) -> str | None:
    if isinstance(total, bool) or not hasattr(total, "__index__"):
        return f"total must be a non-negative integer, got {total!r} ({type(total).__name__})"
    if int(total) < 0:
        return f"total must be a non-negative integer, got {int(total)}"
    return None


def _default_app() -> str:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.basename(path) if path else "<interactive>"


class Farm:
    """Hands out the task ids ``0 .. total - 1`` over the ranks of ``comm``, each exactly once.

    Creating a Farm is collective over ``comm``: every rank must create it with the same
    ``total``. Iterate it to get ids; :meth:`complete` attaches a number to the current
    task. Leaving the ``with`` block (or exhausting the iterator) ends the farm on this
    rank: unstarted ids go back to be run elsewhere, and the call returns when the whole
    job is finished. An exception inside the ``with`` block aborts the job (no rank may
    hang waiting for one that died).

    Args:
        total: Number of tasks (ids ``0 .. total - 1``).
        checkpoint: Path of the HDF5 checkpoint (None: no checkpoint). Completed ids
            recorded there are not run again.
        comm: An mpi4py communicator (default ``MPI.COMM_WORLD``).
        fingerprint: What identifies the app and its parameters; a checkpoint written
            with another fingerprint is refused. Default: the main script's file name.
        fresh: Start over even if the checkpoint has progress; the old file is kept aside.
        config: Settings (default: ``NLEVEL_*`` variables, then defaults).
        result_fields: Names of the numbers :meth:`complete` takes per task when it is
            more than one (e.g. ``("score", "evaluations")``); default: one number.

    Raises:
        ConfigError, PlanError, CheckpointError: on every rank alike, naming the bad value.
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
    ) -> None:
        from .runtime import transport as transport_mod  # MPI lives there

        if result_fields is not None and (
            isinstance(result_fields, str) or not result_fields or not all(isinstance(f, str) for f in result_fields)
        ):
            raise ConfigError(f"result_fields must be a non-empty sequence of names, got {result_fields!r}")
        self.result_fields = tuple(result_fields) if result_fields is not None else None

        self._started = time.time()
        self._t0 = time.perf_counter()
        signals.install()  # SIGUSR1: stop cleanly (checkpoint, then exit); never the default "terminate"
        problem = _check_total(total)
        t = transport_mod.Transport(comm if comm is not None else transport_mod.world())
        self._transport = t
        self._closed = False
        self._current_result: Result | None = None
        self._completed_current = False
        self.report: dict[str, Any] | None = None
        self.rank = t.rank
        self.size = t.size
        self._writer: ckpt.Writer | None = None
        self._meta: ckpt.RunMeta | None = None
        self._ledger: Any = None
        self.failed: tuple[int, ...] = ()  # ranks that died during the run (fault-tolerant runs)
        self._survivors: Any = None  # the transport over the survivors, after the end
        self._exit_code: int | None = None  # after failures: the process must end with os._exit
        try:
            self._setup(t, problem, total, checkpoint, fingerprint, fresh, config)
        except BaseException:
            t.comm.Free()
            raise
        atexit.register(self._exit_guard)  # the farm runs: leaving mid-job must not hang the others

    def _setup(
        self,
        t: Any,
        problem: str | None,
        total: Any,
        checkpoint: Any,
        fingerprint: Any,
        fresh: bool,
        config: Config | None,
    ) -> None:
        # 1. Every rank must agree on a valid total: check collectively, fail everywhere.
        bad = t.any(problem is not None)
        if bad:
            raise ConfigError(problem or "total is invalid on another rank (see its error message)")
        self.total = int(total)
        lo, hi = t.allreduce_minmax(self.total)
        if lo != hi:
            raise ConfigError(
                f"get_task_id/Farm called with different totals on different ranks "
                f"(min {lo}, max {hi}); every rank must pass the same total"
            )
        # 2. Rank 0 decides config, plan and checkpoint state; everyone gets its answer.
        setup: tuple[str, Any]
        failure: BaseException | None = None
        if self.rank == 0:
            try:
                setup = ("ok", self._setup_root(config, checkpoint, fingerprint, fresh))
            except NlevelError as exc:
                setup = ("error", exc)
            except BaseException as exc:  # any failure on rank 0 must fail every rank, not hang them
                failure = exc
                setup = ("error", NlevelError(f"rank 0 failed while setting up the farm: {exc!r}"))
        else:
            setup = ("", None)
        status, value = t.bcast(setup)
        if status == "error":
            if failure is not None:
                raise failure
            raise value
        self.config, plan = value[0], value[1]
        self.hierarchy: Hierarchy = build(self.size, plan)
        self._checkpoint_path = value[2]
        self._meta = value[3]
        t.poll_max = self.config.poll_max
        t.learn_places()  # where every rank runs: a hung one is killed from its host
        if self.config.ft:
            t.enable_ft()  # from here on a dead rank is an event, not an error
        # A rank that serves while computing runs a server thread beside the user's task.
        info = self.hierarchy[self.rank]
        needs_threads = bool(info.children) and info.computes
        if t.any(needs_threads and not t.thread_multiple):
            raise ConfigError(
                "this MPI does not provide MPI_THREAD_MULTIPLE, which a master or region-master that "
                "also computes needs; use serve_only='all' (--serve-only all) or an MPI with thread support"
            )
        self._progress = None
        local: BaseException | None = None
        ft = self.config.ft
        try:
            self._node = Node(
                t,
                self.hierarchy,
                self.config,
                ledger=self._ledger if self.rank == 0 else None,
                # Under fault tolerance any rank may become the master and write the checkpoint.
                on_checkpoint=self._write_checkpoint if ((self.rank == 0 or ft) and self._checkpoint_path) else None,
                recover=self._recover if ft else None,
                control_dir=control.control_dir(self._checkpoint_path) if self._checkpoint_path else None,
            )
            if self.rank == 0 and self.config.progress:
                from .runtime.progress import Progress

                ledger = self._ledger
                assert ledger is not None
                self._progress = Progress(
                    self.total, lambda: ledger.n_committed, plan.describe(), self.config.progress_interval, ledger.resumed
                )
        except BaseException as exc:
            local = exc
        if t.any(local is not None):
            if local is not None:
                raise local
            raise NlevelError("another rank failed while starting the farm (see its error message)")

    def _setup_root(self, config: Config | None, checkpoint: Any, fingerprint: Any, fresh: bool) -> tuple[Any, ...]:
        from .roles.ledger import Ledger

        config = config if config is not None else Config.from_env()
        plan = config.plan(self.size)
        path = os.fspath(checkpoint) if checkpoint is not None else None
        snap = ckpt.Snapshot.empty()
        if path is not None:
            if fingerprint is None:
                # The script and its arguments: a resume with other arguments is refused.
                fingerprint = {"app": _default_app(), "argv": sys.argv[1:]}
            if isinstance(fingerprint, str):
                fingerprint = {"app": fingerprint}
            params = {k: v for k, v in fingerprint.items() if k != "app"}
            if self.result_fields is not None:
                params["result_fields"] = list(self.result_fields)  # the results' width is part of the run
            fp, source = ckpt.fingerprint(str(fingerprint.get("app")), params)
            self._meta = ckpt.RunMeta(self.total, fp, source, plan.to_json(), __version__)
            snap = ckpt.load(path, self._meta, fresh=fresh)
            self._writer = ckpt.Writer(path, self._meta)
            os.makedirs(control.control_dir(path), exist_ok=True)  # operators' requests (python -m nlevel.drain)
        self._ledger = Ledger(
            self.total,
            map(tuple, snap.completed.tolist()),
            snap.result_ids.tolist(),
            snap.result_values.ravel().tolist(),
            width=len(self.result_fields) if self.result_fields else 1,
        )
        return config, plan, path, self._meta

    def _recover(self) -> Any:
        """This rank takes over as master without the deputy's copy: start from the checkpoint file."""
        from .roles.ledger import Ledger

        width = len(self.result_fields) if self.result_fields else 1
        snap = ckpt.Snapshot.empty()
        if self._checkpoint_path is not None and self._meta is not None:
            try:
                snap = ckpt.load(self._checkpoint_path, self._meta)
            except NlevelError as exc:
                sys.stderr.write(f"nlevel: rank {self.rank}: taking over as master, the checkpoint is unusable "
                                 f"({exc}); every uncommitted task runs again\n")
        self._ledger = Ledger(
            self.total, map(tuple, snap.completed.tolist()), snap.result_ids.tolist(),
            snap.result_values.ravel().tolist(), width=width,
        )
        return self._ledger
    # -- checkpoint (rank 0) ------------------------------------------------------------
    def _write_checkpoint(self, ledger: Any, final: bool) -> None:
        writer = self._writer
        if writer is None and self._meta is not None and self._checkpoint_path is not None:
            writer = self._writer = ckpt.Writer(self._checkpoint_path, self._meta)  # a new master
        if writer is None:
            return
        completed, ids, values = ledger.arrays()
        snap = ckpt.Snapshot(completed, ids, values)
        if final:
            writer.close(snap)
        else:
            writer.submit(snap)

    # -- iteration ------------------------------------------------------------------------
    def complete(self, result: float | Sequence[float] | None = None) -> None:
        """Mark the current task finished, with a result committed together with it, once.

        Without ``complete`` the next iteration reports the task finished anyway; it
        matters when leaving the loop early: a task not completed is given back and
        runs elsewhere.

        Args:
            result: None, a number, or with ``result_fields`` a sequence of exactly that many numbers.

        Raises:
            ValueError: naming the task and what was expected.
        """
        self._completed_current = True
        if result is None:
            self._current_result = None
            return
        fields = self.result_fields
        try:
            if fields is None:
                value: Result = float(result)  # type: ignore[arg-type]
            else:
                value = tuple(float(v) for v in result)  # type: ignore[union-attr]
                if len(value) != len(fields):
                    raise ValueError
        except (TypeError, ValueError):
            want = "a number" if fields is None else f"{len(fields)} numbers ({', '.join(fields)})"
            raise ValueError(f"result of task {self._node.current} must be {want}, got {result!r}") from None
        self._current_result = value

    def results(self) -> tuple[Any, Any] | None:
        """The master (rank 0 unless it died): (ids, values) of every committed result; else None.

        ``values`` has shape ``(n,)``, or ``(n, len(result_fields))``.
        """
        ledger = self._node.ledger
        if ledger is None:
            return None
        _, ids, values = ledger.arrays()
        return ids, values

    def fail(self, info: str) -> None:
        """The current task raised (``info``: the error text): the master retries it or records it failed."""
        self._node.fail_task(info)

    def next(self) -> int:
        """Report the current task finished and return the next id, or -1 when this rank is done."""
        if self._closed:
            return -1
        result, self._current_result = self._current_result, None
        self._completed_current = False
        if self._progress is not None:
            self._progress.start()
        tid = self._node.next(result)
        if tid < 0:
            self._finish()
        return tid

    def __iter__(self) -> Iterator[int]:
        while (tid := self.next()) >= 0:
            yield tid

    def __enter__(self) -> Farm:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
            self.close()
            return
        _abort_job(self.rank, "unhandled exception in the task loop", exc_type, exc, tb, self._ft)

    @property
    def _ft(self) -> bool:
        return bool(getattr(self._transport, "ft", False))

    def _exit_guard(self) -> None:
        """At interpreter exit: a rank leaving mid-job must not hang the others; after failures, skip MPI_Finalize."""
        if not self._closed:
            sys.stderr.write(f"nlevel: rank {self.rank}: the process is exiting in the middle of the job\n")
            _die(self._ft)
        elif self._exit_code is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self._exit_code)  # MPI_Finalize may hang after failures (see MPI_NOTES)

    def close(self) -> None:
        """End the farm on this rank; returns when the job is finished on every rank."""
        if self._closed:
            return
        self._node.leave(self._completed_current, self._current_result)
        self._finish()

    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._progress is not None:
            self._progress.close()
        node, t = self._node, self._transport
        if node.drained and t.ft and node.station.dispatcher is None:
            # Drained: its ids went back and its last completions up; free the core now. Under
            # ULFM the others take its SIGKILL for what it is (it left first, holding nothing).
            t.flush(timeout=5.0)
            time.sleep(0.2)  # let the leaving report land before the process is gone
            sys.stderr.write(f"nlevel: rank {self.rank} drained: leaving the job\n")
            _die(True)
        if t.ft:
            node.end_together()  # answer a new master's questions until every live rank is done
            t.flush(timeout=5.0)  # (a send to a rank that died never completes)
            tt = t.shrink()  # the survivors, whoever they are: every collective from here is theirs
            alive = set(tt.comm.allgather(self.rank))
            self.failed = tuple(r for r in range(self.size) if r not in alive)
            if self.failed:
                self._exit_code = 1  # the master's report decides (below)
        else:
            t.flush()
            t.idle_barrier()  # ranks that finish early (or were drained) wait asleep, not spinning
            tt = t
        self._survivors = tt
        row, merged = node.stats()
        rows = tt.gather(row)  # a few numbers per rank
        totals = tt.reduce(merged, merge_stats)  # summaries merged up a tree, not gathered whole
        error: BaseException | None = None
        if node.ledger is not None and rows is not None:
            ledger = node.ledger
            error = node.checkpoint_error
            if self._writer is not None:
                try:
                    completed, ids, values = ledger.arrays()
                    self._writer.close(ckpt.Snapshot(completed, ids, values))  # the state as it ends
                except Exception as exc:
                    error = exc
            station = node.station
            self.report = build_report(
                config=self.config,
                hierarchy=station.hierarchy,  # the plan the job ended with
                rows=rows,
                totals=totals,
                ledger=ledger,
                started=self._started,
                wall=time.perf_counter() - self._t0,
                checkpoint=self._checkpoint_path,
                writer=self._writer,
                failures=sorted((f for f in totals["failures"] if not f["how"].startswith("drained")),
                                key=lambda f: f["detected_at"]),
            )
            self.report["dead_ranks"] = list(self.failed)
            self.report["timeline"] = timeline(totals.get("timeline", {}), TIMELINE_BIN)
            self.report["drained"] = [{"rank": r, "requested_at": t0} for r, t0 in sorted(node.station.drained.items())]
            self.report["plan_history"] = [p.to_dict() for p in station.plans]
            self.report["stopped"] = "SIGUSR1" if station.stopped else None
            self.report["decisions"] = station.planner.report() if station.planner is not None else []
            if error is not None:
                self.report["checkpoint_error"] = str(error)
        signals.quiet()  # the job is over here: a late SIGUSR1 must not kill the process while it ends
        if self.report is not None and self._exit_code is not None:
            self._exit_code = 0 if self.report["complete"] else 1
        t.close()
        if tt is not t and not self.failed:
            tt.comm.Free()
        if self._exit_code is not None:
            self._exit_code = int(tt.bcast(self._exit_code))  # rank 0 of the survivors is the master
        if error is not None:
            raise error if isinstance(error, NlevelError) else ckpt.CheckpointError(str(error))

    @property
    def committed(self) -> int | None:
        """Ids committed so far (the master; None elsewhere)."""
        ledger = self._node.ledger
        return ledger.n_committed if ledger is not None else None

    def agree_status(self, status: int) -> int:
        """The worst of every surviving rank's ``status`` (collective; after the farm ended)."""
        tt = self._survivors or self._transport
        return tt.allreduce_max(status)


def _abort_job(rank: int, what: str, exc_type: Any, exc: Any, tb: Any, ft: bool = False) -> None:
    """Print the error with rank and host, then end: the whole job, or under fault tolerance this process alone.

    No rank may hang on it: under fault tolerance this process dies by SIGKILL, which the
    others detect (an ordinary exit would leave them waiting, see MPI_NOTES).
    """
    from .runtime import transport as transport_mod

    then = "killing this process; the others carry on without it" if ft else (
        "aborting the job (the checkpoint keeps what was committed)")
    sys.stderr.write(f"nlevel: rank {rank} on {transport_mod.host()}: {what}; {then}\n")
    traceback.print_exception(exc_type, exc, tb, file=sys.stderr)
    _die(ft)


def _die(ft: bool) -> None:
    """End this process so that no other rank hangs: SIGKILL itself (fault tolerant), else abort the job."""
    from .runtime import transport as transport_mod

    sys.stdout.flush()
    sys.stderr.flush()
    if ft:
        transport_mod.kill_self()
    transport_mod.abort(1)


_active: dict[int, Farm] = {}


def get_task_id(total: int, checkpoint_file: str | os.PathLike[str] | None = None, comm: Any = None) -> int:
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

    Returns:
        A task id in ``[0, total)``, or -1.

    Raises:
        ConfigError, PlanError, CheckpointError: bad input, the same on every rank.
    """
    from .runtime import transport as transport_mod

    c = comm if comm is not None else transport_mod.world()
    key = transport_mod.comm_key(c)
    farm = _active.get(key)
    if farm is None:
        farm = Farm(total, checkpoint_file, c)
        _active[key] = farm
    elif int(total) != farm.total:
        raise ConfigError(f"get_task_id called with total={total} while a farm with total={farm.total} is running")
    try:
        tid = farm.next()
    except NlevelError:
        raise
    except BaseException as exc:  # get_task_id has no with-block: abort here rather than hang the others
        _abort_job(farm.rank, "error inside get_task_id", type(exc), exc, exc.__traceback__, farm._ft)
        raise
    if tid < 0:
        del _active[key]
        if farm.report is not None:
            global last_report
            last_report = farm.report
    return tid


#: The report of the last farm that :func:`get_task_id` finished on this rank (rank 0 only).
last_report: dict[str, Any] | None = None
