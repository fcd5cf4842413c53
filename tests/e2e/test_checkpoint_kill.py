"""The checkpoint under real processes: a write that fails half way, and SIGKILL at any instant.

The file-level tests (round trips, every refusal, the Writer) are tests/unit/test_checkpoint.py.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from nlevel.runtime import checkpoint as ck

from ..conftest import ROOT
from ..unit.test_checkpoint import FP, FP_SRC, META, sha, snap, temps


def run_py(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_write_error_keeps_previous_file(tmp_path: Path) -> None:
    """A file-size limit stands in for a full disk: the write fails half way."""
    path = tmp_path / "ck.h5"
    ck.write(path, META, snap([[0, 3]]))
    before = sha(path)
    r = run_py(f"""
        import resource, signal, sys, numpy as np
        from nlevel.runtime import checkpoint as ck
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
        meta = ck.RunMeta(10**6, {FP!r}, {FP_SRC!r}, "{{}}", "0")
        try:
            ck.write(sys.argv[1], meta, ck.Snapshot([[0, 10**6]], np.arange(10**6), np.ones(10**6)))
        except ck.CheckpointError as e:
            print(e)
            sys.exit(0)
        sys.exit(3)
        """, str(path))
    assert r.returncode == 0, r.stderr
    assert "cannot write checkpoint" in r.stdout and str(path) in r.stdout
    assert "previous checkpoint" in r.stdout
    assert sha(path) == before and temps(path) == []


# ---------------------------------------------------------------- crash safety

WRITER_LOOP = """
    import sys, numpy as np
    from nlevel.runtime import checkpoint as ck
    meta = ck.RunMeta(10**8, "f" * 64, "{}", "{}", "0")
    i = 0
    while True:
        i += 1
        starts = np.arange(i * 50, dtype=np.int64) * 3
        ck.write(sys.argv[1], meta, ck.Snapshot(np.stack([starts, starts + 2], 1), starts,
                                                starts * 0.5))
        if i == 1:
            print("ready", flush=True)
"""


@pytest.mark.timeout(120)
def test_sigkill_never_leaves_an_unreadable_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "ck.h5"
    rng = random.Random(20240611)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    killed_mid_write = 0
    for trial in range(30):
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER_LOOP), str(path)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 30)
            assert ready and proc.stdout.readline() == b"ready\n", proc.stderr.read()
            time.sleep(rng.uniform(0, 0.2))
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(timeout=30)
            proc.stdout.close()
            proc.stderr.close()
        killed_mid_write += bool(temps(path))
        meta, s, extra = ck.read(path)
        k = len(s.completed)
        assert meta.total == 10**8 and k > 0 and k % 50 == 0, (trial, k)
        starts = np.arange(k, dtype=np.int64) * 3
        assert np.array_equal(s.completed, np.stack([starts, starts + 2], 1))
        assert np.array_equal(s.result_ids, starts)
        assert np.array_equal(s.result_values, starts * 0.5)
        assert s.n_completed == extra["n_completed"] == 2 * k
        ck.load(path, meta)  # removes the killed writer's temporary
        assert temps(path) == []
    assert killed_mid_write > 0, "no kill landed during a write: the test proved nothing"
