"""Teams (issue 36) on a real MPI world. Run by tests/e2e/test_mpi_suite.py under mpiexec -n 1, 4 and 7,
with k = 1, 2, 3 ranks per task (7 ranks, k = 2: one rank left over, said once).

Every check ends in an allreduce, so a failure on one rank fails every rank instead of leaving
the others waiting in a collective.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

from nlevel import ConfigError, Farm, get_task_id
from nlevel.api import get_team

comm = MPI.COMM_WORLD
pytestmark = pytest.mark.mpi


def everywhere(ok: bool) -> bool:
    return bool(comm.allreduce(bool(ok), op=MPI.LAND))


def teams_of(k: int) -> tuple[list[list[int]], list[int]]:
    """The layout on one node: consecutive ranks, the rest left over."""
    n = comm.Get_size()
    full = n - n % k
    return [list(range(i, i + k)) for i in range(0, full, k)], list(range(full, n))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_every_rank_of_a_team_runs_the_same_ids_and_each_id_runs_on_one_team(k):
    total = 60
    if k > comm.Get_size():
        with pytest.raises(ConfigError) as err:
            Farm(total, None, comm, ranks_per_task=k)
        assert everywhere(f"ranks_per_task {k} is larger than the job's {comm.Get_size()} process(es)"
                          in str(err.value))
        return
    mine: list[int] = []
    sizes = set()
    with Farm(total, None, comm, ranks_per_task=k) as farm:
        for tid in farm:
            team = farm.team
            sizes.add(team.Get_size())
            got = np.zeros(1, np.int64)
            team.Allreduce(np.array([tid], np.int64), got)  # a collective on the team's own communicator
            assert got[0] == tid * team.Get_size()
            mine.append(tid)
            farm.complete(float(tid * 10 + team.Get_rank()))  # the leader's value (team rank 0) is committed
    teams, left = teams_of(k)
    everyone = comm.allgather((mine, sorted(sizes)))
    ok = all(everyone[r][0] == [] for r in left)
    for t in teams:
        ok = ok and all(everyone[r][0] == everyone[t[0]][0] for r in t) and all(everyone[r][1] in ([k], []) for r in t)
    ran = [i for t in teams for i in everyone[t[0]][0]]
    ok = ok and sorted(ran) == list(range(total))
    if comm.rank == 0:
        r = farm.report
        ids, values = farm.results()
        ok = ok and r is not None and r["complete"] and r["committed"] == total
        ok = ok and sorted(ids.tolist()) == list(range(total)) and np.array_equal(values, ids * 10.0)
        if k > 1:
            ok = ok and r["teams"]["teams"] == teams and r["teams"]["left"] == left
    else:
        ok = ok and farm.report is None and farm.results() is None
    assert everywhere(ok)


@pytest.mark.timeout(120)
def test_get_task_id_with_teams_and_its_communicator():
    k = 2 if comm.Get_size() >= 2 else 1
    mine = []
    while (tid := get_task_id(40, None, comm, ranks_per_task=k)) >= 0:
        team = get_team(comm)
        assert team.Get_size() == k
        assert team.bcast(tid if team.Get_rank() == 0 else None, root=0) == tid
        mine.append(tid)
    teams, left = teams_of(k)
    everyone = comm.allgather(mine)
    ran = sorted(i for t in teams for i in everyone[t[0]])
    ok = ran == list(range(40)) and all(everyone[r] == everyone[t[0]] for t in teams for r in t)
    assert everywhere(ok and all(everyone[r] == [] for r in left))


@pytest.mark.timeout(120)
def test_a_team_that_leaves_its_loop_gives_its_ids_back():
    """Every rank of team 0 leaves after its second task; the ids it had not run run on the others."""
    k = 2 if comm.Get_size() >= 4 else 1
    teams, _ = teams_of(k)
    in_team0 = comm.rank in teams[0]
    mine = []
    with Farm(50, None, comm, ranks_per_task=k) as farm:
        for tid in farm:
            mine.append(tid)
            farm.complete()
            if in_team0 and len(mine) == 2 and len(teams) > 1:
                break
    everyone = comm.allgather(mine)
    ran = sorted(i for t in teams for i in everyone[t[0]])
    ok = ran == list(range(50)) and all(everyone[r] == everyone[t[0]] for t in teams for r in t)
    if comm.rank == 0:
        ok = ok and farm.report is not None and farm.report["complete"]
    assert everywhere(ok)


@pytest.mark.timeout(120)
def test_a_members_failure_fails_its_teams_task():
    if comm.Get_size() < 2:
        pytest.skip("a team of two needs two processes")
    with Farm(20, None, comm, ranks_per_task=2) as farm:
        for tid in farm:
            if tid == 5 and farm.team.Get_rank() == 1:  # (before any collective of the task: nobody waits)
                farm.fail("Traceback ...\nValueError: task 5 is broken on a member")
                continue
            farm.complete(1.0)
    ok = True
    if comm.rank == 0:
        failed = farm.report["failed_tasks"]
        ok = [f["id"] for f in failed] == [5] and "team member 1" in failed[0]["error"]
        ok = ok and "task 5 is broken on a member" in failed[0]["error"] and farm.report["committed"] == 19
    ok = ok and farm._rt.exit_code == 1  # (every rank, followers too, ends with the job's status ...)
    farm._rt.exit_code = None  # (... but this pytest process runs more tests)
    assert everywhere(ok)


@pytest.mark.timeout(120)
def test_each_team_gets_its_own_gpus_from_a_fake_list():
    k = 2 if comm.Get_size() >= 2 else 1
    teams, left = teams_of(k)
    saved = {v: os.environ.get(v) for v in ("NLEVEL_GPUS", "CUDA_VISIBLE_DEVICES")}
    os.environ["NLEVEL_GPUS"] = ",".join(f"g{i}" for i in range(2 * len(teams)))
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    try:
        with Farm(8, None, comm, ranks_per_task=k, gpus_per_task=2) as farm:
            seen = os.environ.get("CUDA_VISIBLE_DEVICES")
            for _ in farm:
                pass
    finally:
        for v, value in saved.items():
            if value is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = value
    everyone = comm.allgather(seen)
    ok = all(everyone[r] == f"g{2 * i},g{2 * i + 1}" for i, t in enumerate(teams) for r in t)
    assert everywhere(ok and all(everyone[r] == "" for r in left))


@pytest.mark.timeout(120)
def test_too_few_gpus_fail_on_every_rank():
    saved = os.environ.get("NLEVEL_GPUS")
    os.environ["NLEVEL_GPUS"] = "0"
    try:
        with pytest.raises(ConfigError) as err:
            Farm(8, None, comm, gpus_per_task=2)
    finally:
        if saved is None:
            os.environ.pop("NLEVEL_GPUS")
        else:
            os.environ["NLEVEL_GPUS"] = saved
    assert everywhere("has 1 GPU(s)" in str(err.value) and f"{2 * comm.Get_size()} needed" in str(err.value))


@pytest.mark.timeout(120)
def test_each_tasks_output_goes_to_its_own_files(mpi_tmp_path):
    k = 2 if comm.Get_size() >= 2 else 1
    out = os.path.join(str(mpi_tmp_path), "out")
    with Farm(12, None, comm, ranks_per_task=k, task_output=out) as farm:
        for tid in farm:
            os.write(1, f"task {tid} on team rank {farm.team.Get_rank()}\n".encode())
            os.write(2, f"fd 2 of task {tid}\n".encode())
    comm.Barrier()
    ok = True
    if comm.rank == 0:
        names = sorted(os.listdir(out))
        want = sorted([f"{t}.out" for t in range(12)] + [f"{t}.err" for t in range(12)]
                      + ([f"{t}.1.out" for t in range(12)] + [f"{t}.1.err" for t in range(12)] if k == 2 else []))
        ok = names == want
        ok = ok and open(os.path.join(out, "7.out")).read() == "task 7 on team rank 0\n"
        ok = ok and open(os.path.join(out, "7.err")).read() == "fd 2 of task 7\n"
        if k == 2:
            ok = ok and open(os.path.join(out, "7.1.out")).read() == "task 7 on team rank 1\n"
    assert everywhere(ok)
