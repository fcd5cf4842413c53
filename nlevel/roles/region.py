"""A region-master: claims blocks from its parent's upper board ahead of need, batches completions upward. Pure Python."""

from __future__ import annotations

import math
from typing import Callable

from ..model.cost import flush_age
from ..model.hierarchy import Hierarchy
from ..ranges import RangeSet, Ranges
from ..stats import RequestTimes
from .board import CLOSED, Claimer
from .messages import Report, Result, TaskFailure
from .server import LEAF, UPPER, Boards, Child, Server, Sizing
from .suspects import among
from .worker import staggered

__all__ = ["Region"]


class Region(Server):
    """A region-master: claims blocks from its parent's upper board ahead of need, batches completions upward.

    Args:
        hierarchy, rank, weights, clock, boards, sizing, epoch: As for :class:`Server`.
        parent: The rank it claims from.
        batch: Forward completions once this many are buffered ...
        batch_age: ... or once the oldest is about this many seconds old (staggered by rank).
        measured: False: the times of its own claims keep only their moments, no quantiles (the
            simulator: a sketch per region-master was 3 % of a 32,768-process run's time).
    """

    def __init__(self, hierarchy: Hierarchy, rank: int, weights: dict[int, int], clock: Callable[[], float],
                 boards: Boards, sizing: Sizing, parent: int, batch: int = 1024, batch_age: float = 0.05,
                 epoch: int = 0, measured: bool = True) -> None:
        super().__init__(hierarchy, rank, weights, clock, boards, sizing, epoch)
        self.parent = parent
        self.claimer = Claimer(rank, boards.slots(UPPER), epoch)
        self.batch = batch
        self.batch_age = staggered(batch_age, rank)
        self._age0 = batch_age
        self._age_mean = -1.0  # the task mean age() was last worked out for, and its answer
        self._age = 0.0
        self.up_done = RangeSet()
        self.up_results: list[tuple[int, Result]] = []
        self.up_failed: list[TaskFailure] = []
        self.up_returned = RangeSet()  # ids to give back upward (this region left, or ids it cannot use)
        self.up_tasks = 0
        self.up_busy = 0.0
        self.up_busy_sq = 0.0
        self.oldest_up = math.inf
        self.parent_final = False
        self.parent_all_out = False  # the parent's board said everything above is out ("all-out")
        self.gone = False  # every child left early: the stock went back to the parent
        self.requests = RequestTimes(quantiles=measured)  # this region-master's own claims upward
        self.refill_s = 0.0  # how long its refills take, lately (a moving mean): the stock covers it
        self._asked_at: float | None = None
        self.sent_weight = hierarchy[rank].weight  # the weight its parent sizes blocks for: the last it said
        self.shrank = False  # a child left, died or shrank: its stock may be more than the rest can use

    def reparent(self, parent: int) -> None:
        """Claim from ``parent``'s upper board from now on (the old parent died)."""
        if parent != self.parent:
            self.parent = parent
            self.claimer = Claimer(self.rank, self.boards.slots(UPPER), self.epoch)

    def stock(self) -> int:
        """Ids here not yet taken by a child: queued and on the boards."""
        return len(self.queue) + self.on_board()

    def target(self, held: bool = True) -> int:
        """Ids to keep in stock: for each board, a range for every claimer waiting on it now, and
        ``prefetch`` times what its claimers take over two refills (a quarter of the horizon at
        least), so that a claim never waits for a refill. Refills are measured as they happen:
        through two or three levels of region-masters, each noticing on its next look, they can
        take tens of milliseconds; a full horizon of stock was 20 ms of work per rank with
        millisecond tasks, which the master's own slaves did not have at the end of a job
        (simulated, 8,192 ranks, 3 levels: they ran out 25 ms before the rest).

        Per board: ids published on one board cannot serve the other's claimers (a region whose
        leaf board held enough for the total once let its sub-regions wait on an empty upper
        board while it refilled nothing). Not more: stock held here is stock other regions cannot
        have, and at the end of a job it is what keeps some ranks busy while others idle (the
        paper's prefetch is one request).

        ``held=False``: what the claimers need, without counting what is on the boards already
        (a board keeps a few ranges per claimer published, more than this once its claimers left).
        """
        s = self.sizing
        pool = self.gss_pool()
        if self.alone():
            return self.leaf_chunk(pool)  # (one range for its own loop: see shed)
        ahead = max(s.horizon / 4, 2 * self.refill_s) * s.prefetch
        total = 0
        leaf = self.owners.get(LEAF)
        if leaf is not None:
            need = self.leaf_chunk(pool) * leaf.waiting + math.ceil(self.rate[LEAF] * ahead)
            total += max(need, leaf.on_board) if held else need
        upper = self.owners.get(UPPER)
        if upper is not None and self.live[UPPER]:
            # Sub-regions claim blocks from the upper board: their demand is this region's too
            # (counting only its own slaves, a middle region kept almost nothing and every
            # sub-region's refill waited for the master).
            need = self.block(pool, self.block_weight()) * upper.waiting + math.ceil(self.rate[UPPER] * ahead)
            total += max(need, upper.on_board) if held else need
        return max(1, total)

    def alone(self) -> bool:
        """Whether no child but its own loop still claims here (every other one left or died; also
        when its own loop left too, which :meth:`everyone_left` handles first)."""
        own = self.children.get(self.rank)
        mine = 1 if own is not None and not own.left else 0
        return self.had_children and not self.live[UPPER] and self.live[LEAF] <= mine

    def live_ranks(self) -> int:
        """Ranks still computing below this region-master (its own loop included)."""
        return self.live_weight[LEAF] + self.live_weight[UPPER]

    def _gone(self, child: Child) -> None:
        super()._gone(child)
        self.shrank = True
        self.note_weight()

    def set_weight(self, rank: int, weight: int) -> None:
        before = self.live_ranks()
        super().set_weight(rank, weight)
        self._weighed(before)

    def reweigh(self, rank: int, live: int) -> None:
        before = self.live_ranks()
        super().reweigh(rank, live)
        self._weighed(before)

    def _weighed(self, before: int) -> None:
        if self.live_ranks() < before:
            self.shrank = True
        self.note_weight()

    def weight_news(self) -> bool:
        """Whether its parent should hear its live weight (it changed; a region nobody computes in leaves instead)."""
        live = self.live_ranks()
        return live != self.sent_weight and live > 0

    def relaid(self, weight: int) -> None:
        """A failure re-laid the plan: its parent sizes it for ``weight`` now, until it says otherwise."""
        self.sent_weight = weight
        self.note_weight()

    def note_weight(self) -> None:
        """Its live weight may have changed: the parent hears it with the next flush (due within :meth:`age`)."""
        if self.oldest_up == math.inf and self.weight_news():
            self.oldest_up = self.clock()

    def surplus_keep(self) -> int | None:
        """Stock to keep when what is held here is far more than its live ranks can use (None: keep it all).

        Alone (see :meth:`alone`): one range for its own loop. Else, while the parent still has
        ids: what the claimers need (without the boards' stock) or two ranges per live rank,
        whichever is more, once the stock is four times that (never in a region whose ranks all
        compute: its boards keep at most four ranges per claimer). A region whose ranks were
        drained kept its stock published for them, and its region-masters, left alone, ran it one
        task after another (simulated, 1,024 ranks, 4 levels of 8 x 4, 2-5 s tasks, the 128
        highest drained at 30 s: the job ended at 189 s against 79 s with 3 levels).
        """
        if self.alone():
            return self.target()
        if self.ends_job:
            return None  # (the end of the job: the boards' rebalancing does the rest)
        stock, live = self.stock(), self.live_ranks()
        if stock <= 8 * live:
            return None  # (keep is at least two ids a rank: the usual case, decided without the rest)
        keep = max(self.target(held=False), 2 * live * self.leaf_chunk(self.gss_pool()))
        return keep if stock > 4 * keep else None

    def shed(self, now: float) -> None:
        """Stock beyond :meth:`surplus_keep` goes back up, at once. Else a region-master whose ranks
        were drained ran its stock alone, one task after another (simulated, 8,192 ranks, 16 x 16,
        2-5 s tasks, 1,024 drained at 30 s: the job ended at 119 s with blocks of 8 ids, 106 s
        with this, 103 s with blocks of one id)."""
        if not self.shrank:
            return  # (the usual case: every child there is computes)
        keep = self.surplus_keep()
        if keep is None or self.parent_final or self.gone or self.stock() <= keep:
            return
        for kind, owner in self.owners.items():
            owner.take_back_unclaimed(self.mine(kind), lower=True)  # (no hole for its own claims)
            self._settle_owner(owner, kind, now)
        if len(self.queue) > keep:
            kept = RangeSet(self.queue.take(keep))
            if self.suspects:  # (they stay where their deaths are counted toward the quarantine)
                stay = among(self.queue, self.suspects)
                self.queue.remove_ranges(stay)
                kept.add_ranges(stay)
            self.up_returned.add_ranges(self.queue.ranges())
            self.queue = kept
            self.oldest_up = -math.inf  # (up at once: others may wait for them)

    def refill(self, now: float) -> None:
        """Claim from the parent's upper board while the stock is under target (a few tickets at most)."""
        if self.parent_final or self.gone:
            return
        self.shed(now)
        mem = self.boards(self.parent, UPPER)
        for _ in range(4):
            if self.stock() >= self.target():
                return
            if self._asked_at is None:
                self._asked_at = now
            t0 = self.clock()
            try:
                claim = self.claimer.claim(mem)
            except ConnectionError:
                return  # the parent is gone (a board reached by messages): its death is news to come
            if claim.status == "ids":
                self.queue.add(claim.start, claim.stop)
                self.requests.add_parts(now - self._asked_at, self.clock() - t0)
                if not self.parent_all_out:  # (at the end, the waits are for ids nobody has)
                    self.refill_s += 0.2 * (now - self._asked_at - self.refill_s)
                self._asked_at = None
                self.shed(now)  # (its parent sized the block for the region it was)
            elif claim.status == "final":
                self.parent_final = True
                self.ends_job = True
                return
            elif claim.status in ("all-out", "wait"):
                self.parent_all_out = claim.status == "all-out"
                self.ends_job = self.parent_all_out or self.gone
                return
            elif claim.status != "lost":
                return  # stale or closed: messages will say

    def gss_pool(self) -> int:
        """The ids guided self-scheduling divides: while the parent still has ids, the job's pool is
        upstream and a region's own small stock must not cut its ranges (it did: a region of 32
        ranks holding 20 ids handed its sub-regions one id per block, and every one of their
        ranks waited for refills); once the parent's ids are all out, its own stock."""
        if self.ends_job:
            return max(1, super().gss_pool())
        return 1 << 40

    def take_back(self, ranges: Ranges) -> None:
        if self.gone or self.parent_final:
            self.up_returned.add_ranges(ranges)
        else:
            self.queue.add_ranges(ranges)

    def _accept_done(self, done: Ranges, results: tuple[tuple[int, Result], ...], now: float) -> None:
        self.up_done.add_ranges(done)
        self.up_results.extend(results)
        if self.oldest_up == math.inf:
            self.oldest_up = now

    def task_failed(self, failure: TaskFailure) -> None:
        self.up_failed.append(failure)
        if self.oldest_up == math.inf:
            self.oldest_up = self.clock()

    def _after_report(self, report: Report, now: float) -> None:
        self.up_tasks += report.tasks
        self.up_busy += report.busy
        self.up_busy_sq += report.busy_sq

    def everyone_left(self) -> bool:
        """Whether every child has left the loop early (or died), none being left to claim here."""
        return self.had_children and not (self.live[LEAF] or self.live[UPPER])

    def flush_due(self, now: float) -> bool:
        """Whether buffered completions should go up now."""
        if not (self.up_done or self.up_failed or self.up_returned or self.up_tasks or self.weight_news()):
            return False
        if len(self.up_done) >= self.batch or self.parent_final or self.gone:
            return True
        return now >= self.flush_at()

    def age(self) -> float:
        """How long completions wait here before going up: the batch age or, for tasks longer than
        four of them, a quarter of a task (at most :data:`~nlevel.model.cost.LONG_AGE`), staggered
        alike (see :func:`~nlevel.model.cost.flush_age`). With 2-5 s tasks a region of 128 ranks
        flushed 20 times a second, two ids each: its parent's CPU, and most of a simulation's
        events, went to that."""
        mean = self.task_mean
        if mean != self._age_mean:  # (asked several times per look; the mean moves with each report)
            self._age_mean = mean
            self._age = self.batch_age * flush_age(self._age0, mean) / self._age0 if self._age0 > 0 else 0.0
        return self._age

    def flush_at(self) -> float:
        """When the buffered completions are due by age (inf: nothing buffered)."""
        if self.oldest_up == math.inf:
            return math.inf
        # Waiting for its parent, which had nothing to give: the job may be ending, and the
        # master may be waiting for exactly these completions. (Merely low on stock is not
        # that.) Once no child holds an id, nothing more is coming from below: send now;
        # until then gather the children's last reports a little longer, or the master would
        # handle one flush per child and the region would save it nothing at the end.
        # (Not "every child waits on a board": a worker fetches its next ticket while it runs
        # its last range, so that counted every child as idle, and each last report went up
        # alone: 360 reports in the last 3 ms of a 1,024-rank job, the master's CPU the limit.)
        if self.claimer.ticket < 0 or self.queue or self.on_board():
            return self.oldest_up + self.age()
        if not self.held_total:
            return self.oldest_up
        return self.oldest_up + self.age() / 8

    def flush(self, leaving: bool = False) -> Report:
        """The buffered completions as a report upward (the buffers start anew)."""
        live = self.live_ranks()
        report = Report(self.up_done.ranges(), tuple(self.up_results), self.up_returned.ranges(),
                        tuple(self.up_failed), leaving, tasks=self.up_tasks,
                        busy=self.up_busy, busy_sq=self.up_busy_sq, task_max=self.task_max,
                        weight=live if self.weight_news() else 0)
        self.sent_weight = live
        self.up_done = RangeSet()
        self.up_results = []
        self.up_failed = []
        self.up_returned = RangeSet()
        self.up_tasks = 0
        self.up_busy = 0.0
        self.up_busy_sq = 0.0
        self.oldest_up = math.inf
        return report

    def leave(self, now: float) -> Report:
        """Every child left: give the stock back and leave too."""
        self.gone = True
        self.close_boards(CLOSED, now)
        self.up_returned.add_ranges(self.queue.ranges())
        self.queue = RangeSet()
        return self.flush(leaving=True)

    @property
    def exhausted(self) -> bool:
        """The parent's board is final: the job is over (the master ends it only when every id is
        committed, so what is still here is a duplicate)."""
        return self.parent_final and not self.reconciling

    @property
    def finished(self) -> bool:
        """Parent final (or every child left), and nothing left to send up."""
        if not (self.parent_final or self.gone):
            return False
        return not self.reconciling and not (self.up_done or self.up_failed or self.up_returned)
