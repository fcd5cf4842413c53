"""The master's ledger: exactly-once commits, whatever the order and overlap of what comes in."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nlevel.roles.ledger import Ledger

# Batches of ranges in [0, 3000): holes filled in any order, repeats, overlaps, a resumed part.
batch = st.lists(st.tuples(st.integers(0, 2999), st.integers(1, 12)).map(lambda p: (p[0], min(3000, p[0] + p[1]))),
                 max_size=40)


@settings(max_examples=200, deadline=None)
@given(resumed=st.lists(st.tuples(st.integers(0, 2990), st.integers(1, 9)), max_size=20), batches=st.lists(batch, max_size=60))
def test_commits_count_new_ids_once_and_the_committed_set_is_their_union(resumed, batches):
    done = [(a, a + n) for a, n in resumed]
    led = Ledger(3000, done)
    model = set()
    for a, b in done:
        model.update(range(a, b))
    assert led.resumed == len(model)
    asked = 0
    for ranges in batches:
        ranges = sorted(ranges)
        results = [(a, float(a)) for a, _ in ranges]
        before = set(model)
        for a, b in ranges:
            model.update(range(a, b))
        new = led.commit(ranges, results)
        asked += sum(b - a for a, b in ranges)
        assert new == len(model) - len(before)
        assert led.n_committed == len(model)  # (without merging what came lately)
        assert sorted(set(led.result_ids)) == sorted(led.result_ids)  # one result per id
    assert set(led.committed) == model
    assert led.recomputed == asked - (len(model) - led.resumed)
    assert led.complete() == (len(model) == 3000)
    assert set(led.remaining()) == set(range(3000)) - model


def test_many_scattered_commits_stay_exact_across_merges():
    # Enough holes that the recent commits are merged into the large set several times.
    led = Ledger(200_000)
    odd = [(i, i + 1) for i in range(1, 200_000, 2)]
    for k in range(0, len(odd), 37):
        assert led.commit(odd[k : k + 37]) == len(odd[k : k + 37])
    assert led.committed.n_ranges == 100_000 and led.n_committed == 100_000
    even = [(i, i + 1) for i in range(0, 200_000, 2)]
    for k in range(0, len(even), 41):
        led.commit(even[k : k + 41])
    assert led.committed.ranges() == ((0, 200_000),) and led.complete() and led.recomputed == 0
