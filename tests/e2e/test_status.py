"""Looking at a job from outside while it runs, and what a first run shows (issue 16 items 3 and 4)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from nlevel.runtime.machine import usable_cores

from ..conftest import BIN


def status(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "nlevel.status", "run.h5", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(180)
def test_status_of_a_running_job_then_of_the_finished_one(tmp_path, mpi_env):
    cmd = [os.path.join(BIN, "nlevel-mpiexec"), "-n", "2", sys.executable, "-m", "nlevel.run", "--checkpoint", "run.h5",
           "--tasks", "700", "--task-min", "8", "--task-spread", "0", "--checkpoint-interval", "1", "--quiet"]
    job = subprocess.Popen(cmd, cwd=tmp_path, env=mpi_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and job.poll() is None:
            out = status(tmp_path, "--json")
            if out.returncode == 0:
                st = json.loads(out.stdout)
                if st["running"] and (st.get("live") or {}).get("rate_per_s"):
                    seen = st
                    break
            time.sleep(0.3)
        text = status(tmp_path).stdout
        stdout, stderr = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode == 0, stderr
    assert seen is not None, "status never saw the job running with a rate"
    assert seen["holder"]["pid"] is not None and seen["holder"]["how"] == "process alive"
    assert 0 < seen["live"]["rate_per_s"] < 10_000 and seen["live"]["eta_s"] is not None
    assert seen["total"] == 700 and seen["plan"]["now"].startswith("2 levels")
    assert "running: yes, pid" in text or "running: no job" in text  # (the job may just have ended)
    end = status(tmp_path)
    assert end.returncode == 0, end.stderr
    assert end.stdout.startswith("run.h5: 700/700 tasks done (100.0%)")
    assert "running: no job holds it now" in end.stdout and "the last job finished every task" in end.stdout


@pytest.mark.timeout(180)
def test_a_first_run_shows_the_model_and_explains_oversubscription(tmp_path, mpi_env):
    cmd = [os.path.join(BIN, "nlevel-mpiexec"), "-n", "4", sys.executable, "-m", "nlevel.run", "--tasks", "2000",
           "--progress-interval", "0.5", "--replan-interval", "0.5", "--report", "r.json"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=mpi_env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("nlevel: ") and "tasks/s" in line]
    assert lines and all("2 levels" in line or "3 levels" in line for line in lines), proc.stdout
    assert any(re.search(r"overhead (predicted [0-9.]+%, )?measured [0-9.]+%", line) for line in lines), proc.stdout
    assert any("rho " in line and "(busiest server)" in line and "predicted" in line for line in lines), proc.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    place = report["placement"]
    assert place["ranks"] == 4 and place["nodes"] == 1
    over = usable_cores() < 4
    assert bool(place["oversubscribed"]) == over
    assert ("oversubscribed, so processes wait for a core" in proc.stdout) == over, proc.stdout
