"""Shared test settings: where the venv's tools are, the environment MPI runs need, and the
markers that sort the suite by cost.

* ``tests/unit/`` (marker ``unit``): plain pytest, no MPI job (a few run ``python -m nlevel.plan``
  as a child): ``pytest tests/unit`` is the inner loop (well under 2 minutes).
* ``tests/mpi/`` (marker ``mpi``): pytest-mpi tests, run under mpiexec at 1, 4 and 7 ranks by
  ``tests/e2e/test_mpi_suite.py``; plain pytest does not collect them.
* ``tests/e2e/`` (marker ``e2e``): everything that launches processes: the CLI, MPI jobs,
  fault injection, Slurm, the notebook, the compiled simulator, mypy.
* ``tests/cluster/`` (marker ``cluster``): jobs across an emulated cluster of three nodes
  (network namespaces on this machine; root): skipped with one line where it cannot be made,
  a failure then under ``CI=true``.
* ``slow`` marks the longest e2e tests, so ``pytest -m "not slow"`` is a medium loop.

Property tests take :func:`examples` of their written count: all of them in a whole run (CI, the
README's command), a quarter in the inner loop (only ``tests/unit`` asked for; ``NLEVEL_TESTS_FULL=1``
or ``CI=true`` gives it the full counts).

A plain ``pytest`` runs all of it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)

#: Whether property tests take their full example counts (see :func:`examples`); set at configure.
_FULL = True


def pytest_configure(config):
    global _FULL
    unit = os.path.join(ROOT, "tests", "unit")
    asked = [os.path.abspath(str(a).split("::")[0]) for a in config.args]
    inner = bool(asked) and all(a == unit or a.startswith(unit + os.sep) for a in asked)
    _FULL = not inner or os.environ.get("NLEVEL_TESTS_FULL") == "1" or os.environ.get("CI") == "true"


def examples(n: int, least: int = 20) -> int:
    """Random cases (hypothesis examples, random trials) for a test written with ``n``: ``n`` in a
    whole run, a quarter (at least ``least``) in the inner loop, which stays under two minutes on
    two cores."""
    return n if _FULL else min(n, max(least, n // 4))


def run_bounded(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)``, except
    that a job past its timeout is killed whole: the command runs in a session of its own, and
    every process of that session is killed (mpiexec puts each rank in a process group of its
    own: killing the launcher alone left ranks of a hung job running into the next tests).
    Raises ``subprocess.TimeoutExpired`` as ``subprocess.run`` does."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_session(proc.pid)
            try:
                out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # (a process that left the session holds the pipes)
                out, err = "", "(output not collected: a process outside the job's session holds its pipes)"
            raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid``."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getsid(int(name)) == sid:
                    os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass


#: The folder under tests/ -> the marker every test in it gets.
FOLDER_MARKERS = {"unit": "unit", "mpi": "mpi", "e2e": "e2e", "cluster": "cluster"}


@pytest.fixture
def mpi_env() -> dict[str, str]:
    """Environment for launching MPI jobs from tests (quiet, non-interactive)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["NLEVEL_TTY"] = "0"
    return env


def pytest_ignore_collect(collection_path, config):
    """tests/mpi runs under mpiexec (tests/e2e/test_mpi_suite.py); plain pytest leaves it alone."""
    if collection_path.name == "mpi" and not config.getoption("--with-mpi", default=False):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    """Mark each test by its folder: ``unit``, ``mpi``, ``e2e`` or ``cluster``."""
    tests = Path(__file__).resolve().parent
    for item in items:
        try:
            folder = Path(str(item.path)).resolve().relative_to(tests).parts[0]
        except ValueError:  # a test outside tests/
            continue
        name = FOLDER_MARKERS.get(folder)
        if name is not None and item.get_closest_marker(name) is None:
            item.add_marker(name)
