"""Issue 38's table end to end: a new user's script (tests/apps/edges_script.py) on 3 ranks, with and without ULFM.

A one-field result is committed whether it is given bare or as a one-element tuple; a
wrong call to ``complete()`` (a wrong width, a second call for one task, no task in hand)
is an error in the program: it is raised on the rank that made it, and only there; the job
stops once, cleanly, with one message from the master, and ends with exit status 1 (under
ULFM too: no rank dies, no master takes over from another).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from ..conftest import ROOT, run_bounded
from .test_cli import BIN, completed_ids

SCRIPT = os.path.join(ROOT, "tests", "apps", "edges_script.py")
BAD_APP = os.path.join(ROOT, "tests", "apps", "bad_result_app.py")
RANKS = 3
STOPPING = "an error in the program on rank {rank}, raised there by complete() (not a task failure): "


def run(tmp_path, env, fields: str, mode: str, who: str, ft: bool, block: str = "with"
        ) -> tuple[int, str, dict[int, str], set[int]]:
    """(exit status, stderr, {rank: the error it raised}, ranks that ended their loop without one)."""
    launcher = [os.path.join(BIN, "nlevel-mpiexec"), *(["--with-ft", "ulfm"] if ft else []), "-n", str(RANKS)]
    try:
        proc = run_bounded([*launcher, sys.executable, SCRIPT, fields, mode, who, block], 120, cwd=tmp_path, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hung: {fields} {mode} {who}\n{exc.stderr}")
    # (strip: Open MPI's forwarding of the ranks' streams can leave a NUL byte in front of a line)
    lines = [line.lstrip("\0 ") for line in proc.stderr.splitlines()]
    raised: dict[int, str] = {}
    ended: set[int] = set()
    for line in lines:
        m = re.match(r"RAISED rank (\d+): (.*)", line)
        if m:
            assert int(m[1]) not in raised, proc.stderr[-3000:]
            raised[int(m[1])] = m[2]
        m = re.match(r"ENDED rank (\d+)$", line)
        if m:
            ended.add(int(m[1]))
    return proc.returncode, "\n".join(lines), raised, ended


def no_death(err: str) -> None:
    """No rank died, was killed or taken over from: the job ended once."""
    for sign in ("killing this process", "taking over", "died", "aborting the job", "MPI_ABORT", "exiting in the middle"):
        assert sign not in err, (sign, err[-3000:])


FT = [pytest.param(False, id="no-ulfm"), pytest.param(True, id="ulfm")]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("ft", FT)
@pytest.mark.parametrize("mode", ["scalar", "tuple1"])
def test_a_one_field_result_bare_or_in_a_tuple_is_committed(tmp_path, mpi_env, mode, ft):
    """Rows 1 and 2: ``result_fields=("x",)`` with ``complete(1.0)`` or ``complete((1.0,))`` on rank 1."""
    code, err, raised, ended = run(tmp_path, mpi_env, "x", mode, "1", ft)
    assert code == 0 and not raised and ended == set(range(RANKS)), err[-3000:]
    assert "RESULTS n=120 ok=True" in err, err[-3000:]
    assert "an error in the program" not in err and "Traceback" not in err
    no_death(err)


ERRORS = {  # (issue 38's rows 3 and 4, and a call with no task in hand): what the caller raises
    ("ab", "three"): r"ValueError: result of task \d+ must be 2 numbers \(a, b\), got \(1\.0, 2\.0, 3\.0\): "
                     r"3 numbers, expected 2",
    ("none", "twice"): r"RuntimeError: complete\(\) already called for task \d+",
    ("none", "before"): r"RuntimeError: complete\(\) called with no task in hand",
}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("ft", FT)
@pytest.mark.parametrize("fields,mode,block", [(*k, "with") for k in ERRORS] + [("ab", "three", "bare")])
def test_a_wrong_call_raises_on_its_caller_alone_and_stops_the_job_once(tmp_path, mpi_env, fields, mode, block, ft):
    """Rank 1 makes the mistake on its first task; ranks 0 and 2 do it right. (``bare``: a loop
    without a ``with`` block, the error seen at interpreter exit.)"""
    code, err, raised, ended = run(tmp_path, mpi_env, fields, mode, "1", ft, block)
    assert code == 1, (code, err[-3000:])
    assert list(raised) == [1] and re.match(ERRORS[fields, mode], raised[1]), (raised, err[-3000:])
    assert ended == {0, 2}, err[-3000:]  # (the others left their loops without an error)
    said = [line for line in err.splitlines() if "an error in the program on rank" in line]
    assert len(said) == 1 and STOPPING.format(rank=1) in said[0] and raised[1] in said[0], said
    assert said[0].startswith("nlevel: rank 0: ") and "every rank ends with exit status 1" in said[0]
    assert err.count("Traceback (most recent call last)") == 1, err[-3000:]  # (the caller's)
    assert re.search(r"RESULTS n=\d+ ok=True", err), err[-3000:]  # (what was committed is right)
    no_death(err)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("ft", FT)
@pytest.mark.parametrize("fields,mode", [("ab", "three"), ("none", "twice")])
def test_the_same_mistake_on_every_rank_ends_the_job_once(tmp_path, mpi_env, fields, mode, ft):
    """Every rank makes the mistake on its first task (under ULFM each rank died in turn, every
    new master with it): each rank that got a task raises it; the master says so once; exit 1."""
    code, err, raised, ended = run(tmp_path, mpi_env, fields, mode, "all", ft)
    assert code == 1, (code, err[-3000:])
    assert raised and all(re.match(ERRORS[fields, mode], e) for e in raised.values()), (raised, err[-3000:])
    assert set(raised) | ended == set(range(RANKS)) and not set(raised) & ended, (raised, ended, err[-3000:])
    said = [line for line in err.splitlines() if "an error in the program on rank" in line]
    assert len(said) == 1 and said[0].startswith("nlevel: rank 0: "), said
    assert err.count("Traceback (most recent call last)") == len(raised), err[-3000:]
    no_death(err)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("ft", FT)
def test_an_app_whose_do_job_returns_a_wrong_result_stops_the_job_once_with_its_report(tmp_path, mpi_env, ft):
    """``python -m nlevel.run``: the same stop; the report is written and says why; exit status 1."""
    launcher = [os.path.join(BIN, "nlevel-mpiexec"), *(["--with-ft", "ulfm"] if ft else []), "-n", str(RANKS)]
    cmd = [*launcher, sys.executable, "-m", "nlevel.run", BAD_APP, "--checkpoint", "run.h5", "--report", "r.json"]
    try:
        proc = run_bounded(cmd, 120, cwd=tmp_path, env=mpi_env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hung\n{exc.stderr}")
    err = "\n".join(line.lstrip("\0 ") for line in proc.stderr.splitlines())
    assert proc.returncode == 1, (proc.returncode, err[-3000:])
    said = [line for line in err.splitlines() if "an error in the program on rank" in line]
    assert len(said) == 1 and "result of task 7 must be 2 numbers (a, b), got (1.0, 2.0, 3.0)" in said[0], err[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["stopped"].startswith("an error in the program on rank ") and not report["complete"]
    [e] = report["user_errors"]
    assert "result of task 7" in e["error"] and 7 not in completed_ids(tmp_path / "run.h5")
    assert "fix it, then the same command resumes" in proc.stdout + err
    no_death(err)
