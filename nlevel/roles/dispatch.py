"""Server roles: the master and the region-masters, as state machines.

Each takes a message and returns the messages to send (:class:`~nlevel.roles.worker.Out`);
one loop in :mod:`nlevel.runtime.node` does the I/O. No MPI here.

A server keeps a queue of ids and, per child, the ids it granted and not yet saw
finished (``held``: exactly what must be taken back if the child dies), the child's
pending ``want`` and whether it has left. Requests that cannot be answered wait
(FIFO) until ids arrive or the job is finished, so idle ranks at the end of a job
are still there to take ids that come back.

* :class:`Master` owns the pool of ids not yet granted and commits completions to
  a :class:`~nlevel.roles.ledger.Ledger`. The job is finished when the pool is empty
  and no child holds an id: everything granted was committed.
* :class:`Region` gets ids from its parent, keeping ``prefetch`` requests' worth
  queued for its region, and forwards completions upward in batches (by count, by
  age, and at once when its region is idle so the end of a job is not delayed).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable

from ..model.hierarchy import Node
from ..ranges import RangeSet, Ranges
from ..stats import RequestTimes
from .ledger import Ledger
from .messages import Grant, Report, Result
from .worker import Out

__all__ = ["Child", "Dispatcher", "Master", "Region", "grant_size"]


def grant_size(want: int, available: int, weight: int, total_weight: int, factor: float = 2.0) -> int:
    """Return how many ids to grant: the want, capped by a guided-self-scheduling share.

    A child of weight ``w`` (ranks that compute under it) gets at most
    ``ceil(available * w / (factor * total_weight))`` ids, so as the queue drains the
    grants shrink and the last ids are spread over everyone instead of sitting in one
    region's queue. Always at least 1 when anything is available.
    """
    if available <= 0 or want <= 0:
        return 0
    share = math.ceil(available * max(weight, 1) / (factor * max(total_weight, 1)))
    return max(1, min(want, available, share))


class Child:
    """What a server knows about one child (a rank, or its own local worker)."""

    __slots__ = ("rank", "weight", "held", "want", "since", "last_want", "finished", "left", "heard", "leased")

    def __init__(self, rank: int, weight: int) -> None:
        self.rank = rank
        self.weight = weight
        self.held = RangeSet()
        self.want = 0
        self.since = 0.0
        self.last_want = 1
        self.finished = False  # sent a final grant
        self.left = False  # said it is leaving
        self.heard = 0.0  # when it last reported or was granted ids (its lease runs from here)
        self.leased = False  # its lease expired: it is being killed


class Dispatcher:
    """What the master and region-masters share: children, queue, serving wants.

    Args:
        node: This rank's place in the hierarchy.
        child_weights: Weight of each child rank; include this rank itself (weight 1)
            when it computes, so its own loop is served like any child.
        clock: Returns seconds; used to time how long requests stay here.
    """

    def __init__(self, node: Node, child_weights: dict[int, int], clock: Callable[[], float]) -> None:
        self.rank = node.rank
        self.node = node
        self.clock = clock
        self.queue = RangeSet()
        self.children = {r: Child(r, w) for r, w in child_weights.items()}
        self.total_weight = sum(w for w in child_weights.values()) or 1
        self.pending: deque[Child] = deque()
        # Running sums (a region-master reads them on every message; summing over ~10^4
        # children each time was most of its cost at scale).
        self.pending_want = 0  # ids asked for by the wants waiting in `pending`
        self.want_sum = sum(c.last_want for c in self.children.values())  # last wants of children still here
        self.held_total = 0
        self.unexpected = 0  # ids reported done that the child was not holding
        self.served = 0  # wants answered
        self._step_start = 0.0
        # Fault tolerance. Ids a child reported finished or gave back without holding them
        # (after a failure a child's Holding may arrive after its completions did).
        self.settled = RangeSet()
        self.task_max = 0.0  # longest task reported from below (s): leases follow it
        self.deaths: dict[int, int] = {}  # id -> processes that died holding it
        self.quarantine = 3
        self.reconciling = False  # ids may come back from a reconciliation: the job is not over
        self.track_settled = False  # after a failure: remember every id finished or given back below

    # -- events ---------------------------------------------------------------------
    def on_report(self, src: int, report: Report) -> list[Out]:
        """Handle a child's report: completions, returned ids, a want, or leaving."""
        self._step_start = now = self.clock()
        child = self.children[src]
        child.heard = now
        if report.task_max > self.task_max:
            self.task_max = report.task_max
        for a, b in report.done:
            removed = child.held.remove(a, b)
            self.held_total -= removed
            if removed < b - a:
                self.unexpected += (b - a) - removed
            if removed < b - a or self.track_settled:
                self.settled.add(a, b)
        if report.done:
            self._accept_done(report.done, report.results, now)
        for a, b in report.returned:
            removed = child.held.remove(a, b)
            self.held_total -= removed
            if removed < b - a or self.track_settled:
                self.settled.add(a, b)
            self._take_back(a, b)
        for tid, info in report.failed:
            self.held_total -= child.held.remove(tid, tid + 1)
            if self.track_settled:
                self.settled.add(tid, tid + 1)
            self._task_failed(tid, info)
        outs: list[Out] = []
        if report.leaving:
            if not child.left:
                self.want_sum -= child.last_want
            child.left = True
            if child.want:
                # Answer the outstanding want so the child never waits for a grant that
                # will not come, nor misses one that is already on its way.
                self.pending.remove(child)
                self.pending_want -= child.want
                child.finished = True
                outs.append(self._grant(child, (), True, now))
                child.want = 0
        elif report.want > 0:
            if not child.want:
                self.pending.append(child)
            self.pending_want += report.want - child.want
            child.want = report.want
            if not child.left:
                self.want_sum += report.want - child.last_want
            child.last_want = report.want
            child.since = now
        return outs + self._serve(now) + self._upkeep(now)

    def tick(self) -> list[Out]:
        """Time-driven work: called by the loop when idle."""
        self._step_start = now = self.clock()
        return self._serve(now) + self._upkeep(now)

    @property
    def finished(self) -> bool:
        """Whether every child got its final grant or left holding nothing: this server may stop."""
        return all((c.finished or c.left) and not c.held for c in self.children.values())

    def _take_back(self, start: int, stop: int) -> None:
        """Ids a child gave back unstarted: queue them again."""
        self.queue.add(start, stop)

    def _task_failed(self, tid: int, info: str) -> None:
        raise NotImplementedError

    # -- failures (see nlevel.roles.recovery) --------------------------------------------------
    def drop_child(self, rank: int) -> RangeSet:
        """Forget a dead child; return the ids it held (the caller requeues or reconciles them)."""
        child = self.children.pop(rank)
        if child.want:
            self.pending.remove(child)
            self.pending_want -= child.want
        if not child.left:
            self.want_sum -= child.last_want
        self.held_total -= len(child.held)
        self.total_weight = max(1, self.total_weight - child.weight)
        return child.held

    def adopt_child(self, rank: int, weight: int, held: RangeSet | None = None) -> Child:
        """Take a new child (after a failure re-laid the hierarchy), optionally holding ``held``."""
        child = self.children.get(rank)
        if child is None:
            child = self.children[rank] = Child(rank, weight)
            child.heard = self.clock()
            self.want_sum += child.last_want
            self.total_weight += weight
        if held:
            self.attach(child, held)
        return child

    def attach(self, child: Child, held: RangeSet) -> None:
        """Record that ``child`` holds ``held`` (a Holding), minus ids already settled."""
        fresh = held.copy()
        if self.settled:
            fresh.remove_ranges(self.settled.ranges())
        before = len(child.held)
        child.held.add_ranges(fresh.ranges())
        self.held_total += len(child.held) - before

    def set_weight(self, rank: int, weight: int) -> None:
        """A child's subtree changed size."""
        child = self.children[rank]
        self.total_weight += weight - child.weight
        child.weight = weight

    def requeue_lost(self, ids: RangeSet) -> tuple[int, list[int]]:
        """Ids held by a process that died: queue them again; return (requeued, quarantined ids).

        An id held by ``quarantine`` processes that died is not run again: it is recorded
        failed (a task that kills its process would otherwise kill every rank in turn).
        """
        quarantined: list[int] = []
        if len(ids) <= 100_000:  # (a dead region-master's prefetch is not counted one by one)
            for tid in ids:
                n = self.deaths[tid] = self.deaths.get(tid, 0) + 1
                if n >= self.quarantine:
                    quarantined.append(tid)
        for tid in quarantined:
            ids.remove(tid, tid + 1)
            self._task_failed(tid, f"quarantined: held by {self.quarantine} processes that died")
        for a, b in ids.ranges():
            self._take_back(a, b)
        return len(ids), quarantined

    def overdue(self, now: float, lease_min: float, lease_factor: float) -> list[int]:
        """Children holding ids that have been silent longer than their lease (hung processes).

        The lease is ``lease_min + lease_factor * longest task * ceil(held / weight)``; no
        lease runs before any task has finished below (nothing is known of task times yet).
        """
        if self.task_max <= 0:
            return []
        late = []
        for child in self.children.values():
            if child.rank == self.rank or not child.held or child.leased:
                continue
            per = math.ceil(len(child.held) / max(1, child.weight))
            if now - child.heard > lease_min + lease_factor * self.task_max * per:
                child.leased = True
                late.append(child.rank)
        return late

    # -- serving --------------------------------------------------------------------
    def _serve(self, now: float) -> list[Out]:
        outs: list[Out] = []
        pending = self.pending
        queue = self.queue
        while pending:
            child = pending[0]
            available = len(queue)
            if available:
                n = grant_size(child.want, available, child.weight, self._active_weight())
                ids = queue.take(n)
                child.held.add_ranges(ids)
                child.heard = now
                self.held_total += n
                outs.append(self._grant(child, ids, False, now))
            elif self._exhausted():
                child.finished = True
                outs.append(self._grant(child, (), True, now))
            else:
                break
            pending.popleft()
            self.pending_want -= child.want
            child.want = 0
        return outs

    def _grant(self, child: Child, ids: Ranges, final: bool, now: float) -> Out:
        self.served += 1
        t = self.clock()
        return Out(child.rank, Grant(ids, final, t - child.since, t - self._step_start))

    def _active_weight(self) -> int:
        return self.total_weight

    # -- what the master and the regions do differently ----------------------------------
    def _accept_done(self, done: Ranges, results: tuple[tuple[int, Result], ...], now: float) -> None:
        raise NotImplementedError

    def _exhausted(self) -> bool:
        raise NotImplementedError

    @property
    def exhausted(self) -> bool:
        """Whether no id will ever be granted again from here (the job is finished below it)."""
        return self._exhausted()

    def _upkeep(self, now: float) -> list[Out]:
        return []


class Master(Dispatcher):
    """The root: hands out the ids the ledger says are not committed, and commits completions.

    Args:
        node, child_weights, clock: As for :class:`Dispatcher`.
        ledger: The completion record (already holding what earlier runs committed).
    """

    def __init__(
        self,
        node: Node,
        child_weights: dict[int, int],
        clock: Callable[[], float],
        ledger: Ledger,
        retries: int = 0,
        mirror: bool = False,
    ) -> None:
        super().__init__(node, child_weights, clock)
        self.ledger = ledger
        self.retries = retries  # a task that raised runs again up to this many times
        self.attempts: dict[int, int] = {}
        self.mirror = mirror  # keep a copy of each commit for the deputy
        self.mirror_done = RangeSet()
        self.mirror_results: list[tuple[int, Result]] = []
        self.queue = ledger.remaining()
        # Ids granted under an earlier plan and not yet committed or given back: the job
        # is not finished while any is left (see Station.switch).
        self.carried = RangeSet()
        self.stopped = False  # asked to stop early: nothing more is granted
        self.aside = RangeSet()  # ids not granted because of the stop

    def stop(self) -> list[Out]:
        """Grant nothing more: running work finishes, then every child gets its final grant."""
        self._step_start = now = self.clock()
        if not self.stopped:
            self.stopped = True
            self.aside.add_ranges(self.queue.ranges())
            self.queue = RangeSet()
        return self._serve(now) + self._upkeep(now)

    def _take_back(self, start: int, stop: int) -> None:
        (self.aside if self.stopped else self.queue).add(start, stop)

    def _accept_done(self, done: Ranges, results: tuple[tuple[int, Result], ...], now: float) -> None:
        self.ledger.commit(done, results)
        if self.carried:
            self.carried.remove_ranges(done)
        if self.mirror:
            self.mirror_done.add_ranges(done)
            self.mirror_results.extend(results)

    def _task_failed(self, tid: int, info: str) -> None:
        n = self.attempts[tid] = self.attempts.get(tid, 0) + 1
        if n <= self.retries and not info.startswith("quarantined"):
            self._take_back(tid, tid + 1)  # runs again, most likely on another rank
        else:
            self.ledger.fail(tid, info, n)
            if self.carried:
                self.carried.remove(tid, tid + 1)

    def take_orphan(
        self,
        done: Ranges,
        results: tuple[tuple[int, Result], ...],
        returned: Ranges,
        failed: tuple[tuple[int, str], ...] = (),
    ) -> list[Out]:
        """Completions, given-back ids and failed tasks that arrived under an older plan (see Station)."""
        self._step_start = now = self.clock()
        if done:
            self._accept_done(done, results, now)
        for tid, info in failed:
            self._task_failed(tid, info)
        for a, b in returned:
            self.carried.remove(a, b)
            self._take_back(a, b)
        return self._serve(now) + self._upkeep(now)

    def _exhausted(self) -> bool:
        return not self.queue and self.held_total == 0 and not self.carried and not self.reconciling


class Region(Dispatcher):
    """A region-master: asks its parent for ids ahead of need and batches completions upward.

    Args:
        node, child_weights, clock: As for :class:`Dispatcher`.
        prefetch: Requests' worth of ids to keep queued per child (see :class:`~nlevel.model.plan.Plan`).
        batch: Forward completions once this many are buffered ...
        batch_age: ... or once the oldest is this many seconds old.
    """

    def __init__(
        self,
        node: Node,
        child_weights: dict[int, int],
        clock: Callable[[], float],
        prefetch: float = 2.0,
        batch: int = 1024,
        batch_age: float = 0.05,
    ) -> None:
        super().__init__(node, child_weights, clock)
        assert node.parent is not None
        self.parent = node.parent
        self.prefetch = prefetch
        self.batch = batch
        self.batch_age = batch_age
        self.up_done = RangeSet()
        self.up_results: list[tuple[int, Result]] = []
        self.oldest_up = math.inf
        self.asked = False
        self.asked_at = 0.0
        self.parent_final = False
        self.gone = False  # every child left early; the queue went back to the parent
        self.up_returned = RangeSet()  # ids given back to this region after it left
        self.up_failed: list[tuple[int, str]] = []  # tasks that raised below, for the master to decide
        self.requests = RequestTimes()  # this region-master's own requests upward
        self._staying: Child | None = None  # a child not known to have left (see _everyone_left)

    def on_grant(self, grant: Grant) -> list[Out]:
        """Handle the parent's grant: queue the ids, serve waiting children, refill if needed."""
        self._step_start = now = self.clock()
        if self.asked:
            self.requests.add(now - self.asked_at, grant.residence, grant.dispose)
        self.asked = False
        if self.gone:  # crossed our leaving report: hand the ids straight back
            self.parent_final = self.parent_final or grant.final
            return [Out(self.parent, Report((), (), 0, grant.ids, True))] if grant.ids else []
        self.queue.add_ranges(grant.ids)
        if grant.final:
            self.parent_final = True
        return self._serve(now) + self._upkeep(now)

    def target(self) -> int:
        """Ids to keep queued: ``prefetch`` times what the children ask for per request."""
        return max(1, math.ceil(self.prefetch * self.want_sum))

    def _accept_done(self, done: Ranges, results: tuple[tuple[int, Result], ...], now: float) -> None:
        self.up_done.add_ranges(done)
        self.up_results.extend(results)
        if self.oldest_up == math.inf:
            self.oldest_up = now

    def _exhausted(self) -> bool:
        return self.parent_final and not self.queue and not self.reconciling

    def _task_failed(self, tid: int, info: str) -> None:
        self.up_failed.append((tid, info))
        if self.oldest_up == math.inf:
            self.oldest_up = self.clock()

    def _take_back(self, start: int, stop: int) -> None:
        if self.gone:  # this region already left: the ids go straight back up
            self.up_returned.add(start, stop)
        else:
            self.queue.add(start, stop)

    @property
    def released(self) -> bool:
        """Whether this region-master owes its parent nothing more (final grant seen, or left)."""
        return self.parent_final or (self.gone and not self.asked)

    def _upkeep(self, now: float) -> list[Out]:
        if self.gone and self.up_returned:
            returned, self.up_returned = self.up_returned.ranges(), RangeSet()
            report = self._report(0)
            return [Out(self.parent, Report(report.done, report.results, 0, returned, True, failed=report.failed,
                                                task_max=report.task_max))]
        if self.parent_final or self.gone:
            return self._flush() if (self.up_done or self.up_failed) else []
        if self.children and self._everyone_left():
            # Everyone below left the loop early: give the queue back and leave too.
            self.gone = True
            returned = self.queue.ranges()
            self.queue = RangeSet()
            report = self._report(0)
            return [Out(self.parent, Report(report.done, report.results, 0, returned, True, failed=report.failed,
                                                task_max=report.task_max))]
        waiting = self.pending_want
        queued = len(self.queue)
        target = self.target()
        deficit = target + waiting - queued
        low = queued - waiting < target / 2
        if not self.asked and low and deficit > 0:
            self.asked = True
            self.asked_at = now
            return [Out(self.parent, self._report(deficit))]
        if (self.up_done or self.up_failed) and (
            len(self.up_done) >= self.batch
            or now - self.oldest_up >= self.batch_age
            or (self.pending and not queued)  # region idle: the master may be waiting on these
        ):
            return self._flush()
        return []

    def _everyone_left(self) -> bool:
        """Whether every child has left; remembers one that has not (checked on every message)."""
        c = self._staying
        if c is not None and not c.left and self.children.get(c.rank) is c:
            return False
        for c in self.children.values():
            if not c.left:
                self._staying = c
                return False
        self._staying = None
        return True

    def _flush(self) -> list[Out]:
        return [Out(self.parent, self._report(0))]

    def _report(self, want: int) -> Report:
        report = Report(self.up_done.ranges(), tuple(self.up_results), want,
                        failed=tuple(self.up_failed), task_max=self.task_max)
        self.up_done = RangeSet()
        self.up_results = []
        self.up_failed = []
        self.oldest_up = math.inf
        return report
