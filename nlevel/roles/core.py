"""The state and the plumbing every part of a :class:`~nlevel.roles.station.Station` shares. Pure Python.

One rank's roles: a server (:class:`~nlevel.roles.server.Master` or
:class:`~nlevel.roles.server.Region`) if it serves, a :class:`~nlevel.roles.worker.Worker`
if it computes. This module lays them out for a hierarchy and routes what they say:
a report to this rank's own server is delivered in-process, everything else becomes a
:class:`~nlevel.roles.events.Send`. Failure handling (:mod:`nlevel.roles.failures`) and
plan changes (:mod:`nlevel.roles.replan`) build on it; :mod:`nlevel.roles.station`
puts the single entry point on top.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Final

from ..config import Config
from ..model.hierarchy import Hierarchy, Role
from ..model.plan import Plan
from ..ranges import Ranges, RangeSet, Tally
from .autoplan import AutoPlanner
from .board import FINAL
from .events import Effect, Send, WriteCheckpoint
from .ledger import Ledger
from .messages import FailureRecord, Message, Report, Result, Safe
from .recovery import Reconciliation
from .master import Master
from .region import Region
from .server import LEAF, Boards, Server, Sizing
from .worker import State, Worker

__all__ = ["StationCore", "TIMELINE_BIN", "TIMELINE_MAX"]

#: Seconds per bin of the servers' timeline in the run report.
TIMELINE_BIN: Final = 0.1
#: Bins a server keeps at most: past it, its bins double in width (a week's job keeps 2,048, not six million).
TIMELINE_MAX: Final = 2048


class StationCore:
    """A rank's roles and what they share; see :class:`~nlevel.roles.station.Station` for the entry point.

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
    """

    def __init__(self, hierarchy: Hierarchy, rank: int, config: Config, clock: Callable[[], float], boards: Boards,
                 total: int, ledger: Ledger | None = None, width: int = 1,
                 wall: Callable[[], float] = time.time, hosts: tuple[str, ...] = (),
                 setup_failed: frozenset[int] = frozenset(), facts: dict[str, Any] | None = None) -> None:
        self.rank = rank
        self.facts: dict[str, Any] = dict(facts or {})  # where this rank runs ({"hosts": ...}), for the report
        self.total = total
        self.width = width
        self.size = hierarchy.size
        self.config = config
        self.ft = config.ft  # (read once: Config.ft looks at the environment)
        self.clock = clock
        self.wall = wall
        self.boards = boards
        self.ledger = ledger
        self.sizing = Sizing(config.chunk, config.chunk_target, config.max_chunk, hierarchy.plan.prefetch,
                             max(0.01, 4 * config.server_period), ids_per_proc=total / max(1, hierarchy.size))
        self.epoch = 0
        self.plans: list[Plan] = [hierarchy.plan]
        self.unacked: dict[int, set[int]] = {}  # epoch -> old children not yet acknowledged
        self.future: list[tuple[int, Message]] = []  # messages from a newer epoch than ours
        self.served_before = 0  # ranges taken under earlier servers of this rank
        self.final_asked = False  # the master asked for the final checkpoint (the job is done)
        self.final = False  # ... and raised FINAL on its boards
        self.drain_requested = False
        self.drained: dict[int, float] = {}  # the master: ranks it asked to leave, and when
        self.served_bins: dict[int, int] = {}  # wall time // timeline_bin -> ranges taken here
        self.timeline_bin = TIMELINE_BIN  # seconds per bin (doubles as the job goes on, see _timeline)
        self._served_seen = 0  # the server's count of ranges taken, as the timeline last saw it
        self.hosts = hosts
        # Failures (see nlevel.roles.failures).
        self.failed: frozenset[int] = frozenset(setup_failed)
        self.failures: list[FailureRecord] = []
        self.abandoned = False  # this rank gave itself up (its task hung, no fault tolerance)
        self.timeout_notes: list[tuple[int, tuple[tuple[int, int], ...]]] = []  # (rank, ids) timed out, for a successor
        self.stop_reason = ""  # why the master stopped the job early: "SIGUSR1", "task timeout", "checkpoint", "lock"
        # Errors in the user's program (see roles.events.UserError): this rank's own, told again to
        # each new master; and the master's record of every rank's (rank -> the error), first one first.
        self.erred = ""
        self.user_errors: dict[int, str] = {}
        self.master_heard = clock()  # a watcher: when the master was last heard (it heartbeats)
        self.watching: int | None = None  # the master this rank watches now
        self.watched_at = 0.0  # when this rank last looked at the master's silence
        self.looked_at = -1e300  # when it last had the runtime look for processes that exited
        self.heartbeat_sent = clock()  # (its parent heard it at the start: the first beat is one period on)
        self.overran_tasks: set[int] = set()  # this rank's own tasks past --task-timeout, told once
        self.own_running = 0.0  # seconds its user loop has spent in the task it runs now (see Tick)
        # The end (see nlevel.roles.ending).
        self.endings: dict[int, Any] = {}  # child -> its Ending
        self.end_key: tuple[Any, ...] | None = None  # what this rank's last Ending was made of
        self.released: Any = None  # the master's Release (this rank's loop may stop)
        self.pending_release: Any = None  # the deputy: the master is releasing everyone
        self.finished_release = False  # this rank released the job for a master that died while releasing it
        self.held_release: list[Any] = []  # the master: releases sent once its own end is done (see release)
        self.recon: Reconciliation | None = None
        self.mirror: Ledger | None = None
        self.mirror_failures: list[FailureRecord] = []
        self.mirror_deaths = Tally()  # the deputy: the master's death counts per id
        self.mirror_hand: Ranges = ()  # the deputy: what the master's own loop held at the last copy
        self.timed_out_hand = RangeSet()  # the deputy: the master's own task past its limit (no fault tolerance)
        self.hand_sent: Ranges = ()  # the master: its own loop's holding as last copied
        # Ids at or above this mark were never handed out: the master keeps it ahead of what it
        # publishes and copies it to the deputy, which as the next master hands them out at once.
        self.mark = 0  # the master: its mark, copied to the deputy with every Mirror
        self.mirror_mark = -1  # the deputy: the master's mark (-1: not known)
        self.free = RangeSet()  # a new master: the ids above its predecessor's mark, queued on its next tick
        self.mirrored_failures = 0
        self.mirror_to: int | None = None
        self.deferred: deque[tuple[int, Message]] = deque()
        self.mirror_sent = 0.0
        self.leases_checked = -1e300
        self.killing: dict[int, tuple[float, str]] = {}  # ranks this one had killed: (since when, why), until dead
        self.given_up: set[int] = set()  # ranks treated as dead although their processes may live (GiveUp)
        self.kills_checked = 0.0  # when `killing` was last looked at
        # Completions sent to each parent (fault tolerance): a survivor's answer to a reconciler
        # counts them as held while they may be in flight; a parent that passed them to a rank
        # that died reports them lost (``lost_via``). Tracked from the start: a rank that learns
        # of a death late must still know what it passed to the dead. Completions sent to a rank
        # that died are also reported again, with their results, to the new parent.
        self.sent_done: dict[int, RangeSet] | None = {} if self.ft else None
        self.lost_via: dict[int, RangeSet] = {}  # completions passed to a rank that died, by that rank
        self.lost_seen: set[tuple[int, int]] = set()  # a reconciler: (survivor, dead) losses requeued already
        # Reports with completions sent to each parent and not yet said safe (Safe), with their
        # results: sent again to a new parent if that one dies before passing them on. Dropped once
        # safe, so a region-master holds seconds of its region's results, not the whole job's.
        self.unsafe: dict[int, deque[tuple[int, Ranges, tuple[tuple[int, Result], ...]]]] = {}
        self.up_seq: dict[int, int] = {}  # the last seq sent to each parent
        # A parent: the last seq heard from each child; what of it is safe; what it has said safe.
        self.heard_seq: dict[int, int] = {}
        self.safe_seq: dict[int, int] = {}
        self.said_safe: dict[int, int] = {}
        self.flush_covers: deque[tuple[int, dict[int, int]]] = deque()  # a region: its seq up -> children's seqs
        self.covered: dict[int, int] = {}  # the master: children's seqs its last copy to the deputy covered
        self.safe_told = clock()
        self.job_over = False
        self.loading = False  # a new master waits for its ledger from the checkpoint file
        self.planner: AutoPlanner | None = None
        if rank == 0 and config.auto:
            self.planner = AutoPlanner(self.size, config, hierarchy.plan, total, max(1, len(hierarchy.node_sizes)))
        self.worker: Worker | None = None
        self.server: Server | None = None
        self.lay_out(hierarchy)
        if setup_failed and isinstance(self.server, Master):
            now = wall()
            for r in sorted(setup_failed):
                self.failures.append(FailureRecord(r, "(set-up)", -1, "died while the farm was set up", rank, now, 0)
                                     .closed(0, (), now))

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
                                 c.batch, c.batch_age, self.epoch)
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
            self.worker = Worker(self.rank, parent, slots, c.report_every, c.report_age, self.clock)
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
        return bool(self.info.children) or bool(self.unacked)

    @property
    def done_serving(self) -> bool:
        """Whether the server side owes nobody anything more."""
        if self.unacked:
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

    # -- routing --------------------------------------------------------------------------------
    def report_up(self, report: Report, dest: int) -> list[Effect]:
        """Send ``report`` to ``dest`` (this rank's own server: delivered in-process), stamped with the epoch."""
        if report.epoch != self.epoch and not report.orphan:
            from dataclasses import replace

            report = replace(report, epoch=self.epoch)
        if dest == self.rank and self.server is not None:
            self.server.on_report(self.rank, report, self.clock())
            return self.serve()
        if self.sent_done is not None and report.done:
            from dataclasses import replace

            seq = self.up_seq[dest] = self.up_seq.get(dest, 0) + 1
            report = replace(report, seq=seq)
            self.sent_done.setdefault(dest, RangeSet()).add_ranges(report.done)
            self.unsafe.setdefault(dest, deque()).append((seq, report.done, report.results))
            if isinstance(self.server, Region) and dest == self.server.parent:
                # (what its children reported so far rides up in this or an earlier report: once this
                # one is safe, so are theirs)
                self.flush_covers.append((seq, dict(self.heard_seq)))
        return [Send(dest, report)]

    def on_safe(self, src: int, seq: int) -> list[Effect]:
        """Parent ``src`` says this rank's reports to it up to ``seq`` are safe: forget them (a region
        passes the news down to the children whose reports rode up in them)."""
        q = self.unsafe.get(src)
        sent = (self.sent_done or {}).get(src)
        while q and q[0][0] <= seq:
            _, done, _ = q.popleft()
            if sent is not None:
                sent.remove_ranges(done)
        d = self.server
        if isinstance(d, Region) and src == d.parent:
            covers = self.flush_covers
            while covers and covers[0][0] <= seq:
                for child, s in covers.popleft()[1].items():
                    if s > self.safe_seq.get(child, 0):
                        self.safe_seq[child] = s
        return []

    def mark_safe(self) -> None:
        """The master: every completion heard so far is committed where its death cannot lose it
        (its deputy has the copy, or it has none to make)."""
        self.safe_seq.update(self.heard_seq)

    def tell_safe(self) -> list[Effect]:
        """At most every beat: tell each child how far its reports are safe."""
        now = self.clock()
        if not self.safe_seq or now - self.safe_told < self.config.lease / 5:
            return []
        self.safe_told = now
        outs: list[Effect] = []
        for child, s in self.safe_seq.items():
            if s > self.said_safe.get(child, 0) and child not in self.failed and child != self.rank:
                self.said_safe[child] = s
                outs.append(Send(child, Safe(s)))
        return outs

    def orphan(self, report: Report) -> list[Effect]:
        """Completions and returned ids from an older epoch (or a stray sender): to the master."""
        if not (report.done or report.returned or report.failed):
            return []
        if isinstance(self.server, Master):
            self.server.take_orphan(report, self.clock())
            return self.serve()
        from dataclasses import replace

        return [Send(self.hierarchy.master, replace(report, epoch=self.epoch, orphan=True))]

    def worker_report(self, force: bool = False) -> list[Effect]:
        """The worker's batch of finished ids, if it is due (or ``force``)."""
        w = self.worker
        if w is None:
            return []
        now = self.clock()
        if not (force and (w.done or w.failed or w.tasks)) and not w.report_due(now):
            return []
        return self.report_up(w.report(now), w.parent)

    # -- the server's step -------------------------------------------------------------------
    def serve(self, full: bool = False) -> list[Effect]:
        """A server's work now: attribute claims (``full``: every published slot), refill, publish, forward, finish."""
        d = self.server
        if d is None:
            return []
        now = self.clock()
        d.scan(now, full)
        self._timeline(d)
        outs: list[Effect] = []
        if isinstance(d, Region):
            if d.everyone_left() and not d.gone:
                return self.report_up(d.leave(now), d.parent)
            d.refill(now)
        if not self.final:
            d.publish(now)
        if isinstance(d, Region):
            if d.flush_due(now):
                outs += self.report_up(d.flush(), d.parent)
            if d.exhausted and not self.final:
                self.final = True
                d.close_boards(FINAL, now)
        elif isinstance(d, Master) and (d.exhausted or d.abandoned) and not self.final_asked and not self.loading:
            self.final_asked = True  # the last checkpoint first; FINAL when it is on disk
            outs += self.final_checkpoint()
        return outs

    def final_checkpoint(self) -> list[Effect]:
        """The master: what writing the last checkpoint takes (see the failure handling's, which copies
        the last commits to the deputy first)."""
        return [WriteCheckpoint(final=True)]

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

    def _timeline(self, d: Server) -> None:
        served = d.served
        last = self._served_seen
        if served > last:
            bins = self.served_bins
            b = int(self.wall() / self.timeline_bin)
            bins[b] = bins.get(b, 0) + served - last
            if len(bins) > TIMELINE_MAX:
                coarse: dict[int, int] = {}
                for k, n in bins.items():
                    coarse[k // 2] = coarse.get(k // 2, 0) + n
                self.served_bins, self.timeline_bin = coarse, 2 * self.timeline_bin
        self._served_seen = served

    def retire_server(self) -> None:
        """This rank stops serving (plan change, or every child died): count what it served."""
        d = self.server
        if d is not None:
            self.served_before += d.served
            self._served_seen = 0

    def worker_state(self) -> State | None:
        """The worker's state (None: this rank does not compute)."""
        return self.worker.state if self.worker is not None else None

    # -- implemented by the parts of a Station (nlevel.roles.station) ---------------------------
    @property
    def ended(self) -> bool:
        """Whether this rank's user loop is over (see :class:`~nlevel.roles.station.Station`)."""
        raise NotImplementedError

    def stop(self, reason: str = "SIGUSR1") -> list[Effect]:
        """The master stops the job early (see :class:`~nlevel.roles.station.Station`)."""
        raise NotImplementedError

    def user_error(self, rank: int, why: str, src: int | None = None) -> list[Effect]:
        """An error in the user's program on ``rank`` (see :class:`~nlevel.roles.station.Station`)."""
        raise NotImplementedError

    def note_timeout(self, rank: int, ids: tuple[tuple[int, int], ...]) -> list[Effect]:
        """Count a task time-out (see :mod:`nlevel.roles.watch`)."""
        raise NotImplementedError

    def release_for_dead_master(self) -> list[Effect]:
        """Finish a dead master's release (see :mod:`nlevel.roles.ending`)."""
        raise NotImplementedError

    def report_dict(self) -> dict[str, Any]:
        """A few facts for the run report's per-rank row."""
        return {"epoch": self.epoch, "served": self.served}
