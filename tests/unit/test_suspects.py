"""Suspect ids (held by a computing rank that died, or past --task-timeout in an earlier run) are
handed out one per range, and :func:`nlevel.roles.suspects.isolate` neither loses nor repeats an id (issue 14)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.ranges import RangeSet
from nlevel.roles.ledger import Ledger
from nlevel.roles.master import Master
from nlevel.roles.server import LEAF, UPPER, Sizing
from nlevel.sim.engine import SimBoards

from ..conftest import examples

H = build(8, Plan(2))


def _master() -> Master:
    weights = {c: H[c].weight for c in H[0].children}
    weights[0] = 1
    m = Master(H, 0, weights, lambda: 0.0, SimBoards((64, 16)), Sizing(), Ledger(1000))
    m.queue = RangeSet()
    return m


def test_a_suspect_inside_a_range_is_cut_out_alone():
    m = _master()
    m.suspects.add(17, 18)
    assert m._isolate(((16, 20),), 10) == ((16, 17), (17, 18), (18, 20))


def test_suspects_across_ranges_and_runs_of_them():
    m = _master()
    m.suspects.add_ranges(((3, 5), (9, 11)))
    assert m._isolate(((0, 4), (4, 10), (10, 12)), 20) == (
        (0, 3), (3, 4), (4, 5), (5, 9), (9, 10), (10, 11), (11, 12))


def test_what_does_not_fit_goes_back_to_the_queue():
    m = _master()
    m.suspects.add(0, 4)
    assert m._isolate(((0, 8),), 3) == ((0, 1), (1, 2), (2, 3))
    assert m.queue.ranges() == ((3, 8),)


@settings(max_examples=examples(200), deadline=None)
@given(ranges=st.lists(st.tuples(st.integers(0, 200), st.integers(1, 20)), min_size=1, max_size=8),
       suspects=st.lists(st.tuples(st.integers(0, 220), st.integers(1, 5)), max_size=6),
       most=st.integers(1, 30))
def test_no_id_is_lost_or_repeated(ranges, suspects, most):
    pieces = RangeSet()
    for a, n in ranges:
        pieces.add(a, a + n)
    given_ranges = pieces.ranges()  # (disjoint, as the queue hands them out)
    m = _master()
    for a, n in suspects:
        m.suspects.add(a, a + n)
    out = m._isolate(given_ranges, most)
    assert 1 <= len(out) <= most
    ids = [i for a, b in out for i in range(a, b)] + list(m.queue)
    assert sorted(ids) == [i for a, b in given_ranges for i in range(a, b)]
    for a, b in out:
        assert b - a == 1 or not m.suspects.overlap(a, b)  # a suspect is alone in its range


def test_suspects_do_not_go_up_in_a_block_while_the_leaf_board_has_claimers():
    """Issue 14: a sub-region does not know what is suspect here; it would hand a suspect out with
    its neighbours. The suspect stays for this server's own leaf board, one per range."""
    h = build(9, Plan(3, (2,)))
    weights = {c: h[c].weight for c in h[0].children}
    weights[0] = 1
    boards = SimBoards((64, 16))
    m = Master(h, 0, weights, lambda: 0.0, boards, Sizing(), Ledger(1000))
    assert m.live[LEAF] and m.live[UPPER]
    m.queue = RangeSet([(0, 1000)])
    m.suspects.add(21, 22)  # (the leaf board takes ids 0-19, one per range; blocks of 4 follow from 20)
    m.publish(0.0)
    blocks = _published(m, UPPER)
    assert blocks and not any(a <= 21 < b for a, b in blocks), blocks
    assert 21 in m.queue  # (for the leaf board's next range)
    everywhere = [r for kind in (LEAF, UPPER) for r in _published(m, kind)] + list(m.queue.ranges())
    assert [i for a, b in sorted(everywhere) for i in range(a, b)] == list(range(1000))  # nothing lost or twice


def test_with_no_leaf_claimer_suspects_still_go_up():
    h = build(9, Plan(3, (2,), serve_only="all"))
    m = Master(h, 0, {5: h[5].weight}, lambda: 0.0, SimBoards((64, 16)), Sizing(), Ledger(20))  # (its slaves gone)
    assert not m.live[LEAF]
    m.queue = RangeSet([(0, 20)])
    m.suspects.add(5, 6)
    m.publish(0.0)
    assert any(a <= 5 < b for a, b in _published(m, UPPER)), _published(m, UPPER)  # (else it would wait for ever)


def _published(m, kind):
    o = m.owners.get(kind)
    return [] if o is None else sorted(o.published())


def test_a_suspect_is_published_flagged_and_its_claimer_sees_it():
    """The flag rides in the slot (board.SUSPECT): the ids and every other range are unchanged."""
    from nlevel.roles.board import SUSPECT, Claimer, pack, unpack

    assert unpack(pack(17, 1, True)) == (17, 18) and pack(17, 1, True) >= SUSPECT > pack((1 << 42) - 1, 1)
    m = _master()
    m.queue = RangeSet([(0, 40)])
    m.suspects.add(17, 18)
    m.publish(0.0)
    mem = m.boards(0, LEAF)
    claimer = Claimer(1, 64)
    got = []
    while True:
        c = claimer.claim(mem)
        if c.status != "ids":
            break
        got.append((c.start, c.stop, c.suspect))
    assert (17, 18, True) in got and all(not s for a, b, s in got if a != 17), got
    assert sorted(i for a, b, _ in got for i in range(a, b)) == sorted(set(range(40)) - set(m.queue))


def test_a_worker_reports_a_suspect_as_soon_as_it_has_run():
    """A finished id waits in the batch up to --report-age; a suspect does not: a death of the
    process after it ran would count against it (three slaves killed 0.2 s apart in the soak
    quarantined an id that had run fine)."""
    from nlevel.roles.board import Claim
    from nlevel.roles.worker import Worker

    class Board:  # (what the parent's board gives: one range per claim)
        def __init__(self, *claims):
            self.claims = list(claims)

        def claim(self, mem):
            return self.claims.pop(0)

    w = Worker(1, 0, 64, report_every=256, report_age=10.0)
    w.claimer = Board(Claim(5, 9, "ids"), Claim(17, 18, "ids", suspect=True))  # (an ordinary range, then a suspect)
    w.refill(object(), 0.0)
    w.ran(((5, 9),), (), (), 4, 0.01, 0.003, 0.1)
    assert not w.report_due(0.2)  # (a batch: it waits)
    w.refill(object(), 0.2)
    assert not w.report_due(0.2)  # (not run yet)
    w.ran(((17, 18),), (), (), 1, 0.003, 0.003, 0.21)
    assert w.report_due(0.21)
    report = w.report(0.21)
    assert list(RangeSet(report.done)) == [5, 6, 7, 8, 17] and not w.report_due(0.3)
