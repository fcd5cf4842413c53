"""The in-job planner's decision rule (:class:`nlevel.roles.autoplan.AutoPlanner`), driven by hand."""

from __future__ import annotations

from nlevel.config import Config
from nlevel.model.cost import flush_age
from nlevel.model.plan import Plan
from nlevel.roles.autoplan import AutoPlanner


def _decide(procs: int, plan: Plan, task_s: float, service_s: float, msg_s: float, rate: float = 16 / 0.05,
            committed: float = 0.02) -> tuple[Plan | None, dict]:
    """Feed the planner reports of ``task_s`` tasks at the rate ``procs`` ranks make them, and
    ``rate`` messages per second (one flush per region-master per batch age, 16 x 16 tree: 16 at
    the master); return its first decision."""
    cfg = Config(service_time=service_s, msg_time=msg_s)
    ap = AutoPlanner(procs, cfg, plan, total=100 * procs)
    now = task_s
    for _ in range(8):
        ap.on_tasks(128, 128 * task_s, 128 * task_s * task_s, task_s * 1.2, now)
    assert ap.tick(now, 0.01) is None  # the sampling window opens
    end = ap.next_check(now)
    t = now
    while t < end:
        ap.on_message(t)
        t += 1 / rate
    ap.on_service(service_s)
    return ap.tick(end, committed), ap.report()[-1]


def test_a_start_tree_gives_way_to_the_shallower_plan_the_measurements_accept():
    # 32,768 x 60-180 s with the paper's slow master: the start tree (16 x 16) is predicted
    # under C, but so is classic, with 272 servers fewer: the paper's rule takes the shallower.
    start = Plan(4, (16, 16), reason="start")
    plan, rec = _decide(32768, start, 120.0, 0.5e-3, 50e-6, rate=16 / flush_age(0.05, 120.0))  # (flushes each 1 s)
    assert plan is not None and rec["switch"], rec["reason"]
    assert (plan.levels, plan.regions) in {(2, ()), (3, plan.regions)} and plan.levels < 4
    assert rec["reason"].startswith("switch to fewer servers")


def test_a_plan_the_model_would_not_shrink_is_kept():
    # Millisecond tasks on the same tree: nothing shallower is acceptable at 32,768, or it is the same plan.
    start = Plan(4, (16, 16), reason="start")
    plan, rec = _decide(32768, start, 0.0035, 30e-6, 2e-6)
    if plan is not None:
        assert plan.levels >= 3  # (never classic: one master cannot take 32,768 ranks' millisecond claims)


def test_no_switch_to_fewer_servers_when_the_regroup_costs_more_than_it_can_save():
    # 32,768 x 2-5 s with the slow master: a regroup may cost 32,768 x 0.5 ms = 16 s, more than
    # half a point of a job of ~350 s: the start tree stays unless it is in trouble.
    start = Plan(4, (16, 16), reason="start")
    plan, rec = _decide(32768, start, 3.5, 0.5e-3, 50e-6)
    assert not rec["reason"].startswith("switch to fewer servers"), rec["reason"]


def test_the_burst_of_flushes_at_the_end_of_a_job_does_not_move_it_to_another_plan():
    # 32,768 x 2-5 s on the 16 x 16 tree, 98 % committed: every region flushes as its ranks run
    # out, and the master measures rho near 0.9. Mid-job that is trouble; 7 s before the end a
    # switch only costs (it did: 4.3 % predicted, 11.8 % simulated, in nlevel's own simulator).
    start = Plan(4, (16, 16), reason="start")
    burst = 1787.0  # messages per second the master measured then
    plan, rec = _decide(32768, start, 3.5, 0.5e-3, 50e-6, rate=burst, committed=0.02)
    assert plan is not None and rec["switch"], rec["reason"]  # (mid-job the same load is trouble)
    plan, rec = _decide(32768, start, 3.5, 0.5e-3, 50e-6, rate=burst, committed=0.98)
    assert plan is None and not rec["switch"]
    assert rec["reason"].startswith("keep the current plan: the job is ending"), rec["reason"]
