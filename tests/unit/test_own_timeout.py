"""A master whose own task runs past --task-timeout: who counts it, with and without fault tolerance."""

from __future__ import annotations

import pytest

from nlevel.config import Config
from nlevel.model.hierarchy import build
from nlevel.model.plan import Plan
from nlevel.roles.events import Abandon, CheckpointLoaded, Kill, LoadCheckpoint, Overran, Send
from nlevel.roles.ledger import Ledger
from nlevel.roles.messages import TimedOut
from nlevel.roles.station import Station
from nlevel.testing.network import LocalBoards


def master_running_17(ft: str, earlier: int) -> tuple[Station, list[float]]:
    now = [0.0]
    ledger = Ledger(40)
    ledger.timeouts = {17: earlier} if earlier else {}  # (as loaded from the checkpoint of earlier runs)
    st = Station(build(4, Plan(2)), 0, Config(levels=2, fault_tolerance=ft, task_timeout=1.0), lambda: now[0],
                 LocalBoards(), 40, ledger)
    child = st.server.children[0]  # (its own worker: a child of its server)
    child.held.add(17, 18)
    now[0] = 5.0
    return st, now


@pytest.mark.parametrize("earlier", [0, 2])
def test_without_fault_tolerance_the_master_counts_its_own_timeout_before_it_leaves(earlier):
    """Given up, the master writes its ledger as it leaves; its deputy, with no copy of the ledger,
    takes over from that file: the count of earlier runs plus this one must be in it (the deputy's
    own count starts at 1, and loading keeps the larger)."""
    st, _ = master_running_17("off", earlier)
    outs = st.handle(Overran(17, 5.0))  # (the runtime's pulse saw task 17 run 5 s)
    assert st.ledger.timeouts == {17: earlier + 1}
    assert [o.dest for o in outs if isinstance(o, Send) and isinstance(o.msg, TimedOut)] == [1]  # (the deputy)
    assert [o.rank for o in outs if isinstance(o, Abandon)] == [0]
    assert st.stop_reason == "task timeout"


def test_under_fault_tolerance_the_deputy_counts_it_from_its_copy():
    st, _ = master_running_17("on", 2)
    outs = st.handle(Overran(17, 5.0))
    assert st.ledger.timeouts == {17: 2}  # (the deputy's copy counts it; the master is killed)
    assert [o.dest for o in outs if isinstance(o, Send) and isinstance(o.msg, TimedOut)] == [1]
    assert [o.rank for o in outs if isinstance(o, Kill)] == [0]


def test_a_deputy_taking_over_from_the_checkpoint_knows_the_earlier_runs_timeouts():
    """Without fault tolerance the deputy has no copy of the ledger: the timeouts of earlier runs
    come with the checkpoint, after the takeover, and must count toward quarantine then."""
    st = Station(build(4, Plan(2)), 1, Config(levels=2, fault_tolerance="off", task_timeout=1.0), lambda: 0.0,
                 LocalBoards(), 40)
    outs = st.fail((0,), "ran task 17 past --task-timeout 1 s")
    assert any(isinstance(o, LoadCheckpoint) for o in outs) and st.is_master
    ledger = Ledger(40)
    ledger.timeouts = {17: 2}
    st.recovery.loaded(CheckpointLoaded(ledger, ""))
    assert st.server.deaths.count(17) == 2 and 17 in st.server.suspects


@pytest.mark.parametrize("ft", ["off", "on"])
def test_the_last_rank_gives_itself_up_and_counts_its_ids_death_itself(ft):
    """A one-process job: nobody takes over, and killed (under fault tolerance) nobody would end
    the job. The rank is given up, its ids count a death here (the third: quarantined), the job
    stops, the death is recorded for the report, and it leaves the job to end (the runtime then
    writes the checkpoint and the report, and exits with its status)."""
    now = [0.0]
    ledger = Ledger(40)
    ledger.timeouts = {17: 2}
    st = Station(build(1, Plan(2)), 0, Config(levels=2, fault_tolerance=ft, task_timeout=1.0), lambda: now[0],
                 LocalBoards(), 40, ledger)
    child = st.server.children[0]
    child.held.add(17, 18)
    now[0] = 5.0
    outs = st.handle(Overran(17, 5.0))
    assert st.watching.alone and [o.rank for o in outs if isinstance(o, Abandon)] == [0]
    assert not [o for o in outs if isinstance(o, Kill)]
    assert st.watching.abandon_self("ran task 17 past --task-timeout 1 s") == []  # (nobody to tell)
    assert list(ledger.failed) == [17] and ledger.failed[17].kind == "timeout"
    assert st.stopped and st.stop_reason == "task timeout"  # (under fault tolerance too: nobody runs the rest)
    [f] = st.recovery.failures
    assert (f.rank, f.role, f.how, f.detected_by, f.held, f.requeued, f.quarantined) == \
        (0, "master", "ran task 17 past --task-timeout 1 s", 0, 1, 0, (17,))


def test_a_task_is_told_overrun_once_and_only_with_a_limit():
    st, _ = master_running_17("on", 0)
    assert [type(o).__name__ for o in st.handle(Overran(17, 5.0))].count("Kill") == 1
    assert st.handle(Overran(17, 6.0)) == []  # (being killed already)
    st2 = Station(build(4, Plan(2)), 2, Config(levels=2, fault_tolerance="on"), lambda: 0.0, LocalBoards(), 40)
    assert st2.handle(Overran(3, 1e6)) == []  # (no --task-timeout: a long task is never the lease's business)


@pytest.mark.parametrize("ft", ["off", "on"])
def test_a_slave_past_the_limit_tells_its_parent_which_counts_the_timeout(ft):
    st = Station(build(4, Plan(2)), 2, Config(levels=2, fault_tolerance=ft, task_timeout=1.0), lambda: 0.0,
                 LocalBoards(), 40)
    outs = st.handle(Overran(9, 1.5))
    [notice] = [o for o in outs if isinstance(o, Send) and isinstance(o.msg, TimedOut)]
    assert notice.dest == 0 and notice.msg.ids == ((9, 10),) and notice.msg.rank == 2
    assert [type(o) for o in outs if isinstance(o, (Kill, Abandon))] == [Kill if ft == "on" else Abandon]


def test_a_new_master_publishes_nothing_until_its_checkpoint_is_loaded_and_drops_what_the_file_records():
    """Between its takeover and its ledger from the checkpoint file, what a new master queues
    (a survivor's given-back ids, say) may be committed in the file: published then, it ran twice."""
    from nlevel.roles.events import Tick

    st = Station(build(4, Plan(2)), 1, Config(levels=2, fault_tolerance="off"), lambda: 0.0, LocalBoards(), 40)
    outs = st.fail((0,), "exited")
    assert any(isinstance(o, LoadCheckpoint) for o in outs) and st.loading
    st.server.take_back([(5, 10)])
    st.handle(Tick())
    assert not st.server.published()  # (nothing out while what is committed is unknown)
    ledger = Ledger(40)
    ledger.commit([(0, 8)], ())
    st.handle(CheckpointLoaded(ledger, ""))
    assert not st.loading
    out = st.server.queue.copy()
    out.add_ranges(st.server.published().ranges())
    assert out.overlap(0, 8) == 0 and out.overlap(8, 10) == 2
