import random
import statistics

import pytest

from nlevel.stats import RequestTimes, Summary


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
    assert abs(total.quantile(0.5) - statistics.median(xs)) < 0.15


def test_request_parts():
    rt = RequestTimes()
    rt.add(total=1.0, residence=0.4, dispose=0.1)
    d = rt.to_dict()
    assert d["message"]["mean"] == pytest.approx(300.0)
    assert d["wait"]["mean"] == pytest.approx(300.0)
    assert d["dispose"]["mean"] == pytest.approx(100.0)
