"""Results at the edges (issue 38): what complete() takes, and a master that survives any report.

A result enters the roles in two places: the user's ``complete()`` (checked by
:func:`~nlevel.roles.results.as_result`, raised to the caller) and a report a server
receives (:func:`~nlevel.roles.results.vet`, in ``Station.receive``). Whatever a report
carries, the master's ``Station.handle`` must not raise, must not shift the ledger's flat
array of results, and must say why a result was refused: a Log, and the task recorded failed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from nlevel.config import Config
from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.roles.board import Claimer
from nlevel.roles.events import Died, Log, NeedIds, Ran, Received, Send, UserError
from nlevel.roles.ledger import Ledger
from nlevel.roles.messages import Halt, Report
from nlevel.roles.results import BAD_RESULT, as_result
from nlevel.roles.server import LEAF
from nlevel.roles.station import Station
from nlevel.testing.network import LocalBoards

TOTAL = 40


# -- what complete() takes ----------------------------------------------------------------------
@pytest.mark.parametrize("value,width,stored", [
    (1.0, 1, 1.0),
    (3, 1, 3.0),
    ((1.5,), 1, 1.5),
    ([2.5], 1, 2.5),
    (np.float32(0.5), 1, 0.5),
    (np.int64(7), 1, 7.0),
    (np.array([4.0]), 1, 4.0),
    ((1, 2.5), 2, (1.0, 2.5)),
    (np.array([1.0, 2.0, 3.0]), 3, (1.0, 2.0, 3.0)),
    (2**60, 1, float(2**60)),
], ids=lambda v: None if not isinstance(v, int) or v < 2**62 else "big")
def test_numbers_and_sequences_of_the_right_width_are_stored_as_floats(value, width, stored):
    got = as_result(value, width)
    assert got == stored and type(got) is type(stored)
    if isinstance(got, tuple):
        assert all(type(x) is float for x in got)


def test_nan_and_infinities_are_stored_as_they_are():
    assert math.isnan(as_result(float("nan"), 1))
    assert as_result((float("inf"), -math.inf), 2) == (math.inf, -math.inf)


REFUSED = [
    ((1.0, 2.0), 1, "2 numbers, expected 1"),
    ((1.0, 2.0, 3.0), 2, "3 numbers, expected 2"),
    (1.0, 2, "(float) is not a sequence of numbers"),
    ((), 1, "0 numbers, expected 1"),
    ("1.0", 1, "'1.0' (str) is not a real number"),
    (("a", 1.0), 2, "'a' (str) is not a real number"),
    (None, 1, "None (NoneType) is not a real number"),
    ((None,), 1, "None (NoneType) is not a real number"),
    (((1.0,),), 1, "(1.0,) (tuple) is not a real number"),
    (((1.0, 2.0), 3.0), 2, "(1.0, 2.0) (tuple) is not a real number"),
    (True, 1, "a bool: pass float(flag)"),
    (np.bool_(True), 1, "is not a real number (a bool: pass float(flag)"),
    (1 + 2j, 1, "(complex) is not a real number"),
    (10**400, 1, "does not fit a float64"),
    (10**5000, 1, "does not fit a float64"),  # (no repr either: Python refuses to print it)
    ({"x": 1.0}, 1, "(dict) is not a real number"),
    (np.zeros((2, 2)), 2, "(ndarray) is not a sequence of numbers"),
]


@pytest.mark.parametrize("value,width,why", REFUSED, ids=[f"{i}:{why}" for i, (_, _, why) in enumerate(REFUSED)])
def test_anything_else_is_refused_saying_why(value, width, why):
    with pytest.raises(ValueError) as caught:
        as_result(value, width)
    assert why in str(caught.value)


# -- a master fed malformed reports ----------------------------------------------------------------
def master(width: int, ft: str = "off") -> tuple[Station, tuple[int, int]]:
    """The master of 3 ranks, and a range rank 1 claimed from its board (rank 1 then reports it)."""
    boards = LocalBoards()
    st = Station(build(3, Plan(2)), 0, Config(levels=2, fault_tolerance=ft, chunk=4), lambda: 1.0, boards, TOTAL,
                 Ledger(TOTAL, width=width), width)
    st.serve(full=True)
    claim = Claimer(1, boards.slots(LEAF)).claim(boards(0, LEAF))
    assert claim.status == "ids" and claim.stop - claim.start >= 2, claim
    return st, (claim.start, claim.start + 2)


def well_kept(ledger: Ledger) -> None:
    """The ledger's flat array holds exactly ``width`` floats per result id, and ``arrays`` reads."""
    assert len(ledger.result_values) == ledger.width * len(ledger.result_ids)
    _, ids, values = ledger.arrays()
    assert len(ids) == len(values)


BAD = [  # (name, the result for the range's first id, width): each one refused
    ("wrong width", (1.0, 2.0), 1),
    ("too many fields", (1.0, 2.0, 3.0), 2),
    ("too few fields", (1.0,), 2),
    ("bare number for two fields", 1.0, 2),
    ("not a number", object(), 1),
    ("tuple in a tuple", ((1.0, 2.0),), 1),
    ("tuples in a tuple", ((1.0, 2.0), (3.0, 4.0)), 2),
    ("string", "1.0", 1),
    ("strings", ("1.0", "2.0"), 2),
    ("None", None, 1),
    ("None inside", (None, 1.0), 2),
    ("huge int", 10**400, 1),
    ("int without a repr", 10**5000, 1),
    ("bool", True, 1),
    ("numpy bool", np.bool_(False), 1),
    ("complex", 1j, 1),
    ("a dict", {"x": 1.0}, 1),
    ("an array of arrays", np.zeros((2, 2)), 2),
]


@pytest.mark.parametrize("name,bad,width", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("ft", ["off", "on"])
def test_a_master_fed_a_result_it_cannot_store_survives_and_says_why(name, bad, width, ft):
    st, (a, b) = master(width, ft)
    good = 5.0 if width == 1 else tuple(5.0 + k for k in range(width))
    effects = st.handle(Received(1, Report(((a, b),), ((a, bad), (a + 1, good)))))
    logs = [e.text for e in effects if isinstance(e, Log)]
    assert len(logs) == 1 and "a report from rank 1 holds results nlevel cannot store" in logs[0], effects
    assert f"task {a}:" in logs[0] and "recorded failed" in logs[0]
    led = st.ledger
    assert a not in led.committed and a + 1 in led.committed  # (the good one is committed with its result)
    assert led.result_rows() == [good]
    failure = led.failed[a]
    assert failure.kind == BAD_RESULT and failure.rank == 1 and "is not" in failure.error, failure
    well_kept(led)
    st.handle(Received(1, Report(((b, b + 1),), ((b, good),))))  # (the master goes on as before)
    assert b in led.committed and len(led.result_rows()) == 2


@pytest.mark.parametrize("results", [
    None, "abc", 5, {"a": 1}, ((0,),), ((0, 1.0, 2.0),), (0, 1.0), np.array([[0, 1.0]]),
], ids=["None", "str", "int", "dict", "1-tuple", "3-tuple", "bare pair", "ndarray"])
def test_a_results_field_that_cannot_be_read_fails_the_reports_tasks(results):
    st, (a, b) = master(1)
    effects = st.handle(Received(1, Report(((a, b),), results)))
    assert any(isinstance(e, Log) and "cannot store" in e.text for e in effects), effects
    assert set(st.ledger.failed) == {a, a + 1} and not st.ledger.result_rows()
    well_kept(st.ledger)


def test_numpy_scalars_and_ints_from_a_report_are_committed_as_floats():
    st, (a, b) = master(2)
    effects = st.handle(Received(1, Report(((a, b),), ((a, (np.float32(0.5), 3)), (a + 1, [np.int64(2), math.inf])))))
    assert not [e for e in effects if isinstance(e, Log)]
    assert st.ledger.result_rows() == [(0.5, 3.0), (2.0, math.inf)] and not st.ledger.failed
    well_kept(st.ledger)


def test_a_result_for_an_id_not_reported_done_is_dropped_not_stored():
    st, (a, b) = master(1)
    effects = st.handle(Received(1, Report(((a, a + 1),), ((a, 1.0), (b + 5, 2.0), ("x", 3.0)))))
    [log] = [e.text for e in effects if isinstance(e, Log)]
    assert "which the report does not say done: dropped" in log and "(2 in all)" not in log
    assert st.ledger.result_ids.tolist() == [a] and b + 5 not in st.ledger.committed and not st.ledger.failed


def test_an_id_with_a_good_and_a_bad_result_keeps_the_good_one():
    st, (a, b) = master(1)
    effects = st.handle(Received(1, Report(((a, b),), ((a, 1.0), (a, "bad"), (a + 1, 2.0)))))
    assert any(isinstance(e, Log) and "another result for it is kept" in e.text for e in effects)
    assert st.ledger.result_rows() == [1.0, 2.0] and not st.ledger.failed


def test_the_masters_own_loop_is_checked_too():
    st, _ = master(1)
    st.handle(NeedIds())
    assert st.hand is not None
    a = st.hand[0]
    effects = st.handle(Ran(((a, a + 1),), ((a, "x"),), tasks=1, busy=0.1))
    assert any(isinstance(e, Log) and f"task {a}:" in e.text for e in effects), effects
    st.worker_report(force=True)  # (to its own server, in-process)
    assert st.ledger.failed[a].kind == BAD_RESULT and not st.ledger.result_rows()
    well_kept(st.ledger)


# -- an error in the program (complete() refused a call) ---------------------------------------------
def test_the_master_stops_the_job_once_for_errors_in_the_program():
    st, _ = master(1)
    effects = st.handle(Received(2, Halt(2, "ValueError: result of task 3 must be a number (x), got 'a'")))
    logs = [e.text for e in effects if isinstance(e, Log)]
    assert len(logs) == 1 and "an error in the program on rank 2" in logs[0] and "got 'a'" in logs[0]
    assert "every rank ends with exit status 1" in logs[0]
    assert st.stopped and st.stop_reason == "an error in the program on rank 2"
    # The same mistake on the other ranks: recorded, not said again.
    assert not [e for e in st.handle(UserError("ValueError: the master's own")) if isinstance(e, Log)]
    assert not st.handle(Received(1, Halt(1, "RuntimeError: complete() already called for task 1")))
    assert list(st.user_errors) == [2, 0, 1]


def test_another_rank_tells_the_master_and_tells_a_new_master_again():
    st = Station(build(3, Plan(2)), 2, Config(levels=2, fault_tolerance="on"), lambda: 1.0, LocalBoards(), TOTAL)
    effects = st.handle(UserError("RuntimeError: complete() already called for task 4"))
    assert effects == [Send(0, Halt(2, "RuntimeError: complete() already called for task 4"))]
    again = st.handle(Died((0,)))  # the master died with the news: its successor must stop the job too
    assert Send(1, Halt(2, "RuntimeError: complete() already called for task 4")) in again, again
