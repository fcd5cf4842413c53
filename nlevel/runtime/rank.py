"""One rank's runtime: the loop (:mod:`nlevel.roles.loop`) over MPI, with a server thread where one is needed.

:class:`MpiPort` is the loop's way to the world on an MPI rank: the transport, kills,
the checkpoint file, the control directory and SIGUSR1. :class:`Runner` decides who
runs the loop and when, and how each thread waits (one policy, :class:`~nlevel.runtime.backoff.Backoff`;
one look, :meth:`Runner.round`: the messages each time, the full step when something happened or is due):

* a rank that serves others and also computes runs it in a server thread that wakes every
  few hundred microseconds while its boards are busy and backs off to ``server_period`` when
  they are not (it never spins, and it is never on a child's grant path: children claim
  one-sidedly); an idle look is a probe and a read of its boards' HEAD words;
* a serve-only server runs it in its main thread until the job is over;
* a slave runs it while its user loop waits for ids or for the job's release.

Every other rank that computes has a *pulse* (a server thread does its duties itself: one thread
per rank, each a millisecond of the first call to start): a thread that wakes every ``look`` seconds while
the user's task runs, looks at the loop when nothing else has for that long (the rank beats,
answers a recovery's question, hears a drain or a plan change, whatever its task does: a task
of any length never makes it look hung), and tells the station when the task in hand has run
past ``--task-timeout``. A process that is stopped, or whose task holds the GIL, does neither:
its parent's lease finds it. The user's loop itself enters the runtime once per range; while it
runs a short one, the pulse (or the server thread) claims the next range ahead (one-sided boards:
see :class:`~nlevel.roles.events.Prefetch`), so that the call between two ranges makes no claim.

One lock guards the station: the user's loop takes it once per range, not per id.
"""

from __future__ import annotations

import _thread
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from ..config import Config
from ..errors import CheckpointError, NlevelError
from ..model.cost import HORIZON
from ..roles.board import TICKET_BITS
from ..roles.events import DrainRequest, Overran, Prefetch, Ran, ReleaseJob, UserError
from ..roles.ledger import Changes, Ledger
from ..roles.loop import Loop
from ..roles.messages import KillRequest, Message, TaskFailure
from ..roles.recovery import successors
from ..roles.station import Station
from ..roles.watch import WATCH_PERIOD
from . import control, signals
from .backoff import Backoff

if TYPE_CHECKING:  # (imported where a checkpoint is written or read: numpy and h5py come with it)
    from . import checkpoint as ckpt

__all__ = ["MpiPort", "Runner", "RunnerThread", "clock", "prepare_takeover"]

clock = time.perf_counter

#: A slave that never waits for ids still looks at its messages between two ranges (under
#: fault tolerance: between two pieces of a range, ``Runner.piece``), at most this often
#: (seconds): under fault tolerance (a new master waits for every survivor's answer) ...
SLAVE_LOOK_FT = 0.01
#: ... and without it (only an operator's drain needs it; a plan change closes the board,
#: FINAL ends the loop). A look is an MPI probe: on an oversubscribed node an empty probe
#: yields the core, 0.1-0.25 ms each (measured at 8 ranks on 2 cores, 57 ranges of [2, 5] ms
#: tasks per rank: about 4 ms per rank less at 0.05 s than at 0.01 s).
SLAVE_LOOK = 0.05


class MpiPort:
    """The loop's port on one MPI rank.

    Args:
        transport: The farm's :class:`~nlevel.runtime.transport.Transport`.
        config: Settings.
        checkpoint: The checkpoint path (None: no checkpoint).
        meta: The run's identity in the checkpoint.
        writer: The master's checkpoint writer (None elsewhere: a rank that becomes
            master makes its own).
        result_width: Numbers per task result.
    """

    def __init__(self, transport: Any, config: Config, checkpoint: str | None, meta: ckpt.RunMeta | None,
                 writer: ckpt.Writer | None, result_width: int) -> None:
        self.t = transport
        self.rank = transport.rank
        self.config = config
        self.checkpoint = checkpoint
        self.meta = meta
        self.writer = writer
        self.width = result_width
        self.control_dir = control.control_dir(checkpoint) if checkpoint else None
        self._control_at = 0.0
        self._inbox: control.Inbox | None = None  # the master's (made at its first look)
        self.checkpoint_error: BaseException | None = None
        self.lock: Any = None  # the checkpoint's lock (the master's; see nlevel.runtime.lock)
        self.lock_token: str | None = None  # the lock's name, told to every rank: a new master adopts it
        self.lost: CheckpointError | None = None  # the lock went to another job: the checkpoint is not ours
        #: Called with the job's status when this process ends the job itself (see :meth:`retire`),
        #: before it exits: the farm's report, for the caller that writes it to a file.
        self.ended_here: Callable[[int], None] | None = None
        #: Whether some of the master's work after the release outlives it (see ReleaseJob.last_work).
        self.last_work: Callable[[], bool] = lambda: True
        #: Where :meth:`log` writes (None: ``sys.stderr``; with ``--task-output``, the job's own
        #: stderr, so that nlevel's lines stay out of the task's file).
        self.stream: Any = None

    def send(self, dest: int, msg: Message) -> None:
        self.t.send(dest, msg)

    def poll(self) -> Any:
        return self.t.poll()

    def kill(self, rank: int, why: str) -> bool:
        t = self.t
        if rank == self.rank:  # (this rank's own task hung: nobody else can end it sooner)
            self.log(f"{why}: killing this process")
            from .transport import kill_self

            t.flush(timeout=1.0)  # (its TimedOut first: the parent counts the timeout toward quarantine)
            sys.stdout.flush()
            kill_self()
        if rank in t.failed:
            return False
        done = t.kill(rank)
        if done == "gone":
            self.log(f"rank {rank} {why}: its process had exited already")
            return True
        if done:
            self.log(f"rank {rank} {why}: killed it")
            return False
        relay = t.relay_for(rank)
        if relay is not None:
            t.send(relay, KillRequest(rank, why))
        return False

    def gone(self, ranks: list[int]) -> list[int]:
        return self.t.gone(ranks)

    def declare_dead(self, ranks: tuple[int, ...]) -> None:
        self.t.declare_dead(ranks)

    def retire(self, why: str, last: Ledger | None = None) -> None:
        if last is None:
            self.log(f"{why}; this rank leaves the job (without fault tolerance it cannot be killed alone), "
                     f"the others stop cleanly")
            self.t.flush(timeout=1.0)
            return
        # The last rank (one process, or every other one gone): its task never returns, and
        # nobody else can end the job. Its ledger is written (the timeout and the death counted):
        # end the process with the job's status, as the release would have.
        from .report import failed_lines, failed_tasks, ledger_status

        status = ledger_status(last, stopped=True, error=bool(self.checkpoint_error))
        sys.stderr.write(failed_lines(failed_tasks(last), len(last.failed)))
        self.log(f"{why}; no other rank is left to end the job: this process ends it, exit status {status}"
                 + (" (the same command resumes)" if status == signals.EXIT_STOPPED else ""))
        if self.ended_here is not None:
            # (in this thread: the main one is inside the task that never returns, and the code
            # after the user's loop, which writes the report otherwise, never runs)
            try:
                self.ended_here(status)
            except Exception as exc:  # the process ends all the same: its checkpoint is written
                self.log(f"could not write the run report as the process ended: {exc!r}")
        if self.lock is not None:
            self.lock.release()  # (the next run takes the checkpoint without a stale lock to take over)
        from .launch import record_exit

        record_exit(status)  # (for nlevel-mpiexec: it ended the job, it did not die)
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(status)

    def heartbeat(self) -> str:
        if self.lock is None and self.lock_token is not None and self.checkpoint is not None:
            from .lock import adopt  # a new master: the dead one's lock is this job's

            self.lock = adopt(self.checkpoint, self.lock_token)
            self.lock_token = None  # (tried once)
            if self.lock is None:  # (another job holds it now: said by adopt)
                self._lose(f"the lock {self.checkpoint}.lock is not this job's any more")
        if self.lock is not None and self.lost is None:
            why = self.lock.beat()
            if why:
                self._lose(f"the lock {self.lock.path} is not this job's any more ({why})")
        return self.lost.problem if self.lost is not None else ""

    def _lose(self, why: str) -> None:
        """Another job holds the checkpoint now: never write it again (its writes would be lost)."""
        self.lost = CheckpointError(f"{why}: another job may be using checkpoint {self.checkpoint}, which this "
                                    f"job does not write again", path=self.checkpoint)
        if self.writer is not None:
            self.writer.discard()

    def checkpoint_failed(self) -> str:
        w = self.writer
        error = w.error if w is not None else None
        return str(error) if error is not None else ""

    def write_checkpoint(self, ledger: Ledger, final: bool) -> str:
        if self.checkpoint is None or self.meta is None:
            return ""
        if self.lost is not None:
            ledger.untrack()  # (never written again: nothing to count)
            self.checkpoint_error = self.lost
            return self.lost.problem
        from . import checkpoint as ckpt

        try:
            if self.writer is None:
                self.writer = ckpt.Writer(self.checkpoint, self.meta)  # a new master
            item: ckpt.Snapshot | Changes
            if ledger.tracked:  # the file holds this ledger as it was at the previous write: append what is new
                item = ledger.changes()
            else:  # a new master's ledger (its copy, or the file's merged in): written whole, once
                completed, ids, values = ledger.arrays()
                item = ckpt.Snapshot(completed, ids, values, failed=ledger.recorded_failed(),
                                     timeouts=tuple(sorted(ledger.timeouts.items())))
                ledger.track()
            if final:
                self.writer.close(item)
            else:
                self.writer.submit(item)
        except Exception as exc:  # recorded; the job still ends cleanly (the old file is intact)
            if not isinstance(exc, CheckpointError):  # (not taken by the writer: the next write holds all)
                ledger.untrack()
            self.checkpoint_error = exc
            return str(exc)
        return ""

    def load_checkpoint(self) -> tuple[Ledger | None, str]:
        if self.checkpoint is None or self.meta is None:
            return None, ""
        from . import checkpoint as ckpt

        try:
            snap = ckpt.load(self.checkpoint, self.meta)
        except NlevelError as exc:
            self.log(f"taking over as master, the checkpoint is unusable ({exc}); every uncommitted task runs again")
            return None, str(exc)
        return snap.ledger(self.meta.total, self.width), ""

    def answer(self, token: str, outcome: dict[str, object]) -> None:
        if self._inbox is not None:
            self._inbox.answer(token, outcome)

    def log(self, text: str) -> None:
        stream = self.stream or sys.stderr
        stream.write(f"nlevel: rank {self.rank}: {text}\n")
        stream.flush()

    def requests(self) -> list[DrainRequest]:
        if self.control_dir is None or clock() < self._control_at:
            return []
        self._control_at = clock() + self.config.control_interval
        if self._inbox is None:
            self._inbox = control.Inbox(self.control_dir, self.log)
        out: list[DrainRequest] = []
        for taken in self._inbox.take():
            if taken.ranks is not None and self.rank in taken.ranks:
                # (the operator's drain frees cores; the master's never leaves the job: it serves to the end)
                self._inbox.answer(taken.token, {"error": f"rank {self.rank} is the master: it serves every rank "
                                                 f"until the job ends and cannot be drained"})
                continue
            out.append(DrainRequest(taken.token, taken.ranks, taken.count))
        return out

    def stop_requested(self) -> bool:
        return signals.requested()

    def release_job(self, ledger: Ledger, stopped: bool, erred: bool) -> ReleaseJob:
        from .report import failed_lines, failed_tasks, ledger_status

        error = self.checkpoint_error
        failed = failed_tasks(ledger, self.config.task_output)
        sys.stderr.write(failed_lines(failed, len(ledger.failed)))
        sys.stderr.flush()
        code = ledger_status(ledger, stopped=stopped, error=error is not None or erred)
        return ReleaseJob(code, {"complete": ledger.complete(), "failed": failed},
                          (getattr(error, "problem", None) or str(error)) if error is not None else "",
                          getattr(error, "errno", None) or 0, self.last_work())

    def given_up_end(self, code: int, given_up: tuple[int, ...]) -> None:
        from .startwatch import mark_end

        places = self.t.places
        mark_end(code, {r: places[r][0] if r < len(places) else "" for r in given_up})


def prepare_takeover() -> None:
    """Import what a new master's first read of the checkpoint needs (:attr:`Runner.prepare_takeover`):
    the checkpoint's module with numpy and h5py, which a farm imports only when it has a checkpoint."""
    from . import checkpoint as ckpt

    ckpt.h5()


def _nothing() -> None:
    pass


_TICKETS = (1 << TICKET_BITS) - 1

#: A loop's full step (its time-driven work: boards, batches, heartbeats, leases, the planner, the
#: master's controls and checkpoint) comes at least this often (s) in a server thread and while a rank
#: waits; the looks between are a probe for messages, and a server's look at its boards' HEAD words
#: (see :meth:`Runner.round`). The boards' horizon: they hold a few of these of their claimers' ids.
TICK = HORIZON
#: ... and in a pulse (s): a computing rank's time-driven work is at least a batch age or a watch
#: period away (reports, heartbeats, the master's watchers); its messages are looked at every look.
PULSE_TICK = WATCH_PERIOD
#: A rank waiting for ids or for its release sleeps at most this fraction of the time it has waited
#: (at least ``--poll-max``, at most a look): the end of a short job is noticed within a tenth of a
#: millisecond, a rank waiting for minutes for the last long tasks elsewhere does not poll ten
#: thousand times a second meanwhile.
WAIT_FRACTION = 1 / 16


class RunnerThread:
    """A daemon thread of the runner (its server thread or its pulse), started without waiting for it to run.

    ``threading.Thread.start`` blocks until the new thread has run: on an oversubscribed node the
    scheduler gives a new thread its first slice after the others', and every rank paid 0.3-2.9 ms
    (median about 1) of its first call for it (4 ranks under ULFM on 2 cores, each starting one). This one
    is started with the low-level ``_thread.start_new_thread`` (documented) and has what the
    runner uses of a Thread. It is alive from :meth:`start` on (the runner must never take a
    thread that has not run yet for one that has ended). Unlike a ``threading.Thread`` it is not
    in ``threading.enumerate()`` and ``threading.settrace`` does not reach it: it runs nlevel's
    loop only, never the user's code.

    Args:
        target: What the thread runs (it catches its own exceptions: an escaping one is printed).
        name: The thread's name (what it is, for people and tools reading ``name``).
    """

    __slots__ = ("name", "ident", "native_id", "_target", "_ended")

    def __init__(self, target: Callable[[], None], name: str) -> None:
        self.name = name
        self.ident: int | None = None  # (set by the thread itself, first thing)
        self.native_id: int | None = None
        self._target = target
        self._ended = threading.Event()

    def start(self) -> None:
        """Start the thread and return at once."""
        _thread.start_new_thread(self.run, ())

    def run(self) -> None:
        """The thread's body: ``target()``, then it counts as ended."""
        self.ident, self.native_id = threading.get_ident(), threading.get_native_id()
        try:
            self._target()
        finally:
            self._ended.set()

    def is_alive(self) -> bool:
        """Whether the thread was started and has not ended."""
        return not self._ended.is_set()

    def is_current(self) -> bool:
        """Whether the caller runs in this thread."""
        return self.ident == threading.get_ident()

    def join(self) -> None:
        """Wait until the thread has ended."""
        self._ended.wait()


class Runner:
    """Runs one rank's loop: in a server thread, in the main thread, or while the user's loop waits.

    Every thread that runs the loop goes through :meth:`round` and waits with one policy
    (:class:`~nlevel.runtime.backoff.Backoff`): a look at messages each time it wakes, the loop's
    full step when something happened or is due (:data:`TICK`, :data:`PULSE_TICK`).

    Args:
        station: The rank's state machine.
        loop: The loop around it.
        config: Settings (``poll_max``: the longest sleep of a waiting loop; ``server_period``:
            the longest sleep of an idle server thread).
        two_sided: Boards are reached by messages: a server answers them promptly (and no
            range is claimed ahead: a claim is then a question and its answer, not for a lock's holder).
        pulse: Whether a computing rank has a pulse (it needs ``MPI_THREAD_MULTIPLE``).
    """

    def __init__(self, station: Station, loop: Loop, config: Config, two_sided: bool = False,
                 pulse: bool = True) -> None:
        self.station = station
        self.loop = loop
        self.config = config
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.period_max = config.poll_max if two_sided else max(config.poll_max, config.server_period)
        self._thread: RunnerThread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # cuts a server thread's sleep short (the end, a stop)
        self._handoff = False  # the main thread takes over the serving: the thread returns at once
        self._old_switch = sys.getswitchinterval()
        self._last_tick = 0.0  # when the loop was last looked at from the user's side (its pulse, its calls)
        self._stepped = 0.0  # when the loop's last full step was
        self._heard = 0.0  # when a server thread's last look found something
        self._pulsed = 0.0  # when a server thread last did the pulse's duties
        self.look = SLAVE_LOOK_FT if station.ft else SLAVE_LOOK
        self._pulse_on = pulse and station.worker is not None
        #: Seconds of tasks the user's loop runs between two calls to :meth:`next_range` under
        #: fault tolerance when the rank has no pulse (``Farm`` cuts a range into pieces): a survivor
        #: answers a reconciler between two tasks, not after its whole range. 0: whole ranges (the
        #: pulse looks at the messages while a task runs; without fault tolerance only an operator's
        #: drain needs a busy rank's look, and a range's end is soon enough).
        self.piece = SLAVE_LOOK_FT if station.ft and not self._pulse_on else 0.0
        #: Called after each step of a serving loop, under the lock (the master: release everyone
        #: as soon as the last rank has ended, without waiting for its own user loop to notice).
        self.after_step: Callable[[], None] = _nothing
        #: Called once, outside the lock, when this rank is next in line to become master (the
        #: deputy or the rank after it, :func:`~nlevel.roles.recovery.successors`): what a takeover
        #: needs, prepared before one is needed (importing h5py, 30-100 ms, was most of a new
        #: master's recovery).
        self.prepare_takeover: Callable[[], Any] | None = None
        #: The HEAD word of this rank's own board of a kind (set by the farm; None: not known), read by a
        #: server's look to tell whether children claimed (see :meth:`_claimed`).
        self.head: Callable[[int], int] | None = None
        self._seen: Any = None  # the hierarchy _prepare last looked at
        #: The task the user's loop runs now, as (id, since when), or None (set by the farm; read
        #: by the pulse, which tells the station when it runs past ``--task-timeout``).
        self.current_task: Callable[[], tuple[int, float] | None] | None = None
        self._pulse: RunnerThread | None = None
        self._pulse_stop = threading.Event()
        #: Set by the user's loop when it takes a range and the next is due ahead (see
        #: :meth:`_claim_ahead`): the pulse, or the server thread, claims it while the task runs.
        self._ahead = threading.Event()
        self._claims_ahead = not two_sided
        # Since when the user's code runs outside the runtime (None: the main thread is inside it
        # and steps the loop itself). Read without the lock by the pulse: one attribute, set whole.
        self._outside: float | None = None
        #: Called by the pulse at each look, whatever the main thread does (a team's leader under
        #: ULFM: a death in its team revokes the team's communicators, so no rank of it waits for ever).
        self.watch: Callable[[], None] | None = None

    # -- one look at the loop ------------------------------------------------------------------
    def round(self, tick: float = TICK) -> int:
        """One look at the loop by the thread that runs it now (under the lock); return how many
        messages (and deaths) it handled.

        The messages, always; the loop's full step (:meth:`~nlevel.roles.loop.Loop.step`) when
        messages came, when children claimed from this rank's boards (see :meth:`_claimed`), or
        when the last full step is ``tick`` seconds old. An idle server's look is then a probe and
        a read of its boards' HEAD words, not its whole time-driven work (a third of a millisecond
        of CPU on an oversubscribed node, every ``--server-period``).
        """
        loop = self.loop
        now = clock()
        if now - self._stepped >= tick or self._claimed():
            self._stepped = now
            return loop.step()
        n = loop.receive()
        if n and self.station.closing.released is None:  # (released: the loop is over, see Loop.receive)
            self._stepped = clock()
            n += loop.step()
        return n

    def _claimed(self) -> bool:
        """Whether this rank's boards need their owner now: claimers wait, half the published stock
        was taken since the last scan (or a ticket went to a slot in limbo), or the planner times
        every claim. A server's boards are scanned at its full steps; between them a look reads
        only each board's HEAD word (local memory)."""
        d = self.station.server
        head = self.head
        if d is None or head is None:
            return False
        sampling = d.claim_log is not None
        for kind, owner in d.owners.items():
            if owner.ended:
                continue
            h = head(kind) & _TICKETS
            if h == owner.head:
                continue
            if sampling or owner.limbo or h >= owner.tail or 2 * (h - owner.head) >= owner.tail - owner.head:
                return True
        return False

    def _ceiling(self, now: float) -> float | None:
        """The longest sleep of a server thread now (None: its own): once every id of this server is
        out (its queue empty: the last reports end the job), at most :data:`WAIT_FRACTION` of the
        time since it last heard something (at least ``--poll-max``)."""
        d = self.station.server
        if d is None or not d.ends_job or d.queue:
            return None
        return max(self.config.poll_max, (now - self._heard) * WAIT_FRACTION)

    # -- the server's side ------------------------------------------------------------------
    def _threaded(self) -> bool:
        """Whether this rank needs a server thread: it computes, and serves others or, under a task
        time limit, is a server whose own task must be watched (a one-process job: between its
        tasks nobody would look, and a task that never returned hung the job)."""
        st = self.station
        return st.worker is not None and (st.serves_remote or (st.server is not None
                                                               and bool(self.config.task_timeout)))

    def start(self) -> None:
        """Start the server thread if this rank serves others and computes (see :meth:`_threaded`),
        else the pulse (a rank that computes): one thread, never both (a server thread pulses too).

        Neither waits for the new thread to run (see :class:`RunnerThread`). A server thread's
        pulse duties cost it nothing."""
        now = clock()
        if not self._stepped:
            self._stepped = self._last_tick = now  # (the set-up has just stepped it: the first call need not)
            if self._pulse_on:
                self._outside = now  # (the user's code runs until its first call)
        if self._threaded() and self._thread is None:
            self._handoff = False
            if self.config.switch_interval > 0:
                sys.setswitchinterval(self.config.switch_interval)
            self._thread = RunnerThread(self._serve_guarded, "nlevel-server")
            self._thread.start()
        elif self._pulse_on and self._pulse is None:
            self._start_pulse()

    def _start_pulse(self) -> None:
        self._pulse = RunnerThread(self._pulse_guarded, "nlevel-pulse")
        self._pulse.start()

    def _serve_guarded(self) -> None:
        try:
            self.serve()
            if self._pulse_on and self._pulse is None and not (self._handoff or self._stop.is_set()
                                                               or self.station.ended):
                self._start_pulse()  # (it serves no more, and its user's loop runs on: someone must pulse)
        except BaseException as exc:  # surfaced in the main thread; never a silent hang
            self.error = exc

    def serve(self, until: Callable[[], bool] | None = None) -> None:
        """Run the loop until this rank serves nobody (or ``until()``), sleeping when idle."""
        st = self.station
        backoff = Backoff(self.period_max, event=self._wake)
        while not self._stop.is_set():
            with self.lock:
                n = self.round()
                self.after_step()
                busy = n > 0 or self._demand()
                # The master whose own loop is over waits for the last Endings here, promptly: its
                # release (after_step) is every rank's end.
                ending = st.is_master and st.done_serving and st.ended and st.closing.released is None
                if (st.done_serving and st.ended and not ending) or (until is not None and until()):
                    return
                th = self._thread
                mine = th is not None and th.is_current()
                if ((st.done_serving and not ending) or self._handoff) and mine:
                    return  # (the main thread finishes the rank's own loop, or serves on itself)
                now = clock()
                if busy:
                    self._heard = now
                ceiling = self.config.poll_max if ending else self._ceiling(now)
            if busy:
                backoff.reset()
            backoff.wait(ceiling)
            if not mine:
                self._prepare()  # (a serve-only rank: its main thread serves)
                continue
            if self._ahead.is_set():
                self._ahead.clear()
                self._claim_ahead()
            if self._pulse_on and clock() - self._pulsed >= self.look:
                self._pulsed = clock()
                self.pulse()  # (the pulse's duties while the user's task runs: its time limit, a team's watch)

    def task_running(self) -> float:
        """Seconds the user's code has spent in the task it runs now (0: none, or inside the runtime)."""
        if self._outside is None or self.current_task is None:
            return 0.0
        task = self.current_task()
        return max(0.0, clock() - task[1]) if task is not None else 0.0

    # -- the pulse --------------------------------------------------------------------------------
    def _pulse_guarded(self) -> None:
        try:
            due = clock() + self.look
            while not self._pulse_stop.is_set():
                if self._ahead.wait(due - clock()):
                    self._ahead.clear()
                    self._claim_ahead()
                if clock() >= due:
                    self.pulse()
                    due = clock() + self.look
        except BaseException as exc:  # surfaced in the main thread; never a silent hang
            self.error = exc

    def _claim_ahead(self) -> None:
        """While the user's task runs: claim the range after its hand (if still due: see
        :class:`~nlevel.roles.events.Prefetch`)."""
        if self._outside is None:
            return  # (the main thread is in the runtime: it claims, if it must, itself)
        with self.lock:
            if self._outside is not None:
                self.loop.handle(Prefetch())

    def pulse(self) -> None:
        """While the user's code runs: look at the loop if nothing has for a look, and watch the task's time."""
        if self.watch is not None:
            self.watch()
        since = self._outside
        if since is None:
            return  # (the main thread is in the runtime: it steps the loop itself)
        now = clock()
        limit = self.config.task_timeout
        task = self.current_task() if limit and self.current_task is not None else None
        served = self._serving_thread()
        overran = task is not None and limit is not None and now - task[1] > limit
        if not overran and (served or now - self._last_tick < self.look):
            return
        with self.lock:
            if self._outside is None:
                return
            if task is not None and overran:
                self.loop.handle(Overran(task[0], now - task[1]))
            if not served:
                self._last_tick = now
                self.round(PULSE_TICK)
                self._serving()  # (a death or a plan change made this rank a server: it serves from now on)

    def _pulsing(self) -> bool:
        """Whether this rank's pulse looks at its loop while the user's task runs."""
        p = self._pulse
        return p is not None and p.is_alive()

    def _serving_thread(self) -> bool:
        """Whether this rank's server thread runs (one whose serving is over has ended)."""
        th = self._thread
        return th is not None and th.is_alive()

    def _demand(self) -> bool:
        d = self.station.server
        return d is not None and any(o.waiting for o in d.owners.values())

    def stop(self) -> None:
        """Stop the server thread and the pulse (after the job) and give the user back Python's switch interval."""
        self._outside = None
        self._pulse_stop.set()
        self._ahead.set()  # (the pulse waits on it)
        if self._pulse is not None and not self._pulse.is_current():
            self._pulse.join()
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            sys.setswitchinterval(self._old_switch)
        self.raise_error()

    def raise_error(self) -> None:
        """Re-raise in the main thread what killed the server thread."""
        if self.error is not None:
            raise RuntimeError(f"nlevel server thread on rank {self.station.rank} failed: {self.error!r}") \
                from self.error

    # -- the user's side -----------------------------------------------------------------------
    def next_range(self, ran: Ran | None) -> tuple[int, int] | None:
        """Report what ran and return the next range for the user's loop (None: the loop is over)."""
        st = self.station
        if st.worker is None:
            self.serve()  # a serve-only server: its loop is the job's
            return None
        self._outside = None
        hand = self._next_range(ran)
        if hand is not None:
            self._outside = clock()
            if self._claims_ahead and st.claim_ahead and (self._pulsing() or self._serving_thread()):
                self._ahead.set()
        return hand

    def _next_range(self, ran: Ran | None) -> tuple[int, int] | None:
        st, loop = self.station, self.loop
        self._prepare()
        with self.lock:
            if not self._serving_thread():  # (a server thread whose serving is over has ended)
                now = clock()
                if st.server is not None or (now - self._last_tick >= self.look and not self._pulsing()):
                    # A server with no thread (one process) looks here: its checkpoint, signals and
                    # operators. A slave with no pulse hears its messages (a drain, a plan change, a
                    # dead master) between ranges (pieces of them), every `look` seconds: not only
                    # when it waits. (A pulse looks while the task runs: the call need not.)
                    self._last_tick = now
                    if ran is not None:
                        loop.handle(ran)  # (what ran is recorded before what the messages say)
                        ran = None
                    self._look()
                    # A slave that has just become a server (it took over from a dead master, or a
                    # plan change made it one) serves from now on, not only between its own ranges:
                    # a new master that answered the survivors and stocked its board once per range
                    # (tens of milliseconds) was most of a master's recovery time.
                    self._serving()
            hand = loop.need_ids(ran)  # (what ran, and the next range: one event)
            if hand is not None or st.ended:
                return hand
        return self.wait(loop.need_ids, or_ended=True)

    def _look(self) -> None:
        """One full step of the loop by a rank that computes (under the lock), from its user's loop."""
        self._stepped = clock()
        self.loop.step()

    def wait(self, attempt: Callable[[], Any], or_ended: bool = False, after: Callable[[], None] = _nothing,
             serving: bool = True) -> Any:
        """The waits of the thread that runs the user's loop (for ids, for the job's release): look
        at the loop (unless a server thread does) and call ``attempt()`` under the lock until it
        returns something other than None (or, with ``or_ended``, until the loop is over here); return that.

        The first look is a full step (the rank has just come to wait: what that changes, e.g. its
        part of the end, goes out now). Sleeps between two empty looks with
        :class:`~nlevel.runtime.backoff.Backoff`, at most :data:`WAIT_FRACTION` of the time waited
        so far (at least ``--poll-max``, at most a look). ``after()`` follows each look, under the
        lock. ``serving``: a death meanwhile may make this rank a server (its thread starts) or
        next in line (it prepares); False after the end (its threads are stopped).
        """
        st = self.station
        poll_max = self.config.poll_max
        backoff = Backoff(max(poll_max, self.look))
        since = clock()
        tick = 0.0
        while True:
            self.raise_error()
            threaded = False
            if serving:
                self._prepare()  # (a death while this rank waits may put it next in line)
                threaded = self._serving()
            with self.lock:
                n = 0 if threaded else self.round(tick)  # (nobody else moves this rank's messages meanwhile)
                tick = TICK
                after()
                got = attempt()
                if got is not None or (or_ended and st.ended):
                    return got
            if n:
                backoff.reset()
                since = clock()
            backoff.wait(max(poll_max, (clock() - since) * WAIT_FRACTION))

    def _prepare(self) -> None:
        """Run :attr:`prepare_takeover` once this rank is next in line to become master (in the
        thread that runs the user's loop, or a serve-only rank's: a server thread keeps serving)."""
        st = self.station
        if self.prepare_takeover is None or st.hierarchy is self._seen:  # (new only after a death, a switch)
            return
        with self.lock:
            f = self.prepare_takeover
            if f is None or st.hierarchy is self._seen:
                return
            self._seen = st.hierarchy
            if st.rank not in successors(st.hierarchy):
                return
            self.prepare_takeover = None
        f()  # (outside the lock: a server thread goes on serving meanwhile)

    def _serving(self) -> bool:
        """Whether a server thread runs this rank's loop (started anew when a plan change or a
        failure made this rank a server; a thread whose server side is over has ended)."""
        if self._serving_thread():
            return True
        st = self.station
        if self._threaded() and not st.done_serving:
            self._thread = None
            self._stop.clear()
            self.start()
            return True
        return False

    def user_error(self, why: str) -> None:
        """The user's program erred here where nlevel can tell (``complete()`` refused a call): the
        job stops through the master, which says so once (see :class:`~nlevel.roles.events.UserError`)."""
        with self.lock:
            self.loop.handle(UserError(why))

    def leave(self, unstarted: tuple[tuple[int, int], ...], ran: Ran | None) -> None:
        """The user's loop left early: report what ran, give back the rest."""
        self._outside = None
        with self.lock:
            if ran is not None:
                self.loop.handle(ran)
            self.loop.leave(unstarted)

    def finish_serving(self) -> None:
        """The user's loop is over here: serve until this rank owes nobody anything."""
        st = self.station
        if self._thread is not None:
            # The thread would notice only after its sleep (up to server_period): the master's end
            # is every rank's, so the main thread takes the serving over now.
            self._handoff = True
            self._wake.set()
            self._thread.join()
            self.raise_error()
        if not st.done_serving:
            self.serve(until=lambda: st.done_serving)
        if st.closing.released is None:  # (released: nothing more to read; an empty probe yields the core)
            with self.lock:
                self.loop.receive()

    def step(self) -> bool:
        """One round of the loop (for the end-of-job agreement); return whether anything arrived."""
        with self.lock:
            return self.loop.step() > 0


def task_failure(task_id: int, rank: int, host: str, exc: BaseException, tb: str) -> TaskFailure:
    """A task that raised, as data: where, what, and the last lines of its traceback."""
    lines = tb.splitlines(keepends=True)[-20:]
    return TaskFailure(task_id, "raised", f"{type(exc).__name__}: {exc}", rank, host, "".join(lines))

