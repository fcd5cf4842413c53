"""The progress line shows what the model sees (issue 16 item 3), whatever the planner records."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from nlevel.model.plan import Plan
from nlevel.runtime.progress import Progress, describe_state, model_state

DECISION = {
    "rho_measured": 0.31, "reason": "keep the current plan: smallest plan ...", "switch": False,
    "current_predicted": {"overhead": 0.031, "levels": [{"rho": 0.42}, {"rho": 0.07}]},
    "chosen": {"chosen": {"overhead": 0.02, "levels": [{"rho": 0.2}]}},
}


def station(decisions=None, busy=None, plans=(Plan(2),)):
    planner = SimpleNamespace(decisions=decisions) if decisions is not None else None
    return SimpleNamespace(plans=list(plans), planner=planner, server=SimpleNamespace(busy_below=busy))


def test_the_busiest_server_and_both_overheads():
    s = model_state(station([DECISION], busy=9.0), size=4, elapsed=2.5)
    assert s["levels"] == 2 and s["rho"] == 0.42 and s["predicted"] == 0.031 and s["rho_measured"] == 0.31
    assert s["measured"] == pytest.approx(0.1) and s["decisions"] == 1
    assert describe_state(s) == "2 levels, chunk auto; rho 0.42 (busiest server); overhead predicted 3.1%, measured 10.0%"


def test_after_a_switch_the_chosen_plans_prediction_is_shown():
    s = model_state(station([{**DECISION, "switch": True}], plans=(Plan(2), Plan(3, (2,)))), size=8, elapsed=0.5)
    assert (s["levels"], s["rho"], s["predicted"]) == (3, 0.2, 0.02)
    assert "measured" not in s  # under a second: not yet


@pytest.mark.parametrize("decisions", [
    [], [{"time": 1.0, "reason": "forced", "switch_to": {}}], [{"current_predicted": None}],
    [{"current_predicted": {"levels": [{"rho": None}, "x"], "overhead": "?"}}], ["not a dict"],
])
def test_what_the_planner_does_not_record_is_left_out(decisions):
    s = model_state(station(decisions, busy=None), size=4, elapsed=5.0)
    assert "rho" not in s and "predicted" not in s and "measured" not in s
    assert describe_state(s).startswith("2 levels")


def test_no_planner_no_station_parts():
    assert model_state(SimpleNamespace(), 4, 3.0) == {}
    assert describe_state({}) == ""
    assert describe_state({"plan": "2 levels", "predicted": 1.7}) == "2 levels; overhead predicted over 100% (no steady state)"


def test_the_plain_line_carries_the_state_and_a_broken_state_never_stops_it():
    p = Progress(100, lambda: 40, "2 levels", stream=io.StringIO(), state=lambda: {"plan": "3 levels", "rho": 0.5})
    assert p.line(40, 2.0).endswith("[3 levels; rho 0.50 (busiest server)]")

    def broken():
        raise KeyError("levels")

    p = Progress(100, lambda: 40, "2 levels", stream=io.StringIO(), state=broken)
    assert p.line(40, 2.0).endswith("[2 levels]")
