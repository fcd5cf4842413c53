"""Reports up the tree, and when they are safe: one sub-machine of a :class:`~nlevel.roles.station.Station`. Pure Python.

It owns what a rank sent its parents and what its children sent it, counted by sequence
number. A report with completions is *unsafe* until its parent says, with
:class:`~nlevel.roles.messages.Safe`, that the completions in it are committed where one
death cannot lose them (the master: copied to its deputy; a region: passed on in a report
its own parent said safe). Until then the rank keeps the report, results included, to send
again should the parent die: so a region-master holds seconds of its region's results, not
the whole job's. What a rank passed to a parent that died is kept apart (``lost_via``) for
the reconciliation (see :mod:`nlevel.roles.failures`).

Ids a rank gives back to the master (unstarted: its region's stock at a plan switch) are
kept the same way, numbered as a report, until the master says that report is safe: should
the master die first, they go to the new one (:meth:`~nlevel.roles.failures.Recovery.fail`).
They were held by nobody then, and a survivor's older account (a lagging region-master still
counting them as its child's) kept the reconciliation from requeueing them: never committed.
(Ids given back to a region-master that dies are left to its reconciler, which requeues what
nobody holds: ``bench/replan_fuzz.py`` found no loss there.)

Completions a rank passes straight to the master instead of up its tree (a report from an older
plan that reached it after a switch, its region's and its own loop's at a switch) are kept the
same way: until the master says they are safe they are this rank's, reported again should the
master die, and only then is the rank they came from told they are safe. Passed on and
forgotten, they were lost with a master that died before its copy to the deputy: their sender,
still counting them as on their way to a live rank, told the new master it held them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from ..ranges import Ranges, RangeSet
from .events import Effect, Send
from .host import Host
from .messages import Report, Result, Safe
from .region import Region

__all__ = ["Delivery"]


class Delivery:
    """What this rank sent up and heard from below, until it is safe (see the module docstring)."""

    def __init__(self, st: Host) -> None:
        self.st = st
        # Completions sent to each parent (fault tolerance): a survivor's answer to a reconciler
        # counts them as held while they may be in flight; a parent that passed them to a rank
        # that died reports them lost (``lost_via``). Tracked from the start: a rank that learns
        # of a death late must still know what it passed to the dead.
        self.sent_done: dict[int, RangeSet] | None = {} if st.ft else None
        self.lost_via: dict[int, RangeSet] = {}  # completions passed to a rank that died, by that rank
        # Reports with completions sent to each parent and not yet said safe, with their results.
        self.unsafe: dict[int, deque[tuple[int, Ranges, tuple[tuple[int, Result], ...]]]] = {}
        # Ids given back to the master: (the seq of the report that carried them, ids) until it is said safe.
        self.given_back: dict[int, deque[tuple[int, Ranges]]] = {}
        self.up_seq: dict[int, int] = {}  # the last seq sent to each parent
        # A parent: the last seq heard from each child; what of it is safe; what it has said safe.
        self.heard_seq: dict[int, int] = {}
        self.safe_seq: dict[int, int] = {}
        self.said_safe: dict[int, int] = {}
        # Per rank reported to: (this rank's seq to it, the seqs heard from below that report carries)
        # (a region's flush: every child's heard so far; a relay: its sender's).
        self.covers: dict[int, deque[tuple[int, dict[int, int]]]] = {}
        self.covered: dict[int, int] = {}  # the master: children's seqs its last copy to the deputy covered
        self.safe_told = st.clock()
        self.reports = 0  # reports sent to another rank (a parent drops an Ending its sender's report follows)

    def report_up(self, report: Report, dest: int, cover: dict[int, int] | None = None) -> list[Effect]:
        """Send ``report`` to ``dest`` (this rank's own server: delivered in-process), stamped with the epoch.

        ``cover``: the seqs heard from below whose completions ride up in it (default: a region's
        flush to its parent carries everything its children reported so far).
        """
        st = self.st
        if report.epoch != st.epoch and not report.orphan:
            report = replace(report, epoch=st.epoch)
        if dest == st.rank and st.server is not None:
            st.server.on_report(st.rank, report, st.clock())
            return st.serve()
        back = bool(report.returned) and dest == st.hierarchy.master
        if self.sent_done is not None and (report.done or back):
            seq = self.up_seq[dest] = self.up_seq.get(dest, 0) + 1
            report = replace(report, seq=seq)
            if back:
                self.given_back.setdefault(dest, deque()).append((seq, report.returned))
        if self.sent_done is not None and report.done:
            seq = report.seq
            self.sent_done.setdefault(dest, RangeSet()).add_ranges(report.done)
            self.unsafe.setdefault(dest, deque()).append((seq, report.done, report.results))
            if cover is None and isinstance(st.server, Region) and dest == st.server.parent:
                # (what its children reported so far rides up in this or an earlier report: once this
                # one is safe, so are theirs)
                cover = dict(self.heard_seq)
            if cover:
                self.covers.setdefault(dest, deque()).append((seq, cover))
        self.reports += 1
        return [Send(dest, report)]

    def relay(self, src: int, report: Report, master: int) -> list[Effect]:
        """Pass ``report``, which ``src`` sent this rank under an older plan (or when this rank served
        nobody), straight to the master; keep it until the master says it is safe, then tell ``src``."""
        cover = {src: report.seq} if report.seq and report.done else {}
        return self.report_up(replace(report, epoch=self.st.epoch, orphan=True, seq=0), master, cover)

    def heard(self, src: int, seq: int) -> None:
        """A report numbered ``seq`` came from child ``src``."""
        if seq > self.heard_seq.get(src, 0):
            self.heard_seq[src] = seq

    def on_safe(self, src: int, seq: int) -> list[Effect]:
        """Parent ``src`` says this rank's reports to it up to ``seq`` are safe: forget them (and pass the
        news down to the ranks whose reports rode up in them)."""
        q = self.unsafe.get(src)
        sent = (self.sent_done or {}).get(src)
        while q and q[0][0] <= seq:
            _, done, _ = q.popleft()
            if sent is not None:
                sent.remove_ranges(done)
        back = self.given_back.get(src)
        while back and back[0][0] <= seq:
            back.popleft()
        covers = self.covers.get(src)
        while covers and covers[0][0] <= seq:
            for child, s in covers.popleft()[1].items():
                if s > self.safe_seq.get(child, 0):
                    self.safe_seq[child] = s
        return []

    def mark_safe(self) -> None:
        """The master: every completion heard so far is committed where its death cannot lose it
        (its deputy has the copy, or it has none to make)."""
        self.safe_seq.update(self.heard_seq)

    def copied(self) -> None:
        """The master: a copy went to the deputy with every commit heard so far: the commits of the
        copy before it (a copy's time ago: delivered, unless the master died at once) are safe."""
        self.safe_seq.update(self.covered)
        self.covered = dict(self.heard_seq)

    def tell_safe(self) -> list[Effect]:
        """At most every beat: tell each child how far its reports are safe."""
        st = self.st
        now = st.clock()
        if not self.safe_seq or now - self.safe_told < st.config.lease / 5:
            return []
        self.safe_told = now
        outs: list[Effect] = []
        for child, s in self.safe_seq.items():
            if s > self.said_safe.get(child, 0) and child not in st.failed and child != st.rank:
                self.said_safe[child] = s
                outs.append(Send(child, Safe(s)))
        return outs

    def sent(self) -> RangeSet:
        """Completions this rank sent to parents still alive (they may be in flight)."""
        out = RangeSet()
        for ranges in (self.sent_done or {}).values():
            out.add_ranges(ranges.ranges())
        return out

    def lost_with(self, dead: frozenset[int]) -> tuple[RangeSet, list[tuple[int, Result]], RangeSet]:
        """``dead`` died: what this rank had sent them, to report again (completions and the results
        it still has of them, to its new parent; ids it gave back to a master among them, to the new
        master); forget every count kept with them.

        Completions reported to a rank that died are lost with it: reported again rather than run
        again. Ids given back go back again (an id the dead master had handed out since may run twice).
        """
        if self.sent_done is None:
            self.sent_done = {}
        again, again_results, back = RangeSet(), list[tuple[int, Result]](), RangeSet()
        for x in dead:
            for _, ranges in self.given_back.pop(x, ()):
                back.add_ranges(ranges)
            sent = self.sent_done.pop(x, None)
            if sent:
                self.lost_via[x] = sent  # passed to a rank that died: a reconciler must know
                again.add_ranges(sent.ranges())
            for _, _, results in self.unsafe.pop(x, ()):
                again_results += results
            for seqs in (self.heard_seq, self.safe_seq, self.said_safe, self.up_seq):
                seqs.pop(x, None)
            self.covers.pop(x, None)  # (what rode up to x is said safe by nobody now: it goes again to the new parent)
        return again, again_results, back
