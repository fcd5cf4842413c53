"""How a rank moves a running job to another plan (epochs): one sub-machine of a :class:`~nlevel.roles.station.Station`. Pure Python.

Under ``--levels auto`` the master switches the running job to another plan: it sends
:class:`~nlevel.roles.messages.Regroup` to every rank and keeps every id handed out before
as *carried* until it is committed or given back. Each board serves one epoch (its owner
raises the epoch in the board's HEAD when it starts serving a new one), so a claimer that
has not switched yet, or has switched before its new parent, learns it from its claim and
looks at its messages instead. A rank that regroups keeps its worker's queue and hand,
closes its boards (taking back what was published), hands its region's stock and buffered
completions straight to the master, builds its roles for the new hierarchy, and tells its
old parent (:class:`~nlevel.roles.messages.Ack`) that nothing more will come under the old
plan. Reports that still arrive under an older epoch go to the master as orphans. A rank
keeps listening (``unacked``) until every old child has acknowledged.

Ranks an operator drained stay out of every later plan: the Regroup names them (``out``),
and every rank lays the new plan out without them (no block to lead, nothing to compute,
a child of the master that counts it as gone), as it does after a death in that epoch.
"""

from __future__ import annotations

from ..model.hierarchy import build
from ..model.plan import Plan
from ..ranges import RangeSet
from .board import CLOSED
from .events import Effect, Send
from .host import Host
from .messages import Ack, Message, Regroup, Report
from .master import Master
from .region import Region

__all__ = ["Replanning"]


class Replanning:
    """Plan changes on one rank: the master's switch, everyone's regroup, old children's acknowledgements."""

    def __init__(self, st: Host) -> None:
        self.st = st
        self.unacked: dict[int, set[int]] = {}  # epoch -> old children not yet acknowledged
        self.future: list[tuple[int, Message]] = []  # messages from a newer epoch than ours

    def forget(self, dead: frozenset[int]) -> None:
        """``dead`` died: they will never acknowledge a regroup."""
        for epoch in list(self.unacked):
            self.unacked[epoch] -= dead
            if not self.unacked[epoch]:
                del self.unacked[epoch]

    def switch(self, plan: Plan) -> list[Effect]:
        """The master: move the whole job to ``plan``; return the Regroup messages to send."""
        st = self.st
        old = st.server
        assert isinstance(old, Master) and st.ledger is not None
        if st.final_asked:
            return []  # the job is over: nothing to move
        now = st.clock()
        old.close_boards(CLOSED, now)
        st.epoch += 1
        self.unacked[st.epoch - 1] = {r for r in old.children if r != st.rank}
        st.retire_server()
        st.plans.append(plan)
        out = (st.hierarchy.out | frozenset(st.drained)) - st.failed
        st.lay_out(build(st.size, plan, st.failed, out, st.hierarchy.node_sizes))
        new = st.server
        assert isinstance(new, Master)
        new.take_job(old)  # (whole: a field left behind was a retry count or a copy owed to the deputy)
        if not self.unacked[st.epoch - 1]:
            del self.unacked[st.epoch - 1]
        regroup = Regroup(st.epoch, plan, tuple(sorted(out)))
        return [Send(r, regroup) for r in range(st.size) if r != st.rank and r not in st.failed]

    def regroup(self, msg: Regroup) -> list[Effect]:
        """Any rank but the master: switch to the master's new plan; return the effects."""
        st = self.st
        if msg.epoch <= st.epoch:
            return []
        outs: list[Effect] = []
        old_parent = st.info.parent
        master = st.hierarchy.master
        d = st.server
        if isinstance(d, Region):
            d.close_boards(CLOSED, st.clock())
            returned = d.queue.copy()
            returned.add_ranges(d.up_returned.ranges())
            if d.up_done or returned or d.up_failed or d.up_tasks:
                outs.append(Send(master, Report(d.up_done.ranges(), tuple(d.up_results), returned.ranges(),
                                                tuple(d.up_failed), epoch=msg.epoch,
                                                orphan=True, tasks=d.up_tasks, busy=d.up_busy,
                                                task_max=d.task_max)))
            waiting = {r for r, c in d.children.items() if r != st.rank and not (c.left and not c.held)}
            if waiting:
                self.unacked[st.epoch] = waiting
            st.retire_server()
        w = st.worker
        if w is not None and (w.done or w.failed):
            report = w.report(st.clock())
            outs.append(Send(master, Report(report.done, report.results, (), report.failed, epoch=msg.epoch,
                                            orphan=True, tasks=report.tasks, busy=report.busy,
                                            task_max=report.task_max)))
        st.epoch = msg.epoch
        st.plans.append(msg.plan)
        if st.rank in msg.out:
            st.drain_requested = True  # (its Drain came first; this holds whatever the order)
        st.lay_out(build(st.size, msg.plan, st.failed, frozenset(msg.out), st.hierarchy.node_sizes))
        if old_parent is not None and old_parent not in st.failed:
            outs.append(Send(old_parent, Ack(msg.epoch)))
        future, self.future = self.future, []
        for src, m in future:
            outs += st.receive(src, m)
        return outs + st.serve()

    def ack(self, src: int, msg: Ack) -> list[Effect]:
        """An old child switched: stop waiting for it."""
        if msg.epoch > self.st.epoch:
            self.future.append((src, msg))  # a child switched before we did: count it after we switch
            return []
        waiting = self.unacked.get(msg.epoch - 1)
        if waiting is not None:
            waiting.discard(src)
            if not waiting:
                del self.unacked[msg.epoch - 1]
        return []

    def held_below(self) -> RangeSet:
        """Ids this rank's children hold (for a switch's carried set)."""
        out = RangeSet()
        if self.st.server is not None:
            for c in self.st.server.children.values():
                out.add_ranges(c.held.ranges())
        return out
