"""What a farm's first call imports (issue 35): the farm's machinery comes with ``import nlevel``
(which initialises no MPI), and so do the runtime's MPI modules when the script imported
mpi4py's MPI first, so the first ``get_task_id`` imports nothing (or, in a script that has not,
only those modules); and a farm without a checkpoint never imports numpy, h5py or the standard
library's heavy modules (tempfile pulls shutil, bz2, lzma, random; uuid; hashlib; socket; datetime).

Each check runs a fresh interpreter: one process, no launcher (mpi4py initialises MPI as a
singleton), the script's own ``from mpi4py import MPI`` first, as a user's script would.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ..conftest import ROOT, run_bounded

#: What the first call may import: the runtime's modules that import mpi4py (left out of
#: ``import nlevel`` in a script that has not imported mpi4py's MPI: it must not initialise MPI).
FIRST_CALL = {"nlevel.runtime.farm", "nlevel.runtime.transport", "nlevel.runtime.window"}

#: What a farm without a checkpoint never needs, from ``import nlevel`` to its last call.
FORBIDDEN = {"numpy", "h5py", "tempfile", "shutil", "bz2", "lzma", "random", "uuid", "hashlib", "socket",
             "datetime", "subprocess", "platform", "traceback"}

_SCRIPT = """
import json, sys
%(mpi)s
mpi = set(sys.modules)
import nlevel
imported = set(sys.modules)
first = None
while (tid := nlevel.get_task_id(%(total)d)) >= 0:
    if first is None:
        first = set(sys.modules)
last = set(sys.modules)
print(json.dumps({"import": sorted(imported - mpi), "first": sorted(first - imported),
                  "run": sorted(last - mpi)}))
"""


def _run(code: str, mpi_env: dict[str, str]) -> str:
    try:
        proc = run_bounded([sys.executable, "-c", code], 120, cwd=ROOT, env=mpi_env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"a one-process farm hung (killed after 120 s):\n{exc.stdout}\n{exc.stderr}")
    assert proc.returncode == 0, f"a one-process farm failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout.strip().splitlines()[-1]


def first_call_problems(seen: dict[str, list[str]], first_call: set[str] = FIRST_CALL,
                        forbidden: set[str] = FORBIDDEN) -> list[str]:
    """What ``seen`` (the modules new at ``import nlevel``, at the first call and over the whole run)
    shows wrong: a module the first call imports beyond ``first_call``, a ``forbidden`` one anywhere."""
    out = [f"the first call imports {m} (import it with nlevel, or avoid it)"
           for m in seen["first"] if m not in first_call]
    out += [f"a farm without a checkpoint imports {m}" for m in seen["run"] if m.split(".")[0] in forbidden]
    return out


def test_after_the_scripts_own_mpi_import_the_first_call_imports_nothing(mpi_env):
    # (the user's own import: a script using mpi4py's Counter pays it too)
    seen = json.loads(_run(_SCRIPT % {"total": 3, "mpi": "from mpi4py import MPI"}, mpi_env))
    assert first_call_problems(seen, first_call=set()) == []
    assert FIRST_CALL <= set(seen["import"])


def test_without_it_the_first_call_imports_only_the_runtimes_mpi_modules(mpi_env):
    seen = json.loads(_run(_SCRIPT % {"total": 3, "mpi": ""}, mpi_env))
    mpi = json.loads(_run("import json, sys; before = set(sys.modules); from mpi4py import MPI; "
                          "print(json.dumps(sorted(set(sys.modules) - before)))", mpi_env))
    assert first_call_problems(seen, first_call=FIRST_CALL | set(mpi)) == []
    assert FIRST_CALL <= set(seen["first"])  # (else the allowed list is stale: the check would hold nothing)


def test_the_check_fails_on_a_module_imported_late():
    seen = {"import": ["nlevel.api"], "first": ["nlevel.runtime.farm", "tempfile", "shutil"],
            "run": ["nlevel.api", "nlevel.runtime.farm", "tempfile", "shutil", "numpy.linalg"]}
    assert first_call_problems(seen) == [
        "the first call imports tempfile (import it with nlevel, or avoid it)",
        "the first call imports shutil (import it with nlevel, or avoid it)",
        "a farm without a checkpoint imports tempfile",
        "a farm without a checkpoint imports shutil",
        "a farm without a checkpoint imports numpy.linalg",
    ]


def test_import_nlevel_initialises_no_mpi(mpi_env):
    out = _run("import sys, nlevel; print(sorted(m for m in sys.modules if m.startswith('mpi4py.')))", mpi_env)
    assert out == "[]"


def test_mpi4py_imported_but_not_initialised_stays_so(mpi_env):
    """``mpi4py.rc.initialize = False``: the script initialises MPI itself, later; ``import nlevel``
    neither initialises it nor marks the process past MPI_Init (nlevel-mpiexec's fence)."""
    out = _run("import sys, mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; import nlevel; "
               "print(MPI.Is_initialized(), 'nlevel.runtime.transport' in sys.modules)", mpi_env)
    assert out == "False False"
