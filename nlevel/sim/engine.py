"""The event engine of :mod:`nlevel.sim`: every rank's :class:`~nlevel.roles.loop.Loop`, in simulated time.

The engine decides *when* each loop step happens and what it costs; the logic is the
roles' own (the same Station, Loop and boards the MPI runtime runs). Events:

* a worker's **runtime entry** (its range ended, or it was woken while waiting): what
  ran is reported (:class:`~nlevel.roles.events.Ran`), the next range claimed
  (:class:`~nlevel.roles.events.NeedIds`): the claim's one-sided operations cost
  ``atomic_time`` each, plus queueing at the board owner's memory (``atomic_service``
  per operation); the range then runs for the sum of its tasks' durations. A slave
  hears its messages (plan changes) only here, as the runtime's do.
* a message's **arrival** at a server: handled in arrival order, ``service_time`` each,
  on the server's own CPU (its thread; its own tasks run beside it);
* a server's **tick**, when something needs one: a claimer found its board empty
  (noticed within ``detect`` seconds), batched completions reached their age, the
  planner's sampling window ended.

A claimer that finds nothing published waits without polling in the simulation: it is
woken ``poll`` seconds after its board changes (the runtime's back-off, on average).
Pure Python + numpy.
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
from ..roles.events import DrainRequest, NeedIds, Ran, Received, Served, Tick
from ..roles.ledger import Ledger
from ..roles.loop import Loop
from ..roles.messages import Message
from ..roles.region import Region
from ..roles.server import LIMBO_GRACE
from ..roles.station import Station
from ..stats import RequestTimes, Summary
from .faults import _DRAIN, _KILL, as_dict, check_faults, fault_handler
from .heap import Event, pop, push
from .waiters import Waiters

__all__ = ["SimCosts", "SimBoards", "EngineResult", "Engine", "SimStalled"]

_ENTRY: Final = 0
_ARRIVE: Final = 1
_HANDLE: Final = 2
_TICK: Final = 3


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


class _Port:
    """The loop's port in the simulation: messages go to the engine's outbox; nothing else happens."""

    def __init__(self, outbox: list[tuple[int, Message]]) -> None:
        self.outbox = outbox

    def send(self, dest: int, msg: Message) -> None:
        self.outbox.append((dest, msg))

    def poll(self) -> None:
        return None

    def kill(self, rank: int, why: str) -> bool:
        raise SimStalled(f"the simulated farm asked to kill rank {rank} ({why}): no process dies in a simulation")

    def gone(self, ranks: list[int]) -> list[int]:
        return []

    def declare_dead(self, ranks: tuple[int, ...]) -> None:
        pass

    def retire(self, why: str, last: Ledger | None = None) -> None:
        raise SimStalled(f"a simulated rank gave itself up ({why}): no task hangs in a simulation")

    def heartbeat(self) -> str:
        return ""

    def checkpoint_failed(self) -> str:
        return ""

    def write_checkpoint(self, ledger: Ledger, final: bool) -> str:
        return ""

    def load_checkpoint(self) -> tuple[None, str]:
        return None, ""

    def answer(self, token: str, outcome: dict[str, object]) -> None:
        pass

    def log(self, text: str) -> None:
        pass

    def requests(self) -> list[DrainRequest]:
        return []

    def stop_requested(self) -> bool:
        return False


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

    def __init__(self, n: int, costs: SimCosts, stations: list[Station], outbox: list[tuple[int, Message]]) -> None:
        self.heap: list[Event] = []
        self.seq = 0
        self.c = costs
        self.stations = stations
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
        stations, busy_until = self.stations, self.busy_until
        arrive = t + c.msg_time
        for dest, msg in self.outbox:
            if stations[dest].server is not None or stations[dest].replanning.unacked:
                start = busy_until[dest] if busy_until[dest] > arrive else arrive
                end = start + c.service_time
                busy_until[dest] = end
                self.server_busy[dest] += c.service_time
                self.push(end, _HANDLE, dest, (src, msg))
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
        d = self.stations[r].server
        for kind in (0, 1):
            ws = self.waiting[kind][r]
            if not ws:
                continue
            o = d.owners.get(kind) if d is not None else None
            if o is None:  # (no board of that kind any more: everyone looks again)
                for w in ws:
                    self.wake(w, t)
                ws.clear()
                continue
            state = (o.flags, o.epoch)
            changed = self.watched[kind][r] != state
            self.watched[kind][r] = state
            if changed:
                for w in ws:
                    self.wake(w, t)
                ws.clear()
                continue
            for w in ws.ready(o.tail, o.unclaimed_slots > 0):
                self.wake(w, t)

    def after_server(self, r: int, t: float) -> None:
        """A server handled something at ``t``: wake who waits on its boards; plan its next tick."""
        st = self.stations[r]
        self.wake_waiters(r, t)
        d = st.server
        if d is None:
            return
        need = math.inf
        if isinstance(d, Region):
            need = d.flush_at()
            if not d.parent_final:
                tk = d.claimer.ticket
                if tk >= 0:  # waiting for its parent to publish that ticket
                    self.waiters_of(d.parent, 1).add(-1 - r, tk)
                    seen = self.ticket_since.get(r)
                    if seen is None or seen[0] != tk:
                        seen = self.ticket_since[r] = (tk, t)
                    p = self.stations[d.parent].server
                    upper = p.owners.get(1) if p is not None else None
                    if upper is not None and upper.tail <= tk and self.last_tick[d.parent] < seen[1]:
                        # (the parent notices a waiter on its next look; one look is enough)
                        self.schedule_tick(d.parent, t + self.c.detect)
                elif d.stock() < d.target():
                    need = min(need, t + self.c.detect)  # (its own next tick refills)
        planner = st.planner
        if planner is not None:
            need = min(need, planner.next_check(t))
        if st.recovery.free:
            need = min(need, t + self.c.detect)  # a new master's free ids go out on its next tick
        if d.queue and any(o.waiting for o in d.owners.values()):
            need = min(need, t + self.c.detect)  # claimers wait and there is something to publish
        if self.faulty and any(o.limbo for o in d.owners.values()):
            need = min(need, t + LIMBO_GRACE + self.c.detect)  # (a dead claimer's ticket: taken back after the grace)
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
        port = _Port(self.outbox)
        ledger = Ledger(self.total)
        clock = self._clock
        self.stations = [Station(hierarchy, r, config, clock, self.boards, self.total, ledger if r == 0 else None,
                                 wall=clock) for r in range(n)]
        self.loops = [Loop(st, port, checkpoint_every=1 << 62, checkpoint_interval=math.inf) for st in self.stations]
        for st in self.stations:
            if st.worker is not None:
                st.worker.claims = None  # (the engine times the claims: their cost is simulated, not measured)
                st.worker.task_times = Summary(quantiles=False)
        self.kills, self.drains, self.notice = check_faults(n, config.ft, kills, drains, notice)

    def _clock(self) -> float:
        return self.t

    def run(self) -> EngineResult:
        """Run to the end.

        Raises:
            SimStalled: when events run out before every rank has ended (a bug, never silent).
        """
        c = self.costs
        n = self.size
        stations, loops, boards = self.stations, self.loops, self.boards
        sink = boards.sink
        cum = self.cum
        outbox = self.outbox
        ag = _Agenda(n, c, stations, outbox)
        heap = ag.heap
        busy_until = ag.busy_until
        last_served = [-math.inf] * n
        tick_at = ag.tick_at
        faulty = ag.faulty = bool(self.kills or self.drains)
        last_tick = ag.last_tick
        inbox: list[list[tuple[int, Message]]] = [[] for _ in range(n)]
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
        fault = fault_handler(self, stations, loops, ag.push, ag.send_all, ag.after_server, dead, ended, hand, busy_until,
                              server_busy, deaths, inbox)
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
                w = st.worker
                if w is None:
                    continue
                for src, msg in inbox[r]:
                    loop.handle(Received(src, msg))
                inbox[r].clear()
                h = hand[r]
                if payload == "done" and h is not None:
                    a, b = h
                    dur = cum[b] - cum[a]
                    busy += dur
                    tasks_run += b - a
                    loop.handle(Ran(((a, b),), (), (), b - a, dur, dur / (b - a)))
                    hand[r] = None
                    last_done[r] = t
                parent = w.parent
                sink[0] = 0
                loop.handle(NeedIds())
                cost = ag.charge(r, t, parent, sink[0])
                ag.send_all(r, t + cost)
                if st.server is not None:
                    ag.after_server(r, t + cost)
                h = st.hand
                if payload == "done" or asked[r] < 0:
                    asked[r] = t
                if h is not None:
                    hand[r] = h
                    started[r] = t + cost
                    level = st.info.level if w.parent != r else st.info.level + 1
                    rt = requests.get(level)
                    if rt is None:
                        rt = requests[level] = RequestTimes()
                    rt.add_parts(t + cost - asked[r], cost)
                    asked[r] = -1.0
                    a, b = h
                    ag.push(t + cost + (cum[b] - cum[a]), _ENTRY, r, "done")
                elif st.ended:
                    ended[r] = True
                    makespan = max(makespan, t + cost)
                    if st.drain_requested:
                        left.append((t + cost, r))
                else:
                    owner = w.parent
                    ag.waiters_of(owner, 0).add(r, w.claimer.ticket)
                    if (stations[owner].server is not None and not stations[owner].done_serving
                            and last_tick[owner] < asked[r]):
                        # (the owner notices a waiter on its next look; it need not look again
                        # each time this waiter wakes and finds nothing)
                        ag.schedule_tick(owner, t + cost + c.detect)
            elif kind == _ARRIVE:  # at a rank that serves nobody: heard when its loop next runs
                if faulty and ended[r]:
                    fault(kind, r, payload, t)
                    continue
                inbox[r].append(payload)
                if hand[r] is None and not ended[r]:
                    ag.push(t + c.poll, _ENTRY, r)  # a waiting slave polls its messages too
            elif kind == _HANDLE:
                src, msg = payload
                sink[0] = 0
                loop.handle(Received(src, msg))
                if st.planner is not None:
                    loop.handle(Served(c.service_time))  # (μ, as the runtime measures it while serving)
                ag.send_all(r, t)
                last_served[r] = t
                ag.after_server(r, t)
                if st.worker is not None and hand[r] is None and not ended[r]:
                    ag.push(t + c.poll, _ENTRY, r)  # (its own loop, if waiting, hears what changed too)
                level = st.info.level
                handled.setdefault(level, [0, 0, 0])[1] += 1
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
                loop.handle(Tick())
                cost = c.service_time
                d = st.server
                if isinstance(d, Region):
                    cost += ag.charge(r, start, d.parent, sink[0])
                busy_until[r] = start + cost
                server_busy[r] += cost
                ag.send_all(r, start + cost)
                ag.after_server(r, start + cost)
                handled.setdefault(st.info.level, [0, 0, 0])[2] += 1
        for r in range(n):
            if stations[r].worker is not None and not ended[r] and not dead[r]:
                w = stations[r].worker
                raise SimStalled(
                    f"the simulation ran out of events at t={self.t:.6g} s with rank {r} still waiting "
                    f"({w.state.value if w else '?'}); committed {stations[0].ledger.n_committed if stations[0].ledger else '?'}"
                    f" of {self.total}")
        for st in stations:
            if isinstance(st.server, Region) and st.server.requests.total.n:
                requests.setdefault(st.info.level, RequestTimes()).merge(st.server.requests)
        by_level: dict[int, list[float]] = {}
        for st in stations:
            if st.server is not None or server_busy[st.rank]:
                lv = by_level.setdefault(st.info.level, [0.0, 0.0])
                lv[0] += server_busy[st.rank]
                lv[1] = max(lv[1], server_busy[st.rank])
                handled.setdefault(st.info.level, [0, 0, 0])[0] += 1
        master = next(s for s in stations if s.ledger is not None and s.is_master and not dead[s.rank])
        assert master.ledger is not None
        return EngineResult(
            makespan=makespan, busy=busy, tasks_run=tasks_run, events=events, ledger=master.ledger,
            requests=requests, handled=handled, server_busy=by_level, stations=stations,
            decisions=master.planner.report() if master.planner is not None else [],
            plans=list(master.plans),
            deaths=deaths, drained=left,
            failures=[as_dict(f) for st in stations if not dead[st.rank] for f in st.recovery.failures],
            last_done=last_done,
        )
