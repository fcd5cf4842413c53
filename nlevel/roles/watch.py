"""Who watches whom: heartbeats and leases, and task time limits. Pure Python.

MPI reports a process that was killed, never one that hangs (SIGSTOP, a task that holds the
GIL for ever) and never a task that runs too long. Liveness is a heartbeat, never inferred
from task times, so a task of any length never makes its process look hung:

* **Heartbeats.** Every rank sends its parent a :class:`~nlevel.roles.messages.Heartbeat`
  every beat (:func:`beat_period`: a fifth of ``--lease``), and the master its watchers. The
  runtime steps a rank's loop from a thread while the user's task runs
  (:class:`~nlevel.runtime.rank.Runner`), so a rank beats (and answers messages) whatever its
  task does; a process that is stopped, or whose task holds the GIL, does not.
* **Leases.** A server kills a child it has not heard from (a claim, a report, a beat) for
  ``--lease``, and a survivor that does not answer a reconciliation within one. A rank on another
  host is killed by a rank on its host (:class:`~nlevel.roles.messages.KillRequest`); when no
  process there acts within a further lease (the whole node is stopped, or cut off), the rank is
  *given up* (:class:`~nlevel.roles.events.GiveUp`: treated as dead although its process may live
  on). Under fault tolerance the others carry on without it; without, the master stops the job
  cleanly (exit 75, the checkpoint written), to be resumed on the nodes that remain.
* **Watchers.** The master's first :data:`WATCHERS` survivors after it watch it: the deputy
  through its copy of the ledger (:class:`~nlevel.roles.messages.Mirror`, sent at least every
  beat), the next one through Heartbeats. The deputy kills a master silent for a lease; the
  second watcher waits two, so that it acts only when the deputy cannot (hung with the
  master). Then the deputy, master in turn and as silent, is killed two leases later, and the
  next survivor takes over from the checkpoint file.
* **Task time limit** (``--task-timeout``). Each rank watches its own task: the runtime
  tells it, with :class:`~nlevel.roles.events.Overran`, that the task in hand has run past the
  limit. With fault tolerance the rank tells its parent (the master: its deputy) and is
  killed; without, it is given up (:class:`~nlevel.roles.events.Abandon`: MPI would end the
  whole job if it were killed) and the job stops cleanly, to be resumed. Either way the id
  counts toward quarantine as a timeout, and the master keeps the count across runs. A task
  that holds the GIL past the limit silences the thread that would tell: its lease catches it.
"""

from __future__ import annotations

from ..model.hierarchy import Hierarchy, Role
from .core import StationCore
from .events import Abandon, Effect, GiveUp, Kill, Send, Watch
from .master import Master
from .messages import FailureRecord, Gone, Heartbeat, TimedOut
from .recovery import deputy

__all__ = ["Watching", "WATCHERS", "BEATS", "WATCH_PERIOD", "GIVEN_UP", "beat_period", "watchers"]

#: How many ranks watch the master (the deputy first; the second judges after two leases).
WATCHERS = 2
#: Beats per lease: a rank is taken for hung only after this many beats in a row went missing.
BEATS = 5
#: Seconds between two looks at whether watched processes still exist (see :meth:`Watching.watch`).
WATCH_PERIOD = 0.05
#: How a rank that could not be killed is recorded (the start of its failure's ``how``): without
#: fault tolerance the master stops the job when it hears of one (see :meth:`Watching.unkillable`).
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


class Watching(StationCore):
    """The watching part of a station: leases, the master's watchers, task time limits."""

    # -- heartbeats --------------------------------------------------------------------------
    def heartbeats(self) -> list[Effect]:
        """Every beat: a Heartbeat to this rank's parent; the master's to its watchers (the deputy
        has the master's Mirror copies under fault tolerance)."""
        now = self.clock()
        if now - self.heartbeat_sent < beat_period(self.config.lease) or self.released is not None:
            return []
        self.heartbeat_sent = now
        beat = Heartbeat(self.epoch, self.running_now(now))
        if isinstance(self.server, Master):
            dep = deputy(self.hierarchy) if self.ft else None
            return [Send(r, beat) for r in watchers(self.hierarchy) if r != dep and r not in self.failed]
        parent = self.info.parent
        if parent is None or parent in self.failed:
            return []
        return [Send(parent, beat)]

    def running_now(self, now: float) -> float:
        """Seconds this rank and its subtree have spent in tasks still running (as last heard from each):
        busy time that no report has brought up yet (the progress line's measured overhead)."""
        total = self.own_running
        d = self.server
        if d is not None:
            for child in d.children.values():
                if child.running > 0.0 and child.rank != self.rank:
                    total += child.running + (now - child.running_at)
        return total

    def on_heartbeat(self, src: int, running: float = 0.0) -> list[Effect]:
        """Rank ``src`` is alive: a child (its lease starts again), or the master this rank watches.
        ``running``: its subtree's seconds in tasks still running."""
        now = self.clock()
        d = self.server
        if d is not None:
            child = d.children.get(src)
            if child is not None:
                child.heard = now
                child.running, child.running_at = running, now
        if src == self.hierarchy.master:
            self.master_heard = now
        return []

    def watch_master(self) -> list[Effect]:
        """A watcher: a master silent past its lease is hung: have it killed (once per lease)."""
        h = self.hierarchy
        if isinstance(self.server, Master) or self.rank not in watchers(h):
            self.watching = None
            return []
        now = self.clock()
        if self.watching != h.master:
            self.watching = h.master  # a new master (or a new watcher): its lease starts now
            self.master_heard = now
            self.watched_at = now
            return []
        if now - self.watched_at > self.config.lease / 2:
            # (this rank did not run for half a lease: the master's beats may be waiting to be read)
            self.master_heard = max(self.master_heard, now - self.config.lease / 2)
        self.watched_at = now
        lease = self.config.lease
        if self.rank != deputy(h):
            lease *= 2  # (the deputy judges first; this one only when the deputy cannot)
        if self.pending_release is not None:
            # The master is releasing the job (its last checkpoint written) and may be writing its
            # report while nothing steps its loop: killed now, the job would end without its report
            # (or with the deputy's, which lacks the other ranks' rows). Only a master hung far
            # longer is killed.
            lease *= 6
        if now - self.master_heard <= lease:
            return []
        self.master_heard = now
        return self._kill(h.master, "was silent for a lease as the master (hung)", now)

    def watched(self) -> list[int]:
        """Ranks whose processes this rank checks are still there (its children, and the master it watches)."""
        out = [r for r in (self.server.children if self.server is not None else ()) if r != self.rank]
        if self.watching is not None and self.watching not in self.failed:
            out.append(self.watching)
        return out

    def watch(self) -> list[Effect]:
        """Every :data:`WATCH_PERIOD`: have the runtime look whether the watched processes still exist
        (a process that exited is never reported by MPI; one found gone comes back as a death)."""
        now = self.clock()
        if now - self.looked_at < WATCH_PERIOD:
            return []
        self.looked_at = now
        watched = self.watched()
        return [Watch(tuple(watched))] if watched else []

    # -- leases and time limits ---------------------------------------------------------------
    def lease_kills(self) -> list[Effect]:
        """Children silent for a lease and survivors that do not answer a reconciler within one: kill them.

        MPI then reports them dead; without ULFM the job stops and the checkpoint resumes it: never a hang.
        """
        d = self.server
        if d is None:
            return []
        lease = self.config.lease
        now = self.clock()
        # Looking ten times per lease finds a silent child at most 10 % late, instead of scanning
        # every child on every tick.
        gap = now - self.leases_checked
        if gap < lease / 10:
            return []
        self.leases_checked = now
        if lease / 2 < gap < 1e300:
            # This rank itself did not run for half a lease (a loaded machine, a swap storm): what it
            # has not heard meanwhile may be waiting for it. Every child gets a whole lease from now.
            for child in d.children.values():
                child.heard = max(child.heard, now - lease / 2)
            if self.recon is not None:
                self.recon.started = max(self.recon.started, now - lease / 2)
        late = [(r, "was silent for a lease (hung: stopped, or its task holds the GIL)")
                for r in d.overdue(now, lease)]
        recon = self.recon
        if recon is not None and recon.expected and now - recon.started > lease:
            late += [(r, "did not answer a reconciliation within a lease") for r in sorted(recon.expected - recon.killed)]
            recon.killed |= recon.expected
        outs: list[Effect] = []
        for r, why in late:
            outs += self._kill(r, why, now)
        return outs

    def _kill(self, rank: int, why: str, now: float) -> list[Effect]:
        """Kill ``rank``, and remember it: a rank that outlives its kill by a lease is given up."""
        if rank not in self.killing:
            if not self.killing:
                self.kills_checked = now
            self.killing[rank] = (now, why)
        return [Kill(rank, why)]

    def unkillable(self) -> list[Effect]:
        """Ranks this one had killed that are still not dead a lease later: give them up.

        A rank on another host is killed by a rank on its host; when that host's processes are
        all stopped, or its link is cut, nobody carries the kill out and MPI never reports the
        rank dead. It is given up (:class:`GiveUp`, handled as a death told to every rank): under
        fault tolerance the job goes on without it; without, the master stops the job (see
        :meth:`~nlevel.roles.failures.Failures.fail`). A rank that itself did not run for half a
        lease (what would prove the kill done may be waiting to be read) waits a lease more.
        """
        if not self.killing:
            return []
        lease = self.config.lease
        now = self.clock()
        starved = now - self.kills_checked > lease / 2
        self.kills_checked = now
        outs: list[Effect] = []
        for r, (since, why) in sorted(self.killing.items()):
            if r in self.failed:
                del self.killing[r]
            elif starved:
                self.killing[r] = (max(since, now - lease / 2), why)
            elif now - since > lease:
                del self.killing[r]
                outs.append(GiveUp(r, f"{why}, and was still there a lease after it was killed (its host did "
                                       f"not act: stopped, cut off or gone)"))
        return outs

    def _host(self, rank: int) -> str:
        return self.hosts[rank] if 0 <= rank < len(self.hosts) else ""

    def overran(self, task: int, seconds: float) -> list[Effect]:
        """This rank's own task ``task`` has run ``seconds``, past ``--task-timeout`` (the runtime watches it).

        Its parent (the master's: its deputy) must count the timeout, since this rank goes: killed
        under fault tolerance, given up without. The master too without fault tolerance: given up,
        it serves no more and its deputy takes over, counts the timeout and stops the job. The
        deputy has no copy of the ledger then: it takes over from the checkpoint the master writes
        as it leaves (see Loop.perform), which must hold this timeout too, the count of earlier
        runs included (the deputy's own count starts at 1, and a merge keeps the larger).
        """
        limit = self.config.task_timeout
        if not limit or self.abandoned or task in self.overran_tasks:
            return []
        self.overran_tasks.add(task)
        ids = ((task, task + 1),)
        why = f"ran task {task} past --task-timeout {limit:g} s"
        outs: list[Effect] = []
        successor = self.info.parent if self.info.parent is not None else deputy(self.hierarchy)
        if successor is not None and successor not in self.failed:
            outs.append(Send(successor, TimedOut(self.rank, ids, limit, self._host(self.rank))))
        if isinstance(self.server, Master) and (successor is None or not self.ft):
            outs += self.note_timeout(self.rank, ids)
        # (the last rank is given up even under fault tolerance: killed, nobody would end the job)
        if self.ft and not self.alone:
            outs.append(Kill(self.rank, why))
        else:
            outs.append(Abandon(self.rank, why))  # (the runtime writes the ledger first: then the notices)
            outs += self.abandon_self(why)
        return outs

    def note_timeout(self, rank: int, ids: tuple[tuple[int, int], ...]) -> list[Effect]:
        """The master: count a timeout of ``ids`` (kept in the checkpoint); without fault tolerance, stop the job."""
        d = self.server
        if not isinstance(d, Master) or self.ledger is None:
            self.timeout_notes.append((rank, ids))  # the deputy: for when it takes over
            if rank == self.hierarchy.master and not self.ft:
                # The master's own task, given up without fault tolerance: the master counted this
                # timeout in the checkpoint it leaves, which this rank takes over from; an id at its
                # quarantine then must not be handed out again (see Failures._finish_recon).
                self.timed_out_hand.add_ranges(ids)
            return []
        led = self.ledger
        for a, b in ids:
            for tid in range(a, b):  # (one id: a timeout is told per task)
                led.timeouts[tid] = led.timeouts.get(tid, 0) + 1
                d.timeouts[tid] = max(d.timeouts.get(tid, 0), led.timeouts[tid])
                d.mirror_timeouts[tid] = led.timeouts[tid]
        if self.ft or d.stopped:
            return []
        # Without fault tolerance the hung rank cannot be killed without ending the job:
        # stop cleanly (running tasks finish, everything is written), exit 75, resume later.
        return self.stop("task timeout")

    def on_timed_out(self, msg: TimedOut) -> list[Effect]:
        """A task ran past its limit somewhere below: count it here (quarantine), and at the master."""
        d = self.server
        child = d.children.get(msg.rank) if d is not None else None
        if child is not None and not child.leased:
            child.leased = f"ran past --task-timeout {msg.seconds:g} s"
        if d is not None:
            for a, b in msg.ids:
                for tid in range(a, b):  # (one id: a timeout is told per task)
                    d.timeouts[tid] = d.timeouts.get(tid, 0) + 1
        if isinstance(d, Master) or deputy(self.hierarchy) == self.rank and msg.rank == self.hierarchy.master:
            return self.note_timeout(msg.rank, msg.ids)
        return [Send(self.hierarchy.master, msg)]

    def abandon_self(self, why: str) -> list[Effect]:
        """This rank's own task hung and it cannot be killed (no fault tolerance): it leaves the job.

        Every live rank is told it is gone (and handles it like a death); this rank stops taking part.
        The last rank (a master alone, e.g. a one-process job) does here what a successor would:
        the job stops (``"task timeout"``, with or without fault tolerance: nobody is left to run
        the rest), its own ids count a death (toward quarantine) and the death is recorded for the
        report. The process must then end the job itself (the runtime writes the checkpoint and
        the report, and exits with the job's status).
        """
        self.abandoned = True
        others = [r for r in range(self.size) if r not in self.failed and r != self.rank]
        d = self.server
        if not others and isinstance(d, Master):
            self.stop_reason = self.stop_reason or "task timeout"
            d.stop(self.clock())
            if self.rank in d.children:
                host = self._host(self.rank)
                held = d.drop_child(self.rank)
                info = self.info
                record = FailureRecord(self.rank, info.role.value, info.level, why, self.rank, self.wall(), len(held))
                n, quarantined = d.requeue_lost(held, self.rank, host, why)
                self.failures.append(record.closed(n, tuple(quarantined), self.wall()))
        gone = Gone((self.rank,), why)
        return [Send(r, gone) for r in others]

    @property
    def alone(self) -> bool:
        """Whether every other rank of the job has died or been given up."""
        return all(r == self.rank or r in self.failed for r in range(self.size))
