"""The board protocol (:mod:`nlevel.roles.board`) under interleavings of single atomic operations.

An owner and several claimers run as threads that a seeded scheduler lets through one
memory operation at a time, in random order; a claimer may die between any two of its
operations. Checked: no id goes to two claimers, every id a claimer got is attributed to
it, nothing is lost (every id is attributed or back with the owner), nobody hangs.
"""

from __future__ import annotations

import random
import threading

import pytest

from nlevel.roles import board as B


class Sched:
    """Runs actor threads one memory operation at a time, in a seeded random order."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.cv = threading.Condition()
        self.ready: set = set()
        self.turn = None
        self.alive: set = set()
        self.dead: set = set()

    def step(self, me) -> None:
        with self.cv:
            self.ready.add(me)
            self.cv.notify_all()
            while self.turn != me:
                self.cv.wait()
            self.turn = None
            self.ready.discard(me)

    def run(self, actors, kill=None, max_steps=200_000) -> int:
        for name, fn in actors.items():
            def body(fn=fn, name=name):
                try:
                    fn()
                finally:
                    with self.cv:
                        self.alive.discard(name)
                        self.cv.notify_all()
            self.alive.add(name)
            threading.Thread(target=body, daemon=True).start()
        steps = 0
        while True:
            with self.cv:
                while self.turn is not None or not (self.alive - self.dead) <= self.ready:
                    self.cv.wait(timeout=5)
                if not (self.alive - self.dead):
                    return steps
                live = sorted((self.alive - self.dead) & self.ready, key=str)
                if kill and steps == kill[0] and kill[1] in live:
                    self.dead.add(kill[1])
                    continue
                assert steps < max_steps, "no progress: a hang"
                self.turn = self.rng.choice(live)
                steps += 1
                self.cv.notify_all()


class Stepped:
    """A memory whose every operation waits for the scheduler's turn."""

    def __init__(self, mem, sched, who) -> None:
        self.mem, self.sched, self.who = mem, sched, who

    def fetch_add(self, i, n):
        self.sched.step(self.who)
        return self.mem.fetch_add(i, n)

    def get(self, i):
        self.sched.step(self.who)
        return self.mem.get(i)

    def read(self, i, c):
        self.sched.step(self.who)
        return self.mem.read(i, c)

    def write(self, i, v):
        self.sched.step(self.who)
        return self.mem.write(i, v)

    def put(self, i, v):
        self.sched.step(self.who)
        return self.mem.put(i, v)

    def cas(self, i, e, n):
        self.sched.step(self.who)
        return self.mem.cas(i, e, n)


@pytest.mark.parametrize("seed", range(120))
def test_every_id_goes_to_exactly_one_claimer_and_is_attributed_to_it(seed):
    rng = random.Random(seed)
    slots = rng.choice([2, 3, 4, 8])
    total = rng.randint(1, 60)
    nclaim = rng.randint(1, 4)
    mem = B.LocalMemory(slots)
    sched = Sched(seed)
    owner = B.Owner(slots)
    got: dict[int, list[int]] = {r: [] for r in range(nclaim)}
    attributed: dict[int, int] = {}
    queue = [(i, i + 1) for i in range(total)] if rng.random() < 0.5 else \
        [(i, min(i + 3, total)) for i in range(0, total, 3)]
    clock = [0.0]
    takeback = rng.random() < 0.5

    def drain():
        for r, a, b in owner.claimed:
            for i in range(a, b):
                assert i not in attributed, f"id {i} attributed twice"
                attributed[i] = r
        owner.claimed.clear()
        queue.extend(owner.returned)
        owner.returned.clear()

    def owner_loop():
        m = Stepped(mem, sched, "owner")
        idle = 0
        while True:
            clock[0] += 1
            owner.scan(m, clock[0], full=rng.random() < 0.3)
            drain()
            if rng.random() < 0.2:
                owner.reclaim(m, clock[0] - 2)
                drain()
            if takeback and rng.random() < 0.15:  # (a server moving stock to its other board)
                owner.take_back_unclaimed(m, lower=rng.random() < 0.5)
                drain()
            k = min(len(queue), owner.room(), rng.randint(1, 3))
            if k:
                owner.publish(m, [queue.pop(0) for _ in range(k)])
                drain()
            if not queue and owner.on_board == 0 and not owner.limbo:
                owner.set_flags(m, B.FINAL)
                return
            if not (set(range(nclaim)) - sched.dead):  # every claimer died: take everything back, stop
                owner.close(m, B.FINAL, clock[0])
                drain()
                return
            if not k:
                idle += 1
                if idle > 50:  # the living claimers wait: take back what a dead one fetched
                    owner.reclaim(m, clock[0])
                    drain()
                    idle = 0

    def claimer(r):
        def loop():
            m = Stepped(mem, sched, r)
            c = B.Claimer(r, slots)
            while True:
                res = c.claim(m)
                if res.status == "ids":
                    got[r].extend(range(res.start, res.stop))
                elif res.status == "final":
                    return
        return loop

    actors = {"owner": owner_loop, **{r: claimer(r) for r in range(nclaim)}}
    victim = rng.choice(range(nclaim)) if rng.random() < 0.5 else None
    sched.run(actors, kill=(rng.randint(0, 200), victim) if victim is not None else None)
    owner.scan(mem, 1e9, full=True)  # what was swapped after the owner's last look
    drain()
    taken = [i for r in got for i in got[r]]
    assert len(taken) == len(set(taken)), "an id went to two claimers"
    for r in got:
        for i in got[r]:
            assert attributed.get(i) == r, f"id {i} held by {r} but attributed to {attributed.get(i)}"
    back = {i for a, b in queue for i in range(a, b)}
    assert not (back & set(attributed)), "an id both attributed and back with the owner"
    assert set(attributed) | back == set(range(total)), sorted(set(range(total)) - set(attributed) - back)
    if victim is None or set(range(nclaim)) - sched.dead:
        assert not back


def test_packing_round_trips_and_keeps_ranges_apart_from_markers():
    for start, n in [(0, 1), (5, 1), (2**41, B.MAX_LEN), (123456789, 1000)]:
        v = B.pack(start, n)
        assert v >= 0 and B.unpack(v) == (start, start + n)
    assert B.marker(0) < B.EMPTY and B.marker(10**6) < B.EMPTY


def test_a_claimer_of_another_epoch_gives_its_ticket_up_and_the_owner_takes_it_back():
    mem = B.LocalMemory(4)
    owner = B.Owner(4)
    owner.start(mem, epoch=1)
    stale = B.Claimer(7, 4, epoch=0)
    assert stale.claim(mem).status == "stale"
    owner.publish(mem, [(0, 3)])
    owner.scan(mem, now=0.0)
    assert owner.limbo  # ticket 0 was fetched (by the stale claimer) and never swapped
    owner.reclaim(mem, older_than=0.0)
    assert owner.returned == [(0, 3)] and not owner.limbo
    fresh = B.Claimer(8, 4, epoch=1)
    assert fresh.claim(mem).status == "wait"  # its ticket (1) is not published yet


def test_closing_takes_back_what_is_published_and_tells_claimers():
    mem = B.LocalMemory(8)
    owner = B.Owner(8)
    owner.publish(mem, [(0, 2), (2, 4), (4, 6)])
    c = B.Claimer(1, 8)
    assert c.claim(mem) == B.Claim(0, 2, "ids")
    owner.close(mem, B.CLOSED, now=0.0)
    assert owner.claimed == [(1, 0, 2)] and sorted(owner.returned) == [(2, 4), (4, 6)]
    assert c.claim(mem).status in ("closed", "lost")
    assert B.Claimer(2, 8).claim(mem).status == "closed"


def test_publish_refuses_more_than_there_is_room_for():
    mem = B.LocalMemory(2)
    owner = B.Owner(2)
    owner.publish(mem, [(0, 1), (1, 2)])
    with pytest.raises(ValueError, match="publishing 1 ranges into a board with room for 0"):
        owner.publish(mem, [(2, 3)])


def test_a_waiting_ticket_that_the_ring_lapped_is_attributed_before_its_report():
    """A claimer whose ticket waited while the ring went round takes a later lap's range:
    the owner's next scan must attribute it even though HEAD has not reached that ticket."""
    mem = B.LocalMemory(2)
    owner = B.Owner(2)
    slow = B.Claimer(5, 2)
    assert slow.claim(mem).status == "wait"  # ticket 0, nothing published
    owner.publish(mem, [(0, 1), (1, 2)])  # tickets 0, 1
    owner.scan(mem, 0.0)  # ticket 0 fetched, not swapped: limbo
    owner.reclaim(mem, 0.0)  # taken back (the claimer is slow)
    owner.scan(mem, 0.0)
    owner.publish(mem, [(7, 8)])  # ticket 2: slot 0 again
    got = slow.claim(mem)  # the slow claimer's ticket 0 maps to slot 0
    assert got == B.Claim(7, 8, "ids")
    owner.scan(mem, 1.0)  # HEAD has not moved: the quick look cannot see it ...
    owner.scan(mem, 1.0, full=True)  # ... the full one does
    assert (5, 7, 8) in owner.claimed


def test_closing_attributes_a_claim_that_head_does_not_show():
    """The lapped claimer above, with the board closed before any full scan: its claim must be
    attributed by the close, or the id is in no account once the server retires (a plan switch;
    the claimer then died and nobody ran the id: ``replan_fuzz --deaths`` seed 3436 hung)."""
    mem = B.LocalMemory(2)
    owner = B.Owner(2)
    slow = B.Claimer(5, 2)
    assert slow.claim(mem).status == "wait"
    owner.publish(mem, [(0, 1), (1, 2)])
    owner.scan(mem, 0.0)
    owner.reclaim(mem, 0.0)
    owner.scan(mem, 0.0)
    owner.publish(mem, [(7, 8)])
    assert slow.claim(mem) == B.Claim(7, 8, "ids")
    owner.close(mem, B.CLOSED, now=1.0)
    assert (5, 7, 8) in owner.claimed and (7, 8) not in owner.published()
