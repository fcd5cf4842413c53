"""Validate :mod:`nlevel.sim` against real runs on this machine.

For each process count N (default 2, 4, 8) this runs the real farm on the built-in
workload (2-5 ms sleeping tasks)::

    nlevel-mpiexec -n N python -m nlevel.run --tasks 100*N --report r.json --quiet --levels 2

(with ``--levels 2``: the simulator runs one fixed plan, not the runtime's re-planning)
then simulates the same job: the same plan and settings (from the report), the same
task durations (task ``i`` of :mod:`nlevel.runtime.micro`, plus the sleep overshoot measured
in that run: mean measured task time minus mean nominal duration), and the service
and message times measured in that very run (the slaves' ``dispose`` and ``message``
means). The fixed cost of a farm (set-up collectives, final gather), which the
simulator adds as ``startup``, is measured by a zero-task run just before. It prints
measured and simulated overhead side by side; the target is a relative difference
within 25 %.

This machine has 2 cores: runs above 2 processes are oversubscribed (nlevel-mpiexec
turns on non-busy polling for them), which the table says.

    .venv/bin/python bench/sim_validate.py [--procs 2,4,8] [--repeat 3] [--json out.json]

Real runs on a shared machine are noisy (another job's load shows up as overhead), so
each N is run ``--repeat`` times and the run of median measured overhead is compared;
the load average at the start of each run is in the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from nlevel.config import Config  # noqa: E402
from nlevel.model.plan import Plan  # noqa: E402
from nlevel.runtime import micro  # noqa: E402
from nlevel.sim import simulate  # noqa: E402

TARGET = 0.25


def real_run(n: int, tasks: int, workdir: str, timeout: float, levels: str = "2") -> dict[str, Any]:
    """Run the real farm on ``n`` processes with a fixed number of levels; return its report."""
    launcher = os.path.join(os.path.dirname(sys.executable), "nlevel-mpiexec")
    report = os.path.join(workdir, f"r-{n}.json")
    if os.path.exists(report):
        os.unlink(report)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), NLEVEL_TTY="0")
    cmd = [launcher, "-n", str(n), "python", "-m", "nlevel.run", "--tasks", str(tasks), "--report", report, "--quiet",
           "--levels", levels]
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    with open(report) as f:
        result: dict[str, Any] = json.load(f)
    return result


def simulate_like(report: dict[str, Any], startup: float) -> dict[str, Any]:
    """Simulate the job ``report`` describes, with the times it measured; return the comparison row.

    ``startup`` is the fixed cost (set-up and tear-down) measured by a zero-task run.
    """
    n = int(report["size"])
    total = int(report["total"])
    options = argparse.Namespace(tasks=total, task_min=2.0, task_spread=3.0, busy=False, seed=0)
    micro.setup(options)
    nominal = [micro.duration(i) for i in range(total)]
    measured_task = report["tasks"]["mean"] * 1e-3
    overshoot = max(0.0, measured_task - statistics.fmean(nominal))  # time.sleep wakes late
    durations = [d + overshoot for d in nominal]
    slave = report["requests"].get("slave")
    if slave is None or not slave["message"].get("count"):
        raise RuntimeError(f"the {n}-process report has no slave request times")
    msg = slave["message"]["mean"] * 1e-3
    service = max(slave["dispose"]["mean"] * 1e-3, 1e-7)
    plan = Plan.from_dict(report["plan"])
    cfg = dict(report["config"])
    cfg["regions"] = tuple(cfg.get("regions", ()))
    config = Config(**cfg)
    source = f"measured in the {n}-process run"
    sim = simulate(n, plan, durations, service, msg, startup=startup, config=config, times_source=source)
    bare = simulate(n, plan, durations, service, msg, config=config, times_source=source)
    measured = float(report["overhead"])
    return {
        "procs": n,
        "oversubscribed": n > (os.cpu_count() or 1),
        "tasks": total,
        "measured_overhead": measured,
        "simulated_overhead": sim.overhead,
        "simulated_without_fixed_cost": bare.overhead,
        "fixed_cost_ms": startup * 1e3,
        "relative_difference": abs(sim.overhead - measured) / measured if measured > 0 else float("inf"),
        "msg_ms": msg * 1e3,
        "service_ms": service * 1e3,
        "task_mean_ms": measured_task * 1e3,
        "sleep_overshoot_ms": overshoot * 1e3,
        "wall_s": report["wall_s"],
        "sim_makespan_s": sim.makespan,
        "plan": plan.describe(),
    }


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the run of median measured overhead among ``rows`` (one process count)."""
    ordered = sorted(rows, key=lambda r: r["measured_overhead"])
    return ordered[(len(ordered) - 1) // 2]


def format_table(rows: list[dict[str, Any]]) -> str:
    """Return the rows as a Markdown table."""
    head = (
        "| N | cores | measured overhead | simulated overhead | rel. diff | within 25 % | simulated without fixed cost "
        "| fixed cost ms | message ms | dispose ms | task mean ms | wall s | sim makespan s | load avg |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    cores = os.cpu_count() or 1
    for r in rows:
        lines.append(
            f"| {r['procs']} | {cores}{' (oversubscribed)' if r['oversubscribed'] else ''} "
            f"| {100 * r['measured_overhead']:.1f} % | {100 * r['simulated_overhead']:.1f} % "
            f"| {100 * r['relative_difference']:.0f} % | {'yes' if r['relative_difference'] <= TARGET else 'no'} "
            f"| {100 * r['simulated_without_fixed_cost']:.1f} % | {r['fixed_cost_ms']:.1f} "
            f"| {r['msg_ms']:.3f} | {r['service_ms']:.3f} | {r['task_mean_ms']:.3f} | {r['wall_s']:.3f} "
            f"| {r['sim_makespan_s']:.3f} | {r.get('load', float('nan')):.1f} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line (also what ``docs/render.py --check`` parses a saved result's command with)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", default="2,4,8", help="process counts, comma-separated (default 2,4,8)")
    p.add_argument("--tasks-per-proc", type=int, default=100, help="tasks per process (default 100)")
    p.add_argument("--repeat", type=int, default=3, help="real runs per process count; the median is compared (default 3)")
    p.add_argument(
        "--levels", default="2", help="--levels of the real runs (default 2; the simulator runs one fixed plan, so "
        "not auto)"
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per real run")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    options = p.parse_args(argv)
    counts = [int(x) for x in options.procs.split(",") if x.strip()]
    rows = []
    medians = []
    with tempfile.TemporaryDirectory(prefix="nlevel-sim-validate-") as workdir:
        for n in counts:
            mine = []
            for _ in range(options.repeat):
                load = os.getloadavg()[0]  # others' work on a shared machine shows in the real runs
                startup = real_run(n, 0, workdir, options.timeout, options.levels)["wall_s"]
                report = real_run(n, options.tasks_per_proc * n, workdir, options.timeout, options.levels)
                mine.append({**simulate_like(report, startup), "load": load})
                print(f"N={n}: measured {mine[-1]['measured_overhead']:.4f}, simulated "
                      f"{mine[-1]['simulated_overhead']:.4f} (load {load:.1f})", file=sys.stderr, flush=True)
            rows += mine
            medians.append(median_row(mine))
    if options.repeat > 1:
        print("Every run:\n")
        print(format_table(rows))
        print("\nThe run of median measured overhead per N:\n")
    print(format_table(medians))
    if options.json:
        with open(options.json, "w") as f:
            json.dump({"runs": rows, "medians": medians}, f, indent=2)
            f.write("\n")
    return 0 if all(r["relative_difference"] <= TARGET for r in medians) else 1


if __name__ == "__main__":
    sys.exit(main())
