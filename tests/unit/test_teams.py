"""Teams (issue 36) without MPI: the layout arithmetic, the GPU shares, the device list, per-task
output files, the app's ``do_job(task_id, comm)``, and a team's death counted as a death by the roles."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nlevel.config import Config
from nlevel.errors import ConfigError
from nlevel.model.plan import Plan
from nlevel.model.teams import DeviceShortage, assign_devices, layout, left_over_line
from nlevel.runtime import devices
from nlevel.runtime.app import _takes_comm
from nlevel.runtime.output import check_dir, files_of
from nlevel.testing.network import Network

from ..conftest import ROOT, examples


# ---------------------------------------------------------------- the layout

@pytest.mark.parametrize("size,k,teams,left", [
    (1, 1, [(0,)], ()),
    (4, 1, [(0,), (1,), (2,), (3,)], ()),
    (4, 2, [(0, 1), (2, 3)], ()),
    (4, 3, [(0, 1, 2)], (3,)),
    (7, 1, [(r,) for r in range(7)], ()),
    (7, 2, [(0, 1), (2, 3), (4, 5)], (6,)),
    (7, 3, [(0, 1, 2), (3, 4, 5)], (6,)),
])
def test_one_node_is_cut_into_teams_of_consecutive_ranks(size, k, teams, left):
    lay = layout([list(range(size))], k)
    assert list(lay.teams) == teams and lay.left == left
    assert lay.leaders == tuple(t[0] for t in teams)


def test_a_team_never_spans_two_nodes_that_can_each_hold_it():
    # Round-robin placement: node A holds the even ranks, node B the odd ones.
    lay = layout([[0, 2, 4], [1, 3, 5]], 2)
    assert lay.teams == ((0, 2), (1, 3)) and lay.left == (4, 5)
    # The emulated cluster of the many-nodes issue: 3 nodes x 2 ranks, k = 2: one team per node.
    lay = layout([[0, 1], [2, 3], [4, 5]], 2)
    assert lay.teams == ((0, 1), (2, 3), (4, 5)) and lay.left == ()


def test_teams_larger_than_a_node_take_whole_nodes():
    lay = layout([[0, 1], [2, 3], [4, 5], [6, 7]], 4)
    assert lay.teams == ((0, 1, 2, 3), (4, 5, 6, 7)) and lay.left == ()
    # k not a multiple of the node size: the rest of a team's last node is left over, never shared.
    lay = layout([[0, 1], [2, 3], [4, 5]], 3)
    assert lay.teams == ((0, 1, 2),) and lay.left == (3, 4, 5)
    # Mixed sizes: a node that holds k is cut inside, smaller ones are taken whole.
    lay = layout([[0, 1, 2, 3], [4, 5], [6, 7]], 3)
    assert lay.teams == ((0, 1, 2), (4, 5, 6)) and lay.left == (3, 7)


def test_bad_layout_input_is_refused():
    with pytest.raises(ValueError, match="ranks per task must be an integer >= 1, got 0"):
        layout([[0, 1]], 0)
    with pytest.raises(ValueError, match="on two nodes"):
        layout([[0, 1], [1, 2]], 1)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=6), st.integers(1, 12), st.randoms(use_true_random=False))
def test_every_rank_is_in_one_team_or_left_over(sizes, k, rng):
    ranks = list(range(sum(sizes)))
    rng.shuffle(ranks)
    nodes, at = [], 0
    for n in sizes:
        nodes.append(ranks[at:at + n])
        at += n
    lay = layout(nodes, k)
    flat = [r for t in lay.teams for r in t]
    assert sorted(flat + list(lay.left)) == sorted(ranks) and len(set(flat)) == len(flat)
    assert all(len(t) == k for t in lay.teams)
    node_of = {r: i for i, n in enumerate(nodes) for r in n}
    for t in lay.teams:
        spans = {node_of[r] for r in t}
        if any(len(nodes[i]) >= k for i in spans):
            assert len(spans) == 1  # a node that holds k keeps its teams to itself
    for i, n in enumerate(nodes):  # no node that holds k wastes a team's worth of ranks
        if len(n) >= k:
            assert sum(1 for r in lay.left if node_of[r] == i) < k
    # Nodes taken whole by spanning teams are never shared by two teams.
    owners: dict[int, set[int]] = {}
    for j, t in enumerate(lay.teams):
        for r in t:
            owners.setdefault(node_of[r], set()).add(j)
    assert all(len(o) == 1 for i, o in owners.items() if len(nodes[i]) < k)


def test_the_ranks_left_over_are_named_in_one_line():
    lay = layout([list(range(7))], 2)
    line = left_over_line(lay, ["n1"])
    assert line.count("\n") == 0 and "rank 6 (on n1) in no team of 2" in line and "3 team(s)" in line
    assert left_over_line(layout([list(range(4))], 2)) == ""


# ---------------------------------------------------------------- GPUs

def test_each_team_gets_its_own_devices_from_its_node():
    lay = layout([[0, 1, 2, 3], [4, 5, 6, 7]], 2)
    given_ = assign_devices(lay, [["0", "1", "2", "3"], ["0", "1", "2", "3"]], 2)
    assert given_[0] == given_[1] == ("0", "1") and given_[2] == given_[3] == ("2", "3")
    assert given_[4] == ("0", "1") and given_[6] == ("2", "3")
    lay = layout([list(range(5))], 2)  # rank 4 is left over: no device
    assert assign_devices(lay, [["a", "b", "c", "d", "e"]], 1) == {0: ("a",), 1: ("a",), 2: ("b",), 3: ("b",),
                                                                   4: ()}
    assert set(assign_devices(lay, [[]], 0).values()) == {()}  # 0 per task: nobody's devices change


def test_a_node_with_too_few_devices_is_named_with_the_numbers():
    lay = layout([list(range(4))], 2)
    with pytest.raises(DeviceShortage) as err:
        assign_devices(lay, [["0", "1", "2"]], 2, ["gpu07"], "CUDA_VISIBLE_DEVICES")
    text = str(err.value)
    assert "gpus_per_task 2" in text and "gpu07 has 3 GPU(s)" in text and "4 needed" in text
    assert "CUDA_VISIBLE_DEVICES=0,1,2" in text and "\n" not in text


def test_the_node_list_comes_from_the_fake_list_then_the_allocation_then_the_devices(tmp_path):
    assert devices.node_devices({"NLEVEL_GPUS": "0, 1,2"}, str(tmp_path)) == ("CUDA_VISIBLE_DEVICES", ["0", "1", "2"])
    assert devices.node_devices({"NLEVEL_GPUS": "4,5", "ROCR_VISIBLE_DEVICES": "0"}, str(tmp_path)) == \
        ("ROCR_VISIBLE_DEVICES", ["4", "5"])
    assert devices.node_devices({"ZE_AFFINITY_MASK": "0.0,1.0"}, str(tmp_path)) == ("ZE_AFFINITY_MASK",
                                                                                   ["0.0", "1.0"])
    assert devices.node_devices({}, str(tmp_path)) == ("", [])
    for name in ("nvidia1", "nvidia0", "nvidiactl", "nvidia-uvm", "nvidia10"):
        (tmp_path / name).write_text("")
    assert devices.node_devices({}, str(tmp_path)) == ("CUDA_VISIBLE_DEVICES", ["0", "1", "10"])
    env: dict[str, str] = {}
    devices.apply("CUDA_VISIBLE_DEVICES", ("2", "3"), env)
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3"}
    devices.apply("", (), env)
    assert env == {"CUDA_VISIBLE_DEVICES": ""}  # (a rank in no team sees no GPU)


# ---------------------------------------------------------------- settings

def test_the_settings_are_checked_with_the_value_and_what_was_expected():
    with pytest.raises(ConfigError, match="ranks_per_task must be an integer >= 1, got 0"):
        Config(ranks_per_task=0)
    with pytest.raises(ConfigError, match="gpus_per_task must be an integer >= 0, got -1"):
        Config(gpus_per_task=-1)
    assert Config.from_env({"NLEVEL_RANKS_PER_TASK": "3", "NLEVEL_TASK_OUTPUT": "out"}).ranks_per_task == 3
    with pytest.raises(ConfigError, match="NLEVEL_GPUS_PER_TASK must be an integer"):
        Config.from_env({"NLEVEL_GPUS_PER_TASK": "two"})


# ---------------------------------------------------------------- per-task output

def test_a_task_output_directory_is_checked_without_leaving_anything(tmp_path):
    (tmp_path / "afile").write_text("x")
    assert "is a file; expected a directory" in check_dir(str(tmp_path / "afile"))
    assert "is not a directory" in check_dir(str(tmp_path / "afile" / "sub"))
    assert check_dir(str(tmp_path / "new" / "deeper")) == ""
    assert sorted(os.listdir(tmp_path)) == ["afile"]  # (the probe created and removed them)
    assert check_dir(str(tmp_path)) == "" and sorted(os.listdir(tmp_path)) == ["afile"]
    assert "cannot be created" in check_dir("/proc/nlevel-no-such-dir")


def test_each_task_writes_its_own_files_python_c_and_children(tmp_path):
    """fd 1 and 2 go to the task's files: print, sys.stderr, C's printf, a child process; nlevel's own
    console stream and what comes after the last task keep the job's output."""
    script = textwrap.dedent(f"""
        import ctypes, os, sys
        sys.path.insert(0, {ROOT!r})
        from nlevel.runtime.output import TaskOutput, console
        out = TaskOutput({str(tmp_path / "out")!r})
        libc = ctypes.CDLL(None)
        for tid in (3, 4):
            out.start(tid)
            print(f"python {{tid}}")
            print(f"warn {{tid}}", file=sys.stderr)
            libc.printf(b"c-level %d\\n", tid)
            os.system(f"echo child {{tid}}")
            console(2).write(f"nlevel line during {{tid}}\\n")
        out.end()
        print("after the tasks")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    d = tmp_path / "out"
    assert sorted(os.listdir(d)) == ["3.err", "3.out", "4.err", "4.out"]  # (partial names renamed at the end)
    assert sorted((d / "3.out").read_text().splitlines()) == ["c-level 3", "child 3", "python 3"]
    assert (d / "4.err").read_text() == "warn 4\n"
    assert proc.stdout == "after the tasks\n"
    assert "nlevel line during 3" in proc.stderr and "warn" not in proc.stderr
    (d / "31.out").write_text("")  # (another id that starts with 3)
    assert files_of(str(d), [3, 7]) == {3: [str(d / "3.err"), str(d / "3.out")],
                                        7: [str(d / "7.out"), str(d / "7.err")]}  # (none there: the names it writes)


# ---------------------------------------------------------------- the app and the roles

def test_do_job_gets_the_team_communicator_when_it_asks_for_it():
    assert not _takes_comm(lambda task_id: 0)
    assert _takes_comm(lambda task_id, comm: 0)
    assert _takes_comm(lambda task_id, comm=None: 0)
    assert _takes_comm(lambda *args: 0)
    assert not _takes_comm(lambda task_id, *, comm=None: 0)


@pytest.mark.parametrize("plan,size", [(Plan(2), 3), (Plan(3, (2,)), 7)])
def test_a_death_in_a_team_counts_toward_quarantine_like_a_death(plan, size):
    config = Config(levels=plan.levels, regions=plan.regions, fault_tolerance="on")
    out = Network(size, plan, 40, 1, config=config, team_deaths={7: 2}).run()
    assert out.executed[7] == 3 and out.ledger.complete() and not out.ledger.failed  # run again, then committed
    out = Network(size, plan, 40, 1, config=config, team_deaths={7: 99}).run()
    assert out.executed[7] == 3 and set(out.ledger.failed) == {7}  # the quarantine (3 deaths)
    assert out.ledger.failed[7].kind == "died" and "held by 3 processes that died" in out.ledger.failed[7].error
    assert out.ledger.n_committed == 39


def test_a_leader_whose_team_lost_a_process_records_it_and_lives_on():
    """The leader's record reaches the report through its station (CI: written into a station
    attribute that had moved, it raised, and the leader's process died with it)."""
    from nlevel.model.hierarchy import build
    from nlevel.roles.events import TeamLost
    from nlevel.roles.ledger import Ledger
    from nlevel.roles.station import Station
    from nlevel.testing.network import LocalBoards

    st = Station(build(3, Plan(2)), 2, Config(levels=2, fault_tolerance="on"), lambda: 0.0, LocalBoards(), 40)
    assert st.handle(TeamLost(2, (4, 5), "rank 5 died", 1)) == []
    [record] = st.recovery.failures
    assert (record.rank, record.role, record.held, record.requeued) == (2, "team", 1, 1)
    assert record.how == "team 2 (ranks 4, 5) lost a process: rank 5 died"
    assert not st.failed
