"""The master's ledger: exactly-once commits, whatever the order and overlap of what comes in."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nlevel.roles.ledger import Ledger

from ..conftest import examples

# Batches of ranges in [0, 3000): holes filled in any order, repeats, overlaps, a resumed part.
batch = st.lists(st.tuples(st.integers(0, 2999), st.integers(1, 12)).map(lambda p: (p[0], min(3000, p[0] + p[1]))),
                 max_size=40)


@settings(max_examples=examples(200), deadline=None)
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


# ---------------------------------------------------------------- what changed, for the checkpoint

# (ids in [0, 300): batches overlap what earlier ones committed, before and after a take)
small = st.lists(st.tuples(st.integers(0, 299), st.integers(1, 12)).map(lambda p: (p[0], p[0] + p[1])), max_size=10)
step = st.one_of(
    st.tuples(st.just("commit"), small),
    st.tuples(st.just("fail"), st.integers(0, 2999)),
    st.tuples(st.just("timeout"), st.integers(0, 2999)),
    st.tuples(st.just("merge"), small),
    st.tuples(st.just("retry"), st.none()),
    st.tuples(st.just("take"), st.booleans()),  # True: written at once; False: joined with the next ones
)


def _state(led):
    """What a checkpoint of ``led`` holds: committed ids, results, failure records, timeout counts."""
    results = dict(zip(led.result_ids.tolist(), led.result_values.tolist()))
    return (set(led.committed), results, {f.id: f for f in led.recorded_failed()}, dict(led.timeouts))


def _apply(state, ch):
    committed, results, failed, timeouts = state
    for a, b in ch.completed:
        assert not committed & set(range(a, b)), "a range of changes holds an id committed before"
        committed |= set(range(a, b))
    for i, v in zip(ch.result_ids.tolist(), ch.result_values.tolist()):
        assert i not in results
        results[i] = v
    for f in ch.failed:
        failed[f.id] = f
    for tid in ch.unfailed:
        failed.pop(tid, None)
    timeouts.update(dict(ch.timeouts))
    for tid in ch.untimed:
        timeouts.pop(tid, None)
    assert ch.n_committed == len(committed)


@settings(max_examples=examples(150), deadline=None)
@given(resumed=st.lists(st.tuples(st.integers(0, 290), st.integers(1, 9)), max_size=10),
       steps=st.lists(step, max_size=50))
@example(resumed=[], steps=[("commit", [(0, 5)]), ("take", True), ("commit", [(3, 8)])])
def test_changes_applied_in_order_give_the_ledger_and_hold_only_what_is_new(resumed, steps):
    from nlevel.roles.messages import TaskFailure

    led = Ledger(3000, [(a, a + n) for a, n in resumed])
    led.track()
    disk = _state(led)
    pending = None  # (changes taken but joined with later ones first, as the writer joins them)
    for kind, arg in steps:
        if kind == "commit":
            ranges = sorted(arg)
            led.commit(ranges, [(a, float(a)) for a, _ in ranges])
        elif kind == "merge":
            starts = sorted({a for a, _ in arg})
            other = Ledger(3000, sorted(arg), starts, [float(a) for a in starts])
            other.fail(TaskFailure(2999, "raised", "boom"))
            led.merge(other)
        elif kind == "fail":
            led.fail(TaskFailure(arg, "raised", f"failed after {len(disk[2])} others"))
        elif kind == "timeout":
            led.timeouts[arg] = led.timeouts.get(arg, 0) + 1
        elif kind == "retry":
            led.retry_failed()
        else:
            ch = led.changes()
            pending = ch if pending is None else pending.then(ch)
            if arg:
                _apply(disk, pending)
                pending = None
    ch = led.changes()
    _apply(disk, ch if pending is None else pending.then(ch))
    assert disk == _state(led)
    assert led.changes().empty  # nothing new since


def test_changes_cost_what_is_new():
    led = Ledger(10**6, [(0, 500_000)], range(0, 500_000, 5), [1.0] * 100_000)
    led.track()
    led.commit([(500_000, 500_010)], [(500_003, 2.0)])
    ch = led.changes()
    assert ch.completed == ((500_000, 500_010),) and list(ch.result_ids) == [500_003] and ch.n_committed == 500_010
    assert led.changes().empty and not Ledger(5).tracked
    led.untrack()
    with pytest.raises(RuntimeError, match="track"):
        led.changes()
