"""``--retry-failed`` (Farm(..., retry_failed=True)): the failed ids of earlier runs run again, and only they."""

from __future__ import annotations

from nlevel.config import Config
from nlevel.model.plan import Plan
from nlevel.roles.ledger import Ledger
from nlevel.roles.messages import TaskFailure
from nlevel.testing.network import Network


def _failed(tid: int, kind: str = "raised") -> TaskFailure:
    return TaskFailure(tid, kind, f"task {tid} broke", 1, "n1", "Traceback ...", attempts=3)


def _ledger(total: int, done: list[tuple[int, int]], failed: list[int]) -> Ledger:
    led = Ledger(total, done)
    for tid in failed:
        led.fail(_failed(tid))
    led.timeouts = {tid: 3 for tid in failed}
    return led


def test_retry_moves_the_records_aside_until_the_ids_succeed():
    led = _ledger(10, [(0, 5), (6, 9)], [5, 9])
    assert led.retry_failed() == [5, 9] and led.retry and not led.failed and not led.timeouts
    assert [f.id for f in led.recorded_failed()] == [5, 9]  # the checkpoint still says so
    led.commit([(5, 6)])
    assert [f.id for f in led.recorded_failed()] == [9]  # cleared when it succeeds
    again = TaskFailure(9, "raised", "still broken", 2, "n2", "")
    led.fail(again)
    assert led.recorded_failed() == (again,) and led.failed == {9: again} and not led.retrying


def test_without_retry_the_failed_ids_are_left_out():
    led = _ledger(60, [(0, 7), (8, 13), (14, 40)], [7, 13])
    out = Network(3, Plan(2), 60, 1, config=Config(levels=2), ledger=led).run()
    assert sorted(out.executed) == list(range(40, 60))
    assert set(out.ledger.failed) == {7, 13} and out.ledger.n_committed == 58


def test_with_retry_the_failed_ids_and_the_rest_run_and_their_records_go():
    led = _ledger(60, [(0, 7), (8, 13), (14, 40)], [7, 13])
    led.retry_failed()
    out = Network(3, Plan(2), 60, 1, config=Config(levels=2), ledger=led).run()
    assert sorted(out.executed) == [7, 13, *range(40, 60)]
    assert out.ledger.complete() and not out.ledger.failed and out.ledger.recorded_failed() == ()


def test_a_retried_id_that_fails_again_is_recorded_again():
    led = _ledger(30, [(0, 30)], [])
    led.committed.remove(17, 18)
    led.fail(_failed(17))
    led.retry_failed()
    config = Config(levels=2, on_task_error="skip")
    out = Network(3, Plan(2), 30, 2, config=config, raises=frozenset({17}), ledger=led).run()
    assert sorted(out.executed) == [17] and list(out.ledger.failed) == [17]
    assert out.ledger.failed[17].error != "task 17 broke"  # this run's failure replaced the old record
