"""Who watches whom: leases of children, heartbeats of the master, task time limits. Pure Python.

MPI reports a process that was killed, never one that hangs (SIGSTOP, a call that never
returns) and never a task that runs too long. So:

* **Leases.** A server kills a child that holds ids and has been silent longer than its
  lease (``lease_min + lease_factor x`` the longest task seen per id held), and a survivor
  that does not answer a reconciliation within a lease.
* **Watchers.** The master heartbeats to its first :data:`WATCHERS` survivors (the deputy
  through its copy of the ledger, the next one with :class:`~nlevel.roles.messages.Heartbeat`);
  each kills a master silent past a lease. The deputy judges at any time. The second
  watcher judges only after it has itself waited for ids a whole lease: a rank reads its
  messages only between its tasks, and watchers that judged while computing killed masters
  that were working (tests/e2e/test_faults.py); a rank that has waited a lease has read
  every heartbeat sent meanwhile. With the master and its deputy hung together, the ids
  stop coming, the second watcher waits, and kills the master; the deputy, master in turn
  and as silent, is killed one lease later, and the next survivor takes over from the
  checkpoint file.
* **Task time limit** (``--task-timeout``). A rank that computes and has held its ids
  longer than the limit (per id) ran a task too long: with fault tolerance it is killed like
  a hung one; without, it is given up (:class:`~nlevel.roles.events.Abandon`: MPI would end
  the whole job if it were killed) and the job stops cleanly, to be resumed. Either way its
  ids count toward quarantine as timeouts, and the master keeps the count across runs.
"""

from __future__ import annotations

from ..model.hierarchy import Hierarchy, Role
from ..ranges import RangeSet
from .core import StationCore
from .events import Abandon, Effect, Kill, Send
from .master import Master
from .messages import FailureRecord, Gone, Heartbeat, TimedOut
from .recovery import deputy
from .region import Region

__all__ = ["Watching", "WATCHERS", "watchers"]

#: How many ranks watch the master (the deputy first; the second judges only while it waits for ids).
WATCHERS = 2


def watchers(h: Hierarchy) -> list[int]:
    """The ranks that watch the master: its first :data:`WATCHERS` survivors after it, the deputy first."""
    out = []
    for n in h.nodes:
        if n.role is not Role.DEAD and n.rank != h.master:
            out.append(n.rank)
            if len(out) == WATCHERS:
                break
    return out


def _first(ids: RangeSet) -> int:
    return ids.first() if ids else -1


class Watching(StationCore):
    """The watching part of a station: leases, the master's watchers, task time limits."""

    # -- the master's heartbeat -------------------------------------------------------------
    def heartbeats(self) -> list[Effect]:
        """The master: a Heartbeat to each watcher now and then (the deputy has its Mirror under fault tolerance)."""
        if not isinstance(self.server, Master):
            return []
        now = self.clock()
        if now - self.heartbeat_sent < self.config.lease_min / 4:
            return []
        self.heartbeat_sent = now
        dep = deputy(self.hierarchy) if self.ft else None
        beat = Heartbeat(self.epoch)
        return [Send(r, beat) for r in watchers(self.hierarchy) if r != dep]

    def on_heartbeat(self) -> list[Effect]:
        """The master is alive."""
        self.master_heard = self.clock()
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
            return []
        w = self.worker
        longest = w.task_times.hi if w is not None and w.task_times.n else 0.0
        lease = self.config.lease_min + self.config.lease_factor * longest
        if not self.ft and self.pending_release is not None:
            # The master is releasing the job (its last checkpoint written) and may be writing its
            # report, heartbeats stopped: killed now it could not be replaced, the job would end
            # without its report. Only a master hung far longer is killed (not a hang of the job).
            lease *= 6
        if now - self.master_heard <= lease:
            return []
        if self.rank != deputy(h) and (w is None or w.wait_started is None or now - w.wait_started <= lease):
            return []  # (not the deputy: it judges only once it has waited for ids, reading messages, a lease)
        self.master_heard = now
        return [Kill(h.master, "was silent past its lease as the master (hung)")]

    def watched(self) -> list[int]:
        """Ranks whose processes this rank checks are still there (its children, and the master it watches)."""
        out = [r for r in (self.server.children if self.server is not None else ()) if r != self.rank]
        if self.watching is not None and self.watching not in self.failed:
            out.append(self.watching)
        return out

    # -- leases and time limits ---------------------------------------------------------------
    def lease_kills(self) -> list[Effect]:
        """Children silent past their lease, survivors that do not answer a reconciler within one, and
        ranks whose task ran past ``--task-timeout``: kill them (or give them up, see the module docstring).

        MPI then reports them dead; without ULFM the job stops and the checkpoint resumes it: never a hang.
        """
        d = self.server
        if d is None:
            return []
        c = self.config
        now = self.clock()
        limit = c.task_timeout
        # Every lease is at least lease_min: looking ten times per lease_min (or per time limit)
        # finds a silent child at most 10 % late, instead of scanning every child on every tick.
        period = min(c.lease_min, limit) / 10 if limit else c.lease_min / 10
        if now - self.leases_checked < period:
            return []
        self.leases_checked = now
        outs: list[Effect] = []
        if limit:
            for r, ids in d.timed_out(now, limit):
                outs += self._expired(r, ids, limit)
        late = [(r, "held tasks past its lease (hung)") for r in d.overdue(now, c.lease_min, c.lease_factor)]
        recon = self.recon
        if recon is not None and recon.expected and now - recon.started > c.lease_min + c.lease_factor * d.task_max:
            late += [(r, "did not answer a reconciliation within a lease") for r in sorted(recon.expected - recon.killed)]
            recon.killed |= recon.expected
        return outs + [Kill(r, why) for r, why in late]

    def _host(self, rank: int) -> str:
        return self.hosts[rank] if 0 <= rank < len(self.hosts) else ""

    def _expired(self, rank: int, ids: RangeSet, limit: float) -> list[Effect]:
        """Rank ``rank`` (this one's own loop included) held ``ids`` past the time limit."""
        held = f"task {_first(ids)}" if len(ids) == 1 else "one of tasks " + ", ".join(
            f"{a}" if b == a + 1 else f"{a}-{b - 1}" for a, b in ids.ranges()[:4])
        why = f"ran {held} past --task-timeout {limit:g} s"
        outs: list[Effect] = []
        notice = TimedOut(rank, ids.ranges(), limit, self._host(rank))
        if rank != self.rank:
            if isinstance(self.server, Master):
                outs += self.note_timeout(rank, ids.ranges())
            else:
                outs.append(Send(self.hierarchy.master, notice))
            outs.append(Kill(rank, why) if self.ft else Abandon(rank, why))
            return outs
        # This rank's own task: its successor must count the timeout, since this rank goes. The
        # master too without fault tolerance: given up, it serves no more and its deputy takes
        # over, counts the timeout and stops the job. The deputy has no copy of the ledger then:
        # it takes over from the checkpoint the master writes as it leaves (see Loop.perform),
        # which must hold this timeout too, the count of earlier runs included (the deputy's own
        # count starts at 1, and a merge keeps the larger). (Only in the master's ledger, the
        # count was lost with it, and the job ran on to the end.)
        successor = self.info.parent if isinstance(self.server, Region) else deputy(self.hierarchy)
        if successor is not None:
            outs.append(Send(successor, notice))
        if isinstance(self.server, Master) and (successor is None or not self.ft):
            outs += self.note_timeout(rank, ids.ranges())
        # (the last rank is given up even under fault tolerance: killed, nobody would end the job)
        outs.append(Kill(rank, why) if self.ft and not self.alone else Abandon(rank, why))
        return outs

    def note_timeout(self, rank: int, ids: tuple[tuple[int, int], ...]) -> list[Effect]:
        """The master: count a timeout of ``ids`` (kept in the checkpoint); without fault tolerance, stop the job."""
        d = self.server
        if not isinstance(d, Master) or self.ledger is None:
            self.timeout_notes.append((rank, ids))  # the deputy: for when it takes over
            return []
        led = self.ledger
        for a, b in ids:
            for tid in range(a, min(b, a + 10_000)):
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
        if d is not None:
            for a, b in msg.ids:
                for tid in range(a, min(b, a + 10_000)):
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
