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
    assert L.read_holder(lk.path).heartbeat == pytest.approx(clock.t, abs=2.0)
    with pytest.raises(L.LockHeld):
        take(ck, host="n1", clock=clock)


def test_a_beat_is_written_at_most_once_per_interval(tmp_path):
    ck = tmp_path / "run.h5"
    clock = Clock()
    lk = take(ck, clock=clock, interval=5.0)
    clock.t += 4.0
    lk.beat()
    assert L.read_holder(lk.path).heartbeat == NOW
    clock.t += 1.0
    lk.beat()
    assert L.read_holder(lk.path).heartbeat == NOW + 5.0


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
    assert first.lost and first.lost.startswith("it now names host n1")
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


def test_a_beat_never_writes_over_a_lock_another_job_took_meanwhile(tmp_path, monkeypatch):
    """Issue 34: the beat read the lock (its own), then replaced the file: a job that took the lock
    over in between (the first job's heartbeat had stopped for a while) lost it to a slow job that
    did not know, and both wrote the checkpoint. Now the slow job learns it lost it; the other keeps it."""
    ck = tmp_path / "run.h5"
    clock = Clock()
    slow = take(ck, host="n2", clock=clock, interval=1.0)
    clock.t += 100  # (its heartbeat stopped: 100 intervals)
    other: list[L.Lock] = []
    tried: list[bool] = []

    def takeover() -> None:
        if not tried:  # (once: the take-over's own calls come through here too)
            tried.append(True)
            other.append(take(ck, host="n1", clock=clock, lines=[]))

    # The other job takes the lock over right after the slow one has found its own token in it.
    if hasattr(L, "_write_replace"):  # (the beat before the fix: read, then os.replace)
        real = L._write_replace
        monkeypatch.setattr(L, "_write_replace", lambda *a: (takeover(), real(*a)))
    else:
        real_utime = os.utime
        monkeypatch.setattr(L.os, "utime", lambda *a, **k: (takeover(), real_utime(*a, **k)))
    lines: list[str] = []
    slow.log = lines.append
    why = slow.beat()
    assert other, "the take-over did not happen"
    assert L.read_holder(slow.path).token == other[0].holder.token, "the slow job wrote over the other's lock"
    assert slow.lost and why == slow.lost and why.startswith("it now names host n1")
    assert slow.beat() == why and not lines  # (lost for good; the caller says it)


def test_a_take_over_puts_back_a_lock_whose_heartbeat_came_back(tmp_path, monkeypatch):
    """The other side of the race: the holder beats after a second job judged its lock stale and
    before it moved the lock aside; the second job looks again at what it moved and puts it back."""
    ck = tmp_path / "run.h5"
    clock = Clock()
    slow = take(ck, host="n2", clock=clock, interval=1.0)
    clock.t += 100
    real_rename = os.rename

    def beat_first(src, dst):  # (the holder's beat lands between the judgement and the move)
        if str(dst).endswith(f"stale-{__import__('socket').gethostname()}-{os.getpid()}"):
            assert slow.beat() is None
        return real_rename(src, dst)

    monkeypatch.setattr(L.os, "rename", beat_first)
    with pytest.raises(CheckpointError, match="other jobs keep creating and removing it|in use by another job"):
        take(ck, host="n1", clock=clock, lines=[])
    assert L.read_holder(slow.path).token == slow.holder.token and slow.lost is None


def test_a_lost_lock_stops_the_job_cleanly_and_its_checkpoint_is_not_written_again(tmp_path, monkeypatch):
    """Issue 34: losing the lock was only logged; the job went on writing a checkpoint another job owned."""
    from types import SimpleNamespace

    from nlevel.config import Config
    from nlevel.model.plan import Plan
    from nlevel.roles.ledger import Ledger
    from nlevel.runtime import checkpoint as ckpt
    from nlevel.runtime.rank import MpiPort
    from nlevel.testing.network import Network

    # The loop: a heartbeat that says the lock is gone stops the job ("lock"), said once.
    net = Network(4, Plan(2), 3000, 0, config=Config(levels=2, fault_tolerance="off"))
    looks: list[int] = []

    def heartbeat() -> str:
        looks.append(1)
        return "the lock run.h5.lock is not this job's any more (it now names host n9)" if len(looks) > 30 else ""

    net.ports[0].heartbeat = heartbeat
    out = net.run()
    st = out.stations[0]
    assert st.stopped and st.stop_reason == "lock" and out.ledger.n_committed < 3000
    assert sum("stopping the job" in line for line in net.ports[0].logs) == 1
    assert net.loops[0].checkpoint_error.startswith("the lock run.h5.lock is not this job's")

    # The port: once the lock is another job's, nothing more is written to the checkpoint.
    path = tmp_path / "run.h5"
    meta = ckpt.RunMeta(10, "f" * 64, "{}", "{}", "0")
    port = MpiPort(SimpleNamespace(rank=0), Config(), str(path), meta, ckpt.Writer(path, meta), 1)
    port.lock = take(path)
    led = Ledger(10, [(0, 3)])
    assert port.heartbeat() == "" and port.write_checkpoint(led, True) == ""
    port.writer = ckpt.Writer(path, meta)
    before = os.stat(path).st_mtime_ns
    monkeypatch.setattr(port.lock, "beat", lambda force=False: "it now names host n9, pid 1, job id -, since ?")
    said = port.heartbeat()
    assert said.startswith(f"the lock {path}.lock is not this job's any more (it now names host n9")
    assert "which this job does not write again" in said
    assert port.write_checkpoint(Ledger(10, [(0, 5)]), False) == said
    assert port.write_checkpoint(Ledger(10, [(0, 10)]), True) == said
    assert isinstance(port.checkpoint_error, CheckpointError) and os.stat(path).st_mtime_ns == before


def test_status_sees_the_heartbeat_in_the_lock_files_time(tmp_path):
    """The beat refreshes the file's modification time, not its text: python -m nlevel.status reads both."""
    from nlevel.runtime.status import read_lock

    ck = tmp_path / "run.h5"
    clock = Clock()
    lk = take(ck, host="n9", pid=11, clock=clock, interval=5.0)
    clock.t += 600
    assert lk.beat() is None
    lock = read_lock(lk.path)
    assert lock["heartbeat"] == pytest.approx(NOW + 600) and json.loads(open(lk.path).read())["heartbeat"] == NOW
    assert assemble(str(ck), None, None, lock, now=NOW + 602, this_host="login1")["running"]
