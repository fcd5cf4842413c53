"""What a rank does when others die: the pure rules of region-local recovery.

When MPI reports dead ranks, every surviving rank lays out the same hierarchy
without them (:func:`nlevel.model.hierarchy.build` with ``failed``: each block is led by
its lowest survivor). Then, per rank:

* A server whose child died takes the child's ids back. A dead *slave* held exactly
  what its parent granted it: requeued at once, nobody else is involved.
* A dead *server* (region-master, or the master) had passed ids on to its subtree.
  Its nearest surviving ancestor (:func:`reconciler`; the new master if the master
  died) reconciles: every survivor whose parent died sends it a
  :class:`~nlevel.roles.messages.Holding` (what it and its subtree hold), and once all the
  :func:`expected` ones have, the ids the dead server held that nobody holds are
  requeued (:class:`Reconciliation`). The Holding also goes to the survivor's new
  parent, which records it as the child's held ids, so a later death is handled
  the same way.
* The master's ledger survives on a deputy (the lowest surviving rank after the
  master), which gets a copy of every commit; the deputy is also the next master.
  If both die at once, the new master starts from the checkpoint file.
* Who watches whom (:func:`watchers`, :func:`beat_period`): the rules the liveness
  sub-machine (:mod:`nlevel.roles.watch`) applies.

An id is requeued only when no survivor holds it, so it runs twice only if it was
in flight at a process that died. Pure Python, no MPI.
"""

from __future__ import annotations

from ..model.hierarchy import Hierarchy, Role
from ..ranges import RangeSet, Ranges
from .messages import FailureRecord

__all__ = ["expected", "reconciler", "deputy", "successors", "watchers", "beat_period", "Reconciliation",
           "WATCHERS", "BEATS", "WATCH_PERIOD", "GIVEN_UP"]

#: How many ranks watch the master (the deputy first; the second judges after two leases).
WATCHERS = 2
#: Beats per lease: a rank is taken for hung only after this many beats in a row went missing.
BEATS = 5
#: Seconds between two looks at whether watched processes still exist (see
#: :meth:`~nlevel.roles.watch.Watching.watch`).
WATCH_PERIOD = 0.05
#: How a rank that could not be killed is recorded (the start of its failure's ``how``): without
#: fault tolerance the master stops the job when it hears of one (see
#: :meth:`~nlevel.roles.watch.Watching.unkillable`).
GIVEN_UP = "given up"


def beat_period(lease: float) -> float:
    """Seconds between two beats of a rank (see :data:`BEATS`)."""
    return lease / BEATS


def watchers(h: Hierarchy) -> list[int]:
    """The ranks that watch the master: its first :data:`WATCHERS` survivors after it, the deputy first."""
    out = []
    for n in h.nodes:
        if n.role is not Role.DEAD and n.rank != h.master:
            out.append(n.rank)
            if len(out) == WATCHERS:
                break
    return out


def expected(dead: int, old: Hierarchy, failed: frozenset[int]) -> set[int]:
    """Survivors that must send a Holding for ``dead``: its children in ``old``, through dead ones."""
    out: set[int] = set()
    stack = list(old[dead].children)
    while stack:
        c = stack.pop()
        if c in failed:
            stack.extend(old[c].children)
        else:
            out.add(c)
    return out


def reconciler(rank: int, old: Hierarchy, new: Hierarchy) -> int:
    """The nearest ancestor of ``rank`` in ``old`` that survives in ``new`` (else the new master)."""
    p = old[rank].parent
    while p is not None and new[p].role is Role.DEAD:
        p = old[p].parent
    return p if p is not None else new.master


def deputy(h: Hierarchy) -> int | None:
    """The rank that keeps a copy of the master's ledger: the lowest survivor after the master."""
    return next((n.rank for n in h.nodes if n.role is not Role.DEAD and n.rank != h.master), None)


def successors(h: Hierarchy, n: int = 2) -> list[int]:
    """The ``n`` ranks next in line to become master, in order: the deputy, then the rank that
    takes over (from the checkpoint file) should the master and its deputy die together."""
    out: list[int] = []
    for node in h.nodes:
        if len(out) == n:
            break
        if node.role is not Role.DEAD and node.rank != h.master:
            out.append(node.rank)
    return out


class Reconciliation:
    """A reconciler's pending work: ids dead servers held, and the Holdings still to come.

    Args:
        everything: The master died: every id not committed is in question (``held`` unused).
    """

    def __init__(self, everything: bool = False, now: float = 0.0) -> None:
        self.everything = everything
        self.started = now  # a survivor silent for a lease after this is hung: killed
        self.killed: set[int] = set()
        self.held = RangeSet()  # ids the dead servers held here
        self.expected: set[int] = set()
        self.got: dict[int, RangeSet] = {}
        self.records: list[FailureRecord] = []  # failures whose recovery ends when this does
        self.asked: dict[int, int] = {}  # rank -> the token of the latest ask sent to it
        self._tokens = 0
        self.got_lost: dict[int, tuple[tuple[int, Ranges], ...]] = {}  # answers' "passed to the dead"
        self.got_sent: dict[int, RangeSet] = {}  # answers' "passed to a live parent"
        self.last_death = 0.0  # (wall) when a later death voided answers this waits for (see FailureRecord.closed)
        self.got_epoch: dict[int, int] = {}  # answers' plan (epoch; -1: not said)

    def add_dead(self, held: RangeSet, survivors: set[int], record: FailureRecord | None) -> set[int]:
        """A server died holding ``held``; return which of ``survivors`` to ask what they hold."""
        self.held.add_ranges(held.ranges())
        if record is not None:
            self.records.append(record)
        for s in survivors:
            # An answer from before this question is stale, and so is one still on its way:
            # since then the survivor may have sent completions to the dead (its parent), which
            # are lost with it, or claimed ids now in question. Ask again (new token).
            self.got.pop(s, None)
            self.expected.discard(s)
        return self._expect(survivors)

    def member_died(self, rank: int, survivors: set[int]) -> set[int]:
        """An expected sender died: its holding is void; return which of ``survivors`` (its children) to ask."""
        self.expected.discard(rank)
        self.got.pop(rank, None)
        self.got_sent.pop(rank, None)  # (what it said it passed on is not known to have arrived)
        for s in survivors:  # their answers may count completions they passed to it: ask again
            self.got.pop(s, None)
            self.expected.discard(s)
        return self._expect(survivors)

    def reask(self, ranks: set[int]) -> set[int]:
        """Answers of ``ranks`` are stale (a rank they may have sent completions to died): return whom to ask again."""
        stale = ranks & (set(self.got) | self.expected)
        for s in stale:
            self.got.pop(s, None)
            self.expected.discard(s)
        return self._expect(stale)

    def _expect(self, survivors: set[int]) -> set[int]:
        new = survivors - self.expected - set(self.got)
        self.expected |= new
        return new

    def token(self, rank: int) -> int:
        """Number a new ask to ``rank``; only the answer that echoes it counts."""
        self._tokens += 1
        self.asked[rank] = self._tokens
        return self._tokens

    def receive(self, src: int, held: RangeSet, token: int = -1,
                lost: tuple[tuple[int, Ranges], ...] = (), sent: RangeSet | None = None, epoch: int = -1) -> bool:
        """A Holding arrived; return whether it counts.

        Only the answer to the latest ask counts: a survivor's holding written before it was
        asked may miss ids that reached it since (a claim from a live server's board).
        """
        if token < 0 or self.asked.get(src) != token:
            return False
        self.got[src] = held
        self.got_lost[src] = lost
        self.got_sent[src] = sent if sent is not None else RangeSet()
        self.got_epoch[src] = epoch
        self.expected.discard(src)
        return True

    def behind(self, epoch: int) -> set[int]:
        """Ranks whose answers were written under a plan older than ``epoch``: void, they are expected again."""
        old = {r for r in self.got if 0 <= self.got_epoch.get(r, -1) < epoch}
        return self.reask(old)

    @property
    def complete(self) -> bool:
        """Whether every expected Holding has arrived."""
        return not self.expected

    def lost(self, in_question: RangeSet, settled: RangeSet, seen: set[tuple[int, int]] | None = None) -> RangeSet:
        """Ids of ``in_question`` that nobody holds and nobody finished: to run again.

        Completions a survivor passed to a rank that died are lost, whatever older snapshots
        of other survivors say (the id was in someone's hand, then sent up, then lost):
        completions only move up. ``seen``: (survivor, dead) pairs whose losses an earlier
        reconciliation of this rank requeued already (the ids may be running again since);
        this reconciliation's pairs are added to it.
        """
        void, fresh = RangeSet(), RangeSet()
        for src, entries in self.got_lost.items():
            for dead, ranges in entries:
                void.add_ranges(ranges)
                if seen is None or (src, dead) not in seen:
                    fresh.add_ranges(ranges)
                    if seen is not None:
                        seen.add((src, dead))
        lost = in_question.copy()
        # A completion said to be on its way up, which a survivor passed to the dead, is lost
        # (now, or it was requeued back then: either way that claim is void). An id held in hand
        # is void only against a loss this reconciliation is the first to hear of.
        for claims, voided in ((self.got, fresh), (self.got_sent, void)):
            for held in claims.values():
                if voided:
                    held = held.copy()
                    held.remove_ranges(voided.ranges())
                lost.remove_ranges(held.ranges())
        if settled:
            lost.remove_ranges(settled.ranges())
        return lost
