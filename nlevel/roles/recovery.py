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

An id is requeued only when no survivor holds it, so it runs twice only if it was
in flight at a process that died. Pure Python, no MPI.
"""

from __future__ import annotations

from ..model.hierarchy import Hierarchy, Role
from ..ranges import RangeSet
from .messages import FailureRecord

__all__ = ["expected", "reconciler", "deputy", "Reconciliation"]


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

    def add_dead(self, held: RangeSet, survivors: set[int], record: FailureRecord | None) -> set[int]:
        """A server died holding ``held``; return which of ``survivors`` to ask what they hold."""
        self.held.add_ranges(held.ranges())
        if record is not None:
            self.records.append(record)
        return self._expect(survivors)

    def member_died(self, rank: int, survivors: set[int]) -> set[int]:
        """An expected sender died: its holding is void; return which of ``survivors`` (its children) to ask."""
        self.expected.discard(rank)
        self.got.pop(rank, None)
        return self._expect(survivors)

    def _expect(self, survivors: set[int]) -> set[int]:
        new = survivors - self.expected - set(self.got)
        self.expected |= new
        return new

    def receive(self, src: int, held: RangeSet) -> None:
        """A Holding arrived (a later one from the same sender replaces the earlier)."""
        self.got[src] = held
        self.expected.discard(src)

    @property
    def complete(self) -> bool:
        """Whether every expected Holding has arrived."""
        return not self.expected

    def lost(self, in_question: RangeSet, settled: RangeSet) -> RangeSet:
        """Ids of ``in_question`` that nobody holds and nobody finished: to run again."""
        lost = in_question.copy()
        for held in self.got.values():
            lost.remove_ranges(held.ranges())
        if settled:
            lost.remove_ranges(settled.ranges())
        return lost
