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


class RecordingWindow:
    """Stands for an MPI window: records each one-sided call's buffers and target datatype."""

    def __init__(self):
        self.calls = []

    def _record(self, name, buffers, target=None):
        self.calls.append((name, buffers, target))

    def Accumulate(self, origin, rank, target, op):
        self._record("Accumulate", [origin], target)

    def Get_accumulate(self, origin, result, rank, target, op):
        self._record("Get_accumulate", [origin, result], target)

    def Fetch_and_op(self, origin, result, rank, disp, op):
        self._record("Fetch_and_op", [origin, result])

    def Compare_and_swap(self, origin, compare, result, rank, disp):
        self._record("Compare_and_swap", [origin, compare, result])

    def Flush(self, rank):
        pass

    def Set_errhandler(self, handler):
        pass

    def Lock_all(self):
        pass


def test_every_window_operation_names_one_datatype_for_origin_and_target(monkeypatch):
    """An accumulate's origin and target must share their basic datatype. A bare numpy int64 buffer
    is MPI_LONG to mpi4py, not MPI_INT64_T: Open MPI's osc/rdma (a window across nodes) refused the
    board's initialisation with MPI_ERR_TYPE, and every rank fell back to two-sided grants."""
    import types

    import numpy as np
    from mpi4py import MPI

    from nlevel.runtime import window

    win = RecordingWindow()
    fake_mpi = types.SimpleNamespace(
        Win=types.SimpleNamespace(Allocate=lambda size, unit, info, comm: win),
        INFO_NULL=MPI.INFO_NULL, ERRORS_RETURN=MPI.ERRORS_RETURN, Exception=MPI.Exception,
        REPLACE=MPI.REPLACE, SUM=MPI.SUM, NO_OP=MPI.NO_OP, INT64_T=MPI.INT64_T)
    monkeypatch.setattr(window, "MPI", fake_mpi)
    boards, _, problem = window.allocate(comm=None, rank=0, slots=(64, 16))
    assert problem == "" and boards is not None
    mem = boards(0, 0)
    mem.get(0)
    mem.read(0, 1)
    mem.read(0, 5)
    mem.write(3, np.arange(4))
    mem.put(1, 7)
    mem.cas(1, 7, 8)
    assert {c[0] for c in win.calls} == {"Accumulate", "Get_accumulate", "Fetch_and_op", "Compare_and_swap"}
    for name, buffers, target in win.calls:
        for buf in buffers:
            assert isinstance(buf, list) and buf[-1] == MPI.INT64_T, (name, buf)
        if target is not None:
            assert target[-1] == MPI.INT64_T, (name, target)


def test_under_fault_tolerance_a_window_across_nodes_is_not_used():
    """Across nodes (osc/rdma) an atomic on a rank that has exited blocked for ever: the end of a
    ULFM job on the emulated cluster hung every time. One node, or no fault tolerance: allowed."""
    from nlevel.runtime.window import cross_node_problem

    assert cross_node_problem(True, ["node1", "node1", "node2", "node3"]).startswith("the window spans 3 nodes (node1, node2, node3)")
    assert cross_node_problem(True, ["vm"] * 8) == ""
    assert cross_node_problem(False, ["node1", "node2"]) == ""
