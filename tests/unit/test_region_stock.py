"""How servers size and place stock in a deep tree, and when a region's last completions go up.

Each rule here was a measured loss in the simulator (``python -m nlevel.sim``, 8,192 ranks,
4 levels, 2-5 s tasks: 25 % overhead before, 5 % after); these tests pin the rules on a small
tree: 64 ranks, 4 levels, 4 x 4 regions (the master serves three level-1 regions of 16 ranks
and three leaf regions of 4 of its own subtree on one upper board).
"""

from __future__ import annotations

import math

from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.roles.board import Claim, Claimer
from nlevel.roles.events import Send
from nlevel.roles.master import Master
from nlevel.roles.messages import Ending, Report
from nlevel.roles.region import Region
from nlevel.roles.server import BLOCK_FLOOR, LEAF, UPPER, Sizing
from nlevel.roles.ledger import Ledger
from nlevel.roles.station import _ride
from nlevel.sim.engine import SimBoards
from nlevel.ranges import RangeSet

H = build(64, Plan(4, (4, 4)))


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _weights(rank: int) -> dict[int, int]:
    w = {c: H[c].weight for c in H[rank].children}
    w[rank] = 1
    return w


def _master(boards: SimBoards, clock: Clock, total: int = 10_000) -> Master:
    m = Master(H, 0, _weights(0), clock, boards, Sizing(), Ledger(total))
    m.queue = RangeSet()
    m.queue.add(0, total)
    return m


def _region(rank: int, boards: SimBoards, clock: Clock) -> Region:
    parent = H[rank].parent
    assert parent is not None
    return Region(H, rank, _weights(rank), clock, boards, Sizing(), parent)


def test_the_upper_board_sizes_blocks_for_its_smallest_sub_region():
    boards, clock = SimBoards((256, 256)), Clock()
    m = _master(boards, clock)
    assert sorted({H[c].weight for c in H[0].children if H[c].children}) == [4, 16]
    assert m.block_weight() == 4  # (the mean, 10, gave the leaf regions of its own subtree 2.5 times their share)
    m.set_weight(4, 2)
    assert m.block_weight() == 2
    m.child_left(m.children[4])
    assert m.block_weight() == 4


def test_blocks_hold_a_few_horizons_of_work_once_task_times_are_known():
    boards, clock = SimBoards((256, 256)), Clock()
    m = _master(boards, clock)
    assert m.block(10_000, 16) == 16  # nothing measured: a range per rank
    m.on_report(1, Report(done=(), tasks=4, busy=14.0), clock())  # 3.5 s tasks
    # 64 ranks run 0.09 ids in half a horizon: still a few ids (a block of one id was a refill per
    # task at every level), not one per rank; at most an id per four ranks (a range per rank was a
    # task-time of stock that regions taking the last blocks ran after the others had nothing)
    assert m.block(10_000, 64) == BLOCK_FLOOR < 64
    assert m.block(10_000, 16) == 4
    assert m.block(10_000, 3) == 1
    assert m.block(6, 64) == math.ceil(6 * 64 / (2 * m.total_weight)) < BLOCK_FLOOR  # the share of what is left still cuts it
    m.task_mean = 204.0  # (docking: 16 ranks run 0.08 ids a second; a region drained whole ran its stock alone)
    assert m.block(10_000, 16) == 1
    m.task_mean = 0.0035  # (3.5 ms tasks: 16 ranks run 23 ids in 5 ms)
    assert m.block(10_000, 16) == 23


def test_a_region_divides_its_own_stock_only_once_its_parent_is_drained():
    boards, clock = SimBoards((256, 256)), Clock()
    r = _region(16, boards, clock)
    r.queue.add(0, 20)
    assert r.gss_pool() > 10**9  # the job's pool is upstream: 20 ids here must not cut ranges to 1
    r.parent_all_out = r.ends_job = True
    assert r.gss_pool() == 20


def _stocked_region(boards: SimBoards, clock: Clock, waiting: tuple[int, ...]) -> Region:
    """Region 16 with 40 ids published on its two boards; the sub-regions ``waiting`` take what
    is on its upper board and wait there."""
    _master(boards, clock).publish(clock())
    r = _region(16, boards, clock)
    r.queue.add(100_000, 100_040)
    r.publish(clock())
    for rank in waiting:
        c = Claimer(rank, boards.slots(UPPER), 0)
        while c.claim(boards(16, UPPER)).status == "ids":
            pass
    r.scan(clock(), full=True)
    return r


def test_a_region_refills_for_the_board_its_claimers_wait_on():
    # Ids published on its leaf board cannot serve sub-regions waiting on its upper board.
    boards, clock = SimBoards((256, 256)), Clock()
    r = _stocked_region(boards, clock, (20, 24))  # two sub-regions find nothing upstairs
    leaf = r.owners[LEAF]
    assert leaf.on_board > 0
    assert r.owners[UPPER].waiting == 2 and r.owners[UPPER].on_board == 0
    # Its stock is all on the leaf board (16 ids); two blocks are wanted upstairs. One number for
    # both boards (8 wanted, 16 held) said "enough"; per board it is short, so it refills.
    assert r.stock() == leaf.on_board == 16
    assert r.stock() < r.target() == 16 + 2 * r.block(r.gss_pool(), 4)


def test_a_region_moves_its_leaf_stock_upstairs_only_once_nothing_more_comes_from_above():
    boards, clock = SimBoards((256, 256)), Clock()
    r = _stocked_region(boards, clock, (20,))  # a sub-region waits upstairs
    r.queue = RangeSet()  # everything it holds is on its leaf board
    leaf = r.owners[LEAF]
    held = leaf.on_board
    r.publish(clock())
    # Its parent still has ids: the refill serves the sub-region, the leaf board stays as it is
    # (taken back and published again on every look, it left holes its own ranks claimed through).
    assert leaf.on_board == held and not r.queue
    r.parent_all_out = r.ends_job = True
    r.publish(clock())
    assert r.owners[UPPER].on_board > 0  # the end: stock goes where claimers wait


def test_a_region_left_with_only_its_own_loop_sends_its_surplus_up_at_once():
    boards, clock = SimBoards((256, 256)), Clock()
    r = _region(4, boards, clock)  # a leaf region of 4 ranks: rank 4 and its slaves 5, 6, 7
    r.queue.add(100, 108)  # a block of 8 ids
    r.publish(clock())
    assert r.stock() == 8 and not r.alone()
    r.shed(clock())  # (not alone: nothing moves)
    assert r.stock() == 8 and not r.up_returned
    for rank in (5, 6, 7):  # its slaves are drained: they leave
        r.on_report(rank, Report(leaving=True), clock())
    assert r.alone()
    r.refill(clock())
    assert r.stock() == r.leaf_chunk(r.gss_pool()) == 1  # one range for its own loop ...
    r.publish(clock())
    assert Claimer(4, boards.slots(LEAF)).claim(boards(4, LEAF)) == Claim(100, 101, "ids")  # ... its first claim finds it
    assert r.flush_due(clock())  # (up at once: other regions may wait for them)
    assert r.flush().returned == ((101, 108),)


def test_a_sub_region_whose_ranks_leave_says_so_and_its_parent_sizes_blocks_for_what_is_left():
    boards, clock = SimBoards((256, 256)), Clock()
    r = _region(20, boards, clock)  # a leaf region of 4 ranks (20 and its slaves 21-23) under region 16
    assert not r.flush_due(clock()) and r.flush().weight == 0  # nothing changed: nothing said
    for rank in (21, 22, 23):  # drained
        r.on_report(rank, Report(leaving=True), clock())
    assert r.live_ranks() == 1 and not r.flush_due(clock())  # (due within its flush age, with what else goes up)
    clock.t += 1.0
    assert r.flush_due(clock())
    report = r.flush()
    assert report.weight == 1 and not report.done
    assert r.flush().weight == 0  # said once
    p = _region(16, boards, clock)  # its parent: its own 4 ranks and three sub-regions of 4
    assert p.block_weight() == 4 and p.live_ranks() == 16 and p.total_weight == 16
    p.on_report(20, report, clock())
    assert p.live_ranks() == 13 and p.total_weight == 13  # the pool's shares follow ...
    # ... not the blocks, while a sibling is whole: sized for the drained one, every sibling's
    # block was one id, a refill per task (what the drained one cannot use comes back)
    assert p.block_weight() == 4
    clock.t += 1.0
    assert p.flush_due(clock()) and p.flush().weight == 13  # ... and up the tree
    p.on_report(24, Report(weight=2), clock())  # (half of a sub-region left: it counts)
    assert p.block_weight() == 2 and p.live_ranks() == 11
    for sub in (24, 28):
        p.on_report(sub, Report(weight=1), clock())
    assert p.block_weight() == 1  # every sub-region drained: blocks for what they are
    p.set_weight(20, 3)  # a failure re-laid the plan (one of its ranks died): what left stays gone
    assert p.children[20].gone_weight == 2 and p.live_ranks() == 7 and p.total_weight == 7


def test_a_region_whose_ranks_were_drained_sends_what_they_cannot_use_up():
    boards, clock = SimBoards((256, 256)), Clock()
    r = _stocked_region(boards, clock, ())  # region 16: 40 ids on its boards, for 16 ranks
    assert r.stock() == 40
    r.shed(clock())
    assert r.stock() == 40 and not r.up_returned  # (every rank computes: a few ranges each is its stock)
    for rank in (17, 18, 19):  # its own slaves are drained ...
        r.on_report(rank, Report(leaving=True), clock())
    for sub in (20, 24, 28):  # ... and its sub-regions' (each says what is left: its region-master)
        r.on_report(sub, Report(weight=1), clock())
    assert r.live_ranks() == 4 and not r.alone()
    r.refill(clock())
    keep = r.stock()
    assert keep == max(r.target(held=False), 2 * 4 * r.leaf_chunk(r.gss_pool())) < 40  # two ranges a rank
    assert r.flush_due(clock())  # (up at once: other regions run them)
    back = RangeSet(r.flush().returned)
    kept = r.published()
    kept.add_ranges(r.queue.ranges())
    assert len(back) == 40 - keep and len(kept) == keep and not any(back.overlap(a, b) for a, b in kept.ranges())
    r.queue.add(200_000, 200_040)
    r.suspects.add(200_030, 200_031)  # (an id a rank died holding: it stays where its deaths are counted)
    r.shed(clock())
    assert RangeSet(r.flush().returned).overlap(200_000, 200_040) == 39 and 200_030 in r.queue
    r.queue.add(300_000, 300_040)
    r.parent_all_out = r.ends_job = True
    r.shed(clock())
    assert not r.up_returned and 300_039 in r.queue  # the end of the job: the boards' rebalancing does it


def test_a_region_sends_its_completions_at_once_when_no_child_holds_an_id():
    boards, clock = SimBoards((256, 256)), Clock()
    r = _region(20, boards, clock)
    r.claimer.ticket = 7  # waiting for its parent, which had nothing
    r.children[21].held.add(5, 6)
    r.held_total = 1
    r._accept_done(((3, 4),), (), clock())
    assert r.flush_at() == r.oldest_up + r.batch_age / 8  # rank 21 still runs id 5
    r.on_report(21, Report(done=((5, 6),)), clock())
    assert r.held_total == 0 and r.flush_at() == r.oldest_up  # nothing more can come from below


def test_a_last_report_and_the_ending_behind_it_go_as_one_message_without_fault_tolerance():
    report, ending = Report(done=((1, 2),)), Ending(({"rank": 5},), {})
    outs = [Send(4, report), Send(4, ending)]
    assert _ride(outs, ft=False) == [Send(4, Report(done=((1, 2),), ending=ending))]
    assert _ride(outs, ft=True) == outs  # (under fault tolerance a parent may set a report aside)
    assert _ride([Send(3, report), Send(4, ending)], ft=False) == [Send(3, report), Send(4, ending)]


def test_orphan_completions_after_a_switch_are_known_to_be_held_by_no_child():
    boards, clock = SimBoards((256, 256)), Clock()
    m = _master(boards, clock)
    m.carried.add(500, 600)
    assert m.accounted([(510, 520), (590, 600)])
    assert not m.accounted([(590, 601)])
    assert not _region(16, boards, clock).accounted([(510, 520)])


def test_a_region_holds_completions_a_quarter_task_when_tasks_are_long():
    boards, clock = SimBoards((256, 256)), Clock()
    r = _region(20, boards, clock)
    assert r.age() == r.batch_age  # nothing measured
    r.task_mean = 0.2  # (four batch ages: still the batch age)
    assert r.age() == r.batch_age
    r.task_mean = 3.5
    assert abs(r.age() - r.batch_age * 0.875 / 0.05) < 1e-12  # the same stagger, a quarter task
    r.task_mean = 120.0
    assert abs(r.age() - r.batch_age * 1.0 / 0.05) < 1e-12  # at most LONG_AGE


def test_a_region_master_of_the_simulator_keeps_no_sketch_of_its_own_claims():
    """A sketch per region-master was 3 % of a 32,768-process simulation; the moments stay."""
    from nlevel.config import Config
    from nlevel.roles.station import Station
    from nlevel.testing.network import LocalBoards

    h = build(16, Plan(3, [2]))
    region = next(r for r in range(16) if h[r].children and h[r].parent is not None)
    for measured in (True, False):
        st = Station(h, region, Config(levels=3, regions=(2,)), lambda: 0.0, LocalBoards(), 100, measured=measured)
        assert isinstance(st.server, Region)
        requests = st.server.requests
        requests.add_parts(0.002, 0.001)
        assert requests.total.n == 1
        assert (requests.total.sketch is not None) is measured
