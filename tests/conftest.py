"""Shared test settings: where the venv's tools are, the environment MPI runs need, and the
markers that sort the suite by cost.

* ``tests/unit/`` (marker ``unit``): plain pytest, no MPI job (a few run ``python -m nlevel.plan``
  as a child): ``pytest tests/unit`` is the inner loop (well under 2 minutes).
* ``tests/mpi/`` (marker ``mpi``): pytest-mpi tests, run under mpiexec at 1, 4 and 7 ranks by
  ``tests/e2e/test_mpi_suite.py``; plain pytest does not collect them.
* ``tests/e2e/`` (marker ``e2e``): everything that launches processes: the CLI, MPI jobs,
  fault injection, Slurm, the notebook, the compiled simulator, mypy.
* ``slow`` marks the longest e2e tests, so ``pytest -m "not slow"`` is a medium loop.

A plain ``pytest`` runs all of it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)

#: The folder under tests/ -> the marker every test in it gets.
FOLDER_MARKERS = {"unit": "unit", "mpi": "mpi", "e2e": "e2e"}


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
    """Mark each test by its folder: ``unit``, ``mpi`` or ``e2e``."""
    tests = Path(__file__).resolve().parent
    for item in items:
        try:
            folder = Path(str(item.path)).resolve().relative_to(tests).parts[0]
        except ValueError:  # a test outside tests/
            continue
        name = FOLDER_MARKERS.get(folder)
        if name is not None and item.get_closest_marker(name) is None:
            item.add_marker(name)
