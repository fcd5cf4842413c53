"""How fast ``python -m nlevel.sim`` simulates a 32,768-process farm, 100 tasks per process.

The goal (issue 3) is under 2 minutes on one core for each plan. Each plan runs in its
own child process; the time reported is that child's CPU time (user + system, from
``getrusage(RUSAGE_CHILDREN)``), not wall time, so other load on the machine changes it
less (it still slows a busy core's caches). Events/s is the engine's events over that
CPU time. The overhead and makespan are the simulation's results (they must not depend
on how fast it runs).

``--engine`` is passed on (default auto: the roles compiled with mypyc, see
:mod:`nlevel.sim.build`; build it first, e.g. with a small ``--engine compiled`` run, or
the first plan's time includes the one-minute build). The compiled run's CPU time
counts the ``python -m nlevel.sim`` process that starts it too.

    python bench/sim_speed.py [--procs 32768] [--tasks-per-proc 100] [--plans classic auto levels=3,regions=128] [--engine python]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

PLANS = ("classic", "auto", "levels=3,regions=128")


def run(plan: str, procs: int, tasks_per_proc: int, task_time: str, engine: str = "auto") -> dict[str, float | str]:
    """Run one simulation in a child process; return its CPU seconds, wall seconds and results."""
    cmd = [sys.executable, "-m", "nlevel.sim", "--procs", str(procs), "--task-time", task_time,
           "--tasks-per-proc", str(tasks_per_proc), "--plan", plan, "--json", "--engine", engine]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = json.loads(proc.stdout)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "plan": plan,
        "cpu_s": cpu,
        "wall_s": wall,
        "events": out["events"],
        "events_per_cpu_s": out["events"] / cpu if cpu > 0 else 0.0,
        "overhead": out["overhead"],
        "makespan": out["makespan"],
        "engine": out["engine"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=int, default=32768)
    p.add_argument("--tasks-per-proc", type=int, default=100)
    p.add_argument("--task-time", default="2:5")
    p.add_argument("--plans", nargs="+", default=list(PLANS))
    p.add_argument("--engine", choices=("auto", "compiled", "python"), default="auto")
    args = p.parse_args()
    load = os.getloadavg()[0]
    print(f"# python -m nlevel.sim --procs {args.procs} --task-time {args.task_time} "
          f"--tasks-per-proc {args.tasks_per_proc} --plan PLAN --json --engine {args.engine}   (load average {load:.1f} at start)")
    print(f"{'plan':>22} {'CPU s':>7} {'wall s':>7} {'events':>10} {'events/CPU s':>13} {'overhead':>9} {'makespan s':>11}  engine")
    for plan in args.plans:
        r = run(plan, args.procs, args.tasks_per_proc, args.task_time, args.engine)
        print(f"{plan:>22} {r['cpu_s']:7.1f} {r['wall_s']:7.1f} {r['events']:10,} {r['events_per_cpu_s']:13,.0f} "
              f"{100 * float(r['overhead']):8.3f}% {float(r['makespan']):11.4f}  {r['engine']}", flush=True)
    print(f"# load average {os.getloadavg()[0]:.1f} at the end; CPU s = the child's user + system time")


if __name__ == "__main__":
    main()
