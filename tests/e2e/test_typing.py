"""The package type-checks (STYLE rule 10) and keeps MPI confined (STYLE rule 1).

tests/unit/test_architecture.py checks the MPI rule from the import graph too.
"""

import os
import re
import subprocess
import sys

import pytest

from ..conftest import ROOT

MPI_MODULES = {"runtime/transport.py", "runtime/window.py", "runtime/calibrate.py"}  # messages, one-sided boards, calibration


@pytest.mark.timeout(300)
def test_mypy_clean():
    pytest.importorskip("mypy")
    proc = subprocess.run([sys.executable, "-m", "mypy", "nlevel"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_only_the_transport_the_window_and_the_calibration_import_mpi4py():
    offenders = []
    pkg = os.path.join(ROOT, "nlevel")
    for dirpath, _, files in os.walk(pkg):
        for name in files:
            rel = os.path.relpath(os.path.join(dirpath, name), pkg)
            if name.endswith(".py") and rel not in MPI_MODULES:
                text = open(os.path.join(dirpath, name)).read()
                if re.search(r"^\s*(from|import)\s+mpi4py", text, re.M):
                    offenders.append(os.path.relpath(os.path.join(dirpath, name), ROOT))
    assert offenders == []
