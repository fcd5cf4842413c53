import pytest
from hypothesis import given, settings, strategies as st

from nlevel.errors import PlanError
from nlevel.model.hierarchy import Role, build
from nlevel.model.plan import Plan, default_regions

from ..conftest import examples


def check_tree(h):
    size = h.size
    assert h[0].role is Role.MASTER and h[0].parent is None and h[0].level == 0
    for node in h.nodes[1:]:
        p = node.parent
        assert p is not None and p < node.rank
        assert node.rank in h[p].children
        assert node.level >= 1
    # every rank reaches the master
    for node in h.nodes:
        r, hops = node.rank, 0
        while h[r].parent is not None:
            r = h[r].parent
            hops += 1
            assert hops <= h.plan.levels
        assert r == 0
    assert sum(len(n.children) for n in h.nodes) == size - 1
    # weights count computing ranks in each subtree
    assert h[0].weight == h.workers()
    for node in h.nodes:
        assert node.weight == int(node.computes) + sum(h[c].weight for c in node.children)
    slaves = [n for n in h.nodes if n.role is Role.SLAVE]
    assert all(not n.children for n in slaves)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 8, 16, 100, 1000])
def test_two_levels(size):
    h = build(size, Plan())
    check_tree(h)
    assert h[0].children == tuple(range(1, size))
    assert h.workers() == size


@pytest.mark.parametrize("size,regions", [(4, (2,)), (7, (2,)), (7, (3,)), (64, (8,)), (1000, (31,)), (32768, (128,))])
def test_three_levels(size, regions):
    h = build(size, Plan(3, regions))
    check_tree(h)
    rms = [n for n in h.nodes if n.role is Role.REGION]
    assert len(rms) == regions[0] - 1  # the master leads the first region itself
    assert all(n.level == 1 for n in rms)
    assert all(h[n.rank].level == 2 for n in h.nodes if n.role is Role.SLAVE)


def test_seven_ranks_three_levels_layout():
    h = build(7, Plan(3, (2,)))
    assert h[0].children == (4, 1, 2, 3)
    assert h[4].children == (5, 6) and h[4].role is Role.REGION
    assert h[4].weight == 3 and h[0].weight == 7


@pytest.mark.parametrize("size,regions", [(8, (2, 2)), (50, (3, 4)), (4096, (16, 16))])
def test_four_levels(size, regions):
    h = build(size, Plan(4, regions))
    check_tree(h)
    assert max(n.level for n in h.nodes) == 3
    assert any(n.level == 2 and n.role is Role.REGION for n in h.nodes)


def test_serve_only():
    h = build(7, Plan(3, (2,), serve_only="all"))
    check_tree(h)
    assert not h[0].computes and not h[4].computes
    assert h.workers() == 5
    h = build(7, Plan(3, (2,), serve_only="master"))
    assert not h[0].computes and h[4].computes


def test_plan_that_does_not_fit_names_the_sizes():
    with pytest.raises(PlanError, match=r"needs at least 8 processes .* got 7"):
        build(7, Plan(3, (4,)))
    with pytest.raises(PlanError, match="got 1"):
        build(1, Plan(serve_only="master"))
    with pytest.raises(PlanError, match=r"levels=3 needs at least 4 processes"):
        default_regions(3, 3)


@pytest.mark.parametrize("kwargs,match", [
    ({"levels": 1}, "levels must be an integer >= 2, got 1"),
    ({"levels": 3}, r"levels=3 needs 1 region count"),
    ({"levels": 3, "regions": (1,)}, "region count must be an integer >= 2"),
    ({"prefetch": 0.5}, "prefetch must be a number >= 1, got 0.5"),
    ({"chunk": -1}, "chunk must be an integer >= 0"),
    ({"serve_only": "slaves"}, "serve_only must be one of none, master, all; got 'slaves'"),
])
def test_plan_validation(kwargs, match):
    with pytest.raises(PlanError, match=match):
        Plan(**kwargs)


@pytest.mark.parametrize("size,levels", [(4, 3), (7, 3), (16, 3), (100, 3), (8, 4), (1000, 4), (32768, 4)])
def test_default_regions_fit(size, levels):
    regions = default_regions(size, levels)
    check_tree(build(size, Plan(levels, regions)))


def test_plan_round_trips_through_dict():
    p = Plan(4, (3, 2), 3.0, 8, "all", "why not")
    assert Plan.from_dict(p.to_dict()) == p


# -- failed ranks: each block is led by its lowest surviving rank --------------------------
def test_failed_region_master_is_replaced_by_the_lowest_survivor_of_its_region():
    h = build(7, Plan(levels=3, regions=(2,)), failed=frozenset({4}))
    assert h[4].role is Role.DEAD and h[4].parent is None and h[4].children == ()
    assert h[5].role is Role.REGION and h[5].parent == 0 and h[5].children == (6,)
    assert h[0].children == (5, 1, 2, 3)


def test_failed_master_is_replaced_by_the_lowest_survivor():
    h = build(7, Plan(levels=3, regions=(2,)), failed=frozenset({0}))
    assert h.master == 1 and h[1].role is Role.MASTER and h[1].level == 0 and h[1].parent is None
    assert h[1].children == (4, 2, 3) and h[4].parent == 1 and h[4].children == (5, 6)


def test_a_whole_dead_first_block_hands_the_world_to_the_next_leader():
    h = build(7, Plan(levels=3, regions=(2,)), failed=frozenset({0, 1, 2, 3}))
    assert h.master == 4 and h[4].role is Role.MASTER and h[4].children == (5, 6)
    assert h.summary()["ranks_per_level"] == [1, 0, 2]


SHAPES = st.sampled_from([(2, ()), (3, (2,)), (3, (3,)), (4, (2, 2))])


def fits(size: int, shape: tuple[int, tuple[int, ...]]) -> Plan | None:
    """The plan of ``shape`` if ``size`` ranks can run it, else None."""
    plan = Plan(levels=shape[0], regions=shape[1])
    try:
        build(size, plan)
    except PlanError:
        return None
    return plan


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(2, 60), SHAPES, st.data())
def test_failures_keep_a_tree_over_exactly_the_survivors(size, shape, data):
    plan = fits(size, shape)
    if plan is None:
        return
    failed = frozenset(data.draw(st.sets(st.integers(0, size - 1), max_size=size - 1)))
    h = build(size, plan, failed)
    alive = [r for r in range(size) if r not in failed]
    assert h.master == alive[0]
    for r in alive:  # every survivor reaches the master, through survivors only
        seen, x = set(), r
        while h[x].parent is not None:
            assert h[x].parent not in failed and x not in seen
            seen.add(x)
            assert x in h[h[x].parent].children
            x = h[x].parent
        assert x == h.master
    assert h[h.master].weight == sum(1 for r in alive if h[r].computes)
    for r in failed:
        assert h[r].role is Role.DEAD and not h[r].computes


# -- drained ranks left out of a new plan (a switch after an operator's drain) ------------------
def test_drained_ranks_lead_nothing_compute_nothing_and_hang_under_the_master():
    h = build(9, Plan(3, (3,)), out=frozenset({3, 7}))  # blocks [0..2], [3..5], [6..8]
    assert h[4].role is Role.REGION and h[4].children == (5,)  # 3 was the leader: its next rank leads
    assert h[6].children == (8,)
    for r in (3, 7):
        assert h[r].role is Role.DRAINED and h[r].parent == 0 and not h[r].children
        assert not h[r].computes and h[r].weight == 0 and h[r].level == 2
    assert h[0].children == (4, 6, 1, 2, 3, 7) and h[0].weight == 7 == h.workers()
    assert h.out == frozenset({3, 7})
    assert h.summary()["ranks_per_level"] == [1, 2, 4] and h.summary()["master_children"] == 4


def test_a_drained_master_stays_master_and_serves_only():
    h = build(7, Plan(3, (2,)), out=frozenset({0}))
    assert h.master == 0 and h[0].role is Role.MASTER and not h[0].computes
    assert h[1].role is Role.REGION and h[1].parent == 0 and h[1].children == (2, 3)
    assert h[0].children == (1, 4) and h[0].weight == 6


def test_a_drained_rank_that_died_is_dead():
    h = build(7, Plan(2), failed=frozenset({3}), out=frozenset({3, 4}))
    assert h[3].role is Role.DEAD and h[4].role is Role.DRAINED and h.out == frozenset({4})


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(2, 60), SHAPES, st.data())
def test_failed_and_drained_ranks_keep_a_tree_of_the_others_under_the_lowest_survivor(size, shape, data):
    plan = fits(size, shape)
    if plan is None:
        return
    levels = plan.levels
    failed = frozenset(data.draw(st.sets(st.integers(0, size - 1), max_size=size - 1)))
    out = frozenset(data.draw(st.sets(st.integers(0, size - 1), max_size=size)))
    h = build(size, plan, failed, out)
    alive = [r for r in range(size) if r not in failed]
    assert h.master == alive[0]
    for r in alive:
        node, x, hops = h[r], r, 0
        if r in out and r != h.master:
            assert node.role is Role.DRAINED and node.parent == h.master and not node.children and node.weight == 0
        while h[x].parent is not None:
            p = h[x].parent
            assert p not in failed and x in h[p].children and (p not in out or p == h.master)
            x, hops = p, hops + 1
            assert hops <= levels
        assert x == h.master
    assert not any(h[r].computes for r in out)
    assert h[h.master].weight == sum(1 for r in alive if r not in out and h[r].computes) == h.workers()
