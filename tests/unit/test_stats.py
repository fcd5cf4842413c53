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


def test_the_full_reservoir_stays_a_uniform_sample_of_the_stream():
    """Algorithm L: every value of the stream is as likely to be kept (late ones are not favoured or lost)."""
    n, cap, kept_late, means = 50_000, 256, 0, []
    for seed in range(20):
        s = Summary(seed=seed, cap=cap)
        for i in range(n):
            s.add(float(i))
        assert len(s.sample) == cap and s.n == n
        means.append(sum(s.sample) / cap)
        kept_late += sum(1 for v in s.sample if v >= 0.9 * n)
    assert abs(sum(means) / len(means) - n / 2) < 0.03 * n  # (sd of the mean here: ~0.013 n)
    assert 0.07 < kept_late / (20 * cap) < 0.13  # the last tenth of the stream: a tenth of the sample
    assert s.quantile(0.5) == sorted(s.sample)[cap // 2]
