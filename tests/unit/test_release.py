"""The master's release: who is released at once, and who waits for the master's last work (its report)."""

from __future__ import annotations

import pytest

from nlevel.config import Config
from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.roles.events import NeedIds, Received, ReleaseJob, Send
from nlevel.roles.ledger import Ledger
from nlevel.roles.loop import Loop
from nlevel.roles.messages import Release
from nlevel.roles.station import Station
from nlevel.testing.network import LocalBoards, Network


def master(ft: str, failed: frozenset[int]) -> Station:
    st = Station(build(6, Plan(2)), 0, Config(levels=2, fault_tolerance=ft), lambda: 0.0, LocalBoards(), 10, Ledger(10))
    st.failed = failed
    return st


def released(effects: list) -> list[tuple[int, bool]]:
    out = []
    for e in effects:
        assert isinstance(e, Send) and isinstance(e.msg, Release)
        out.append((e.dest, e.msg.pending))
    return out


def test_without_fault_tolerance_a_job_that_gave_a_rank_up_releases_nobody_before_the_masters_last_work():
    """A given-up rank keeps its process, so every process ends on its own with the job's status,
    and mpiexec ends the whole job at the first non-zero exit: a rank released at once killed the
    master before it wrote its report (the next run read the last run's report)."""
    st = master("off", frozenset({3}))
    assert released(st.closing.release(75, {})) == [(1, True)]  # (the deputy is told first, as always)
    assert released(st.closing.release_deputy()) == [(5, False), (4, False), (2, False), (1, False)]
    assert st.closing.release_deputy() == []  # once


@pytest.mark.parametrize("ft,failed,now,held", [
    ("off", frozenset(), [(1, True), (5, False), (4, False), (3, False), (2, False), (1, False)], []),
    ("on", frozenset({3}), [(1, True), (5, False), (4, False), (2, False)], [(1, False)]),
    ("on", frozenset(), [(1, True), (5, False), (4, False), (3, False), (2, False)], [(1, False)]),
])
def test_otherwise_only_the_deputy_waits_and_only_under_fault_tolerance(ft, failed, now, held):
    st = master(ft, failed)
    assert released(st.closing.release(0, {})) == now
    assert released(st.closing.release_deputy()) == held


@pytest.mark.parametrize("failed,now,held", [
    (frozenset(), [(1, True), (5, False), (4, False), (3, False), (2, False), (1, False)], []),
    (frozenset({3}), [(1, True), (5, False), (4, False), (2, False)], [(1, False)]),
])
def test_under_fault_tolerance_the_deputy_waits_only_for_last_work_that_outlives_the_master(failed, now, held):
    """No checkpoint and no report file: nothing for the deputy to take over, it is released with
    everyone. After a death it still waits (a rank given up: the launcher is told first)."""
    st = master("on", failed)
    assert released(st.closing.release(0, {}, last_work=False)) == now
    assert released(st.closing.release_deputy()) == held


class _Recording:
    """The part of a port the end uses, recording what it is asked in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def send(self, dest, msg):
        self.calls.append(("send", dest, msg.pending))

    def given_up_end(self, code, given_up):
        self.calls.append(("given_up_end", code, given_up))


def test_the_loop_sends_the_held_releases_once_after_saying_the_job_ended_with_ranks_given_up():
    """The launcher waits for every process, and a rank given up may never end: the master says the
    job is over (runtime: end.json) before the releases it held back, once."""
    st = master("off", frozenset({3}))
    st.recovery.given_up = {3}
    port = _Recording()
    loop = Loop(st, port)  # type: ignore[arg-type]
    loop.handle(ReleaseJob(75))
    assert port.calls == [("send", 1, True)]
    assert loop.report_done()
    assert port.calls[1:] == [("given_up_end", 75, (3,)), ("send", 5, False), ("send", 4, False), ("send", 2, False),
                              ("send", 1, False)]
    assert not loop.report_done() and len(port.calls) == 6  # once


@pytest.mark.parametrize("ft", ["on", "off"])
def test_the_in_process_farm_is_released_by_the_masters_loop_once_every_rank_has_ended(ft):
    net = Network(6, Plan(2), 60, seed=1, config=Config(levels=2, fault_tolerance=ft))
    loop = net.loops[0]
    assert not loop.release()  # (nobody has ended yet)
    out = net.run()
    assert out.report is not None and out.report["master"] == 0 and len(out.report["rows"]) == 6
    assert all(st.closing.released is not None for st in net.stations)
    assert loop.final_written and net.disk is not None and net.disk.n_committed == 60
    assert not loop.release() and not loop.report_done()  # once each


def test_a_master_that_released_the_job_no_longer_watches_the_ranks_it_released():
    """Released ranks exit while the master writes its report: found gone then, they were recorded as
    failures of a job that had none (CI: a 3,000-id job with one slave killed reported four deaths)."""
    from nlevel.roles.events import Watch
    from nlevel.roles.recovery import WATCH_PERIOD

    now = [0.0]
    st = Station(build(6, Plan(2)), 0, Config(levels=2, fault_tolerance="on"), lambda: now[0], LocalBoards(), 10,
                 Ledger(10))
    now[0] = 2 * WATCH_PERIOD
    assert [e.ranks for e in st.watching.watch() if isinstance(e, Watch)] == [(1, 2, 3, 4, 5)]
    st.closing.release(0, {})
    now[0] = 4 * WATCH_PERIOD
    assert st.watching.watch() == []


def test_ranks_the_master_released_are_no_failures_when_they_exit_but_its_held_deputy_is():
    """Under ULFM a released rank's exit is a death: told while the master writes its report, it was
    recorded as a failure of the job (CI: a cluster job with a node given up listed a healthy rank)."""
    from nlevel.roles.events import Died

    st = master("on", frozenset())
    st.closing.release(0, {})
    assert st.handle(Died((2, 5), "ulfm")) == [] and not st.recovery.failures and not st.failed
    st.handle(Died((1,), "ulfm"))  # (the deputy, whose release waits for the report: it died first)
    assert [f.rank for f in st.recovery.failures] == [1] and st.failed == {1}
    st.closing.release_deputy()
    assert st.closing.let_go == {1, 2, 3, 4, 5}


class _Untouchable(LocalBoards):
    """Boards that fail the test when anyone reads them."""

    def __call__(self, rank, kind):
        raise AssertionError(f"rank {rank}'s board {kind} was asked after the release")


def test_a_released_leaf_asks_its_parents_board_nothing():
    """A leaf whose early Ending let the master release everyone, and that reads its Release before
    its next claim, claims nothing: its parent, released too, may have left, and under two-sided
    grants a question it never answers hung the leaf for good (CI, 4 ranks, 3 levels, ULFM)."""
    st = Station(build(4, Plan(3, (2,))), 3, Config(levels=3, fault_tolerance="on"), lambda: 0.0, _Untouchable(), 10,
                 None)
    st.handle(Received(0, Release(0)))
    assert st.handle(NeedIds(None)) == [] and st.hand is None and st.ended
