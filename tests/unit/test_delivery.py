"""The Delivery sub-machine alone, driven with random events: no completion sent up is ever forgotten
before its parent said it safe, and none is kept once it was."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from nlevel.config import Config
from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.ranges import RangeSet
from nlevel.roles.delivery import Delivery
from nlevel.roles.events import Send
from nlevel.roles.ledger import Ledger
from nlevel.roles.messages import Report, Safe, TaskFailure
from nlevel.roles.station import Station
from nlevel.testing.network import LocalBoards

from ..conftest import examples

PARENTS = (1, 2, 3)

events = st.lists(st.one_of(
    st.tuples(st.just("report"), st.sampled_from(PARENTS), st.integers(1, 5)),
    st.tuples(st.just("safe"), st.sampled_from(PARENTS), st.integers(0, 8)),
    st.tuples(st.just("death"), st.sampled_from(PARENTS), st.just(0)),
), max_size=60)


def host() -> SimpleNamespace:
    """What Delivery reads of its station: a leaf (no server) under fault tolerance."""
    return SimpleNamespace(ft=True, clock=lambda: 0.0, epoch=0, rank=9, server=None, failed=frozenset(),
                           config=Config(), serve=lambda: [], hierarchy=SimpleNamespace(master=0))


@settings(max_examples=examples(200), deadline=None)
@given(events)
def test_every_completion_is_kept_until_safe_and_dropped_once_safe(evs):
    d = Delivery(host())  # type: ignore[arg-type]
    next_id = 0
    seqs = dict.fromkeys(PARENTS, 0)
    sent: dict[int, list[tuple[int, RangeSet]]] = {p: [] for p in PARENTS}  # parent -> (seq, ids) in order
    safe_ids, again_ids = RangeSet(), RangeSet()
    for kind, parent, n in evs:
        if kind == "report":
            ids = ((next_id, next_id + n),)
            next_id += n
            [out] = d.report_up(Report(ids, tuple((i, 1.0) for i in range(ids[0][0], ids[0][1]))), parent)
            seqs[parent] += 1
            assert isinstance(out, Send) and out.dest == parent and out.msg.seq == seqs[parent]
            sent[parent].append((out.msg.seq, RangeSet(ids)))
        elif kind == "safe":
            assert d.on_safe(parent, n) == []
            for seq, ids in [x for x in sent[parent] if x[0] <= n]:
                safe_ids.add_ranges(ids.ranges())
            sent[parent] = [x for x in sent[parent] if x[0] > n]
        else:
            again, results, _ = d.lost_with(frozenset({parent}))
            unsafe = RangeSet()
            for _, ids in sent[parent]:
                unsafe.add_ranges(ids.ranges())
            assert again.ranges() == unsafe.ranges()  # exactly what was not yet safe goes again
            assert sorted(i for i, _ in results) == [i for a, b in unsafe.ranges() for i in range(a, b)]
            assert parent in d.lost_via or not unsafe
            again_ids.add_ranges(again.ranges())
            sent[parent], seqs[parent] = [], 0  # (a new parent there would count from 1)
        # Kept: exactly what was sent and not yet safe, per parent, results included.
        for p in PARENTS:
            kept = RangeSet()
            for _, ids, results in d.unsafe.get(p, ()):
                kept.add_ranges(ids)
                assert len(results) == sum(b - a for a, b in ids)
            expect = RangeSet()
            for _, ids in sent[p]:
                expect.add_ranges(ids.ranges())
            assert kept.ranges() == expect.ranges()
            assert (d.sent_done or {}).get(p, RangeSet()).ranges() == expect.ranges()
    # Nothing sent is unaccounted for: safe, reported again after a death, or still kept.
    everything = safe_ids.copy()
    everything.add_ranges(again_ids.ranges())
    everything.add_ranges(d.sent().ranges())
    assert everything.ranges() == (((0, next_id),) if next_id else ())


def test_a_parent_is_told_how_far_its_childs_reports_are_safe():
    h = host()
    d = Delivery(h)  # type: ignore[arg-type]
    d.heard(4, 3)
    d.heard(4, 2)  # (an older number never moves it back)
    d.mark_safe()
    h.clock = lambda: 10.0
    assert d.tell_safe() == [Send(4, Safe(3))]
    assert d.tell_safe() == []  # (once per beat, and only news)


def test_ids_given_back_to_the_master_are_kept_until_safe_and_go_again_after_its_death():
    """Ids given back to the master that dies go to the new one (given back to a master that died,
    they were held by nobody and a survivor's stale account could claim them: never run). A give-back
    is numbered as a report, and forgotten once the master says that report is safe; ids given back
    to a region-master are not kept (its reconciler requeues what nobody holds)."""
    h = host()
    d = Delivery(h)  # type: ignore[arg-type]
    [first] = d.report_up(Report(returned=((0, 4),)), 0)  # to the master: numbered
    [second] = d.report_up(Report(((10, 11),), ((10, 1.0),), returned=((4, 6),)), 0)
    d.report_up(Report(returned=((6, 8),)), 2)  # to a region-master: not kept
    assert (first.msg.seq, second.msg.seq) == (1, 2) and 2 not in d.given_back
    d.on_safe(0, 1)
    assert [ids for _, ids in d.given_back[0]] == [((4, 6),)]
    again, results, back = d.lost_with(frozenset({0, 2}))
    assert again.ranges() == ((10, 11),) and len(results) == 1 and back.ranges() == ((4, 6),)
    assert 0 not in d.given_back
    d.report_up(Report(returned=((20, 22),)), 0)
    d.on_safe(0, 1)  # (the new master numbers from 1)
    assert not d.given_back[0]


def test_the_master_does_not_queue_again_an_id_given_back_after_its_commit_or_failure():
    """Given back again after a death, an id may have run and been committed meanwhile, or failed
    for good: not handed out again."""
    st = Station(build(4, Plan(2)), 0, Config(levels=2, fault_tolerance="on"), lambda: 0.0, LocalBoards(), 100,
                 Ledger(100))
    d = st.server
    d.queue = RangeSet()
    d.ledger.commit(((5, 7),), ((5, 1.0), (6, 1.0)))
    d.ledger.fail(TaskFailure(8, "raised", "boom"))
    d.take_orphan(Report(returned=((4, 10),), orphan=True), 0.0)
    assert d.queue.ranges() == ((4, 5), (7, 8), (9, 10))
