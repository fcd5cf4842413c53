"""The role state machines, driven over whole hierarchies with no MPI.

A tiny in-process network delivers messages in random order (but FIFO per sender and
receiver, as MPI does) while random workers take and finish tasks. Invariants are
checked at the end: every id executed and committed exactly once, results committed
with their ids, every rank released.
"""

from __future__ import annotations

import random
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nlevel.config import Config
from nlevel.errors import ConfigError
from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.roles.dispatch import Master, Region, grant_size
from nlevel.roles.ledger import Ledger
from nlevel.roles.messages import Grant, Report
from nlevel.roles.station import Station
from nlevel.roles.worker import END, WAIT, Worker, auto_chunk


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def simulate(size, plan, total, seed, completed=(), config=None, leave=None, switches=(), max_steps=2_000_000):
    """Run a farm in-process; return (ledger, executions per id, stations, final-callback count).

    ``switches``: (step, plan) pairs; at that step the master switches the job to that plan.
    """
    rng = random.Random(seed)
    config = config or Config(levels=plan.levels, regions=plan.regions, serve_only=plan.serve_only, chunk=plan.chunk)
    switches = sorted(switches, key=lambda s: s[0])
    h = build(size, plan)
    clock = Clock()
    ledger = Ledger(total, completed)
    finals = []
    stations = [
        Station(h, r, config, clock, ledger if r == 0 else None, (lambda: finals.append(ledger.n_committed)) if r == 0 else None)
        for r in range(size)
    ]
    channels: dict[tuple[int, int], deque] = {}
    executed: dict[int, int] = {}
    state = {r: "idle" for r in range(size) if stations[r].worker is not None}
    current: dict[int, int | None] = {r: None for r in state}
    tasks_done = {r: 0 for r in state}

    def post(src, outs):
        for o in outs:
            channels.setdefault((src, o.dest), deque()).append(o.msg)

    for step in range(max_steps):
        clock.t += rng.random() * 1e-3
        while switches and switches[0][0] <= step:
            post(0, stations[0].switch(switches.pop(0)[1]))
        live = [k for k, q in channels.items() if q]
        runnable = [r for r, s in state.items() if s == "idle"]
        if not live and not runnable:
            if not switches:
                break
            continue
        choice = rng.random()
        if live and (choice < 0.5 or not runnable):
            src, dest = rng.choice(live)
            msg = channels[(src, dest)].popleft()
            stn = stations[dest]
            if state.get(dest) == "left" and isinstance(msg, Grant) and stn.dispatcher is None:
                post(dest, stn.on_grant_after_leaving(msg))  # a grant that crossed a slave's leaving
                continue
            post(dest, stn.deliver(src, msg))
            if dest in state and state[dest] == "waiting":
                state[dest] = "idle"
        else:
            r = rng.choice(runnable)
            stn = stations[r]
            tid_prev = current[r]
            if not (leave and r in leave and tasks_done[r] >= leave[r]):
                stn.finish(float(tid_prev) * 2 if tid_prev is not None and tid_prev % 3 == 0 else None)
            if leave and r in leave and tasks_done[r] >= leave[r]:
                # Half the time the user completed the current task before leaving.
                done = tid_prev is not None and rng.random() < 0.5
                if tid_prev is not None and not done:
                    executed[tid_prev] -= 1  # given back: it will run elsewhere
                post(r, stn.leave(done))
                state[r] = "left"
                current[r] = None
                continue
            tid, sends = stn.take()
            post(r, sends)
            if tid >= 0:
                executed[tid] = executed.get(tid, 0) + 1
                current[r] = tid
                tasks_done[r] += 1
            elif tid == WAIT:
                current[r] = None
                state[r] = "waiting"
            else:
                assert tid == END
                current[r] = None
                state[r] = "end"
        if rng.random() < 0.05:
            r = rng.randrange(size)
            post(r, stations[r].tick())
    else:
        raise AssertionError("simulation did not finish")
    # A rank that left with a want outstanding gets its answer later: drain it.
    return ledger, executed, stations, finals, state


def check(ledger, executed, stations, finals, state, total, completed_ids=frozenset()):
    assert ledger.complete(), f"{ledger.n_committed}/{total} committed"
    assert ledger.recomputed == 0
    executed = {i: n for i, n in executed.items() if n}
    assert sorted(executed) == sorted(set(range(total)) - completed_ids)
    assert all(n == 1 for n in executed.values()), "a task ran twice"
    assert all(s in ("end", "left") for s in state.values()), state
    assert all(st.done_serving for st in stations)
    if not any(st.epoch for st in stations):  # after a switch, carried ids finish through new parents
        assert all(st.dispatcher is None or st.dispatcher.unexpected == 0 for st in stations)
    for st in stations:  # the dispatchers' running sums agree with a recount
        d = st.dispatcher
        if d is not None:
            assert d.pending_want == sum(c.want for c in d.pending)
            assert d.want_sum == sum(c.last_want for c in d.children.values() if not c.left)
    if total:  # the final checkpoint comes after the last commit (a world where everyone left has none)
        assert finals in ([total], []), finals
    results = dict(zip(ledger.result_ids, ledger.result_values))
    expected = {i: float(i) * 2 for i in executed if i % 3 == 0}
    assert set(results) <= set(expected) and all(results[i] == expected[i] for i in results)


PLANS = [
    (1, Plan()),
    (2, Plan()),
    (5, Plan()),
    (4, Plan(3, (2,))),
    (7, Plan(3, (2,))),
    (7, Plan(3, (3,))),
    (9, Plan(4, (2, 2))),
    (7, Plan(3, (2,), serve_only="all")),
    (7, Plan(3, (2,), serve_only="master")),
    (6, Plan(chunk=3)),
    (7, Plan(3, (2,), chunk=4)),
]


@pytest.mark.parametrize("size,plan", PLANS)
@pytest.mark.parametrize("seed", range(4))
def test_every_id_exactly_once(size, plan, seed):
    total = 157
    out = simulate(size, plan, total, seed)
    check(*out, total)


@given(
    st.sampled_from(PLANS),
    st.integers(0, 300),
    st.integers(0, 10**6),
    st.sampled_from([
        Config(levels=2),
        Config(levels=2, prefetch=1.0, batch=1),
        Config(levels=2, report_every=1, batch_age=1.0),
        Config(levels=2, max_chunk=8),
    ]),
)
@settings(max_examples=60, deadline=None)
def test_exactly_once_property(plan_case, total, seed, config):
    size, plan = plan_case
    out = simulate(size, plan, total, seed, config=config)
    check(*out, total)


@pytest.mark.parametrize("size,plan", [(5, Plan()), (7, Plan(3, (2,))), (9, Plan(4, (2, 2)))])
def test_resume_skips_committed_ids(size, plan):
    total = 200
    done = [(0, 50), (70, 71), (120, 180)]
    completed_ids = frozenset(i for a, b in done for i in range(a, b))
    out = simulate(size, plan, total, 3, completed=done)
    check(*out, total, completed_ids)
    assert out[0].resumed == len(completed_ids)


@pytest.mark.parametrize("size,plan,leave", [
    (5, Plan(), {1: 3, 3: 0}),
    (7, Plan(3, (2,)), {5: 2, 6: 1}),  # a region's slaves leave; its computing region-master keeps working
    (7, Plan(3, (2,), chunk=4), {1: 5}),
    (4, Plan(3, (2,)), {3: 0}),
    (7, Plan(3, (2,), serve_only="all", chunk=4), {5: 1, 6: 0}),  # a whole region leaves: it becomes gone
    (7, Plan(3, (2,), chunk=4), {4: 2, 5: 1, 6: 0}),  # region-master and its slaves leave
    (7, Plan(3, (2,)), {0: 3}),  # the master's own loop leaves; it keeps serving
    (5, Plan(chunk=2), {1: 21, 3: 22}),  # late leavers: the pool is empty, wants are pending
    (4, Plan(chunk=3), {0: 27, 2: 26}),
])
@pytest.mark.parametrize("seed", range(12))
def test_ranks_leaving_early_give_their_ids_back(size, plan, leave, seed):
    total = 120
    out = simulate(size, plan, total, seed, leave=leave)
    check(*out, total)


def test_master_finishes_only_when_everything_is_committed():
    h = build(3, Plan())
    clock = Clock()
    ledger = Ledger(4)
    master = Station(h, 0, Config(), clock, ledger).dispatcher
    assert isinstance(master, Master)
    # Guided share: ceil(4 ids * weight 1 / (2 * total weight 3)) = 1.
    assert master.on_report(1, Report(want=4))[0].msg.ids == ((0, 1),)
    assert master.on_report(2, Report(want=10))[0].msg.ids == ((1, 2),)
    assert master.on_report(2, Report(done=((1, 2),), want=1))[0].msg.ids == ((2, 3),)
    assert master.on_report(2, Report(done=((2, 3),), want=1))[0].msg.ids == ((3, 4),)
    # Pool empty but rank 1 still holds id 0: the want waits.
    assert master.on_report(2, Report(done=((3, 4),), want=1)) == []
    assert not ledger.complete()
    outs = master.on_report(1, Report(done=((0, 1),), want=1))
    assert sorted(o.dest for o in outs) == [1, 2] and all(o.msg.final and not o.msg.ids for o in outs)
    assert ledger.complete()


def test_region_prefetches_and_forwards_completions_in_batches():
    h = build(7, Plan(3, (2,)))
    clock = Clock()
    region = Station(h, 4, Config(batch=2, batch_age=10.0), clock).dispatcher
    assert isinstance(region, Region)
    outs = region.on_report(5, Report(want=1))
    assert len(outs) == 1 and outs[0].dest == 0 and outs[0].msg.want == region.target() + 1
    outs = region.on_grant(Grant(((0, 6),)))
    assert [(o.dest, o.msg.ids) for o in outs] == [(5, ((0, 1),))]
    assert len(region.queue) == 5
    assert region.on_report(5, Report(done=((0, 1),))) == []  # 1 buffered < batch 2
    outs = region.on_report(6, Report(want=1))
    assert [o.dest for o in outs] == [6]
    outs = region.on_report(6, Report(done=((1, 2),)))
    assert [(o.dest, o.msg.done) for o in outs] == [(0, ((0, 2),))]  # batch of 2 goes up


def test_grant_size_is_guided():
    assert grant_size(10, 1000, 1, 10) == 10
    assert grant_size(100, 40, 1, 10) == 2  # ceil(40 / 20)
    assert grant_size(100, 3, 1, 10) == 1
    assert grant_size(0, 100, 1, 1) == 0
    assert grant_size(5, 0, 1, 1) == 0


def test_auto_chunk_from_task_time():
    assert auto_chunk(1.0, 2e-3, 256) == 1
    assert auto_chunk(1e-6, 2e-3, 256) == 256
    assert auto_chunk(1e-4, 2e-3, 256) == 20


def test_worker_reports_completions_while_waiting():
    w = Worker(parent=0)
    w.asked = True
    w.current = 5
    w.finish(1.0)
    tid, outs = w.next(1.0)
    assert tid == WAIT and outs[0].msg.done == ((5, 6),) and outs[0].msg.want == 0


def test_ledger_keeps_fixed_width_results_once():
    ledger = Ledger(10, width=2)
    assert ledger.commit(((0, 3),), ((0, (1.0, 2.0)), (2, (5.0, 6.0)))) == 3
    assert ledger.commit(((2, 3),), ((2, (9.0, 9.0)),)) == 0  # a recomputed id keeps its first result
    completed, ids, values = ledger.arrays()
    assert ids.tolist() == [0, 2] and values.tolist() == [[1.0, 2.0], [5.0, 6.0]]
    assert ledger.recomputed == 1
    resumed = Ledger(10, completed.tolist(), ids.tolist(), values.ravel().tolist(), width=2)
    assert resumed.arrays()[2].tolist() == values.tolist()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("size,plan", [(5, Plan(chunk=2)), (7, Plan(3, (2,), chunk=3)), (7, Plan(3, (2,), serve_only="all"))])
def test_everyone_leaving_ends_incomplete_without_hanging(size, plan, seed):
    leave = {r: seed % 3 for r in range(size)}
    ledger, executed, stations, finals, state = simulate(size, plan, 120, seed, leave=leave)
    assert all(st.done_serving for st in stations)  # nobody waits for anybody
    assert not ledger.complete() and ledger.recomputed == 0
    assert all(n <= 1 for n in executed.values())
    assert finals == []  # the job did not finish, so no "final" checkpoint was taken


SWITCH_PLANS = [Plan(), Plan(3, (2,)), Plan(3, (3,)), Plan(4, (2, 2)), Plan(3, (2,), chunk=3), Plan(chunk=2)]


@given(
    st.integers(0, 10**6),
    st.sampled_from([9, 10, 13]),
    st.sampled_from(["none", "master"]),
    st.lists(st.tuples(st.integers(0, 3000), st.integers(0, len(SWITCH_PLANS) - 1)), min_size=1, max_size=4),
)
@settings(max_examples=120, deadline=None)
def test_switching_plans_mid_run_loses_and_duplicates_nothing(seed, size, serve_only, switch_specs):
    """The master moves the job between plans at random moments (while ids are queued,
    granted, in flight and being reported): still every id exactly once, nobody stuck."""
    total = 300
    start = Plan(serve_only=serve_only)
    switches = [
        (step, Plan(p.levels, p.regions, p.prefetch, p.chunk, serve_only)) for step, k in switch_specs
        for p in [SWITCH_PLANS[k]]
    ]
    config = Config(levels=0, serve_only=serve_only)  # auto: epochs, carried ids, orphans
    out = simulate(size, start, total, seed, config=config, switches=switches)
    check(*out, total)
    stations = out[2]
    assert len({s.epoch for s in stations}) == 1  # every rank ended on the same plan
    assert not any(s.draining for s in stations)


def test_auto_refuses_serve_only_all():
    with pytest.raises(ConfigError, match="levels=auto supports serve_only none or master"):
        Config(levels=0, serve_only="all")


@given(
    st.lists(st.tuples(st.integers(0, 60), st.integers(1, 6), st.booleans()), max_size=40),
    st.integers(0, 3),
)
@settings(max_examples=200, deadline=None)
def test_ledger_commits_out_of_order_exactly_once(commits, seed):
    # Completions arrive in any order (the master commits whatever finishes first): the
    # ledger counts new and recomputed ids and keeps each id's first result.
    total = 70
    ledger = Ledger(total)
    seen: set[int] = set()
    first: dict[int, float] = {}
    recomputed = 0
    for k, (a, n, with_results) in enumerate(commits):
        b = min(total, a + n)
        results = tuple((i, float(k * 100 + i + seed)) for i in range(a, b)) if with_results else ()
        fresh = set(range(a, b)) - seen
        assert ledger.commit(((a, b),), results) == len(fresh)
        recomputed += (b - a) - len(fresh)
        for i, v in results:
            if i not in seen:
                first[i] = v
        seen |= fresh
        assert ledger.n_committed == len(seen) and ledger.recomputed == recomputed
    assert list(ledger.committed) == sorted(seen)
    assert ledger.complete() == (len(seen) == total)
    assert dict(zip(ledger.result_ids, ledger.result_values)) == first
    assert list(ledger.remaining()) == [i for i in range(total) if i not in seen]
