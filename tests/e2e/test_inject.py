"""The fault-injection harness itself: roles by the library's rule, processes found by environment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from nlevel.testing import inject
from nlevel.testing.inject import Schedule, candidates, find_ranks, new_leader, plan_of, roles

from ..conftest import ROOT

P3 = plan_of(3, (2,))   # 8 ranks: [0..3] led by the master 0, [4..7] by region-master 4
P4 = plan_of(4, (2, 2))  # 8 ranks: region-masters 2, 4, 6


def test_roles_of_a_three_level_plan():
    r = roles(8, P3)
    assert r[0] == "master" and r[4] == "region-master"
    assert sorted(k for k, v in r.items() if v == "slave") == [1, 2, 3, 5, 6, 7]
    assert candidates(8, P3, "region-master") == [4]
    assert candidates(8, P3, "any") == list(range(8))
    assert candidates(8, plan_of(2), "slave") == list(range(1, 8))


def test_dead_ranks_have_no_role_and_the_lowest_survivor_leads():
    r = roles(8, P3, frozenset({4}))
    assert 4 not in r and r[5] == "region-master"
    r = roles(8, P3, frozenset({0}))
    assert 0 not in r and r[1] == "master" and r[4] == "region-master"
    assert candidates(8, P3, "master", frozenset({0, 1})) == [2]


def test_new_leader_is_the_lowest_survivor_of_the_victims_block():
    assert new_leader(8, P3, 4) == 5
    assert new_leader(8, P3, 4, frozenset({5})) == 6
    assert new_leader(8, P3, 0) == 1
    assert new_leader(8, P3, 0, frozenset({1, 2})) == 3
    assert new_leader(8, P3, 3) is None  # a slave leads nothing
    assert new_leader(8, P4, 6) == 7
    assert new_leader(8, P4, 2) == 3
    # The last rank of a region: nobody is left to lead it.
    assert new_leader(8, P3, 7, frozenset({4, 5, 6})) is None


def test_schedule_refuses_bad_values():
    with pytest.raises(ValueError, match="role must be one of"):
        Schedule(role="boss")
    with pytest.raises(ValueError, match="signal must be one of"):
        Schedule(signal="HUP")
    with pytest.raises(ValueError, match="count must be >= 1"):
        Schedule(count=0)


def test_marker_entry():
    assert inject.marker_entry("j1") == "NLEVEL_INJECT_JOB=j1"
    assert inject.marker_entry("NLEVEL_TEST_LOG_DIR=/x") == "NLEVEL_TEST_LOG_DIR=/x"


@pytest.fixture
def fake_job(request):
    """Start sleeping processes that look like a job's ranks from outside; kill them after."""
    marker = f"test-{uuid.uuid4().hex[:8]}"
    procs: list[subprocess.Popen] = []

    def start(rank: int | None, var: str = "OMPI_COMM_WORLD_RANK", cmd=None) -> subprocess.Popen:
        env = {"PATH": os.environ.get("PATH", ""), inject.MARKER_VAR: marker}
        if rank is not None:
            env[var] = str(rank)
        p = subprocess.Popen(cmd or ["sleep", "60"], env=env, start_new_session=True)
        procs.append(p)
        return p

    def stop():
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
        inject.kill_job(None, marker, grace=2)

    request.addfinalizer(stop)
    start.marker = marker  # type: ignore[attr-defined]
    return start


def wait_found(marker, n, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = find_ranks(marker)
        if len(found) >= n:
            return found
        time.sleep(0.01)
    return find_ranks(marker)


def test_find_ranks_reads_the_rank_from_the_environment_and_skips_the_launcher(fake_job):
    launcher = fake_job(None)
    a = fake_job(0)
    b = fake_job(1, "PMIX_RANK")
    c = fake_job(2, "PMI_RANK")
    found = wait_found(fake_job.marker, 3)
    assert found == {0: a.pid, 1: b.pid, 2: c.pid}
    assert launcher.pid in inject.marked_pids(fake_job.marker)
    assert find_ranks("no-such-job-" + uuid.uuid4().hex) == {}


def test_a_ranks_child_process_is_not_taken_for_the_rank(fake_job):
    # The rank runs a shell that starts a child: both carry rank 3; the parent is the rank.
    parent = fake_job(3, cmd=["sh", "-c", "sleep 60 & wait"])
    deadline = time.monotonic() + 5
    while len([p for p in inject.marked_pids(fake_job.marker)]) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(inject.marked_pids(fake_job.marker)) == 2
    assert find_ranks(fake_job.marker) == {3: parent.pid}


def test_inject_kills_the_chosen_role_and_logs_it(fake_job):
    ranks = {r: fake_job(r) for r in range(8)}
    t0 = time.time()
    kills = inject.inject(fake_job.marker, 8, P3, Schedule(role="region-master", then_new_leader=0.05),
                          timeout=10)
    assert [(k.rank, k.role, k.signal) for k in kills] == [(4, "region-master", "KILL"), (5, "new-leader", "KILL")]
    assert kills[1].time - kills[0].time >= 0.05 and kills[0].time >= t0
    for k in kills:
        assert k.pid == ranks[k.rank].pid
        assert ranks[k.rank].wait(timeout=5) == -signal.SIGKILL
    assert all(ranks[r].poll() is None for r in (0, 1, 2, 3, 6, 7))


def process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat (R, S, T for stopped, Z, ...)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0].decode()


def wait_stopped(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process_state(pid) == "T":
            return True
        time.sleep(0.01)
    return False


def test_several_victims_are_chosen_given_the_earlier_ones_are_dead(fake_job):
    ranks = {r: fake_job(r) for r in range(8)}
    kills = inject.inject(fake_job.marker, 8, P3, Schedule(role="master", count=2), timeout=10)
    assert [k.rank for k in kills] == [0, 1]  # the second is the newly elected master
    assert all(ranks[r].wait(timeout=5) == -signal.SIGKILL for r in (0, 1))
    # A second injection into the same job: the dead are not waited for, nor chosen.
    kills = inject.inject(fake_job.marker, 8, P3, Schedule(role="slave", count=3, seed=7, signal="STOP"),
                          timeout=10, dead=frozenset({0, 1}))
    assert len({k.rank for k in kills}) == 3
    assert all(roles(8, P3, frozenset({0, 1}))[k.rank] == "slave" for k in kills)
    assert all(wait_stopped(ranks[k.rank].pid) for k in kills)
    assert all(ranks[r].poll() is None and process_state(ranks[r].pid) != "T"
               for r in set(range(2, 8)) - {k.rank for k in kills})


def test_inject_refuses_to_kill_everyone():
    with pytest.raises(ValueError, match="leaves no survivor"):
        inject.inject("x", 3, plan_of(2), Schedule(count=3), timeout=0.1)


def test_inject_gives_up_when_the_ranks_never_appear(fake_job):
    ranks = {r: fake_job(r) for r in range(4)}
    wait_found(fake_job.marker, 4)
    # Where only some ranks appear (0 and 1 of 4 here: the marker matches a job of 2 ranks
    # asked about as 4), it waits out the timeout, says why, and kills nothing.
    ranks[2].kill(), ranks[3].kill()
    ranks[2].wait(timeout=5), ranks[3].wait(timeout=5)
    said: list[str] = []
    t0 = time.monotonic()
    assert inject.inject(fake_job.marker, 4, plan_of(2), Schedule(role="any", count=1), timeout=0.3,
                         log=said.append) == []
    assert time.monotonic() - t0 >= 0.3
    assert said == ["inject: only ranks [0, 1] of 4 appeared; no kill"]
    assert ranks[0].poll() is None and ranks[1].poll() is None
    # No process at all carries the marker: the same.
    said.clear()
    assert inject.inject("none-" + uuid.uuid4().hex, 4, plan_of(2), Schedule(), timeout=0.2, log=said.append) == []
    assert said == ["inject: only ranks [] of 4 appeared; no kill"]
    # The same call once every rank is there kills, really: the give-up above is not a no-op.
    kills = inject.inject(fake_job.marker, 2, plan_of(2), Schedule(role="slave", count=1), timeout=10)
    assert [(k.rank, k.pid) for k in kills] == [(1, ranks[1].pid)]
    assert ranks[1].wait(timeout=5) == -signal.SIGKILL and ranks[0].poll() is None


def test_kill_job_removes_stopped_processes(fake_job):
    p = fake_job(0)
    wait_found(fake_job.marker, 1)
    os.kill(p.pid, signal.SIGSTOP)
    assert inject.kill_job(None, fake_job.marker, grace=5)
    assert p.wait(timeout=5) == -signal.SIGKILL


def test_cli_injects_into_a_running_job_and_writes_the_log(fake_job, tmp_path):
    procs = {r: fake_job(r) for r in range(4)}
    log = tmp_path / "kills.json"
    rc = subprocess.run(
        [sys.executable, "-m", "nlevel.testing.inject", "--job-marker", fake_job.marker, "--size", "4",
         "--levels", "2", "--role", "slave", "--count", "2", "--signal", "TERM", "--seed", "3",
         "--after", "0.05", "--log", str(log)],
        cwd=ROOT, timeout=60,
    ).returncode
    assert rc == 0
    kills = json.loads(log.read_text())["kills"]
    assert len(kills) == 2 and {k["signal"] for k in kills} == {"TERM"}
    for k in kills:
        assert k["rank"] != 0 and procs[k["rank"]].wait(timeout=5) == -signal.SIGTERM


def test_audit_checks_the_promise_from_checkpoint_logs_and_report(tmp_path):
    import numpy as np

    from nlevel.runtime import checkpoint as ckpt

    meta = ckpt.RunMeta(10, "f", "{}", "{}", "test")
    ckpt.write(tmp_path / "run.h5", meta, ckpt.Snapshot(np.array([[0, 8]]), [], []))
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "exec-1.log").write_text("0\n1\n2\n3\n")
    (logs / "exec-2.log").write_text("4\n5\n")       # rank 2 was killed holding 4 and 5
    (logs / "exec-3.log").write_text("4\n5\n6\n1\n")  # 1 ran twice, never on a dead rank
    kills = [inject.Kill(100.0, 2, 1234, "slave", "KILL"), inject.Kill(100.5, 5, 1235, "slave", "STOP")]
    report = {"recomputed": 0, "failures": [
        {"rank": 2, "role": "slave", "detected_at": 100.008, "recovered_at": 100.010, "recovery_ms": 2.0,
         "requeued": 2, "held": [4, 5]}]}
    a = inject.audit(10, [logs], tmp_path / "run.h5", report, kills)
    assert a["committed"] == 8 and a["lost"] == 2 and a["double_commits"] == 0
    assert a["never_ran"] == 1  # 7 is committed but no log shows it running
    assert a["re_executed"] == 3 and a["bound"] == 2 and a["within_bound"] is False
    assert a["re_executed_elsewhere"] == [1]
    assert a["unreported"] == [5]
    f = a["failures"][0]
    assert f["detect_ms"] == pytest.approx(8.0) and f["kill_to_recovered_ms"] == pytest.approx(10.0)
    assert f["recovery_ms"] == 2.0 and a["failures"][1]["detect_ms"] is None
    assert not inject.audit(10, [logs], tmp_path / "missing.h5", None, [])["checkpoint_readable"]


def test_percentile_is_nearest_rank():
    assert inject.percentile([], 50) is None
    assert inject.percentile(list(range(1, 11)), 50) == 5
    assert inject.percentile(list(range(1, 101)), 99) == 99
    assert inject.percentile([3.0], 99) == 3.0


def test_blast_radius_is_each_victim_and_its_subtree_when_it_died():
    assert inject.blast_radius(8, P3, [5]) == {5}
    assert inject.blast_radius(8, P3, [4]) == {4, 5, 6, 7}
    assert inject.blast_radius(8, P3, [0]) == set(range(8))
    # Region-master 4 dies, then its successor 5 (which then serves 6 and 7).
    assert inject.blast_radius(8, P3, [4, 5]) == {4, 5, 6, 7}
    assert inject.blast_radius(8, P4, [2, 6]) == {2, 3, 6, 7}
