"""The checkpoint's lock (nlevel.runtime.lock): pure file logic, no MPI."""

from __future__ import annotations

import json
import os

import pytest

from nlevel.errors import CheckpointError
from nlevel.runtime import lock as L
from nlevel.runtime.status import assemble

NOW = 1_800_000_000.0


class Clock:
    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def take(ck, *, host="n1", pid=100, job="77", clock=None, alive=lambda pid: True, lines=None, **kw):
    return L.Lock.acquire(ck, host=host, pid=pid, job=job, clock=clock or Clock(), alive=alive,
                          started_of=lambda pid: None, log=(lines.append if lines is not None else None), **kw)


def test_the_lock_names_host_pid_job_and_start(tmp_path):
    ck = tmp_path / "run.h5"
    lk = take(ck)
    d = json.loads((tmp_path / "run.h5.lock").read_text())
    assert (d["host"], d["pid"], d["job_id"], d["started"], d["heartbeat"]) == ("n1", 100, "77", NOW, NOW)
    assert d["heartbeat_interval"] == L.HEARTBEAT_S and d["token"] == lk.holder.token
    lk.release()
    assert not (tmp_path / "run.h5.lock").exists()


def test_a_second_job_is_refused_naming_the_file_and_the_holder(tmp_path):
    ck = tmp_path / "run.h5"
    take(ck)
    with pytest.raises(L.LockHeld) as e:
        take(ck, pid=200)  # same host, the first pid still alive
    msg = str(e.value)
    assert f"checkpoint {ck} is in use by another job" in msg and "host n1, pid 100, job id 77" in msg
    assert "since 2027-01-15T08:00:00Z" in msg and f"{ck}.lock" in msg and "\n" not in msg
    assert isinstance(e.value, CheckpointError)


def test_a_lock_of_a_gone_process_on_this_host_is_taken_over_with_one_line(tmp_path):
    ck = tmp_path / "run.h5"
    take(ck, pid=100)
    lines: list[str] = []
    lk = take(ck, pid=200, alive=lambda pid: pid != 100, lines=lines)
    assert lk.holder.pid == 200 and json.loads((tmp_path / "run.h5.lock").read_text())["pid"] == 200
    [line] = lines
    assert "taking over the lock" in line and "pid 100 is gone" in line and "host n1, pid 100" in line
    assert sorted(os.listdir(tmp_path)) == ["run.h5.lock"]  # nothing left aside


def test_a_reused_pid_is_not_the_holder(tmp_path):
    ck = tmp_path / "run.h5"
    L.Lock.acquire(ck, host="n1", pid=100, job=None, clock=Clock(), started_of=lambda pid: 5, log=None)
    lines: list[str] = []
    lk = L.Lock.acquire(ck, host="n1", pid=200, job=None, clock=Clock(), alive=lambda pid: True,
                        started_of=lambda pid: 9, log=lines.append)
    assert lk.holder.pid == 200 and "pid 100 is now another process" in lines[0]


def test_another_hosts_lock_is_judged_by_its_heartbeat(tmp_path):
    ck = tmp_path / "run.h5"
    clock = Clock()
    take(ck, host="n2", clock=clock, interval=2.0)
    clock.t = NOW + 19.0  # under 10 intervals: held
    with pytest.raises(L.LockHeld, match="heartbeat 19 s ago"):
        take(ck, host="n1", clock=clock, alive=lambda pid: False)  # (its pid means nothing here)
    clock.t = NOW + 21.0
    lines: list[str] = []
    lk = take(ck, host="n1", clock=clock, lines=lines)
    assert lk.holder.host == "n1" and "last heartbeat was 21 s ago (stale after 20 s)" in lines[0]


def test_the_heartbeat_keeps_another_hosts_lock_held(tmp_path):
    ck = tmp_path / "run.h5"
    clock = Clock()
    lk = take(ck, host="n2", clock=clock, interval=2.0)
    for _ in range(20):
        clock.t += 1.5
        lk.beat()
    assert json.loads((tmp_path / "run.h5.lock").read_text())["heartbeat"] == pytest.approx(clock.t, abs=2.0)
    with pytest.raises(L.LockHeld):
        take(ck, host="n1", clock=clock)


def test_a_beat_is_written_at_most_once_per_interval(tmp_path):
    ck = tmp_path / "run.h5"
    clock = Clock()
    lk = take(ck, clock=clock, interval=5.0)
    clock.t += 4.0
    lk.beat()
    assert json.loads((tmp_path / "run.h5.lock").read_text())["heartbeat"] == NOW
    clock.t += 1.0
    lk.beat()
    assert json.loads((tmp_path / "run.h5.lock").read_text())["heartbeat"] == NOW + 5.0


@pytest.mark.parametrize("content", [b"", b"hello", b'{"host": "n1"}', b"[1, 2]", b'{"format": "other"}'])
def test_a_lock_file_that_is_not_ours_is_refused_and_left_alone(tmp_path, content):
    ck = tmp_path / "run.h5"
    (tmp_path / "run.h5.lock").write_bytes(content)
    with pytest.raises(L.ForeignLock) as e:
        take(ck, alive=lambda pid: False)
    assert str(e.value).startswith(f"{ck}.lock exists and is not an nlevel lock file")
    assert "nlevel will not touch it" in str(e.value) and "\n" not in str(e.value)
    assert (tmp_path / "run.h5.lock").read_bytes() == content


def test_release_leaves_a_lock_that_another_job_took(tmp_path):
    ck = tmp_path / "run.h5"
    clock = Clock()
    first = take(ck, host="n2", clock=clock, interval=1.0)
    clock.t += 100
    second = take(ck, host="n1", clock=clock, lines=[])
    lines: list[str] = []
    first.log = lines.append
    first.beat()  # it was slow, not dead: it learns it lost the lock
    assert first.lost and "no longer this job's" in lines[0]
    first.release()
    assert json.loads((tmp_path / "run.h5.lock").read_text())["token"] == second.holder.token


def test_a_new_master_adopts_its_jobs_lock_and_not_another(tmp_path):
    ck = tmp_path / "run.h5"
    lk = take(ck, pid=100)
    lines: list[str] = []
    new = L.adopt(ck, lk.holder.token, host="n3", pid=300, clock=Clock(NOW + 50), log=lines.append)
    assert new is not None and not lines
    d = json.loads((tmp_path / "run.h5.lock").read_text())
    assert (d["host"], d["pid"], d["job_id"], d["started"], d["heartbeat"]) == ("n3", 300, "77", NOW, NOW + 50)
    assert L.adopt(ck, "another-token", host="n4", pid=400, log=lines.append) is None
    assert "names another job" in lines[0]
    new.release()
    assert not (tmp_path / "run.h5.lock").exists()


def test_a_new_master_recreates_a_missing_lock(tmp_path):
    ck = tmp_path / "run.h5"
    new = L.adopt(ck, "tok", host="n3", pid=300, clock=Clock(), log=print)
    assert new is not None and json.loads((tmp_path / "run.h5.lock").read_text())["token"] == "tok"


def test_an_unwritable_directory_names_the_lock(tmp_path):
    ck = tmp_path / "no-such-dir" / "run.h5"
    with pytest.raises(CheckpointError, match=r"cannot create the lock file .*no-such-dir/run.h5.lock"):
        take(ck)


def test_status_reads_the_lock_as_written(tmp_path):
    ck = tmp_path / "run.h5"
    take(ck, host="n9", pid=11, job="5")
    lock = json.loads((tmp_path / "run.h5.lock").read_text())
    st = assemble(str(ck), None, None, lock, now=NOW + 2, this_host="login1")
    h = st["holder"]
    assert st["running"] and (h["host"], h["pid"], h["job_id"], h["since"]) == ("n9", 11, "5", NOW)


def test_job_id_comes_from_the_batch_system():
    assert L.job_id({"SLURM_JOB_ID": "42"}) == "42" and L.job_id({}) is None


def test_a_zombie_holder_is_not_alive():
    """A job killed whole leaves its ranks as zombies until reaped: their lock is stale, not in use."""
    import os
    import subprocess
    import time

    from nlevel.runtime.lock import pid_alive

    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # exited, not yet reaped: a zombie
        with open(f"/proc/{child.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.01)
    assert not pid_alive(child.pid)
    child.wait()
    assert pid_alive(os.getpid())
