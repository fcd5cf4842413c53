"""The part of a :class:`~nlevel.roles.station.Station` that repairs it after failures.

:meth:`Repair.fail` takes the ranks MPI reported dead and applies the rules of
:mod:`nlevel.roles.recovery` to this rank: requeue a dead slave's ids, start (or
extend) a reconciliation for a dead server, take over as region-master or master
when this rank is now the lowest survivor of a block, send a Holding when this
rank's parent died. Messages that arrive before this rank has heard of the failure
they follow are held back until it has. Pure Python, no MPI.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from ..hierarchy import Hierarchy, Role, build
from ..protocol import Failed, Holding, Kill, Message, Mirror, Report
from ..ranges import RangeSet
from .dispatch import Dispatcher, Master, Region
from .ledger import Ledger
from .recovery import Reconciliation, close_record, deputy, expected, failure_record, reconciler
from .worker import Out

if TYPE_CHECKING:
    from .station import Station

__all__ = ["Repair"]


class Repair:
    """Failure handling mixed into :class:`~nlevel.roles.station.Station` (which owns the state)."""

    def _init_repair(self: Station, wall: Callable[[], float], recover: Callable[[], Ledger] | None) -> None:
        self.wall = wall
        self.recover = recover  # the ledger as the checkpoint has it (a new master without a mirror)
        self.failed: frozenset[int] = frozenset()
        self.failures: list[dict[str, Any]] = []  # this rank's finished recoveries (for the report)
        self.recon: Reconciliation | None = None
        self.mirror: Ledger | None = None  # the deputy's copy of the master's ledger
        self._mirror_to: int | None = None  # the master: where the copy goes (None: not sent yet)
        self._deferred: deque[tuple[int, Message]] = deque()

    # -- events ---------------------------------------------------------------------------
    def fail(self: Station, ranks: tuple[int, ...], how: str = "ulfm") -> list[Out]:
        """``ranks`` are dead: repair this rank's roles; return what to send."""
        new = frozenset(ranks) - self.failed - {self.rank}
        if not new:
            return []
        old = self.hierarchy
        self.failed = failed = self.failed | new
        nh = build(self.size, old.plan, failed)
        wall = self.wall()
        outs: list[Out] = []
        for epoch in list(self.draining):  # the dead never acknowledge a regroup
            self.draining[epoch] -= new
            if not self.draining[epoch]:
                del self.draining[epoch]
        d = self.dispatcher
        if d is not None:
            for x in sorted(new & set(d.children)):
                leased = d.children[x].leased
                silent = d.clock() - d.children[x].heard
                held = d.drop_child(x)
                record = failure_record(x, old, len(held), "lease expired (hung)" if leased else how, self.rank, wall)
                record["silent_ms"] = round(silent * 1e3, 3)  # since its last message: bounds the detection latency
                if old[x].children:  # a server: its survivors will say what they hold
                    self.recon = self.recon or Reconciliation()
                    self.recon.add_dead(held, expected(x, old, failed), record)
                else:
                    n, quarantined = d.requeue_lost(held)
                    close_record(record, n, quarantined, self.wall())
                    self.failures.append(record)
        if self.recon is not None:
            for x in sorted(new & (self.recon.expected | set(self.recon.got))):
                mine = reconciler(x, old, nh) == self.rank
                self.recon.member_died(x, expected(x, old, failed) if mine else set())
        became_master = nh.master == self.rank and old.master != self.rank
        if became_master:
            outs += self._take_over(old, nh, wall, how)
        outs += self._relayout(nh)
        parent = old[self.rank].parent
        if parent is not None and parent in new:
            outs += self._send_holding(reconciler(self.rank, old, nh))
        if isinstance(self.dispatcher, Master) and self.config.ft:
            dep = deputy(nh)
            if dep != self._mirror_to:
                outs += self._mirror_full(dep)
        if self.dispatcher is not None:
            self.dispatcher.reconciling = self.recon is not None
        deferred, self._deferred = self._deferred, deque()
        for src, msg in deferred:
            outs += self.deliver(src, msg)
        outs += self._finish_recon()
        if self.dispatcher is not None:
            outs += self.route(self.dispatcher.tick())
        return outs

    def _defer(self: Station, src: int, msg: Message) -> bool:
        """Whether ``msg`` must wait for this rank to learn of a failure (and keep order per sender)."""
        if self._deferred and any(s == src for s, _ in self._deferred):
            self._deferred.append((src, msg))
            return True
        waiting = False
        if isinstance(msg, Holding):
            waiting = not set(msg.failed) <= self.failed
        elif isinstance(msg, Report) and not msg.orphan and msg.epoch == self.epoch:
            d = self.dispatcher
            waiting = d is None or src not in d.children
        if waiting:
            self._deferred.append((src, msg))
        return waiting

    def on_holding(self: Station, src: int, msg: Holding) -> list[Out]:
        """A survivor whose parent died says what it holds (this rank reconciles, or is its new parent)."""
        held = RangeSet(msg.held)
        d = self.dispatcher
        if d is None:
            return []
        path = src
        while path is not None and path not in d.children and path != self.rank:
            path = self.hierarchy[path].parent
        if path is not None and path != self.rank:
            d.attach(d.children[path], held)  # the child's subtree holds these now
        if self.recon is not None and (src in self.recon.expected or src in self.recon.got):
            self.recon.receive(src, held)
        return self._finish_recon()

    def on_mirror(self: Station, msg: Mirror) -> list[Out]:
        """The deputy: copy the master's commits (a full copy replaces what it had)."""
        if isinstance(self.dispatcher, Master):  # a late copy from the master this rank replaced
            self.dispatcher.ledger.commit(msg.done, msg.results)
            return []
        if msg.full or self.mirror is None:
            self.mirror = Ledger(msg.total, width=msg.width)
        self.mirror.commit(msg.done, msg.results)
        return []

    # -- the pieces -----------------------------------------------------------------------------
    def _take_over(self: Station, old: Hierarchy, nh: Hierarchy, wall: float, how: str) -> list[Out]:
        """This rank is the new master: the ledger from the mirror (or the checkpoint); reconcile everything."""
        ledger = self.mirror
        source = "deputy's copy"
        if ledger is None:
            if self.recover is None:
                raise RuntimeError(f"rank {self.rank} must take over as master but has no ledger to start from")
            ledger = self.recover()
            source = "checkpoint"
        self.ledger = ledger
        self.mirror = None
        record = failure_record(old.master, old, len(ledger.remaining()), how, self.rank, wall)
        record["ledger_from"] = source
        recon = self.recon or Reconciliation()
        recon.everything = True
        recon.add_dead(RangeSet(), expected(old.master, old, self.failed) - {self.rank}, record)
        self.recon = recon
        self.planner = None  # the new master keeps the plan it finds
        return []

    def _relayout(self: Station, nh: Hierarchy) -> list[Out]:
        """Give this rank the roles ``nh`` says, keeping every id it holds; return what to send."""
        outs: list[Out] = []
        old_d = self.dispatcher
        self.hierarchy = nh
        self.info = info = nh[self.rank]
        w = self.worker
        weights = {c: nh[c].weight for c in info.children}
        if w is not None and (info.children or info.role is Role.MASTER):
            weights[self.rank] = 1
        c = self.config
        d: Dispatcher | None = old_d
        if info.role is Role.MASTER and not isinstance(old_d, Master):
            assert self.ledger is not None
            d = Master(info, {}, self.clock, self.ledger, c.task_retries if c.on_task_error == "retry" else 0, c.ft)
            d.queue = RangeSet()  # nothing is granted before the reconciliation says what is free
            self._absorb(old_d, d)
        elif info.role is Role.REGION and old_d is None:
            d = Region(info, {}, self.clock, nh.plan.prefetch, c.batch, c.batch_age)
        elif isinstance(d, Region) and info.role is Role.REGION and d.parent != info.parent:
            assert info.parent is not None
            d.parent = info.parent
            d.asked = False  # the want went to a dead parent: ask the new one
        elif isinstance(d, Region) and info.role is Role.SLAVE:
            # Every child died: no region left to serve. Its ids go back up; its own loop goes on.
            assert info.parent is not None
            returned = d.queue.copy()
            returned.add_ranges(d.up_returned.ranges())
            own = d.children.get(self.rank)
            if own is not None:
                returned.remove_ranges(own.held.ranges())  # still this rank's own worker's
            outs.append(Out(info.parent, Report(d.up_done.ranges(), tuple(d.up_results), 0, returned.ranges(),
                                                failed=tuple(d.up_failed), task_max=d.task_max)))
            self.served_before += d.served
            d = None
        if d is not None:
            d.quarantine = c.quarantine
            for r in [r for r in d.children if r not in weights]:
                d.requeue_lost(d.drop_child(r))  # (not expected: children only change by dying)
            for r, wt in weights.items():
                if r in d.children:
                    d.set_weight(r, wt)
                else:
                    child = d.adopt_child(r, wt)
                    if r == self.rank and w is not None:
                        d.attach(child, w.holding())  # this rank's own loop is now served here
        self.dispatcher = d
        if w is None:
            return outs
        parent = self.rank if d is not None else info.parent
        assert parent is not None
        if w.parent != parent:
            w.parent = parent
            w.asked = False  # an unanswered want to a dead parent: ask again
        return outs

    def _absorb(self: Station, old: Dispatcher | None, new: Master) -> None:
        """A region-master becoming master: its queue, children and buffered completions come along."""
        if not isinstance(old, Region):
            return
        new.queue = old.queue
        new.children = {r: ch for r, ch in old.children.items()}
        new.pending = deque(ch for ch in new.children.values() if ch.want)
        new.pending_want = sum(ch.want for ch in new.children.values())
        new.want_sum = sum(ch.last_want for ch in new.children.values() if not ch.left)
        new.held_total = sum(len(ch.held) for ch in new.children.values())
        new.total_weight = sum(ch.weight for ch in new.children.values()) or 1
        new.settled, new.task_max, new.deaths = old.settled, old.task_max, old.deaths
        if old.up_done:
            new.ledger.commit(old.up_done.ranges(), old.up_results)
        for tid, info in old.up_failed:
            new._task_failed(tid, info)
        self.served_before += old.served

    def _holding(self: Station) -> RangeSet:
        """Every id this rank and its subtree hold, for a Holding."""
        held = RangeSet()
        w, d = self.worker, self.dispatcher
        if w is not None:
            held.add_ranges(w.holding().ranges())
        if d is not None:
            held.add_ranges(d.queue.ranges())
            for ch in d.children.values():
                held.add_ranges(ch.held.ranges())
            if isinstance(d, Region):
                held.add_ranges(d.up_done.ranges())
                held.add_ranges(d.up_returned.ranges())
                for tid, _ in d.up_failed:
                    held.add(tid, tid + 1)
        if self.recon is not None:
            held.add_ranges(self.recon.held.ranges())
        return held

    def _send_holding(self: Station, to: int) -> list[Out]:
        """This rank's parent died: tell the reconciler and the new parent what this rank holds."""
        msg = Holding(self._holding().ranges(), tuple(sorted(self.failed)))
        dests = {to}
        if self.info.parent is not None:
            dests.add(self.info.parent)
        outs: list[Out] = []
        for dest in sorted(dests):
            if dest == self.rank:
                outs += self.on_holding(self.rank, msg)
            else:
                outs.append(Out(dest, msg))
        return outs

    def _finish_recon(self: Station) -> list[Out]:
        """Every expected Holding is in: requeue what nobody holds."""
        recon, d = self.recon, self.dispatcher
        if recon is None or not recon.complete or d is None:
            return []
        if recon.everything:
            assert isinstance(d, Master)
            question = d.ledger.remaining()
            question.remove_ranges(d.queue.ranges())
            question.remove_ranges(d.carried.ranges())
            for ch in d.children.values():
                question.remove_ranges(ch.held.ranges())
        else:
            question = recon.held
        lost = recon.lost(question, d.settled)
        n, quarantined = d.requeue_lost(lost)
        wall = self.wall()
        for record in recon.records:
            close_record(record, n, quarantined, wall)
            n, quarantined = 0, []  # counted once, on the first record
        self.failures += recon.records
        self.recon = None
        d.reconciling = False
        return self.route(d.tick())

    def _mirror_full(self: Station, dep: int | None) -> list[Out]:
        """The master: (re)start the deputy's copy with the whole ledger."""
        self._mirror_to = dep
        d = self.dispatcher
        assert isinstance(d, Master)
        d.mirror_done, d.mirror_results = RangeSet(), []
        if dep is None:
            return []
        led = d.ledger
        results = tuple(zip(led.result_ids.tolist(), _rows(led)))
        return [Out(dep, Mirror(led.committed.ranges(), results, led.total, led.width, True))]

    def _mirror_out(self: Station) -> list[Out]:
        """The master: send the deputy what was committed since the last copy."""
        d = self.dispatcher
        if not isinstance(d, Master) or not d.mirror:
            return []
        if self._mirror_to is None:
            return self._mirror_full(deputy(self.hierarchy))
        if not (d.mirror_done or d.mirror_results):
            return []
        msg = Mirror(d.mirror_done.ranges(), tuple(d.mirror_results), d.ledger.total, d.ledger.width)
        d.mirror_done, d.mirror_results = RangeSet(), []
        return [Out(self._mirror_to, msg)]

    def lease_kills(self: Station) -> list[Out]:
        """Children silent past their lease: ask for them to be killed (MPI then reports them dead)."""
        d = self.dispatcher
        if d is None or not self.config.ft:
            return []
        late = d.overdue(self.clock(), self.config.lease_min, self.config.lease_factor)
        return [Out(r, Kill(r)) for r in late]


def _rows(led: Ledger) -> list[Any]:
    values = led.result_values.tolist()
    if led.width == 1:
        return values
    return [tuple(values[i : i + led.width]) for i in range(0, len(values), led.width)]


# Failed is handled by Station.deliver; re-exported for the runtime's convenience.
__all__ += ["Failed"]
