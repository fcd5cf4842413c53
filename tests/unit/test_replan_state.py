"""A plan switch moves the master's state whole (issue 35), and the job survives a switch then a
master's death (and its deputy's), every id committed once."""

from __future__ import annotations

import pytest

from nlevel.config import Config
from nlevel.model.hierarchy import Hierarchy, build
from nlevel.model.plan import Plan
from nlevel.roles.ledger import Ledger
from nlevel.roles.master import Master
from nlevel.roles.messages import Regroup, Report
from nlevel.roles.station import Station
from nlevel.testing.network import LocalBoards, Network

from .test_farm_inprocess import check


def test_every_attribute_of_the_master_is_job_or_layout():
    st = Station(build(4, Plan(2)), 0, Config(levels=2, fault_tolerance="on"), lambda: 0.0, LocalBoards(), 100,
                 Ledger(100))
    assert isinstance(st.server, Master)
    names = set(vars(st.server))
    assert not set(Master.JOB) & set(Master.LAYOUT)
    assert names == set(Master.JOB) | set(Master.LAYOUT), (names - set(Master.JOB) - set(Master.LAYOUT),
                                                          set(Master.JOB) | set(Master.LAYOUT) - names)


def test_a_switch_keeps_retry_counts_suspects_and_the_deputys_pending_copy():
    st = Station(build(8, Plan(2)), 0, Config(levels=0, fault_tolerance="on", on_task_error="retry"), lambda: 0.0,
                 LocalBoards(), 100, Ledger(100))
    old = st.server
    old.attempts[7] = 2
    old.suspects.add(9, 10)
    old.mirror_done.add(3, 4)
    old.strangers[5] = __import__("nlevel.ranges", fromlist=["RangeSet"]).RangeSet(((40, 42),))
    st.replanning.switch(Plan(3, (2,)))
    new = st.server
    assert new is not old and new.attempts == {7: 2} and 9 in new.suspects and 3 in new.mirror_done
    assert 40 in new.carried and 41 in new.carried  # (taken by a rank not yet a child: still carried)


@pytest.mark.parametrize("victims", [(0,), (0, 1)], ids=["master", "master-and-deputy"])
@pytest.mark.parametrize("seed", range(4))
def test_a_switch_then_the_masters_death_commits_every_id_once(victims, seed):
    """--levels auto under ULFM takes this path: the plan switches (forced at 30 %), then the master
    (and its deputy, on the same step) die."""
    size, total = 9, 300
    config = Config(levels=0, force_replan="0.3@3x2", fault_tolerance="on", report_every=4)
    net = Network(size, Plan(2), total, seed, config=config)
    orig = net.step
    state = {"killed": False}

    def step(user_step=None):
        if not state["killed"] and net.stations[0].epoch >= 1 and sum(net.executed.values()) >= 150:
            state["killed"] = True
            for v in victims:
                net.die(v)
        return orig(user_step)

    net.step = step
    out = net.run()
    assert state["killed"] and len(out.stations[min(set(range(size)) - out.dead)].plans) >= 2
    check(out, total)


@pytest.mark.parametrize("seed", range(3))
def test_results_sent_up_are_forgotten_once_safe(seed):
    """Issue 35: every rank kept every result it sent up until its parent died (a region-master its
    whole region's, for the whole job). Parents now say which reports are safe (the master once its
    deputy has the commits, a region once its own parent said so): a few remain, never the job's."""
    config = Config(levels=3, regions=(2,), fault_tolerance="on", lease=0.05, report_every=4)
    out = Network(8, Plan(3, (2,)), 3000, seed, config=config).run()
    check(out, 3000)
    for st in out.stations:
        sent = sum(st.delivery.up_seq.values())
        kept = sum(len(q) for q in st.delivery.unsafe.values())
        assert kept <= 8 and (sent < 20 or kept < sent / 5), (st.rank, sent, kept)


def _kill_master_when(net, ready, victims=(0,)):
    """Make ``net`` kill the master (rank 0; ``victims``: these ranks together) at the first step
    after its switch at which ``ready(net)``."""
    orig = net.step
    state = {"killed": False}

    def step(user_step=None):
        if not state["killed"] and net.stations[0].epoch >= 1 and ready(net):
            state["killed"] = True
            for v in victims:
                net.die(v)
        return orig(user_step)

    net.step = step
    return state


def _relayed_to_the_master(net):
    """A report with completions from an older plan, passed on by a rank that is not its writer, is on its way to the master."""
    return any(dest == 0 and src != 0 and any(isinstance(m, Report) and m.orphan and m.done for m in q)
               for (src, dest), q in net.channels.items())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(8))
def test_a_master_dying_with_relayed_orphan_completions_loses_none(seed):
    """Found by the simulator (256 ranks, --levels auto, the master killed 0.1 s after the switch): a
    report written under the old plan reaches its old region-master after the switch, which passed it
    to the master and forgot it; the master died before copying it to the deputy, and the writer, which
    still counted it as on its way to a live rank, told the new master it held it: never committed, the
    job waited forever. Every rank has switched when the master dies here: the new master also asks
    every rank what it holds (ids handed out under the old plan are known to no parent: run twice)."""
    size, total = 13, 600
    config = Config(levels=0, force_replan="0.3@3x2", fault_tolerance="on", report_every=4)
    net = Network(size, Plan(3, (3,)), total, seed, config=config)
    state = _kill_master_when(net, lambda n: all(s.epoch >= 1 for s in n.stations) and _relayed_to_the_master(n))
    out = net.run(max_steps=60_000)
    assert state["killed"]
    check(out, total)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(8))
def test_a_master_dying_before_every_rank_has_its_regroup_leaves_no_rank_behind(seed):
    """The master dies with its Regroups (and orphan reports) still on their way: the survivors it reached
    run the new plan, the others (the new master among them, for some seeds) the old one. The new master
    tells every survivor its plan; a rank ahead of it answers with its own, and the master catches up."""
    size, total = 13, 600
    config = Config(levels=0, force_replan="0.3@3x2", fault_tolerance="on", report_every=4)
    net = Network(size, Plan(3, (3,)), total, seed, config=config)
    state = _kill_master_when(net, _relayed_to_the_master)
    out = net.run(max_steps=60_000)
    assert state["killed"]
    check(out, total)


def _regroups_on_their_way(net):
    """The master's Regroups are on their way: some ranks will switch before they hear of its death, some after."""
    return any(src == 0 and any(isinstance(m, Regroup) for m in q) for (src, _), q in net.channels.items())


# Seeds that lost ids before the fix (fuzzing 200 runs of 4 levels: 31 hung; 60 of 5 levels: 26).
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("size", "plan", "switch", "seed"), [
    (17, Plan(4, (2, 2)), "3x3", 175), (17, Plan(4, (2, 2)), "3x3", 8), (17, Plan(4, (2, 2)), "3x2", 22),
    (33, Plan(5, (2, 2, 2)), "3x2", 1), (33, Plan(5, (2, 2, 2)), "3x2", 4), (33, Plan(5, (2, 2, 2)), "3x2", 15)])
def test_ids_a_switched_rank_gave_back_to_the_dead_master_are_given_back_again(size, plan, switch, seed):
    """Found by fuzzing the tests above over plans: 4 or 5 levels, the master dies with its Regroups
    on their way. A region-master that switched handed its stock back to the master (lost with it);
    its old parent, still on the old plan, told the new master that child held that stock (or held
    it on its own board, a child's claim not yet seen), so the reconciliation requeued none of it:
    never committed, the job waited forever. Ids given back to the master are kept until it says
    they are safe, as completions are, and go to the new master should it die first."""
    config = Config(levels=0, force_replan=f"0.3@{switch}", fault_tolerance="on", report_every=4)
    net = Network(size, plan, 400, seed, config=config)
    state = _kill_master_when(net, _regroups_on_their_way)
    out = net.run(max_steps=60_000)
    assert state["killed"]
    check(out, 400)


@pytest.mark.timeout(120)
def test_an_id_claimed_between_two_answers_runs_once():
    """Found by fuzzing the test above (seed 183 of 400): rank 11, still on the old plan, answered
    the new master, then claimed id 147 from its region-master 9's board; 9 switched (closing the
    board: the id its child's now, not its own) and only then answered. Neither answer named 147:
    it was requeued while 11 ran it, and ran twice. Answers written under an older plan than the
    master's are asked again, once every old board is closed."""
    config = Config(levels=0, force_replan="0.3@3x3", fault_tolerance="on", report_every=4)
    net = Network(17, Plan(4, (2, 2)), 400, 183, config=config)
    state = _kill_master_when(net, _regroups_on_their_way)
    out = net.run(max_steps=60_000)
    assert state["killed"]
    check(out, 400)


@pytest.mark.timeout(120)
def test_ids_given_back_to_the_dead_master_go_to_the_new_master():
    """Found by fuzzing (5 levels, master and deputy killed together, seed 12): ids a switched rank
    gave back to the master that died, given back again to its new parent, arrived after that
    parent had answered the new master, which requeued them too: they ran twice, one copy after
    its rank's Ending (its row in the report missed it). They go to the new master now, ahead of
    the sender's answer."""
    config = Config(levels=0, force_replan="0.3@3x2", fault_tolerance="on", report_every=4)
    net = Network(33, Plan(5, (2, 2, 2)), 400, 12, config=config)
    state = _kill_master_when(net, _relayed_to_the_master, victims=(0, 1))
    out = net.run(max_steps=60_000)
    assert state["killed"]
    check(out, 400)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("size", "plan", "kills", "pieces", "report_every", "seed"), [
    (13, Plan(3, (3,)), [(193, 10)], 0.3, 1, 120),  # the master's own hand, then ids a region gave back
    (16, Plan(4, (2, 2)), [(189, 2), (541, 4), (791, 4), (794, 5)], 0.0, 1, 479),
    (13, Plan(3, (3,)), [(235, 10), (563, 2)], 0.3, 4, 161),
    (9, Plan(3, (2,)), [(178, 1), (351, 1), (427, 1)], 0.0, 1, 842),  # ids given back after the question
])
def test_after_a_switch_a_death_requeues_no_id_that_is_in_hand_or_on_the_board(size, plan, kills, pieces,
                                                                                report_every, seed):
    """A death after a plan switch makes the master ask everyone but itself about its carried ids
    (handed out under the old plan). Its own loop's hand from before the switch was among them,
    and so were ids a region gave back since and the master had published again: requeued, each
    ran twice (found by a random search of two to four deaths around a switch). So were ids given
    back after the question was asked: the master's own again, not in question."""
    config = Config(levels=0, force_replan="0.3@3x2", chunk=16 if pieces else plan.chunk, fault_tolerance="on",
                    report_every=report_every)
    out = Network(size, plan, 300, seed, config=config, pieces=pieces).run(kills=kills, max_steps=80_000)
    check(out, 300)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("size", "plan", "kills", "pieces", "report_every", "switch", "seed"), [
    (16, Plan(4, (2, 2)), [(273, 8), (375, 10), (567, 10), (642, 15)], 0.0, 4, False, 949),
    (13, Plan(3, (3,)), [(282, 0), (393, 12)], 0.3, 4, True, 2172),
])
def test_a_rank_that_answered_a_reconciler_then_died_before_its_new_parent_heard_from_it_loses_nothing(
        size, plan, kills, pieces, report_every, switch, seed):
    """A region-master's death: a survivor below it answers the reconciler (which writes the ids
    into its child's holding, the survivor's new region-master) and tells its new parent, unasked;
    dead before that parent heard it, the parent drops the news with the dead's other messages,
    and only the reconciler's record says the ids are held. Nobody ran them: the job hung (found by
    ``bench/replan_fuzz.py --deaths``)."""
    config = Config(levels=0 if switch else plan.levels, regions=() if switch else plan.regions,
                    force_replan="0.3@3x2" if switch else "", chunk=16 if pieces else plan.chunk,
                    fault_tolerance="on", report_every=report_every)
    out = Network(size, plan, 300, seed, config=config, pieces=pieces).run(kills=kills, max_steps=80_000)
    check(out, 300)


@pytest.mark.timeout(120)
def test_ids_given_back_to_a_master_that_died_and_handed_out_again_since_run_once():
    """A rank gives ids back to the master, which publishes them again and some are claimed; the
    master dies. Not yet safe, the ids go back again to the new master, which queued them while
    their new holders ran them: twice (found by ``bench/replan_fuzz.py --deaths``, seed 666). The
    new master asks every survivor what it holds: what nobody holds runs again, once."""
    plan = Plan(4, (2, 2))
    config = Config(levels=0, force_replan="0.3@3x2", chunk=plan.chunk, fault_tolerance="on", report_every=1)
    out = Network(16, plan, 300, 666, config=config).run(kills=[(444, 9), (512, 0), (830, 10)], max_steps=80_000)
    check(out, 300)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("size", "plan", "kills", "pieces", "report_every", "seed"), [
    (13, Plan(3, (3,)), [(234, 9), (732, 4)], 0.3, 4, 1835),
    (16, Plan(4, (2, 2)), [(281, 9), (369, 12), (373, 4)], 0.0, 4, 2407),
    (16, Plan(4, (2, 2)), [(287, 11), (415, 12), (450, 3), (584, 6)], 0.3, 4, 1180),
    (16, Plan(4, (2, 2)), [(507, 9), (553, 8), (804, 13)], 0.0, 4, 3298),  # the Ack of the switch before last
])
def test_a_switch_acknowledged_to_a_parent_that_had_died_reaches_the_rank_that_took_its_place(
        size, plan, kills, pieces, report_every, seed):
    """A region-master dies; before its children hear of it, the Regroup of a switch reaches them
    and they acknowledge it to the dead. The survivor that leads the region in their place (in its
    own view, their parent) waited for their Acks for ever, and the job never ended (found by
    ``bench/replan_fuzz.py --deaths``). Learning of the death, a child acknowledges again."""
    config = Config(levels=0, force_replan="0.3@3x2", chunk=16 if pieces else plan.chunk, fault_tolerance="on",
                    report_every=report_every)
    out = Network(size, plan, 300, seed, config=config, pieces=pieces).run(kills=kills, max_steps=80_000)
    check(out, 300)


def test_a_child_acknowledges_its_switch_again_to_the_rank_that_took_its_dead_parents_place():
    from nlevel.roles.events import Received, Send
    from nlevel.roles.messages import Ack

    old = build(13, Plan(3, (3,)))
    dead = next(r for r in range(1, 13) if old[r].children)  # (a region-master)
    child = max(old[dead].children)
    st = Station(old, child, Config(levels=3, regions=(3,), fault_tolerance="on"), lambda: 0.0, LocalBoards(), 40)
    outs = st.handle(Received(0, Regroup(1, Plan(2), ())))
    assert [o.dest for o in outs if isinstance(o, Send) and isinstance(o.msg, Ack)] == [dead]
    # (what it keeps per switch is a plan, not the old layout's node per rank: switches are many in a long job)
    assert not any(isinstance(v, Hierarchy) for kept in st.replanning.acked.values() for v in kept)
    outs = st.fail((dead,), "ulfm")
    heir = build(13, Plan(3, (3,)), frozenset({dead}))[child].parent
    assert heir not in (None, 0, dead)
    assert [(o.dest, o.msg.epoch) for o in outs if isinstance(o, Send) and isinstance(o.msg, Ack)] == [(heir, 1)]


@pytest.mark.timeout(120)
def test_a_claim_the_master_sees_only_when_a_switch_closes_its_board_is_carried():
    """A rank waiting on the master's board took an id without moving HEAD, and the switch's close
    looked only as far as HEAD: the id was in no account, its claimer died, and the job waited for
    ever (``bench/replan_fuzz.py --deaths``, seed 3436; test_board has the board's part)."""
    plan = Plan(3, (3,))
    config = Config(levels=0, force_replan="0.3@3x2", chunk=plan.chunk, fault_tolerance="on", report_every=4)
    out = Network(13, plan, 300, 3436, config=config).run(kills=[(328, 12), (334, 12), (437, 5), (894, 8)],
                                                         max_steps=80_000)
    check(out, 300)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("kills", "seed"), [
    ([(395, 12), (711, 5)], 7740),
    ([(304, 12), (483, 14), (488, 4), (637, 15)], 8111),
])
def test_a_region_master_that_switches_while_it_reconciles_a_death_hands_the_question_to_the_master(kills, seed):
    """A region-master reconciling the death of a server below it switched plans before the answers
    came: with no server of that plan it dropped them, and its own answers claimed the ids for ever
    (a hang; ``bench/replan_fuzz.py --deaths``). It now hands the ids in question to the master,
    which asks everyone."""
    plan = Plan(4, (2, 2))
    config = Config(levels=0, force_replan="0.3@3x2", chunk=plan.chunk, fault_tolerance="on", report_every=4)
    out = Network(16, plan, 300, seed, config=config).run(kills=kills, max_steps=80_000)
    check(out, 300)


def test_the_question_of_a_region_master_that_switches_goes_to_the_master():
    from nlevel.roles.events import Received, Send
    from nlevel.roles.messages import InQuestion

    h = build(16, Plan(4, (2, 2)))
    rm = next(r for r in range(1, 16) if h[r].children and any(h[c].children for c in h[r].children if c != r))
    dead = next(c for c in h[rm].children if c != rm and h[c].children)
    st = Station(h, rm, Config(levels=4, regions=(2, 2), fault_tolerance="on"), lambda: 0.0, LocalBoards(), 300)
    st.server.children[dead].held.add(100, 110)
    st.fail((dead,), "ulfm")
    assert st.recovery.recon is not None and st.recovery.recon.expected  # (asked the dead's children)
    outs = st.handle(Received(0, Regroup(1, Plan(2), ())))
    [(dest, msg)] = [(o.dest, o.msg) for o in outs if isinstance(o, Send) and isinstance(o.msg, InQuestion)]
    assert dest == 0 and msg.ids == ((100, 110),)
    # The death's record goes with the ids, still open: the master counts what runs again in it.
    assert [(r.rank, r.held, r.recovered_at) for r in msg.records] == [(dead, 10, None)]
    assert st.recovery.recon is None and not st.recovery.failures


def test_the_master_asks_everyone_about_ids_in_question_and_requeues_what_nobody_holds():
    from nlevel.roles.events import Received, Send
    from nlevel.roles.messages import FailureRecord, Holding, InQuestion

    st = Station(build(4, Plan(2)), 0, Config(levels=2, fault_tolerance="on"), lambda: 0.0, LocalBoards(), 40,
                 Ledger(40))
    d = st.server
    d.queue.remove(0, 40)
    d.children[2].held.add(5, 10)  # (the sender's earlier answer, say: void now)
    d.held_total += 5
    record = FailureRecord(9, "region-master", 1, "ulfm", 3, 0.0, 5)
    outs = st.handle(Received(3, InQuestion(((5, 10),), (record,))))
    asked = {o.dest: o.msg.token for o in outs if isinstance(o, Send) and isinstance(o.msg, Holding) and o.msg.ask}
    assert set(asked) == {1, 2, 3} and d.children[2].held.overlap(5, 10) == 0
    st.handle(Received(1, Holding((), (), token=asked[1], epoch=0)))
    st.handle(Received(2, Holding(((5, 7),), (), token=asked[2], epoch=0)))
    assert not d.queue
    st.handle(Received(3, Holding((), (), token=asked[3], epoch=0)))
    out = d.queue.copy()
    out.add_ranges(d.published().ranges())
    assert out.overlap(5, 7) == 0 and out.overlap(7, 10) == 3
    # The death's record came with the question: closed here, with what ran again.
    assert [(f.rank, f.held, f.requeued) for f in st.recovery.failures] == [(9, 5, 3)]
