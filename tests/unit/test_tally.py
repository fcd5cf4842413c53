"""Counting toward quarantine at any scale (issue 34): counts kept as ranges, never switched off."""

from __future__ import annotations

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from nlevel.config import Config
from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.ranges import RangeSet, Tally
from nlevel.roles.ledger import Ledger
from nlevel.roles.messages import Mirror
from nlevel.roles.station import Station
from nlevel.testing.network import LocalBoards

from ..conftest import examples

ranges = st.lists(st.tuples(st.integers(0, 60), st.integers(1, 12)).map(lambda t: (t[0], t[0] + t[1])),
                  min_size=1, max_size=4)


@settings(max_examples=examples(200), deadline=None)
@given(adds=st.lists(ranges, max_size=8), other=st.lists(ranges, max_size=4), gone=ranges)
def test_a_tally_counts_like_a_dict(adds, other, gone):
    t, model = Tally(), {}
    for rs in adds:
        ids = RangeSet(rs)
        t.add(ids.ranges())
        for i in ids:
            model[i] = model.get(i, 0) + 1
    assert {i: t.count(i) for i in range(80)} == {i: model.get(i, 0) for i in range(80)}
    for n in (1, 2, 3):
        assert set(t.at_least(n)) == {i for i, k in model.items() if k >= n}
    u, um = Tally(), {}
    for rs in other:
        ids = RangeSet(rs)
        u.add(ids.ranges())
        for i in ids:
            um[i] = um.get(i, 0) + 1
    t.raise_to(Tally(u.ranges()))
    assert {i: t.count(i) for i in range(80)} == {i: max(model.get(i, 0), um.get(i, 0)) for i in range(80)}
    t.forget(RangeSet(gone).ranges())
    assert all(t.count(i) == 0 for i in RangeSet(gone))


def _master(total: int) -> Station:
    return Station(build(8, Plan(2)), 0, Config(levels=2, fault_tolerance="on", quarantine=3), lambda: 0.0,
                   LocalBoards(), total, Ledger(total))


def test_a_poison_task_at_id_250_million_of_a_billion_is_quarantined_after_three_deaths():
    """The ranges a dying slave held (its hand and queue) count a death each; the suspect then goes out
    alone, so its neighbours are not quarantined with it. No count is skipped however large the job."""
    st = _master(10**9)
    d = st.server
    poison = 250_000_000
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    held = [(poison - 100, poison + 156), (poison, poison + 1), (poison, poison + 1)]
    for k, (a, b) in enumerate(held):
        n, quarantined = d.requeue_lost(RangeSet(((a, b),)), rank=k + 1, host="h", how="killed")
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert quarantined == [poison] and d.deaths.count(poison) == 3 and d.deaths.count(poison - 1) == 1
    assert list(st.ledger.failed) == [poison] and st.ledger.failed[poison].attempts == 3
    assert grown < 200_000, grown  # (ranges, not ids)


def test_a_region_master_dying_with_a_huge_stock_quarantines_nothing_by_itself():
    """A dead server's stock never ran: its deaths count, but only a death of a rank that ran an id
    (in flight) quarantines it; ids at the limit go out alone (suspects) meanwhile."""
    st = _master(10**9)
    d = st.server
    stock = RangeSet(((10**8, 2 * 10**8),))
    for _ in range(3):
        _, quarantined = d.requeue_lost(stock.copy(), rank=4, how="killed", in_flight=False)
        assert quarantined == []
    assert d.deaths.count(150_000_000) == 3 and 150_000_000 in d.suspects
    assert len(d.deaths.levels) == 3 and all(level.n_ranges == 1 for level in d.deaths.levels)
    _, quarantined = d.requeue_lost(RangeSet(((150_000_000, 150_000_001),)), rank=5, how="killed")
    assert quarantined == [150_000_000]


def test_the_deputy_copies_every_count_however_many_ids():
    st = _master(10**9)
    st.server.deaths.add(((0, 10**8),))
    st.server.deaths.add(((5, 10),))
    [send] = st.recovery._mirror_full(1)
    assert isinstance(send.msg, Mirror) and Tally(send.msg.deaths).ranges() == st.server.deaths.ranges()
    deputy = Station(build(8, Plan(2)), 1, Config(levels=2, fault_tolerance="on"), lambda: 0.0, LocalBoards(), 10**9)
    from nlevel.roles.events import Received

    deputy.handle(Received(0, send.msg))
    assert deputy.recovery.mirror_deaths.ranges() == st.server.deaths.ranges()


def test_a_poison_task_in_a_billion_id_job_is_quarantined_by_the_farm():
    """The whole path on the real state machines (in-process network, 8 ranks, ULFM on): a job of
    10^9 ids whose checkpoint holds all but 400 around id 250,000,000, which kills every process that
    runs it. After --quarantine (3) deaths it is recorded failed; every other id is committed once."""
    from nlevel.model.plan import Plan as _Plan
    from nlevel.testing.network import Network

    poison = 250_000_000
    total = 10**9
    completed = ((0, poison - 200), (poison + 200, total))
    config = Config(levels=2, fault_tolerance="on", chunk=4, quarantine=3)
    out = Network(8, _Plan(2), total, 3, config=config, completed=completed, exits=frozenset({poison})).run()
    led = out.ledger
    assert list(led.failed) == [poison] and led.failed[poison].kind == "died" and led.failed[poison].attempts == 3
    assert led.n_committed == total - 1 and len(out.dead) == 3
    twice = [tid for tid, n in out.executed.items() if n > 1 and tid != poison]
    assert all(tid in out.at_risk for tid in twice), twice  # (run again only if held by a rank that died)
