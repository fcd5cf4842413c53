"""``bench/soak.py --quick``: the soak's short version runs, and its figures hold the promise.

Four fixed trials under ``--with-ft ulfm`` (a region-master SIGKILLed, the master
SIGSEGVed, a slave SIGSTOPped, a task that never returns), each bounded by the soak's own
60 s hang limit; the whole run by this test's timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ..conftest import ROOT


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_quick_soak_loses_nothing_and_hangs_nowhere(tmp_path, mpi_env):
    out, md = tmp_path / "soak.json", tmp_path / "soak.md"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "soak.py"), "--quick", "--out", str(out),
                           "--markdown", str(md)], env=mpi_env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads(out.read_text())
    s = d["summary"]
    assert d["provenance"] and d["args"]["quick"] and s["trials"] == 4
    assert s["lost_ids"] == 0 and s["double_commits"] == 0 and s["unreadable_checkpoints"] == 0, proc.stdout
    assert s["hangs"] == 0, proc.stdout
    assert s["kills_landed"] >= 3, proc.stdout  # (a kill may miss a job that ended first)
    assert md.read_text().startswith("| trials |")
