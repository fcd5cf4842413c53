"""The event engine of :mod:`nlevel.sim`: every rank's :class:`~nlevel.roles.loop.Loop`, in simulated time.

The engine decides *when* each loop step happens and what it costs; the logic is the
roles' own (the same Station, Loop and boards the MPI runtime runs). Every rank is driven
through its :class:`~nlevel.roles.loop.Loop` alone, over a port (:class:`SimPort`) that
performs effects in simulated time. Events:

* a worker's **runtime entry** (its range ended, or it was woken while waiting): the
  messages that came meanwhile (:meth:`~nlevel.roles.loop.Loop.receive`), what ran
  (:meth:`~nlevel.roles.loop.Loop.ran`), the next range claimed
  (:meth:`~nlevel.roles.loop.Loop.need_ids`): the claim's one-sided operations cost
  ``atomic_time`` each, plus queueing at the board owner's memory (``atomic_service``
  per operation); the range then runs for the sum of its tasks' durations. A slave
  hears its messages (plan changes) only here, as the runtime's do.
* a message's **arrival** at a server: handled in arrival order, ``service_time`` each,
  on the server's own CPU (its thread; its own tasks run beside it);
* a server's **tick**, when something needs one (:meth:`~nlevel.roles.loop.Loop.next_tick`):
  a claimer found its board empty (noticed within ``detect`` seconds), batched completions
  reached their age, the planner's sampling window ended. A tick is the loop's whole step:
  messages, time, the master's controls (an operator's drain comes in there) and checkpoint.
* the **end**: the master releases every rank once every live one has ended
  (:meth:`~nlevel.roles.loop.Loop.release`), at once after its last event; its own last
  work takes no simulated time.

A claimer that finds nothing published waits without polling in the simulation: it is
woken ``poll`` seconds after its board changes (the runtime's back-off, on average): what
it waits for is the loop's to say (:attr:`~nlevel.roles.loop.Loop.ticket`,
:meth:`~nlevel.roles.loop.Loop.published`). Checkpoint writes are not modelled: they take
no time and keep nothing (a new master finds no checkpoint), but they are asked and answered
as in a job. Pure Python + numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final, Sequence

import numpy as np

from ..config import Config
from ..errors import SimStalled
from ..model.hierarchy import Hierarchy
from ..roles.board import LocalMemory
from ..roles.ledger import Ledger
from ..roles.loop import Loop
from ..roles.messages import Message
from ..roles.station import Station
from ..stats import RequestTimes
from .faults import _DRAIN, _KILL, as_dict, check_faults, fault_handler
from .heap import Event, pop, push
from .port import SimPort
from .waiters import Waiters

__all__ = ["SimCosts", "SimBoards", "SimPort", "EngineResult", "Engine", "SimStalled"]

_ENTRY: Final = 0
_ARRIVE: Final = 1
_HANDLE: Final = 2
_TICK: Final = 3
_HANDLE_LATE: Final = 7  # a message sent after every user loop had ended: handled, not counted (the end)
_STEP: Final = 8  # a server whose part of the job is over steps its loop once: its Ending goes up


@dataclass(frozen=True)
class SimCosts:
    """The simulator's timing model's inputs (seconds; built with keywords, see tests/unit/test_architecture.py).

    Attributes:
        msg_time: One message, one way.
        service_time: A server's CPU per message handled, and per tick.
        atomic_time: One one-sided operation as its origin sees it (a round trip).
        atomic_service: The target's time per one-sided operation (they queue there).
        poll: A waiting claimer notices a change of its board this long after it (its back-off).
        detect: An idle server notices a claimer waiting on its board this long after.
    """

    msg_time: float
    service_time: float
    atomic_time: float = 1e-6
    atomic_service: float = 2e-7
    poll: float = 5e-5
    detect: float = 1e-3


class _Counting(LocalMemory):
    """A board in local memory that counts the operations made on it (the engine charges them)."""

    def __init__(self, slots: int, sink: list[int]) -> None:
        super().__init__(slots)
        self.sink = sink

    def fetch_add(self, index: int, n: int) -> int:
        self.sink[0] += 1
        return super().fetch_add(index, n)

    def get(self, index: int) -> int:
        self.sink[0] += 1
        return self.words[index]

    def read(self, index: int, count: int) -> list[int]:
        self.sink[0] += 1
        return super().read(index, count)

    def write(self, index: int, values: Sequence[int]) -> None:
        self.sink[0] += 1
        super().write(index, values)

    def put(self, index: int, value: int) -> None:
        self.sink[0] += 1
        self.words[index] = value

    def cas(self, index: int, expected: int, new: int) -> int:
        self.sink[0] += 1
        return super().cas(index, expected, new)


class SimBoards:
    """Every rank's boards, made on first use, each counting operations into a shared sink."""

    def __init__(self, slots: tuple[int, int]) -> None:
        self._slots = slots
        # [kind][rank], grown on first use (lists: a claim asks for its parent's board each time)
        self._mem: tuple[list[_Counting | None], list[_Counting | None]] = ([], [])
        self.sink = [0]

    def __call__(self, rank: int, kind: int) -> _Counting:
        mems = self._mem[kind]
        if rank < len(mems):
            mem = mems[rank]
            if mem is not None:
                return mem
        else:
            mems.extend([None] * (rank + 1 - len(mems)))
        made = _Counting(self._slots[kind], self.sink)
        mems[rank] = made
        return made

    def slots(self, kind: int) -> int:
        return self._slots[kind]


@dataclass
class EngineResult:
    """What one simulated run produced.

    Attributes:
        makespan: Simulated seconds until the last rank's loop ended.
        busy: Sum of the durations of the tasks run.
        tasks_run: Tasks executed.
        events: Events processed.
        ledger: The master's completion record.
        requests: Per level of the claiming rank, the request-time parts of its claims.
        handled: Per server level: [servers, messages handled, ticks].
        server_busy: Per server level: [total seconds busy, the busiest server's seconds].
        stations: Every rank's Station (for inspection).
        decisions: The in-job planner's decisions (``levels=auto``).
        plans: The plans the job ran, in order.
        deaths: Ranks killed (``kills``), with when: ``(time, rank)``.
        drained: Ranks the master drained (``drains``) and when each one left: ``(time left, rank)``.
        failures: The survivors' records of each death (role, ids held, who recovered them).
        last_done: Per rank, when its last task ended (0 for a rank that ran none).
    """

    makespan: float
    busy: float
    tasks_run: int
    events: int
    ledger: Ledger
    requests: dict[int, RequestTimes] = field(default_factory=dict)
    handled: dict[int, list[float]] = field(default_factory=dict)
    server_busy: dict[int, list[float]] = field(default_factory=dict)
    stations: list[Station] = field(default_factory=list, repr=False)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    plans: list[Any] = field(default_factory=list)
    deaths: list[tuple[float, int]] = field(default_factory=list)
    drained: list[tuple[float, int]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    last_done: list[float] = field(default_factory=list)


class _Agenda:
    """The engine's pending events, and what the servers' CPUs and the boards' memories are booked
    for: the engine's most frequent steps, as methods (compiled, a method is called directly, a
    closure through Python's calling convention)."""

    def __init__(self, n: int, costs: SimCosts, stations: list[Station], loops: list[Loop],
                 outbox: list[tuple[int, Message]]) -> None:
        self.heap: list[Event] = []
        self.seq = 0
        self.c = costs
        self.stations = stations
        self.loops = loops
        self.outbox = outbox
        self.busy_until = [0.0] * n  # a server's CPU (its thread)
        self.server_busy = [0.0] * n
        self.nic_until = [0.0] * n  # a board owner's memory, for one-sided operations
        self.tick_at = [math.inf] * n  # the pending tick of each server
        self.last_tick = [-math.inf] * n  # when each server last looked at its boards
        # [board kind][owner] -> {waiter: ticket it waits for (-1: none, it waits for a change)};
        # a waiter is a worker's rank, or -1-rank for a region-master waiting to refill.
        self.waiting: list[list[Waiters | None]] = [[None] * n, [None] * n]
        self.watched: list[list[tuple[int, int] | None]] = [[None] * n, [None] * n]  # (flags, epoch) at the last look
        self.ticket_since: dict[int, tuple[int, float]] = {}  # region-master -> (its ticket above, since when)
        self.faulty = False  # (kills or drains: limbo tickets can happen)
        # Ranks whose part of the job is over (user loop ended, serving done): from then on each
        # event runs a whole step of the loop, as the runtime's loop steps until it is released.
        self.over = [False] * n
        self.released = False  # the master released the job
        self.totals: dict[str, Any] = {}  # ... with every live rank's statistics, merged
        # Messages count in the servers' statistics while some user loop still runs and when their
        # sender's part is not over: those are of the makespan, not of the end's own messages
        # (every rank's Ending as its loop ends, the release).
        self.running = sum(1 for st in stations if st.worker is not None)
        self.counting = self.running > 0

    def loop_over(self) -> None:
        """A user loop ended (or its rank died while it ran)."""
        self.running -= 1
        if self.running <= 0:
            self.counting = False

    def push(self, t: float, kind: int, r: int, payload: Any = None) -> None:
        self.seq += 1
        push(self.heap, Event(t, self.seq, kind, r, payload))

    def schedule_tick(self, r: int, t: float) -> None:
        if t < self.tick_at[r]:
            self.tick_at[r] = t
            self.push(t, _TICK, r)

    def send_all(self, src: int, t: float) -> None:
        """Send what the last step put in the outbox."""
        # Messages arrive in the order they were sent (every one takes msg_time), so a
        # server's handling slot can be booked now: first come, first served.
        c = self.c
        loops, busy_until = self.loops, self.busy_until
        arrive = t + c.msg_time
        counting = self.counting and not self.over[src]
        for dest, msg in self.outbox:
            if loops[dest].serving:
                start = busy_until[dest] if busy_until[dest] > arrive else arrive
                end = start + c.service_time
                busy_until[dest] = end
                if counting:
                    self.server_busy[dest] += c.service_time
                    self.push(end, _HANDLE, dest, (src, msg))
                else:
                    self.push(end, _HANDLE_LATE, dest, (src, msg))
            else:
                self.push(arrive, _ARRIVE, dest, (src, msg))
        self.outbox.clear()

    def waiters_of(self, owner: int, kind: int) -> Waiters:
        """Who waits on ``owner``'s board ``kind``."""
        ws = self.waiting[kind][owner]
        if ws is None:
            ws = self.waiting[kind][owner] = Waiters()
        return ws

    def wake(self, w: int, t: float) -> None:
        """Waiter ``w`` looks at its board again (a worker's rank, or -1-rank: a region-master)."""
        if w >= 0:
            self.push(t + self.c.poll, _ENTRY, w)
        else:
            self.schedule_tick(-1 - w, t + self.c.poll)

    def wake_waiters(self, r: int, t: float) -> None:
        """Wake the claimers waiting on ``r``'s boards for whom something changed: their ticket
        was published, or a flag or the epoch changed (a claimer without a ticket waits for that)."""
        loop = self.loops[r]
        for kind in (0, 1):
            ws = self.waiting[kind][r]
            if not ws:
                continue
            board = loop.published(kind)
            if board is None:  # (no board of that kind any more: everyone looks again)
                for w in ws:
                    self.wake(w, t)
                ws.clear()
                continue
            flags, epoch, tail, unclaimed = board
            seen = self.watched[kind][r]
            if seen is None or seen[0] != flags or seen[1] != epoch:
                self.watched[kind][r] = (flags, epoch)
                for w in ws:
                    self.wake(w, t)
                ws.clear()
                continue
            for w in ws.ready(tail, unclaimed):
                self.wake(w, t)

    def after_server(self, r: int, t: float) -> None:
        """A server handled something at ``t``: the master releases the job once every rank has
        ended; wake who waits on its boards; plan its next tick."""
        loop = self.loops[r]
        st = self.stations[r]
        now_over = st.server is not None and not self.over[r] and st.closing.over
        if now_over:
            self.over[r] = True
        if loop.release() or (st.closing.finished_release and not self.released):  # (or a deputy finished it)
            self.released = True
            # The statistics every rank sent up at the end (a later death changes who is a child).
            self.totals = (st.closing.partial_payload if st.closing.finished_release else st.closing.payload)[1]
            loop.report_done()  # (its last work, the report, takes no simulated time)
            self.send_all(r, t)
        self.wake_waiters(r, t)
        if st.server is None:
            return
        if now_over:
            self.push(t, _STEP, r)
            return
        wait = loop.refill_wait
        if wait is not None:  # waiting for its parent to publish that ticket
            parent, tk = wait
            self.waiters_of(parent, 1).add(-1 - r, tk)
            seen = self.ticket_since.get(r)
            if seen is None or seen[0] != tk:
                seen = self.ticket_since[r] = (tk, t)
            upper = self.loops[parent].published(1)
            if upper is not None and upper[2] <= tk and self.last_tick[parent] < seen[1]:
                # (the parent notices a waiter on its next look; one look is enough)
                self.schedule_tick(parent, t + self.c.detect)
        need = loop.next_tick(t, self.c.detect, self.faulty)
        if need < math.inf and not st.done_serving:
            self.schedule_tick(r, max(need, t))

    def charge(self, r: int, t: float, target: int, ops: int) -> float:
        """Seconds ``ops`` one-sided operations of rank ``r`` on ``target``'s board take from ``t``."""
        if ops <= 0:
            return 0.0
        c = self.c
        if target == r:
            return ops * c.atomic_service  # its own memory
        nic_until = self.nic_until
        start = nic_until[target] if nic_until[target] > t else t
        nic_until[target] = start + ops * c.atomic_service
        return (start - t) + ops * c.atomic_time


class Engine:
    """A timed run of every rank's loop.

    Args:
        hierarchy: The laid-out first plan.
        config: Settings the stations take (``levels=0``: the in-job planner decides, as in a real job).
        durations: Seconds of task ``i`` at index ``i``.
        costs: The timing model.
        slots: Ring sizes of the leaf and upper boards.
        kills: ``(time, rank)``: the process ``rank`` dies at simulated ``time``: its events are
            dropped, messages to it are lost, and every survivor hears ``Died((rank,))``
            ``notice`` seconds later. Needs ``config.ft`` (fault tolerance on).
        drains: ``(time, count)``: at ``time`` the master is asked to take ``count`` slaves out
            of the job (an operator's :class:`~nlevel.roles.events.DrainRequest`: the highest
            ranked; ``-count``: as many, spread evenly over the slaves); each finishes the range
            it runs, then leaves.
        notice: Seconds between a death and the survivors hearing of it (failure detection).

    Raises:
        ValueError: kills without fault tolerance, or a rank or count out of range.
    """

    def __init__(self, hierarchy: Hierarchy, config: Config, durations: Sequence[float], costs: SimCosts,
                 slots: tuple[int, int] | None = None, kills: Sequence[tuple[float, int]] = (),
                 drains: Sequence[tuple[float, int]] = (), notice: float = 0.05) -> None:
        self.hierarchy = hierarchy
        self.config = config
        self.costs = costs
        n = hierarchy.size
        self.size = n
        self.total = len(durations)
        # Work before each task, as a list: one float per read, not a numpy scalar (~100 MB at 3.3 M tasks).
        self.cum: list[float] = np.concatenate(([0.0], np.cumsum(np.asarray(durations, dtype=float)))).tolist()
        leaf = slots[0] if slots else max(config.board_slots, 4 * n)
        self.boards = SimBoards(slots or (leaf, max(16, leaf // 8)))
        self.t = 0.0
        self.outbox: list[tuple[int, Message]] = []
        ledger = Ledger(self.total)
        clock = self._clock
        # (claims are timed by the engine, in simulated time: not by the workers)
        self.stations = [Station(hierarchy, r, config, clock, self.boards, self.total, ledger if r == 0 else None,
                                 wall=clock, measured=False) for r in range(n)]
        self.ports = [SimPort(self.outbox) for _ in range(n)]
        # (the planner is told the model's service time)
        self.loops = [Loop(st, port, config.checkpoint_every, config.checkpoint_interval, service=costs.service_time)
                      for st, port in zip(self.stations, self.ports)]
        self.kills, self.drains, self.notice = check_faults(n, config.ft, kills, drains, notice)

    def _clock(self) -> float:
        return self.t

    def run(self) -> EngineResult:
        """Run to the end.

        Raises:
            SimStalled: when events run out before every rank has ended and the job was released
                (a bug, never silent).
        """
        c = self.costs
        n = self.size
        stations, loops, ports, boards = self.stations, self.loops, self.ports, self.boards
        sink = boards.sink
        cum = self.cum
        outbox = self.outbox
        ag = _Agenda(n, c, stations, loops, outbox)
        heap = ag.heap
        busy_until = ag.busy_until
        last_served = [-math.inf] * n
        tick_at = ag.tick_at
        ag.faulty = bool(self.kills or self.drains)
        last_tick = ag.last_tick
        hand: list[tuple[int, int] | None] = [None] * n
        started = [0.0] * n
        last_done = [0.0] * n  # when each rank's last task ended
        ended = [False] * n
        events = 0
        busy = 0.0
        tasks_run = 0
        makespan = 0.0
        handled: dict[int, list[float]] = {}
        server_busy = ag.server_busy
        asked = [0.0] * n  # when each worker started needing its next range
        requests: dict[int, RequestTimes] = {}

        dead = [False] * n
        deaths: list[tuple[float, int]] = []
        left: list[tuple[float, int]] = []
        fault = fault_handler(self, ag, stations, loops, ports, dead, ended, hand, deaths)
        for t0, r in self.kills:
            ag.push(t0, _KILL, r)
        for k, (t0, count) in enumerate(self.drains):
            ag.push(t0, _DRAIN, 0, (k, count))

        # Every worker starts by asking for ids; every server ticks once at the start.
        for r in range(n):
            if stations[r].worker is not None:
                ag.push(0.0, _ENTRY, r)
                asked[r] = 0.0
            if stations[r].server is not None:
                ag.schedule_tick(r, 0.0)

        while heap:
            e = pop(heap)
            t, kind, r, payload = e.t, e.kind, e.r, e.payload
            if dead[r]:
                continue  # (what was on its way to a dead rank, or its own next step)
            self.t = t
            events += 1
            st = stations[r]
            loop = loops[r]
            if kind == _ENTRY:
                if ended[r] or (payload is None and hand[r] is not None):
                    continue  # (a wake-up for a rank that is running a range, or is over)
                if st.worker is None:
                    continue
                if ports[r].inbox:
                    loop.receive(1 << 30)  # (what came while it ran)
                h = hand[r]
                if payload == "done" and h is not None:
                    a, b = h
                    dur = cum[b] - cum[a]
                    busy += dur
                    tasks_run += b - a
                    loop.ran(((a, b),), (), (), b - a, dur, dur / (b - a))
                    hand[r] = None
                    last_done[r] = t
                sink[0] = 0
                h = loop.need_ids()
                parent = loop.claims_from
                cost = ag.charge(r, t, parent, sink[0])
                ag.send_all(r, t + cost)
                if st.server is not None:
                    ag.after_server(r, t + cost)
                if payload == "done" or asked[r] < 0:
                    asked[r] = t
                if h is not None:
                    hand[r] = h
                    started[r] = t + cost
                    level = st.info.level if parent != r else st.info.level + 1
                    rt = requests.get(level)
                    if rt is None:
                        # (moments only: the simulation reports their means, and a sketch's add
                        # is interpreted Python, four per claim: 32,768 ranks x 20 tasks of 2-5 s
                        # took 73.6 s compiled with them, 63.0 s without)
                        rt = requests[level] = RequestTimes(quantiles=False)
                    rt.add_parts(t + cost - asked[r], cost)
                    asked[r] = -1.0
                    a, b = h
                    ag.push(t + cost + (cum[b] - cum[a]), _ENTRY, r, "done")
                elif st.ended:
                    ended[r] = True
                    ag.loop_over()
                    makespan = max(makespan, t + cost)
                    if st.drain_requested:
                        left.append((t + cost, r))
                    if st.server is None:
                        # Its loop goes on until the job is released (the runtime's does, after the
                        # user's loop): a step now sends its Ending up, unless it went early.
                        ag.over[r] = True
                        self.t = t + cost
                        loop.step()
                        ag.send_all(r, t + cost)
                else:
                    ag.waiters_of(parent, 0).add(r, loop.ticket)
                    if (stations[parent].server is not None and not stations[parent].done_serving
                            and last_tick[parent] < asked[r]):
                        # (the owner notices a waiter on its next look; it need not look again
                        # each time this waiter wakes and finds nothing)
                        ag.schedule_tick(parent, t + cost + c.detect)
            elif kind == _ARRIVE:  # at a rank that serves nobody: heard when its loop next runs
                ports[r].inbox.append(payload)
                if ended[r]:
                    # A rank whose own loop has ended still steps its loop until the job is released
                    # (a recovery asks it what it holds, a plan change wants its answer, the release).
                    loop.step()
                    ag.send_all(r, t)
                elif hand[r] is None:
                    ag.push(t + c.poll, _ENTRY, r)  # a waiting slave polls its messages too
            elif kind == _HANDLE or kind == _HANDLE_LATE:
                ports[r].inbox.append(payload)
                sink[0] = 0
                if ag.over[r]:
                    loop.step()
                else:
                    loop.receive()  # (the planner is told the service time, μ, as the runtime measures it)
                ag.send_all(r, t)
                last_served[r] = t
                ag.after_server(r, t)
                if st.worker is not None and hand[r] is None and not ended[r]:
                    ag.push(t + c.poll, _ENTRY, r)  # (its own loop, if waiting, hears what changed too)
                if kind == _HANDLE:
                    handled.setdefault(st.info.level, [0, 0, 0])[1] += 1
            elif kind == _STEP:  # (on its CPU; the end's: not counted)
                start = busy_until[r] if busy_until[r] > t else t
                self.t = start
                loop.step()
                busy_until[r] = start + c.service_time
                ag.send_all(r, start + c.service_time)
                ag.after_server(r, start + c.service_time)
            elif kind != _TICK:
                fault(kind, r, payload, t)
            else:  # _TICK
                if tick_at[r] != t:
                    continue  # superseded by an earlier one
                tick_at[r] = math.inf
                start = busy_until[r] if busy_until[r] > t else t
                last_tick[r] = start
                self.t = start
                sink[0] = 0
                loop.step()
                cost = c.service_time
                up = loop.refills_from
                if up >= 0:
                    cost += ag.charge(r, start, up, sink[0])
                busy_until[r] = start + cost
                server_busy[r] += cost
                handled.setdefault(st.info.level, [0, 0, 0])[2] += 1
                ag.send_all(r, start + cost)
                ag.after_server(r, start + cost)
        live_master = next((s for s in stations if s.ledger is not None and s.is_master and not dead[s.rank]), None)
        for r in range(n):
            if stations[r].worker is not None and not ended[r] and not dead[r]:
                # (the live master's count: rank 0's stops where it died)
                raise SimStalled(
                    f"the simulation ran out of events at t={self.t:.6g} s with rank {r} still waiting for ids "
                    f"(ticket {loops[r].ticket} on rank {loops[r].claims_from}'s board); the master committed "
                    f"{live_master.ledger.n_committed if live_master and live_master.ledger else '?'} of {self.total}")
        master = next(s for s in stations if s.ledger is not None and s.is_master and not dead[s.rank])
        assert master.ledger is not None
        if not ag.released:
            raise SimStalled(f"the simulation ran out of events at t={self.t:.6g} s with every rank's loop over, "
                             f"but the master (rank {master.rank}) never released the job")
        # The region-masters' claims upward, from the statistics every rank sent up at the end (as a
        # job's report has them: a dead rank's are lost with it).
        for level, rt in sorted(ag.totals.get("requests", {}).items()):
            requests.setdefault(level, RequestTimes(quantiles=False)).merge(rt)
        by_level: dict[int, list[float]] = {}
        for st in stations:
            if st.server is not None or server_busy[st.rank]:
                lv = by_level.setdefault(st.info.level, [0.0, 0.0])
                lv[0] += server_busy[st.rank]
                lv[1] = max(lv[1], server_busy[st.rank])
                handled.setdefault(st.info.level, [0, 0, 0])[0] += 1
        planner = master.planner
        return EngineResult(
            makespan=makespan, busy=busy, tasks_run=tasks_run, events=events, ledger=master.ledger,
            requests=requests, handled=handled, server_busy=by_level, stations=stations,
            decisions=planner.report() if planner is not None else [],
            plans=list(master.plans),
            deaths=deaths, drained=left,
            failures=[as_dict(f) for st in stations if not dead[st.rank] for f in st.recovery.failures],
            last_done=last_done,
        )
