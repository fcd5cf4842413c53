"""The report file: written whole, and a deputy's report never replaces its master's (issue 14)."""

from __future__ import annotations

import json
import os
import time

from nlevel.runtime.report import master_wrote, write_json


def test_a_report_is_written_whole_and_readable(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, {"complete": True, "failures": []})
    assert json.loads(path.read_text()) == {"complete": True, "failures": []}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # (no temporary file left)


def test_the_masters_report_of_this_job_stands(tmp_path):
    """The master exited right after releasing its deputy, its report written: the deputy must not replace it."""
    path = tmp_path / "r.json"
    write_json(path, {"complete": True, "job": "abc"})
    assert master_wrote(path, "abc")


def test_a_report_from_an_earlier_run_does_not_stand_whatever_its_time(tmp_path):
    """An earlier run's report on the same path (the run being resumed): this job's deputy writes its own,
    even when the file looks newer than this job (a file server's clock ahead of the nodes')."""
    path = tmp_path / "r.json"
    write_json(path, {"complete": False, "job": "earlier"})
    future = time.time() + 3600
    os.utime(path, (future, future))
    assert not master_wrote(path, "abc")
    write_json(path, {"complete": False})  # (a report from before job ids)
    assert not master_wrote(path, "abc")


def test_a_deputys_report_does_not_stand_for_a_master(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, {"complete": True, "job": "abc", "written_by": {"rank": 1, "why": "..."}})
    assert not master_wrote(path, "abc")


def test_no_file_or_an_unreadable_one_does_not_stand(tmp_path):
    assert not master_wrote(tmp_path / "missing.json", "abc")
    bad = tmp_path / "half.json"
    bad.write_text('{"complete": tr')
    assert not master_wrote(bad, "abc")


def test_writing_a_report_never_changes_the_umask_which_other_threads_create_files_under(tmp_path, monkeypatch):
    """Issue 34: write_json read the umask by setting it to 0 and back, from the status thread, while
    other threads created files: one made in between was world-writable. The mode comes from the kernel now."""
    import threading

    calls: list[tuple[int, str]] = []
    real = os.umask

    def umask(mask):
        calls.append((mask, threading.current_thread().name))
        return real(mask)

    monkeypatch.setattr(os, "umask", umask)
    old = real(0o027)
    try:
        t = threading.Thread(target=write_json, args=(tmp_path / "r.json", {"complete": True}), name="nlevel-status")
        t.start()
        t.join()
        assert calls == [], f"the umask was changed: {calls}"
        assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o640  # (0666 less the umask)
    finally:
        real(old)
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
