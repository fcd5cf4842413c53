"""Whole farms in one process (nlevel.testing.network): every rank's Station and Loop, random interleavings.

Checked at the end of every run: every id committed exactly once, results committed with
their ids, every survivor released, and an id ran twice only if it was at risk (held by a
rank that died, or in a message to or from it).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nlevel.config import Config
from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.ranges import RangeSet
from nlevel.testing.network import LocalBoards, Network

from ..conftest import examples

PLANS = [
    (1, Plan(2)),
    (2, Plan(2)),
    (5, Plan(2)),
    (7, Plan(3, (2,))),
    (9, Plan(3, (3,))),
    (16, Plan(4, (2, 2))),
    (6, Plan(2, serve_only="master")),
    (8, Plan(3, (2,), serve_only="all")),
]


def check(out, total, quarantine=3, earlier=frozenset()):
    """Every id committed once (or, after ``quarantine`` deaths, recorded failed); re-runs only of ids at risk.

    ``earlier``: ids an earlier run committed (they never run, and their results are not this run's).
    """
    led = out.ledger
    quarantined = {tid for tid, f in led.failed.items() if f.kind == "died"}
    if quarantined:
        # An id held by `quarantine` processes that died is recorded failed, not run again:
        # possible only when that many ranks died.
        assert len(out.dead) >= quarantine, f"quarantined {sorted(quarantined)} after {len(out.dead)} deaths"
        assert all(led.failed[t].attempts >= quarantine for t in quarantined)
    missing = led.remaining()
    for tid in quarantined:
        missing.remove(tid, tid + 1)
    assert not missing, f"not committed: {missing}"
    assert led.n_committed + len(quarantined) == total
    for tid in range(total):
        n = out.executed.get(tid, 0)
        if tid in earlier:
            assert n == 0, f"id {tid}, committed by an earlier run, ran again"
            continue
        assert n >= 1 or tid in quarantined, f"id {tid} never ran"
        if n > 1:
            assert tid in out.at_risk, f"id {tid} ran {n} times without being at risk"
    for r, u in out.users.items():
        assert u.state in ("end", "left"), f"rank {r} was not released: {u.state}"
    for st in out.stations:
        if st.rank not in out.dead and st.rank not in out.retired:
            assert st.closing.released is not None, f"rank {st.rank} was never released by the master"
    if out.report is not None:  # every surviving rank's row counts what it ran (an Ending sent early still held)
        rows = {row["rank"]: row for row in out.report["rows"]}
        for r, u in out.users.items():
            if r in rows and r not in out.dead:
                assert rows[r]["tasks"] == u.ran, f"rank {r}: its row says {rows[r]['tasks']} tasks, it ran {u.ran}"
    ids = led.result_ids.tolist()
    assert len(ids) == len(set(ids))
    assert sorted(ids) == [i for i in range(total) if i % 3 == 0 and i not in quarantined and i not in earlier]
    assert led.result_values.tolist() == [2.0 * i for i in ids]


@pytest.mark.parametrize("size,plan", PLANS)
@pytest.mark.parametrize("seed", range(4))
def test_every_id_exactly_once(size, plan, seed):
    total = 3 * size + 37
    out = Network(size, plan, total, seed).run()
    check(out, total)


@settings(max_examples=examples(60), deadline=None)
@given(case=st.sampled_from(PLANS), total=st.integers(0, 300), seed=st.integers(0, 10**6),
       chunk=st.sampled_from([0, 1, 3]), slots=st.sampled_from([(4, 2), (16, 8), (64, 16)]),
       ahead=st.sampled_from([0.0, 0.5]))
def test_exactly_once_property(case, total, seed, chunk, slots, ahead):
    """``ahead``: ranks also claim their next range while their hand runs (as the pulse does)."""
    size, plan = case
    config = Config(levels=plan.levels, regions=plan.regions, serve_only=plan.serve_only, chunk=chunk,
                    fault_tolerance="on", report_every=7)
    out = Network(size, plan, total, seed, config=config, boards=LocalBoards(*slots), ahead=ahead).run()
    check(out, total)


@pytest.mark.parametrize("size,plan", PLANS)
def test_resume_skips_committed_ids(size, plan):
    total = 120
    completed = ((0, 40), (50, 55), (90, 120))
    out = Network(size, plan, total, 3, completed=completed).run()
    assert out.ledger.complete()
    ran = set(out.executed)
    assert not ran & (set(range(0, 40)) | set(range(50, 55)) | set(range(90, 120)))


@pytest.mark.parametrize("size,plan", PLANS[1:])
@pytest.mark.parametrize("seed", range(3))
def test_ranks_leaving_early_give_their_ids_back(size, plan, seed):
    total = 200
    net = Network(size, plan, total, seed)
    workers = sorted(net.users)
    for r in workers[1:]:
        net.users[r].leave_after = (seed * 7 + r) % 5
    out = net.run()
    assert out.ledger.complete()
    assert all(n == 1 for n in out.executed.values())


def test_everyone_leaving_ends_incomplete_without_hanging():
    net = Network(5, Plan(2), 100, 1)
    for u in net.users.values():
        u.leave_after = 2
    out = net.run()
    assert not out.ledger.complete()
    assert all(u.state == "left" for u in out.users.values())
    assert all(n == 1 for n in out.executed.values())


def test_a_task_that_raises_is_retried_then_recorded_failed():
    config = Config(levels=2, fault_tolerance="on", on_task_error="retry", task_retries=2)
    out = Network(4, Plan(2), 60, 5, config=config, raises=frozenset({17})).run()
    led = out.ledger
    assert 17 not in led.committed and 17 in led.failed
    assert led.failed[17].kind == "raised" and led.failed[17].attempts == 3
    assert out.executed[17] == 3
    assert len(led.committed) == 59


@pytest.mark.parametrize("ahead", [0.0, 0.5])
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("size,plan,switches", [
    (7, Plan(2), [(30, Plan(3, (2,)))]),
    (9, Plan(3, (2,)), [(20, Plan(2)), (200, Plan(3, (3,)))]),
    (16, Plan(2, serve_only="master"), [(10, Plan(4, (2, 2), serve_only="master"))]),
])
def test_switching_plans_mid_run_loses_and_duplicates_nothing(seed, size, plan, switches, ahead):
    """``ahead``: a switch also finds ranks holding a range claimed ahead on the old board."""
    total = 400
    config = Config(levels=plan.levels, regions=plan.regions, fault_tolerance="on", serve_only=plan.serve_only)
    net = Network(size, plan, total, seed, config=config, ahead=ahead)
    pending = list(switches)
    orig = net.step

    def step(user_step=None):
        while pending and net.stations[0].server is not None and sum(net.executed.values()) >= pending[0][0]:
            net.loops[0].perform(net.stations[0].replanning.switch(pending.pop(0)[1]))
        return orig(user_step)

    net.step = step
    out = net.run()
    check(out, total)
    assert all(n == 1 for n in out.executed.values())
    assert net.stations[0].epoch == len(switches)


KILL_PLANS = [(6, Plan(2)), (9, Plan(3, (2,))), (16, Plan(4, (2, 2)))]


@pytest.mark.parametrize("size,plan", KILL_PLANS)
@pytest.mark.parametrize("role", ["slave", "region-master", "master"])
@pytest.mark.parametrize("seed", range(3))
def test_one_death_of_each_role(size, plan, role, seed):
    h = build(size, plan)
    victims = [n.rank for n in h.nodes if n.role.value == role]
    if not victims:
        pytest.skip(f"no {role} in this plan")
    total = 300
    out = Network(size, plan, total, seed).run(kills=[(40 + seed * 17, victims[seed % len(victims)])])
    check(out, total)


@pytest.mark.parametrize("size,plan", KILL_PLANS)
@pytest.mark.parametrize("seed", range(6))
def test_a_new_master_of_a_resumed_job_hands_out_no_id_an_earlier_run_committed(size, plan, seed):
    """The new master hands out the ids above its predecessor's mark at once: never one the checkpoint has."""
    total = 400
    completed = ((0, 60), (150, 170), (260, 262), (330, 400))
    out = Network(size, plan, total, seed, completed=completed).run(kills=[(30 + seed * 23, 0)])
    check(out, total, earlier=frozenset().union(*(range(a, b) for a, b in completed)))
    assert 0 in out.dead


@pytest.mark.parametrize("size,plan", KILL_PLANS)
@pytest.mark.parametrize("seed", range(3))
def test_the_master_and_its_deputy_killed_on_the_same_step_leave_a_new_master_that_starts_from_the_file(
        size, plan, seed):
    """The README's fault table, "master and deputy die together": the copy of the commits dies with the
    deputy, so the next rank (2) takes over from the checkpoint file; what the file holds never runs again."""
    total = 400
    net = Network(size, plan, total, seed)
    at_death: dict[str, object] = {}
    die = net.die

    def die_and_note(rank: int, notify: bool = True) -> None:
        if not at_death:
            at_death["file"] = net.disk.committed.ranges() if net.disk is not None else ()
            at_death["master"] = net.stations[0].ledger.n_committed
        die(rank, notify)

    net.die = die_and_note  # type: ignore[method-assign]
    loaded = []
    for port in net.ports:
        def load(port=port, load=port.load_checkpoint):
            loaded.append(port.rank)
            return load()
        port.load_checkpoint = load  # type: ignore[method-assign]
    step = 380 + 20 * seed  # (about a third of the way: the file holds a hundred ids or so, the master more)
    out = net.run(kills=[(step, 0), (step, 1)])
    check(out, total)
    assert out.dead == {0, 1} and out.kills == []
    assert loaded == [2]  # (the new master read the file; nobody else did)
    in_file = [i for a, b in at_death["file"] for i in range(a, b)]
    assert len(in_file) > 40, at_death
    assert all(out.executed[i] == 1 for i in in_file)  # (started from the file: nothing it held ran again)


@pytest.mark.parametrize("plan", [Plan(2), Plan(3, (2,))])
@pytest.mark.parametrize("seed", range(3))
def test_the_master_and_its_deputy_hung_together_are_killed_in_turn_not_a_hang(plan, seed):
    """Issue 14: the second watcher, once it has waited a lease for ids, kills the silent master, then the deputy."""
    config = Config(levels=plan.levels, regions=plan.regions, fault_tolerance="on", lease=0.5)
    total = 400
    out = Network(7, plan, total, seed, config=config).run(kills=[(60 + seed * 5, 0, "hang"), (61 + seed * 5, 1, "hang")])
    check(out, total)
    assert out.kills == [(0, "was silent for a lease as the master (hung)"),
                         (1, "was silent for a lease as the master (hung)")]
    assert out.dead == {0, 1}


@pytest.mark.parametrize("seed", range(3))
def test_a_master_hung_after_releasing_everyone_is_killed_by_the_deputy_it_has_not_released(seed):
    """Issue 14 (the soak's last hang): the master stopped between its Releases and its own end."""
    config = Config(levels=2, fault_tolerance="on", lease=0.5)
    total = 200
    net = Network(6, Plan(2), total, seed, config=config)

    def hang_instead() -> list:
        net.hang(0)  # (SIGSTOP while it writes the report: it never sends the deputy's release)
        return []

    net.stations[0].closing.release_deputy = hang_instead  # type: ignore[method-assign]
    out = net.run()
    assert out.kills == [(0, "was silent for a lease as the master (hung)")]
    assert out.ledger.complete() and all(n == 1 for n in out.executed.values())
    assert all(net.stations[r].closing.released is not None for r in net.live())


@pytest.mark.parametrize("ft", ["on", "off"])
@pytest.mark.parametrize("plan", [Plan(2), Plan(3, (2,))])
@pytest.mark.parametrize("seed", range(3))
def test_a_long_task_on_a_live_rank_is_never_taken_for_a_hang(ft, plan, seed):
    """Issue 34: liveness is a heartbeat. Tasks of 6 and 8 leases, among tasks of 1 ms, kill nobody: their
    ranks' loops step while they run (the runtime's pulse), so they beat and answer."""
    config = Config(levels=plan.levels, regions=plan.regions, fault_tolerance=ft, lease=0.25)
    out = Network(7, plan, 200, seed, config=config, long={30: 2.0, 150: 1.5}).run()
    check(out, 200)
    assert out.kills == [] and not out.dead and not out.ledger.failed


@pytest.mark.parametrize("size,plan", KILL_PLANS)
@pytest.mark.parametrize("role", ["slave", "region-master", "master"])
@pytest.mark.parametrize("seed", range(4))
def test_a_range_claimed_ahead_is_neither_lost_nor_run_twice_when_a_rank_dies(size, plan, role, seed):
    """Every rank claims its next range before each task of its hand (the pulse's Prefetch), so a
    death finds ranks holding two ranges: what the dead rank held runs again (at risk), and a new
    parent learns both ranges of every survivor (it hands neither out again)."""
    h = build(size, plan)
    victims = [n.rank for n in h.nodes if n.role.value == role]
    if not victims:
        pytest.skip(f"no {role} in this plan")
    total = 300
    config = Config(levels=plan.levels, regions=plan.regions, chunk=4, fault_tolerance="on")
    net = Network(size, plan, total, seed, config=config, ahead=1.0)
    ahead = RangeSet()  # what the other ranks held claimed ahead as it died
    die = net.die

    def dying(rank, notify=True):
        for other in net.stations:
            if other.rank != rank and other.rank not in net.dead and other.worker is not None:
                ahead.add_ranges(other.worker.queue.ranges())
        die(rank, notify)

    net.die = dying
    out = net.run(kills=[(150 + seed * 17, victims[seed % len(victims)])])
    check(out, total)
    assert not out.kills, f"a live rank was killed as hung: {out.kills}"
    assert ahead, "no survivor held a range claimed ahead when the rank died"


@settings(max_examples=examples(80), deadline=None)
@given(case=st.sampled_from(KILL_PLANS), seed=st.integers(0, 10**6),
       kills=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 15)), max_size=3),
       pieces=st.sampled_from([0.0, 0.3]), ahead=st.sampled_from([0.0, 0.5]))
def test_random_deaths_lose_nothing_and_rerun_only_what_was_at_risk(case, seed, kills, pieces, ahead):
    """``pieces``: user loops also look at their messages in the middle of a hand (as the runtime's do);
    ``ahead``: ranks claim their next range while their hand runs (a death finds two ranges held)."""
    size, plan = case
    kills = [(s, r % size) for s, r in kills]
    total = 250
    # (with pieces, long hands: chunk 16; one-id hands have no middle to look in)
    config = Config(levels=plan.levels, regions=plan.regions, serve_only=plan.serve_only,
                    chunk=16 if pieces else plan.chunk, fault_tolerance="on")
    out = Network(size, plan, total, seed, config=config, pieces=pieces, ahead=ahead).run(kills=kills)
    check(out, total)
    assert not out.kills, f"a live rank was killed as hung: {out.kills}"


def test_ids_given_back_and_handed_out_again_come_back_when_their_holder_dies():
    """After a first death the master records what a child gives back as settled (a survivor's
    older answer may still name it). Handed out again, to a region-master that ran one and died
    before reporting it, it was left settled: the reconciliation took it for nobody's, and the
    job waited forever for ids 42, 44 and 46 (a random search of four deaths)."""
    config = Config(levels=3, regions=(2,), fault_tolerance="on", report_every=1)
    out = Network(9, Plan(3, (2,)), 300, 1505, config=config).run(kills=[(43, 5), (80, 7), (349, 6), (732, 2)],
                                                                   max_steps=80_000)
    check(out, 300)


@pytest.mark.parametrize("size,plan", PLANS)
def test_the_master_hears_every_second_of_task_time(size, plan):
    """The progress line's measured overhead rests on it: every report's busy time reaches the master."""
    total = 5 * size + 11
    out = Network(size, plan, total, 1).run()
    master = out.stations[0].server
    assert master.busy_below == pytest.approx(total * 1e-3)  # (each task reports 1 ms)


@pytest.mark.parametrize("size,force", [(8, "0.3@3x2"), (16, "0.5@4x2x2")])
@pytest.mark.parametrize("seed", range(3))
def test_the_task_time_heard_survives_a_plan_switch(size, force, seed):
    """A switch retires the servers: the master's total and the region-masters' unsent busy time carry over."""
    config = Config(levels=0, force_replan=force, report_every=3)
    out = Network(size, Plan(2), 300, seed, config=config).run()
    st = out.stations[0]
    assert len(st.plans) >= 2 and st.server.busy_below == pytest.approx(300 * 1e-3)


@pytest.mark.parametrize("seed", range(examples(20, least=5)))
def test_a_task_that_kills_its_process_is_quarantined_alone_not_with_its_range(seed):
    """Issue 14: ids held beside a poison task died with it three times and were quarantined with it,
    some without ever running. After a death its ids are handed out one per range, so only an id
    that ran (and whose completion was lost with the process three times) can share its fate."""
    config = Config(levels=2, fault_tolerance="on", chunk=4, lease=0.5)
    total = 200
    out = Network(8, Plan(2), total, seed, config=config, exits=frozenset({17})).run()
    led = out.ledger
    assert 17 in led.failed and led.failed[17].kind == "died"
    never_ran = [tid for tid in led.failed if tid != 17 and not out.executed.get(tid)]
    assert not never_ran, f"quarantined without running: {never_ran} (failed: {sorted(led.failed)})"
    assert led.n_committed + len(led.failed) == total


def _drain_then_switch(net, drain, switches):
    """Step ``net``: the master drains ``drain[1]`` once ``drain[0]`` tasks ran, then switches plans as ``switches``
    say ((tasks run, plan), ...), as ``--levels auto`` would."""
    from nlevel.roles.events import DrainRequest

    pending = [(drain[0], "drain", drain[1])] + [(at, "switch", plan) for at, plan in switches]
    answers = []
    orig = net.step

    def step(user_step=None):
        while pending and sum(net.executed.values()) >= pending[0][0]:
            _, kind, what = pending.pop(0)
            m = net.master()
            if kind == "drain":
                effects = net.stations[m].handle(DrainRequest("op", ranks=what))
                answers.extend(e.outcome for e in effects if type(e).__name__ == "Answer")
                net.loops[m].perform(effects)
            else:
                net.loops[m].perform(net.stations[m].replanning.switch(what))
        return orig(user_step)

    net.step = step
    return answers


def _drained_stay_out(out, drained):
    """In the view of every rank on the master's epoch, the drained ranks compute nothing, serve nobody and
    are held by no server as a child still claiming."""
    master = out.stations[min(r for r in range(len(out.stations)) if r not in out.dead)]
    for st in out.stations:
        if st.rank in out.dead or st.epoch != master.epoch:
            continue
        h = st.hierarchy
        for d in drained - out.dead:
            node = h[d]
            assert not node.computes, (st.rank, node)
            if d != h.master:  # (a drained master serves only)
                assert node.role.value == "drained" and node.parent == h.master, (st.rank, node)
                assert not node.children and node.weight == 0, (st.rank, node)
            child = st.server.children.get(d) if st.server is not None else None
            assert child is None or child.left, f"rank {st.rank} counts drained rank {d} as a child still claiming"
        if st.rank in drained and st.rank != h.master:
            assert st.server is None, f"drained rank {st.rank} serves again"


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ft", ["on", "off"])
@pytest.mark.parametrize("pieces", [0.0, 0.4])
@pytest.mark.parametrize("size,plan,drained,switches", [
    (9, Plan(3, (2,)), {3, 5}, [(60, Plan(2)), (200, Plan(3, (3,)))]),   # a slave and a region-master
    (16, Plan(4, (2, 2)), {8, 13}, [(80, Plan(2)), (250, Plan(4, (2, 2)))]),
    (7, Plan(2), {0, 6}, [(50, Plan(3, (2,)))]),                         # the master drains itself
])
def test_drained_ranks_stay_out_across_plan_switches(seed, ft, pieces, size, plan, drained, switches):
    """Issue 14: a switch laid the new plan out over every live rank, so a drained rank (gone, or leaving)
    was a computing child or a region-master again, counted and waited for as one. With ``pieces``
    the drain and the switches also find user loops in the middle of a hand (they look between
    two pieces of it): a drained rank gives back what it had not started."""
    total = 400
    config = Config(levels=plan.levels, regions=plan.regions, fault_tolerance=ft, chunk=16 if pieces else 0)
    net = Network(size, plan, total, seed, config=config, pieces=pieces, ahead=0.5 if seed % 2 else 0.0)
    answers = _drain_then_switch(net, (15, tuple(sorted(drained))), switches)
    out = net.run()
    assert answers == [{"result": {"ranks": sorted(drained)}}]
    check(out, total)
    assert all(n == 1 for n in out.executed.values())
    assert out.stations[0].epoch == len(switches)
    _drained_stay_out(out, drained)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("victim", [0, 4, 7])
def test_drained_ranks_stay_out_when_a_death_follows_a_switch(seed, victim):
    """The layout after a death is built from the epoch's plan and the ranks it left out, the same on every rank."""
    size, total = 9, 400
    config = Config(levels=3, regions=(2,), fault_tolerance="on")
    net = Network(size, Plan(3, (2,)), total, seed, config=config)
    _drain_then_switch(net, (15, (3, 5)), [(60, Plan(3, (3,)))])
    orig = net.step
    state = {"killed": False}

    def step(user_step=None):
        if not state["killed"] and net.stations[0].epoch == 1 and sum(net.executed.values()) >= 120:
            state["killed"] = True
            net.die(victim)
        return orig(user_step)

    net.step = step
    out = net.run()
    assert state["killed"]
    check(out, total)
    _drained_stay_out(out, {3, 5})


def test_a_worker_leaving_between_two_pieces_of_its_hand_gives_back_the_rest():
    """The runtime hands a range to the user's loop in pieces and looks at messages between them:
    a drain found there makes the rank leave with part of its hand not started."""
    from nlevel.roles.worker import Worker

    w = Worker(rank=1, parent=0, slots=4)
    w.hand = (10, 20)
    w.ran(((10, 13),), (), (), 3, 0.003, 0.001, now=0.0)
    assert w.hand == (13, 20)
    report = w.leave((), now=1.0)
    assert report.done == ((10, 13),) and report.returned == ((13, 20),) and report.leaving
    assert w.hand is None


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ft", ["on", "off"])
def test_a_drain_between_two_pieces_of_a_hand_loses_and_reruns_nothing(seed, ft):
    """Long hands (chunk 16) looked at between pieces: the drained ranks leave in the middle of one."""
    total = 400
    config = Config(levels=2, fault_tolerance=ft, chunk=16)
    net = Network(6, Plan(2, chunk=16), total, seed, config=config, pieces=0.5)
    answers = _drain_then_switch(net, (40, (2, 4)), [])
    out = net.run()
    assert answers == [{"result": {"ranks": [2, 4]}}]
    check(out, total)
    assert all(n == 1 for n in out.executed.values())
    assert out.users[2].state == out.users[4].state == "left"
