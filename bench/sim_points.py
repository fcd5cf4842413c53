"""Simulated overhead vs processes, classic and nlevel, up to 32,768: the notebook's data.

Runs ``python -m nlevel.sim ... --json`` (one process per point, so a point that runs for
minutes is just a slow subprocess) for each workload, plan and process count, and saves
every point to ``--json`` (default ``bench/results/sim_points.json``) as soon as it is done.
A point already in the file is not run again, so an interrupted run resumes, and
``--max-procs 32768`` later adds the big points to a file made with ``--max-procs 8192``.

Workloads (``WORKLOADS``; the times are given explicitly so the file does not depend
on whatever calibration the machine holds):

* ``scaled``: the paper's micro benchmark scaled by 1/1000, 2-5 ms tasks, with this
  machine's measured service time (24 us per request) and message time (70 us one way;
  README, "Before spending an allocation"). It continues the curves the suite measures
  at 2-8 processes.
* ``paper``: the paper's own job, 2-5 s tasks, with a master as slow as the paper's
  Sunway one (250 us per request, 20 us messages), which reproduces its > 50 % classic
  overhead at 32,768 (README, "Scale by simulation").
* ``paper-long``: the paper's 60-180 s tasks with the same master, at the largest counts
  only (the paper reports them at 32,768).

Plans: ``classic`` (2 levels, one id per request) and ``auto`` (the queueing model's
choice, as nlevel makes it). 100 tasks per process, as in the paper.

    .venv/bin/python bench/sim_points.py [--max-procs 8192] [--procs 32768] [--workloads paper,paper-long]
        [--json bench/results/sim_points.json]

Cost: one core; points from 300,000 tasks on run on the compiled engine (see
``nlevel.sim.build``): about 1.5 min for one point at 32,768 (5 min interpreted).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import provenance  # noqa: E402

PROCS = (2, 4, 8, 32, 128, 512, 1024, 2048, 4096, 8192, 16384, 32768)
WORKLOADS: dict[str, dict[str, Any]] = {
    "scaled": {"task_time": "0.002:0.005", "service_time": 24e-6, "msg_time": 70e-6, "procs": PROCS},
    "paper": {"task_time": "2:5", "service_time": 250e-6, "msg_time": 20e-6, "procs": PROCS},
    "paper-long": {"task_time": "60:180", "service_time": 250e-6, "msg_time": 20e-6, "procs": (1024, 8192, 32768)},
}
PLANS = ("classic", "auto")


def key(workload: str, plan: str, procs: int) -> str:
    """The point's key in the JSON file."""
    return f"{workload}/{plan}/{procs}"


def simulate_point(workload: str, plan: str, procs: int, tasks_per_proc: int, timeout: float) -> dict[str, Any]:
    """Run one ``python -m nlevel.sim --json`` and return its report plus the workload name."""
    w = WORKLOADS[workload]
    cmd = [
        sys.executable, "-m", "nlevel.sim", "--procs", str(procs), "--task-time", w["task_time"],
        "--tasks-per-proc", str(tasks_per_proc), "--plan", plan,
        "--service-time", repr(w["service_time"]), "--msg-time", repr(w["msg_time"]), "--json",
    ]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    point: dict[str, Any] = json.loads(proc.stdout)
    point.update(workload=workload, plan_name=plan, wall_seconds=time.perf_counter() - t0,
                 command=" ".join(["python", *cmd[1:]]))
    return point


def build_parser() -> argparse.ArgumentParser:
    """The command line (also what ``docs/render.py --check`` parses a saved result's command with)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-procs", type=int, default=8192, help="largest process count to simulate (default 8192)")
    p.add_argument("--procs", help="only these process counts, comma-separated (default: every count of each workload)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, from {', '.join(WORKLOADS)}")
    p.add_argument("--tasks-per-proc", type=int, default=100, help="tasks per process (default 100, as in the paper)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per point (default 1800)")
    p.add_argument("--json", default=os.path.join(HERE, "results", "sim_points.json"), help="the file to fill in")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    options = p.parse_args(argv)
    data: dict[str, Any] = {"points": {}}
    if os.path.exists(options.json):
        with open(options.json) as f:
            data = json.load(f)
    data["workloads"] = {k: {**v, "procs": list(v["procs"])} for k, v in WORKLOADS.items()}
    data["machine"] = {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
                       "python": platform.python_version()}
    todo = [
        (w, plan, n) for w in options.workloads.split(",") for n in WORKLOADS[w]["procs"] for plan in PLANS
        if n <= options.max_procs and (options.procs is None or str(n) in options.procs.split(","))
    ]
    todo.sort(key=lambda t: t[2])  # small first: a short run still covers every curve
    for w, plan, n in todo:
        k = key(w, plan, n)
        if k in data["points"] and data["points"][k].get("tasks_per_proc") == options.tasks_per_proc:
            continue
        point = simulate_point(w, plan, n, options.tasks_per_proc, options.timeout)
        point["tasks_per_proc"] = options.tasks_per_proc
        point["provenance"] = provenance.record()
        data["points"][k] = point
        if os.path.exists(options.json):  # another run may have added points meanwhile: keep them
            with open(options.json) as f:
                data["points"] = {**json.load(f)["points"], **data["points"]}
        print(f"{k:28} overhead {100 * point['overhead']:7.2f} %  plan {point['plan']['levels']} levels "
              f"{point['plan']['regions']}  ({point['wall_seconds']:.0f} s)", flush=True)
        tmp = options.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, options.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
