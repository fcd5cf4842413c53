"""An in-process farm for tests: every rank's :class:`~nlevel.roles.loop.Loop` over a fake network.

Messages between two ranks stay in order (as MPI's do) but are delivered in a random
order overall; boards are local arrays (:class:`~nlevel.roles.board.LocalMemory`);
every step picks at random what happens next: a message delivered, a rank's tick, a
user loop running its next task, a rank dying, a survivor learning of a death. The
driver records how often each id ran, so tests can check the promises: every id
committed exactly once, and run twice only if it was at risk. Pure Python, no MPI.

Deaths come in three kinds, as on a real machine: killed (every survivor learns of it
later, as ULFM tells them), *vanished* (the process exited: nobody is told; its watchers
find it gone), and *hung* (stopped, or stuck in a task: it is there, and says nothing).
The run is over when every survivor has been released by the master
(:mod:`nlevel.roles.ending`); the master's "report" here is a small dict.
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
from ..roles.events import Died, DrainRequest, Overran, Prefetch, Received, ReleaseJob
from ..roles.ledger import Ledger
from ..roles.loop import Loop
from ..roles.messages import TEAM_DEATH, Message, TaskFailure
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

    def kill(self, rank: int, why: str) -> bool:
        if rank in self.net.dead:
            return rank in self.net.vanished
        self.net.kills.append((rank, why))
        self.net.die(rank)
        return False

    def gone(self, ranks: list[int]) -> list[int]:
        return [r for r in ranks if r in self.net.vanished]

    def declare_dead(self, ranks: tuple[int, ...]) -> None:
        pass  # (sends to a dead rank are dropped by the network already)

    def retire(self, why: str, last: Ledger | None = None) -> None:
        self.net.retired[self.rank] = why

    def heartbeat(self) -> str:
        return ""

    def checkpoint_failed(self) -> str:
        return self.net.disk_error

    def write_checkpoint(self, ledger: Ledger, final: bool) -> str:
        if self.net.disk_error:
            return self.net.disk_error
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

    def release_job(self, ledger: Ledger, stopped: bool, erred: bool) -> ReleaseJob:
        rows, stats = self.net.stations[self.rank].closing.payload
        self.net.report = {"rows": rows, "failures": stats["failures"], "master": self.rank}
        return ReleaseJob(0, self.net.report)

    def given_up_end(self, code: int, given_up: tuple[int, ...]) -> None:
        pass


@dataclass
class _User:
    """The user's loop on one rank, as the runtime's fast path runs it."""

    hand: tuple[int, int] | None = None
    next_id: int = 0
    done_from: int = 0
    leave_after: int | None = None
    ran: int = 0
    state: str = "need"  # need, run, wait, end, left
    until: float = 0.0  # a long task (see Network's ``long``) runs until then
    started: float = 0.0  # ... since then


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
    report: dict[str, Any] | None = None
    retired: set[int] = field(default_factory=set)


def _results(done: tuple[tuple[int, int], ...]) -> tuple[tuple[int, float], ...]:
    """The results the test tasks give: ``2 * id`` for every third id."""
    return tuple((i, float(i) * 2) for a, b in done for i in range(a, b) if i % 3 == 0)


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
        exits: Ids whose task makes its process exit (it vanishes) every time it runs.
        hangs: Ids whose task never returns (the rank's loop is stuck; a server's thread goes on).
        ledger: The master's starting ledger (default: a fresh one with ``completed``).
        pieces: The chance that a user's loop, after a task in the middle of its hand, looks at
            its messages as the runtime's does between two pieces of a hand (``Farm``): it
            reports what ran, steps its loop, and takes what is left of its hand again.
        team_deaths: Id -> how many of its runs lose a process of the team running it (the rank is
            a team's leader: it reports a :data:`~nlevel.roles.messages.TEAM_DEATH` failure; its own
            process lives on).
        ahead: The chance that, before a task of its hand, a rank's runtime claims the next range
            ahead (:class:`~nlevel.roles.events.Prefetch`, as the pulse does while a task runs).
    """

    def __init__(self, size: int, plan: Plan, total: int, seed: int, config: Config | None = None,
                 completed: tuple[tuple[int, int], ...] = (), raises: frozenset[int] = frozenset(),
                 boards: LocalBoards | None = None, exits: frozenset[int] = frozenset(),
                 hangs: frozenset[int] = frozenset(), ledger: Ledger | None = None, pieces: float = 0.0,
                 long: dict[int, float] | None = None, team_deaths: dict[int, int] | None = None,
                 ahead: float = 0.0) -> None:
        self.rng = random.Random(seed)
        self.ahead = ahead
        self.team_deaths = dict(team_deaths or {})
        self.long = long or {}  # task id -> its seconds (the others take 1 ms, reported, and no simulated time)
        self.pieces = pieces
        self.size = size
        self.total = total
        self.config = config or Config(levels=plan.levels, regions=plan.regions, serve_only=plan.serve_only,
                                       chunk=plan.chunk, fault_tolerance="on")
        self.clock = Clock()
        self.boards = boards or LocalBoards()
        h = build(size, plan)
        self.ledger0 = ledger if ledger is not None else Ledger(total, completed)
        self.stations = [Station(h, r, self.config, self.clock, self.boards, total,
                                 self.ledger0 if r == 0 else None, wall=self.clock) for r in range(size)]
        self.ports = [_Port(self, r) for r in range(size)]
        self.loops = [Loop(self.stations[r], self.ports[r], checkpoint_every=50) for r in range(size)]
        for r, loop in enumerate(self.loops):
            loop.running = lambda r=r: self._running(r)  # (its ticks say how long the task in hand has run)
        self.channels: dict[tuple[int, int], deque[Message]] = {}
        self.users = {r: _User() for r in range(size) if self.stations[r].worker is not None}
        self.executed: dict[int, int] = {}
        self.raises = raises
        self.exits = exits
        self.hangs = hangs
        self.dead: set[int] = set()
        self.vanished: set[int] = set()  # dead without anyone being told
        self.hung: set[int] = set()  # alive and silent: never stepped again
        self.stuck: dict[int, tuple[int, float]] = {}  # inside a task that never returns: (id, since); its
        # loop still steps (the runtime's thread, while a task runs) and is told when the task overruns
        self.retired: dict[int, str] = {}  # ranks that left the job (Abandon of themselves)
        self.disk_error = ""
        self.report: dict[str, Any] | None = None
        self.notices: dict[int, list[int]] = {}  # survivor -> dead ranks it has not heard of yet
        # (a resumed job: the checkpoint file it resumed from holds the earlier run's commits)
        self.disk: Ledger | None = _copy(self.ledger0) if self.ledger0.n_committed else None
        self.kills: list[tuple[int, str]] = []
        self.answers: dict[str, dict[str, object]] = {}
        self.requests: list[DrainRequest] = []
        self.stop = False
        self.at_risk = RangeSet()

    def master(self) -> int:
        return min(r for r in range(self.size) if r not in self.dead and r not in self.retired)

    def live(self) -> list[int]:
        """Ranks that take part (not dead, not retired)."""
        return [r for r in range(self.size) if r not in self.dead and r not in self.retired]

    # -- deaths -------------------------------------------------------------------------
    def vanish(self, rank: int) -> None:
        """Rank ``rank``'s process exits now: dead, and nobody is told (its watchers must find out)."""
        self.die(rank, notify=False)
        self.vanished.add(rank)

    def hang(self, rank: int) -> None:
        """Rank ``rank`` stops (SIGSTOP): alive, silent, never stepped again until killed."""
        if rank not in self.dead:
            self.hung.add(rank)

    def die(self, rank: int, notify: bool = True) -> None:
        """Rank ``rank`` dies now: what it held is at risk; every survivor will hear of it, later (``notify``)."""
        if rank in self.dead:
            return
        self.hung.discard(rank)
        self.stuck.pop(rank, None)
        st = self.stations[rank]
        self.at_risk.add_ranges(st.recovery.held_ids.ranges())
        for (src, dest), q in self.channels.items():
            if rank in (src, dest):
                for m in q:
                    self.lost(m)
        # Commits are lost with a rank when no survivor has them (a deputy's copy, another
        # master's ledger) and the checkpoint file does not either.
        for copy in (st.ledger if st.server is not None and hasattr(st.server, "ledger") else None, st.recovery.mirror):
            if copy is None:
                continue
            lost = copy.committed.copy()
            for other in self.stations:
                if other is st or other.rank in self.dead:
                    continue
                for keep in (other.recovery.mirror, other.ledger):
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
        if notify:
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
        silent = self.hung | set(self.retired)
        live = [k for k, q in self.channels.items() if q and k[1] not in silent]
        now = self.clock.t
        runnable = [r for r, u in self.users.items() if u.state in ("need", "run", "wait") and r not in silent
                    and r not in self.stuck and u.until <= now]
        noticed = [r for r, n in self.notices.items() if n and r not in self.dead and r not in silent]
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
        # a tick somewhere (servers first: they are what moves the job when users wait); a rank
        # whose user loop is over keeps ticking until the master releases it (the end)
        stations = self.stations
        limit = self.config.task_timeout
        for r, (tid, since) in list(self.stuck.items()):
            if r not in silent and limit and self.clock.t - since > limit:
                del self.stuck[r]  # (told once; it is killed or given up)
                self.loops[r].handle(Overran(tid, self.clock.t - since))
                return True
        servers = [r for r in range(self.size) if r not in self.dead and r not in silent
                   and not stations[r].done_serving]
        waiting = [r for r, u in self.users.items() if u.state == "wait" and r not in silent and r not in self.stuck]
        ending = [r for r in self.live() if r not in self.hung and stations[r].closing.released is None
                  and (stations[r].ended or stations[r].server is not None) and r not in self.stuck]
        # (the runtime steps a rank's loop while its task runs: one that never returns, or a long one)
        busy = [r for r in self.stuck if r not in silent] + [r for r, u in self.users.items()
                                                              if u.until > now and r not in silent]
        pool = servers + waiting + ending + busy
        master = self.master() if self.live() else None
        if master is not None and master not in self.hung and self.loops[master].release():
            self.loops[master].report_done()  # (its end is instant here)
            return True
        if not pool and not live and not runnable and not noticed:
            return False
        if pool:
            r = rng.choice(pool)
            self.loops[r].step()
        return True

    def _running(self, r: int) -> float:
        """Seconds rank ``r``'s user loop has spent in the task it runs now (a long one, or one that
        never returns; the others take no simulated time)."""
        stuck = self.stuck.get(r)
        if stuck is not None:
            return self.clock.t - stuck[1]
        u = self.users.get(r)
        return self.clock.t - u.started if u is not None and u.until > self.clock.t else 0.0

    def _idle(self, r: int) -> str:
        """The state of rank ``r``'s user loop when it got no ids: it left, it is over, or it waits."""
        st = self.stations[r]
        if st.worker is not None and st.worker.state is State.LEFT:
            return "left"
        return "end" if st.ended else "wait"

    def user_step(self, r: int, u: _User) -> None:
        """The user's loop on rank ``r`` does its next thing: take a range, or run one task of it."""
        loop = self.loops[r]
        if u.hand is None:
            if u.leave_after is not None and u.ran >= u.leave_after:
                loop.leave(())
                u.state = "left"
                return
            hand = loop.need_ids()
            if hand is None:
                u.state = self._idle(r)
                return
            u.hand, u.next_id, u.done_from, u.state = hand, hand[0], hand[0], "run"
            return
        if self.ahead and self.rng.random() < self.ahead:
            loop.handle(Prefetch())
        tid = u.next_id
        if tid in self.long and not u.until:
            u.until = self.clock.t + self.long[tid]  # it runs from now; its loop steps meanwhile
            u.started = self.clock.t
            return
        if u.until > self.clock.t:
            return
        u.until = 0.0
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
        if tid in self.exits:
            self.vanish(r)  # the task ended its process (os._exit from C, say): nobody is told
            return
        if tid in self.hangs:
            self.stuck[r] = (tid, self.clock.t)  # never returns; the rank's loop still steps
            return
        u.ran += 1
        u.next_id = tid + 1
        failed: tuple[TaskFailure, ...] = ()
        if tid in self.raises:
            failed = (TaskFailure(tid, "raised", "ValueError: planned", r),)
        elif self.team_deaths.get(tid, 0) > 0:
            self.team_deaths[tid] -= 1
            failed = (TaskFailure(tid, TEAM_DEATH, "a process of the team died", r),)
        if u.next_id >= u.hand[1] or failed:
            done = tuple((a, b) for a, b in ((u.done_from, tid),) if b > a)
            if not failed:
                done = ((u.done_from, u.next_id),)
            n = (u.next_id - u.done_from)
            loop.ran(done, _results(done), failed, tasks=n, busy=n * 1e-3, longest=1e-3)
            u.done_from = u.next_id
            if u.next_id >= u.hand[1]:
                u.hand = None
                u.state = "need"
        elif self.pieces and self.rng.random() < self.pieces:
            # The end of a piece of the hand: what ran is reported, the loop looks at its messages
            # (a death, a drain, a plan switch may come), and the rest of the hand goes on.
            n = u.next_id - u.done_from
            done = ((u.done_from, u.next_id),)
            loop.ran(done, _results(done), tasks=n, busy=n * 1e-3, longest=1e-3)
            loop.step()
            hand = loop.need_ids()
            if hand is None:
                u.hand, u.state = None, self._idle(r)
                return
            assert hand == (u.next_id, u.hand[1]), f"rank {r}: its hand was {u.hand} at {u.next_id}, then {hand}"
            u.done_from = u.next_id

    def run(self, max_steps: int = 200_000, kills: Sequence[tuple[int, ...]] = (),
            user_step: Callable[[int, _User], None] | None = None) -> Outcome:
        """Step until nothing is left to do; ``kills``: (step, rank) deaths, or (step, rank, kind)
        with kind ``"kill"``, ``"vanish"`` or ``"hang"``.

        Raises:
            AssertionError: when the farm does not finish within ``max_steps`` (a hang).
        """
        pending = sorted(kills)
        for n in range(max_steps):
            while pending and pending[0][0] <= n:
                event = pending.pop(0)
                victim, kind = int(event[1]), str(event[2]) if len(event) > 2 else "kill"
                if len([r for r in self.live() if r not in self.hung]) > 1:
                    {"kill": self.die, "vanish": self.vanish, "hang": self.hang}[kind](victim)
            for r, u in list(self.users.items()):
                if u.state == "wait":
                    # A user loop waiting for ids runs its rank's loop (as the runtime's does) and asks again.
                    u.state = "need"
                    if r not in self.hung and r not in self.stuck and r not in self.dead and self.rng.random() < 0.2:
                        self.loops[r].step()
            if not self.step(user_step):
                break
        else:
            raise AssertionError(f"the in-process farm did not finish in {max_steps} steps: a hang")
        ledger = self.stations[self.master()].ledger
        assert ledger is not None
        return Outcome(ledger, self.executed, self.stations, self.dead, self.at_risk, self.users, self.kills, n,
                       self.report, set(self.retired))
