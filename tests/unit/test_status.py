"""``python -m nlevel.status`` (issue 16 item 4): what it reads, what it concludes, and that reading
never blocks on, waits for, or changes a live checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from nlevel.roles.messages import TaskFailure
from nlevel.runtime import checkpoint as ck
from nlevel.runtime import status as S

pytestmark = pytest.mark.timeout(120)

META = ck.RunMeta(100, *ck.fingerprint("screen.py", {"seed": 1}), '{"levels": 2, "reason": "auto: classic first"}', "0.1.0")
NOW = 1_800_003_000.0  # 2027-01-15 08:50:00 UTC


def snapshot(n: int, failed=()) -> ck.Snapshot:
    return ck.Snapshot(np.array([[0, n]] if n else np.zeros((0, 2)), np.int64), [], [], failed=tuple(failed))


def write(path, n=40, failed=()):
    ck.write(path, META, snapshot(n, failed))


# ---------------------------------------------------------------- reading the checkpoint

def test_the_checkpoint_is_read_for_counts_identity_and_failures(tmp_path):
    path = tmp_path / "run.h5"
    write(path, 40, [TaskFailure(41, "died", "killed", 3, "n1", "", 3), TaskFailure(45, "raised", "ValueError: x", 2, "n2", "tb", 3)])
    c = S.read_checkpoint(str(path))
    assert (c["total"], c["n_completed"]) == (100, 40)
    assert c["identity"] == META.fingerprint_source and json.loads(c["plan"])["levels"] == 2
    assert [(f["id"], f["kind"], f["host"]) for f in c["failed"]] == [(41, "died", "n1"), (45, "raised", "n2")]


@pytest.mark.parametrize("content,message", [(b"notes\n", "cannot read"), (None, "not an nlevel checkpoint")])
def test_a_file_that_is_not_a_checkpoint_is_named(tmp_path, content, message):
    path = tmp_path / "x.h5"
    if content is None:
        import h5py

        with h5py.File(path, "w") as f:
            f["a"] = 1
    else:
        path.write_bytes(content)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=message):
        S.read_checkpoint(str(path))
    assert path.read_bytes() == before


def test_reading_takes_no_lock_so_a_holder_of_one_never_waits_for_it(tmp_path):
    """Another process holds the file open for writing (HDF5's exclusive lock): the read still goes through."""
    path = tmp_path / "run.h5"
    write(path)
    holder = subprocess.Popen([sys.executable, "-c", "import h5py, sys, time\nf = h5py.File(sys.argv[1], 'r+')\n"
                               "print('open', flush=True)\ntime.sleep(60)\n", str(path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        t0 = time.monotonic()
        assert S.read_checkpoint(str(path))["n_completed"] == 40
        assert time.monotonic() - t0 < 5
    finally:
        holder.kill()
        holder.wait()


WRITER = """
import sys, numpy as np
from nlevel.runtime import checkpoint as ck
meta = ck.RunMeta(100, *ck.fingerprint("screen.py", {"seed": 1}), "{}", "0.1.0")
n = 1
print("writing", flush=True)
while True:
    n = n % 99 + 1
    ck.write(sys.argv[1], meta, ck.Snapshot(np.array([[0, n]], np.int64), [], []))
"""


def test_reads_during_atomic_replacements_see_whole_files(tmp_path):
    """A job's writer replaces the file over and over (another process, as in a run): every read is whole."""
    path = tmp_path / "run.h5"
    write(path, 1)
    job = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    seen, errors = [], []
    try:
        assert job.stdout.readline().strip() == "writing"
        deadline = time.monotonic() + 20
        while (len(seen) + len(errors) < 200 or len(set(seen)) < 3) and time.monotonic() < deadline:
            try:
                seen.append(S.read_checkpoint(str(path))["n_completed"])
            except Exception as exc:  # noqa: BLE001
                errors.append(repr(exc))
        assert job.poll() is None, "the writer failed while being read"
    finally:
        job.kill()
        job.wait()
    assert errors == [] and all(1 <= n <= 99 for n in seen) and len(set(seen)) > 1


def test_a_file_moved_aside_between_calls_is_tried_once_more(tmp_path, monkeypatch):
    path = tmp_path / "run.h5"
    write(path)
    import h5py

    real, calls = h5py.File, []

    def flaky(*a, **k):
        calls.append(a[0])
        if len(calls) == 1:
            raise FileNotFoundError(a[0])
        return real(*a, **k)

    monkeypatch.setattr(h5py, "File", flaky)
    assert S.read_checkpoint(str(path))["n_completed"] == 40 and len(calls) == 2
    calls.clear()

    def gone(*a, **k):
        calls.append(a[0])
        raise FileNotFoundError(a[0])

    monkeypatch.setattr(h5py, "File", gone)
    with pytest.raises(FileNotFoundError):
        S.read_checkpoint(str(path))
    assert len(calls) == 2


# ---------------------------------------------------------------- what it concludes

CK = {"total": 100, "n_completed": 40, "created": "2027-01-15T08:00:00+00:00", "updated": "2027-01-15T08:46:30+00:00",
      "identity": META.fingerprint_source, "plan": '{"levels": 2, "reason": "auto: classic first"}', "version": "0.1.0",
      "failed": [{"id": 45, "kind": "raised", "attempts": 3, "rank": 2, "host": "n2", "error": "ValueError"},
                 {"id": 41, "kind": "died", "attempts": 3, "rank": 3, "host": "n1", "error": "killed"}]}


def record(**kw):
    r = {"checkpoint": None, "host": "n0", "pid": 4242, "job_id": "77", "started": NOW - 600, "updated": NOW - 1,
         "interval": 2.0, "committed": 52, "total": 100, "rate_per_s": 4.0, "eta_s": 12.0, "finished": False,
         "model": {"plan": "3 levels, regions 2, chunk auto", "levels": 3, "reason": "predicted 12% > C",
                   "rho": 0.42, "predicted": 0.031, "measured": 0.05}}
    r.update(kw)
    return r


def conclude(ck_=CK, rec=None, lock=None, host="n0", alive=lambda pid: pid == 4242):
    return S.assemble("run.h5", ck_, rec, lock, now=NOW, this_host=host, alive=alive)


def test_a_running_job_seen_through_its_record():
    st = conclude(rec=record())
    assert st["running"] and st["holder"]["pid"] == 4242 and st["holder"]["how"] == "process alive"
    assert [f["id"] for f in st["failed"]] == [45] and [f["id"] for f in st["quarantined"]] == [41]
    assert st["done_live"] == 52 and st["live"]["eta_s"] == pytest.approx(11.0)  # the record is 1 s old
    text = S.format_status(st, now=NOW)
    assert "run.h5: 52/100 tasks done (52.0%) (40 in the file)" in text
    assert "failed: 1 (45); quarantined: 1 (41)" in text
    assert "plan: 3 levels, regions 2, chunk auto; rho 0.42 (busiest server); overhead predicted 3.1%, measured 5.0%" in text
    assert "why: predicted 12% > C" in text
    assert "running: yes, pid 4242 on n0, job 77, since 2027-01-15 08:40:00 UTC (10 min ago)" in text
    assert "rate: 4.0 tasks/s over the last half minute, ETA 11 s" in text


def test_a_dead_job_is_not_running_and_shows_no_rate():
    st = conclude(rec=record(), alive=lambda pid: False)
    assert not st["running"] and "live" not in st and "done_live" not in st
    text = S.format_status(st, now=NOW)
    assert "running: no job holds it now (its record names pid 4242 on n0: process gone)" in text
    assert "rate:" not in text


def test_another_hosts_job_is_judged_by_its_heartbeat():
    assert conclude(rec=record(), host="login1")["running"]  # 1 s old, interval 2 s
    assert not conclude(rec=record(updated=NOW - 300), host="login1")["running"]


@pytest.mark.parametrize("lock", [
    {"host": "n9", "pid": 11, "job_id": "5", "started": "2027-01-15T08:00:00Z", "heartbeat": NOW - 2},
    {"hostname": "n9", "pid": "11", "jobid": "5", "start_time": NOW - 3000, "heartbeat_at": "2027-01-15T08:49:58+00:00"},
])
def test_the_lock_is_read_whatever_it_calls_its_fields(lock):
    st = conclude(lock=lock, host="login1")
    h = st["holder"]
    assert st["running"] and (h["from"], h["host"], h["pid"], h["job_id"]) == ("lock", "n9", 11, "5")
    assert h["since"] == pytest.approx(NOW - 3000) and h["heartbeat"] == pytest.approx(NOW - 2)


def test_a_stale_lock_and_no_record():
    st = conclude(lock={"host": "n0", "pid": 99, "heartbeat": NOW - 5}, alive=lambda pid: False)
    assert not st["running"] and "its lock names pid 99 on n0: process gone" in S.format_status(st, now=NOW)


def test_without_a_record_the_first_plan_comes_from_the_checkpoint():
    text = S.format_status(conclude(), now=NOW)
    assert "plan at the start: 2 levels (auto: classic first)" in text
    assert "last written: 2027-01-15 08:46:30 UTC (3.5 min ago)" in text


def test_a_finished_job():
    st = conclude(rec=record(finished=True, complete=True, updated=NOW - 7200), alive=lambda pid: False)
    assert "the last job finished every task 2.0 h ago" in S.format_status(st, now=NOW)


def test_a_job_that_has_not_written_its_checkpoint_yet():
    st = conclude(ck_=None, rec=record(committed=3))
    assert S.format_status(st, now=NOW).startswith("run.h5: 3/100 tasks done (3.0%) (no checkpoint written yet)")


# ---------------------------------------------------------------- the job's record and the command

def test_the_recorder_writes_rate_and_eta_and_never_raises(tmp_path):
    path = tmp_path / "run.h5"
    os.makedirs(str(path) + ".control")
    n = {"c": 10}
    rec = S.Recorder(str(path), lambda: {"committed": n["c"], "total": 100, "resumed": 10, "size": 4, "plan": "2 levels"},
                     interval=60)
    rec.start()
    first = S.read_json(S.record_path(path))
    assert first["committed"] == 10 and first["rate_per_s"] is None and first["model"] == {"plan": "2 levels"}
    rec._samples[0] = (rec._samples[0][0] - 2.0, 10)  # as if the first record were 2 s old
    n["c"] = 30
    rec.close(finished=True, complete=False)
    last = S.read_json(S.record_path(path))
    assert last["finished"] and last["rate_per_s"] == pytest.approx(10.0, rel=0.05)
    assert last["eta_s"] == pytest.approx(7.0, rel=0.05)
    broken = S.Recorder(str(tmp_path / "gone" / "run.h5"), lambda: {"committed": 1, "total": 2})
    broken.write()  # no directory: nothing written, nothing raised


def run_status(*args, cwd):
    return subprocess.run([sys.executable, "-m", "nlevel.status", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_the_command(tmp_path):
    write(tmp_path / "run.h5")
    out = run_status("run.h5", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("run.h5: 40/100 tasks done (40.0%)"), out.stderr
    js = json.loads(run_status("run.h5", "--json", cwd=tmp_path).stdout)
    assert (js["done"], js["total"], js["running"]) == (40, 100, False)
    assert sorted(os.listdir(tmp_path)) == ["run.h5"]  # reading wrote nothing


@pytest.mark.parametrize("name,message", [("none.h5", "no checkpoint 'none.h5'"), (".", "is a directory"),
                                          ("notes.h5", "cannot read notes.h5")])
def test_bad_input_is_one_line_and_exit_2(tmp_path, name, message):
    (tmp_path / "notes.h5").write_text("my notes\n")
    out = run_status(name, cwd=tmp_path)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert (tmp_path / "notes.h5").read_text() == "my notes\n"


def test_a_job_whose_heartbeat_stopped_is_not_running_and_says_since_when():
    """Issue 33: a node lost with the master on it; status, on another host, said "running: yes"
    because the lock's heartbeat (every 5 s) was still recent. The record's heartbeat (every 2 s,
    same process) says sooner that it stopped, and how long ago."""
    lock = {"host": "node1", "pid": 4242, "started": NOW - 20, "heartbeat": NOW - 9, "heartbeat_interval": 5.0}
    st = conclude(rec=record(host="node1", updated=NOW - 9), lock=lock, host="login1")
    assert not st["running"]
    text = S.format_status(st, now=NOW)
    assert "running: no job holds it now (its record names pid 4242 on node1: heartbeat stopped 9 s ago " \
           "(expected every 2 s))" in text, text
    assert conclude(rec=record(host="node1", updated=NOW - 3), lock=lock, host="login1")["running"]
    assert conclude(lock=lock, host="login1")["running"]  # (the lock alone: 9 s is within three 5 s beats)
    assert not conclude(lock={**lock, "heartbeat": NOW - 18}, host="login1")["running"]
