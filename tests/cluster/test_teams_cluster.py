"""Teams (issue 36) on the emulated cluster (tests/cluster/conftest.py): three nodes of two ranks.

k = 2 with the ranks placed round-robin over the nodes (rank r on node r mod 3): one team per
node, (0, 3), (1, 4), (2, 5), never two consecutive ranks across nodes; k = 4 (more than a node
holds): a team takes two whole nodes, the third node's ranks are left over and said once.
"""

from __future__ import annotations

import os

import pytest

from ..conftest import ROOT, run_bounded
from ..e2e.test_cli import completed_ids
from .test_cluster import job, report

APP = os.path.join(ROOT, "tests", "apps", "team_app.py")


def ran(tmp_path) -> dict[int, list[tuple[int, int, int]]]:
    """World rank -> (task id, team size, team rank) of each execution (tests/apps/team_app.py's log)."""
    out = {}
    for path in (tmp_path / "logs").iterdir():
        if path.name.startswith("exec-"):
            rows = [line.split() for line in path.read_text().splitlines()]
            out[int(path.name[5:-4])] = [(int(a), int(b), int(c)) for a, b, c, _ in rows]
    return out


def teams_job(cluster, tmp_path, env, k, n=120, extra=()):
    cmd, env = job(cluster, tmp_path, env, ["--ranks-per-task", str(k), "--n", str(n), "--sleep-ms", "1"],
                   extra=extra)
    cmd = [c if c != os.path.join(ROOT, "tests", "apps", "where_app.py") else APP for c in cmd]
    return run_bounded(cmd, 200, cwd=tmp_path, env=env)


@pytest.mark.timeout(240)
def test_teams_of_two_on_nodes_of_two_are_one_team_per_node(cluster, tmp_path, mpi_env):
    proc = teams_job(cluster, tmp_path, mpi_env, 2, extra=("--map-by", "node"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = report(tmp_path)
    assert r["complete"] and completed_ids(tmp_path / "run.h5") == set(range(120))
    assert r["teams"]["node_names"] == ["node1", "node2", "node3"]
    assert r["teams"]["nodes"] == [[0, 3], [1, 4], [2, 5]]
    assert r["teams"]["teams"] == [[0, 3], [1, 4], [2, 5]] and r["teams"]["left"] == []  # (no team across nodes)
    assert r["size"] == 3  # (the farm runs on the three leaders)
    execs = ran(tmp_path)
    for a, b in ((0, 3), (1, 4), (2, 5)):
        assert [t for t, _, _ in execs.get(a, [])] == [t for t, _, _ in execs.get(b, [])]  # same ids, same order
        assert all(me == 0 for *_, me in execs.get(a, [])) and all(me == 1 for *_, me in execs.get(b, []))
    leaders = [t for rows in execs.values() for t, _, me in rows if me == 0]
    assert sorted(leaders) == list(range(120))


@pytest.mark.timeout(240)
def test_a_team_larger_than_a_node_takes_whole_nodes(cluster, tmp_path, mpi_env):
    proc = teams_job(cluster, tmp_path, mpi_env, 4, n=40)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = report(tmp_path)
    assert r["complete"] and r["teams"]["teams"] == [[0, 1, 2, 3]] and r["teams"]["left"] == [4, 5]
    assert proc.stderr.count("in no team of 4") == 1 and "ranks 4, 5 (on node3)" in proc.stderr
    execs = ran(tmp_path)
    assert all(size == 4 for rows in execs.values() for _, size, _ in rows) and 4 not in execs and 5 not in execs
