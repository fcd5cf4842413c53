"""The cost model's predictions for a few fixed plans beside the planner's own choice.

The case of docs/paper.md's comparison with Herbein et al. (many short tasks on a large
allocation): 16,384 processes, 64 tasks per process of 1 s (and of 0.1 s), a server spending
0.5 ms per message, 50 us per message, nlevel's default one-sided costs. Each plan is evaluated
by ``nlevel.model.cost.predict``, the planner's own model; the chosen plan is what ``python -m
nlevel.plan`` prints for the same arguments. No MPI, no simulation: seconds on one core.

    python bench/plan_cases.py --json bench/results/plan_cases.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import replace
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from provenance import record  # noqa: E402

from nlevel.config import Config  # noqa: E402
from nlevel.model.cost import Prediction, Workload, predict  # noqa: E402
from nlevel.model.plan import Plan  # noqa: E402
from nlevel.model.planner import choose_plan  # noqa: E402
from nlevel.roles.autoplan import costs_of  # noqa: E402

#: The fixed plans, by name: the centralized one, the paper's DOCK layout, and a 4-level tree.
PLANS = {"2 levels (centralized)": Plan(2), "3 levels, regions 128": Plan(3, (128,)),
         "4 levels, regions 16 x 8": Plan(4, (16, 8))}


def _row(name: str, p: Prediction) -> dict[str, Any]:
    def clean(x: float) -> float | None:
        return x if math.isfinite(x) else None

    return {"name": name, "plan": p.plan.to_dict(), "makespan_s": clean(p.makespan), "overhead": clean(p.overhead),
            "busiest_rho": clean(p.busiest), "feasible": p.feasible}


def case(procs: int, task_s: float, tasks_per_proc: int, service_time: float, msg_time: float) -> dict[str, Any]:
    """The fixed plans and the planner's choice for one workload."""
    costs = costs_of(replace(Config(), service_time=service_time, msg_time=msg_time))
    work = Workload.uniform(procs, task_s, task_s, procs * tasks_per_proc)
    chosen = choose_plan(work, costs)
    regions = " x ".join(map(str, chosen.plan.regions))
    name = f"chosen: {chosen.plan.levels} levels" + (f", regions {regions}" if regions else "")
    return {"procs": procs, "task_s": task_s, "tasks_per_proc": tasks_per_proc, "service_time_s": service_time,
            "msg_time_s": msg_time, "plans": [_row(k, predict(v, work, costs)) for k, v in PLANS.items()]
            + [_row(name, chosen.chosen)]}


def build_parser() -> argparse.ArgumentParser:
    """The command line (also what ``docs/render.py --check`` parses a saved result's command with)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=int, default=16384, help="processes (default 16384)")
    p.add_argument("--task-times", default="1,0.1", help="task seconds, one case each (default 1,0.1)")
    p.add_argument("--tasks-per-proc", type=int, default=64, help="tasks per process (default 64)")
    p.add_argument("--service-time", type=float, default=5e-4, help="a server's seconds per message (default 5e-4)")
    p.add_argument("--msg-time", type=float, default=5e-5, help="one message, one way, seconds (default 5e-5)")
    p.add_argument("--json", metavar="FILE", help="write the cases and their provenance here")
    return p


def main(argv: list[str] | None = None) -> int:
    o = build_parser().parse_args(argv)
    cases = [case(o.procs, float(t), o.tasks_per_proc, o.service_time, o.msg_time) for t in o.task_times.split(",")]
    for c in cases:
        print(f"{c['procs']} processes, {c['tasks_per_proc']} tasks of {c['task_s']} s each:")
        for r in c["plans"]:
            print(f"  {r['name']}: makespan {r['makespan_s']} s, overhead {r['overhead']}, "
                  f"busiest rho {r['busiest_rho']}, feasible {r['feasible']}")
    if o.json:
        prov = record([os.path.abspath(__file__), *(argv if argv is not None else sys.argv[1:])])
        with open(o.json, "w") as f:
            json.dump({"provenance": prov, "cases": cases}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
