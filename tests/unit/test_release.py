"""The master's release: who is released at once, and who waits for the master's last work (its report)."""

from __future__ import annotations

import pytest

from nlevel.config import Config
from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.roles.events import Send
from nlevel.roles.ledger import Ledger
from nlevel.roles.messages import Release
from nlevel.roles.station import Station
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
