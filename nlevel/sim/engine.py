"""The event engine of :mod:`nlevel.sim`: one :class:`~nlevel.roles.station.Station` per rank, timed.

The runtime (:mod:`nlevel.runtime.node`) and the role tests drive the same Stations; this
module only decides *when* each Station call happens (see :mod:`nlevel.sim.model` for the
timing model). Pure Python, no MPI.

The engine's own work is a small part of a simulated task (most of the time goes to
the Stations themselves); it is kept small by merging three event sources by time
instead of pushing every event through one heap:

* messages: every message takes the same ``msg_time`` and is sent at the current
  simulated time, which never decreases, so messages in flight arrive in the order
  they were sent: one FIFO (a deque) holds them all;
* server handlings: a server starts handling a message "now" and every handling
  lasts ``service_time``, so handling ends are also in time order: a second deque
  (one entry per server that is busy, its queue of waiting messages kept apart);
* a heap of times for what varies: task ends, batch-age ticks, and handlings
  lengthened by the optional GIL delay. The heap holds bare floats (32,768 tasks in
  flight make tuple comparisons the engine's largest cost); a dict maps each time to
  what happens then, ``kind * size + rank`` (a list in the rare case of a tie), so ties
  still go in ``(kind, rank)`` order.
"""

from __future__ import annotations

import gc
import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Sequence

from ..config import Config
from ..errors import ConfigError, SimStalled
from ..model.hierarchy import Hierarchy
from ..roles.dispatch import Region
from ..roles.ledger import Ledger
from ..roles.messages import Grant, Message
from ..roles.station import Station
from ..roles.worker import WAIT
from ..stats import PARTS, RequestTimes, Summary

__all__ = ["SimClock", "EngineResult", "Engine", "SimStalled", "LeanSummary"]

_INF = math.inf
# Heap entry kinds; at equal times a handling end goes first, then task ends, then ticks.
_SERVE, _TASK, _TICK = 0, 1, 2


class SimClock:
    """The simulated time, shared by every Station: the engine sets ``t`` before each call."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass
class EngineResult:
    """What one simulated run produced.

    Attributes:
        makespan: Simulated seconds from the start until the last rank got its end.
        busy: Sum of the durations of the tasks run (seconds).
        tasks_run: Tasks executed (counting any re-execution).
        events: Events processed (messages, handlings, task ends, ticks).
        ledger: The master's completion record.
        requests: Per level of the asking rank: ``[count, sum of seconds]`` of the requests
            answered with ids (from sending the request to receiving the grant). A
            request answered "no more ids" is left out: its wait is the end of the job.
        handled: Messages handled per server level: ``[count of servers, messages]``.
        max_handled_by_level: Per server level, the most messages one server handled.
        stations: Every rank's Station (for inspection; large at scale).
    """

    makespan: float
    busy: float
    tasks_run: int
    events: int
    ledger: Ledger
    requests: dict[int, list[float]] = field(default_factory=dict)
    handled: dict[int, list[int]] = field(default_factory=dict)
    max_handled_by_level: dict[int, int] = field(default_factory=dict)
    stations: list[Station] = field(default_factory=list, repr=False)


def LeanSummary() -> Summary:
    """A :class:`~nlevel.stats.Summary` that keeps no percentile samples.

    Every worker keeps five summaries (its task times and the four request-time parts).
    With 512 samples each, 32,768 simulated ranks x 100 tasks retain 16 million floats
    (peak memory 1.37 GB against 0.82 GB without), for percentiles the simulator never
    reports. What the roles read back (``n``, ``mean``) is unchanged.
    """
    return Summary(cap=0)


def _lean(times: RequestTimes) -> None:
    for name in PARTS:
        setattr(times, name, LeanSummary())


class Engine:
    """A timed run of every rank's Station.

    Args:
        hierarchy: The laid-out plan.
        config: Settings the Stations take (batch sizes and ages, chunk sizing). The plan is
            the hierarchy's: re-planning while the job runs (``levels=auto``) is not simulated.
        durations: Seconds of task ``i`` at index ``i``; its length is the number of tasks.
        service_time: Seconds a server spends on each incoming message (FIFO, one at a time).
        msg_time: Seconds a message takes one way.
        gil_delay: Extra seconds added to a handling while the server's own task runs.

    Raises:
        ConfigError: for ``config.levels == 0`` (auto).
    """

    def __init__(
        self,
        hierarchy: Hierarchy,
        config: Config,
        durations: Sequence[float],
        service_time: float,
        msg_time: float,
        gil_delay: float = 0.0,
    ) -> None:
        if config.auto:
            raise ConfigError(
                "the simulator runs one fixed plan; levels=auto (re-planning while the job runs) is not "
                "simulated: give the config the hierarchy's levels"
            )
        self.hierarchy = hierarchy
        self.config = config
        self.durations = durations
        self.service_time = float(service_time)
        self.msg_time = float(msg_time)
        self.gil_delay = float(gil_delay)
        self.clock = SimClock()
        self.ledger = Ledger(len(durations))
        size = hierarchy.size
        # The Stations read the time through a C-level callable (half the cost of calling
        # SimClock; they read it several times per task).
        now = partial(getattr, self.clock, "t")
        # The cyclic collector would walk the Stations built so far again and again while
        # 32,768 of them are made (see run()); the wall clock is the simulated one too.
        enabled = gc.isenabled()
        gc.disable()
        try:
            self.stations = [
                Station(hierarchy, r, config, now, self.ledger if r == 0 else None, wall=now) for r in range(size)
            ]
        finally:
            if enabled:
                gc.enable()
        for st in self.stations:
            if st.worker is not None:
                st.worker.task_times = LeanSummary()
                _lean(st.worker.requests)
            if isinstance(st.dispatcher, Region):
                _lean(st.dispatcher.requests)

    def run(self) -> EngineResult:
        """Run the farm to its end; return the result.

        Raises:
            SimStalled: when no event is left but some rank has not ended.
        """
        # Every object an event creates dies by reference counting; the cyclic collector
        # would only walk the 32,768 Stations again and again (5-10 % of the run).
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if enabled:
                gc.enable()

    def _run(self) -> EngineResult:
        # One flat loop with the hot paths (a task ends, a grant reaches a slave, a server
        # finishes a handling) written out: at 3.3M tasks every call saved counts.
        stations = self.stations
        workers = [s.worker for s in stations]
        size = len(stations)
        clock = self.clock
        dur = self.durations
        msg_time = self.msg_time
        svc = self.service_time
        gil = self.gil_delay
        heap: list[float] = []  # times at which something in `at` happens
        at: dict[float, int | list[int]] = {}  # time -> kind * size + rank (a list when tied)
        heappush, heappop = heapq.heappush, heapq.heappop
        msgs: deque[tuple[float, int, int, Message]] = deque()  # (arrival, dest, src, msg)
        ends: deque[tuple[float, int]] = deque()  # (handling end, server)
        msgs_append, msgs_popleft = msgs.append, msgs.popleft
        ends_append, ends_popleft = ends.append, ends.popleft
        # A server's queue of messages waiting for it, as they arrived (entries of msgs).
        inbox: list[deque[tuple[float, int, int, Message]] | None] = [
            deque() if s.serves_remote else None for s in stations
        ]
        region = [isinstance(s.dispatcher, Region) for s in stations]
        busy = [False] * size
        waiting = [False] * size
        tick_at = [_INF] * size
        handled = [0] * size
        level = [s.info.level for s in stations]
        levels = self.hierarchy.plan.levels
        req_n = [0] * levels  # requests answered with ids, by the asking rank's level
        req_s = [0.0] * levels
        counts = [0, 0]  # ranks ended, tasks started
        to_end = sum(w is not None for w in workers)
        events = 0
        now = 0.0

        def push(t: float, kind: int, r: int) -> None:
            code = kind * size + r
            e = at.get(t)
            if e is None:
                at[t] = code
                heappush(heap, t)
            elif isinstance(e, int):
                at[t] = [e, code]
            else:
                e.append(code)

        def check_tick(r: int) -> None:
            # Completions buffered at a region-master go up by count or age; an age is
            # only ever reached between events, so schedule a tick exactly then.
            d = stations[r].dispatcher
            assert isinstance(d, Region)
            if d.up_done and tick_at[r] == _INF and not d.parent_final and not d.gone:
                due = d.oldest_up + d.batch_age
                while due - d.oldest_up < d.batch_age:  # rounding: the tick must see the age reached
                    due = math.nextafter(due, _INF)
                tick_at[r] = due
                push(due, _TICK, r)

        def resume(r: int, t: float) -> None:
            # The rank's loop asks for its next task (the same steps as the hot paths below).
            clock.t = t
            tid, outs = stations[r].take()
            if outs:
                arrive = t + msg_time
                for o in outs:
                    msgs_append((arrive, o.dest, r, o.msg))
            if tid >= 0:
                waiting[r] = False
                counts[1] += 1
                push(t + dur[tid], _TASK, r)
            elif tid == WAIT:
                waiting[r] = True
            else:
                waiting[r] = False
                counts[0] += 1
            if region[r]:
                check_tick(r)

        def after_server(r: int, t: float) -> None:
            if waiting[r]:
                w = workers[r]
                assert w is not None
                if w.queue or w.final:  # a grant reached the local worker in-process
                    resume(r, t)
                    return  # resume checked the tick
            if region[r]:
                check_tick(r)

        def start_handling(r: int, t: float) -> None:
            w = workers[r]
            if gil and w is not None and w.current is not None:
                push(t + svc + gil, _SERVE, r)
            else:
                ends_append((t + svc, r))

        def handle(r: int, t: float) -> None:
            # A server finishes handling the message at the head of its queue (the ends
            # branch of the loop below is the same, written out for the common case).
            q = inbox[r]
            assert q is not None
            _, _, src, msg = q.popleft()
            clock.t = t
            handled[r] += 1
            if region[r] and isinstance(msg, Grant) and msg.ids:
                d = stations[r].dispatcher
                assert isinstance(d, Region)
                if d.asked:
                    req_n[level[r]] += 1
                    req_s[level[r]] += t - d.asked_at
            outs = stations[r].deliver(src, msg)
            if outs:
                arrive = t + msg_time
                for o in outs:
                    msgs_append((arrive, o.dest, r, o.msg))
            if q:
                start_handling(r, t)
            else:
                busy[r] = False
            if waiting[r] or region[r]:
                after_server(r, t)

        for r in range(size):
            if workers[r] is not None:
                resume(r, 0.0)

        while True:
            events += 1
            th = heap[0] if heap else _INF
            if ends and ends[0][0] <= th and (not msgs or ends[0][0] <= msgs[0][0]):
                now, r = ends_popleft()
                if gil or region[r]:
                    handle(r, now)
                    continue
                q = inbox[r]
                _, _, src, msg = q.popleft()  # type: ignore[union-attr]
                clock.t = now
                handled[r] += 1
                outs = stations[r].deliver(src, msg)
                if outs:
                    arrive = now + msg_time
                    for o in outs:
                        msgs_append((arrive, o.dest, r, o.msg))
                if q:
                    ends_append((now + svc, r))
                else:
                    busy[r] = False
                if waiting[r]:
                    after_server(r, now)
            elif msgs and msgs[0][0] <= th:
                entry = msgs_popleft()
                now, dest, src, msg = entry
                q = inbox[dest]
                if q is not None:
                    q.append(entry)
                    if not busy[dest]:
                        busy[dest] = True
                        if gil:
                            start_handling(dest, now)
                        else:
                            ends_append((now + svc, dest))
                    continue
                # A slave: its loop is blocked on this grant; taking it costs nothing beyond
                # the message time.
                clock.t = now
                st = stations[dest]
                w = workers[dest]
                if w.asked and isinstance(msg, Grant) and msg.ids:  # type: ignore[union-attr]
                    lv = level[dest]
                    req_n[lv] += 1
                    req_s[lv] += now - w.asked_at  # type: ignore[union-attr]
                st.deliver(src, msg)
                if waiting[dest]:
                    resume(dest, now)
            elif heap:
                now = heap[0]
                e = at[now]
                if isinstance(e, int):
                    heappop(heap)
                    del at[now]
                    code = e
                else:  # a tie: (kind, rank) order
                    code = min(e)
                    e.remove(code)
                    if len(e) == 1:
                        at[now] = e[0]
                kind, r = divmod(code, size)
                if kind == _TASK:
                    clock.t = now
                    st = stations[r]
                    st.finish()
                    resume(r, now)  # also checks a region-master's tick
                elif kind == _SERVE:
                    handle(r, now)
                else:
                    tick_at[r] = _INF
                    if not busy[r]:  # else the handling in progress runs the same upkeep when it ends
                        clock.t = now
                        outs = stations[r].tick()
                        if outs:
                            arrive = now + msg_time
                            for o in outs:
                                msgs_append((arrive, o.dest, r, o.msg))
                        after_server(r, now)
            else:
                events -= 1
                break

        ended, tasks_run = counts
        if ended != to_end or not self.ledger.complete():
            stuck = [r for r in range(size) if waiting[r] or (workers[r] is not None and workers[r].current is not None)]  # type: ignore[union-attr]
            raise SimStalled(
                f"simulation stalled at t={now:.6g} s: {ended}/{to_end} ranks ended, "
                f"{self.ledger.n_committed}/{self.ledger.total} ids committed; waiting or running ranks {stuck[:10]}"
            )
        requests = {lv: [req_n[lv], req_s[lv]] for lv in range(levels) if req_n[lv]}
        return self._result(now, tasks_run, events, handled, requests)

    def _result(
        self, makespan: float, tasks_run: int, events: int, handled: list[int], requests: dict[int, list[float]]
    ) -> EngineResult:
        per_level: dict[int, list[int]] = {}
        most: dict[int, int] = {}
        for s in self.stations:
            level = s.info.level
            if s.dispatcher is not None:
                h = per_level.setdefault(level, [0, 0])
                h[0] += 1
                h[1] += handled[s.rank]
                most[level] = max(most.get(level, 0), handled[s.rank])
        return EngineResult(
            makespan=makespan,
            busy=math.fsum(self.durations),
            tasks_run=tasks_run,
            events=events,
            ledger=self.ledger,
            requests=requests,
            handled=per_level,
            max_handled_by_level=most,
            stations=self.stations,
        )
