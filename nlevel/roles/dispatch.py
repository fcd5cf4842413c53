"""Server roles: the master and the region-masters, as state machines.

Each takes a message and returns the messages to send (:class:`~nlevel.roles.worker.Out`);
one loop in :mod:`nlevel.node` does the I/O. No MPI here.

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

from ..hierarchy import Node
from ..protocol import Grant, Report, Result
from ..ranges import RangeSet, Ranges
from ..stats import RequestTimes
from .ledger import Ledger
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

    __slots__ = ("rank", "weight", "held", "want", "since", "last_want", "finished", "left")

    def __init__(self, rank: int, weight: int) -> None:
        self.rank = rank
        self.weight = weight
        self.held = RangeSet()
        self.want = 0
        self.since = 0.0
        self.last_want = 1
        self.finished = False  # sent a final grant
        self.left = False  # said it is leaving


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

    # -- events ---------------------------------------------------------------------
    def on_report(self, src: int, report: Report) -> list[Out]:
        """Handle a child's report: completions, returned ids, a want, or leaving."""
        self._step_start = now = self.clock()
        child = self.children[src]
        for a, b in report.done:
            removed = child.held.remove(a, b)
            self.held_total -= removed
            self.unexpected += (b - a) - removed
        if report.done:
            self._accept_done(report.done, report.results, now)
        for a, b in report.returned:
            removed = child.held.remove(a, b)
            self.held_total -= removed
            self._take_back(a, b)
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

    def __init__(self, node: Node, child_weights: dict[int, int], clock: Callable[[], float], ledger: Ledger) -> None:
        super().__init__(node, child_weights, clock)
        self.ledger = ledger
        self.queue = ledger.remaining()
        # Ids granted under an earlier plan and not yet committed or given back: the job
        # is not finished while any is left (see Station.switch).
        self.carried = RangeSet()

    def _accept_done(self, done: Ranges, results: tuple[tuple[int, Result], ...], now: float) -> None:
        self.ledger.commit(done, results)
        if self.carried:
            self.carried.remove_ranges(done)

    def take_orphan(self, done: Ranges, results: tuple[tuple[int, Result], ...], returned: Ranges) -> list[Out]:
        """Completions and given-back ids that arrived under an older plan (see Station)."""
        self._step_start = now = self.clock()
        if done:
            self._accept_done(done, results, now)
        for a, b in returned:
            self.carried.remove(a, b)
            self.queue.add(a, b)
        return self._serve(now) + self._upkeep(now)

    def _exhausted(self) -> bool:
        return not self.queue and self.held_total == 0 and not self.carried


class Region(Dispatcher):
    """A region-master: asks its parent for ids ahead of need and batches completions upward.

    Args:
        node, child_weights, clock: As for :class:`Dispatcher`.
        prefetch: Requests' worth of ids to keep queued per child (see :class:`~nlevel.plan.Plan`).
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
        return self.parent_final and not self.queue

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
            return [Out(self.parent, Report(report.done, report.results, 0, returned, True))]
        if self.parent_final or self.gone:
            return self._flush() if self.up_done else []
        if self._everyone_left():
            # Everyone below left the loop early: give the queue back and leave too.
            self.gone = True
            returned = self.queue.ranges()
            self.queue = RangeSet()
            report = self._report(0)
            return [Out(self.parent, Report(report.done, report.results, 0, returned, True))]
        waiting = self.pending_want
        queued = len(self.queue)
        target = self.target()
        deficit = target + waiting - queued
        low = queued - waiting < target / 2
        if not self.asked and low and deficit > 0:
            self.asked = True
            self.asked_at = now
            return [Out(self.parent, self._report(deficit))]
        if self.up_done and (
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
        report = Report(self.up_done.ranges(), tuple(self.up_results), want)
        self.up_done = RangeSet()
        self.up_results = []
        self.oldest_up = math.inf
        return report
