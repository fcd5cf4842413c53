"""Operator input never kills a master (issue 34): malformed control files dropped into a live ULFM job.

Before, ``{"action": "drain", "ranks": ["3"]}`` raised a TypeError in the master's state machine,
which killed rank 0, then its deputy, reading the same file; the file was never answered.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter

import pytest

from ..conftest import ROOT, run_bounded
from .test_cli import BIN, completed_ids

LOGGING_APP = os.path.join(ROOT, "tests", "apps", "logging_app.py")

#: name -> what goes in it (bytes), on a 4-rank job: master 0 computes, slaves 1-3.
BAD = {
    "rank-as-text": json.dumps({"action": "drain", "ranks": ["3"]}).encode(),
    "negative-count": json.dumps({"action": "drain", "count": -3}).encode(),
    "count-as-text": json.dumps({"action": "drain", "count": "2"}).encode(),
    "count-every-slave": json.dumps({"action": "drain", "count": 3}).encode(),
    "rank-2.5": json.dumps({"action": "drain", "ranks": [2.5]}).encode(),
    "rank-true": json.dumps({"action": "drain", "ranks": [True]}).encode(),
    "unknown-rank": json.dumps({"action": "drain", "ranks": [99]}).encode(),
    "the-master": json.dumps({"action": "drain", "ranks": [0]}).encode(),
    "twice": json.dumps({"action": "drain", "ranks": [2, 2]}).encode(),
    "unknown-action": json.dumps({"action": "explode"}).encode(),
    "not-json": b"{drain: everything}",
    "empty": b"",
    "binary": bytes(range(256)),
    "deep": b"[" * 50_000,
}


@pytest.mark.timeout(300)
def test_malformed_control_files_are_all_answered_and_no_process_is_lost(tmp_path, mpi_env):
    logs = tmp_path / "logs"
    logs.mkdir()
    cmd = [os.path.join(BIN, "nlevel-mpiexec"), "--with-ft", "ulfm", "-n", "4", sys.executable, "-m", "nlevel.run",
           LOGGING_APP, "--n", "3000", "--sleep-ms", "10", "--levels", "2", "--checkpoint", "run.h5",
           "--report", "r.json", "--quiet"]
    result: dict[str, object] = {}

    def job() -> None:
        try:
            result["proc"] = run_bounded(cmd, 240, cwd=tmp_path, env={**mpi_env, "NLEVEL_TEST_LOG_DIR": str(logs)})
        except BaseException as exc:  # (a hang: reported below)
            result["error"] = exc

    runner = threading.Thread(target=job, daemon=True)
    runner.start()
    control = tmp_path / "run.h5.control"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and runner.is_alive():
        done = sum(len(p.read_text().split()) for p in logs.iterdir())
        if control.is_dir() and done > 200:
            break
        time.sleep(0.1)
    assert control.is_dir(), result
    requests = {}
    for i, (what, raw) in enumerate(BAD.items()):
        tmp = control / f".tmp-{what}"
        tmp.write_bytes(raw)
        requests[what] = control / f"request-{i:02d}-{what}.json"
        os.rename(tmp, requests[what])
    os.mkdir(control / "request-50-a-directory.json")
    requests["a-directory"] = control / "request-50-a-directory.json"
    os.symlink("request-51-loop.json", control / "request-51-loop.json")
    requests["a-symlink-loop"] = control / "request-51-loop.json"
    answers = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(answers) < len(requests):
        for what, path in requests.items():
            done = path.with_name(path.name + ".done")
            if what not in answers and done.exists():
                answers[what] = json.loads(done.read_text())
        time.sleep(0.1)
    runner.join(260)
    assert "error" not in result, result["error"]
    proc = result["proc"]
    assert sorted(answers) == sorted(requests), f"unanswered: {sorted(set(requests) - set(answers))}\n" \
                                                f"{proc.stderr[-3000:]}"
    for what, a in answers.items():
        assert "error" in a and "result" not in a, (what, a)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["complete"] and report["failures"] == [] and report["dead_ranks"] == [] and not report["drained"]
    runs: Counter[int] = Counter()
    for p in logs.iterdir():
        runs.update(int(x) for x in p.read_text().split())
    assert set(runs) == set(range(3000)) and max(runs.values()) == 1
    assert completed_ids(tmp_path / "run.h5") == set(range(3000))
    assert sorted(p.name for p in control.iterdir() if not p.name.endswith(".done")) == \
        ["request-50-a-directory.json.refused", "status.json"]
