"""The one loop: named steps that feed a :class:`~nlevel.roles.station.Station` its events and perform its effects.

The MPI runtime, the simulator and the tests' in-process network run the same steps;
they differ only in their :class:`Port` (how a message is sent, a process killed, a
checkpoint written) and in *when* they call a step (a server thread every tick, a
slave when it needs ids, simulated time). The steps:

* :meth:`Loop.receive`: messages and deaths the port has for this rank;
* :meth:`Loop.tick`: time-driven work (boards, batches, heartbeats, leases, the planner, and a look
  for processes that vanished: a rank that exited is never reported by MPI);
* :meth:`Loop.control`: the master's operator requests and stop signal;
* :meth:`Loop.checkpoint`: the master's periodic checkpoint;
* :meth:`Loop.need_ids`: the user's loop needs its next range;
* :meth:`Loop.release` and :meth:`Loop.report_done`: the master ends the job once every live
  rank has ended, then sends the releases it held back once its own last work is done.

A driver that wakes a rank only when something it waits for changes (the simulator) reads
what to wait for from the loop (:meth:`Loop.next_tick`, :meth:`Loop.published`,
:attr:`Loop.claims_from`, :attr:`Loop.ticket`, :attr:`Loop.refill_wait`), not from the roles' parts.

Pure Python: threads, locks and MPI belong to the port's owner.
"""

from __future__ import annotations

import math
from typing import Callable, Final, Protocol

from ..ranges import Ranges
from .events import (
    Abandon, Answer, CheckpointLoaded, CheckpointWritten, Died, DrainRequest, Effect, Event, GiveUp, Kill, Leave,
    LoadCheckpoint, Log, NeedIds, Ran, Received, ReleaseJob, ReportDone, Send, Served, Stop, Tick, Watch,
    WriteCheckpoint,
)
from .ledger import Ledger
from .messages import Gone, Message, Release, Result, TaskFailure
from .recovery import GIVEN_UP
from .master import Master
from .region import Region
from .server import LIMBO_GRACE
from .station import Station

__all__ = ["Port", "Loop"]

_NEED: Final = NeedIds()  # (frozen: one instance serves every plain request)
_TICK: Final = Tick()


class Port(Protocol):
    """What a loop needs from the world around one rank."""

    def send(self, dest: int, msg: Message) -> None:
        """Send ``msg`` to rank ``dest`` without blocking (to a dead rank: dropped)."""

    def poll(self) -> tuple[int, Message] | Died | None:
        """A waiting message ``(source, message)``, or ranks newly known dead, or None."""

    def kill(self, rank: int, why: str) -> bool:
        """Kill process ``rank`` (from this host, or by asking a rank on its host; this rank: at once).

        Returns True when the process was gone already (it exited: MPI will never report it).
        """

    def gone(self, ranks: list[int]) -> list[int]:
        """Those of ``ranks`` whose processes no longer exist (only those this rank can look at)."""

    def declare_dead(self, ranks: tuple[int, ...]) -> None:
        """Stop talking to ``ranks``: they are dead, although MPI may never say so."""

    def retire(self, why: str, last: Ledger | None = None) -> None:
        """This rank leaves the job for good (its task hung): finish what must not be left half done.

        ``last``: it was the last rank (its ledger, written): nobody else can end the job, so the
        process ends here, with the job's status.
        """

    def heartbeat(self) -> str:
        """The master: show that the job still runs (the checkpoint's lock); return why the job no
        longer holds the checkpoint (another job took its lock over), or "" while it does."""

    def write_checkpoint(self, ledger: Ledger, final: bool) -> str:
        """Write the ledger (``final``: synchronously); return an error text, or ""."""

    def load_checkpoint(self) -> tuple[Ledger | None, str]:
        """The ledger in the checkpoint file (None and why, when there is none or it is unusable)."""

    def answer(self, token: str, outcome: dict[str, object]) -> None:
        """Answer an operator's request."""

    def log(self, text: str) -> None:
        """A line for stderr."""

    def requests(self) -> list[DrainRequest]:
        """Operator requests waiting for the master (empty elsewhere)."""

    def stop_requested(self) -> bool:
        """Whether the job was asked to stop early (SIGUSR1)."""

    def checkpoint_failed(self) -> str:
        """The error of the latest checkpoint write (a full disk...), or ""."""

    def release_job(self, ledger: Ledger, stopped: bool, erred: bool) -> ReleaseJob:
        """The master ends the job (its last checkpoint written): the release every rank is told, with
        the status every process ends with, the facts the deputy keeps for the report and the
        checkpoint's write error. ``stopped``: the job was stopped early; ``erred``: the user's
        program erred on some rank (see :class:`~nlevel.roles.events.UserError`)."""

    def given_up_end(self, code: int, given_up: tuple[int, ...]) -> None:
        """The job is over with status ``code`` although the processes of ``given_up`` (ranks given up:
        nobody could kill them) may live on: say so to whoever waits for every process (the launcher),
        before the last releases go out (a rank released may end the job at once)."""


class Loop:
    """The steps around one station.

    Args:
        station: The rank's state machine.
        port: The rank's way to the world.
        checkpoint_every: The master writes the checkpoint after this many new commits ...
        checkpoint_interval: ... or this many seconds, whichever comes first.
        timer: A clock for the CPU time of handling one message (the master's planner
            measures its μ with it while it serves); None: not measured.
        service: Without a timer, the seconds handling one message takes (the simulator's
            model), told to the planner as the measured time would be; 0: nothing told.
    """

    def __init__(self, station: Station, port: Port, checkpoint_every: int = 10_000,
                 checkpoint_interval: float = 2.0, timer: Callable[[], float] | None = None,
                 service: float = 0.0) -> None:
        self.station = station
        self.port = port
        self.timer = timer
        self.service = service
        self.checkpoint_every = checkpoint_every
        self.checkpoint_interval = checkpoint_interval
        self.flushed_at = station.clock()
        self.flushed_commits = 0
        self.final_written = False
        self.checkpoint_error = ""
        self.reported = False  # the master's last work is done (report_done)
        #: Seconds the user's loop has spent in the task it runs now (None: not known here), for Tick.
        self.running: Callable[[], float] | None = None

    # -- effects -----------------------------------------------------------------------------
    def handle(self, event: Event) -> None:
        """Give the station one event and perform what it returns."""
        self.perform(self.station.handle(event))

    def perform(self, effects: list[Effect]) -> None:
        """Carry out effects (some answer with an event, handled at once)."""
        port = self.port
        for e in effects:
            kind = type(e)
            if kind is Send:
                assert isinstance(e, Send)
                port.send(e.dest, e.msg)
            elif kind is WriteCheckpoint:
                assert isinstance(e, WriteCheckpoint)
                self._write(e.final)
            elif kind is Kill:
                assert isinstance(e, Kill)
                if port.kill(e.rank, e.why):  # it had exited: nobody else will ever hear of it
                    self.lost((e.rank,), "exited (found gone)")
            elif kind is Abandon:
                assert isinstance(e, Abandon)
                st = self.station
                ledger = st.ledger
                if ledger is not None and not self.final_written:
                    # The master gives itself up: what it committed goes to disk before its deputy
                    # takes over from the checkpoint (every id committed since the last write ran
                    # again: all of them, a second into a job).
                    self.final_written = True
                    self.checkpoint_error = port.write_checkpoint(ledger, True) or self.checkpoint_error
                port.retire(e.why, ledger if st.watching.alone else None)
            elif kind is GiveUp:
                assert isinstance(e, GiveUp)
                then = ("the others carry on without it" if self.station.ft else
                        "the job stops cleanly, the same command resumes")
                hosts = self.station.hosts
                where = f" on {hosts[e.rank]}" if 0 <= e.rank < len(hosts) and hosts[e.rank] else ""
                port.log(f"rank {e.rank}{where} {e.why}: {GIVEN_UP}; {then}")
                self.lost((e.rank,), f"{GIVEN_UP}: {e.why}")
            elif kind is Watch:
                assert isinstance(e, Watch)
                gone = port.gone(list(e.ranks))
                if gone:
                    # What they sent before they went comes first: a master that released its deputy
                    # and exited at once is not a master that died while releasing (its report stands).
                    self.receive()
                    self.lost(tuple(gone), "exited")
            elif kind is LoadCheckpoint:
                ledger, error = port.load_checkpoint()
                self.handle(CheckpointLoaded(ledger, error))
            elif kind is Answer:
                assert isinstance(e, Answer)
                port.answer(e.token, e.outcome)
            elif kind is Log:
                assert isinstance(e, Log)
                port.log(e.text)
            else:
                raise TypeError(f"not an nlevel effect: {e!r}")

    def lost(self, ranks: tuple[int, ...], how: str) -> None:
        """This rank found ``ranks`` dead (MPI will not say so): stop talking to them, tell everyone, repair."""
        self.port.declare_dead(ranks)
        self.handle(Died(ranks, how, tell=True))

    def _write(self, final: bool) -> None:
        st = self.station
        ledger = st.ledger
        if ledger is None or self.final_written:
            if final:
                self.handle(CheckpointWritten(True, ""))
            return
        if final:
            self.final_written = True
        error = self.port.write_checkpoint(ledger, final)
        if error:
            self.checkpoint_error = error
        self.flushed_commits = ledger.commits
        self.flushed_at = st.clock()
        if final:
            self.handle(CheckpointWritten(True, error))

    # -- the steps --------------------------------------------------------------------------
    def receive(self, most: int = 256) -> int:
        """Handle up to ``most`` waiting messages and deaths; return how many."""
        n = 0
        port = self.port
        timer = self.timer
        closing = self.station.closing
        while n < most:
            got = port.poll()
            if got is None:
                break
            n += 1
            if isinstance(got, Died):
                self.handle(got)
                continue
            if isinstance(got[1], Gone):
                port.declare_dead(got[1].ranks)
            if timer is None or self.station.planner is None:
                self.handle(Received(got[0], got[1]))
                if self.service and self.station.planner is not None:
                    self.handle(Served(self.service))
            else:
                t0 = timer()
                self.handle(Received(got[0], got[1]))
                self.handle(Served(timer() - t0))
            if closing.released is not None and isinstance(got[1], Release):
                # The release ends the rank's loop: it goes now, not after another probe. At the
                # job's end every rank wakes at once, and an empty probe yields the core (Open MPI's
                # yield_when_idle): 1-3.5 ms between a rank's release and its return, measured.
                break
        return n

    def tick(self) -> None:
        """Time-driven work."""
        running = self.running
        self.handle(Tick(running()) if running is not None else _TICK)

    def control(self) -> None:
        """The master: the operator's requests, and a stop asked by signal."""
        st = self.station
        if not isinstance(st.server, Master) or st.abandoned:
            return  # (a master that gave itself up: its deputy holds the lock and hears the operator now)
        lost = self.port.heartbeat()
        if lost and not st.stopped:
            # Another job writes the checkpoint now: this one stops cleanly (running tasks finish)
            # and writes it no more (the port refuses), so the other job's progress is not lost.
            self.checkpoint_error = lost
            self.port.log(f"{lost}; stopping the job (tasks running now finish)")
            self.handle(Stop("lock"))
        for request in self.port.requests():
            try:
                self.handle(request)
            except Exception as exc:
                # Operator input never ends the master (nor, read again, its successor): a request
                # that raised anyway is answered, and the job goes on.
                self.port.answer(request.token, {"error": f"the master could not act on this request: {exc!r}"})
                self.port.log(f"an operator's request raised {exc!r}; answered with the error, the job goes on")
        if self.port.stop_requested() and not st.stopped:
            self._write(False)  # what is committed now, in case running tasks outlast the warning
            self.handle(Stop())

    def checkpoint(self) -> None:
        """The master: write the checkpoint when enough commits or time have gone by."""
        st = self.station
        ledger = st.ledger
        if ledger is None or self.final_written or not isinstance(st.server, Master):
            return
        error = self.port.checkpoint_failed()
        if error and not st.stopped:
            # The old checkpoint is intact (a failed write leaves the files as they were); going on would
            # run tasks whose completions cannot be kept. Stop cleanly; the same command resumes.
            self.checkpoint_error = error
            self.port.log(f"{error}; stopping the job (tasks running now finish; free space, then run the same "
                          f"command to resume)")
            self.handle(Stop("checkpoint"))
            return
        new = ledger.commits - self.flushed_commits
        if new and (new >= self.checkpoint_every or st.clock() - self.flushed_at >= self.checkpoint_interval):
            self._write(False)

    def step(self) -> int:
        """One round of a server's loop: messages, time, the master's controls and checkpoint."""
        n = self.receive()
        self.tick()
        self.control()
        self.checkpoint()
        return n

    # -- the end ------------------------------------------------------------------------------
    def release(self) -> bool:
        """The master, once every live rank has ended: write the last checkpoint, then end the job
        for everyone (:class:`~nlevel.roles.events.ReleaseJob`, as the port words it). Returns
        whether it did so now (False on any other rank, before the end, and once it has)."""
        st = self.station
        if not st.closing.all_ended:
            return False
        ledger = st.ledger
        assert ledger is not None
        if not self.final_written:
            self.final_written = True
            self.checkpoint_error = self.port.write_checkpoint(ledger, True) or self.checkpoint_error
        self.handle(self.port.release_job(ledger, st.stopped, bool(st.user_errors)))
        return True

    def report_done(self) -> bool:
        """The master (or the rank that finished a dead master's release), its own last work done
        (its report written, its lock given back): send the releases it held back (its deputy's
        under fault tolerance; everyone's after a rank was given up without it). Returns whether
        any went out; once."""
        st = self.station
        if self.reported or st.closing.released is None:
            return False
        self.reported = True
        held = st.handle(ReportDone())
        if held and st.recovery.given_up:
            self.port.given_up_end(int(st.closing.released.code), tuple(sorted(st.recovery.given_up)))
        self.perform(held)
        return bool(held)

    # -- what to wait for (a driver that wakes this rank on events instead of polling) ------------
    def next_tick(self, now: float, look: float, limbo: bool = True) -> float:
        """When a tick of this rank next has work (inf: none until something happens to it).

        By the clock: a region's batch of completions due by age, the planner's next look. Noticed
        ``look`` seconds from ``now``: ids to publish for claimers waiting on its boards, a
        region short of stock holding no ticket above, a new master's free ids; a claimer's ticket
        in limbo once its grace is over (``limbo``: look for those).
        """
        st = self.station
        d = st.server
        if d is None:
            return math.inf
        need = math.inf
        soon = now + look
        if isinstance(d, Region):
            need = d.flush_at()
            if not d.parent_final and d.claimer.ticket < 0 and d.stock() < d.target():
                need = soon
        planner = st.planner
        if planner is not None:
            due = planner.next_check(now)
            if due < need:
                need = due
        if soon < need and (st.recovery.free or (d.queue and any(o.waiting for o in d.owners.values()))):
            need = soon
        if limbo and now + LIMBO_GRACE + look < need and any(o.limbo for o in d.owners.values()):
            need = now + LIMBO_GRACE + look
        return need

    def published(self, kind: int) -> tuple[int, int, int, bool] | None:
        """This rank's board ``kind`` as its claimers see it: ``(flags, epoch, tickets published,
        whether published slots wait for no ticket yet)``; None: it has no such board."""
        d = self.station.server
        o = d.owners.get(kind) if d is not None else None
        if o is None:
            return None
        return o.flags, o.epoch, o.tail, o.unclaimed_slots > 0

    @property
    def claims_from(self) -> int:
        """The rank whose leaf board this rank's user loop claims from (-1: it runs no tasks)."""
        w = self.station.worker
        return w.parent if w is not None else -1

    @property
    def ticket(self) -> int:
        """The ticket this rank's user loop waits for on that board (-1: none: it waits for a change)."""
        w = self.station.worker
        return w.claimer.ticket if w is not None else -1

    @property
    def refill_wait(self) -> tuple[int, int] | None:
        """A region-master waiting for its parent to publish its ticket: ``(parent, ticket)``; else None."""
        d = self.station.server
        if not isinstance(d, Region) or d.parent_final:
            return None
        tk = d.claimer.ticket
        return (d.parent, tk) if tk >= 0 else None

    @property
    def refills_from(self) -> int:
        """The rank whose upper board this region-master refills from (-1: it is no region-master)."""
        d = self.station.server
        return d.parent if isinstance(d, Region) else -1

    @property
    def serving(self) -> bool:
        """Whether messages to this rank are handled as they come (it serves, or old children must
        still be heard), not when its user loop next runs."""
        st = self.station
        return st.server is not None or bool(st.replanning.unacked)

    # -- the user's side ------------------------------------------------------------------------
    def ran(self, done: Ranges, results: tuple[tuple[int, Result], ...] = (), failed: tuple[TaskFailure, ...] = (),
            tasks: int = 0, busy: float = 0.0, longest: float = 0.0) -> None:
        """The user's loop finished these."""
        self.handle(Ran(done, results, failed, tasks, busy, longest))

    def need_ids(self, ran: Ran | None = None) -> tuple[int, int] | None:
        """Ask for the next range, first recording ``ran``; return it (None: wait, or the loop is over:
        see ``station.ended``)."""
        self.handle(NeedIds(ran) if ran is not None else _NEED)
        return self.station.hand

    def leave(self, unstarted: Ranges = ()) -> None:
        """The user's loop left early."""
        self.handle(Leave(unstarted))
