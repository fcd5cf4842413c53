"""Who watches whom: heartbeats and leases, and task time limits: one sub-machine of a :class:`~nlevel.roles.station.Station`. Pure Python.

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

from .ending import Closing
from .events import Abandon, Effect, GiveUp, Kill, Send, Watch
from .failures import Recovery
from .host import Host
from .master import Master
from .messages import FailureRecord, Gone, Heartbeat, TimedOut
from .recovery import WATCH_PERIOD, beat_period, deputy, watchers

__all__ = ["Watching"]

class Watching:
    """Liveness on one rank: heartbeats, leases, the master's watchers, kills, task time limits."""

    def __init__(self, st: Host, recovery: Recovery, closing: Closing) -> None:
        self.st = st
        self.recovery = recovery
        self.closing = closing
        now = st.clock()
        self.heartbeat_sent = now  # (its parent heard it at the start: the first beat is one period on)
        self.own_running = 0.0  # seconds its user loop has spent in the task it runs now (see Tick)
        self.master_watched: int | None = None  # the master this rank watches now
        self.master_heard = now  # a watcher: when the master was last heard (it heartbeats)
        self.watched_at = 0.0  # when this rank last looked at the master's silence
        self.looked_at = -1e300  # when it last had the runtime look for processes that exited
        self.leases_checked = -1e300  # when it last looked for children silent for a lease
        self.killing: dict[int, tuple[float, str]] = {}  # ranks this one had killed: (since when, why), until dead
        self.kills_checked = 0.0  # when `killing` was last looked at
        self.overran_tasks: set[int] = set()  # this rank's own tasks past --task-timeout, told once

    def heard_master(self) -> None:
        """The master was heard from (its copy to the deputy counts as a beat)."""
        self.master_heard = self.st.clock()

    # -- heartbeats --------------------------------------------------------------------------
    def heartbeats(self) -> list[Effect]:
        """Every beat: a Heartbeat to this rank's parent; the master's to its watchers (the deputy
        has the master's Mirror copies under fault tolerance)."""
        st = self.st
        now = st.clock()
        if now - self.heartbeat_sent < beat_period(st.config.lease) or self.closing.released is not None:
            return []
        self.heartbeat_sent = now
        beat = Heartbeat(st.epoch, self.running_now(now))
        if isinstance(st.server, Master):
            dep = deputy(st.hierarchy) if st.ft else None
            return [Send(r, beat) for r in watchers(st.hierarchy) if r != dep and r not in st.failed]
        parent = st.info.parent
        if parent is None or parent in st.failed:
            return []
        return [Send(parent, beat)]

    def running_now(self, now: float) -> float:
        """Seconds this rank and its subtree have spent in tasks still running (as last heard from each):
        busy time that no report has brought up yet (the progress line's measured overhead)."""
        total = self.own_running
        d = self.st.server
        if d is not None:
            for child in d.children.values():
                if child.running > 0.0 and child.rank != self.st.rank:
                    total += child.running + (now - child.running_at)
        return total

    def on_heartbeat(self, src: int, running: float = 0.0) -> list[Effect]:
        """Rank ``src`` is alive: a child (its lease starts again), or the master this rank watches.
        ``running``: its subtree's seconds in tasks still running."""
        st = self.st
        now = st.clock()
        d = st.server
        if d is not None:
            child = d.children.get(src)
            if child is not None:
                child.heard = now
                child.running, child.running_at = running, now
        if src == st.hierarchy.master:
            self.master_heard = now
        return []

    def watch_master(self) -> list[Effect]:
        """A watcher: a master silent past its lease is hung: have it killed (once per lease)."""
        st = self.st
        h = st.hierarchy
        if isinstance(st.server, Master) or st.rank not in watchers(h):
            self.master_watched = None
            return []
        now = st.clock()
        if self.master_watched != h.master:
            self.master_watched = h.master  # a new master (or a new watcher): its lease starts now
            self.master_heard = now
            self.watched_at = now
            return []
        if now - self.watched_at > st.config.lease / 2:
            # (this rank did not run for half a lease: the master's beats may be waiting to be read)
            self.master_heard = max(self.master_heard, now - st.config.lease / 2)
        self.watched_at = now
        lease = st.config.lease
        if st.rank != deputy(h):
            lease *= 2  # (the deputy judges first; this one only when the deputy cannot)
        if self.closing.pending_release is not None:
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
        st = self.st
        if self.closing.released is not None:
            # The job is over for this rank: the ranks it released exit now, and a master still
            # writing its report must not take them for failures (nor anyone for its own master).
            return []
        out = [r for r in (st.server.children if st.server is not None else ()) if r != st.rank]
        if self.master_watched is not None and self.master_watched not in st.failed:
            out.append(self.master_watched)
        return out

    def watch(self) -> list[Effect]:
        """Every :data:`WATCH_PERIOD`: have the runtime look whether the watched processes still exist
        (a process that exited is never reported by MPI; one found gone comes back as a death)."""
        now = self.st.clock()
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
        st = self.st
        d = st.server
        if d is None:
            return []
        lease = st.config.lease
        now = st.clock()
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
            if self.recovery.recon is not None:
                self.recovery.recon.started = max(self.recovery.recon.started, now - lease / 2)
        late = [(r, "was silent for a lease (hung: stopped, or its task holds the GIL)")
                for r in d.overdue(now, lease)]
        recon = self.recovery.recon
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
        :meth:`~nlevel.roles.failures.Recovery.fail`). A rank that itself did not run for half a
        lease (what would prove the kill done may be waiting to be read) waits a lease more.
        """
        st = self.st
        if not self.killing:
            return []
        lease = st.config.lease
        now = st.clock()
        starved = now - self.kills_checked > lease / 2
        self.kills_checked = now
        outs: list[Effect] = []
        for r, (since, why) in sorted(self.killing.items()):
            if r in st.failed:
                del self.killing[r]
            elif starved:
                self.killing[r] = (max(since, now - lease / 2), why)
            elif now - since > lease:
                del self.killing[r]
                outs.append(GiveUp(r, f"{why}, and was still there a lease after it was killed (its host did "
                                       f"not act: stopped, cut off or gone)"))
        return outs

    def _host(self, rank: int) -> str:
        return self.st.hosts[rank] if 0 <= rank < len(self.st.hosts) else ""

    def overran(self, task: int, seconds: float) -> list[Effect]:
        """This rank's own task ``task`` has run ``seconds``, past ``--task-timeout`` (the runtime watches it).

        Its parent (the master's: its deputy) must count the timeout, since this rank goes: killed
        under fault tolerance, given up without. The master too without fault tolerance: given up,
        it serves no more and its deputy takes over, counts the timeout and stops the job. The
        deputy has no copy of the ledger then: it takes over from the checkpoint the master writes
        as it leaves (see Loop.perform), which must hold this timeout too, the count of earlier
        runs included (the deputy's own count starts at 1, and a merge keeps the larger).
        """
        st = self.st
        limit = st.config.task_timeout
        if not limit or st.abandoned or task in self.overran_tasks:
            return []
        self.overran_tasks.add(task)
        ids = ((task, task + 1),)
        why = f"ran task {task} past --task-timeout {limit:g} s"
        outs: list[Effect] = []
        successor = st.info.parent if st.info.parent is not None else deputy(st.hierarchy)
        if successor is not None and successor not in st.failed:
            outs.append(Send(successor, TimedOut(st.rank, ids, limit, self._host(st.rank))))
        if isinstance(st.server, Master) and (successor is None or not st.ft):
            outs += self.note_timeout(st.rank, ids)
        # (the last rank is given up even under fault tolerance: killed, nobody would end the job)
        if st.ft and not self.alone:
            outs.append(Kill(st.rank, why))
        else:
            outs.append(Abandon(st.rank, why))  # (the runtime writes the ledger first: then the notices)
            outs += self.abandon_self(why)
        return outs

    def note_timeout(self, rank: int, ids: tuple[tuple[int, int], ...]) -> list[Effect]:
        """The master: count a timeout of ``ids`` (kept in the checkpoint); without fault tolerance, stop the job."""
        st = self.st
        d = st.server
        if not isinstance(d, Master) or st.ledger is None:
            self.recovery.timed_out(rank, ids)  # the deputy: for when it takes over
            return []
        led = st.ledger
        for a, b in ids:
            for tid in range(a, b):  # (one id: a timeout is told per task)
                led.timeouts[tid] = led.timeouts.get(tid, 0) + 1
                d.timeouts[tid] = max(d.timeouts.get(tid, 0), led.timeouts[tid])
                d.mirror_timeouts[tid] = led.timeouts[tid]
        if st.ft or d.stopped:
            return []
        # Without fault tolerance the hung rank cannot be killed without ending the job:
        # stop cleanly (running tasks finish, everything is written), exit 75, resume later.
        return st.stop("task timeout")

    def on_timed_out(self, msg: TimedOut) -> list[Effect]:
        """A task ran past its limit somewhere below: count it here (quarantine), and at the master."""
        st = self.st
        d = st.server
        child = d.children.get(msg.rank) if d is not None else None
        if child is not None and not child.leased:
            child.leased = f"ran past --task-timeout {msg.seconds:g} s"
        if d is not None:
            for a, b in msg.ids:
                for tid in range(a, b):  # (one id: a timeout is told per task)
                    d.timeouts[tid] = d.timeouts.get(tid, 0) + 1
        if isinstance(d, Master) or deputy(st.hierarchy) == st.rank and msg.rank == st.hierarchy.master:
            return self.note_timeout(msg.rank, msg.ids)
        return [Send(st.hierarchy.master, msg)]

    def abandon_self(self, why: str) -> list[Effect]:
        """This rank's own task hung and it cannot be killed (no fault tolerance): it leaves the job.

        Every live rank is told it is gone (and handles it like a death); this rank stops taking part.
        The last rank (a master alone, e.g. a one-process job) does here what a successor would:
        the job stops (``"task timeout"``, with or without fault tolerance: nobody is left to run
        the rest), its own ids count a death (toward quarantine) and the death is recorded for the
        report. The process must then end the job itself (the runtime writes the checkpoint and
        the report, and exits with the job's status).
        """
        st = self.st
        st.abandoned = True
        others = [r for r in range(st.size) if r not in st.failed and r != st.rank]
        d = st.server
        if not others and isinstance(d, Master):
            st.stop_reason = st.stop_reason or "task timeout"
            d.stop(st.clock())
            if st.rank in d.children:
                host = self._host(st.rank)
                held = d.drop_child(st.rank)
                info = st.info
                record = FailureRecord(st.rank, info.role.value, info.level, why, st.rank, st.wall(), len(held))
                n, quarantined = d.requeue_lost(held, st.rank, host, why)
                self.recovery.failures.append(record.closed(n, tuple(quarantined), st.wall()))
        gone = Gone((st.rank,), why)
        return [Send(r, gone) for r in others]

    @property
    def alone(self) -> bool:
        """Whether every other rank of the job has died or been given up."""
        st = self.st
        return all(r == st.rank or r in st.failed for r in range(st.size))
