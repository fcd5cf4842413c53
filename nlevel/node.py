"""One rank's runtime: the loop that feeds messages to the role state machines and sends what they return.

A rank that serves children runs a :class:`~nlevel.roles.dispatch.Dispatcher` (master
or region-master); a rank that computes runs a :class:`~nlevel.roles.worker.Worker`.
A server that also computes answers its children from a server thread while the main
thread runs the user's task; its own worker is served by its own dispatcher in-process
(a message to itself is a function call). A serve-only server runs the loop in the
main thread. One lock guards the state machines; the transport is the only I/O.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

from .backoff import Backoff
from .config import Config
from .hierarchy import Hierarchy, Role
from .protocol import Grant, Report
from .roles.dispatch import Master, Region
from .roles.ledger import Ledger
from .roles.worker import END, WAIT, Out, Worker

__all__ = ["Node"]

clock = time.perf_counter


class Node:
    """The farm on one rank.

    Args:
        transport: A :class:`~nlevel.comm.Transport` (or a test double with the same methods).
        hierarchy: The laid-out plan.
        config: Settings.
        ledger: The completion record (rank 0 only).
        on_checkpoint: Rank 0: called with the ledger when a checkpoint is due, and with
            ``final=True`` once before the master releases everyone at the end.
    """

    def __init__(
        self,
        transport: Any,
        hierarchy: Hierarchy,
        config: Config,
        ledger: Ledger | None = None,
        on_checkpoint: Callable[[Ledger, bool], None] | None = None,
    ) -> None:
        self.t = transport
        self.rank = transport.rank
        self.info = hierarchy[self.rank]
        self.config = config
        self.on_checkpoint = on_checkpoint
        self.lock = threading.Condition()
        self.error: BaseException | None = None
        self.dispatcher: Master | Region | None = None
        self.worker: Worker | None = None
        self._flushed_at = clock()
        self._flushed_count = 0
        self._final_written = False

        info = self.info
        if info.children:
            weights = {c: hierarchy[c].weight for c in info.children}
            if info.computes:
                weights[self.rank] = 1
            if info.role is Role.MASTER:
                assert ledger is not None
                self.dispatcher = Master(info, weights, clock, ledger)
            else:
                self.dispatcher = Region(info, weights, clock, config.prefetch, config.batch, config.batch_age)
        elif info.role is Role.MASTER:  # a world of one: the master serves only itself
            assert ledger is not None
            self.dispatcher = Master(info, {self.rank: 1}, clock, ledger)
        if info.computes:
            parent = self.rank if self.dispatcher is not None else info.parent
            assert parent is not None
            self.worker = Worker(
                parent, config.chunk, config.report_every, config.report_age, config.chunk_target, config.max_chunk
            )
            if self.dispatcher is not None:
                # The local worker reports straight to its dispatcher: no batching needed.
                self.worker.report_every = 1
        self._thread: threading.Thread | None = None
        if self.dispatcher is not None and self.worker is not None and info.children:
            if config.switch_interval > 0:
                # Measured: with Python's 5 ms default a server thread waits ~ms for the GIL
                # behind a pure-Python task; 1e-4 s brings request latency to microseconds.
                sys.setswitchinterval(config.switch_interval)
            self._thread = threading.Thread(target=self._serve_guarded, name="nlevel-server", daemon=True)
            self._thread.start()

    @property
    def ledger(self) -> Ledger | None:
        """The master's ledger (rank 0), else None."""
        return self.dispatcher.ledger if isinstance(self.dispatcher, Master) else None

    # -- the user's side ------------------------------------------------------------
    def next(self, result: float | None = None) -> int:
        """Finish the current task (with ``result``) and return the next id, or -1 when done."""
        w = self.worker
        if w is None:
            self._serve()  # serve-only rank: the loop runs here until the job ends
            return -1
        with self.lock:
            w.finish(clock(), result)
            while True:
                self._raise_error()
                tid, outs = w.next(clock())
                self._route(outs)
                if tid >= 0:
                    return tid
                if tid == END:
                    break
                if w.queue or w.final:
                    continue  # the grant came back synchronously while routing
                if w.parent == self.rank:
                    self.lock.wait(0.5)  # woken by the server thread's grant
                else:
                    self.lock.release()
                    try:
                        grant = self.t.wait_grant(w.parent)
                    finally:
                        self.lock.acquire()
                    assert isinstance(grant, Grant)
                    w.on_grant(grant, clock())
        if self._thread is not None:
            self._thread.join()
            self._raise_error()
        return -1

    def leave(self) -> None:
        """The user left the loop early: give back unstarted ids, keep serving until the end."""
        w = self.worker
        if w is None or w.final:
            return
        with self.lock:
            w.finish(clock())
            self._route(w.leave(clock()))
            # A want still outstanding is always answered (ids or final): take the
            # answer and give any ids straight back.
            while w.asked and w.parent != self.rank:
                self.lock.release()
                try:
                    grant = self.t.wait_grant(w.parent)
                finally:
                    self.lock.acquire()
                assert isinstance(grant, Grant)
                w.on_grant(grant, clock())
                if grant.ids:
                    self._route(w.leave(clock(), again=True))
        if self.dispatcher is not None and self._thread is None:
            self._serve()
        if self._thread is not None:
            self._thread.join()
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
        d = self.dispatcher
        assert d is not None
        backoff = Backoff(self.config.poll_max)
        next_tick = 0.0
        while True:
            got = self.t.poll()
            with self.lock:
                if got is not None:
                    src, msg = got
                    if isinstance(msg, Report):
                        self._route(d.on_report(src, msg))
                    elif isinstance(d, Region):
                        self._route(d.on_grant(msg))
                elif clock() >= next_tick:
                    self._route(d.tick())
                    next_tick = clock() + 1e-3
                self._checkpoint_if_due()
                if d.finished and (not isinstance(d, Region) or d.released):
                    break
            if got is None:
                backoff.wait()
            else:
                backoff.reset()
        self.t.flush()

    def _route(self, outs: list[Out]) -> None:
        """Deliver messages: to this rank's own dispatcher or worker by call, else by MPI."""
        for out in outs:
            msg = out.msg
            if out.dest != self.rank:
                if isinstance(msg, Grant) and msg.final:
                    self._checkpoint_final()
                self.t.send(out.dest, msg)
            elif isinstance(msg, Report):
                assert self.dispatcher is not None
                self._route(self.dispatcher.on_report(self.rank, msg))
            else:
                assert self.worker is not None
                if msg.final:
                    self._checkpoint_final()
                self.worker.on_grant(msg, clock())
                self.lock.notify_all()

    # -- checkpoint (rank 0) ---------------------------------------------------------------
    def _checkpoint_if_due(self) -> None:
        ledger = self.ledger
        if ledger is None or self.on_checkpoint is None or self._final_written:
            return
        new = ledger.commits - self._flushed_count
        if new and (new >= self.config.checkpoint_every or clock() - self._flushed_at >= self.config.checkpoint_interval):
            self.on_checkpoint(ledger, False)
            self._flushed_count = ledger.commits
            self._flushed_at = clock()

    def _checkpoint_final(self) -> None:
        """Write the checkpoint once, before the first final grant releases anyone."""
        ledger = self.ledger
        if ledger is None or self._final_written:
            return
        self._final_written = True
        if self.on_checkpoint is not None:
            self.on_checkpoint(ledger, True)

    def _raise_error(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"nlevel server thread on rank {self.rank} failed: {self.error!r}") from self.error

    # -- teardown -------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Return this rank's statistics for the run report (picklable)."""
        info = self.info
        out: dict[str, Any] = {"rank": self.rank, "role": info.role.value, "level": info.level}
        if self.worker is not None:
            out["tasks"] = self.worker.task_times
            if self.worker.parent != self.rank:
                out["requests"] = self.worker.requests  # to the parent, one level up
        if self.dispatcher is not None:
            out["served"] = self.dispatcher.served
            out["unexpected"] = self.dispatcher.unexpected
            if isinstance(self.dispatcher, Region):
                out["requests"] = self.dispatcher.requests
        return out
