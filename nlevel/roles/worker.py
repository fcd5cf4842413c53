"""The worker side of a rank: hands out ids to the user's loop and talks to its parent.

A state machine, no MPI: :meth:`Worker.next` is called each time the user asks for
a task and returns the id (or WAIT / END) plus the reports to send; :meth:`on_grant`
takes the parent's answer. Slaves run one with an MPI parent; the master and the
region-masters run one whose parent is their own dispatcher, in the same process.
"""

from __future__ import annotations

import math

from ..ranges import RangeSet
from ..stats import RequestTimes, Summary
from .messages import Grant, Message, Report, Result

__all__ = ["WAIT", "END", "Out", "Worker", "auto_chunk"]

#: ``next`` outcome: no id yet, a request is outstanding; wait for a grant.
WAIT = -1
#: ``next`` outcome: no id will ever come; the rank is done.
END = -2


class Out:
    """A message to send: ``msg`` to rank ``dest`` (treat it as immutable).

    A plain class with slots rather than a frozen dataclass: every task creates a few
    (the simulator makes millions), and this constructs about 3x faster.
    """

    __slots__ = ("dest", "msg")

    def __init__(self, dest: int, msg: Message) -> None:
        self.dest = dest
        self.msg = msg

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Out):
            return NotImplemented
        return self.dest == other.dest and self.msg == other.msg

    def __hash__(self) -> int:
        return hash((self.dest, self.msg))

    def __repr__(self) -> str:
        return f"Out(dest={self.dest!r}, msg={self.msg!r})"


def auto_chunk(mean_task_s: float, target_s: float, max_chunk: int) -> int:
    """Return how many ids to ask for at once so a batch runs about ``target_s`` seconds.

    Long tasks get 1 (best balance); tasks much cheaper than a round trip come in
    batches of up to ``max_chunk`` so the request cost is shared.
    """
    if mean_task_s <= 0:
        return max_chunk
    return max(1, min(max_chunk, int(target_s / mean_task_s)))


class Worker:
    """Ids for one rank's user loop.

    Args:
        parent: Rank that grants ids (may be this rank itself for a server).
        chunk: Ids per request; 0 = automatic from the measured task time.
        report_every: Send buffered completions once this many are waiting.
        report_age: ... or once the oldest has waited this many seconds.
        chunk_target: Seconds of work an automatic chunk aims at.
        max_chunk: Largest automatic chunk.
    """

    def __init__(
        self,
        parent: int,
        chunk: int = 0,
        report_every: int = 256,
        report_age: float = 0.05,
        chunk_target: float = 2e-3,
        max_chunk: int = 256,
    ) -> None:
        self.parent = parent
        self.chunk = chunk
        self.report_every = report_every
        self.report_age = report_age
        self.chunk_target = chunk_target
        self.max_chunk = max_chunk
        self.queue = RangeSet()
        self.current: int | None = None
        self.started = 0.0
        self.done = RangeSet()
        self.results: list[tuple[int, Result]] = []
        self.failed: list[tuple[int, str]] = []  # tasks that raised, for the master to retry or record
        self.oldest_done = math.inf
        self.asked = False
        self.asked_at = 0.0
        self.final = False
        self.left = False
        self._last_want = 1
        self.task_times = Summary()
        self.requests = RequestTimes()

    # -- the user's loop -------------------------------------------------------------
    def finish(self, now: float, result: Result | None = None) -> None:
        """Record the current task (if any) as finished at ``now``, with an optional result (a float or a tuple of floats)."""
        tid = self.current
        if tid is None:
            return
        self.current = None
        self.task_times.add(now - self.started)
        self.done.add(tid, tid + 1)
        if result is not None:
            self.results.append((tid, result))
        if self.oldest_done == math.inf:
            self.oldest_done = now

    def fail(self, now: float, info: str) -> None:
        """The current task raised: report it (``info``: the error, rank and host) instead of a completion."""
        tid = self.current
        if tid is None:
            return
        self.current = None
        self.failed.append((tid, info))
        if self.oldest_done == math.inf:
            self.oldest_done = now

    def holding(self) -> RangeSet:
        """Ids this worker holds: queued, running, finished but not yet reported."""
        held = self.queue.copy()
        held.add_ranges(self.done.ranges())
        if self.current is not None:
            held.add(self.current, self.current + 1)
        for tid, _ in self.failed:
            held.add(tid, tid + 1)
        return held

    def want(self) -> int:
        """Return how many ids the next request asks for."""
        if self.chunk:
            return self.chunk
        if self.task_times.n == 0:
            return 1
        return auto_chunk(self.task_times.mean, self.chunk_target, self.max_chunk)

    def next(self, now: float) -> tuple[int, list[Out]]:
        """Return ``(id | WAIT | END, messages to send)`` for the user's next call."""
        outs: list[Out] = []
        if self.queue:
            tid = self.queue.pop()
            self.current = tid
            self.started = now
            if not self.asked and not self.final and len(self.queue) < self._last_want // 2:
                # Cheap tasks (batches > 1): ask for the next batch before this one runs out.
                outs.append(self._request(now, self.want()))
            elif (self.done or self.failed) and (
                len(self.done) >= self.report_every or now - self.oldest_done >= self.report_age
            ):
                outs.append(Out(self.parent, self._drain_report(0)))
            return tid, outs
        if self.final:
            if self.done or self.failed:  # cannot happen with a sane parent; never drop a completion
                outs.append(Out(self.parent, self._drain_report(0)))
            return END, outs
        if not self.asked:
            outs.append(self._request(now, self.want()))
        elif self.done or self.failed:
            # A request is outstanding and may wait for these very completions (the
            # parent finishes the job only when everything granted is committed).
            outs.append(Out(self.parent, self._drain_report(0)))
        return WAIT, outs

    def leave(self, now: float, again: bool = False) -> list[Out]:
        """Give back unstarted ids and report what is done: the user left the loop early.

        ``again=True`` returns ids of a grant that crossed the first leaving report.
        """
        if (self.left and not again) or (self.final and not self.queue and not self.done):
            self.left = True
            return []
        self.left = True
        returned = self.queue.ranges()
        self.queue = RangeSet()
        report = self._drain_report(0)
        return [Out(self.parent, Report(report.done, report.results, 0, returned, True, failed=report.failed,
                                                task_max=report.task_max))]

    # -- the parent's answers --------------------------------------------------------
    def on_grant(self, grant: Grant, now: float) -> None:
        """Take a grant: queue its ids, note a final one, and time the request."""
        if self.asked:
            self.requests.add(now - self.asked_at, grant.residence, grant.dispose)
        self.asked = False
        self.queue.add_ranges(grant.ids)
        if grant.final:
            self.final = True

    # -- internals ---------------------------------------------------------------------
    def _request(self, now: float, want: int) -> Out:
        self._last_want = want
        self.asked = True
        self.asked_at = now
        return Out(self.parent, self._drain_report(want))

    def _drain_report(self, want: int) -> Report:
        # A request carries this rank's measurements for the planner (what Station._stamp
        # puts there; made here once so the Station need not rebuild the report).
        times = self.task_times
        longest = times.hi if times.n else 0.0
        if want:
            report = Report(self.done.ranges(), tuple(self.results), want, (), False, 0, False,
                            times.mean if times.n else 0.0,
                            self.requests.message.mean if self.requests.message.n else 0.0,
                            tuple(self.failed), longest)
        else:
            report = Report(self.done.ranges(), tuple(self.results), want, failed=tuple(self.failed), task_max=longest)
        self.done = RangeSet()
        self.results = []
        self.failed = []
        self.oldest_done = math.inf
        return report
