"""A checkpoint on a full file system (issue 14): the old file stays readable, one line says so, the job stops.

Needs a tiny tmpfs (root: ``mount -t tmpfs -o size=64k``); skipped where mounting is not allowed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ..conftest import ROOT, run_bounded
from .test_cli import BIN, completed_ids

APP = os.path.join(ROOT, "tests", "apps", "dying_app.py")


@pytest.fixture
def tiny_fs(tmp_path):
    where = tmp_path / "fs"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _run(cwd, env, n, checkpoint):
    cmd = [os.path.join(BIN, "nlevel-mpiexec"), "-n", "3", sys.executable, "-m", "nlevel.run", APP,
           "--checkpoint", str(checkpoint), "--quiet", "--n", str(n), "--sleep-ms", "0", "--die-task", "-1"]
    return subprocess.run(cmd, cwd=cwd, env={**env, "NLEVEL_TEST_LOG_DIR": str(cwd)}, capture_output=True,
                          text=True, timeout=120)


def _nlevel_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("nlevel:")]


@pytest.mark.timeout(300)
def test_a_full_disk_keeps_the_old_checkpoint_and_stops_with_one_line(tmp_path, mpi_env, tiny_fs):
    ckpt = tiny_fs / "run.h5"
    first = _run(tmp_path, mpi_env, 200, ckpt)
    assert first.returncode == 0, first.stderr[-3000:]
    try:
        with open(tiny_fs / "filler", "wb", buffering=0) as f:  # the rest of the file system, taken
            while True:
                f.write(b"\0" * 512)
    except OSError:
        pass
    again = _run(tmp_path, mpi_env, 200, ckpt)  # resuming rewrites the file: no room
    assert completed_ids(ckpt) == set(range(200))  # the old checkpoint, intact
    assert again.returncode != 0 and len(_nlevel_lines(again.stderr)) == 1, again.stderr[-3000:]
    assert str(tiny_fs) in again.stderr and "No space left on device" in again.stderr
    os.unlink(tiny_fs / "filler")
    fresh = _run(tmp_path, mpi_env, 30000, tiny_fs / "big.h5")  # 30000 results do not fit in 64 KiB
    for proc in (again, fresh):
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert fresh.returncode == 1, fresh.stderr[-3000:]
    [line] = _nlevel_lines(fresh.stderr)
    assert "cannot write checkpoint" in line and "No space left on device" in line and "intact" in line
    assert not [p for p in os.listdir(tiny_fs) if ".tmp" in p]  # no temporary file left on the full disk


@pytest.mark.timeout(300)
def test_a_full_disk_reaches_a_users_script_as_one_checkpoint_error_on_every_rank(tmp_path, mpi_env, tiny_fs):
    """Issue 34: every rank raises the same CheckpointError, naming the file and the cause, no h5py chain."""
    ckpt = tiny_fs / "big.h5"  # 30000 results do not fit in 64 KiB
    cmd = [os.path.join(BIN, "nlevel-mpiexec"), "-n", "3", sys.executable,
           os.path.join(ROOT, "tests", "apps", "results_script.py"), str(ckpt), "30000"]
    proc = run_bounded(cmd, 200, cwd=tmp_path, env=mpi_env)
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank "))
    assert [line.split(":")[0] for line in lines] == ["rank 0", "rank 1", "rank 2"], proc.stdout + proc.stderr[-3000:]
    said = {line.split(":", 1)[1] for line in lines}
    assert said == {f" CheckpointError errno=28 path={ckpt} cause=False: cannot write checkpoint {ckpt}: No space "
                    f"left on device (errno 28); the previous checkpoint, if any, is intact"}, lines
    assert "Traceback" not in proc.stderr and "h5py" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert not [p for p in os.listdir(tiny_fs) if ".tmp" in p]
