"""One rank's roles wired together, without I/O: the dispatcher (if it serves) and the worker (if it computes).

A message to this rank itself is delivered by a function call; everything else comes
back as :class:`~nlevel.roles.worker.Out` for the caller to send. The MPI runtime
(:mod:`nlevel.node`), the tests and the simulator all drive ranks through this class,
so they run the same logic. Pure Python.
"""

from __future__ import annotations

from typing import Callable

from ..config import Config
from ..hierarchy import Hierarchy, Role
from ..protocol import Grant, Message, Report, Result
from .dispatch import Master, Region
from .ledger import Ledger
from .worker import WAIT, Out, Worker

__all__ = ["Station"]


class Station:
    """The state machines of rank ``rank``.

    Args:
        hierarchy: The laid-out plan.
        rank: This rank.
        config: Settings (chunking, batching, prefetch).
        clock: Returns seconds.
        ledger: The completion record; required on rank 0.
        before_final: Rank 0: called once, before the first final grant goes anywhere
            (the runtime writes the last checkpoint there, before anyone is released).
    """

    def __init__(
        self,
        hierarchy: Hierarchy,
        rank: int,
        config: Config,
        clock: Callable[[], float],
        ledger: Ledger | None = None,
        before_final: Callable[[], None] | None = None,
    ) -> None:
        self.rank = rank
        self.info = info = hierarchy[rank]
        self.clock = clock
        self.before_final = before_final
        self._final_sent = False
        self.dispatcher: Master | Region | None = None
        self.worker: Worker | None = None
        weights = {c: hierarchy[c].weight for c in info.children}
        if info.computes and (info.children or info.role is Role.MASTER):
            weights[rank] = 1  # its own loop is one more child, served in-process
        if info.role is Role.MASTER:
            if ledger is None:
                raise ValueError("rank 0 (the master) needs the ledger")
            self.dispatcher = Master(info, weights, clock, ledger)
        elif info.children:
            self.dispatcher = Region(info, weights, clock, hierarchy.plan.prefetch, config.batch, config.batch_age)
        if info.computes:
            parent = rank if self.dispatcher is not None else info.parent
            assert parent is not None
            self.worker = Worker(
                parent,
                hierarchy.plan.chunk,
                config.report_every,
                config.report_age,
                config.chunk_target,
                config.max_chunk,
            )

    @property
    def serves_remote(self) -> bool:
        """Whether other ranks ask this one for ids (it needs a server loop)."""
        return bool(self.info.children)

    @property
    def local_parent(self) -> bool:
        """Whether this rank's worker is served by this rank's own dispatcher."""
        return self.worker is not None and self.worker.parent == self.rank

    @property
    def done_serving(self) -> bool:
        """Whether the server side owes nobody anything more (every child released, parent settled)."""
        d = self.dispatcher
        if d is None:
            return True
        return d.finished and (not isinstance(d, Region) or d.released)

    # -- events -----------------------------------------------------------------------
    def deliver(self, src: int, msg: Message) -> list[Out]:
        """Handle a message from another rank; return what to send."""
        if isinstance(msg, Report):
            assert self.dispatcher is not None, f"rank {self.rank} got a report but serves nobody"
            return self.route(self.dispatcher.on_report(src, msg))
        if isinstance(self.dispatcher, Region):
            return self.route(self.dispatcher.on_grant(msg))
        assert self.worker is not None
        self.worker.on_grant(msg, self.clock())
        return []

    def tick(self) -> list[Out]:
        """Time-driven work of the dispatcher (batch ages); return what to send."""
        return self.route(self.dispatcher.tick()) if self.dispatcher is not None else []

    def finish(self, result: Result | None = None) -> None:
        """Record the current task (if any) as finished, with an optional result."""
        assert self.worker is not None
        self.worker.finish(self.clock(), result)

    def take(self) -> tuple[int, list[Out]]:
        """Return ``(id | WAIT | END, what to send)`` for the user's next task."""
        w = self.worker
        assert w is not None
        sends: list[Out] = []
        while True:
            tid, outs = w.next(self.clock())
            sends += self.route(outs)
            if tid == WAIT and (w.queue or w.final):
                continue  # the grant came back in-process while routing
            return tid, sends

    def leave(self, done: bool = False, result: Result | None = None) -> list[Out]:
        """The user left the loop early: give back unstarted ids; return what to send.

        The current task counts as finished only if ``done`` (the user completed it
        explicitly); otherwise it is given back too, to run elsewhere.
        """
        w = self.worker
        if w is None or w.final:
            return []
        if done:
            w.finish(self.clock(), result)
        elif w.current is not None:
            w.queue.add(w.current, w.current + 1)
            w.current = None
        return self.route(w.leave(self.clock()))

    def on_grant_after_leaving(self, grant: Grant) -> list[Out]:
        """A grant that crossed this rank's leaving report: give its ids straight back."""
        w = self.worker
        assert w is not None
        w.on_grant(grant, self.clock())
        return self.route(w.leave(self.clock(), again=True)) if grant.ids else []

    # -- routing ----------------------------------------------------------------------
    def route(self, outs: list[Out]) -> list[Out]:
        """Deliver messages addressed to this rank in-process; return the rest."""
        remote: list[Out] = []
        for out in outs:
            msg = out.msg
            if (
                isinstance(msg, Grant)
                and msg.final
                and not self._final_sent
                and isinstance(self.dispatcher, Master)
                and self.dispatcher.exhausted  # the job's end, not a leaving child's answer
            ):
                self._final_sent = True
                if self.before_final is not None:
                    self.before_final()
            if out.dest != self.rank:
                remote.append(out)
            elif isinstance(msg, Report):
                assert self.dispatcher is not None
                remote += self.route(self.dispatcher.on_report(self.rank, msg))
            else:
                assert self.worker is not None
                self.worker.on_grant(msg, self.clock())
        return remote

