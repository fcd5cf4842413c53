"""Resume semantics a user can predict (issue 16): a script's run is its file name and total, plus
what it passes as ``fingerprint=``; arguments that do not define the tasks never block a resume."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ..conftest import BIN, run_bounded

SCRIPT = '''
import sys
from nlevel import get_task_id
out, seed = sys.argv[1], int(sys.argv[2])          # an output directory and a parameter of the tasks
fp = {"seed": seed} if "--declare-seed" in sys.argv else None
n = 0
while (task_id := get_task_id(30, "run.h5", fingerprint=fp)) >= 0:
    n += 1
print(f"ran {n}", flush=True)
'''


def run(tmp_path, env, *args):
    cmd = [os.path.join(BIN, "nlevel-mpiexec"), "-n", "2", sys.executable, "screen.py", *args]
    try:
        return run_bounded(cmd, 120, cwd=tmp_path, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"screen.py {' '.join(args)} hung:\n{exc.stdout}\n{exc.stderr}")


def ran(proc) -> int:
    return sum(int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("ran "))


@pytest.mark.timeout(300)
def test_a_script_resumes_with_other_arguments_and_is_refused_when_a_declared_parameter_changes(tmp_path, mpi_env):
    (tmp_path / "screen.py").write_text(SCRIPT)
    first = run(tmp_path, mpi_env, "/scratch/job1", "1")
    assert first.returncode == 0 and ran(first) == 30, first.stderr
    # Another output directory (a Slurm job id, a log path ...): the same run, nothing runs again.
    again = run(tmp_path, mpi_env, "/scratch/job2", "1")
    assert again.returncode == 0 and ran(again) == 0, again.stderr
    # A script that declares its parameter: a checkpoint without it does not record it, so it is refused ...
    declared = run(tmp_path, mpi_env, "/scratch/job3", "2", "--declare-seed")
    assert declared.returncode != 0
    err = declared.stderr
    assert "belongs to another run" in err and 'seed only in this run (2)' in err, err
    assert "--fresh" not in err and "Farm(..., fresh=True)" in err and "move run.h5 aside" in err, err
    # ... and a new checkpoint written with it refuses another seed, naming both values.
    os.rename(tmp_path / "run.h5", tmp_path / "old.h5")
    assert run(tmp_path, mpi_env, "/scratch/job4", "2", "--declare-seed").returncode == 0
    other = run(tmp_path, mpi_env, "/scratch/job5", "3", "--declare-seed")
    assert other.returncode != 0 and "seed: 2 in the checkpoint, 3 in this run" in other.stderr, other.stderr
