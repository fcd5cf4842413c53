import random
import statistics

import pytest

from nlevel.stats import ACCURACY, PARTS, RequestTimes, Summary


def test_merged_summaries_equal_the_whole():
    rng = random.Random(1)
    xs = [rng.expovariate(1.0) for _ in range(5000)]
    parts = [Summary() for _ in range(7)]
    for i, x in enumerate(xs):
        parts[i % 7].add(x)
    total = Summary()
    for p in parts:
        total.merge(p)
    assert total.n == len(xs)
    assert abs(total.mean - statistics.fmean(xs)) < 1e-9
    assert abs(total.std - statistics.stdev(xs)) < 1e-9
    assert total.lo == min(xs) and total.hi == max(xs)
    assert abs(total.quantile(0.5) - statistics.median(xs)) <= ACCURACY * statistics.median(xs) * 1.01


def test_request_parts():
    rt = RequestTimes()
    rt.add(total=1.0, residence=0.4, dispose=0.1)
    d = rt.to_dict()
    assert d["message"]["mean"] == pytest.approx(300.0)
    assert d["wait"]["mean"] == pytest.approx(300.0)
    assert d["dispose"]["mean"] == pytest.approx(100.0)


def test_quantiles_of_a_heavy_tail_are_within_one_percent():
    """Docking-like times (2.5-850 s, heavy-tailed): a reservoir of 512 missed the tail; the sketch
    reports every quantile within its relative accuracy, however the values were split and merged."""
    rng = random.Random(3)
    xs = [rng.paretovariate(1.1) * 2.5 for _ in range(20_000)]
    parts = [Summary() for _ in range(5)]
    for i, x in enumerate(xs):
        parts[i % 5].add(x)
    total = Summary()
    for p in parts:
        total.merge(p)
    ordered = sorted(xs)
    for q in (0.5, 0.9, 0.99, 0.999):
        true = ordered[int(q * (len(xs) - 1))]
        assert abs(total.quantile(q) - true) <= ACCURACY * true * 1.01 + 1e-12, q
    assert total.quantile(1.0) == max(xs)


def test_a_batch_timed_together_counts_as_equal_values():
    s = Summary()
    s.add_many(0.002, 1000, hi=0.004)
    s.add(40.0)
    assert s.n == 1001 and s.hi == 40.0
    assert s.quantile(0.5) == pytest.approx(0.002, rel=ACCURACY)
    assert s.quantile(1.0) == 40.0


def test_request_times_without_quantiles_keep_moments_only_even_when_merging_sketched_ones():
    # (the simulator's: a sketch's add is interpreted Python, four per simulated claim)
    rt, sketched = RequestTimes(quantiles=False), RequestTimes()
    rt.add_parts(total=1.0, message=0.4, dispose=0.1)
    sketched.add_parts(total=3.0, message=0.4, dispose=0.1)
    rt.merge(sketched)
    assert all(getattr(rt, name).sketch is None for name in PARTS)
    d = rt.to_dict()
    assert d["total"]["mean"] == pytest.approx(2000.0) and d["wait"]["mean"] == pytest.approx(1500.0)


def test_a_summary_without_quantiles_keeps_no_sketch():
    s = Summary(quantiles=False)
    for x in range(100):
        s.add(float(x))
    assert s.sketch is None and s.quantile(0.5) == 0.0 and s.mean == pytest.approx(49.5)


@pytest.mark.parametrize("spread, most", [((2e-3, 5e-3), 800), ((1e-6, 40.0), 2500)])
def test_a_pickled_summary_is_small_and_answers_every_quantile_as_before(spread, most):
    """Endings carry summaries up the tree: pickled, a summary of 300 task times of [2, 5] ms stays far
    below MPI's 4 KB eager limit (0.2 KB; ddsketch's own pickle: 1.8 KB; over 7 decades: 1.8 KB against
    8.7 KB) and loses nothing, merged or not."""
    import pickle

    rng = random.Random(2)
    a, b = Summary(), Summary()
    for _ in range(300):
        a.add(rng.uniform(*spread))
        b.add(rng.uniform(*spread))
    a.add(0.0)
    b.add_many(spread[0] * 1.5, 9, hi=spread[1])
    qs = [0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0]
    for s in (a, b, Summary()):
        data = pickle.dumps(s, 5)
        t = pickle.loads(data)
        assert len(data) < most, len(data)
        if s.n:
            assert len(data) < len(pickle.dumps(s.sketch, 5)) / 3
        assert (t.n, t.total, t.mean, t.std, t.lo, t.hi) == (s.n, s.total, s.mean, s.std, s.lo, s.hi)
        assert [t.quantile(q) for q in qs] == [s.quantile(q) for q in qs]
    whole = pickle.loads(pickle.dumps(a, 5))
    whole.merge(pickle.loads(pickle.dumps(b, 5)))
    a.merge(b)
    assert [whole.quantile(q) for q in qs] == [a.quantile(q) for q in qs]
