"""One rank's runtime: the I/O loop around a :class:`~nlevel.roles.station.Station`.

A rank that serves children and also computes answers them from a server thread
while the main thread runs the user's task; its own worker is served in-process.
A serve-only server runs the loop in the main thread. One condition variable guards
the state machines; the transport is the only I/O. The server thread never spins: an
idle poll backs off up to ``Config.poll_max``.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

from ..config import Config
from ..model.hierarchy import Hierarchy
from ..roles.dispatch import Master, Region
from ..roles.ledger import Ledger
from ..roles.messages import Kill, Report, Result
from ..roles.station import Station
from ..roles.worker import WAIT, Out
from .backoff import Backoff
from . import control, signals

__all__ = ["Node"]

clock = time.perf_counter


class Node:
    """The farm on one rank.

    Args:
        transport: A :class:`~nlevel.runtime.transport.Transport` (or a double with ``rank``, ``send``,
            ``poll`` and ``flush``).
        hierarchy: The laid-out plan.
        config: Settings.
        ledger: The completion record (rank 0 only).
        on_checkpoint: Rank 0: called with ``(ledger, final)`` when a checkpoint is due,
            and once with ``final=True`` before the master releases anyone at the end.
    """

    def __init__(
        self,
        transport: Any,
        hierarchy: Hierarchy,
        config: Config,
        ledger: Ledger | None = None,
        on_checkpoint: Callable[[Ledger, bool], None] | None = None,
        recover: Callable[[], Ledger] | None = None,
        control_dir: str | None = None,
    ) -> None:
        self.t = transport
        self.rank = transport.rank
        self.config = config
        self.on_checkpoint = on_checkpoint
        self.lock = threading.Condition()
        self.error: BaseException | None = None
        self.station = Station(hierarchy, self.rank, config, clock, ledger, self._checkpoint_final, recover=recover)
        self._flushed_at = clock()
        self._flushed_count = 0
        self._final_written = False
        self.checkpoint_error: BaseException | None = None
        self.control_dir = control_dir  # operator requests (drain), read by the master
        self._control_at = 0.0
        self.drained = False  # this rank left the job on an operator's request
        self._thread: threading.Thread | None = None
        self._old_switch = sys.getswitchinterval()
        if self.station.serves_remote and self.station.worker is not None:
            if config.switch_interval > 0:
                # Measured (README, bench/results/gil_decision.txt): at Python's 5 ms default a
                # server thread waits ~7 ms for the GIL behind a pure-Python task; 1e-4 s: ~0.5 ms.
                sys.setswitchinterval(config.switch_interval)
            self._thread = threading.Thread(target=self._serve_guarded, name="nlevel-server", daemon=True)
            self._thread.start()

    @property
    def current(self) -> int | None:
        """The id this rank is running, if any."""
        w = self.station.worker
        return w.current if w is not None else None

    @property
    def ledger(self) -> Ledger | None:
        """The master's ledger (rank 0), else None."""
        d = self.station.dispatcher
        return d.ledger if isinstance(d, Master) else None

    # -- the user's side ------------------------------------------------------------
    def next(self, result: Result | None = None) -> int:
        """Finish the current task (with ``result``) and return the next id, or -1 when done."""
        st = self.station
        if st.worker is None:
            self._serve()  # serve-only rank: the loop runs here until the job ends
            return -1
        with self.lock:
            st.finish(result)
            if self.ledger is not None:
                self._send(self._stop_if_asked() + self._control())
                self._checkpoint_if_due()  # rank 0 with no server loop (one process) flushes here
            drained = False
            while True:
                if st.drain_requested and not st.worker.left:
                    drained = True  # an operator drained this rank: its last task is done, the rest goes back
                    break
                tid, sends = st.take()
                self._send(sends)
                if tid >= 0 and st.worker.asked and not self._threaded():
                    # An ask-ahead grant is taken as soon as it is here (so the request is timed
                    # from its arrival); a regroup that came with it is seen early too.
                    self._pump(block=False)
                if tid != WAIT:
                    break
                self._raise_error()
                if self._threaded():
                    self.lock.wait(0.05)  # the server thread delivers and notifies
                else:
                    self._pump(block=True, most=0.1)  # then take() again: time-driven checks run there
        if drained:
            self.drained = True
            self.leave()
            return -1
        if tid >= 0:
            return tid
        self._finish_serving()
        return -1

    def leave(self, done: bool = False, result: Result | None = None) -> None:
        """The user left the loop early: give back unstarted ids, keep serving until the end.

        The current task counts as finished only when ``done``; otherwise it runs elsewhere.
        """
        st = self.station
        with self.lock:
            self._send(st.leave(done, result))
            # A want still outstanding is always answered (ids or final): take the answer
            # and give any ids straight back (Station does, for a worker that left).
            while st.worker is not None and st.worker.asked and not st.local_parent:
                if self._threaded():
                    self.lock.wait(0.05)
                else:
                    self._pump(block=True)
        if st.dispatcher is not None and not self._threaded() and st.serves_remote:
            self._serve()
        self._finish_serving()

    def _threaded(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _pump(self, block: bool, most: float | None = None) -> None:
        """Main thread, no server thread: deliver what has arrived from anyone (lock held).

        With ``block``, wait (backing off) until at least one message was handled, or at
        most ``most`` seconds.
        """
        backoff: Backoff | None = None
        handled = False
        end = None if most is None else clock() + most
        while True:
            got = self.t.poll()
            if got is None:
                if handled or not block or (end is not None and clock() > end):
                    return
                if backoff is None:
                    backoff = Backoff(self.config.poll_max)
                backoff.wait()
                continue
            handled = True
            self._send(self.station.deliver(*got))
            self._start_thread_if_needed()

    def _start_thread_if_needed(self) -> None:
        """After a regroup a computing rank may have become a server: give it a server thread."""
        st = self.station
        if st.worker is None or not st.info.children or self._threaded():
            return
        if self.config.switch_interval > 0:
            sys.setswitchinterval(self.config.switch_interval)
        self._thread = threading.Thread(target=self._serve_guarded, name="nlevel-server", daemon=True)
        self._thread.start()

    def _finish_serving(self) -> None:
        """This rank's loop is over: wait for its server side, and hear every old child out."""
        self._join()
        with self.lock:
            while self.station.draining:
                self._pump(block=True)
        self.t.flush()

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            sys.setswitchinterval(self._old_switch)  # process-wide: give the user theirs back
            self._raise_error()

    # -- the server's side ------------------------------------------------------------
    def _serve_guarded(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # surfaced in the main thread; never a silent hang
            with self.lock:
                self.error = exc
                self.lock.notify_all()

    def _serve(self) -> None:
        st = self.station
        backoff = Backoff(self.config.poll_max)
        next_tick = 0.0
        while True:
            t0 = clock()
            got = self.t.poll()
            with self.lock:
                if got is not None:
                    self._send(st.deliver(*got))
                    msg = got[1]
                    if st.planner is not None and isinstance(msg, Report) and msg.want > 0:
                        st.planner.on_service(clock() - t0)  # receive + handle + answer: 1/mu
                    self.lock.notify_all()
                elif clock() >= next_tick:
                    self._send(self._stop_if_asked() + self._control() + st.tick())
                    next_tick = clock() + 1e-3
                    self.lock.notify_all()
                self._checkpoint_if_due()
                if st.done_serving:
                    break
            if got is None:
                backoff.wait()
            else:
                backoff.reset()
        self.t.flush()

    def _send(self, outs: list[Out]) -> None:
        for out in outs:
            if isinstance(out.msg, Kill):
                self._kill(out.msg.rank)
            else:
                self.t.send(out.dest, out.msg)

    def _kill(self, rank: int) -> None:
        """A lease expired: kill the hung rank here if it is on this host, else ask a rank on its host."""
        if rank in self.t.failed or rank == self.rank:
            return
        if self.t.kill(rank):
            sys.stderr.write(f"nlevel: rank {self.rank}: rank {rank} held tasks past its lease; killed it\n")
            return
        relay = self.t.relay_for(rank)
        if relay is not None:
            self.t.send(relay, Kill(rank))

    def end_together(self) -> None:
        """Fault tolerance: this rank's loop is over; keep answering until every live rank's is.

        A rank past its loop would otherwise be deaf (inside the end's collectives) to a
        new master that needs to ask it what it holds.
        """
        if not self.t.ft:
            return
        st = self.station
        next_tick = 0.0

        def step() -> bool:
            nonlocal next_tick
            got = self.t.poll()
            with self.lock:
                if got is not None:
                    self._send(st.deliver(*got))
                elif clock() >= next_tick:
                    self._send(st.tick())
                    next_tick = clock() + 1e-3
                self._checkpoint_if_due()
            return got is not None

        self.t.end_together(step)

    def _control(self) -> list[Out]:
        """The master: act on operator requests in the control directory (lock held)."""
        if self.control_dir is None or self.ledger is None or clock() < self._control_at:
            return []
        self._control_at = clock() + self.config.control_interval
        outs: list[Out] = []
        for path, request in control.pending(self.control_dir):
            if request is None or request.get("action") != "drain":
                control.answer(path, request, error=f"not a request nlevel understands: {request!r}")
                continue
            try:
                ranks, sends = self.station.drain(request.get("ranks"), request.get("count"))
            except ValueError as exc:
                control.answer(path, request, error=str(exc))
                continue
            outs += sends
            control.answer(path, request, result={"ranks": ranks})
            sys.stderr.write(f"nlevel: draining ranks {ranks} (operator request)\n")
        return outs

    def _stop_if_asked(self) -> list[Out]:
        """The master, on SIGUSR1: save what is committed now, then stop granting (lock held)."""
        st = self.station
        if not signals.requested() or st.stopped or self.ledger is None:
            return []
        if self.on_checkpoint is not None and not self._final_written:
            self.on_checkpoint(self.ledger, False)  # in case running tasks outlast the warning
            self._flushed_count = self.ledger.commits
            self._flushed_at = clock()
        return st.stop()

    # -- checkpoint (rank 0) ---------------------------------------------------------------
    def _checkpoint_if_due(self) -> None:
        ledger = self.ledger
        if ledger is None or self.on_checkpoint is None or self._final_written:
            return
        new = ledger.commits - self._flushed_count
        if new and (new >= self.config.checkpoint_every or clock() - self._flushed_at >= self.config.checkpoint_interval):
            self.on_checkpoint(ledger, False)  # a background write: never blocks on disk
            self._flushed_count = ledger.commits
            self._flushed_at = clock()

    def _checkpoint_final(self) -> None:
        ledger = self.ledger
        self._final_written = True  # no periodic write may follow the last one
        if ledger is not None and self.on_checkpoint is not None:
            try:
                self.on_checkpoint(ledger, True)
            except Exception as exc:  # recorded; the final grants must still go out
                self.checkpoint_error = exc

    def _raise_error(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"nlevel server thread on rank {self.rank} failed: {self.error!r}") from self.error

    # -- teardown -------------------------------------------------------------------------
    def stats(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Return this rank's (row, mergeable statistics) for the run report.

        The row is a few numbers per rank (gathered); the statistics are summaries
        merged up a tree with :func:`nlevel.runtime.report.merge_stats`.
        """
        st = self.station
        info = st.info
        w, d = st.worker, st.dispatcher
        row: dict[str, Any] = {
            "rank": self.rank,
            "role": info.role.value,
            "level": info.level,
            "tasks": w.task_times.n if w is not None else 0,
            "busy_s": w.task_times.total if w is not None else 0.0,
            "served": st.served,
        }
        requests = None
        if w is not None and not st.local_parent:
            requests = w.requests  # to the parent, one level up
        elif isinstance(d, Region):
            requests = d.requests
        merged: dict[str, Any] = {
            "tasks": w.task_times if w is not None else None,
            "requests": {info.level: requests} if requests is not None and requests.total.n else {},
            "unexpected": st.unexpected_before + (d.unexpected if d is not None else 0),
            "failures": list(st.failures),
            "timeline": {self.rank: dict(st.served_bins)} if st.served_bins else {},
        }
        return row, merged

    def fail_task(self, info: str) -> None:
        """The current task raised: report it instead of a completion (the master retries or records it)."""
        with self.lock:
            self.station.fail_task(info)
