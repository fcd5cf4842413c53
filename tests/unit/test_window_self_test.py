"""The window's set-up self-test (``nlevel.runtime.window.self_test_problem``), decided without MPI."""

from __future__ import annotations

from nlevel.runtime.window import self_test_problem


def test_any_start_of_consecutive_values_passes_negative_too():
    """The tested word is not initialised: a window in a freed one's memory may hold anything.
    A second farm in one process once saw a negative word and fell back to two-sided grants."""
    assert self_test_problem([5, 3, 4]) == ""
    assert self_test_problem([-9_000_000_000]) == ""
    assert self_test_problem([-2, -1, -3]) == ""


def test_a_failed_operation_or_values_atomics_cannot_give_fail():
    assert self_test_problem([0, None, 2]) == "see the message above"
    assert "saw [0, 2, 3] from 3 atomic additions (expected 3 consecutive values)" in self_test_problem([0, 2, 3])
