"""An in-process farm for tests: every rank's :class:`~nlevel.roles.loop.Loop` over a fake network.

Messages between two ranks stay in order (as MPI's do) but are delivered in a random
order overall; boards are local arrays (:class:`~nlevel.roles.board.LocalMemory`);
every step picks at random what happens next: a message delivered, a rank's tick, a
user loop running its next task, a rank dying, a survivor learning of a death. The
driver records how often each id ran, so tests can check the promises: every id
committed exactly once, and run twice only if it was at risk. Pure Python, no MPI.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..config import Config
from ..model.hierarchy import build
from ..model.plan import Plan
from ..ranges import RangeSet
from ..roles.board import LocalMemory
from ..roles.events import Died, DrainRequest, Received
from ..roles.ledger import Ledger
from ..roles.loop import Loop
from ..roles.messages import Message, TaskFailure
from ..roles.station import Station
from ..roles.worker import State

__all__ = ["LocalBoards", "Clock", "Network", "Outcome"]


class LocalBoards:
    """Every rank's boards in local memory.

    Args:
        leaf_slots, upper_slots: Ring sizes (small ones exercise the ring going round).
    """

    def __init__(self, leaf_slots: int = 16, upper_slots: int = 8) -> None:
        self._slots = (leaf_slots, upper_slots)
        self._mem: dict[tuple[int, int], LocalMemory] = {}

    def __call__(self, rank: int, kind: int) -> LocalMemory:
        mem = self._mem.get((rank, kind))
        if mem is None:
            mem = self._mem[(rank, kind)] = LocalMemory(self._slots[kind])
        return mem

    def slots(self, kind: int) -> int:
        return self._slots[kind]


class Clock:
    """Simulated seconds, advanced by the driver."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _copy(ledger: Ledger) -> Ledger:
    return Ledger(ledger.total, ledger.committed.ranges(), ledger.result_ids.tolist(), ledger.result_values.tolist(),
                  width=ledger.width)


class _Port:
    def __init__(self, net: Network, rank: int) -> None:
        self.net = net
        self.rank = rank
        self.inbox: deque[tuple[int, Message] | Died] = deque()
        self.logs: list[str] = []

    def send(self, dest: int, msg: Message) -> None:
        if dest in self.net.dead:
            self.net.lost(msg)  # what it carried is lost with the rank it was sent to
        else:
            self.net.channels.setdefault((self.rank, dest), deque()).append(msg)

    def poll(self) -> tuple[int, Message] | Died | None:
        return self.inbox.popleft() if self.inbox else None

    def kill(self, rank: int, why: str) -> None:
        self.net.kills.append((rank, why))
        self.net.die(rank)

    def write_checkpoint(self, ledger: Ledger, final: bool) -> str:
        self.net.disk = _copy(ledger)
        return ""

    def load_checkpoint(self) -> tuple[Ledger | None, str]:
        disk = self.net.disk
        return (_copy(disk), "") if disk else (None, "")

    def answer(self, token: str, outcome: dict[str, object]) -> None:
        self.net.answers[token] = outcome

    def log(self, text: str) -> None:
        self.logs.append(text)

    def requests(self) -> list[DrainRequest]:
        out, self.net.requests = self.net.requests, []
        return out

    def stop_requested(self) -> bool:
        return self.net.stop and self.rank == self.net.master()


@dataclass
class _User:
    """The user's loop on one rank, as the runtime's fast path runs it."""

    hand: tuple[int, int] | None = None
    next_id: int = 0
    done_from: int = 0
    leave_after: int | None = None
    ran: int = 0
    state: str = "need"  # need, run, wait, end, left


@dataclass
class Outcome:
    """What a run of the in-process farm did."""

    ledger: Ledger
    executed: dict[int, int]
    stations: list[Station]
    dead: set[int]
    at_risk: RangeSet
    users: dict[int, Any] = field(default_factory=dict)
    kills: list[tuple[int, str]] = field(default_factory=list)
    steps: int = 0


class Network:
    """A whole farm in one process.

    Args:
        size: Ranks.
        plan: The hierarchy's plan.
        total: Tasks.
        seed: Every random choice comes from it.
        config: Settings (default: the plan's levels and regions, fault tolerance on).
        completed: Ids committed by an earlier run.
        raises: Ids whose task raises every time it runs.
        boards: Board memory (default: small rings).
    """

    def __init__(self, size: int, plan: Plan, total: int, seed: int, config: Config | None = None,
                 completed: tuple[tuple[int, int], ...] = (), raises: frozenset[int] = frozenset(),
                 boards: LocalBoards | None = None) -> None:
        self.rng = random.Random(seed)
        self.size = size
        self.total = total
        self.config = config or Config(levels=plan.levels, regions=plan.regions, serve_only=plan.serve_only,
                                       chunk=plan.chunk, fault_tolerance="on")
        self.clock = Clock()
        self.boards = boards or LocalBoards()
        h = build(size, plan)
        self.ledger0 = Ledger(total, completed)
        self.stations = [Station(h, r, self.config, self.clock, self.boards, total,
                                 self.ledger0 if r == 0 else None, wall=self.clock) for r in range(size)]
        self.ports = [_Port(self, r) for r in range(size)]
        self.loops = [Loop(self.stations[r], self.ports[r], checkpoint_every=50) for r in range(size)]
        self.channels: dict[tuple[int, int], deque[Message]] = {}
        self.users = {r: _User() for r in range(size) if self.stations[r].worker is not None}
        self.executed: dict[int, int] = {}
        self.raises = raises
        self.dead: set[int] = set()
        self.notices: dict[int, list[int]] = {}  # survivor -> dead ranks it has not heard of yet
        self.disk: Ledger | None = None
        self.kills: list[tuple[int, str]] = []
        self.answers: dict[str, dict[str, object]] = {}
        self.requests: list[DrainRequest] = []
        self.stop = False
        self.at_risk = RangeSet()

    def master(self) -> int:
        return min(r for r in range(self.size) if r not in self.dead)

    # -- deaths -------------------------------------------------------------------------
    def die(self, rank: int) -> None:
        """Rank ``rank`` dies now: what it held is at risk; every survivor will hear of it, later."""
        if rank in self.dead:
            return
        st = self.stations[rank]
        self.at_risk.add_ranges(st.holding().ranges())
        for (src, dest), q in self.channels.items():
            if rank in (src, dest):
                for m in q:
                    self.lost(m)
        # Commits are lost with a rank when no survivor has them (a deputy's copy, another
        # master's ledger) and the checkpoint file does not either.
        for copy in (st.ledger if st.server is not None and hasattr(st.server, "ledger") else None, st.mirror):
            if copy is None:
                continue
            lost = copy.committed.copy()
            for other in self.stations:
                if other is st or other.rank in self.dead:
                    continue
                for keep in (other.mirror, other.ledger):
                    if keep is not None and keep is not copy:
                        lost.remove_ranges(keep.committed.ranges())
            if self.disk is not None:
                lost.remove_ranges(self.disk.committed.ranges())
            self.at_risk.add_ranges(lost.ranges())
        self.dead.add(rank)
        self.users.pop(rank, None)
        for (src, dest) in list(self.channels):
            if dest == rank:
                del self.channels[(src, dest)]
        for r in range(self.size):
            if r not in self.dead:
                self.notices.setdefault(r, []).append(rank)

    def lost(self, msg: Message) -> None:
        """A message to or from a dead rank: the ids it carried are at risk."""
        for name in ("done", "returned", "held"):
            self.at_risk.add_ranges(getattr(msg, name, ()))
        for f in getattr(msg, "failed", ()):
            if hasattr(f, "id"):
                self.at_risk.add(f.id, f.id + 1)

    # -- one step -------------------------------------------------------------------------
    def step(self, user_step: Callable[[int, _User], None] | None = None) -> bool:
        """Do one random thing; return False when nothing is left to do."""
        rng = self.rng
        self.clock.t += rng.random() * 1e-3
        live = [k for k, q in self.channels.items() if q]
        runnable = [r for r, u in self.users.items() if u.state in ("need", "run", "wait")]
        noticed = [r for r, n in self.notices.items() if n and r not in self.dead]
        choice = rng.random()
        if noticed and choice < 0.1:
            r = rng.choice(noticed)
            x = self.notices[r].pop(0)
            self.loops[r].handle(Died((x,)))
            return True
        if live and (choice < 0.5 or not runnable):
            src, dest = rng.choice(live)
            msg = self.channels[(src, dest)].popleft()
            self.loops[dest].handle(Received(src, msg))
            return True
        if runnable and choice < 0.9:
            r = rng.choice(runnable)
            (user_step or self.user_step)(r, self.users[r])
            return True
        # a tick somewhere (servers first: they are what moves the job when users wait)
        servers = [r for r in range(self.size) if r not in self.dead and not self.stations[r].done_serving]
        waiting = [r for r, u in self.users.items() if u.state == "wait"]
        pool = servers + waiting
        if not pool and not live and not runnable and not noticed:
            return False
        if pool:
            r = rng.choice(pool)
            self.loops[r].step()
        return True

    def user_step(self, r: int, u: _User) -> None:
        """The user's loop on rank ``r`` does its next thing: take a range, or run one task of it."""
        loop = self.loops[r]
        if u.hand is None:
            if u.leave_after is not None and u.ran >= u.leave_after:
                loop.leave(())
                u.state = "left"
                return
            hand = loop.need_ids()
            st = self.stations[r]
            if hand is None:
                u.state = "end" if st.ended else "wait"
                if st.worker is not None and st.worker.state is State.LEFT:
                    u.state = "left"
                return
            u.hand, u.next_id, u.done_from, u.state = hand, hand[0], hand[0], "run"
            return
        tid = u.next_id
        if u.leave_after is not None and u.ran >= u.leave_after:
            # Leave in the middle of a range: what ran is reported, the rest goes back.
            if tid > u.done_from:
                loop.ran(((u.done_from, tid),), tasks=tid - u.done_from)
            unstarted = ((tid, u.hand[1]),) if tid < u.hand[1] else ()
            u.hand = None
            loop.leave(unstarted)
            u.state = "left"
            return
        self.executed[tid] = self.executed.get(tid, 0) + 1
        u.ran += 1
        u.next_id = tid + 1
        failed: tuple[TaskFailure, ...] = ()
        if tid in self.raises:
            failed = (TaskFailure(tid, "raised", "ValueError: planned", r),)
        if u.next_id >= u.hand[1] or failed:
            done = tuple((a, b) for a, b in ((u.done_from, tid),) if b > a)
            if not failed:
                done = ((u.done_from, u.next_id),)
            results = tuple((i, float(i) * 2) for a, b in done for i in range(a, b) if i % 3 == 0)
            n = (u.next_id - u.done_from)
            loop.ran(done, results, failed, tasks=n, busy=n * 1e-3, longest=1e-3)
            u.done_from = u.next_id
            if u.next_id >= u.hand[1]:
                u.hand = None
                u.state = "need"

    def run(self, max_steps: int = 200_000, kills: Sequence[tuple[int, int]] = (),
            user_step: Callable[[int, _User], None] | None = None) -> Outcome:
        """Step until nothing is left to do; ``kills``: (step, rank) deaths.

        Raises:
            AssertionError: when the farm does not finish within ``max_steps`` (a hang).
        """
        pending = sorted(kills)
        for n in range(max_steps):
            while pending and pending[0][0] <= n:
                _, victim = pending.pop(0)
                if len([r for r in range(self.size) if r not in self.dead]) > 1:
                    self.die(victim)
            for u in self.users.values():
                if u.state == "wait":
                    u.state = "need"
            if not self.step(user_step):
                break
        else:
            raise AssertionError(f"the in-process farm did not finish in {max_steps} steps: a hang")
        ledger = self.stations[self.master()].ledger
        assert ledger is not None
        return Outcome(ledger, self.executed, self.stations, self.dead, self.at_risk, self.users, self.kills, n)
