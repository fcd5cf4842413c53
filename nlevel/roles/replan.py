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
plan. Reports that still arrive under an older epoch go to the master as orphans. Completions
handed or passed to the master this way are kept (:class:`~nlevel.roles.delivery.Delivery`)
until it says they are safe, as any report up: should it die first, they go again to the new
one. A rank keeps listening (``unacked``) until every old child has acknowledged.

Ranks an operator drained stay out of every later plan: the Regroup names them (``out``),
and every rank lays the new plan out without them (no block to lead, nothing to compute,
a child of the master that counts it as gone), as it does after a death in that epoch.
"""

from __future__ import annotations

from typing import NamedTuple

from ..model.hierarchy import build
from ..model.plan import Plan
from ..ranges import RangeSet
from .board import CLOSED
from .delivery import Delivery
from .events import Effect, Send
from .host import Host
from .messages import Ack, Message, Regroup, Report
from .master import Master
from .region import Region

__all__ = ["Replanning"]


class _Acked(NamedTuple):
    """One switch this rank acknowledged: to whom, and what lays the plan before it out again
    (a plan, not its built hierarchy: a Hierarchy is a node per rank, kept per switch)."""

    parent: int
    plan: Plan
    out: frozenset[int]
    node_sizes: tuple[int, ...]


class Replanning:
    """Plan changes on one rank: the master's switch, everyone's regroup, old children's acknowledgements."""

    def __init__(self, st: Host, delivery: Delivery) -> None:
        self.st = st
        self.delivery = delivery
        self.unacked: dict[int, set[int]] = {}  # epoch -> old children not yet acknowledged
        self.future: list[tuple[int, Message]] = []  # messages from a newer epoch than ours
        # epoch -> this rank's Ack of that switch: should its old parent turn out dead, the rank
        # that took its place in the old plan waits for the Ack
        self.acked: dict[int, _Acked] = {}

    def forget(self, dead: frozenset[int]) -> None:
        """``dead`` died: they will never acknowledge a regroup."""
        for epoch in list(self.unacked):
            self.unacked[epoch] -= dead
            if not self.unacked[epoch]:
                del self.unacked[epoch]

    def switch(self, plan: Plan, epoch: int = 0, out_before: tuple[int, ...] = ()) -> list[Effect]:
        """The master: move the whole job to ``plan``; return the Regroup messages to send.

        ``epoch``: the epoch a predecessor gave ``plan`` (see :meth:`catch_up`), with the ranks
        it left out (``out_before``); by default the next one.
        """
        st = self.st
        old = st.server
        assert isinstance(old, Master) and st.ledger is not None
        if st.final_asked:
            return []  # the job is over: nothing to move
        now = st.clock()
        old.close_boards(CLOSED, now)
        if epoch:
            st.epoch = epoch  # (its old children may have switched already: none is waited for)
        else:
            st.epoch += 1
            self.unacked[st.epoch - 1] = {r for r in old.children if r != st.rank}
        st.retire_server()
        st.plans.append(plan)
        out = (st.hierarchy.out | frozenset(st.drained) | frozenset(out_before)) - st.failed
        st.lay_out(build(st.size, plan, st.failed, out, st.hierarchy.node_sizes))
        new = st.server
        assert isinstance(new, Master)
        new.take_job(old)  # (whole: a field left behind was a retry count or a copy owed to the deputy)
        if not self.unacked.get(st.epoch - 1, True):
            del self.unacked[st.epoch - 1]
        regroup = Regroup(st.epoch, plan, tuple(sorted(out)))
        return [Send(r, regroup) for r in range(st.size) if r != st.rank and r not in st.failed]

    @property
    def may_have_switched(self) -> bool:
        """Whether the job may have run another plan than its first (as far as this rank can tell)."""
        return self.st.epoch > 0 or self.st.config.auto

    def announce(self) -> list[Effect]:
        """A new master: tell every survivor the plan it runs, before it asks what they hold.

        The Regroup of the last switch goes to every rank just before the master's death may
        reach only some: those behind switch now; those ahead (this rank missed it) answer with
        theirs (:meth:`regroup`), and this rank catches up (:meth:`catch_up`) before their answers
        to its questions come in (messages between two ranks keep their order).
        """
        st = self.st
        out = tuple(sorted((st.hierarchy.out | frozenset(st.drained)) - st.failed))
        regroup = Regroup(st.epoch, st.plans[-1], out)
        return [Send(r, regroup) for r in range(st.size) if r != st.rank and r not in st.failed]

    def catch_up(self, msg: Regroup) -> list[Effect]:
        """The master, behind a rank that heard of a later switch than it did (its predecessor's last
        Regroup did not reach it): switch to that plan too, then take what came under it."""
        st = self.st
        if msg.epoch <= st.epoch:
            return []
        outs = self.switch(msg.plan, msg.epoch, msg.out)
        if st.epoch != msg.epoch:
            return outs  # (the job was over: nothing moved)
        future, self.future = self.future, []
        for src, m in future:
            outs += st.receive(src, m)
        return outs + st.serve()

    def regroup(self, src: int, msg: Regroup) -> list[Effect]:
        """Any rank but the master: switch to the master's new plan; return the effects.

        A Regroup older than this rank's plan comes from a new master that missed its
        predecessor's last one (:meth:`announce`): this rank tells it the plan it runs.
        """
        st = self.st
        if isinstance(st.server, Master):
            return self.catch_up(msg)
        if msg.epoch < st.epoch:
            out = tuple(sorted(st.hierarchy.out - st.failed))
            return [Send(src, Regroup(st.epoch, st.plans[-1], out))]
        if msg.epoch == st.epoch:
            return []
        outs: list[Effect] = []
        old_parent = st.info.parent
        before = st.hierarchy
        master = st.hierarchy.master
        d = st.server
        if isinstance(d, Region):
            d.close_boards(CLOSED, st.clock())
            returned = d.queue.copy()
            returned.add_ranges(d.up_returned.ranges())
            if d.up_done or returned or d.up_failed or d.up_tasks:
                # (what its children reported so far rides to the master in this or an earlier report)
                outs += self.delivery.report_up(Report(d.up_done.ranges(), tuple(d.up_results), returned.ranges(),
                                                       tuple(d.up_failed), epoch=msg.epoch,
                                                       orphan=True, tasks=d.up_tasks, busy=d.up_busy,
                                                       task_max=d.task_max), master,
                                                dict(self.delivery.heard_seq))
            waiting = {r for r, c in d.children.items() if r != st.rank and not (c.left and not c.held)}
            if waiting:
                self.unacked[st.epoch] = waiting
            st.retire_server()
        w = st.worker
        if w is not None and (w.done or w.failed):
            report = w.report(st.clock())
            outs += self.delivery.report_up(Report(report.done, report.results, (), report.failed, epoch=msg.epoch,
                                                   orphan=True, tasks=report.tasks, busy=report.busy,
                                                   task_max=report.task_max), master, {})
        st.epoch = msg.epoch
        st.plans.append(msg.plan)
        if st.rank in msg.out:
            st.drain_requested = True  # (its Drain came first; this holds whatever the order)
        st.lay_out(build(st.size, msg.plan, st.failed, frozenset(msg.out), st.hierarchy.node_sizes))
        if old_parent is not None and old_parent not in st.failed:
            outs.append(Send(old_parent, Ack(msg.epoch)))
            self.acked[msg.epoch] = _Acked(old_parent, before.plan, before.out, before.node_sizes)
        future, self.future = self.future, []
        for src, m in future:
            outs += st.receive(src, m)
        return outs + st.serve()

    def ack_again(self, dead: frozenset[int]) -> list[Effect]:
        """An old parent this rank acknowledged a switch to is among ``dead``: acknowledge it to the
        rank that leads its block of the old plan without them, which waits for it.

        The Regroup came before the news of the death, so the Ack went to the dead; the
        survivor that took over its block (and its children, in its own view) waited for an Ack
        for ever and never ended (the Ack of an earlier switch too, not only the last).
        A plan is kept per switch (as ``plans``), and the layout before it is built again here.
        """
        st = self.st
        outs: list[Effect] = []
        for epoch, acked in sorted(self.acked.items()):
            if acked.parent not in dead:
                continue
            heir = build(st.size, acked.plan, st.failed, acked.out, acked.node_sizes)[st.rank].parent
            if heir is None or heir in st.failed or heir == st.rank:
                del self.acked[epoch]
                continue
            self.acked[epoch] = acked._replace(parent=heir)
            outs.append(Send(heir, Ack(epoch)))
        return outs

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
