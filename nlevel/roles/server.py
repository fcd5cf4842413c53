"""The servers: the master and the region-masters, as state machines around their boards. Pure Python.

A server holds a queue of ids and publishes them on its boards (see
:mod:`nlevel.roles.board`): a *leaf* board for the ranks that compute (its slaves,
and itself when it computes) and an *upper* board for the region-masters below it.
It never answers a request: its children take ids one-sidedly. What it does, when the
loop ticks or a report arrives:

* **scan** its boards: who took which ids (``held`` per child: exactly what must be taken
  back if that child dies); tickets fetched but never swapped are taken back after a
  grace period;
* **refill** (a region-master): claim blocks from its parent's upper board before its
  own stock runs low, sized to what its region consumes (the paper's prefetch);
* **publish** from its queue: ranges sized from the task time (``chunk_target``) and
  cut by guided self-scheduling (a child of weight ``w`` gets at most
  ``available * w / (2 * total_weight)``, ``available`` from :meth:`Server.gss_pool`), so that
  the last ids spread over everyone;
* take **reports**: completions (the master commits them to the
  :class:`~nlevel.roles.ledger.Ledger`; a region-master forwards them upward in
  batches), ids given back, tasks that failed.

:class:`~nlevel.roles.master.Master` and :class:`~nlevel.roles.region.Region` are the two
kinds of server.
"""

from __future__ import annotations

import math
from typing import Callable, Final

from ..model.cost import CHUNK_TARGET, HORIZON, auto_ids
from ..model.hierarchy import Hierarchy
from ..ranges import RangeSet, Ranges, Tally
from .board import MAX_LEN, Boards, Memory, Owner
from .messages import TEAM_DEATH, Report, Result, TaskFailure
from .child import Child
from .suspects import among, isolate

__all__ = ["LEAF", "UPPER", "Boards", "Child", "Server", "Sizing"]

#: Board kinds: claimed by ranks that compute, and by region-masters.
LEAF: Final = 0
UPPER: Final = 1

#: A fetched ticket not swapped after this long (s) is taken back: its claimer died between its
#: two atomic operations, or gave the ticket up (a live one swaps within microseconds).
LIMBO_GRACE: Final = 0.05

#: A block holds, once task times are known, at least the least of: ``BLOCK_FLOOR`` ids, an id per
#: four ranks of the child, what they run in ``BLOCK_SPAN`` seconds (see :meth:`Server.block`).
BLOCK_FLOOR: Final = 8
BLOCK_SPAN: Final = 1.0


class Sizing:
    """How big a published range is, and how many to keep on a board. Shared by every server of a farm.

    Args:
        chunk: Ids per leaf range (0: automatic, from the task time).
        chunk_target: Automatic ranges aim at this much work (s).
        max_chunk: Largest automatic range.
        prefetch: A region-master keeps this many refills' worth of ids in stock.
        horizon: Seconds of consumption a board keeps published (so that claimers do not
            find it empty between two of its owner's ticks).
        ids_per_proc: The job's ids per process (caps automatic ranges; None: no cap).
    """

    def __init__(self, chunk: int = 0, chunk_target: float = CHUNK_TARGET, max_chunk: int = 256,
                 prefetch: float = 2.0, horizon: float = HORIZON, ids_per_proc: float | None = None) -> None:
        self.ids_per_proc = ids_per_proc
        self.chunk = chunk
        self.chunk_target = chunk_target
        self.max_chunk = max_chunk
        self.prefetch = prefetch
        self.horizon = horizon


class Server:
    """What the master and region-masters share: children, queue, boards.

    Args:
        hierarchy: The laid-out plan (for which child claims from which board).
        rank: This rank.
        weights: Ranks that compute under each child (this rank itself, weight 1, when it computes).
        clock: Returns seconds.
        boards: This farm's boards.
        sizing: Range sizes.
        epoch: The plan epoch the boards serve.
    """

    #: Whether an empty queue means the whole job's ids are out (ALL_OUT on the boards): the
    #: master's always; a region's once its parent's board said so (see :class:`Region`).
    ends_job = False

    def __init__(self, hierarchy: Hierarchy, rank: int, weights: dict[int, int], clock: Callable[[], float],
                 boards: Boards, sizing: Sizing, epoch: int = 0) -> None:
        self.rank = rank
        self.clock = clock
        self.boards = boards
        self._mine: dict[int, Memory] = {}  # kind -> this rank's own board (see mine)
        self.sizing = sizing
        self.epoch = epoch
        self.queue = RangeSet()
        self.published_top = 0  # every id published here is below this (the queue hands out its smallest ids)
        self.children: dict[int, Child] = {}
        self.total_weight = 0
        self.held_total = 0
        self.live = [0, 0]  # children of each board kind (LEAF, UPPER) still in the loop
        self.had_children = False
        self.live_weight = [0, 0]
        self._block_weight = 1  # see block_weight(): worked out again when a sub-region's weight changes
        self.owners: dict[int, Owner] = {}
        for r, w in weights.items():
            kind = UPPER if r != rank and hierarchy[r].children else LEAF
            self._add_child(r, w, kind)
        self.unexpected = 0  # ids reported done that the child was not holding
        self.task_mean = 0.0  # mean task time reported from below (s): sizes the ranges
        self.task_max = 0.0  # longest task reported from below (s): leases follow it
        self.busy_below = 0.0  # seconds of tasks reported from below, in all (the progress line's measured overhead)
        self._tasks_seen = 0
        self.rate = [0.0, 0.0]  # ids taken per second from each board (by kind: lists, not dicts, on a hot path)
        self._rate_at = clock()
        self._taken = [0, 0]
        self.claims_seen = 0  # claims attributed (the planner counts arrivals from it)
        self.claim_log: list[float] | None = None  # when set (sampling), the time of each scan's claims
        self.served = 0  # ranges taken by children
        # Fault tolerance.
        self.settled = RangeSet()  # ids reported finished or given back without being held
        self.track_settled = False
        self.deaths = Tally()  # processes that died holding each id (ranges: a region-master held 10^8)
        self.timeouts: dict[int, int] = {}  # id -> times a rank holding it ran past --task-timeout
        # Ids a computing rank held when it died or ran past --task-timeout: published one per
        # range from now on, so that the next death (or timeout) holding one names it alone.
        self.suspects = RangeSet()
        self.quarantine = 3
        self.reconciling = False
        # Ids taken from these boards by ranks that are not children (yet): a rank that learnt of
        # a failure before this one did and claims from its new parent. Adopted with the child;
        # requeued if it dies first.
        self.strangers: dict[int, RangeSet] = {}

    # -- children -------------------------------------------------------------------------
    def _add_child(self, rank: int, weight: int, kind: int) -> Child:
        child = self.children[rank] = Child(rank, weight, kind)
        self.had_children = True  # (a region-master whose children all died or left gives its stock back)
        child.heard = self.clock()
        self.total_weight += weight
        self.live[kind] += 1
        self.live_weight[kind] += weight
        if kind == UPPER:
            self._size_blocks()
        if kind not in self.owners:
            owner = self.owners[kind] = Owner(self.boards.slots(kind))
            owner.start(self.mine(kind), self.epoch)
        return child

    def drop_child(self, rank: int) -> RangeSet:
        """Forget a dead child; return the ids it held (the caller requeues or reconciles them)."""
        self.scan(self.clock(), full=True)
        child = self.children.pop(rank)
        self.held_total -= len(child.held)
        self.total_weight = max(0, self.total_weight - (child.weight - child.gone_weight))
        if not child.left:
            self._gone(child)
        return child.held

    def child_left(self, child: Child) -> None:
        """``child`` left the loop early: it claims no more here."""
        if not child.left:
            child.left = True
            self._gone(child)

    def _gone(self, child: Child) -> None:
        """``child`` claims no more (it left, or died)."""
        self.live[child.kind] -= 1
        self.live_weight[child.kind] -= child.weight - child.gone_weight
        if child.kind == UPPER:
            self._size_blocks()

    def adopt_child(self, rank: int, weight: int, kind: int, held: RangeSet | None = None) -> Child:
        """Take a new child (after a failure re-laid the hierarchy), optionally holding ``held``."""
        child = self.children.get(rank)
        if child is None:
            child = self._add_child(rank, weight, kind)
        taken = self.strangers.pop(rank, None)
        if taken:
            self.held_total += child.held.add_ranges(taken.ranges()) - len(taken)
        if held:
            self.attach(child, held)
        return child

    def drop_stranger(self, rank: int) -> RangeSet:
        """Forget what a rank that is not a child took here (it died); return those ids."""
        taken = self.strangers.pop(rank, None) or RangeSet()
        self.held_total -= len(taken)
        return taken

    def attach(self, child: Child, held: RangeSet) -> None:
        """Record that ``child`` holds ``held`` (from a Holding), minus ids already settled."""
        fresh = held.copy()
        if self.settled:
            fresh.remove_ranges(self.settled.ranges())
        before = len(child.held)
        child.held.add_ranges(fresh.ranges())
        self.held_total += len(child.held) - before

    def set_weight(self, rank: int, weight: int) -> None:
        """A child's subtree changed size (a failure re-laid the plan); what it said had left stays gone."""
        child = self.children[rank]
        gone = min(child.gone_weight, max(0, weight - 1))
        change = (weight - gone) - (child.weight - child.gone_weight)
        self.total_weight += change
        if not child.left:
            self.live_weight[child.kind] += change
        child.weight, child.gone_weight = weight, gone
        if child.kind == UPPER:
            self._size_blocks()

    def reweigh(self, rank: int, live: int) -> None:
        """Sub-region ``rank`` says ``live`` of its ranks still compute (the others left or died)."""
        child = self.children[rank]
        gone = max(0, child.weight - live)
        change = child.gone_weight - gone
        child.gone_weight = gone
        self.total_weight += change
        if not child.left:
            self.live_weight[child.kind] += change
        if change and child.kind == UPPER:
            self._size_blocks()

    def _size_blocks(self) -> None:
        live = [(c.weight - c.gone_weight, c.weight) for c in self.children.values() if c.kind == UPPER and not c.left]
        some = [w for w, planned in live if 2 * w >= planned] or [w for w, _ in live]
        self._block_weight = max(1, min(some)) if some else 1

    def block_weight(self) -> int:
        """The weight a block on the upper board is sized for: the smallest live sub-region's.

        One board serves every sub-region, and any may take any block. The master of a deep
        tree serves its level-1 regions (hundreds of ranks each) and the leaf regions of its
        own subtree (tens): blocks sized for the mean went to the small ones too, each of which
        then held several tasks per rank at the end of the job while the rest of the job idled
        (8,192 ranks, 4 levels, 2-5 s tasks: 25 % overhead, against 4 % with this). A large
        region claims more blocks instead. Sub-regions that lost over half their ranks (drained)
        count only when all did: sized for one, every sibling's block was one id, a refill per
        task; what a drained one cannot use it sends back (``Region.shed``).
        """
        return self._block_weight

    def requeue_lost(self, ids: RangeSet, rank: int = -1, host: str = "", how: str = "",
                     count: bool = True, in_flight: bool = True, judge: bool = False) -> tuple[int, list[int]]:
        """Ids held by a process that died: queue them again; return (requeued, quarantined ids).

        An id held by ``quarantine`` processes that died is not run again: it is recorded
        failed (a task that kills its process would otherwise kill every rank in turn), with
        kind ``"timeout"`` when a rank holding it ran past ``--task-timeout``, else ``"died"``.
        ``rank``, ``host`` and ``how``: the last death, for that record.
        ``count=False``: the ids were not in flight (a dead master's queue): no death counts.
        ``in_flight=False``: a server died holding them, most of them stock that never ran: the
        death counts, but quarantines nothing by itself; the ids it brings to the limit go out
        alone from now on (suspects), and the next death holding one decides.
        ``judge``: no death counts (it was counted already), but ids at their quarantine are not run again.
        """
        quarantined: list[int] = []
        if (count or judge) and ids:
            held = ids.ranges()
            if count:
                self.deaths.add(held)
            over = self.deaths.at_least(self.quarantine, held)
            if over and not in_flight:
                self.suspects.add_ranges(over.ranges())
            elif over:
                quarantined = list(over)
        for tid in quarantined:
            ids.remove(tid, tid + 1)
            n, late = self.deaths.count(tid), self.timeouts.get(tid, 0)
            why = f"quarantined: held by {n} processes that died" + (f", {late} of them past --task-timeout" if late
                                                                     else "")
            if how:
                why += f" (the last: {how})"
            self.task_failed(TaskFailure(tid, "timeout" if late else "died", why, rank, host, attempts=n))
        self.take_back(ids.ranges())
        return len(ids), quarantined

    def overdue(self, now: float, lease: float) -> list[int]:
        """Children not heard from (a claim, a report, a heartbeat) for ``lease`` seconds: hung processes.

        Each is returned once (it is then being killed). Every live rank beats whatever its task
        does (see :mod:`nlevel.roles.watch`), so a task of any length never expires a lease.
        """
        late = []
        for child in self.children.values():
            if child.rank == self.rank or child.leased:
                continue
            if now - child.heard > lease:
                child.leased = "lease expired (hung)"
                late.append(child.rank)
        return late

    # -- the boards -----------------------------------------------------------------------
    def mine(self, kind: int) -> Memory:
        """This rank's own board of ``kind`` (asked of :attr:`boards` once: a rank's memory stays put)."""
        mem = self._mine.get(kind)
        if mem is None:
            mem = self._mine[kind] = self.boards(self.rank, kind)
        return mem

    def scan(self, now: float, full: bool = False) -> None:
        """Attribute what children took from the boards; take back limbo past its grace (see :meth:`Owner.scan`)."""
        for kind, owner in self.owners.items():
            mem = self.mine(kind)
            owner.scan(mem, now, full)
            owner.reclaim(mem, now - LIMBO_GRACE)
            self._settle_owner(owner, kind, now)

    def _settle_owner(self, owner: Owner, kind: int, now: float) -> None:
        if owner.claimed:
            children = self.children
            n = 0
            for rank, a, b in owner.claimed:
                child = children.get(rank)
                n += 1
                if child is None:
                    self.held_total += self.strangers.setdefault(rank, RangeSet()).add(a, b)
                    continue
                self.held_total += child.held.add(a, b)  # (a Holding may have named them already)
                child.heard = now
                self._taken[kind] += b - a
            self.claims_seen += n
            self.served += n
            if self.claim_log is not None:
                self.claim_log.extend([now] * n)
            owner.claimed.clear()
        if owner.returned:
            self.take_back(tuple(owner.returned))
            owner.returned.clear()
        dt = now - self._rate_at
        if dt >= 0.01:
            for k in (LEAF, UPPER):
                inst = self._taken[k] / dt
                self.rate[k] = inst if not self.rate[k] else 0.7 * self.rate[k] + 0.3 * inst
                self._taken[k] = 0
            self._rate_at = now

    def on_board(self) -> int:
        """Ids published and not yet taken, on all boards (as of the last scan)."""
        return sum(o.on_board for o in self.owners.values())

    def _limbo(self) -> bool:
        return any(o.limbo for o in self.owners.values())

    def gss_pool(self) -> int:
        """The ids guided self-scheduling divides: what this server holds, on its boards or not."""
        return len(self.queue) + self.on_board()

    def leaf_chunk(self, available: int) -> int:
        """Ids per leaf range now: from the task time, cut by guided self-scheduling."""
        s = self.sizing
        base = s.chunk or (auto_ids(self.task_mean, s.chunk_target, s.max_chunk, s.ids_per_proc)
                           if self._tasks_seen else 1)
        share = math.ceil(available / (2 * max(1, self.total_weight)))
        return max(1, min(min(base, share), MAX_LEN))  # (two-argument min and max compile to plain code)

    def block(self, available: int, weight: int) -> int:
        """Ids per upper range (a region-master's refill) for a child of ``weight``.

        What the child's ranks run in half a horizon, once task times are known (a range per
        rank before: with tasks of seconds, a task per rank in every block, and regions that took
        the last blocks ran a task-time after the others had nothing). Not more: at the end of a
        job the last blocks are what some regions run while others idle (simulated, 8,192 ranks,
        4 levels, 2-5 ms: 6.1 % with four horizons, 4.6 % with one, 3.8 % with a half).

        Not under the least of :data:`BLOCK_FLOOR` ids, an id per four ranks and what the ranks run
        in ``BLOCK_SPAN``: with tasks of seconds every block was one id, a refill per task at every
        level (simulated, 8,192 ranks, 16 x 16, 2-5 s: 716,000 events for 163,840 tasks, now 416,000).
        Not more for long tasks: a region drained whole ran its stock alone (see ``Region.shed``).
        """
        s = self.sizing
        chunk = self.leaf_chunk(available)
        if self._tasks_seen and self.task_mean > 0:
            want = max(max(chunk, math.ceil(weight * s.horizon / (2 * self.task_mean))),
                       min(min(BLOCK_FLOOR, math.ceil(weight / 4)), math.ceil(weight * BLOCK_SPAN / self.task_mean)))
        else:
            want = chunk * weight
        share = math.ceil(available * weight / (2 * max(1, self.total_weight)))
        return max(1, min(min(want, share), MAX_LEN))

    def publish(self, now: float) -> None:
        """Keep each board stocked from the queue (a few ticks' consumption, at least a range per claimer).

        Ranges sitting on a board whose claimers all left, or while claimers of the other
        board wait with the queue empty (the end of a job), are taken back and published
        where they are wanted.
        """
        self._rebalance(now)
        queue = self.queue
        if self.ends_job:
            for kind, o in self.owners.items():
                if not o.ended:
                    o.set_all_out(self.mine(kind), not queue)
        if not queue:
            return
        available = self.gss_pool()
        owners = self.owners
        ending = self.ends_job and available <= 2 * self.total_weight
        for kind in (LEAF, UPPER):
            owner = owners.get(kind)
            if owner is None or owner.ended or not queue:
                continue
            claimers = self.live[kind]
            if not claimers:
                continue
            # Enough ranges that every claimer finds one more after taking one, and enough for
            # what the board's claimers take over the horizon (the owner's tick period, a few times).
            if kind == LEAF:
                size = self.leaf_chunk(available)
                depth = max(4 * claimers, math.ceil(self.rate[LEAF] * self.sizing.horizon / size))
            else:
                weight = self.block_weight()
                size = self.block(available, weight)
                depth = max(2 * claimers, math.ceil(self.rate[UPPER] * self.sizing.horizon / size))
            want = min(owner.room(), depth + owner.waiting - owner.unclaimed_slots)
            if kind == LEAF and ending and UPPER in owners:
                # The end: nothing more comes from above, and fewer ids are left than two per rank
                # below. One range per own slave on the leaf board, the rest for the sub-regions:
                # a leaf board kept four per slave, which the sub-regions' ranks waited for (taken
                # back when they starved, then published on the leaf board again first). Not a
                # share by ranks: the sub-regions hold stock of their own, and the master's own
                # slaves ran out 30 ms before the end of a 2-5 ms job.
                want = min(want, claimers - owner.unclaimed_slots)
            if want <= 0:
                continue
            kept: Ranges = ()
            if kind == UPPER and self.suspects and self.live[LEAF]:
                # A block goes to a sub-region, which does not know what is suspect here and would
                # hand a suspect out with its neighbours (each death then counted against them too,
                # and ids that never ran quarantined with it): suspects stay for the leaf board,
                # one per range (with no claimer there, they go up as before).
                kept = among(queue, self.suspects)
                queue.remove_ranges(kept)
            ranges = queue.take_pieces(size, want)
            if kept:
                queue.add_ranges(kept)
            alone: tuple[int, ...] = ()
            if ranges and kind == LEAF and self.suspects:
                ranges = self._isolate(ranges, want)
                suspects = self.suspects
                alone = tuple(a for a, b in ranges if b == a + 1 and a in suspects)
            if ranges:
                if self.settled:
                    # Out again (ids given back, requeued): a holder's death must bring them back
                    # again. Left settled, the reconciliation after it took them for nobody's: lost.
                    self.settled.remove_ranges(ranges)
                if ranges[-1][1] > self.published_top:
                    self.published_top = ranges[-1][1]
                owner.publish(self.mine(kind), list(ranges), alone)

    def count_timeouts(self, timeouts: dict[int, int]) -> None:
        """Count the ``--task-timeout`` give-ups of earlier runs (id -> times): as timeouts, as
        deaths toward the quarantine, and as suspects."""
        for tid, k in timeouts.items():
            self.timeouts[tid] = max(k, self.timeouts.get(tid, 0))
            self.deaths.set_at_least(tid, k)
            self.suspects.add(tid, tid + 1)

    def _isolate(self, ranges: Ranges, most: int) -> Ranges:
        """``ranges`` with every suspect id in a range of its own (see :mod:`.suspects`); at most
        ``most`` ranges, the rest back to the queue."""
        return isolate(ranges, self.suspects, most, self.queue)

    def _rebalance(self, now: float) -> None:
        # Stock moves to the board whose claimers starve only once nothing more comes from above
        # (before, the refill serves them). Else a middle region took its leaf board back on every
        # look while a sub-region waited and published it there again, leaving holes its ranks lost
        # claims in (4,096 ranks, 4 levels, 2-5 s: 865,000 ranges taken back for 81,920 tasks).
        owners = self.owners
        if not owners:
            return
        live = {k: self.live[k] > 0 for k in owners}
        starving = self.ends_job and not self.queue and any(o.waiting for k, o in owners.items() if live[k])
        for kind, owner in owners.items():
            if owner.ended or not owner.unclaimed_slots:
                continue
            if not live[kind] or (starving and not owner.waiting):
                owner.take_back_unclaimed(self.mine(kind))
                self._settle_owner(owner, kind, now)

    def close_boards(self, flags: int, now: float) -> None:
        """Raise ``flags`` on every board and take back what is still published (see :meth:`Owner.close`)."""
        for kind, owner in self.owners.items():
            owner.close(self.mine(kind), flags, now)
            self._settle_owner(owner, kind, now)

    # -- reports -------------------------------------------------------------------------------
    def on_report(self, src: int, report: Report, now: float) -> None:
        """A child's report: completions, returned ids, failures, leaving."""
        self.scan(now)  # what the child took before reporting is attributed first
        child = self.children.get(src)
        if child is None:
            # Not a child (yet, or any more): its completions still count; what it took here is
            # tracked among the strangers.
            child = Child(src, 0, LEAF)
            child.held = self.strangers.get(src) or RangeSet()
        elif report.done:
            unheld = [(a, b) for a, b in report.done if child.held.overlap(a, b) != b - a]
            if unheld and not self.accounted(unheld):
                self.scan(now, full=True)  # a claim the quick look missed (a ticket the ring lapped)
        child.heard = now
        if report.tasks:
            child.running = 0.0  # (what ran is in busy_below now; its next heartbeat says what runs)
        if report.weight > 0 and child.kind == UPPER:  # (a stranger is a LEAF child)
            self.reweigh(src, report.weight)  # (its ranks left or died)
        if report.task_max > self.task_max:
            self.task_max = report.task_max
        self.busy_below += report.busy
        if report.tasks:
            n = self._tasks_seen + report.tasks
            mean = report.busy / report.tasks
            self.task_mean += (mean - self.task_mean) * report.tasks / n
            self._tasks_seen = min(n, 10_000)  # (a moving mean: tasks may change over a job)
        strays: list[tuple[int, int]] = []  # done ranges the child was not (wholly) holding
        for a, b in report.done:
            removed = child.held.remove(a, b)
            self.held_total -= removed
            if removed < b - a:
                self.unexpected += (b - a) - removed
                strays.append((a, b))
            if removed < b - a or self.track_settled:
                self.settled.add(a, b)
        if report.done:
            if self.track_settled or (strays and not self.accounted(strays)):
                # After failures a Holding may have named these as held by another child too
                # (a completion passed on, or an id run twice), and after a plan switch a rank
                # that was a child under the old plan may still be listed with them: nobody
                # holds them now (else its lease would expire on ids long done).
                for other in self.children.values():
                    if other is not child and other.held:
                        self.held_total -= other.held.remove_ranges(report.done)
            self._accept_done(report.done, report.results, now)
        for a, b in report.returned:
            removed = child.held.remove(a, b)
            self.held_total -= removed
            if removed < b - a or self.track_settled:
                self.settled.add(a, b)
        if report.returned:
            self.take_back(report.returned)
        for f in report.failed:
            self.held_total -= child.held.remove(f.id, f.id + 1)
            if self.track_settled:
                self.settled.add(f.id, f.id + 1)
            if f.kind == TEAM_DEATH:
                # A process of the child's team died running it: that attempt is a death (toward
                # quarantine, as if the child had died holding it), and the id runs again.
                self.requeue_lost(RangeSet.span(f.id, f.id + 1), f.rank, f.host, f.error)
            else:
                self.task_failed(f)
        if report.leaving and src in self.children:
            self.child_left(child)
        self._after_report(report, now)

    # -- what the master and the regions do differently ----------------------------------------
    def accounted(self, ranges: list[tuple[int, int]]) -> bool:
        """Whether ids a child reported without holding them are known to be held by no child here.

        A region knows no such ids; the master knows the ids handed out under an earlier plan
        (``carried``), which no child of the current plan can hold.
        """
        return False

    def take_back(self, ranges: Ranges) -> None:
        """Ids given back (unstarted, or taken back from a board): queue them again."""
        self.queue.add_ranges(ranges)

    def task_failed(self, failure: TaskFailure) -> None:
        raise NotImplementedError

    def _accept_done(self, done: Ranges, results: tuple[tuple[int, Result], ...], now: float) -> None:
        raise NotImplementedError

    def published(self) -> RangeSet:
        """Ids on the boards, published and not yet attributed to a claimer."""
        out = RangeSet()
        for owner in self.owners.values():
            out.add_ranges(owner.published())
        return out

    def _after_report(self, report: Report, now: float) -> None:
        pass

    @property
    def exhausted(self) -> bool:
        """Whether no id will ever be published here again."""
        raise NotImplementedError

    @property
    def finished(self) -> bool:
        """Whether this server owes nobody anything more."""
        raise NotImplementedError
