"""One rank's roles as one state machine: :meth:`Station.handle` takes an event, returns effects. Pure Python.

The MPI runtime, the simulator and the tests' in-process network all drive ranks through
this class (with the loop of :mod:`nlevel.roles.loop`), so they run the same logic. Events
and effects are in :mod:`nlevel.roles.events`.

A station is composed of sub-machines, each owning its state, none inheriting from another:

* the **server** (:class:`~nlevel.roles.master.Master` or :class:`~nlevel.roles.region.Region`),
  if this rank serves, and the **worker** (:class:`~nlevel.roles.worker.Worker`) if it computes;
* :class:`~nlevel.roles.delivery.Delivery`: reports up the tree, and when they are safe;
* :class:`~nlevel.roles.failures.Recovery`: deaths, reconciliations, take-overs, the deputy's copy;
* :class:`~nlevel.roles.watch.Watching`: heartbeats, leases, kills, task time limits;
* :class:`~nlevel.roles.ending.Closing`: the end of the job and the release;
* :class:`~nlevel.roles.replan.Replanning`: moving the running job to another plan;
* the **planner** (:class:`~nlevel.roles.autoplan.AutoPlanner`), on the master under ``--levels auto``.

The station itself holds what they all read (this rank, the plan laid out, the ranks known
dead, the settings, the clocks), routes each event to the sub-machine that owns it, and
runs the server's and the worker's steps. The sub-machines reach each other through it
(``self.st``); nothing outside reaches them but through :meth:`Station.handle`, and reads
of their state (the runtime's report, the tests).

The user's loop talks to it through three events: :class:`~nlevel.roles.events.Ran`
(these tasks finished), :class:`~nlevel.roles.events.NeedIds` (put the next range in
:attr:`Station.hand`), :class:`~nlevel.roles.events.Leave`; while it runs a short hand the
runtime may add :class:`~nlevel.roles.events.Prefetch` (claim the next range ahead). Everything
else is the servers' and the runtime's: messages, ticks, deaths, the operator's requests.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Final

from ..config import Config
from ..model.hierarchy import Hierarchy, Role
from ..model.plan import Plan
from ..ranges import RangeSet
from ..stats import Timeline
from .autoplan import AutoPlanner
from .board import FINAL
from .delivery import Delivery
from .ending import Closing
from .events import (
    Answer, CheckpointLoaded, CheckpointWritten, Died, DrainRequest, Effect, Event, Kill, Leave, Log, NeedIds, Prefetch,
    Overran, Ran, Received, ReleaseJob, ReportDone, Send, Served, Stop, Tick, TeamLost, UserError, WriteCheckpoint,
)
from .failures import Recovery
from .ledger import Ledger
from .master import Master
from .messages import (
    Ack, BoardOp, BoardReply, Drain, Ending, FailureRecord, Gone, Halt, Heartbeat, Holding, KillRequest, Message,
    Mirror, Regroup, Release, Report, Safe, TimedOut, InQuestion,
)
from .region import Region
from .replan import Replanning
from .results import vet
from .server import LEAF, Boards, Server, Sizing
from .recovery import GIVEN_UP
from .watch import Watching
from .worker import PREFETCH_SPAN, State, Worker

__all__ = ["Station"]

#: Claims one ``NeedIds`` makes before it reports "wait" (a claim that loses a race claims again).
_ATTEMPTS: Final = 8


class Station:
    """The state machines of one rank, composed (see the module docstring).

    Args:
        hierarchy: The laid-out plan.
        rank: This rank.
        config: Settings.
        clock: Returns seconds (monotonic).
        boards: Where the boards are (an MPI window, or local memory).
        total: The farm's number of tasks.
        ledger: The completion record; required on the master.
        width: Numbers per task result.
        wall: Returns the wall-clock time (failure records).
        hosts: Every rank's host name (failure records; may be empty).
        setup_failed: Ranks that died while the farm was being set up (``hierarchy`` was
            built without them); the master records them.
        facts: Where this rank runs (``{"hosts": ...}``), for the run report.
        measured: False: its worker does not time its claims and keeps only the moments of its
            task times (the simulator, which times claims in simulated time).
    """

    def __init__(self, hierarchy: Hierarchy, rank: int, config: Config, clock: Callable[[], float], boards: Boards,
                 total: int, ledger: Ledger | None = None, width: int = 1,
                 wall: Callable[[], float] = time.time, hosts: tuple[str, ...] = (),
                 setup_failed: frozenset[int] = frozenset(), facts: dict[str, Any] | None = None,
                 measured: bool = True) -> None:
        self.rank = rank
        self.measured = measured
        self.facts: dict[str, Any] = dict(facts or {})
        self.total = total
        self.width = width
        self.size = hierarchy.size
        self.config = config
        self.ft = config.ft  # (read once: Config.ft looks at the environment)
        self.clock = clock
        self.wall = wall
        self.boards = boards
        self.ledger = ledger
        self.hosts = hosts
        self.sizing = Sizing(config.chunk, config.chunk_target, config.max_chunk, hierarchy.plan.prefetch,
                             max(0.01, 4 * config.server_period), ids_per_proc=total / max(1, hierarchy.size))
        self.epoch = 0
        self.plans: list[Plan] = [hierarchy.plan]
        self.failed: frozenset[int] = frozenset(setup_failed)  # ranks known dead (or given up)
        self.served_before = 0  # ranges taken under earlier servers of this rank
        self.timeline = Timeline()  # ranges taken here over time (the run report)
        self.final_asked = False  # the master asked for the final checkpoint (the job is done)
        self.final = False  # ... and raised FINAL on its boards
        self.job_over = False  # a new master whose predecessor died while releasing: the job is over
        self.loading = False  # a new master waits for its ledger from the checkpoint file
        self.abandoned = False  # this rank gave itself up (its task hung, no fault tolerance)
        self.drain_requested = False  # this rank is to leave the job (an operator's request)
        self.drained: dict[int, float] = {}  # the master: ranks it asked to leave, and when
        self.stop_reason = ""  # why the master stopped the job early: "SIGUSR1", "task timeout", "checkpoint", "lock"
        # Errors in the user's program (see roles.events.UserError): this rank's own, told again to
        # each new master; and the master's record of every rank's (rank -> the error), first one first.
        self.erred = ""
        self.user_errors: dict[int, str] = {}
        self.planner: AutoPlanner | None = None
        if rank == 0 and config.auto:
            self.planner = AutoPlanner(self.size, config, hierarchy.plan, total, max(1, len(hierarchy.node_sizes)))
        # The sub-machines, each given those below it (see nlevel.roles.host).
        self.delivery = Delivery(self)
        self.replanning = Replanning(self, self.delivery)
        self.recovery = Recovery(self, self.delivery, self.replanning)
        self.closing = Closing(self, self.recovery, self.replanning)
        self.watching = Watching(self, self.recovery, self.closing)
        self.worker: Worker | None = None
        self.server: Server | None = None
        self.lay_out(hierarchy)
        if setup_failed and isinstance(self.server, Master):
            now = wall()
            for r in sorted(setup_failed):
                self.recovery.failures.append(
                    FailureRecord(r, "(set-up)", -1, "died while the farm was set up", rank, now, 0).closed(0, (), now))

    def handle(self, event: Event) -> list[Effect]:
        """Take one event; return what the runtime must do."""
        if self.abandoned:
            return []  # this rank left the job (its task hung): the others carry on without it
        kind = type(event)
        if kind is Received:
            assert isinstance(event, Received)
            return self.receive(event.src, event.msg)
        if kind is Tick:
            assert isinstance(event, Tick)
            self.watching.own_running = event.running
            return self.tick()
        if kind is NeedIds:
            assert isinstance(event, NeedIds)
            if event.ran is not None:
                told = self.ran(event.ran)  # (its report, if due, goes with need_ids')
                return told + self.need_ids() if told else self.need_ids()
            return self.need_ids()
        if kind is Prefetch:
            return self.prefetch()
        if kind is Ran:
            assert isinstance(event, Ran)
            return self.ran(event) + self.worker_report()
        if kind is Leave:
            assert isinstance(event, Leave)
            return self.leave(event.unstarted)
        if kind is Died:
            assert isinstance(event, Died)
            return self.fail(event.ranks, event.how, event.tell)
        if kind is Stop:
            assert isinstance(event, Stop)
            return self.stop(event.reason)
        if kind is DrainRequest:
            assert isinstance(event, DrainRequest)
            return self.drain(event)
        if kind is CheckpointLoaded:
            assert isinstance(event, CheckpointLoaded)
            return self.recovery.loaded(event)
        if kind is ReleaseJob:
            assert isinstance(event, ReleaseJob)
            return self.closing.release(event.code, event.report, event.error, event.errno, event.last_work)
        if kind is ReportDone:
            return self.closing.release_deputy()
        if kind is Served:
            assert isinstance(event, Served)
            if self.planner is not None:
                self.planner.on_service(event.seconds)
            return []
        if kind is Overran:
            assert isinstance(event, Overran)
            return self.watching.overran(event.task, event.seconds)
        if kind is CheckpointWritten:
            assert isinstance(event, CheckpointWritten)
            return self.finish_job() if event.final else []
        if kind is UserError:
            assert isinstance(event, UserError)
            return self.user_error(self.rank, event.why)
        if kind is TeamLost:
            assert isinstance(event, TeamLost)
            return self.recovery.team_lost(event)
        raise TypeError(f"not an nlevel event: {event!r}")

    @property
    def claim_ahead(self) -> bool:
        """Whether a :class:`~nlevel.roles.events.Prefetch` would claim now (the runtime wakes a thread for it)."""
        w = self.worker
        return w is not None and not self.drain_requested and self.closing.released is None \
            and w.parent not in self.failed and self.watching.own_running <= PREFETCH_SPAN and w.prefetch_due()

    @property
    def hand(self) -> tuple[int, int] | None:
        """The range the user's loop runs now (after :class:`NeedIds`), or None."""
        return self.worker.hand if self.worker is not None else None

    @property
    def ended(self) -> bool:
        """Whether this rank's user loop is over (no id will come, it left, or the master released it:
        a leaf that sent its Ending early may be released before it reads FINAL)."""
        w = self.worker
        return w is None or w.state in (State.END, State.LEFT) or self.closing.released is not None

    def fail(self, ranks: tuple[int, ...], how: str = "ulfm", tell: bool = False) -> list[Effect]:
        """``ranks`` are dead (``tell``: this rank found out by itself, see :meth:`Recovery.fail`)."""
        let_go = self.closing.let_go
        if let_go and any(r in let_go for r in ranks):
            # Released by this rank, they exit (under ULFM an exit is a death; the watch finds them
            # gone): not failures of the job (CI: a node's ranks given up, then a healthy rank
            # released before the master's report was recorded as dead).
            ranks = tuple(r for r in ranks if r not in let_go)
            if not ranks:
                return []
        self.closing.forget(frozenset(ranks) - self.failed)  # (before the deferred messages are read again)
        return self.recovery.fail(ranks, how, tell)

    def took_over(self) -> list[Effect]:
        """This rank is the new master (its roles laid out): what its predecessor left half done."""
        outs: list[Effect] = []
        notes, self.recovery.timeout_notes = self.recovery.timeout_notes, []
        for rank, ids in notes:  # tasks that ran past their limit, told to the deputy
            outs += self.watching.note_timeout(rank, ids)
        return outs + self.closing.release_for_dead_master()  # (if it died while releasing everyone)

    # -- messages ---------------------------------------------------------------------------
    def receive(self, src: int, msg: Message) -> list[Effect]:
        """A wire message from ``src``."""
        if self.planner is not None:
            self.planner.on_message(self.clock())
        if isinstance(msg, Report):
            told: list[Effect] = []
            if type(msg.results) is not tuple or msg.results:
                # Results enter here from other ranks: as the ledger stores them, or their tasks failed
                # (a value the master cannot store must never raise in its thread, nor shift its array).
                msg, told = vet(src, msg, self.width)
            if msg.ending is not None:
                return told + self._receive(src, replace(msg, ending=None)) + self._receive(src, msg.ending)
            return told + self._receive(src, msg) if told else self._receive(src, msg)
        return self._receive(src, msg)

    def _receive(self, src: int, msg: Message) -> list[Effect]:
        if isinstance(msg, Mirror):
            outs = self.recovery.on_mirror(msg)  # (even from a master that died since: its commits stand)
            self.watching.heard_master()  # (a copy is the master's beat to its deputy)
            return outs
        if isinstance(msg, Gone):
            if src in self.recovery.given_up and msg.how.startswith(GIVEN_UP):
                # A rank given up may live on (its node thawed, its link mended) and give up others
                # in turn: children that stopped beating to it only because it was given up.
                return []
            return self.fail(msg.ranks, msg.how)  # (news from a rank that may have died since)
        if isinstance(msg, TimedOut):
            return self.watching.on_timed_out(msg)  # (sent by a rank just before it was killed)
        if isinstance(msg, Halt):
            return self.user_error(msg.rank, msg.why, src)  # (the error stands, whatever became of its rank)
        if isinstance(msg, Safe):
            return self.delivery.on_safe(src, msg.seq)  # (true even if its sender died since)
        if src in self.failed:
            return []  # sent before it died; what it held is already back in a queue
        if isinstance(msg, Heartbeat):
            return self.watching.on_heartbeat(src, msg.running)
        if isinstance(msg, Ending):
            if self.ft and self.recovery.defer(src, msg):
                return []  # (after the sender's reports set aside before it: one would drop it)
            return self.closing.on_ending(src, msg)
        if isinstance(msg, Report):
            self.closing.endings.pop(src, None)  # (an early Ending no longer holds: the child sends another)
        if isinstance(msg, Release):
            return self.closing.on_release(msg)
        if isinstance(msg, BoardOp):
            return self._board_op(src, msg)
        if self.ft and isinstance(msg, Holding) and msg.ask and set(msg.failed) - self.failed - {self.rank}:
            # A reconciler's question names deaths this rank has not heard of: they are certain (the
            # asker was told by MPI or the launcher, or killed the rank itself), so they count from
            # now. Waiting for this rank's own notice held a master's recovery up to 196 ms: ULFM
            # told some survivors 130-160 ms after the new master (8 ranks on 2 cores; they had its
            # question at 33-43 ms). (Recorded as "ulfm" should this rank be the one to record it.)
            return self.fail(msg.failed) + self._receive(src, msg)  # (fail() keeps only the news)
        if self.ft and isinstance(msg, (Report, Holding)) and self.recovery.defer(src, msg):
            return []
        if isinstance(msg, Holding):
            return self.recovery.on_holding(src, msg)
        if isinstance(msg, KillRequest):
            return [Kill(msg.rank, msg.why)]
        if isinstance(msg, Drain):
            self.drain_requested = True
            return []
        if isinstance(msg, Regroup):
            serving = self.server
            outs = self.replanning.regroup(src, msg)
            return outs + self.recovery.hand_over() if self.server is not serving else outs
        if isinstance(msg, InQuestion):
            return self.recovery.on_in_question(msg)
        if isinstance(msg, Ack):
            return self.replanning.ack(src, msg)
        if isinstance(msg, Report):
            outs = self._report(src, msg)
            if self.ft:
                outs += self.recovery.mirror_out()
            return outs
        raise TypeError(f"rank {self.rank} cannot handle {msg!r} from rank {src}")

    def _report(self, src: int, msg: Report) -> list[Effect]:
        if msg.orphan or msg.epoch < self.epoch:
            return self.orphan(src, msg)
        if msg.epoch > self.epoch:
            self.replanning.future.append((src, msg))  # its sender regrouped before we did
            return []
        d = self.server
        if d is None:
            return self.orphan(src, msg)  # (a stray: this rank serves nobody now)
        now = self.clock()
        if self.planner is not None and isinstance(d, Master) and msg.tasks:
            self.planner.on_tasks(msg.tasks, msg.busy, msg.busy_sq, msg.task_max, now)
        d.on_report(src, msg, now)
        self.delivery.heard(src, msg.seq)
        return self.serve()

    def _board_op(self, src: int, op: BoardOp) -> list[Effect]:
        """Two-sided fallback: a claimer's operation on one of this rank's boards."""
        mem = self.boards(self.rank, op.kind)
        if op.op == "fetch_add":
            values: tuple[int, ...] = (mem.fetch_add(op.index, op.a),)
        elif op.op == "read":
            values = tuple(int(v) for v in mem.read(op.index, op.a))
        elif op.op == "cas":
            values = (mem.cas(op.index, op.a, op.b),)
        else:
            raise ValueError(f"unknown board operation {op.op!r} from rank {src}")
        return [Send(src, BoardReply(values))]

    # -- time --------------------------------------------------------------------------------
    def tick(self) -> list[Effect]:
        """Time-driven work: boards, batches, leases, the planner, the deputy's copy."""
        outs: list[Effect] = []
        d = self.server
        if self.recovery.free and isinstance(d, Master):
            # A new master's ids above its predecessor's mark: out once its questions to the
            # survivors are (a survivor that finds ids first answers only after its range).
            d.queue.add_ranges(self.recovery.free.ranges())
            self.recovery.free = RangeSet()
        if self.planner is not None and isinstance(d, Master) and not self.final_asked and not self.failed:
            ledger = d.ledger
            plan = self.planner.tick(self.clock(), ledger.n_committed / max(1, ledger.total), d)
            if plan is not None and plan.min_size() <= self.size:
                outs += self.replanning.switch(plan)
        outs += self.serve(full=True)
        outs += self.give_back_ahead()
        outs += self.worker_report()
        outs += self.watching.lease_kills()
        if self.ft:
            outs += self.recovery.mirror_out()
        outs += self.watching.heartbeats() + self.watching.watch_master() + self.watching.watch() + self.delivery.tell_safe()
        outs += self.watching.unkillable()
        outs += self.closing.step()
        return outs

    # -- the user's loop -------------------------------------------------------------------
    def ran(self, event: Ran) -> list[Effect]:
        """Record what the user's loop finished (its results checked as a report's are, see :func:`vet`)."""
        w = self.worker
        assert w is not None, f"rank {self.rank} runs no tasks"
        told: list[Effect] = []
        if type(event.results) is not tuple or event.results:
            checked, notes = vet(self.rank, Report(event.done, event.results, failed=event.failed), self.width)
            if notes:
                told = list(notes)
                event = replace(event, done=checked.done, results=checked.results, failed=checked.failed)
        w.ran(event.done, event.results, event.failed, event.tasks, event.busy, event.longest, self.clock(),
              event.busy_sq, event.times)
        return told

    def need_ids(self) -> list[Effect]:
        """Put the next range in :attr:`hand`: from the queue, or claimed from the parent's board."""
        w = self.worker
        assert w is not None, f"rank {self.rank} runs no tasks"
        if self.drain_requested and w.state is not State.LEFT:
            return self.leave(()) + [Log("drained: leaving the job (an operator's request)")]
        outs: list[Effect] = []
        if w.hand is not None or w.state is State.LEFT or self.closing.released is not None:
            # (released: no id will come, and its parent, released too, may have left: a question to
            # its board by message would never be answered)
            return outs
        own = w.parent == self.rank and self.server is not None
        for attempt in range(_ATTEMPTS):
            if w.parent in self.failed:
                w.state = State.WAIT  # the failure notice will give it a new parent
                break
            try:
                claim = w.refill(self.boards(w.parent, LEAF), self.clock())
            except ConnectionError:  # (a board reached by messages whose owner is gone: its death, or
                w.state = State.WAIT  # the job's end, is news this rank's loop reads next)
                break
            # (self.hand, not w.hand: mypy narrowed w.hand to None above, and the compiled
            # simulator would enforce that narrowing although refill() just set it)
            if self.hand is not None or w.state is State.END or claim is None:
                break
            if claim.status == "lost":
                continue
            if own and attempt == 0:
                outs += self.serve()  # its own board is empty: stock it now, and claim again
                continue
            break
        if self.hand is None and w.state is State.RUN:
            w.state = State.WAIT  # every claim lost its race: nothing to run until the next look
        if own and self.ft and self.hand is not None:
            outs += self.recovery.mirror_out()  # the deputy learns what the master runs (its death counts toward quarantine)
        outs += self.worker_report()
        if w.all_out and self.hand is None:
            outs += self.closing.early_ending()  # (right behind its last report: the end need not wait for its next look)
            outs = _ride(outs, self.ft)
        return outs

    def prefetch(self) -> list[Effect]:
        """Claim the next range into the worker's queue while its hand runs (when due: see
        :meth:`~nlevel.roles.worker.Worker.prefetch_due`); the master's deputy learns of it."""
        w = self.worker
        if w is None or not self.claim_ahead:
            return []
        try:
            claim = w.prefetch(self.boards(w.parent, LEAF), self.clock())
        except ConnectionError:  # (a board reached by messages whose owner is gone: news for the next look)
            return []
        if claim.status == "ids" and w.parent == self.rank and self.server is not None and self.ft:
            return self.recovery.mirror_out()  # (what the master holds counts toward quarantine if it dies)
        return []

    def give_back_ahead(self) -> list[Effect]:
        """The task in hand has run longer than its whole hand was expected to take (:data:`PREFETCH_SPAN`):
        the range claimed ahead goes back to the parent, for another rank to run."""
        w = self.worker
        if w is None or not w.queue or self.watching.own_running <= PREFETCH_SPAN or w.state is State.LEFT \
                or w.parent in self.failed or self.closing.released is not None:
            return []
        return self.delivery.report_up(w.give_back(self.clock()), w.parent)

    def leave(self, unstarted: tuple[tuple[int, int], ...]) -> list[Effect]:
        """The user's loop left early: its ids go back to its parent."""
        w = self.worker
        if w is None or w.state is State.LEFT:
            return []
        if w.state is State.END and not unstarted and not w.queue:
            w.state = State.LEFT
            return self.worker_report(force=True)
        return self.delivery.report_up(w.leave(unstarted, self.clock()), w.parent)

    # -- the master's controls ---------------------------------------------------------------
    def stop(self, reason: str = "SIGUSR1") -> list[Effect]:
        """The master: stop handing out ids (SIGUSR1, a task past its time limit without fault tolerance,
        a checkpoint that cannot be written); running tasks finish, then everyone is released."""
        d = self.server
        if not isinstance(d, Master):
            return []
        self.stop_reason = self.stop_reason or reason
        d.stop(self.clock())
        return self.serve()

    def user_error(self, rank: int, why: str, src: int | None = None) -> list[Effect]:
        """An error in the user's program on ``rank`` (see :class:`~nlevel.roles.events.UserError`;
        ``src``: who told this rank). The master stops the job, saying so once; another rank tells
        the master (its own error also to every later master: see :meth:`fail`)."""
        if rank == self.rank:
            self.erred = self.erred or why
        if not isinstance(self.server, Master):
            master = self.hierarchy.master
            if master == self.rank or master == src:
                return []  # (a master being made, or one that sent it here: the sender's own error comes again)
            return [Send(master, Halt(rank, why))]
        if rank in self.user_errors:
            return []
        self.user_errors[rank] = why
        if len(self.user_errors) > 1:
            return []  # the job is stopping already (the report lists every rank's error)
        return [Log(f"an error in the program on rank {rank}, raised there by complete() (not a task failure): "
                    f"{why}; stopping the job: running tasks finish, then every rank ends with exit status 1")
                ] + self.stop(f"an error in the program on rank {rank}")

    def drain(self, request: DrainRequest) -> list[Effect]:
        """The master: take ranks out of the job (an operator's request); answer it.

        Total: whatever the request holds, the answer is an :class:`Answer` (an error naming the
        value when the request cannot be acted on), and nothing changes unless it is acted on.
        """
        try:
            chosen = self._drain_choice(request)
        except ValueError as exc:
            return [Answer(request.token, {"error": str(exc)})]
        except Exception as exc:  # (operator input never raises here: whatever slipped through is refused)
            return [Answer(request.token, {"error": f"cannot act on this request: {exc!r}"})]
        now = self.wall()
        outs: list[Effect] = []
        for r in chosen:
            self.drained[r] = now
            if r == self.rank:
                self.drain_requested = True
            else:
                outs.append(Send(r, Drain()))
        outs.append(Answer(request.token, {"result": {"ranks": chosen}}))
        outs.append(Log(f"unacked ranks {chosen} (operator request)"))
        return outs

    def _drain_choice(self, request: DrainRequest) -> list[int]:
        """The ranks a drain request takes out; ValueError naming the value when it cannot be acted on."""
        if not isinstance(self.server, Master):
            raise ValueError(f"rank {self.rank} is not the master")
        h = self.hierarchy
        computing = [r for r in range(self.size) if h[r].computes and r not in self.drained and r not in self.failed]
        slaves = [r for r in computing if h[r].role.value == "slave"]
        ranks, count = request.ranks, request.count
        if (ranks is None) == (count is None):
            raise ValueError("a drain request names ranks or a count, not both nor neither")
        if ranks is not None:
            if not isinstance(ranks, (tuple, list)) or not ranks:
                raise ValueError(f"ranks must be a non-empty list of rank numbers, got {ranks!r}")
            for r in ranks:
                if isinstance(r, bool) or not isinstance(r, int):
                    raise ValueError(f"ranks must be whole numbers, got {r!r} ({type(r).__name__})")
                if not 0 <= r < self.size:
                    raise ValueError(f"rank {r} is not in this job (ranks 0..{self.size - 1})")
                if r in self.failed:
                    raise ValueError(f"rank {r} has died already")
                if r in self.drained:
                    raise ValueError(f"rank {r} is drained already")
                if not h[r].computes:
                    raise ValueError(f"rank {r} runs no tasks (a serve-only server)")
            if len(set(ranks)) != len(ranks):
                raise ValueError(f"ranks names a rank twice: {list(ranks)}")
            chosen = sorted(ranks)
        else:
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"count must be a whole number >= 1, got {count!r}")
            if count >= len(slaves):
                raise ValueError(f"count {count} must be less than the {len(slaves)} slaves still running tasks "
                                 f"(at least one stays)")
            chosen = sorted(slaves[-count:])
        if not set(computing) - set(chosen):
            raise ValueError(f"unacked {chosen} would leave no rank running tasks")
        return chosen

    @property
    def is_master(self) -> bool:
        """Whether this rank is the master now."""
        return isinstance(self.server, Master)

    @property
    def is_region(self) -> bool:
        """Whether this rank is a region-master now."""
        return isinstance(self.server, Region)


    # -- roles ----------------------------------------------------------------------------
    def lay_out(self, hierarchy: Hierarchy) -> None:
        """Build this rank's roles for ``hierarchy`` (a new plan), keeping the worker's queue and hand."""
        self.hierarchy = hierarchy
        self.info = info = hierarchy[self.rank]
        c = self.config
        weights = {r: hierarchy[r].weight for r in info.children}
        if info.computes and (info.children or info.role is Role.MASTER):
            weights[self.rank] = 1  # its own loop claims from its own leaf board
        busy = self.server.busy_below if self.server is not None else 0.0  # (a running total across plans)
        self.server = None
        if info.role is Role.MASTER:
            if self.ledger is None:
                raise ValueError(f"rank {self.rank} (the master) needs the ledger")
            self.server = Master(hierarchy, self.rank, weights, self.clock, self.boards, self.sizing, self.ledger,
                                 c.task_retries if c.on_task_error == "retry" else 0, self.ft, self.epoch)
        elif info.children:
            assert info.parent is not None
            self.server = Region(hierarchy, self.rank, weights, self.clock, self.boards, self.sizing, info.parent,
                                 c.batch, c.batch_age, self.epoch, self.measured)
        if self.server is not None:
            self.server.quarantine = c.quarantine
            self.server.busy_below = busy
            if isinstance(self.server, Master) and self.ledger is not None:
                # Timeouts of earlier runs (without fault tolerance a hung task stops the job;
                # the next run counts on).
                self.server.count_timeouts(self.ledger.timeouts)
            self.leave_out(self.server)
        if not info.computes:
            if info.role is Role.DRAINED and self.worker is not None and info.parent is not None:
                # Drained: it claims nothing more, but what it still runs (it may not have left
                # yet) is reported to its parent in this plan, the master, which holds it as gone.
                self.worker.reparent(info.parent, self.boards.slots(LEAF), self.epoch)
            return
        parent = self.rank if self.server is not None else info.parent
        assert parent is not None
        slots = self.boards.slots(LEAF)
        if self.worker is None:
            self.worker = Worker(self.rank, parent, slots, c.report_every, c.report_age, self.clock, self.measured)
        self.worker.reparent(parent, slots, self.epoch)

    def leave_out(self, server: Server) -> None:
        """The drained ranks among ``server``'s children (see :func:`~nlevel.model.hierarchy.build`'s
        ``out``) claim nothing: they count as gone from the start (their last reports still come)."""
        h = self.hierarchy
        for r, child in server.children.items():
            if h[r].role is Role.DRAINED:
                server.child_left(child)

    @property
    def serves_remote(self) -> bool:
        """Whether other ranks take ids from this one, or old children must still be heard."""
        return bool(self.info.children) or bool(self.replanning.unacked)

    @property
    def done_serving(self) -> bool:
        """Whether the server side owes nobody anything more."""
        if self.replanning.unacked:
            return False
        d = self.server
        if d is None:
            return True
        if isinstance(d, Master):
            return self.final or self.job_over
        return d.finished

    @property
    def served(self) -> int:
        """Ranges children took from this rank's boards, all epochs."""
        return self.served_before + (self.server.served if self.server is not None else 0)

    @property
    def stopped(self) -> bool:
        """Whether this rank, as master, stopped the job early."""
        return isinstance(self.server, Master) and self.server.stopped

    # -- the server's and the worker's steps -----------------------------------------------
    def orphan(self, src: int, report: Report) -> list[Effect]:
        """Completions and returned ids ``src`` sent under an older epoch (or to a rank that serves
        nobody now): to the master, kept here until it says they are safe (see Delivery.relay)."""
        if not (report.done or report.returned or report.failed):
            return []
        if isinstance(self.server, Master):
            self.recovery.take_orphan(report)
            self.delivery.heard(src, report.seq)  # (safe, as any report, once the deputy has the commits)
            return self.serve()
        return self.delivery.relay(src, report, self.hierarchy.master)

    def worker_report(self, force: bool = False) -> list[Effect]:
        """The worker's batch of finished ids, if it is due (or ``force``)."""
        w = self.worker
        if w is None:
            return []
        now = self.clock()
        if not (force and (w.done or w.failed or w.tasks)) and not w.report_due(now):
            return []
        return self.delivery.report_up(w.report(now), w.parent)

    # -- the server's step -------------------------------------------------------------------
    def serve(self, full: bool = False) -> list[Effect]:
        """A server's work now: attribute claims (``full``: every published slot), refill, publish, forward, finish."""
        d = self.server
        if d is None:
            return []
        now = self.clock()
        d.scan(now, full)
        self.timeline.note(d.served, self.wall())
        outs: list[Effect] = []
        if isinstance(d, Region):
            if d.everyone_left() and not d.gone:
                return self.delivery.report_up(d.leave(now), d.parent)
            d.refill(now)
        if not self.final and not self.loading:  # (a new master publishes once it knows what is committed)
            d.publish(now)
        if isinstance(d, Region):
            if d.flush_due(now):
                outs += self.delivery.report_up(d.flush(), d.parent)
            if d.exhausted and not self.final:
                self.final = True
                d.close_boards(FINAL, now)
        elif isinstance(d, Master) and (d.exhausted or d.abandoned) and not self.final_asked and not self.loading:
            self.final_asked = True  # the last checkpoint first; FINAL when it is on disk
            outs += self.final_checkpoint()
        return outs

    def final_checkpoint(self) -> list[Effect]:
        """The master: everything is committed. Under fault tolerance the deputy gets the last commits
        before the checkpoint is written and anyone is released, so a master dying now leaves a
        complete ledger."""
        return (self.recovery.mirror_out(force=True) if self.ft else []) + [WriteCheckpoint(final=True)]

    def finish_job(self) -> list[Effect]:
        """The master's final checkpoint is written: release everyone (FINAL on the boards)."""
        d = self.server
        if isinstance(d, Master) and not self.final:
            self.final = True
            d.close_boards(FINAL, self.clock())
            w = self.worker
            if w is not None and w.parent == self.rank and w.hand is None and w.state is State.WAIT:
                # Its own last report ended the job (the final checkpoint written while it
                # asked): it reads the end now; nobody else tells it.
                w.refill(self.boards(self.rank, LEAF), self.clock())
        return []

    def retire_server(self) -> None:
        """This rank stops serving (plan change, or every child died): count what it served."""
        d = self.server
        if d is not None:
            self.served_before += d.served
            self.timeline.restart()

    def worker_state(self) -> State | None:
        """The worker's state (None: this rank does not compute)."""
        return self.worker.state if self.worker is not None else None

    def own_stats(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """This rank's (row, mergeable statistics) for the run report."""
        info = self.info
        w, d = self.worker, self.server
        row: dict[str, Any] = {
            "rank": self.rank,
            "role": info.role.value,
            "level": info.level,
            "tasks": w.task_times.n if w is not None else 0,
            "busy_s": w.task_times.total if w is not None else 0.0,
            "served": self.served,
        }
        requests: dict[int, Any] = {}
        if w is not None and w.claims is not None and w.claims.total.n and w.parent != self.rank:
            requests[info.level] = w.claims  # its claims on its parent's board, one level up
        elif w is not None and w.claims is not None and w.claims.total.n and info.level == 0:
            requests[info.level + 1] = w.claims  # the master's own loop claims from its own board
        if isinstance(d, Region) and d.requests.total.n:
            requests.setdefault(info.level, d.requests)
        merged: dict[str, Any] = {
            "tasks": w.task_times if w is not None else None,
            "requests": requests,
            "unexpected": d.unexpected if d is not None else 0,
            "failures": [f.to_dict() for f in self.recovery.failures],
            "timeline": {self.rank: (self.timeline.width, dict(self.timeline.bins))} if self.timeline.bins else {},
            **self.facts,
        }
        return row, merged

    def report_dict(self) -> dict[str, Any]:
        """A few facts for the run report's per-rank row."""
        return {"epoch": self.epoch, "served": self.served}


def _ride(outs: list[Effect], ft: bool) -> list[Effect]:
    """A last report and the Ending right behind it, to the same parent, as one message.

    At the end of a job every leaf sends both at once: a region-master of 128 leaves handled
    256 messages there instead of 128 (in the simulator, the last 4 ms of a 2-5 ms job). Not
    under fault tolerance, where a parent may set a report aside until a failure is settled.
    """
    if ft or len(outs) < 2:
        return outs
    report, ending = outs[-2], outs[-1]
    if (isinstance(report, Send) and isinstance(ending, Send) and report.dest == ending.dest
            and isinstance(report.msg, Report) and isinstance(ending.msg, Ending) and report.msg.ending is None):
        return outs[:-2] + [Send(report.dest, replace(report.msg, ending=ending.msg))]
    return outs
