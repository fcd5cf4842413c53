"""The pure rules of region-local recovery (:mod:`nlevel.roles.recovery`).

Whole farms with random deaths run in tests/unit/test_farm_inprocess.py.
"""

from __future__ import annotations

from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.ranges import RangeSet
from nlevel.roles.recovery import Reconciliation, deputy, expected, reconciler, successors


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
    r.add_dead(RangeSet([(0, 10)]), {5, 6}, None)
    t5, _ = r.token(5), r.token(6)
    assert r.receive(5, RangeSet([(0, 3)]), t5)
    assert not r.complete
    r.member_died(6, {7})
    assert r.receive(7, RangeSet([(8, 9)]), r.token(7))
    assert r.complete
    assert r.lost(r.held, RangeSet([(3, 4)])) == RangeSet([(4, 8), (9, 10)])


def test_only_the_answer_to_the_latest_ask_counts():
    """A holding written before the ask (or before a later death) may miss ids: it does not count."""
    r = Reconciliation()
    r.add_dead(RangeSet([(0, 10)]), {5}, None)
    first = r.token(5)
    assert not r.receive(5, RangeSet([(0, 10)]))  # unasked (a new parent's copy)
    assert r.receive(5, RangeSet([(0, 4)]), first)
    assert r.complete
    # Another server dies: 5 may have sent completions to it since it answered: asked again.
    assert r.add_dead(RangeSet([(20, 30)]), {5}, None) == {5}
    second = r.token(5)
    assert not r.complete
    assert not r.receive(5, RangeSet([(0, 30)]), first)  # the old answer, arriving late
    assert r.receive(5, RangeSet([(0, 2)]), second)
    assert r.lost(r.held, RangeSet()) == RangeSet([(2, 10), (20, 30)])


def test_answers_written_under_an_older_plan_are_asked_again():
    """Until every old board is closed an id can move between two answers: an answer from an older
    plan than the reconciler's is void, and its writer is expected again."""
    r = Reconciliation(everything=True)
    r.add_dead(RangeSet(), {5, 6, 7}, None)
    assert r.receive(5, RangeSet([(0, 2)]), r.token(5), epoch=0)
    assert r.receive(6, RangeSet([(2, 4)]), r.token(6), epoch=1)
    assert r.receive(7, RangeSet(), r.token(7))  # (said no plan: not judged)
    assert r.complete and r.behind(0) == set()
    assert r.behind(1) == {5}
    assert not r.complete and 5 not in r.got and 6 in r.got
    assert r.receive(5, RangeSet([(0, 3)]), r.token(5), epoch=1)
    assert r.complete and r.behind(1) == set()


def test_the_deputy_is_the_lowest_survivor_after_the_master():
    h = build(8, Plan(3, (2,)))
    assert deputy(h) == 1
    assert deputy(build(8, Plan(3, (2,)), frozenset({0, 1}))) == 3
    assert deputy(build(1, Plan())) is None


def test_the_successors_are_the_ranks_that_would_take_over_in_turn():
    h = build(8, Plan(3, (2,)))
    assert successors(h) == [1, 2]
    assert build(8, Plan(3, (2,)), frozenset({0})).master == successors(h)[0]
    assert build(8, Plan(3, (2,)), frozenset({0, 1})).master == successors(h)[1]
    for dead in ({0}, {0, 1}, {1, 4}):
        after = build(8, Plan(3, (2,)), frozenset(dead))
        assert successors(after)[0] == deputy(after)
    assert successors(build(2, Plan())) == [1] and successors(build(1, Plan())) == []


def test_a_new_master_from_the_checkpoint_alone_keeps_the_failed_ids():
    """Issue 14: merging the file's ledger into the new master's dropped ``/failed`` (they would run again)."""
    from nlevel.roles.ledger import Ledger
    from nlevel.roles.messages import TaskFailure

    on_file = Ledger(10, [(0, 4)], [0, 1, 2, 3], [0.0, 1.0, 2.0, 3.0])
    on_file.fail(TaskFailure(7, "raised", "ValueError: broken", 3, "h", "", 3))
    on_file.fail(TaskFailure(8, "died", "quarantined", -1, "", "", 3))
    new = Ledger(10)
    new.retrying[8] = on_file.failed[8]  # (--retry-failed runs 8 again: not failed in this run)
    assert new.merge(on_file) == 4
    assert sorted(new.failed) == [7] and new.failed[7].error == "ValueError: broken"
    assert new.merge(on_file) == 0 and sorted(new.failed) == [7]  # (idempotent)
