"""A computing rank's side: ids for the user's loop, claimed from its parent's leaf board. Pure Python.

The user's loop runs the ids of one claimed range at a time ("in hand"); the runtime
hands them out one per call without entering this module, and reports what ran with
:meth:`Worker.ran`. When the hand is empty, :meth:`Worker.refill` moves the next range
from the queue, or claims one from the parent's board (:class:`~nlevel.roles.board.Claimer`).
Finished ids wait in a batch until it is worth a report (``report_every`` ids, or
``report_age`` seconds, or at once when this rank finds nothing to run: the parent may be
waiting for exactly these to finish the job).

While the user's loop runs a short hand, the runtime may claim the next range into the queue
from another thread (:meth:`Worker.prefetch`): the loop's next call then finds it without a
claim on its path.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Callable, Final

from ..ranges import RangeSet, Ranges
from ..stats import RequestTimes, Summary
from .board import Claim, Claimer, Memory
from .messages import Report, Result, TaskFailure

__all__ = ["Worker", "State", "staggered", "TIMED_ONE_BY_ONE", "PREFETCH_SPAN"]

#: A rank claims its next range ahead (:meth:`Worker.prefetch_due`) only while its hand holds at
#: most this much work (s, from its mean task time). A claim is a few hundred microseconds of the
#: path between two tasks on an oversubscribed node, worth taking off that path when the hand is
#: tens of milliseconds (4 ranks under ULFM on 2 cores, 1,200 x [2, 5] ms: the calls summed over
#: the ranks 85 -> 71 ms). Not for longer hands: a claim is then under 0.4 % of the hand, and the
#: range claimed ahead waits in this rank's queue while another rank could run it (the job's end).
#: A task in hand that runs longer than this gives the range back (:meth:`Worker.give_back`): its
#: hand was expected to take less, and a range must not wait behind a task of unknown length.
PREFETCH_SPAN: Final = 0.1

#: Tasks shorter than this (s) on average are summarised by their mean: adding each to the
#: task-time sketch (about 1.5 us a value) would cost more than 1 % of their time.
TIMED_ONE_BY_ONE: Final = 1.5e-4


class State(str, Enum):
    """Where a worker's user loop stands."""

    RUN = "run"  # ids in hand or queued
    WAIT = "wait"  # nothing published for its ticket yet (or its parent is switching plans)
    END = "end"  # no id will ever come
    LEFT = "left"  # the user's loop left early


def staggered(age: float, rank: int) -> float:
    """``age`` spread over ``[age / 2, 3 age / 2)`` by rank (the golden-ratio sequence).

    Every rank starts at the same moment; with one batch age they would all report
    together, every ``age`` seconds, and their parent would take each wave as one burst.
    """
    return age * (0.5 + (rank * 0.6180339887498949) % 1.0)


class Worker:
    """Ids for one rank's user loop.

    Args:
        rank: This rank (its marker on the board).
        parent: The rank whose leaf board it claims from (itself, for a server that computes).
        slots: Ring size of the parent's leaf board.
        report_every: Report finished ids once this many are batched ...
        report_age: ... or once the oldest has waited about this many seconds (:func:`staggered` by rank).
        clock: Returns seconds (times the claims).
    """

    def __init__(self, rank: int, parent: int, slots: int, report_every: int = 256, report_age: float = 0.05,
                 clock: Callable[[], float] | None = None, measured: bool = True) -> None:
        self.rank = rank
        self.clock = clock
        self.parent = parent
        self.claimer = Claimer(rank, slots)
        self.report_every = report_every
        self.report_age = staggered(report_age, rank)
        self.queue = RangeSet()  # claimed, not yet in hand
        self.hand: tuple[int, int] | None = None  # the range the user's loop runs now
        self.done = RangeSet()  # finished, not yet reported
        self.results: list[tuple[int, Result]] = []
        self.failed: list[TaskFailure] = []
        self.oldest = math.inf  # when the oldest unreported completion was recorded
        self.state = State.RUN
        self.task_times = Summary(quantiles=measured)  # (not measured: moments only, for huge simulated runs)
        self.tasks = 0  # tasks since the last report, their seconds, and the sum of their squares
        self.busy = 0.0
        self.busy_sq = 0.0
        self.claims: RequestTimes | None = RequestTimes() if measured else None  # (the simulator times claims itself)
        self.wait_started: float | None = None  # since when the user's loop has been waiting for ids
        self.all_out = False  # the parent's board said everything is out (its last claim: "all-out")
        self.reports = 0  # reports sent up so far
        # A suspect id in hand (its range's end, 0: none): once it has run, the batch goes up at
        # once (see board.SUSPECT), so that a death of this process after it does not count against it.
        self.suspect_until = 0
        self.report_now = False
        self.queued_suspect = 0  # the end of a suspect range claimed ahead (0: none)
        self.widest = 0  # ids in the largest range claimed so far, and in the last one
        self.last_width = 0

    # -- the user's loop ------------------------------------------------------------------
    def ran(self, done: Ranges, results: tuple[tuple[int, Result], ...], failed: tuple[TaskFailure, ...],
            tasks: int, busy: float, longest: float, now: float, busy_sq: float = 0.0,
            times: tuple[float, ...] = ()) -> None:
        """Record what the user's loop finished; the hand shrinks past it.

        ``times``: each task's seconds, when known one by one; the task-time summary then holds
        each (its quantiles: a heavy tail shows), unless the tasks are too short for their timing
        to matter (:data:`TIMED_ONE_BY_ONE`).
        """
        if done:
            if len(done) == 1:
                a, last = done[0]
                self.done.add(a, last)
            else:
                self.done.add_ranges(done)
                last = max(b for _, b in done)
        else:
            last = 0
        if results:
            self.results.extend(results)
        if failed:
            self.failed.extend(failed)
            last = max(last, max(f.id for f in failed) + 1)
        if done or failed:
            if self.oldest == math.inf:
                self.oldest = now
            hand = self.hand
            if hand is not None:
                # What ran came from the front of the hand; the rest is still to run.
                self.hand = (last, hand[1]) if last < hand[1] else None
            if self.suspect_until and last >= self.suspect_until:
                self.suspect_until = 0
                self.report_now = True
        if tasks:
            self.tasks += tasks
            self.busy += busy
            if times and busy >= TIMED_ONE_BY_ONE * tasks:
                add = self.task_times.add
                sq = 0.0
                for t in times:
                    add(t)
                    sq += t * t
                self.busy_sq += sq
            else:
                self.busy_sq += busy_sq if busy_sq > 0 else busy * busy / tasks
                if tasks == 1:
                    self.task_times.add(busy)
                else:
                    self.task_times.add_many(busy / tasks, tasks, longest)

    def refill(self, mem: Memory | None, now: float) -> Claim | None:
        """Put the next range in hand: from the queue, else claimed from the parent's board.

        Returns the claim made (None when the queue had ids or no board was given). The
        caller reads :attr:`hand` and :attr:`state`.
        """
        if self.hand is not None:
            return None
        if self.queue:
            hand = self.hand = self.queue.pop_range()
            if self.queued_suspect and hand[0] < self.queued_suspect <= hand[1]:
                self.suspect_until = hand[1]
                self.queued_suspect = 0
            self.state = State.RUN
            return None
        if mem is None or self.state in (State.END, State.LEFT):
            return None
        if self.wait_started is None:
            self.wait_started = now
        clock = self.clock
        t0 = clock() if clock is not None else now
        claim = self.claimer.claim(mem)
        status = claim.status
        if status == "ids":
            t1 = clock() if clock is not None else now
            self.hand = (claim.start, claim.stop)
            self._claimed(claim.stop - claim.start)
            self.state = State.RUN
            if claim.suspect:
                self.suspect_until = claim.stop
            if self.claims is not None:
                self.claims.add_parts(t1 - self.wait_started, t1 - t0)
            self.wait_started = None
        elif status == "final":
            self.state = State.END
            self.wait_started = None
        elif status != "lost":  # "wait", "all-out", "closed", "stale": try again after the next look at messages
            self.state = State.WAIT
        self.all_out = status == "all-out"
        return claim

    def prefetch_due(self) -> bool:
        """Whether to claim the next range now, while the user's loop runs its hand.

        Only for a short hand (at most :data:`PREFETCH_SPAN` of work, once a task time is known:
        before, a single id may be hours), and not once ranges narrow (the servers cut them as
        their stock runs low: the end of the job, where a range held ahead idles another rank).
        """
        hand = self.hand
        if hand is None or self.queue or self.state is not State.RUN or self.all_out:
            return False
        times = self.task_times
        return times.n > 0 and times.mean * (hand[1] - hand[0]) <= PREFETCH_SPAN and self.last_width >= self.widest

    def prefetch(self, mem: Memory, now: float) -> Claim:
        """Claim the next range into the queue (see :meth:`prefetch_due`); return the claim.

        Only a claim that gives ids changes the worker (a ticket that finds nothing published
        is kept, as in :meth:`refill`, which claims again when the hand is done).
        """
        clock = self.clock
        t0 = clock() if clock is not None else now
        claim = self.claimer.claim(mem)
        status = claim.status
        if status == "ids":
            self.queue.add(claim.start, claim.stop)
            self._claimed(claim.stop - claim.start)
            if claim.suspect:
                self.queued_suspect = claim.stop
            if self.claims is not None:
                took = (clock() if clock is not None else now) - t0
                self.claims.add_parts(took, took)  # (nobody waited for it)
        elif status == "all-out":
            self.all_out = True
        return claim

    def give_back(self, now: float) -> Report:
        """The range claimed ahead goes back to the parent (the task in hand runs long); the report to send."""
        back = self.queue.ranges()
        self.queue = RangeSet()
        self.queued_suspect = 0
        return self.report(now, returned=back)

    def _claimed(self, width: int) -> None:
        self.last_width = width
        if width > self.widest:
            self.widest = width

    def leave(self, unstarted: Ranges, now: float) -> Report:
        """The user's loop left early: everything not run goes back; the report to send."""
        self.state = State.LEFT
        back = self.queue
        back.add_ranges(unstarted)
        if self.hand is not None:  # (the loop runs its hand in pieces: what it had not started of it)
            back.add(*self.hand)
        self.queue = RangeSet()
        self.queued_suspect = 0
        self.hand = None
        return self.report(now, returned=back.ranges(), leaving=True)

    # -- reporting -----------------------------------------------------------------------------
    def report_due(self, now: float) -> bool:
        """Whether the batch of finished ids should go to the parent now."""
        if not (self.done or self.failed or self.tasks):
            return False
        if self.state is not State.RUN or self.report_now:
            return True  # nothing to run here: the parent may wait for these to end the job (or a suspect ran)
        # While ids keep coming, completions wait for a batch (they are not on the grant path):
        # a parent's load is its children's reports, not their claims.
        return len(self.done) >= self.report_every or now - self.oldest >= self.report_age

    def report(self, now: float, returned: Ranges = (), leaving: bool = False) -> Report:
        """The batch as a report (and the batch starts anew)."""
        times = self.task_times
        report = Report(self.done.ranges(), tuple(self.results), returned, tuple(self.failed), leaving,
                        tasks=self.tasks, busy=self.busy, busy_sq=self.busy_sq, task_max=times.hi if times.n else 0.0)
        self.done = RangeSet()
        self.results = []
        self.failed = []
        self.oldest = math.inf
        self.report_now = False
        self.tasks = 0
        self.busy = 0.0
        self.busy_sq = 0.0
        self.reports += 1
        return report

    def holding(self) -> RangeSet:
        """Every id this worker holds: queued, in hand, finished or failed but not yet reported."""
        held = self.queue.copy()
        held.add_ranges(self.done.ranges())
        if self.hand is not None:
            held.add(*self.hand)
        for f in self.failed:
            held.add(f.id, f.id + 1)
        return held

    def reparent(self, parent: int, slots: int, epoch: int) -> None:
        """Claim from ``parent``'s board in ``epoch`` from now on (a plan change, or the old parent died)."""
        c = self.claimer
        if parent != self.parent or c.slots != slots or c.epoch != epoch:
            self.all_out = False
            self.parent = parent
            self.claimer = Claimer(self.rank, slots, epoch)  # (a ticket on the old board is given up)
        if self.state is State.WAIT:
            self.state = State.RUN
