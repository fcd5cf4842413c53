"""How a rank repairs itself when other ranks die: one sub-machine of a :class:`~nlevel.roles.station.Station`. Pure Python.

:meth:`Recovery.fail` takes the ranks the runtime reported dead and applies the rules of
:mod:`nlevel.roles.recovery` to this rank: requeue a dead slave's ids, start (or extend)
a reconciliation for a dead server, take over as region-master or master when this
rank is now the lowest survivor of a block, send a Holding when this rank's parent
died. Messages that arrive before this rank has heard of the failure they follow are
held back until it has. The master copies its commits to a deputy (the next master),
and the deputy watches the master's heartbeat.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Final

from ..model.hierarchy import Hierarchy, Role, build
from ..ranges import Ranges, RangeSet, Tally
from .delivery import Delivery
from .events import CheckpointLoaded, Effect, LoadCheckpoint, Send, TeamLost
from .host import Host
from .ledger import Ledger
from .messages import FailureRecord, Gone, Holding, Message, Mirror, Report, InQuestion
from .recovery import BEATS, GIVEN_UP, Reconciliation, deputy, expected, reconciler
from .replan import Replanning
from .master import Master
from .region import Region
from .server import LEAF, UPPER, Server
from .worker import State

__all__ = ["Recovery", "MIRROR_AGE", "MIRROR_BATCH", "RESERVE_SHARE"]

#: The master copies its commits to the deputy at least this often (s) ...
MIRROR_AGE: Final = 0.005
#: ... or once this many ids are waiting (a master that dies loses at most these commits).
MIRROR_BATCH: Final = 256
#: The master's mark (no id above it handed out yet, see :meth:`Recovery._move_mark`) moves
#: this share of the job's ids ahead of what it published.
RESERVE_SHARE: Final = 1 / 64


def _told(rank: int, old: Hierarchy, failed: frozenset[int]) -> set[int]:
    """The live parent ``rank`` had in ``old``: after a death it tells its new parent what it holds, unasked."""
    parent = old[rank].parent
    return {parent} if parent is not None and parent not in failed else set()


def _record(rank: int, old: Hierarchy, held: int, how: str, by: int, wall: float) -> FailureRecord:
    return FailureRecord(rank, old[rank].role.value, old[rank].level, how, by, wall, held)


class Recovery:
    """Deaths, reconciliations, take-overs and the deputy's copy of the master's ledger, on one rank."""

    def __init__(self, st: Host, delivery: Delivery, replanning: Replanning) -> None:
        self.st = st
        self.delivery = delivery
        self.replanning = replanning
        self.failures: list[FailureRecord] = []  # deaths this rank recorded (the master's: the report's)
        self.given_up: set[int] = set()  # ranks treated as dead although their processes may live (GiveUp)
        self.recon: Reconciliation | None = None  # a reconciliation this rank leads
        self.lost_seen: set[tuple[int, int]] = set()  # a reconciler: (survivor, dead) losses requeued already
        self.deferred: deque[tuple[int, Message]] = deque()  # messages held until this rank learns of a death
        # A reconciler's record of answers from below its children (rank -> (child, ids)): written
        # into the child's holding, they are the child's only once the sender's new parent has them.
        self.vouched: dict[int, tuple[int, int, RangeSet]] = {}  # (child, epoch, ids): a switch moves records
        self.given_again = RangeSet()  # a new master: ids given back to the dead master, sent again
        # The master's side of the deputy's copy.
        self.mirror_to: int | None = None  # the deputy it copies to (-1: none; None: not started)
        self.mirror_sent = 0.0  # when it last sent a copy
        self.mirrored_failures = 0  # failure records copied so far
        self.hand_sent: Ranges = ()  # its own loop's holding as last copied
        # Ids at or above this mark were never handed out: the master keeps it ahead of what it
        # publishes and copies it to the deputy, which as the next master hands them out at once.
        self.mark = 0
        # The deputy's side: its copy of the master's ledger and what came with it.
        self.mirror: Ledger | None = None
        self.mirror_failures: list[FailureRecord] = []
        self.mirror_deaths = Tally()  # the master's death counts per id
        self.mirror_hand: Ranges = ()  # what the master's own loop held at the last copy
        self.mirror_mark = -1  # the master's mark (-1: not known)
        self.timed_out_hand = RangeSet()  # the master's own task past its limit (no fault tolerance)
        self.timeout_notes: list[tuple[int, tuple[tuple[int, int], ...]]] = []  # (rank, ids) timed out, for a successor
        self.free = RangeSet()  # a new master: the ids above its predecessor's mark, queued on its next tick

    # -- events ----------------------------------------------------------------------------
    def fail(self, ranks: tuple[int, ...], how: str = "ulfm", tell: bool = False) -> list[Effect]:
        """``ranks`` are dead: repair this rank's roles; return the effects.

        ``tell``: this rank found out by itself (MPI will not tell the others): tell every live rank.
        """
        st = self.st
        new = frozenset(ranks) - st.failed - {st.rank}
        if not new:
            return []
        old = st.hierarchy
        st.failed = failed = st.failed | new
        given_up = how.startswith(GIVEN_UP)  # (they may live on: see Watching.unkillable)
        if given_up:
            self.given_up |= new
        outs: list[Effect] = []
        nh = build(st.size, old.plan, failed, old.out, old.node_sizes)  # (the ranks its plan left out stay out)
        # What this rank reported to the dead goes again (below) to the new parent, rather than run again.
        again, again_results, given_back = self.delivery.lost_with(new)
        wall = st.wall()
        self.replanning.forget(new)  # (the dead never acknowledge a regroup)
        outs += self.replanning.ack_again(new)
        d = st.server
        ask: set[int] = set()
        if d is not None:
            for x in sorted(new & set(d.strangers)):
                d.requeue_lost(d.drop_stranger(x))  # (it took them here before this rank knew it as a child)
            for x in sorted(new & set(d.children)):
                child = d.children[x]
                silent = d.clock() - child.heard
                why = how if given_up else child.leased or ("drained (left, then ended)" if child.left
                                                                            else how)
                held = d.drop_child(x)
                record = replace(_record(x, old, len(held), why, st.rank, wall), silent_ms=round(silent * 1e3, 3))
                if old[x].children:
                    # A server that was still working: its survivors will say what they hold.
                    self.recon = self.recon or Reconciliation(now=st.clock())
                    ask |= self.recon.add_dead(held, expected(x, old, failed), record)
                else:
                    host = st.hosts[x] if x < len(st.hosts) else ""
                    d.suspects.add_ranges(held.ranges())  # (one of them may be what killed it)
                    n, quarantined = d.requeue_lost(held, x, host, why)
                    self.failures.append(record.closed(n, tuple(quarantined), st.wall()))
        if d is not None:
            ask |= self._unvouch(new, old, failed)
        if isinstance(d, Master) and d.carried and not (self.recon is not None and self.recon.everything):
            # Ids out with ranks the master cannot name (claimed by a rank that was not yet its
            # child, or handed off below): one of the dead may have held them. Everyone says
            # what it holds; what nobody holds runs again.
            d.forget_recorded()
            if d.carried:
                self.recon = self.recon or Reconciliation(now=st.clock())
                others = set(range(st.size)) - failed - {st.rank}
                ask |= self.recon.add_dead(d.carried.copy(), others, None)
        if self.recon is not None:
            for x in sorted(new & (self.recon.expected | set(self.recon.got))):
                if x in self.recon.expected:
                    self.recon.last_death = wall  # (its recovery waited for x's answer: x's death ends that wait)
                # Asked: its children, if it is this rank's to reconcile; and the parent it may have
                # told what it held, unasked, which then took those ids back when it died.
                asked = expected(x, old, failed) if reconciler(x, old, nh) == st.rank else set()
                ask |= self.recon.member_died(x, asked | (_told(x, old, failed) - {st.rank}))
            for x in sorted(new):
                # Whoever answered and had x as its parent may count completions it sent x: stale.
                stale = expected(x, old, failed)
                if stale & set(self.recon.got):
                    self.recon.last_death = wall  # (answers in hand are void: the recovery waits for them again)
                ask |= self.recon.reask(stale)
        took_over = nh.master == st.rank and old.master != st.rank
        load: list[Effect] = []
        if took_over:
            took, load = self._take_over(old, nh, wall, how)
            ask |= took
        outs += self._relayout(nh)
        if given_back:
            # Given back to the master that died: to the new one, which asks everyone what it holds
            # and requeues what nobody does (the dead may have handed them out again). They come
            # before this rank's answer (same sender, in order), which then rightly leaves them out.
            report = Report(returned=given_back.ranges(), epoch=st.epoch, orphan=True)
            if isinstance(st.server, Master):
                self.take_orphan(report)
            else:
                outs += self.delivery.report_up(report, nh.master)
        if again:
            up = st.rank if st.server is not None else st.info.parent
            if up is not None:
                outs += self.delivery.report_up(Report(again.ranges(), tuple(again_results), epoch=st.epoch), up)
        if took_over:
            outs += st.took_over()
            if self.replanning.may_have_switched:
                outs += self.replanning.announce()  # (before the questions: see Replanning.announce)
        parent = old[st.rank].parent
        if parent is not None and parent in new and st.info.parent is not None:
            # Unasked, to the new parent: it records what this rank's subtree holds.
            outs.append(Send(st.info.parent, Holding(self.holding(sent=False).ranges(), tuple(sorted(failed)),
                                                       left=self.left_the_loop())))
        if ask - {st.rank}:
            assert self.recon is not None
            outs += self._ask(self.recon, ask - {st.rank})
        if tell:
            # After the questions: a survivor takes the death from the question and answers it in
            # the same look (see Station.receive). Told first, it learned of the death and often
            # found the question only one range later (measured: a master's recovery waited 25 ms
            # more for such a survivor, 8 ranks on 2 cores).
            gone = Gone(tuple(sorted(new)), how)
            outs += [Send(r, gone) for r in range(st.size) if r not in failed and r != st.rank]
        if isinstance(st.server, Master) and st.ft:
            dep = deputy(nh)
            if (dep if dep is not None else -1) != self.mirror_to:
                outs += self._mirror_full(dep)
        if st.server is not None:
            st.server.reconciling = self.recon is not None
        if st.erred and nh.master != old.master:
            outs += st.user_error(st.rank, st.erred)  # (the new master stops the job too)
        deferred, self.deferred = self.deferred, deque()
        for src, msg in deferred:
            outs += st.receive(src, msg)
        outs += self._finish_recon()
        outs += st.serve()
        if not st.ft and given_up and isinstance(st.server, Master):
            # Without fault tolerance a rank given up (it could not be killed: its node stopped or
            # cut off) may come back and claim: the job stops cleanly, to be resumed without it.
            outs += st.stop("rank given up")
        # The checkpoint file last: the runtime reads it while the survivors answer the questions
        # sent above (read first, it delayed them: 25-45 ms of a new master's recovery).
        return outs + load

    def team_lost(self, event: TeamLost) -> list[Effect]:
        """This rank's team lost a process (see :class:`~nlevel.roles.events.TeamLost`): recorded for
        the report (``role`` "team", this rank's number); the rank itself carries on."""
        st = self.st
        now = st.wall()
        members = ", ".join(map(str, event.members))
        record = FailureRecord(st.rank, "team", st.info.level,
                               f"team {event.team} (ranks {members}) lost a process: {event.why}", st.rank, now,
                               event.held)
        self.failures.append(record.closed(event.held, (), now))
        return []

    def timed_out(self, rank: int, ids: tuple[tuple[int, int], ...]) -> None:
        """Not the master: a task of ``rank`` ran past its limit; the timeout counts if this rank takes over."""
        self.timeout_notes.append((rank, ids))
        if rank == self.st.hierarchy.master and not self.st.ft:
            # The master's own task, given up without fault tolerance: the master counted this
            # timeout in the checkpoint it leaves, which this rank takes over from; an id at its
            # quarantine then must not be handed out again (see _finish_recon).
            self.timed_out_hand.add_ranges(ids)

    def defer(self, src: int, msg: Message) -> bool:
        """Whether ``msg`` must wait for this rank to learn of a failure (keeping order per sender)."""
        st = self.st
        if self.deferred and any(s == src for s, _ in self.deferred):
            self.deferred.append((src, msg))
            return True
        waiting = False
        if isinstance(msg, Holding):
            waiting = not set(msg.failed) <= st.failed
        elif isinstance(msg, Report) and not msg.orphan and msg.epoch == st.epoch:
            d = st.server
            waiting = d is None or src not in d.children
        if waiting:
            self.deferred.append((src, msg))
        return waiting

    def take_orphan(self, report: Report) -> None:
        """The master: completions, given-back ids and failures sent under an older plan (or again,
        after the master they went to died). As an orphan: not `settled`, as a child's would be.

        Ids given back to this master are its own: in question in a reconciliation asked before
        they came, they ran twice, queued here and requeued as nobody's.
        Given back to a master that died, they wait for this new master's reconciliation (see
        :meth:`_finish_recon`): the dead may have handed some out again.
        """
        d = self.st.server
        assert isinstance(d, Master)
        everything = self.recon is not None and self.recon.everything
        d.take_orphan(report, self.st.clock(), everything)
        if self.recon is not None and report.returned:
            if everything:
                self.given_again.add_ranges(report.returned)
            else:
                self.recon.held.remove_ranges(report.returned)

    def hand_over(self) -> list[Effect]:
        """This rank stopped serving the plan it was reconciling a death under (a switch): the ids
        still in question go to the master, which asks every survivor.

        Answers would come to a rank with no server of that plan to requeue into, and meanwhile
        its own answers claimed the ids for ever: a hang.
        """
        st, recon = self.st, self.recon
        if recon is None or recon.everything or isinstance(st.server, Master):
            return []
        self.recon = None
        if st.server is not None:
            st.server.reconciling = False
        ids = recon.held.copy()
        if st.worker is not None:
            ids.remove_ranges(st.worker.holding().ranges())
        if not ids:  # (nothing left in question: nothing runs again)
            self._close(recon.records, 0, (), recon.last_death)
            return []
        # The deaths' records go with the ids: what runs again is counted where it is requeued.
        return [Send(st.hierarchy.master, InQuestion(ids.ranges(), tuple(recon.records)))]

    def on_in_question(self, msg: InQuestion) -> list[Effect]:
        """The master: ids a rank that stopped serving could not settle (see :meth:`hand_over`): ask everyone."""
        st = self.st
        d = st.server
        if not isinstance(d, Master):
            # (sent under a plan, or to a master, this rank has not caught up with): to the master
            master = st.hierarchy.master
            return [Send(master, msg)] if master != st.rank else []
        ids = d.unrecorded(RangeSet(msg.ids))
        for out in (d.queue, d.published()):
            ids.remove_ranges(out.ranges())  # (its own: the sender's stock, given back just before)
        if not ids:
            self._close(msg.records, 0, (), 0.0)
            return []
        # Whatever records say of them (the sender's earlier answers, carried over at a switch)
        # is void: fresh answers from everyone say who holds them.
        for child in d.children.values():
            d.held_total -= child.held.remove_ranges(ids.ranges())
        self.recon = self.recon or Reconciliation(now=st.clock())
        if self.recon.everything:
            d.carried.remove_ranges(ids.ranges())  # (a new master's question leaves carried ids out)
        else:
            d.carried.add_ranges(ids.ranges())  # (out under an earlier plan: a later death questions them too)
        d.reconciling = True
        ask = self.recon.add_dead(ids, set(range(st.size)) - st.failed - {st.rank}, None)
        self.recon.records.extend(msg.records)
        return self._ask(self.recon, ask) + self._finish_recon() + st.serve()

    def left_the_loop(self) -> bool:
        """Whether this rank claims no more: its loop left early and it serves nobody (or its region left)."""
        d, w = self.st.server, self.st.worker
        if isinstance(d, Region):
            return d.gone
        return d is None and w is not None and w.state is State.LEFT

    def on_holding(self, src: int, msg: Holding) -> list[Effect]:
        """A survivor whose parent died says what it holds (this rank reconciles, or is its new parent)."""
        st = self.st
        if msg.ask:
            lost = tuple((x, r.ranges()) for x, r in self.delivery.lost_via.items())
            return [Send(src, Holding(self.holding(sent=False).ranges(), tuple(sorted(st.failed)), token=msg.token,
                                      lost=lost, sent=self.delivery.sent().ranges(), epoch=st.epoch))]
        held = RangeSet(msg.held)
        d = st.server
        if d is None:
            return []
        path: int | None = src
        while path is not None and path not in d.children and path != st.rank:
            path = st.hierarchy[path].parent
        if path is not None and path != st.rank:
            d.attach(d.children[path], held)  # the child's subtree holds these now
            if path != src:
                entry = self.vouched.get(src)
                if entry is None or entry[1] != st.epoch:
                    entry = self.vouched[src] = (path, st.epoch, RangeSet())
                entry[2].add_ranges(held.ranges())
            if msg.left and path == src:
                d.child_left(d.children[src])  # (its leaving report went to the parent that died)
        outs: list[Effect] = []
        recon = self.recon
        if recon is not None and msg.token >= 0 and (src in recon.expected or src in recon.got):
            if st.failed <= set(msg.failed):
                recon.receive(src, held, msg.token, msg.lost, RangeSet(msg.sent), msg.epoch)
            elif recon.asked.get(src) == msg.token:
                # Written before the sender knew of a death this rank knows of: stale. It
                # answers again once it knows (an ask waits until the failures it names are known).
                recon.got.pop(src, None)
                recon.expected.add(src)
                outs += self._ask(recon, {src})
        return outs + self._finish_recon() + st.serve()

    def on_mirror(self, msg: Mirror) -> list[Effect]:
        """The deputy: copy the master's commits (a full copy replaces what it had)."""
        if isinstance(self.st.server, Master):  # a late copy from the master this rank replaced
            self.st.server.ledger.commit(msg.done, msg.results)
            return []
        if msg.full or self.mirror is None:
            self.mirror = Ledger(msg.total, width=msg.width)
            self.mirror_failures = []
        self.mirror.commit(msg.done, msg.results)
        for f in msg.failed:
            self.mirror.fail(f)
        for tid, k in msg.timeouts:
            self.mirror.timeouts[tid] = k
        if msg.deaths:
            self.mirror_deaths.raise_to(Tally(msg.deaths))
        if msg.hand is not None:
            self.mirror_hand = msg.hand
        if msg.mark >= 0:
            self.mirror_mark = msg.mark if msg.full else max(msg.mark, self.mirror_mark)
        self.mirror_failures.extend(msg.failures)
        return []

    def loaded(self, event: CheckpointLoaded) -> list[Effect]:
        """A new master's ledger from the checkpoint file arrived: carry on taking over."""
        st = self.st
        if not st.loading:
            return []
        st.loading = False
        d = st.server
        assert isinstance(d, Master) and st.ledger is not None
        if event.ledger is not None:
            st.ledger.merge(event.ledger)
            d.count_timeouts(st.ledger.timeouts)  # (earlier runs' timeouts: deaths toward quarantine, suspects)
            d.forget_recorded()  # (what was queued while loading may be committed in the file: it must not run again)
        elif event.error:
            self.failures.append(_record(st.rank, st.hierarchy, 0, f"checkpoint unusable: {event.error}",
                                         st.rank, st.wall()))
        return self._finish_recon() + st.serve()

    # -- the pieces -----------------------------------------------------------------------------
    def _unvouch(self, new: frozenset[int], old: Hierarchy, failed: frozenset[int]) -> set[int]:
        """Dead ranks whose answers this rank wrote into a child's holding: those ids are in question.

        The sender also told its new parent (unasked); dead before that parent heard it, the
        parent dropped the news with the rest of the dead's messages, and only this rank's record
        of the child said the ids were held: nobody would run them (a hang).
        The parent is asked: it holds them (taken back at the death) or they run again.
        """
        d = self.st.server
        assert d is not None
        ask: set[int] = set()
        for x in sorted(new & set(self.vouched)):
            path, epoch, ids = self.vouched.pop(x)
            child = d.children.get(path)
            if child is None or epoch != self.st.epoch:
                continue  # (dead too: its ids are in question with it; or a switch carried its record)
            gone = ids.copy()
            gone.remove_ranges(child.held.ranges())
            moved = ids.copy()
            moved.remove_ranges(gone.ranges())
            if not moved:
                continue  # (finished, or handed back, since)
            child.held.remove_ranges(moved.ranges())
            d.held_total -= len(moved)
            self.recon = self.recon or Reconciliation(now=self.st.clock())
            ask |= self.recon.add_dead(moved, _told(x, old, failed) - {self.st.rank} or {path}, None)
        return ask

    def _take_over(self, old: Hierarchy, nh: Hierarchy, wall: float, how: str) -> tuple[set[int], list[Effect]]:
        """This rank is the new master: the ledger from the mirror (and the checkpoint); reconcile everything."""
        st = self.st
        effects: list[Effect] = []
        ledger = self.mirror
        source = "deputy's copy"
        if ledger is None:
            ledger = Ledger(st.total, width=st.width)
            source = "checkpoint"
        if not ledger.complete():
            # The copy may lack the last commits (a message lost with the master); the checkpoint
            # file may have them (the master writes it before releasing anyone).
            st.loading = True
            effects.append(LoadCheckpoint())
            if source != "checkpoint":
                source = "deputy's copy + checkpoint"
        st.ledger = ledger
        # Ids at or above the master's mark were never handed out: nobody can hold them, and
        # the new master hands them out on its next tick (Station.tick) while the survivors say
        # what they hold of the rest. Without the deputy's copy, nothing is known to be free.
        self.mark = self.mirror_mark if self.mirror is not None and self.mirror_mark >= 0 else st.total
        self.free = RangeSet(ledger.to_hand_out().within(self.mark, st.total))
        self.mirror = None
        self.failures = self.mirror_failures + self.failures  # recoveries the dead master had recorded
        record = replace(_record(old.master, old, len(ledger.remaining()), how, st.rank, wall), ledger_from=source,
                         free=len(self.free))
        st.planner = None  # the new master keeps the plan it finds
        if ledger.complete() and self.recon is None:
            # The job was over (the old master copies its last commits here before releasing
            # anyone): nothing to reconcile; ranks already released will not ask again.
            st.job_over = True
            self.failures.append(record.closed(0, (), wall))
            return set(), effects
        recon = self.recon or Reconciliation(now=st.clock())
        recon.everything = True
        self.recon = recon
        survivors = expected(old.master, old, st.failed) - {st.rank}
        if self.replanning.may_have_switched:
            # After a plan switch, ids handed out under an earlier plan (the dead master's carried,
            # never copied here) may be in the hands of ranks whose new parents do not know of
            # them: everyone says what it holds, or they would run again. (Under --levels auto
            # even in the first plan: the last switch's Regroup may have missed this rank.)
            survivors = set(range(st.size)) - st.failed - {st.rank}
        return recon.add_dead(RangeSet(), survivors, record), effects

    def _relayout(self, nh: Hierarchy) -> list[Effect]:
        """Give this rank the roles ``nh`` says, keeping every id it holds; return the effects."""
        st = self.st
        outs: list[Effect] = []
        old_d = st.server
        st.hierarchy = nh
        st.info = info = nh[st.rank]
        w = st.worker
        weights = {c: nh[c].weight for c in info.children}
        if w is not None and (info.children or info.role is Role.MASTER):
            weights[st.rank] = 1
        c = st.config
        d: Server | None = old_d
        now = st.clock()
        if info.role is Role.MASTER and not isinstance(old_d, Master):
            assert st.ledger is not None
            if old_d is not None:
                old_d.close_boards(0, now)  # (its boards stay; the master's serve the same children)
            d = Master(nh, st.rank, {}, st.clock, st.boards, st.sizing, st.ledger,
                       c.task_retries if c.on_task_error == "retry" else 0, st.ft, st.epoch)
            d.queue = RangeSet()  # nothing below the mark is handed out before the reconciliation says what is free
            if isinstance(old_d, Region):
                d.absorb(old_d)  # (its queue, children and buffered completions come along)
                st.retire_server()
            d.published_top = self.mark  # (the ids above it, self.free, go out on the next tick: see Station.tick)
            d.count_timeouts(st.ledger.timeouts)
            d.deaths.raise_to(self.mirror_deaths)  # (counted by the master that died)
        elif info.role is Role.REGION and old_d is None:
            assert info.parent is not None
            d = Region(nh, st.rank, {}, st.clock, st.boards, st.sizing, info.parent, c.batch, c.batch_age,
                       st.epoch, st.measured)
        elif isinstance(d, Region) and info.role is Role.REGION:
            assert info.parent is not None
            d.reparent(info.parent)  # the want went to a dead parent: claim from the new one
        elif isinstance(d, Region) and info.role is Role.SLAVE:
            # Every child died: no region left to serve. Its ids go back up; its own loop goes on.
            assert info.parent is not None
            d.close_boards(0, now)
            returned = d.queue.copy()
            returned.add_ranges(d.up_returned.ranges())
            own = d.children.get(st.rank)
            if own is not None:
                returned.remove_ranges(own.held.ranges())  # still this rank's own worker's
            outs.append(Send(info.parent, Report(d.up_done.ranges(), tuple(d.up_results), returned.ranges(),
                                                 tuple(d.up_failed), epoch=st.epoch, task_max=d.task_max)))
            st.retire_server()
            d = None
        if d is not None:
            d.quarantine = c.quarantine
            d.track_settled = True
            for r in [r for r in d.children if r not in weights]:
                d.requeue_lost(d.drop_child(r))  # (not expected: children only change by dying)
            for r, wt in weights.items():
                if r in d.children:
                    d.set_weight(r, wt)
                else:
                    kind = UPPER if r != st.rank and nh[r].children else LEAF
                    child = d.adopt_child(r, wt, kind)
                    if r == st.rank and w is not None:
                        d.attach(child, w.holding())  # this rank's own loop is now served here
                        if w.state is State.LEFT:
                            d.child_left(child)  # (it left while it was someone else's child)
            st.leave_out(d)
            if isinstance(d, Region):
                d.relaid(info.weight)
        st.server = d
        if w is None:
            return outs
        parent = st.rank if d is not None else info.parent
        assert parent is not None
        w.reparent(parent, st.boards.slots(LEAF), st.epoch)
        return outs

    @property
    def held_ids(self) -> RangeSet:
        """Every id this rank and its subtree hold, completions in flight to live parents included."""
        return self.holding()

    def holding(self, sent: bool = True) -> RangeSet:
        """Every id this rank and its subtree hold, for a Holding (``sent``: and :meth:`sent`)."""
        held = RangeSet()
        w, d = self.st.worker, self.st.server
        if w is not None:
            held.add_ranges(w.holding().ranges())
        if d is not None:
            held.add_ranges(d.queue.ranges())
            held.add_ranges(d.published().ranges())
            for ch in d.children.values():
                held.add_ranges(ch.held.ranges())
            for taken in d.strangers.values():
                held.add_ranges(taken.ranges())
            if isinstance(d, Region):
                held.add_ranges(d.up_done.ranges())
                held.add_ranges(d.up_returned.ranges())
                for f in d.up_failed:
                    held.add(f.id, f.id + 1)
        if self.recon is not None:
            held.add_ranges(self.recon.held.ranges())
        if sent:
            held.add_ranges(self.delivery.sent().ranges())
        return held

    def _ask(self, recon: Reconciliation, ranks: set[int]) -> list[Effect]:
        """Ask ``ranks`` what they hold (a numbered question naming every death this rank knows of)."""
        names = tuple(sorted(self.st.failed))
        return [Send(r, Holding((), names, True, recon.token(r))) for r in sorted(ranks)]

    def _finish_recon(self) -> list[Effect]:
        """Every expected Holding is in (and the ledger loaded): requeue what nobody holds."""
        st = self.st
        recon, d = self.recon, st.server
        if recon is None or not recon.complete or d is None or st.loading:
            return []
        behind = recon.behind(st.epoch) if recon.everything else set()
        if behind:
            # Answers written under an older plan than this rank's: until every old board is
            # closed an id can move between two answers (a lagging rank answers, then claims from
            # its region-master's board; the region-master switches, the id its child's now, and
            # answers without it): nobody's. Asked again: a rank answers once it runs this plan.
            return self._ask(recon, behind)
        d.scan(st.clock())
        if recon.everything:
            assert isinstance(d, Master)
            question = d.ledger.remaining()
            question.remove_ranges(d.queue.ranges())
            question.remove_ranges(d.published().ranges())
            question.remove_ranges(d.carried.ranges())
            for ch in d.children.values():
                question.remove_ranges(ch.held.ranges())
            for taken in d.strangers.values():
                question.remove_ranges(taken.ranges())
            for tid in d.ledger.failed:
                question.remove(tid, tid + 1)
            question.remove_ranges(self.free.ranges())  # (free, not lost: queued on the next tick)
        else:
            question = recon.held.copy()
            if isinstance(d, Master):
                question.remove_ranges(d.ledger.committed.ranges())
            # After a switch the question is the master's carried ids, asked of everyone but itself,
            # while they keep coming back: its own loop's hand from before the switch is among them,
            # and so are ids a region gave back since, published again. Requeued, each ran twice.
            for out in (d.queue, d.published()):
                question.remove_ranges(out.ranges())
            if st.worker is not None:
                question.remove_ranges(st.worker.holding().ranges())
        lost = recon.lost(question, d.settled, self.lost_seen)
        if recon.everything and self.given_again:
            # Ids given back to the master that died run again unless an answer to this question
            # holds them (handed out again since; older records, stale after a switch, do not count).
            assert isinstance(d, Master)
            again, self.given_again = d.unrecorded(self.given_again), RangeSet()
            for answers in (recon.got, recon.got_sent):
                for held in answers.values():
                    again.remove_ranges(held.ranges())
            for out in (d.queue, d.published()):
                again.remove_ranges(out.ranges())
            if st.worker is not None:
                again.remove_ranges(st.worker.holding().ranges())  # (this rank answers no question of its own)
            lost.add_ranges(again.ranges())
        last = recon.records[-1] if recon.records else None
        where = (last.rank, st.hosts[last.rank] if last.rank < len(st.hosts) else "", last.how) if last else (-1, "", "")
        # A dead master's queue was never in flight: its ids count no death toward quarantine.
        if recon.everything and self.mirror_hand:
            # What the dead master's own loop held was in flight (its task may have killed it):
            # that death counts toward quarantine, unlike the rest of its queue.
            inside = RangeSet()
            for a, b in self.mirror_hand:
                inside.add_ranges(lost.within(a, b))
            lost.remove_ranges(inside.ranges())
            self.mirror_hand = ()
            if inside:
                d.requeue_lost(inside, *where, count=True)
        if recon.everything and self.timed_out_hand:
            # (counted already, in the checkpoint the given-up master left: judged, not counted again)
            judged = RangeSet()
            for a, b in self.timed_out_hand.ranges():
                judged.add_ranges(lost.within(a, b))
            lost.remove_ranges(judged.ranges())
            self.timed_out_hand = RangeSet()
        else:
            judged = RangeSet()
        n0, q0 = d.requeue_lost(judged, *where, count=False, judge=True) if judged else (0, [])
        n, quarantined = d.requeue_lost(lost, *where, count=not recon.everything, in_flight=False)
        n, quarantined = n + n0, q0 + quarantined
        self._close(recon.records, n, tuple(quarantined), recon.last_death)
        self.recon = None
        d.reconciling = False
        return st.serve()

    def _close(self, records: list[FailureRecord] | tuple[FailureRecord, ...], requeued: int,
               quarantined: tuple[int, ...], since: float) -> None:
        """A reconciliation is over: its deaths' records, closed now (what it requeued and quarantined
        counted once, on the first)."""
        wall = self.st.wall()
        for record in records:
            self.failures.append(record.closed(requeued, quarantined, wall, since=since))
            requeued, quarantined = 0, ()

    def _mirror_full(self, dep: int | None) -> list[Effect]:
        """The master: (re)start the deputy's copy with the whole ledger."""
        self.mirror_to = dep if dep is not None else -1
        d = self.st.server
        assert isinstance(d, Master)
        d.mirror_done, d.mirror_results, d.mirror_failed = RangeSet(), [], []
        if dep is None:
            return []
        led = d.ledger
        results = tuple(zip(led.result_ids.tolist(), led.result_rows()))
        self.mirrored_failures = len(self.failures)
        d.mirror_timeouts = {}
        self._move_mark(d)
        return [Send(dep, Mirror(led.committed.ranges(), results, led.total, led.width, True, tuple(self.failures),
                                 tuple(led.failed.values()), tuple(led.timeouts.items()), self._deaths(d),
                                 mark=self.mark))]

    def _move_mark(self, d: Master) -> bool:
        """Keep the mark copied to the deputy ahead of what the master publishes; return whether it moved.

        The mark moves once publishing is within half a step of it, so the copy with the new
        mark is on its way before any id above the old one is handed out, unless one round of
        publishing took more than half a step (the job's first, say): then the copy goes out
        just after, in the same step (before it, the deputy knows no mark: nothing is free).
        A copy lost with the master would make a takeover hand out again ids someone holds:
        run twice, never lost.
        """
        total = d.ledger.total
        step = max(int(total * RESERVE_SHARE), 2)
        if self.mark >= total or d.published_top + step // 2 <= self.mark:
            return False
        self.mark = min(total, max(self.mark, d.published_top + step))
        return True

    @staticmethod
    def _deaths(d: Master) -> tuple[Ranges, ...]:
        """The master's death counts, for the deputy (as ranges per count: a few, whatever the ids held)."""
        return d.deaths.ranges()

    def mirror_out(self, force: bool = False) -> list[Effect]:
        """The master: send the deputy what was committed since the last copy (batched), or a heartbeat."""
        st = self.st
        d = st.server
        if not isinstance(d, Master) or not d.mirror:
            return []
        now = st.clock()
        if self.mirror_to is None:
            self.mirror_sent = now
            return self._mirror_full(deputy(st.hierarchy))
        if self.mirror_to < 0:  # one process: nobody to copy to
            d.mirror_done, d.mirror_results, d.mirror_failed, d.mirror_timeouts = RangeSet(), [], [], {}
            self.delivery.mark_safe()
            return []
        w = st.worker
        hand = w.holding().ranges()[:64] if w is not None else ()
        moved = hand != self.hand_sent
        marked = self._move_mark(d)
        waiting = (len(d.mirror_done) + len(d.mirror_failed) + len(self.failures) - self.mirrored_failures
                   + len(d.mirror_timeouts) + int(moved) + int(marked))
        if not waiting:
            if now - self.mirror_sent < st.config.lease / BEATS:
                return []
            self.mirror_sent = now  # a heartbeat: the deputy watches for the master's silence
            self.delivery.copied()
            return [Send(self.mirror_to, Mirror((), (), d.ledger.total, d.ledger.width, mark=self.mark))]
        if waiting < MIRROR_BATCH and now - self.mirror_sent < MIRROR_AGE and not force and not moved and not marked:
            return []
        self.mirror_sent = now
        news = tuple(self.failures[self.mirrored_failures:])
        self.mirrored_failures = len(self.failures)
        msg = Mirror(d.mirror_done.ranges(), tuple(d.mirror_results), d.ledger.total, d.ledger.width, False, news,
                     tuple(d.mirror_failed), tuple(d.mirror_timeouts.items()), self._deaths(d) if news else (),
                     hand if moved else None, self.mark)
        self.hand_sent = hand
        d.mirror_done, d.mirror_results, d.mirror_failed, d.mirror_timeouts = RangeSet(), [], [], {}
        self.delivery.copied()
        return [Send(self.mirror_to, msg)]
