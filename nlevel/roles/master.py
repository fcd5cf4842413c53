"""The master: publishes the ids the ledger says are not committed, and commits completions. Pure Python.

The job is finished when the master's queue and boards are empty and no child holds an
id: everything handed out was committed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Final

from ..model.hierarchy import Hierarchy
from ..ranges import RangeSet, Ranges
from .ledger import Ledger
from .messages import TEAM_DEATH, Report, Result, TaskFailure
from .region import Region
from .server import Boards, Child, Server, Sizing

__all__ = ["Master"]


#: Tasks that failed the same way (the same traceback, whatever its message) keep their whole
#: traceback up to this many times; later ones keep their error line. A job whose every task
#: hits one bug recorded 10**6 tracebacks otherwise, in memory, in every copy to the deputy
#: and in the checkpoint.
TRACEBACKS_KEPT: Final = 10
#: Ways of failing counted at most (past it, a new way keeps no traceback either).
WAYS_KEPT: Final = 1000
#: A failure's error line is cut to this many characters.
ERROR_MAX: Final = 1000


def _way(traceback: str) -> int:
    """Where a traceback comes from: its frames without the exception's message, hashed (a count
    kept by this master only: Python's per-process hash serves)."""
    frames = [line for line in traceback.splitlines() if line.startswith("  File ")]
    return hash("\n".join(frames) if frames else traceback)


class Master(Server):
    """The root: publishes the ids the ledger says are not committed, and commits completions.

    Args:
        hierarchy, rank, weights, clock, boards, sizing, epoch: As for :class:`Server`.
        ledger: The completion record (already holding what earlier runs committed).
        retries: A task that raised runs again up to this many times.
        mirror: Keep a copy of each commit for the deputy.
    """

    ends_job = True

    #: What the master knows of the job, as opposed to of the plan's layout (children, boards,
    #: their rates): a plan switch moves all of it to the new plan's master (:meth:`take_job`).
    #: tests/unit/test_replan_state.py holds every attribute to one of the two lists.
    JOB: tuple[str, ...] = (
        "ledger", "retries", "attempts", "mirror", "mirror_done", "mirror_results", "mirror_failed",
        "mirror_timeouts", "queue", "aside", "stopped", "published_top", "task_mean", "task_max", "_tasks_seen",
        "busy_below", "deaths", "timeouts", "suspects", "quarantine", "settled", "track_settled", "unexpected",
        "reconciling", "ways")
    #: What belongs to the plan's layout: built anew for the new plan.
    LAYOUT: tuple[str, ...] = (
        "rank", "clock", "boards", "_mine", "sizing", "epoch", "children", "total_weight", "held_total", "live",
        "had_children", "live_weight", "_block_weight", "owners", "rate", "_rate_at", "_taken", "claims_seen",
        "claim_log", "served", "strangers", "carried")

    def __init__(self, hierarchy: Hierarchy, rank: int, weights: dict[int, int], clock: Callable[[], float],
                 boards: Boards, sizing: Sizing, ledger: Ledger, retries: int = 0, mirror: bool = False,
                 epoch: int = 0) -> None:
        super().__init__(hierarchy, rank, weights, clock, boards, sizing, epoch)
        self.ledger = ledger
        self.retries = retries
        self.attempts: dict[int, int] = {}
        self.mirror = mirror
        self.mirror_done = RangeSet()
        self.mirror_results: list[tuple[int, Result]] = []
        self.mirror_failed: list[TaskFailure] = []
        self.mirror_timeouts: dict[int, int] = {}  # timeouts counted since the last copy (id -> total)
        self.ways: dict[int, int] = {}  # how many failures kept a traceback, per way of failing (see _way)
        self.queue = ledger.to_hand_out()
        # Ids handed out under an earlier plan (or to a non-child) not yet committed or
        # given back: the job is not finished while any is left.
        self.carried = RangeSet()
        self.stopped = False
        self.aside = RangeSet()  # ids not handed out because of the stop

    def take_job(self, old: Master) -> None:
        """This master serves a new plan: take the job's state from ``old``'s whole; what ``old``
        handed out (its children's ids, and ids taken by ranks not yet its children) is carried
        until committed or given back."""
        for name in self.JOB:
            setattr(self, name, getattr(old, name))
        carried = old.carried.copy()
        for child in old.children.values():
            carried.add_ranges(child.held.ranges())
        for taken in old.strangers.values():
            carried.add_ranges(taken.ranges())
        self.carried = carried

    def absorb(self, old: Region) -> None:
        """This rank, a region-master until now, is the new master: its region's queue, children,
        stranger claims and buffered completions come along whole (its boards were closed)."""
        self.queue = old.queue
        self.queue.add_ranges(old.published().ranges())  # (its boards were closed: taken back)
        for r, ch in old.children.items():
            child = self.adopt_child(r, ch.weight, ch.kind)
            child.held = ch.held
            child.heard = ch.heard
            if ch.left and not child.left:
                child.left = True
                self._gone(child)
        self.held_total = sum(len(ch.held) for ch in self.children.values())
        # (Not its `settled`: what it passed up went to the master that died; the ledger decides now.)
        self.task_max, self.deaths, self.task_mean = old.task_max, old.deaths, old.task_mean
        if old.up_done:
            self.ledger.commit(old.up_done.ranges(), old.up_results)
        for f in old.up_failed:
            self.task_failed(f)
        self.take_back(old.up_returned.ranges())
        for r, taken in old.strangers.items():
            self.strangers[r] = taken
            self.held_total += len(taken)

    def gss_pool(self) -> int:
        """What is left to publish: the master's queue is every id not yet handed out.

        Ranges on a board are claimed in the order they went up, so dividing what is left
        to publish makes the last ranges the smallest. (Counting the board's stock too, a
        deep board filled mid-job with full-size ranges was the job's last ids: a rank
        could start a full range as the others ran out, and they waited for it.)
        """
        return len(self.queue)

    def stop(self, now: float) -> None:
        """Hand out nothing more: running work finishes, then everyone is released."""
        if not self.stopped:
            self.stopped = True
            for kind, owner in self.owners.items():
                owner.take_back_unclaimed(self.mine(kind))
                self._settle_owner(owner, kind, now)
            self.aside.add_ranges(self.queue.ranges())
            self.queue = RangeSet()

    def take_back(self, ranges: Ranges) -> None:
        (self.aside if self.stopped else self.queue).add_ranges(ranges)
        if self.carried:
            self.carried.remove_ranges(ranges)

    def _accept_done(self, done: Ranges, results: tuple[tuple[int, Result], ...], now: float) -> None:
        self.ledger.commit(done, results)
        if self.carried:
            self.carried.remove_ranges(done)
        if self.mirror:
            self.mirror_done.add_ranges(done)
            self.mirror_results.extend(results)

    def task_failed(self, failure: TaskFailure) -> None:
        tid = failure.id
        if failure.kind == TEAM_DEATH:  # (an orphan report's: counted here as the child's server would)
            self.requeue_lost(RangeSet.span(tid, tid + 1), failure.rank, failure.host, failure.error)
            return
        n = self.attempts[tid] = self.attempts.get(tid, 0) + 1
        if failure.kind == "raised" and n <= self.retries:
            self.take_back(((tid, tid + 1),))  # runs again, most likely on another rank
            return
        failure = self.bounded(replace(failure, attempts=max(failure.attempts, n)))
        self.ledger.fail(failure)
        if self.carried:
            self.carried.remove(tid, tid + 1)
        if self.mirror:
            self.mirror_failed.append(failure)

    def bounded(self, failure: TaskFailure) -> TaskFailure:
        """``failure`` as it is recorded: its error line cut to :data:`ERROR_MAX` characters, its
        traceback kept only for the first :data:`TRACEBACKS_KEPT` failures of its way of failing."""
        error, traceback = failure.error, failure.traceback
        if len(error) > ERROR_MAX:
            error = f"{error[:ERROR_MAX]}... ({len(error)} characters)"
        if traceback:
            way = _way(traceback)
            n = self.ways.get(way, 0)
            if n < TRACEBACKS_KEPT and (n or len(self.ways) < WAYS_KEPT):
                self.ways[way] = n + 1
            else:
                traceback = (f"(not kept: {TRACEBACKS_KEPT} tasks that failed in the same place first keep theirs)"
                             if n else f"(not kept: more than {WAYS_KEPT} ways of failing)")
        if error is failure.error and traceback is failure.traceback:
            return failure
        return replace(failure, error=error, traceback=traceback)

    def take_orphan(self, report: Report, now: float, reconciling: bool = False) -> None:
        """Completions, given-back ids and failures that arrived under an older plan.

        ``reconciling``: this new master asks every survivor what it holds, and requeues what
        nobody holds: given-back ids are left to that. Given back to the master that died, which
        may have handed some out again since, they ran twice when queued here.
        """
        self.busy_below += report.busy
        if report.done:
            self._accept_done(report.done, report.results, now)
        for f in report.failed:
            self.task_failed(f)
        if report.returned:
            self.carried.remove_ranges(report.returned)
            if reconciling:
                return
            # (given back again after the master's death, an id may have been run and committed
            # meanwhile, or failed for good: an orphan is rare, the ledger's look affordable)
            self.take_back(self.unrecorded(RangeSet(report.returned)).ranges())

    def attach(self, child: Child, held: RangeSet) -> None:
        """Record what a Holding says ``child`` holds, minus what the ledger already records.

        A survivor's Holding includes completions it sent that may have been lost; those the
        ledger has are not held by anyone (else the job would wait for them forever).
        """
        fresh = held.copy()
        fresh.remove_ranges(self.ledger.committed.ranges())
        super().attach(child, fresh)

    def accounted(self, ranges: list[tuple[int, int]]) -> bool:
        """Ids handed out under an earlier plan (carried) are held by no child of this one.

        Without this, every orphan report after a plan switch would search every child's
        holdings: quadratic in the processes at 32,768 (the simulator's slowest part).
        """
        carried = self.carried
        return all(carried.overlap(a, b) == b - a for a, b in ranges)

    def forget_recorded(self) -> None:
        """Forget queued and carried ids the ledger already records (committed, or failed for good).

        An id can become carried after its commit arrived, e.g. a dead region-master's
        hand-offs absorbed by a new master whose ledger came from the deputy's copy; and a new
        master's queue can take ids whose commits it learns only from the checkpoint file.
        """
        self.unrecorded(self.carried)
        self.unrecorded(self.queue)

    def unrecorded(self, ids: RangeSet) -> RangeSet:
        """Take out of ``ids`` (in place) what the ledger records: committed, or failed for good; return it."""
        ids.remove_ranges(self.ledger.committed.ranges())
        failed = self.ledger.failed
        if failed:
            # (one look per id of the smaller side: a failed set of thousands against a few ids given back)
            inside = [t for t in failed if ids.overlap(t, t + 1)] if len(failed) <= len(ids) else \
                [t for a, b in ids.ranges() for t in range(a, b) if t in failed]
            for tid in inside:
                ids.remove(tid, tid + 1)
        return ids

    @property
    def exhausted(self) -> bool:
        """Whether the job is over: every id committed or recorded failed (after a stop: nothing out).

        The ledger decides, not the bookkeeping of who holds what: an id run twice after a
        failure, or reported along an unexpected path, cannot hold the end back.
        """
        if self.reconciling:
            return False
        if self.stopped:
            return not (self.queue or self.held_total or self.carried or self.on_board() or self._limbo())
        return self.ledger.undecided <= 0

    @property
    def abandoned(self) -> bool:
        """Whether every child left the loop early holding nothing: the job ends here, incomplete."""
        return (bool(self.children) and not (self.live[0] or self.live[1]) and not self.held_total
                and not self.reconciling)

    @property
    def finished(self) -> bool:
        return self.exhausted or self.abandoned
