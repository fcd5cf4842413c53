"""Shared test settings: where the venv's tools are, and the environment MPI runs need."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


@pytest.fixture
def mpi_env() -> dict[str, str]:
    """Environment for launching MPI jobs from tests (quiet, non-interactive)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["NLEVEL_TTY"] = "0"
    return env


def pytest_ignore_collect(collection_path, config):
    """tests/mpi runs under mpiexec (tests/test_mpi_suite.py); plain pytest leaves it alone."""
    if collection_path.name == "mpi" and not config.getoption("--with-mpi", default=False):
        return True
    return None
