"""A farm's life on one rank: set-up and end (both collective), and the calls of the user's loop in between.

Set-up (:meth:`FarmRuntime.__init__`) takes two collectives besides the private
communicator's ``Idup``, which overlaps them (a blocking ``Dup`` under fault tolerance):
the window of the boards (``Win.Allocate``), on which every rank takes the self-test at
once; and one exchange (an allgather) that carries what rank 0 decided (settings, plan,
checkpoint state), every rank's answers (its total, threads, window, self-test) and where
every rank runs. Under fault tolerance a barrier and an agreement end it. No fixed sleep,
no wait for a decision: under ``--levels auto`` the job starts on the first plan at once
and the planner decides while it runs.

The end (:meth:`FarmRuntime.end`) is messages (:mod:`nlevel.roles.ending`): every rank's
Ending goes up, the master releases everyone once the last is in. Without fault
tolerance the window's free follows, the one collective of the end; the master merges the
statistics and builds the report after it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable

from .._version import __version__
from ..config import Config
from ..errors import CheckpointError, ConfigError, NlevelError, PlanError
from ..model.hierarchy import Hierarchy, build, check_nodes, fit_nodes, nodes_of
from ..roles.board import HEAD
from ..roles.events import Ran, Tick
from ..roles.ledger import Ledger
from ..roles.loop import Loop
from ..roles.station import Station
from . import control, machine, signals, window
from .identity import identity
from .rank import MpiPort, Runner, clock, prepare_takeover
from .startwatch import mark, start_records
from .report import build_report, station_facts
from .transport import Agreement, MpiError, Transport, kill_self, revoke, setup_recovery, shrink, user_ranks, world

if TYPE_CHECKING:  # (imported by a farm that has a checkpoint: numpy and h5py come with it)
    from . import checkpoint as ckpt

__all__ = ["FarmRuntime"]


def _settings(config: Config | None) -> Config | None:
    """``config``, else the environment's settings (read once per set-up); None when they are bad
    (rank 0 tells every rank what is wrong with them)."""
    if config is not None:
        return config
    try:
        return Config.from_env()
    except NlevelError:
        return None


def _layout(cfg: Config | None) -> tuple[tuple[int, int], bool]:
    """The window's layout under ``cfg`` (None: bad settings, the defaults'): the ring sizes of the
    leaf and the upper board, and whether grants are two-sided (no window at all)."""
    if cfg is None:
        cfg = Config()
    n = cfg.board_slots
    return (n, max(16, n // 8)), cfg.grants == "two-sided"


def _head(boards: Any, rank: int, kind: int) -> int:
    """The HEAD word of this rank's own board ``kind``: local memory where the window allows, else an atomic read."""
    word = boards.own_word(kind, HEAD)
    return word if word is not None else boards(rank, kind).get(HEAD)


def _check_total(total: Any) -> str | None:
    if isinstance(total, bool) or not hasattr(total, "__index__"):
        return f"total must be a non-negative integer, got {total!r} ({type(total).__name__})"
    if int(total) < 0:
        return f"total must be a non-negative integer, got {int(total)}"
    return None


class FarmRuntime:
    """The MPI side of one :class:`~nlevel.api.Farm` on this rank.

    Args:
        total, checkpoint, comm, fingerprint, fresh, config, result_fields, retry_failed: As for the Farm.

    Raises:
        ConfigError, PlanError, CheckpointError: on every rank alike, naming the bad value.
    """

    def __init__(self, total: Any, checkpoint: Any, comm: Any, fingerprint: Any, fresh: bool,
                 config: Config | None, result_fields: tuple[str, ...] | None, *, retry_failed: bool = False) -> None:
        self.started = time.time()
        self.retry_failed = retry_failed
        self.t0 = clock()
        self.width = len(result_fields) if result_fields else 1
        self.result_fields = result_fields
        self.user_comm = comm if comm is not None else world()
        self.released_code = 0  # the status the master ended the job with (its Release)
        self.boards: Any = None
        self._report_made: dict[str, Any] | None = None
        self._make_report: Callable[[], dict[str, Any]] | None = None  # (the master, after the end: see report)
        self.failed: tuple[int, ...] = ()
        self.survivors: Transport | None = None
        self.exit_code: int | None = None
        self.writer: ckpt.Writer | None = None
        self.lock: Any = None  # rank 0: the checkpoint's lock (nlevel.runtime.lock), held for the whole job
        self._decided: tuple[Any, ...] | None = None  # rank 0: what it decided (kept if set-up starts over)
        self._early: tuple[Station, list[Any]] | None = None  # rank 0: its roles, stocked before the exchange
        self._built = False  # this rank's roles are made (see _build), not yet started
        self._released_all = False  # the master released everyone ...
        self.hold_deputy = False  # the caller writes the report after the end, then calls release_deputy()
        #: The caller's writer of the report, for a process that ends the job itself from inside a
        #: task that never returns (see :meth:`_ended_here`); None: the report stays in memory.
        self.on_forced_end: Callable[[dict[str, Any]], None] | None = None
        self._closing: BaseException | None = None  # ... and the checkpoint's error then, if any
        self.released_at = 0.0  # (unix s) when the job was released (by the master, or the deputy that finished it)
        self.setup_deaths: list[dict[str, Any]] = []  # ranks (of the user's communicator) dead during set-up
        # Under ULFM a death inside the set-up collectives must not hang or fail the job: every survivor revokes
        # the set-up's communicator, they shrink and set up again (farm ranks renumbered; the report maps them).
        recover = self._recover = setup_recovery(config)
        base = self.user_comm
        while True:
            try:
                t = self.t = Transport(base, overlap=not recover)
            except MpiError:
                if not recover:
                    raise
                # (ULFM creates communicators uniformly: Dup failed on every survivor alike)
                base = self._after_setup_death(base, time.time())
                continue
            self.rank, self.size = t.rank, t.size
            error: BaseException | None = None
            try:
                self._setup(total, checkpoint, fingerprint, fresh, config)
            except MpiError as exc:
                if not recover:
                    self._abandon(release_lock=True)
                    raise
                error = exc
                revoke(t.comm)  # get the others out of the collective they wait in
            except BaseException:
                self._abandon(release_lock=True)
                raise
            if not recover:
                break
            seen = time.time()
            agreement = Agreement(t.comm, error is None)
            if error is None:
                try:
                    self._build(agreement.progress)  # (local: while the agreement's messages go round)
                except BaseException:
                    agreement.result()
                    self._abandon(release_lock=True)
                    raise
            if agreement.result():
                break  # every rank is set up and none died (ULFM's agreement fails on all alike after a death)
            self._built = False
            survivors = shrink(t.comm)  # (only after a failure: a shrink builds a communicator, milliseconds)
            if survivors.Get_size() == t.size:
                survivors.Free()
                self._abandon(release_lock=True)
                raise error if error is not None else NlevelError(
                    "the farm's set-up failed on another rank (see its error message)")
            self._abandon(release_lock=False)
            base = self._after_setup_death(survivors, seen, shrunk=True)
        self.setup_s = clock() - self.t0  # (the report's set-up time: the model's fixed cost, with the last write)
        mark("run", say=self.rank == 0)  # (for nlevel-mpiexec: the start is over, leases watch from here)
        if self.setup_deaths and self.rank == 0:
            sys.stderr.write(f"nlevel: rank(s) {', '.join(str(d['rank']) for d in self.setup_deaths)} of the job died "
                             f"while the farm was being set up; it goes on with the {self.size} others (farm ranks renumbered)\n")
        try:
            self._start()
        except BaseException:
            self._abandon(release_lock=True)
            raise

    # -- set-up ---------------------------------------------------------------------------
    def _setup(self, total: Any, checkpoint: Any, fingerprint: Any, fresh: bool, config: Config | None) -> None:
        """The collective set-up after the ``Dup``: the window, then one exchange that tells every
        rank what rank 0 decided and every rank's answers (two collectives in all)."""
        t = self.t
        failure: BaseException | None = None
        # Every rank reads the window's layout from its own settings (rank 0's decision is not
        # known yet); a rank whose settings differ is told after the exchange.
        settings = _settings(config)
        layout = _layout(settings)
        if self.rank == 0:
            try:
                if self._decided is None:
                    self._decided = self._decide(total, checkpoint, fingerprint, fresh, settings)
                else:  # set-up starts over after a death: the same decision for fewer processes
                    cfg0 = self._decided[0]
                    self._decided = (cfg0, cfg0.plan(self.size), *self._decided[2:])
                decided: tuple[str, Any] = ("ok", self._decided)
            except NlevelError as exc:
                decided = ("error", exc)
            except BaseException as exc:  # any failure on rank 0 must fail every rank, not hang them
                failure = exc
                decided = ("error", NlevelError(f"rank 0 failed while setting up the farm: {exc!r}"))
        else:
            decided = ("", None)
        slots, two_sided = layout
        boards, seen, problem_here = (None, 0, "") if two_sided else window.allocate(t.setup_comm, self.rank, slots)
        self._early = None
        if self.rank == 0 and self._decided is not None and decided[0] == "ok" and boards is not None \
                and not problem_here and not self._recover:
            # The master stocks its board before the exchange: its children's first claims, right
            # after it, find ids instead of waiting for its roles to be built (they wait in the
            # exchange meanwhile anyway). Used only if the exchange says the window is good. (Not
            # when an agreement closes the set-up: the others wait in it for the master, and stocking
            # after it overlaps their own start, a millisecond or two of an oversubscribed node.)
            cfg0, plan0, total0 = self._decided[0], self._decided[1], self._decided[4]
            st = Station(build(self.size, plan0), 0, cfg0, clock, boards, total0, self._ledger, self.width,
                         facts={"hosts": machine.here()})
            self._early = (st, st.handle(Tick()))
        problem = _check_total(total)
        mine = int(total) if problem is None else 0
        # One collective answers the set-up's questions (rank 0's decision, bad totals, threads,
        # the window and its self-test), tells every rank where the others run (a hung one is
        # killed from its host, with or without ULFM), and orders every board's initialisation
        # before anyone's first claim on it.
        rows = t.share((int(problem is not None), int(not t.thread_multiple), mine,
                        int(boards is None and not two_sided), seen, layout, decided if self.rank == 0 else None))
        t.dup_done()  # (the private communicator's duplication overlapped the window and the exchange)
        status, value = rows[0][6]
        window_failed = any(r[3] for r in rows)
        if problem_here:  # (said once the others answered: after a death, set-up starts over and this is moot)
            sys.stderr.write(f"nlevel: {problem_here}\n")  # (this rank's own: it names the rank and the MPI error)
        if status == "error":
            if boards is not None:
                boards.close(collective=not window_failed)
            if failure is not None:
                raise failure
            raise value
        cfg, plan, path, meta, total0, lock_token, self.costs_from, self.job = value
        # Where the ranks run (every rank saw the same rows: every rank decides the same): regions
        # follow the nodes, so claims stay inside a node (see nlevel.model.hierarchy).
        nodes = nodes_of([place[0] for place in t.places]) if not cfg.split_nodes else ()
        self.nodes_note = ""
        if nodes is None:
            self.nodes_note = ("the ranks of a node are not contiguous (mpiexec --map-by slot keeps them so): "
                               "regions follow ranks, not nodes")
            nodes = ()
        if nodes:
            if cfg.regions and not cfg.auto:
                try:
                    check_nodes(self.size, plan, nodes)
                except PlanError as exc:
                    if boards is not None:
                        boards.close(collective=not window_failed)
                    raise ConfigError(str(exc)) from None
            else:
                plan = fit_nodes(self.size, plan, nodes)
            early = self._early
            if early is not None and [n for n in early[0].hierarchy.nodes] != build(
                    self.size, plan, node_sizes=nodes).nodes:
                # Stocked for a layout without the nodes (a plan of regions): what it published is
                # taken back before anyone claims (claims start after this exchange), or a claimer
                # would find those ranges beside the new station's and run them twice.
                server = early[0].server
                if server is not None:
                    server.close_boards(0, clock())
                self._early = None
        self.plan, self._lock_token = plan, lock_token
        self.config: Config = cfg
        self.checkpoint: str | None = path
        self.meta: ckpt.RunMeta | None = meta
        self.total = total0
        self.hierarchy: Hierarchy = self._early[0].hierarchy if self._early is not None else build(
            self.size, plan, node_sizes=nodes)
        t.poll_max = cfg.poll_max
        h = self.hierarchy
        threads = [r for r, row in enumerate(rows) if row[1] and h[r].children and h[r].computes]
        hi, lo = max(r[2] for r in rows), min(r[2] for r in rows)
        bad = any(r[0] for r in rows)
        expected = _layout(cfg)
        other = [(r, row[5]) for r, row in enumerate(rows) if row[5] != expected]
        if bad or hi != lo or threads or other:
            if boards is not None:
                boards.close(collective=not window_failed)  # (every rank saw the same rows: all leave alike)
            if bad:
                raise ConfigError(problem or "total is invalid on another rank (see its error message)")
            if hi != lo:
                raise ConfigError(f"get_task_id/Farm called with different totals on different ranks (min {lo}, "
                                  f"max {hi}); every rank must pass the same total")
            if other:
                r, (theirs, two) = other[0]
                raise ConfigError(f"the settings differ between ranks: board_slots {theirs[0]}, grants "
                                  f"{'two-sided' if two else 'one-sided'} on rank {r}; board_slots {cfg.board_slots}, "
                                  f"grants {cfg.grants} on rank 0; pass the same settings (config, NLEVEL_* "
                                  f"variables) on every rank")
            raise ConfigError(
                "this MPI does not provide MPI_THREAD_MULTIPLE, which a master or region-master that "
                "also computes needs; use serve_only='all' (--serve-only all) or an MPI with thread support")
        self.boards, self.grants_note = self._boards(
            cfg, boards, window_failed, "" if two_sided else window.self_test_problem([r[4] for r in rows]), slots)
        if cfg.ft and not self._recover:
            # Nobody runs a task before every rank is out of the set-up collectives: a task that
            # ends its process (os._exit) while a slower rank is still inside the window's
            # creation would make Open MPI's osc/sm abort the whole job. (With the set-up's
            # recovery, the agreement that closes it does this: nobody leaves it before all came.)
            t.comm.Barrier()

    def _build(self, progress: Callable[[], None] = lambda: None) -> None:
        """After the collective set-up: this rank's roles and their loop, made but not started (local:
        no MPI, no thread, no output; under ULFM it overlaps the agreement that closes the set-up,
        whose ``progress`` it calls between its parts)."""
        t, cfg, path, meta = self.t, self.config, self.checkpoint, self.meta
        progress()
        ledger = self._ledger if self.rank == 0 else None
        hosts = tuple(p[0] for p in t.places)
        early, self._early = self._early, None
        if early is not None and early[0].boards is self.boards:
            self.station = early[0]  # (stocked before the exchange)
            self.station.hosts = hosts
        else:
            early = None
            self.station = Station(self.hierarchy, self.rank, cfg, clock, self.boards, self.total, ledger, self.width,
                                   hosts=hosts, facts={"hosts": machine.here()})  # (facts: in its Ending, even early)
        progress()
        self.port = MpiPort(t, cfg, path, meta, self.writer, self.width)
        self.port.lock, self.port.lock_token = self.lock, self._lock_token
        self.port.ended_here = self._ended_here
        self.port.last_work = lambda: path is not None or self.hold_deputy  # (a lock and status file, a report file)
        self.loop = Loop(self.station, self.port, cfg.checkpoint_every, cfg.checkpoint_interval,
                         timer=time.perf_counter)
        # (the pulse does MPI from its own thread: without MPI_THREAD_MULTIPLE a rank beats only
        # between tasks, and a task longer than --lease looks hung: said once, below)
        self.runner = Runner(self.station, self.loop, cfg, two_sided=self.boards.kind == "two-sided",
                             pulse=t.thread_multiple)
        self.loop.running = self.runner.task_running
        boards, rank = self.boards, self.rank
        self.runner.head = lambda kind: _head(boards, rank, kind)
        if self.rank == 0 or cfg.ft:  # (the master, or a rank that may become master)
            self.runner.after_step = self._release_when_ended
            self.runner.prepare_takeover = prepare_takeover if path else None
        self._early_effects = early[1] if early is not None else None
        self._built = True

    def _start(self) -> None:
        """After the collective set-up: this rank's roles (see :meth:`_build`), and its loop started."""
        t, cfg, plan, path = self.t, self.config, self.plan, self.checkpoint
        if not self._built:
            self._build()
        if cfg.ft:
            t.enable_ft()  # from here on a dead rank is an event, not an error
        early = self._early_effects
        self.progress: Any = None
        self.recorder: Any = None
        if self.rank == 0 and cfg.progress:
            from .progress import Progress

            led = self._ledger
            self.progress = Progress(self.total, lambda: led.n_committed, plan.describe(),
                                     cfg.progress_interval, led.resumed, state=self._model)
        if self.rank == 0 and path is not None:  # what python -m nlevel.status shows while the job runs
            from .status import Recorder

            self.recorder = Recorder(path, self.live, interval=max(1.0, cfg.checkpoint_interval))
            self.recorder.start()
        if self.grants_note and self.rank == 0:
            sys.stderr.write(f"nlevel: {self.grants_note}\n")
        if self.nodes_note and self.rank == 0:
            sys.stderr.write(f"nlevel: {self.nodes_note}\n")
        if not t.thread_multiple and self.size > 1 and self.station.worker is not None:
            sys.stderr.write(f"nlevel: rank {self.rank}: this MPI does not provide MPI_THREAD_MULTIPLE: the rank beats "
                             f"only between tasks, so a task longer than --lease ({cfg.lease:g} s) looks hung; "
                             f"raise --lease above your longest task\n")
        if early is not None:
            self.loop.perform(early)  # (what stocking asked for: e.g. the final checkpoint of a finished job)
        elif self.station.server is not None:
            # Stock its boards now (its children's first claims must not wait for a thread); a
            # tick, not a whole step: no message can be waiting yet, and an empty probe yields the core.
            self.loop.tick()
        self.runner.start()

    def _abandon(self, *, release_lock: bool) -> None:
        """Undo a set-up that failed here (no collective: the others may be gone)."""
        if release_lock and self.lock is not None:  # (a script's process lives on: it must not keep the lock)
            self.lock.release()
        if self.boards is not None:
            self.boards.close(collective=False)
            self.boards = None
        try:
            self.t.dup_done()
            self.t.comm.Free()
        except MpiError:
            pass  # (a revoked communicator: nothing to give back that matters)

    def _after_setup_death(self, survivors: Any, seen: float, shrunk: bool = False) -> Any:
        """Record who died during set-up (ranks of the user's communicator); return the survivors' communicator."""
        if not shrunk:
            survivors = shrink(survivors)
        known = {d["rank"] for d in self.setup_deaths}
        now = time.time()
        for r in sorted(set(range(self.user_comm.Get_size())) - set(user_ranks(survivors, self.user_comm)) - known):
            self.setup_deaths.append({"rank": r, "role": "set-up", "level": -1, "how": "died during set-up",
                                      "detected_by": -1, "detected_at": seen, "recovered_at": now,
                                      "recovery_ms": (now - seen) * 1e3, "silent_ms": None, "held": 0,
                                      "requeued": 0})
        return survivors

    def _decide(self, total: Any, checkpoint: Any, fingerprint: Any, fresh: bool,
                config: Config | None) -> tuple[Any, ...]:
        """Rank 0: settings, the first plan, and the checkpoint's state."""
        problem = _check_total(total)
        if problem:
            raise ConfigError(problem)
        total = int(total)
        config = config if config is not None else Config.from_env()  # (None: bad settings; this raises why)
        from .costs import with_calibration

        config, costs_from, notes = with_calibration(config)  # (--levels auto: the stored calibration)
        for note in notes:
            sys.stderr.write(f"nlevel: warning: {note}\n")
        plan = config.plan(self.size)
        path = os.fspath(checkpoint) if checkpoint is not None else None
        meta = None
        app, params = identity(fingerprint)  # (checked with or without a checkpoint)
        token = None
        self._ledger = Ledger(total, width=self.width)
        if path is not None:
            from . import checkpoint as ckpt
            from .lock import Lock

            # First of all, before --fresh moves the old file aside: one checkpoint, one job.
            self.lock = Lock.acquire(path)
            token = self.lock.holder.token
            if self.result_fields is not None:
                params["result_fields"] = list(self.result_fields)  # the results' width is part of the run
            fp, source = ckpt.fingerprint(app, params)
            meta = ckpt.RunMeta(total, fp, source, plan.to_json(), __version__)
            meta, snap = ckpt.resume(path, meta, fresh=fresh)
            if meta.fingerprint != fp:  # the file records more than this run counts: say so, once
                sys.stderr.write(f"nlevel: resuming {path}: it also records {meta.fingerprint_source}; "
                                 f"this run counts only {source}, so the rest does not block a resume\n")
            self.writer = ckpt.Writer(path, meta)
            os.makedirs(control.control_dir(path), exist_ok=True)  # operators' requests (python -m nlevel.drain)
            self._ledger = snap.ledger(total, self.width)
            self._ledger.track()  # (the files hold it as it is now: each write appends what changed since)
        if self.retry_failed:
            again = self._ledger.retry_failed()
            shown = ", ".join(map(str, again[:20])) + (f" ... ({len(again)} in all)" if len(again) > 20 else "")
            sys.stderr.write(f"nlevel: retrying {len(again)} failed task(s) recorded in {path}: {shown}\n"
                             if again else f"nlevel: --retry-failed: {path or 'no checkpoint'} records no failed "
                             f"task; running what is not done\n")
        return config, plan, path, meta, total, token, costs_from, os.urandom(16).hex()  # (the last: this job's id)

    def _boards(self, cfg: Config, boards: window.WindowBoards | None, window_failed: bool, self_test: str,
                slots: tuple[int, int]) -> tuple[Any, str]:
        """The boards: one-sided in the window (its self-test passed), or the two-sided fallback; and a note to print."""
        t = self.t
        if cfg.grants == "two-sided":
            return window.MessageBoards(t, self.rank, slots, cfg.poll_max, lambda: t.failed), \
                "grants are two-sided (--grants two-sided): every claim is a message to the parent's server"
        hosts = [place[0] for place in t.places]
        spread = window.cross_node_problem(cfg.ft, hosts)  # (alike on every rank)
        if not window_failed and not self_test and not spread and boards is not None:
            slow = window.progress_problem(boards, t.comm, self.rank, hosts[self.rank] != hosts[0]) \
                if len(set(hosts)) > 1 else ""
            if not slow:
                return boards, ""
            spread = slow
        if boards is not None:
            boards.close(collective=not window_failed)  # (a rank whose allocation failed has no window to free)
        problem = ("" if window_failed else self_test or spread) or "see the message above"
        return window.MessageBoards(t, self.rank, slots, cfg.poll_max, lambda: t.failed), \
            f"one-sided operations do not work here ({problem}); falling back to two-sided grants (messages to each server)"

    def _model(self) -> dict[str, Any]:
        from .progress import model_state

        return model_state(self.station, self.size, clock() - self.t0)

    def live(self) -> dict[str, Any]:
        """Rank 0: the job's state now (for the status record), read without locks from another thread."""
        led = self._ledger
        return {"committed": led.n_committed, "total": self.total, "resumed": led.resumed, "size": self.size,
                "task_output": self.config.task_output or None, **self._model()}

    # -- the user's loop --------------------------------------------------------------------
    def next_range(self, ran: Ran | None) -> tuple[int, int] | None:
        """Report what ran; return the next range (None: this rank's loop is over)."""
        return self.runner.next_range(ran)

    def leave(self, unstarted: tuple[tuple[int, int], ...], ran: Ran | None) -> None:
        """The user's loop left early."""
        self.runner.leave(unstarted, ran)

    @property
    def ledger(self) -> Ledger | None:
        """The master's ledger (None on other ranks)."""
        return self.station.ledger if self.station.is_master else None

    # -- the end ------------------------------------------------------------------------------
    def end(self) -> None:
        """This rank's loop is over: serve until the job is, then the collective end and the report."""
        runner, st, t = self.runner, self.station, self.t
        if self.progress is not None:
            self.progress.close()
        runner.finish_serving()
        runner.stop()
        if st.drain_requested and t.ft and st.server is None:
            # Drained: its ids went back and its last completions up; free the core now. Under
            # ULFM the others take its SIGKILL for what it is (it left first, holding nothing).
            t.flush(timeout=5.0)
            time.sleep(0.2)  # let the leaving report land before the process is gone
            self.port.log("drained: leaving the job")
            sys.stdout.flush(), sys.stderr.flush()
            kill_self()
        self._await_release()
        mark("done")  # (for nlevel-mpiexec: a process stopped from now on hangs nothing, it is killed)
        released = st.closing.released
        assert released is not None
        self.failed = tuple(released.failed)
        signals.reset()  # the job is over here: its stop request (if any) is not the next farm's
        if t.ft or self.failed:
            # No collective from here: a rank that exited unseen (or one given up, stuck in its
            # task) would hang it. Every process ends with os._exit (MPI_Finalize may hang after
            # failures) and the master's status; mpiexec reports the worst.
            t.flush(timeout=5.0)
            self.exit_code = int(released.code)
            self.boards.close(collective=False)
        else:
            t.flush()
            if self.boards.kind == "two-sided":
                t.idle_barrier(runner.step)  # (a server answers board operations until the last child is out)
            # One-sided, nothing is in flight to a released rank (every rank's Ending was its last
            # message, the master's Release its last), and freeing the window is collective.
            self.boards.close(collective=True)
            t.close()
            if released.code:  # (a script's process too ends with the job's status: failed ids, a stop)
                self.exit_code = int(released.code)
        self.released_code = int(released.code)
        error: BaseException | None = self.port.checkpoint_error
        # The master died after releasing some ranks (its final checkpoint written first): its
        # deputy released the rest and writes the report, from what it has (the dead master's
        # recoveries were mirrored to it; every dead rank is listed; the others' rows are lost).
        successor = st.closing.finished_release
        if successor:
            self.released_at = time.time()
        if self._released_all or successor:  # the master: the report, once every rank's part is over
            error = self._closing
            self._make_report = self._report_maker(successor, error)
        if self.recorder is not None:
            self.recorder.close(finished=True, complete=bool(self.report and self.report.get("complete")))
        if self.port.lock is not None:
            self.port.lock.release()
        if not self.hold_deputy:
            self.release_deputy()
        told = st.closing.released
        if error is None and told is not None and told.error:  # (the master's, told with the release)
            error = CheckpointError(told.error, path=self.checkpoint, errno=told.errno or None)
        if error is not None:
            from . import checkpoint as ckpt

            raise ckpt.write_error(self.checkpoint or "", error) from None  # (new: no chain, no writer's traceback)

    @property
    def report(self) -> dict[str, Any] | None:
        """The run report: the master's (or the successor's that finished its release), once the job
        is over; None on the other ranks and before.

        Built when first read, from what the end left: the master returns from the end right after
        the release instead of after merging every rank's statistics and building the report
        (1.5-4 ms, the last of a short job's end: 4 ranks under ULFM on 2 cores, measured).
        """
        make = self._make_report
        if make is not None:
            self._make_report = None
            self._report_made = make()
        return self._report_made

    @report.setter
    def report(self, value: dict[str, Any] | None) -> None:
        self._make_report, self._report_made = None, value

    @property
    def has_report(self) -> bool:
        """Whether :attr:`report` is (or will be, when read) a report, not None."""
        return self._make_report is not None or self._report_made is not None

    def _report_maker(self, successor: bool, error: BaseException | None) -> Callable[[], dict[str, Any]]:
        """What builds the report later (:attr:`report`), with what may change meanwhile taken now:
        the wall time, the ranks let go, the launcher's records, the user's ranks (MPI)."""
        st = self.station
        ledger = st.ledger
        assert ledger is not None
        facts = self._report_facts()

        def make() -> dict[str, Any]:
            rows, totals = st.closing.partial_payload if successor else st.closing.payload
            report = self._report(rows, totals, ledger, *facts)
            if successor:
                report["written_by"] = {
                    "rank": st.rank, "why": "the master died after releasing the job; its deputy finished the "
                    "release and wrote this report (the other ranks' statistics were lost with the master)"}
            if error is not None:
                report["checkpoint_error"] = str(error)
            return report

        return make

    def release_deputy(self) -> None:
        """The master (or the successor that finished its release), its report written: send the
        releases it held back (see :meth:`~nlevel.roles.loop.Loop.report_done`): its deputy's
        under fault tolerance (it watches the master until then, and writes the report if it
        dies); everyone's when, without it, a rank was given up."""
        if (self._released_all or self.station.closing.finished_release) and self.loop.report_done():
            self.t.flush(timeout=5.0)

    def _ended_here(self, status: int) -> None:
        """The last rank ends the job from inside its own task, past ``--task-timeout`` (see
        :meth:`~nlevel.runtime.rank.MpiPort.retire`; its checkpoint is written): the report, as
        the end would build it, is given to :attr:`on_forced_end`. Called in the server thread,
        which holds the runner's lock; the process exits right after."""
        st = self.station
        ledger = st.ledger
        if ledger is None:
            return
        self.released_code, self.released_at = status, time.time()
        rows, totals = st.closing.partial_payload  # (its own row: no other rank is left)
        report = self._report(rows, totals, ledger, *self._report_facts())
        if self.port.checkpoint_error is not None:
            report["checkpoint_error"] = str(self.port.checkpoint_error)
        self.report = report
        if self.recorder is not None:
            self.recorder.close(finished=True, complete=bool(report.get("complete")))
        if self.on_forced_end is not None:
            self.on_forced_end(report)

    def _await_release(self) -> None:
        """Take part in the end (:mod:`nlevel.roles.ending`) until the master releases this rank.

        The master, once every live rank's statistics are in, writes the last checkpoint and
        the report, then releases everyone; a rank that becomes master meanwhile does it.
        """
        st = self.station
        if st.closing.released is not None:
            return  # (the master, its server thread having released everyone: no look, no probe)
        # (the end is on every rank's critical path: a short job waits for it; the runner's one waiting policy)
        self.runner.wait(lambda: st.closing.released, after=self._release_when_ended, serving=False)

    def _release_when_ended(self) -> None:
        """The master, under the runner's lock: release everyone once every live rank has ended (see
        :meth:`~nlevel.roles.loop.Loop.release`: the last checkpoint, the failed ids told).

        (The statistics are merged and the report built after the end's collectives: no rank
        waits for the report, except those whose release the master holds back until its last
        work is done, see :meth:`release_deputy`.)
        """
        if self.loop.release():
            self._released_all, self._closing, self.released_at = True, self.port.checkpoint_error, time.time()

    def _report_facts(self) -> tuple[float, set[int], list[dict[str, Any]], list[int] | None]:
        """What :meth:`_report` takes from now: the wall time, the ranks let go after the release, the
        launcher's records of deaths before MPI was up, and (after deaths during set-up) the user's ranks."""
        ranks = user_ranks(self.t.comm, self.user_comm) if self.setup_deaths else None
        return clock() - self.t0, self.station.closing.left_after_release, start_records(self.started), ranks

    def _report(self, rows: list[dict[str, Any]], totals: dict[str, Any], ledger: Ledger, wall: float,
                left: set[int], early: list[dict[str, Any]], ranks: list[int] | None) -> dict[str, Any]:
        st = self.station
        if left:
            totals = {**totals, "failures": [f for f in totals["failures"] if f["rank"] not in left]}
        report = build_report(
            config=self.config, hierarchy=st.hierarchy, rows=rows, totals=totals, ledger=ledger,
            started=self.started, wall=wall, checkpoint=self.checkpoint, writer=self.port.writer,
            failures=early + sorted(  # (deaths before MPI was up first)
                (f for f in totals["failures"] if not f["how"].startswith("drained")), key=lambda f: f["detected_at"]),
        )
        report["setup_s"], report["released_at"] = self.setup_s, self.released_at  # (unix s: the end)
        report["job"] = self.job  # (the same on every rank: a deputy tells its master's report of this job by it)
        if self.setup_deaths:  # (ranks of the user's communicator; the farm's own were renumbered after them)
            report["failures"] = self.setup_deaths + report["failures"]
            report["user_ranks"] = ranks
        facts = station_facts(st, totals, left)
        report["failures"] += facts.pop("lost")
        places = self.t.places
        for f in report["failures"]:  # (where it ran: a whole node lost shows as its ranks on one host)
            if 0 <= f["rank"] < len(places) and "host" not in f:
                f["host"] = places[f["rank"]][0]
        report.update(facts)
        report["grants"] = self.boards.kind
        report["costs_from"] = self.costs_from  # (where the model's costs came from: calibration, settings)
        report["retried_failed"] = self.retry_failed
        return report

    def results(self) -> tuple[Any, Any] | None:
        """The master: (ids, values) of every committed result; None elsewhere."""
        ledger = self.ledger
        if ledger is None:
            return None
        _, ids, values = ledger.arrays()
        return ids, values

    def agree_status(self, status: int) -> int:
        """The worst of ``status`` and the job's (after the end).

        Collective over the user's communicator when no process died and fault tolerance is
        off; otherwise local (the master's status came with its release, and a collective
        could wait for a process that exited unseen).
        """
        if self.ft or self.failed:
            return max(status, self.released_code)
        from .transport import allreduce_max

        return allreduce_max(self.user_comm, max(status, self.released_code))

    @property
    def ft(self) -> bool:
        """Whether dead ranks are survived (ULFM)."""
        return bool(self.t.ft)

