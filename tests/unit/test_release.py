"""The master's release: who is released at once, and who waits for the master's last work (its report)."""

from __future__ import annotations

import pytest

from nlevel.config import Config
from nlevel.roles.ending import told_first
from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.roles.events import Send
from nlevel.roles.ledger import Ledger
from nlevel.roles.messages import Ending, FailureRecord, Release
from nlevel.roles.station import Station
from nlevel.stats import Summary
from nlevel.testing.network import LocalBoards


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
    assert released(st.release(75, {})) == [(1, True)]  # (the deputy is told first, as always)
    assert released(st.release_deputy()) == [(5, False), (4, False), (2, False), (1, False)]
    assert st.release_deputy() == []  # once


@pytest.mark.parametrize("ft,failed,now,held", [
    ("off", frozenset(), [(1, True), (5, False), (4, False), (3, False), (2, False), (1, False)], []),
    ("on", frozenset({3}), [(1, True), (1, True), (5, False), (4, False), (2, False)], [(1, False)]),
    ("on", frozenset(), [(1, True), (1, True), (5, False), (4, False), (3, False), (2, False)], [(1, False)]),
])
def test_otherwise_only_the_deputy_waits_and_only_under_fault_tolerance(ft, failed, now, held):
    st = master(ft, failed)
    assert released(st.release(0, {})) == now
    assert released(st.release_deputy()) == held


def ended(st: Station, children: list[int]) -> Station:
    """``st`` with an Ending from each of ``children``: one task each, and rank 3 a death it recorded."""
    for c in children:
        tasks = Summary()
        tasks.add(0.5)
        failures = [FailureRecord(5, "slave", 1, "exited", 3, 10.0, 1).to_dict()] if c == 3 else []
        st.on_ending(c, Ending(({"rank": c, "tasks": 1},), {"tasks": tasks, "requests": {}, "unexpected": 0,
                                                             "failures": failures, "timeline": {}}))
    return st


def test_under_fault_tolerance_the_deputy_is_sent_every_ranks_row_with_its_release():
    """A master that dies once it has released its deputy leaves the whole report's rows behind
    (they went only up the tree: the deputy's report lacked every other rank's row). They come
    in a second message: the first, small, arrives however the master dies; both before anyone
    else is released."""
    st = ended(master("on", frozenset()), [1, 2, 3, 4, 5])
    outs = st.release(0, {"complete": True})
    assert told_first(outs) == 2
    small, second = outs[0].msg, outs[1].msg
    assert outs[1].dest == 1 and second.pending and small.pending and small.ending is None
    whole = second.ending
    assert [r["rank"] for r in whole.rows] == [0, 1, 2, 3, 4, 5]
    assert whole.stats["tasks"].n == 5 and [f["rank"] for f in whole.stats["failures"]] == [5]
    outs = ended(master("off", frozenset()), [1, 2, 3, 4, 5]).release(0, {})
    assert told_first(outs) == 1 and outs[0].msg.ending is None  # (no takeover without fault tolerance)


def test_a_deputy_that_finishes_a_dead_masters_release_reports_every_rank_and_passes_them_on():
    whole = ended(master("on", frozenset()), [1, 2, 3, 4, 5]).release(0, {"complete": True})[1].msg.ending
    cfg = Config(levels=2, fault_tolerance="on")
    dep = Station(build(6, Plan(2)), 1, cfg, lambda: 0.0, LocalBoards(), 10)
    dep.on_release(Release(0, (), {"complete": True}, pending=True, ending=whole))
    mirrored = FailureRecord(5, "slave", 1, "exited", 3, 10.0, 1)  # (also in rank 3's Ending)
    death = FailureRecord(0, "master", 0, "ulfm", 1, 20.0, 0)
    dep.failures = [mirrored, death]
    dep.failed = {0}
    dep.hierarchy = build(6, Plan(2), frozenset({0}))
    dep.finished_release = True
    rows, stats = dep.end_payload(partial=True)
    assert [r["rank"] for r in rows] == [0, 1, 2, 3, 4, 5] and stats["tasks"].n == 5
    assert [(f["rank"], f["how"]) for f in stats["failures"]] == [(5, "exited"), (0, "ulfm")]  # (once each)
    assert dep.written_by()["rank"] == 1 and "every rank's statistics" in dep.written_by()["why"]
    outs = dep.release(0, {"complete": True})
    assert told_first(outs) == 2 and outs[1].dest == 2
    assert [r["rank"] for r in outs[1].msg.ending.rows] == [0, 1, 2, 3, 4, 5]  # (should it die in turn)


def test_a_deputy_sent_no_rows_says_they_were_lost():
    dep = Station(build(6, Plan(2)), 1, Config(levels=2, fault_tolerance="on"), lambda: 0.0, LocalBoards(), 10)
    dep.on_release(Release(0, (), {"complete": True}, pending=True))
    dep.finished_release = True
    assert [r["rank"] for r in dep.end_payload(partial=True)[0]] == [1]
    assert "lost with the master" in dep.written_by()["why"]
