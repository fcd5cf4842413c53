"""Region-local recovery, driven over whole hierarchies with no MPI.

Like tests/unit/test_roles.py: a tiny in-process network (FIFO per pair, random order
overall) and random workers, but ranks die at random moments. Each survivor hears of
a death at its own random later moment (as ULFM tells each rank separately); messages
to the dead are lost, and a dead rank's last messages may or may not arrive. Checked
at the end: every id committed exactly once, every survivor released, and every id
that ran twice was at risk: held by a dead rank, in a message to or from it, or (a
dead master) committed but not yet copied to the deputy.
"""

from __future__ import annotations

import functools
import random
from collections import deque

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nlevel.config import Config
from nlevel.model.hierarchy import Role, build
from nlevel.model.plan import Plan
from nlevel.ranges import RangeSet
from nlevel.roles.dispatch import Master
from nlevel.roles.ledger import Ledger
from nlevel.roles.messages import Failed, Grant, Holding, Mirror, Report
from nlevel.roles.recovery import Reconciliation, deputy, expected, reconciler
from nlevel.roles.station import Station
from nlevel.roles.worker import END, WAIT


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _ids_in(msg) -> RangeSet:
    out = RangeSet()
    if isinstance(msg, Report):
        out.add_ranges(msg.done)
        out.add_ranges(msg.returned)
        for tid, _ in msg.failed:
            out.add(tid, tid + 1)
    elif isinstance(msg, Grant):
        out.add_ranges(msg.ids)
    elif isinstance(msg, Holding):
        out.add_ranges(msg.held)
    return out


def own_ids(stn) -> RangeSet:
    """Ids a rank holds itself (not what it granted to live children): lost if it dies."""
    out = RangeSet()
    if stn.worker is not None:
        out.add_ranges(stn.worker.holding().ranges())
    d = stn.dispatcher
    if d is not None:
        out.add_ranges(d.queue.ranges())
        for name in ("up_done", "up_returned"):
            if hasattr(d, name):
                out.add_ranges(getattr(d, name).ranges())
        for tid, _ in getattr(d, "up_failed", []):
            out.add(tid, tid + 1)
    if stn.recon is not None:
        out.add_ranges(stn.recon.held.ranges())
    for _, msg in stn._deferred:  # received, not yet handled: lost with it
        out.add_ranges(_ids_in(msg).ranges())
    return out


def run(size, plan, total, seed, kills, checkpoint_every=50, max_steps=3_000_000, raise_at=()):
    """Run with ``kills``: list of (step, rank). Return (ledger, executed, at_risk, stations, state, dead)."""
    rng = random.Random(seed)
    config = Config(levels=plan.levels, regions=plan.regions, chunk=plan.chunk, fault_tolerance="on",
                    on_task_error="retry", task_retries=1, quarantine=10)
    h = build(size, plan)
    clock = Clock()
    disk = {"ledger": Ledger(total)}  # the checkpoint: a copy of the master's ledger now and then

    def recover() -> Ledger:
        src = disk["ledger"]
        return Ledger(total, src.committed.ranges())

    def final_checkpoint(rank: int) -> None:
        # As the runtime does (Node._checkpoint_final): the master writes the checkpoint
        # with every commit before it releases anyone at the end.
        disk["ledger"] = Ledger(total, stations[rank].dispatcher.ledger.committed.ranges())

    stations = [
        Station(h, r, config, clock, Ledger(total) if r == 0 else None, functools.partial(final_checkpoint, r),
                wall=clock, recover=recover)
        for r in range(size)
    ]
    channels: dict[tuple[int, int], deque] = {}
    executed: dict[int, int] = {}
    at_risk = RangeSet()
    state = {r: "idle" for r in range(size) if stations[r].worker is not None}
    current: dict[int, int | None] = {r: None for r in state}
    dead: set[int] = set()
    kills = sorted(kills)
    notices: dict[int, list[tuple[int, int]]] = {}  # rank -> [(step, dead rank)]

    def post(src, outs):
        for o in outs:
            if o.dest in dead:
                at_risk.add_ranges(_ids_in(o.msg).ranges())
                continue
            if type(o.msg).__name__ == "Kill":
                continue
            channels.setdefault((src, o.dest), deque()).append(o.msg)

    def master_station():
        alive = [s for s in stations if s.rank not in dead and isinstance(s.dispatcher, Master)]
        return alive[0] if alive else None

    step = 0
    for step in range(max_steps):
        clock.t += rng.random() * 1e-3
        now_dying = {v for s_, v in kills if s_ <= step}
        while kills and kills[0][0] <= step:
            _, victim = kills.pop(0)
            if victim in dead or len(dead) + 1 >= size:
                continue
            stn = stations[victim]
            at_risk.add_ranges(own_ids(stn).ranges())
            if stn.mirror is not None:
                # The deputy dies with its copy: if the master is dead or dies before it has
                # sent a new deputy everything, the next master starts from the checkpoint.
                risky = stn.mirror.committed.copy()
                risky.remove_ranges(disk["ledger"].committed.ranges())
                at_risk.add_ranges(risky.ranges())
            if isinstance(stn.dispatcher, Master):
                # Commits the next master will not find: those its deputy has no copy of yet
                # (or, the deputy dying too, those not yet in the checkpoint).
                led = stn.dispatcher.ledger
                risky = led.committed.copy()
                dep = deputy(stn.hierarchy)
                if dep is not None and dep not in dead | now_dying and stations[dep].mirror is not None:
                    risky.remove_ranges(stations[dep].mirror.committed.ranges())
                else:
                    risky.remove_ranges(disk["ledger"].committed.ranges())
                at_risk.add_ranges(risky.ranges())
            dead.add(victim)
            state.pop(victim, None)
            for (src, dest), q in list(channels.items()):
                if victim in (src, dest):
                    for m in q:
                        at_risk.add_ranges(_ids_in(m).ranges())
                    if dest == victim or rng.random() < 0.5:
                        q.clear()
            for r in range(size):
                if r not in dead:
                    notices.setdefault(r, []).append((step + rng.randrange(1, 400), victim))
        for r, lst in notices.items():
            due = [v for s, v in lst if s <= step]
            if due and r not in dead:
                notices[r] = [(s, v) for s, v in lst if s > step]
                post(r, stations[r].deliver(-1, Failed(tuple(due))))
                if state.get(r) == "waiting":
                    state[r] = "idle"  # the runtime's loop asks again after any event
        live = [k for k, q in channels.items() if q]
        runnable = [r for r, s in state.items() if s == "idle"]
        pending_notices = any(lst for r, lst in notices.items() if r not in dead)
        if not live and not runnable and not kills and not pending_notices:
            break
        if not live and not runnable:
            continue
        if live and (rng.random() < 0.5 or not runnable):
            src, dest = rng.choice(live)
            msg = channels[(src, dest)].popleft()
            post(dest, stations[dest].deliver(src, msg))
            if dest in state and state[dest] == "waiting":
                state[dest] = "idle"
        else:
            r = rng.choice(runnable)
            stn = stations[r]
            prev = current[r]
            if prev is not None and prev in raise_at and executed.get(prev, 0) == 1:
                stn.fail_task(f"ValueError: task {prev} (rank {r})")
            else:
                stn.finish(float(prev) if prev is not None else None)
            tid, sends = stn.take()
            post(r, sends)
            if tid >= 0:
                executed[tid] = executed.get(tid, 0) + 1
                current[r] = tid
            elif tid == WAIT:
                current[r] = None
                state[r] = "waiting"
            else:
                assert tid == END
                current[r] = None
                state[r] = "end"
        if rng.random() < 0.05:
            r = rng.randrange(size)
            if r not in dead:
                post(r, stations[r].tick())
        m = master_station()
        if m is not None and step % checkpoint_every == 0 and m.recon is None:
            disk["ledger"] = Ledger(total, m.dispatcher.ledger.committed.ranges())
    else:
        raise AssertionError(f"did not finish; states {state}")
    m = master_station()
    assert m is not None
    return m.dispatcher.ledger, executed, at_risk, stations, state, dead


def check(ledger, executed, at_risk, state, total):
    assert ledger.complete(), f"{ledger.n_committed}/{total} committed; missing {ledger.remaining()}"
    assert all(s == "end" for s in state.values()), state
    twice = {i for i, n in executed.items() if n > 1}
    assert all(i in at_risk for i in twice), f"ran twice without being at risk: {sorted(i for i in twice if i not in at_risk)[:10]}"
    assert set(executed) == set(range(total))


PLANS = [Plan(2), Plan(3, (2,)), Plan(3, (3,)), Plan(4, (2, 2)), Plan(3, (2,), chunk=1)]


def role_ranks(size, plan, role):
    h = build(size, plan)
    return [n.rank for n in h.nodes if n.role is role]


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: f"L{p.levels}{p.regions}c{p.chunk}")
@pytest.mark.parametrize("role", [Role.SLAVE, Role.REGION, Role.MASTER])
def test_one_death_of_each_role(plan, role):
    size = 12
    ranks = role_ranks(size, plan, role)
    if not ranks:
        pytest.skip(f"no {role.value} in this plan")
    for seed in range(6):
        victim = random.Random(seed).choice(ranks)
        ledger, executed, at_risk, stations, state, dead = run(size, plan, 400, seed, [(300 + 97 * seed, victim)])
        check(ledger, executed, at_risk, state, 400)


def test_a_dead_slave_is_handled_by_its_region_alone():
    plan = Plan(3, (2,))
    size = 12
    h = build(size, plan)
    slave = max(n.rank for n in h.nodes if n.role is Role.SLAVE)
    parent = h[slave].parent
    ledger, executed, at_risk, stations, state, dead = run(size, plan, 400, 1, [(400, slave)])
    check(ledger, executed, at_risk, state, 400)
    recorders = [s.rank for s in stations if s.failures]
    assert recorders == [parent]
    rec = stations[parent].failures[0]
    assert rec["rank"] == slave and rec["role"] == "slave" and rec["recovery_ms"] is not None


def test_a_new_master_takes_the_deputys_copy():
    plan = Plan(3, (2,))
    ledger, executed, at_risk, stations, state, dead = run(10, plan, 500, 3, [(600, 0)])
    check(ledger, executed, at_risk, state, 500)
    new = next(s for s in stations if s.rank not in dead and isinstance(s.dispatcher, Master))
    assert new.rank == 1
    rec = [f for f in new.failures if f["rank"] == 0][0]
    assert rec["role"] == "master" and rec["ledger_from"].startswith("deputy's copy")


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(PLANS),
    st.integers(6, 14),
    st.integers(0, 10_000),
    st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 13)), min_size=1, max_size=4),
)
# Found by CI (the oracle then missed the final checkpoint and the deputy's dying copy):
@example(Plan(2), 6, 0, [(860, 1), (869, 0)])  # deputy, then the master right after it released everyone
@example(Plan(2), 6, 0, [(43, 0), (44, 1)])  # master, then its deputy before it took over
@example(Plan(2), 6, 3113, [(12, 0), (13, 1)])
def test_random_deaths_lose_nothing_and_rerun_only_what_was_at_risk(plan, size, seed, kills):
    try:
        build(size, plan)
    except Exception:
        return
    kills = [(s, r % size) for s, r in kills]
    ledger, executed, at_risk, stations, state, dead = run(size, plan, 300, seed, kills)
    check(ledger, executed, at_risk, state, 300)


def test_a_task_that_raises_is_retried_then_recorded_failed():
    plan = Plan(3, (2,))
    ledger, executed, at_risk, stations, state, dead = run(8, plan, 200, 5, [], raise_at={7, 8})
    assert ledger.complete()
    assert executed[7] == 2 and executed[8] == 2


def test_expected_walks_through_dead_children():
    h = build(13, Plan(4, (2, 2)))
    top = h[0].children
    region = next(c for c in top if h[c].children and h[c].level == 1)
    sub = h[region].children
    failed = frozenset({region, sub[0]})
    exp = expected(region, h, failed)
    assert sub[0] not in exp and set(h[sub[0]].children) <= exp
    nh = build(13, Plan(4, (2, 2)), failed)
    for r in exp:
        assert reconciler(r, h, nh) == 0


def test_reconciliation_requeues_only_what_nobody_holds():
    r = Reconciliation()
    r.add_dead(RangeSet([(0, 10)]), {5, 6}, {"rank": 4})
    r.receive(5, RangeSet([(0, 3)]))
    assert not r.complete
    r.member_died(6, {7})
    r.receive(7, RangeSet([(8, 9)]))
    assert r.complete
    assert r.lost(r.held, RangeSet([(3, 4)])) == RangeSet([(4, 8), (9, 10)])


def test_the_report_keeps_a_dead_masters_records():
    """The master's failure records travel with its ledger copy: a successor dying too loses none."""
    plan = Plan(3, (2,))
    ledger, executed, at_risk, stations, state, dead = run(10, plan, 800, 4, [(500, 0), (1500, 1)])
    check(ledger, executed, at_risk, state, 800)
    final = next(s for s in stations if s.rank not in dead and isinstance(s.dispatcher, Master))
    assert final.rank == 2
    assert {0, 1} <= {f["rank"] for f in final.failures}
