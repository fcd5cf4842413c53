"""One rank's roles wired together, without I/O: the dispatcher (if it serves) and the worker (if it computes).

A message to this rank itself is delivered by a function call; everything else comes
back as :class:`~nlevel.roles.worker.Out` for the caller to send. The MPI runtime
(:mod:`nlevel.runtime.node`), the tests and the simulator all drive ranks through this class,
so they run the same logic. Pure Python.

Changing plans (epochs). Under ``--levels auto`` the master switches the running job
to another plan: it sends :class:`~nlevel.roles.messages.Regroup` to every rank and keeps
every id granted before as *carried* until it is committed or given back. A rank that
regroups keeps its worker's queue and task in hand, hands its region's queue and
buffered completions straight to the master, builds its roles for the new hierarchy,
and tells its old parent (:class:`~nlevel.roles.messages.Ack`) that nothing more will come
under the old plan. Reports that still arrive under an older epoch are forwarded to the
master as orphans; stale grants are given back. A rank keeps listening (``draining``)
until every old child has acknowledged.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any, Callable

from ..config import Config
from ..model.hierarchy import Hierarchy, Role, build
from ..model.plan import Plan
from ..ranges import RangeSet
from .autoplan import AutoPlanner
from .dispatch import Master, Region
from .ledger import Ledger
from .messages import Ack, Drain, Failed, Grant, Holding, Kill, Message, Mirror, Regroup, Report, Result
from .recovery import Reconciliation
from . import repair
from .worker import WAIT, Out, Worker

__all__ = ["Station", "TIMELINE_BIN"]

#: Seconds per bin of the servers' request timeline in the run report.
TIMELINE_BIN = 0.1


class Station:
    """The state machines of rank ``rank``.

    Args:
        hierarchy: The laid-out plan.
        rank: This rank.
        config: Settings (batching, chunk sizing; ``levels=auto`` adds a planner on rank 0).
        clock: Returns seconds.
        ledger: The completion record; required on rank 0.
        before_final: Rank 0: called once, before the first final grant goes anywhere
            (the runtime writes the last checkpoint there, before anyone is released).
        wall: Returns the wall-clock time (failure records).
        recover: Returns the ledger as the checkpoint has it, for a rank that must take
            over as master without a copy of the ledger (see :mod:`nlevel.roles.recovery`).
    """

    def __init__(
        self,
        hierarchy: Hierarchy,
        rank: int,
        config: Config,
        clock: Callable[[], float],
        ledger: Ledger | None = None,
        before_final: Callable[[], None] | None = None,
        wall: Callable[[], float] = time.time,
        recover: Callable[[], Ledger] | None = None,
    ) -> None:
        # Failures (see nlevel.roles.repair).
        self.wall = wall
        self.recover = recover  # the ledger as the checkpoint has it (a new master without a mirror)
        self.failed: frozenset[int] = frozenset()
        self.failures: list[dict[str, Any]] = []  # this rank's finished recoveries (for the report)
        self.recon: Reconciliation | None = None
        self.mirror: Ledger | None = None  # the deputy's copy of the master's ledger
        self.mirror_failures: list[dict[str, Any]] = []  # ... and of its failure records
        self._mirrored_failures = 0  # the master: failure records already copied
        self._mirror_to: int | None = None  # the master: where the copy goes (None: not sent yet)
        self._deferred: deque[tuple[int, Message]] = deque()
        self._master_heard = 0.0  # the deputy: when the master's last copy (or heartbeat) came
        self._mirror_sent = 0.0  # the master: when it last sent the deputy anything
        self._leases_checked = -math.inf  # when the leases below were last looked at
        # After a failure: every id this rank reported finished upward, per receiver. A Holding
        # includes those sent to live ranks, so ids on their way up between two survivors are
        # not taken for lost (those sent to a rank that died are lost with it).
        self.sent_done: dict[int, RangeSet] | None = None
        self.drain_requested = False  # this rank was asked to leave the job
        self.job_over = False  # a new master found every id committed: only releasing is left
        self.served_bins: dict[int, int] = {}  # wall time // TIMELINE_BIN -> grants sent (a server's timeline)
        self.drained: dict[int, float] = {}  # the master: ranks it asked to leave, and when
        self.rank = rank
        self.size = hierarchy.size
        self.config = config
        # Read once: Config.ft looks at the environment, and the hot paths ask on every message.
        self.ft = config.ft
        self.clock = clock
        self.before_final = before_final
        self.ledger = ledger
        self._final_sent = False
        self.epoch = 0
        self.plans: list[Plan] = [hierarchy.plan]
        self.draining: dict[int, set[int]] = {}  # epoch -> old children not yet acknowledged
        self._future: list[tuple[int, Message]] = []  # reports from a newer epoch than ours
        self.served_before = 0  # requests served by dispatchers of earlier epochs
        self.unexpected_before = 0
        self.planner: AutoPlanner | None = None
        if rank == 0 and config.auto:
            self.planner = AutoPlanner(self.size, config, hierarchy.plan)
        self.worker: Worker | None = None
        self._lay_out(hierarchy)

    def _lay_out(self, hierarchy: Hierarchy) -> None:
        """Build this rank's roles for ``hierarchy``, keeping the worker (queue, task in hand)."""
        self.hierarchy = hierarchy
        self.info = info = hierarchy[self.rank]
        plan = hierarchy.plan
        weights = {c: hierarchy[c].weight for c in info.children}
        if info.computes and (info.children or info.role is Role.MASTER):
            weights[self.rank] = 1  # its own loop is one more child, served in-process
        self.dispatcher: Master | Region | None = None
        if info.role is Role.MASTER:
            if self.ledger is None:
                raise ValueError("rank 0 (the master) needs the ledger")
            c = self.config
            self.dispatcher = Master(info, weights, self.clock, self.ledger,
                                     c.task_retries if c.on_task_error == "retry" else 0, self.ft)
        elif info.children:
            self.dispatcher = Region(info, weights, self.clock, plan.prefetch, self.config.batch, self.config.batch_age)
        parent = self.rank if self.dispatcher is not None else info.parent
        if not info.computes:
            return
        assert parent is not None
        c = self.config
        if self.worker is None:
            self.worker = Worker(parent, plan.chunk, c.report_every, c.report_age, c.chunk_target, c.max_chunk)
        else:
            self.worker.parent = parent
            self.worker.chunk = plan.chunk
            self.worker.asked = False  # an old want will not be answered: ask the new parent

    @property
    def serves_remote(self) -> bool:
        """Whether other ranks ask this one for ids, or old children must still be heard."""
        return bool(self.info.children) or bool(self.draining)

    @property
    def local_parent(self) -> bool:
        """Whether this rank's worker is served by this rank's own dispatcher."""
        return self.worker is not None and self.worker.parent == self.rank

    @property
    def done_serving(self) -> bool:
        """Whether the server side owes nobody anything more (every child released, parent settled, old children heard)."""
        if self.draining:
            return False
        d = self.dispatcher
        if d is None:
            return True
        return d.finished and (not isinstance(d, Region) or d.released)

    @property
    def served(self) -> int:
        """Requests served by this rank's dispatchers, all epochs."""
        return self.served_before + (self.dispatcher.served if self.dispatcher is not None else 0)

    # -- events -----------------------------------------------------------------------
    def deliver(self, src: int, msg: Message) -> list[Out]:
        """Handle a message from another rank; return what to send."""
        if isinstance(msg, Failed):
            return self.fail(msg.ranks, msg.how)
        if isinstance(msg, Mirror):
            return repair.on_mirror(self, msg)  # (even from a master that died since: its commits stand)
        if src in self.failed:
            return []  # sent before it died; what it held is already back in a queue
        if self.ft and isinstance(msg, (Report, Holding)) and repair.defer(self, src, msg):
            return []
        if isinstance(msg, Holding):
            return repair.on_holding(self, src, msg)
        if isinstance(msg, Kill):
            return [Out(msg.rank, msg)]  # the runtime kills it (this rank is on the victim's host)
        if isinstance(msg, Drain):
            self.drain_requested = True
            return []
        outs = self._deliver(src, msg)
        if self.ft:
            outs += repair.mirror_out(self)
        return outs

    def fail(self, ranks: tuple[int, ...], how: str = "ulfm") -> list[Out]:
        """``ranks`` are dead: repair this rank's roles (see :mod:`nlevel.roles.repair`); return what to send."""
        return repair.fail(self, ranks, how)

    def _deliver(self, src: int, msg: Message) -> list[Out]:
        if isinstance(msg, Regroup):
            return self.regroup(msg)
        if isinstance(msg, Ack):
            if msg.epoch > self.epoch:
                self._future.append((src, msg))  # a child switched before we did: count it after we switch
                return []
            waiting = self.draining.get(msg.epoch - 1)
            if waiting is not None:
                waiting.discard(src)
                if not waiting:
                    del self.draining[msg.epoch - 1]
            return []
        if isinstance(msg, Report):
            if msg.orphan or msg.epoch < self.epoch:
                return self._orphan(msg)
            if msg.epoch > self.epoch:
                self._future.append((src, msg))  # its sender regrouped before we did
                return []
            if self.planner is not None:
                self.planner.on_report(msg, self.clock())
            assert self.dispatcher is not None, f"rank {self.rank} got a report but serves nobody"
            return self.route(self.dispatcher.on_report(src, msg))
        assert isinstance(msg, Grant)
        if msg.epoch < self.epoch:
            # Answers a want of an older plan: the ids are carried at the master; give them back.
            return self._orphan(Report(returned=msg.ids, epoch=self.epoch)) if msg.ids else []
        if isinstance(self.dispatcher, Region):
            return self.route(self.dispatcher.on_grant(msg))
        assert self.worker is not None
        if self.worker.left:
            return self.on_grant_after_leaving(msg)
        self.worker.on_grant(msg, self.clock())
        return []

    def _orphan(self, msg: Report) -> list[Out]:
        """Completions and returned ids from an older epoch: they go to the master."""
        if not (msg.done or msg.returned or msg.failed):
            return []
        if isinstance(self.dispatcher, Master):
            return self.route(self.dispatcher.take_orphan(msg.done, msg.results, msg.returned, msg.failed))
        return [Out(self.hierarchy.master, Report(msg.done, msg.results, 0, msg.returned, epoch=self.epoch,
                                                  orphan=True, failed=msg.failed))]

    def tick(self) -> list[Out]:
        """Time-driven work: batch ages, and on rank 0 under auto, the planner."""
        outs: list[Out] = []
        if self.planner is not None and isinstance(self.dispatcher, Master) and not self._final_sent and not self.failed:
            ledger = self.dispatcher.ledger
            plan = self.planner.tick(self.clock(), ledger.n_committed / max(1, ledger.total))
            if plan is not None and plan.min_size() <= self.size:
                outs += self.switch(plan)
        if self.dispatcher is not None:
            outs += self.route(self.dispatcher.tick())
        outs += repair.lease_kills(self)
        if self.ft:
            outs += repair.mirror_out(self) + repair.watch_master(self)
        return outs

    def stop(self) -> list[Out]:
        """The master: stop granting (SIGUSR1); running tasks finish, then everyone is released."""
        if not isinstance(self.dispatcher, Master):
            return []
        return self.route(self.dispatcher.stop())

    def drain(self, ranks: list[int] | None = None, count: int | None = None) -> tuple[list[int], list[Out]]:
        """The master: choose ranks to leave the job (``ranks``, or the ``count`` highest slaves); tell them.

        Raises:
            ValueError: naming the rank or count that cannot be drained, and why.
        """
        h = self.hierarchy
        computing = [r for r in range(self.size) if h[r].computes and r not in self.drained]
        if ranks is not None:
            for r in ranks:
                if not 0 <= r < self.size:
                    raise ValueError(f"rank {r} is not in this job (ranks 0..{self.size - 1})")
                if r in self.failed:
                    raise ValueError(f"rank {r} has died already")
                if r in self.drained or not h[r].computes:
                    raise ValueError(f"rank {r} is not running tasks (drained already, or a serve-only server)")
            chosen = sorted(set(ranks))
        else:
            assert count is not None
            slaves = [r for r in computing if h[r].role.value == "slave"]
            if count > len(slaves):
                raise ValueError(f"count {count} is more than the {len(slaves)} slaves still running tasks")
            chosen = sorted(slaves[-count:]) if count else []
        if len(set(computing) - set(chosen)) < 1:
            raise ValueError(f"draining {chosen} would leave no rank running tasks")
        now = self.wall()
        outs: list[Out] = []
        for r in chosen:
            self.drained[r] = now
            if r == self.rank:
                self.drain_requested = True
            else:
                outs.append(Out(r, Drain()))
        return chosen, outs

    @property
    def stopped(self) -> bool:
        """Whether this rank, as master, stopped the job early."""
        return isinstance(self.dispatcher, Master) and self.dispatcher.stopped

    # -- changing plans ---------------------------------------------------------------------
    def switch(self, plan: Plan) -> list[Out]:
        """Rank 0: move the whole job to ``plan``; return the Regroup messages to send."""
        old = self.dispatcher
        assert isinstance(old, Master) and self.ledger is not None
        if self._final_sent:
            return []  # the job is over: nothing to move
        self.epoch += 1
        carried = old.carried.copy()
        for child in old.children.values():
            carried.add_ranges(child.held.ranges())
        self.draining[self.epoch - 1] = {r for r in old.children if r != self.rank}
        queue = old.queue
        self.served_before += old.served
        self.unexpected_before += old.unexpected
        self.plans.append(plan)
        self._lay_out(build(self.size, plan))
        new = self.dispatcher
        assert isinstance(new, Master)
        new.queue = queue
        new.carried = carried
        if not self.draining[self.epoch - 1]:
            del self.draining[self.epoch - 1]
        regroup = Regroup(self.epoch, plan.to_dict())
        return [Out(r, regroup) for r in range(1, self.size)]

    def regroup(self, msg: Regroup) -> list[Out]:
        """Any rank but 0: switch to the master's new plan; return what to send."""
        if msg.epoch <= self.epoch:
            return []
        outs: list[Out] = []
        old_parent = self.info.parent
        d = self.dispatcher
        if isinstance(d, Region):
            returned = d.queue.copy()
            returned.add_ranges(d.up_returned.ranges())
            if d.up_done or returned:
                outs.append(Out(self.hierarchy.master, Report(d.up_done.ranges(), tuple(d.up_results), 0, returned.ranges(),
                                          epoch=msg.epoch, orphan=True)))
            waiting = {r for r, c in d.children.items() if r != self.rank and not (c.left and not c.held)}
            if waiting:
                self.draining[self.epoch] = waiting
            self.served_before += d.served
            self.unexpected_before += d.unexpected
        w = self.worker
        if w is not None and w.done:
            report = w._drain_report(0)
            outs.append(Out(self.hierarchy.master, Report(report.done, report.results, epoch=msg.epoch, orphan=True, failed=report.failed)))
        self.epoch = msg.epoch
        self.plans.append(Plan.from_dict(msg.plan))
        self._lay_out(build(self.size, self.plans[-1]))
        if old_parent is not None:
            outs.append(Out(old_parent, Ack(msg.epoch)))
        future, self._future = self._future, []
        for src, m in future:
            outs += self.deliver(src, m)
        return outs

    # -- the user's loop --------------------------------------------------------------
    def finish(self, result: Result | None = None) -> None:
        """Record the current task (if any) as finished, with an optional result."""
        assert self.worker is not None
        self.worker.finish(self.clock(), result)

    def take(self) -> tuple[int, list[Out]]:
        """Return ``(id | WAIT | END, what to send)`` for the user's next task."""
        w = self.worker
        assert w is not None
        sends: list[Out] = []
        while True:
            tid, outs = w.next(self.clock())
            sends += self.route([self._stamp(o) for o in outs])
            if tid == WAIT and (w.queue or w.final):
                continue  # the grant came back in-process while routing
            if self.ft:
                sends += repair.mirror_out(self) + repair.watch_master(self)
            return tid, sends

    def fail_task(self, info: str) -> None:
        """The current task raised (``info``: error, rank, host): the master retries or records it."""
        assert self.worker is not None
        self.worker.fail(self.clock(), info)

    def _stamp(self, out: Out) -> Out:
        """Put the epoch and the planner's measurements on a worker's report."""
        msg = out.msg
        if not isinstance(msg, Report):
            return out
        w = self.worker
        assert w is not None
        task_mean = w.task_times.mean if (msg.want and w.task_times.n) else 0.0
        msg_time = w.requests.message.mean if (msg.want and w.requests.message.n) else 0.0
        if msg.epoch == self.epoch and not msg.orphan and msg.task_mean == task_mean and msg.msg_time == msg_time:
            return out  # already stamped (the worker measures its requests): no copy
        return Out(out.dest, Report(msg.done, msg.results, msg.want, msg.returned, msg.leaving,
                                    self.epoch, False, task_mean, msg_time, msg.failed, msg.task_max))

    def leave(self, done: bool = False, result: Result | None = None) -> list[Out]:
        """The user left the loop early: give back unstarted ids; return what to send.

        The current task counts as finished only if ``done`` (the user completed it
        explicitly); otherwise it is given back too, to run elsewhere.
        """
        w = self.worker
        if w is None or w.final:
            return []
        if done:
            w.finish(self.clock(), result)
        elif w.current is not None:
            w.queue.add(w.current, w.current + 1)
            w.current = None
        return self.route([self._stamp(o) for o in w.leave(self.clock())])

    def on_grant_after_leaving(self, grant: Grant) -> list[Out]:
        """A grant that crossed this rank's leaving report: give its ids straight back."""
        w = self.worker
        assert w is not None
        if grant.epoch < self.epoch:
            return self._orphan(Report(returned=grant.ids, epoch=self.epoch)) if grant.ids else []
        w.on_grant(grant, self.clock())
        return self.route([self._stamp(o) for o in w.leave(self.clock(), again=True)]) if grant.ids else []

    # -- routing ----------------------------------------------------------------------
    def route(self, outs: list[Out]) -> list[Out]:
        """Deliver messages addressed to this rank in-process; return the rest (epoch-stamped)."""
        remote: list[Out] = []
        for out in outs:
            msg = out.msg
            if isinstance(msg, Grant):
                b = int(self.wall() / TIMELINE_BIN)
                self.served_bins[b] = self.served_bins.get(b, 0) + 1
                if msg.epoch != self.epoch:
                    msg = Grant(msg.ids, msg.final, msg.residence, msg.dispose, self.epoch)
                if (
                    msg.final
                    and not self._final_sent
                    and isinstance(self.dispatcher, Master)
                    and self.dispatcher.exhausted  # the job's end, not a leaving child's answer
                ):
                    self._final_sent = True
                    if self.before_final is not None:
                        self.before_final()
                    if self.ft:
                        # Everything is committed: the deputy gets the last commits before anyone
                        # is released, so a master dying now leaves a complete ledger behind.
                        remote += repair.mirror_out(self, force=True)
            elif isinstance(msg, Report) and msg.epoch != self.epoch and not msg.orphan:
                msg = Report(msg.done, msg.results, msg.want, msg.returned, msg.leaving, self.epoch,
                             False, msg.task_mean, msg.msg_time, msg.failed, msg.task_max)
            if out.dest != self.rank:
                if self.sent_done is not None and isinstance(msg, Report) and msg.done:
                    self.sent_done.setdefault(out.dest, RangeSet()).add_ranges(msg.done)
                remote.append(out if msg is out.msg else Out(out.dest, msg))
            elif isinstance(msg, Report):
                assert self.dispatcher is not None
                remote += self.route(self.dispatcher.on_report(self.rank, msg))
            else:
                assert self.worker is not None and isinstance(msg, Grant)
                self.worker.on_grant(msg, self.clock())
        return remote

