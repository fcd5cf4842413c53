"""``python -m nlevel.plan --calibrate``: a real MPI measurement (nlevel-mpiexec -n 2), stored and used."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nlevel.model.calibration import load_calibration

from ..unit.test_planner import plan_cli


@pytest.mark.timeout(180)
def test_calibrate_measures_and_later_plans_use_it(tmp_path, mpi_env):
    path = str(tmp_path / "cal.json")
    proc = subprocess.run(
        [sys.executable, "-m", "nlevel.plan", "--calibrate", "--calibration", path],
        capture_output=True, text=True, timeout=150, env=mpi_env,
    )
    assert proc.returncode == 0, proc.stderr
    cal = load_calibration(path)
    assert cal is not None and 0 < cal.service_time < 0.1 and 0 < cal.msg_time < 0.1
    assert 0 < cal.atomic_time < 0.01 and 0 < cal.atomic_service < 0.01  # the one-sided operation, both ends
    out = plan_cli("--procs", "64", "--task-time", "0.01", "--calibration", path, "--json")
    assert out.returncode == 0, out.stderr
    inputs = json.loads(out.stdout)["inputs"]
    assert inputs["service_time_s"] == pytest.approx(cal.service_time)
    assert inputs["atomic_time_s"] == pytest.approx(cal.atomic_time)
