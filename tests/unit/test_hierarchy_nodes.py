"""Regions follow machine nodes (issue 33): a split of ranks that span several nodes cuts only between nodes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nlevel.errors import PlanError
from nlevel.model.hierarchy import Role, build, check_nodes, fit_nodes, node_splits, nodes_of
from nlevel.model.plan import Plan

from ..conftest import examples


def node_of(sizes):
    out = []
    for k, n in enumerate(sizes):
        out += [k] * n
    return out


def ancestor(h, r, level):
    """The rank leading ``r``'s block at ``level`` (1: a region of the first split)."""
    while h[r].level > level and h[r].parent is not None:
        r = h[r].parent
    return r


def test_three_nodes_of_two_one_region_each():
    h = build(6, Plan(3, (3,)), node_sizes=(2, 2, 2))
    assert [n.role for n in h.nodes] == [Role.MASTER, Role.SLAVE, Role.REGION, Role.SLAVE, Role.REGION, Role.SLAVE]
    where = node_of((2, 2, 2))
    assert all(where[n.parent] == where[n.rank] for n in h.nodes if n.role is Role.SLAVE)


def test_without_nodes_the_layout_is_unchanged():
    assert [n.parent for n in build(7, Plan(3, (2,))).nodes] == [n.parent for n in
                                                                 build(7, Plan(3, (2,)), node_sizes=(7,)).nodes]


@settings(max_examples=examples(200), deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=2, max_size=6), levels=st.sampled_from([3, 4]), data=st.data())
def test_no_region_of_a_split_across_nodes_cuts_a_node(sizes, levels, data):
    size = sum(sizes)
    r1 = data.draw(st.integers(2, max(2, len(sizes))))
    regions = (r1,) if levels == 3 else (r1, data.draw(st.integers(2, 3)))
    plan = Plan(levels, regions)
    if size < plan.min_size():
        return
    h = build(size, plan, node_sizes=tuple(sizes))
    where = node_of(sizes)
    for a in range(size):
        for b in range(size):
            if where[a] == where[b]:
                assert ancestor(h, a, 1) == ancestor(h, b, 1), (sizes, plan, a, b)


def test_more_regions_than_nodes_are_refused_naming_the_numbers():
    assert node_splits(6, Plan(3, (4,)), (2, 2, 2)) == [(1, 4, 3)]
    with pytest.raises(PlanError, match=r"regions 4 at level 1 would split a node: those ranks run on 3 nodes "
                                        r"\(2, 2, 2 ranks per node\)"):
        check_nodes(6, Plan(3, (4,)), (2, 2, 2))
    assert fit_nodes(6, Plan(3, (4,)), (2, 2, 2)).regions == (3,)
    check_nodes(8, Plan(4, (2, 2)), (4, 4))  # (the second split is inside a node: allowed)


def test_nodes_are_read_from_host_names_in_rank_order():
    assert nodes_of(["a", "a", "b", "b", "b"]) == (2, 3)
    assert nodes_of(["a", "a"]) == ()
    assert nodes_of(["a", "b", "a"]) is None  # (--map-by node: not contiguous)


def test_the_planner_keeps_regions_of_whole_nodes():
    from nlevel.model.cost import Costs, Workload
    from nlevel.model.planner import candidates, choose_plan, first_plan

    assert all(not p.regions or p.regions[0] <= 4 for p in candidates(4096, 0.003, Costs(service_time=3e-5, msg_time=5e-6), nodes=4))
    assert choose_plan(Workload(4096, 0.003, nodes=4), Costs(service_time=3e-5, msg_time=5e-6)).plan.regions[:1] in ((), (2,), (3,), (4,))
    assert first_plan(20000, Costs(service_time=3e-5, msg_time=5e-6), nodes=3).regions[0] == 3
