from hypothesis import given, settings
from hypothesis import strategies as st

from nlevel.ranges import RangeSet

from ..conftest import examples

ops = st.lists(
    st.tuples(st.sampled_from(["add", "remove", "take"]), st.integers(0, 60), st.integers(0, 12)), max_size=60
)


@given(ops)
@settings(max_examples=examples(300), deadline=None)
def test_matches_a_python_set(steps):
    rs, model = RangeSet(), set()
    for op, a, n in steps:
        if op == "add":
            new = rs.add(a, a + n)
            assert new == len(set(range(a, a + n)) - model)
            model |= set(range(a, a + n))
        elif op == "remove":
            gone = rs.remove(a, a + n)
            assert gone == len(set(range(a, a + n)) & model)
            model -= set(range(a, a + n))
        else:
            taken = [i for s, e in rs.take(n) for i in range(s, e)]
            assert taken == sorted(model)[:n]
            model -= set(taken)
        assert list(rs) == sorted(model)
        assert len(rs) == len(model)
        starts = [s for s, _ in rs.ranges()]
        stops = [e for _, e in rs.ranges()]
        # canonical: sorted, disjoint, never adjacent
        assert all(stops[k] < starts[k + 1] for k in range(len(starts) - 1))
        assert all(s < e for s, e in rs.ranges())


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 8))), st.integers(0, 70))
def test_complement_and_overlap(pairs, total):
    rs = RangeSet((a, a + n) for a, n in pairs)
    model = {i for a, n in pairs for i in range(a, a + n)}
    assert list(rs.complement(total)) == [i for i in range(total) if i not in model]
    assert rs.overlap(10, 30) == len(model & set(range(10, 30)))
    assert all((i in rs) == (i in model) for i in range(-2, 62))


def test_in_order_completion_stays_one_range():
    rs = RangeSet()
    for i in range(100_000):
        rs.add(i, i + 1)
    assert rs.n_ranges == 1 and len(rs) == 100_000


def test_huge_spans_cost_nothing():
    rs = RangeSet.span(0, 10**9)
    assert len(rs) == 10**9
    assert rs.take(3) == ((0, 3),)
    assert rs.pop() == 3 and rs.first() == 4


many = st.lists(st.tuples(st.integers(0, 80), st.integers(0, 10)), max_size=6)


@given(st.lists(st.tuples(st.sampled_from(["add_ranges", "remove_ranges", "pop"]), many), max_size=40))
@settings(max_examples=examples(300), deadline=None)
def test_bulk_operations_match_a_python_set(steps):
    # The fast paths (one range touched: edited in place; merges without generators)
    # against a reference set, with the counts each call returns.
    rs, model = RangeSet(), set()
    for op, pairs in steps:
        ids = [set(range(a, a + n)) for a, n in pairs]
        if op == "add_ranges":
            expected = 0
            for s in ids:
                expected += len(s - model)
                model |= s
            assert rs.add_ranges((a, a + n) for a, n in pairs) == expected
        elif op == "remove_ranges":
            expected = 0
            for s in ids:
                expected += len(s & model)
                model -= s
            assert rs.remove_ranges([(a, a + n) for a, n in pairs]) == expected
        elif model:
            assert rs.pop() == min(model)
            model.remove(min(model))
        assert list(rs) == sorted(model) and len(rs) == len(model)
        ranges = rs.ranges()
        assert all(a < b for a, b in ranges)
        assert all(ranges[k][1] < ranges[k + 1][0] for k in range(len(ranges) - 1))


wide = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 12)), min_size=8, max_size=40)


@given(st.lists(st.tuples(st.sampled_from(["add", "add_ranges", "remove_ranges"]), wide), max_size=25))
@settings(max_examples=examples(300), deadline=None)
def test_merges_of_many_ranges_match_a_python_set(steps):
    # Eight or more ranges at once, as a tuple: add_ranges and remove_ranges merge the two
    # sorted lists in one pass (unsorted, overlapping and empty input ranges included).
    rs, model = RangeSet(), set()
    for op, pairs in steps:
        ranges = tuple((a, a + n) for a, n in pairs)
        ids = set().union(*(range(a, b) for a, b in ranges))
        if op == "add":
            for a, b in ranges:
                rs.add(a, b)
            model |= ids
        elif op == "add_ranges":
            assert rs.add_ranges(ranges) == len(ids - model)
            model |= ids
        else:
            assert rs.remove_ranges(list(ranges)) == len(ids & model)
            model -= ids
        assert set(rs) == model and len(rs) == len(model)
        flat = [x for r in rs.ranges() for x in r]
        assert flat == sorted(flat) and all(b > a for a, b in rs.ranges())
        assert all(rs.ranges()[k][1] < rs.ranges()[k + 1][0] for k in range(len(rs.ranges()) - 1))
