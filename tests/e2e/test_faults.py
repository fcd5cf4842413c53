"""Issue 4's proof: real signals from outside (nlevel.testing.inject), the promise checked from outside.

Without ULFM a dead rank must stop the job within seconds with the checkpoint intact, and
the same command resumes it. With ``--with-ft ulfm`` the job must finish on the survivors:
exit 0, every id committed exactly once, re-executions only of ids in flight on dead ranks.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from nlevel.testing import inject
from nlevel.testing.inject import Schedule, plan_of

APP = "tests.apps.logging_app"
KILL_TO_END_S = 30.0  # without ULFM, a failure must end the job within this long


LEASE = "2"  # seconds: a SIGSTOPped rank is found by its lease (default 5 s) sooner


def launch(tmp_path, mpi_env, logs, size, plan, n, schedule, *, ft=None, timeout=90.0, sleep_ms=5):
    logs.mkdir(exist_ok=True)
    env = {**mpi_env, "NLEVEL_TEST_LOG_DIR": str(logs)}
    args = [APP, "--n", str(n), "--sleep-ms", str(sleep_ms), "--checkpoint", "run.h5",
            "--checkpoint-interval", "0.1", "--report", "r.json", "--quiet"]
    if schedule is not None and schedule.signal == "STOP":
        args += ["--lease", LEASE]
    # inject.run kills the whole job (process group + every marked pid) on a hang and
    # after any failure, so nothing outlives the test.
    return inject.run(size, plan, args, schedule, ft=ft, cwd=str(tmp_path), env=env,
                      checkpoint="run.h5", report="r.json", timeout=timeout)


def explain(res) -> str:
    return (f"exit {res.returncode}, hung={res.hung}, kills={[(k.rank, k.role, k.signal) for k in res.kills]}"
            f"\n--- stdout\n{res.stdout[-3000:]}\n--- stderr\n{res.stderr[-3000:]}")


# ---------------------------------------------------------------- without ULFM

@pytest.mark.timeout(300)
@pytest.mark.parametrize("role, sig", [
    ("slave", "KILL"),
    ("region-master", "KILL"),
    ("master", "KILL"),  # (the README's fault table: "the master dies | as above")
    # A stopped rank is never detected by MPI: only the parent's task lease can kill it.
    pytest.param("slave", "STOP"),
])
def test_without_ulfm_a_killed_rank_stops_the_job_and_the_same_command_resumes(tmp_path, mpi_env, role, sig):
    n, size, plan = 2000, 6, plan_of(3, (2,))
    first = launch(tmp_path, mpi_env, tmp_path / "logs1", size, plan, n,
                   Schedule(role=role, signal=sig, after_committed=300, seed=1),
                   timeout=120 if sig == "KILL" else 75)
    assert first.kills, f"no kill landed (the job ended first?)\n{explain(first)}"
    assert first.kills[0].role == role
    assert not first.hung, f"the job did not stop after SIG{sig} of a {role} (library bug)\n{explain(first)}"
    ended_in = first.ended_at - first.kills[0].time
    assert ended_in < KILL_TO_END_S, f"the job took {ended_in:.1f} s to stop\n{explain(first)}"
    assert first.returncode != 0, f"a failed run must not exit 0\n{explain(first)}"
    assert first.leftover == [], f"ranks {first.leftover} outlived the launcher"

    at_kill = inject.committed_ids(tmp_path / "run.h5")  # must be readable: the guarantee
    assert 300 <= len(at_kill) < n, f"kill did not land mid-run ({len(at_kill)} committed)"

    second = launch(tmp_path, mpi_env, tmp_path / "logs2", size, plan, n, None, timeout=120)
    assert not second.hung and second.returncode == 0, explain(second)
    again = inject.executions([tmp_path / "logs2"])
    assert not set(again) & at_kill, "a task the checkpoint recorded as done ran again"
    assert all(len(r) == 1 for r in again.values()), "a task ran twice in a failure-free rerun"
    assert inject.committed_ids(tmp_path / "run.h5") == set(range(n))
    assert second.report and second.report["complete"] and second.report["recomputed"] == 0
    # Over both runs, every id ran; ids run twice were in flight at the kill (not committed).
    both = inject.executions([tmp_path / "logs1", tmp_path / "logs2"])
    assert set(both) == set(range(n))


# ---------------------------------------------------------------- with ULFM

FAILURE_KEYS = {"rank", "role", "detected_at", "recovered_at", "recovery_ms", "requeued", "held"}

# (size, levels, regions, schedule): every role, 1-3 victims, 2- to 4-level plans, 8-12 ranks.
MATRIX = [
    pytest.param(8, 2, (), Schedule(role="slave", seed=1), id="slave-1-L2"),
    pytest.param(10, 3, (2,), Schedule(role="slave", count=3, spacing=0.05, seed=2), id="slave-3-L3"),
    pytest.param(8, 3, (2,), Schedule(role="slave", signal="STOP", seed=3), id="slave-stop-L3"),
    pytest.param(8, 3, (2,), Schedule(role="region-master"), id="region-1-L3"),
    pytest.param(8, 3, (2,), Schedule(role="region-master", signal="STOP"), id="region-stop-L3"),
    pytest.param(12, 4, (2, 2), Schedule(role="region-master", count=2, seed=4), id="region-2-L4"),
    pytest.param(8, 2, (), Schedule(role="master"), id="master-1-L2"),
    pytest.param(10, 3, (2,), Schedule(role="master"), id="master-1-L3"),
    pytest.param(9, 3, (2,), Schedule(role="region-master", then_new_leader=0.1), id="new-leader-L3"),
    pytest.param(12, 3, (3,), Schedule(role="any", count=3, spacing=0.1, seed=5), id="any-3-L3"),
    pytest.param(8, 2, (), Schedule(role="master", then_new_leader=0.1), id="new-master-L2"),
    # The README's fault table, "master and deputy die together": two SIGKILLs back to back (no
    # spacing), so the deputy dies with the copy of the commits; rank 2 takes over from the file.
    pytest.param(8, 2, (), Schedule(role="master", count=2), id="master-deputy-together-L2"),
    pytest.param(10, 3, (2,), Schedule(role="master", count=2), id="master-deputy-together-L3"),
    # Issue 14: master and deputy hung together; the second watcher kills one, then the other.
    pytest.param(7, 2, (), Schedule(role="master", signal="STOP", then_new_leader=0.1), id="master-deputy-stop-L2"),
]


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("size, levels, regions, schedule", MATRIX)
def test_with_ulfm_the_job_survives(tmp_path, mpi_env, size, levels, regions, schedule):
    n, plan = 3000, plan_of(levels, regions)
    schedule = dataclasses.replace(schedule, after_committed=300)
    res = launch(tmp_path, mpi_env, tmp_path / "logs", size, plan, n, schedule, ft="ulfm", timeout=120)
    assert res.kills, f"no kill landed\n{explain(res)}"
    if schedule.role == "master" and schedule.count == 2:  # (together: the deputy before it could take over)
        assert [k.rank for k in res.kills] == [0, 1] and res.kills[1].time - res.kills[0].time < 0.05, explain(res)
    assert not res.hung, f"hang after {[(k.rank, k.role) for k in res.kills]}\n{explain(res)}"
    assert res.returncode == 0, explain(res)
    # A new master took the checkpoint's lock over from the dead one and removed it at the end.
    assert not (tmp_path / "run.h5.lock").exists(), (tmp_path / "run.h5.lock").read_text()
    a = inject.audit(n, [tmp_path / "logs"], tmp_path / "run.h5", res.report, res.kills, size, plan)
    msg = json.dumps({**a, "report_failures": (res.report or {}).get("failures")}, default=str)  # untruncated
    assert a["lost"] == 0, msg
    assert a["double_commits"] == 0, msg
    assert a["executed_ids"] == n, msg
    assert a["re_executed_elsewhere"] == [], msg
    assert res.report is not None and res.report["complete"], msg
    failures = res.report["failures"]
    assert sorted(f["rank"] for f in failures) == sorted(k.rank for k in res.kills), msg
    for f in failures:
        assert FAILURE_KEYS <= set(f), msg
        # (a death whose record was lost with the rank that recovered from it has no times)
        assert f["detected_at"] is None or f["detected_at"] <= f["recovered_at"], msg
    assert a["within_bound"], msg
    # A victim stopped with SIGSTOP must have been killed by the library (lease expiry).
    assert res.leftover == [], f"ranks {res.leftover} outlived the job"
