"""What a plan costs (:mod:`nlevel.model.cost`), the choice (:mod:`nlevel.model.planner`) and ``python -m nlevel.plan``."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nlevel.errors import ConfigError
from nlevel.model.cost import Costs, Workload, predict, tail_idle
from nlevel.model.plan import Plan
from nlevel.model.planner import CLASSIC_UP_TO, candidates, choose_plan, first_plan

from ..conftest import examples

service = st.floats(1e-6, 1e-3)
msg = st.floats(0.0, 1e-3)
task = st.floats(1e-3, 1000.0)


def work(procs: int, mean: float, tasks_per_proc: int = 100) -> Workload:
    return Workload(procs, mean, (0.25 * mean) ** 2, 1.5 * mean, tasks_per_proc * procs)


@given(st.integers(8, 20_000), st.floats(0.1, 100.0), st.floats(1.05, 6.0), msg)
@settings(max_examples=examples(40), deadline=None)
def test_rho_above_one_always_adds_a_level(p, t, rho, m):
    # The service time at which the master gets rho times the messages it can handle:
    # every other rank reports each task (chunk 1; tasks longer than the report age, so one
    # report each), (p - 1) / t per second, each costing s.
    s = rho * t / (p - 1)
    costs = Costs(service_time=s, msg_time=m)
    classic = predict(Plan(chunk=1), work(p, t), costs)
    assert not classic.feasible and classic.levels[0].rho_cpu >= 1.0
    d = choose_plan(work(p, t), costs)
    assert d.plan != Plan(chunk=1)
    assert d.chosen.feasible or "every plan has a server above the headroom" in d.reason
    if d.chosen.feasible:
        assert d.plan.levels >= 3 or d.chosen.chunk > 1  # deeper, or fewer messages per task


@given(st.integers(4, 160), st.floats(1e-3, 0.5), st.floats(1e-5, 2e-3), msg, st.floats(0.02, 0.5))
@settings(max_examples=examples(60), deadline=None)
def test_chosen_plan_meets_c_whenever_a_brute_force_plan_does(p, t, s, m, c):
    # Brute force every 2-4 level plan with automatic chunks, every region count.
    costs, w = Costs(service_time=s, msg_time=m), work(p, t)
    options = [Plan()]
    options += [Plan(3, (r,)) for r in range(2, p // 2 + 1)]
    options += [Plan(4, (a, b)) for a in range(2, p // 4 + 1) for b in range(2, p // (2 * a) + 1)]
    best = min((predict(o, w, costs) for o in options if o.min_size() <= p), key=lambda x: x.overhead)
    d = choose_plan(w, costs, threshold=c)
    if best.feasible and best.overhead <= 0.9 * c:  # (the planner's grid of region counts is coarser above 16)
        assert d.predicted_overhead <= c, (d.reason, best.plan)
    if d.predicted_overhead > c:
        assert "no plan meets" in d.reason


@given(st.integers(2, 50_000), task, service, msg)
@settings(max_examples=examples(60), deadline=None)
def test_prediction_is_sane(p, t, s, m):
    for plan in list(candidates(p, t, Costs(service_time=s, msg_time=m)))[:40]:
        pr = predict(plan, work(p, t), Costs(service_time=s, msg_time=m))
        assert 0.0 <= pr.overhead <= 1.0 or math.isinf(pr.makespan)
        assert pr.makespan >= 100 * t * (1 - 1e-9)  # never less than the work per rank
        assert pr.binding


def test_tail_idle_grows_with_spread_and_ranks():
    assert tail_idle(1.0, 0.0, 1.0, 1) == pytest.approx(0.0, abs=1e-12)
    a = tail_idle(1.0, 0.1, 1.5, 100)
    assert 0 < a < tail_idle(1.0, 0.3, 2.0, 100)
    assert a <= 1.5


def test_paper_shape_with_the_paper_machines_service_time():
    # 32,768 processes, 2-5 s tasks: a master that handles ~4,000 messages/s cannot keep up
    # with ~9,600 reports/s, so classic with one id per claim is not feasible; the model adds a level.
    costs = Costs(service_time=2.5e-4, msg_time=2e-5)
    w = Workload.uniform(32768, 2.0, 5.0, 100 * 32768)
    classic = predict(Plan(chunk=1), w, costs)
    assert not classic.feasible
    d = choose_plan(w, costs, 0.10)
    assert d.plan.levels >= 3 and d.predicted_overhead <= 0.10
    assert d.classic is not None and "classic" in d.reason


def test_first_plan_classic_small_tree_large():
    costs = Costs(service_time=3e-5, msg_time=2e-6)
    assert first_plan(CLASSIC_UP_TO, costs).levels == 2
    big = first_plan(32768, costs)
    assert big.levels >= 3 and "32768 processes" in big.reason
    hinted = first_plan(32768, costs, task_time=3.5e-3)
    assert "task-time hint" in hinted.reason


@pytest.mark.parametrize("kwargs,match", [
    (dict(procs=0, task_mean=1.0), "process count must be an integer >= 1, got 0"),
    (dict(procs=8, task_mean=0.0), "task time must be > 0 s, got 0.0"),
    (dict(procs=8, task_mean=-1.0), "task time must be > 0 s"),
])
def test_bad_workload(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Workload(**kwargs)


def test_bad_costs_and_threshold():
    with pytest.raises(ConfigError, match="service_time must be > 0 s, got 0"):
        Costs(service_time=0, msg_time=1e-5)
    with pytest.raises(ConfigError, match="msg_time must be a number of seconds >= 0, got -1"):
        Costs(service_time=1e-5, msg_time=-1)
    with pytest.raises(ConfigError, match="headroom must be in"):
        Costs(service_time=1e-5, msg_time=1e-5, headroom=1.5)
    for c in (0.0, 1.0):
        with pytest.raises(ConfigError, match=r"threshold must be in \(0, 1\)"):
            choose_plan(work(8, 1.0), Costs(service_time=1e-5, msg_time=1e-5), threshold=c)


def plan_cli(*args):
    return subprocess.run([sys.executable, "-m", "nlevel.plan", *args], capture_output=True, text=True, timeout=120)


def test_plan_cli_json_keys():
    proc = plan_cli("--procs", "32768", "--task-time", "2:5", "--service-time", "2.5e-4", "--msg-time", "2e-5",
                    "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["levels"] >= 3 and isinstance(out["regions_per_level"], list)
    assert 0 <= out["predicted_overhead"] <= 0.1
    assert "RuntimeWarning" not in proc.stderr


@pytest.mark.parametrize("args,message", [
    (["--procs", "0", "--task-time", "1"], "--procs must be >= 1, got 0"),
    (["--procs", "8", "--task-time", "-2"], "--task-time"),
    (["--procs", "8", "--task-time", "1", "--threshold", "1.5"], "--threshold must be in (0, 1)"),
    (["--procs", "8"], "--procs and --task-time are required"),
])
def test_plan_cli_bad_input(args, message):
    proc = plan_cli(*args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
