"""Failure records stay bounded (issue 35): a job whose every task hits the same bug keeps a few
tracebacks, not one per task; every failed id is still recorded."""

from __future__ import annotations

from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.roles.ledger import Ledger
from nlevel.roles.master import ERROR_MAX, TRACEBACKS_KEPT, WAYS_KEPT, Master
from nlevel.roles.messages import TaskFailure
from nlevel.roles.server import Sizing
from nlevel.sim.engine import SimBoards

H = build(8, Plan(2))


def _master() -> Master:
    weights = {c: H[c].weight for c in H[0].children}
    return Master(H, 0, weights, lambda: 0.0, SimBoards((64, 16)), Sizing(), Ledger(100_000))


def _raised(tid: int, line: int = 12, message: str = "") -> TaskFailure:
    tb = (f'Traceback (most recent call last):\n  File "app.py", line {line}, in do_job\n    1 / x\n'
          f"ZeroDivisionError: {message or f'task {tid}: division by zero'}\n")
    return TaskFailure(tid, "raised", f"ZeroDivisionError: task {tid}", 3, "n1", tb)


def test_one_bug_in_every_task_keeps_a_few_tracebacks_and_every_id():
    m = _master()
    for tid in range(5000):
        m.task_failed(_raised(tid))
    failed = m.ledger.failed
    assert sorted(failed) == list(range(5000))
    kept = [f for f in failed.values() if f.traceback.startswith("Traceback")]
    assert len(kept) == TRACEBACKS_KEPT and {f.id for f in kept} == set(range(TRACEBACKS_KEPT))
    assert all("not kept" in f.traceback for f in failed.values() if f not in kept)
    assert failed[4999].error == "ZeroDivisionError: task 4999"  # (the error line is each task's own)


def test_another_place_keeps_its_own_tracebacks():
    m = _master()
    for tid in range(40):
        m.task_failed(_raised(tid, line=12 if tid % 2 else 30))
    kept = [f for f in m.ledger.failed.values() if f.traceback.startswith("Traceback")]
    assert len(kept) == 2 * TRACEBACKS_KEPT


def test_the_ways_counted_are_bounded_and_a_huge_error_line_is_cut():
    m = _master()
    for tid in range(WAYS_KEPT + 5):
        m.task_failed(_raised(tid, line=tid))
    assert len(m.ways) == WAYS_KEPT
    assert m.ledger.failed[WAYS_KEPT + 4].traceback.startswith("(not kept: more than")
    m.task_failed(TaskFailure(99_999, "raised", "ValueError: " + "x" * 10**6, 1, "", ""))
    f = m.ledger.failed[99_999]
    assert len(f.error) < ERROR_MAX + 40 and f.error.endswith(f"({10**6 + 12} characters)")
