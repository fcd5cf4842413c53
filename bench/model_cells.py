"""The model's targets (issue "the model decides"): the automatic plan in every cell, simulated.

Each cell is a job of ``--tasks-per-proc`` tasks per process, run by :func:`nlevel.sim.simulate`
with ``plan=None``: the job starts as a real ``--levels auto`` job does, the master's planner
samples, fits λ̂ and σ̂², decides and switches in simulated time. The cells:

* 1,024, 8,192 and 32,768 processes;
* 2-5 ms tasks on a fast network (service time S = 30 µs, one-way message 2 µs);
* 2-5 s and 60-180 s tasks with the paper's slow master (S = 0.5 ms, message 50 µs).

For each: the simulated overhead (``1 - work / (procs x makespan)``), the overhead the
planner predicted for the plan it ran, the plans and decisions, and whether the targets
hold: simulated ≤ C = 10 % (≤ 5 % for 2-5 s at 32,768, the paper's 6.88 % to beat), and
the prediction within 25 % of the simulation or 0.5 points.

    .venv/bin/python bench/model_cells.py [--procs 1024,8192,32768] [--json bench/results/model_cells.json]

The simulator is deterministic: the same command and commit give the same numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from provenance import record  # noqa: E402

from nlevel.model.plan import Plan  # noqa: E402


#: name -> (task time range, service time, one-way message time)
WORKLOADS = {
    "2-5 ms": ((0.002, 0.005), 30e-6, 2e-6),
    "2-5 s": ((2.0, 5.0), 0.5e-3, 50e-6),
    "60-180 s": ((60.0, 180.0), 0.5e-3, 50e-6),
}
C = 0.10


def limit(workload: str, procs: int) -> float:
    """The overhead the automatic plan must stay under in this cell."""
    return 0.05 if workload == "2-5 s" and procs >= 32768 else C


def close(predicted: float | None, simulated: float) -> bool:
    """Prediction within 25 % of the simulation, or within 0.5 points."""
    if predicted is None:
        return False
    return abs(predicted - simulated) <= max(0.25 * simulated, 0.005)


def cell(procs: int, workload: str, per_proc: int, engine: str) -> dict[str, Any]:
    """Simulate one cell with the automatic plan (``python -m nlevel.sim --plan auto``); return its row."""
    (lo, hi), service, msg = WORKLOADS[workload]
    cmd = [sys.executable, "-m", "nlevel.sim", "--procs", str(procs), "--task-time", f"{lo}:{hi}",
           "--tasks-per-proc", str(per_proc), "--plan", "auto", "--service-time", str(service),
           "--msg-time", str(msg), "--engine", engine, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    r = json.loads(out.stdout)
    decisions = r.get("decisions") or []
    first = decisions[0] if decisions else {}
    predicted = r.get("predicted_overhead")
    return {
        "procs": procs,
        "workload": workload,
        "tasks": procs * per_proc,
        "service_s": service,
        "msg_s": msg,
        "command": " ".join(["python"] + cmd[1:]),
        "start": first.get("start"),
        "start_reason": first.get("reason"),
        "plan": Plan.from_dict(r["plan"]).describe(),
        "plans": [Plan.from_dict(p).describe() for p in r.get("plan_history") or []],
        "decisions": decisions,
        "overhead": r["overhead"],
        "predicted_overhead": predicted,
        "limit": limit(workload, procs),
        "meets_limit": r["overhead"] <= limit(workload, procs),
        "prediction_close": close(predicted, r["overhead"]),
        "makespan_s": r["makespan"],
        "sim_seconds": r.get("sim_seconds"),
        "engine": r.get("engine"),
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = ["| processes | tasks | plan ran | simulated | predicted | limit | meets | prediction within 25 % / 0.5 pt |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pred = "-" if r["predicted_overhead"] is None else f"{100 * r['predicted_overhead']:.2f} %"
        lines.append(f"| {r['procs']:,} | {r['workload']} | {r['plan']} | {100 * r['overhead']:.2f} % | {pred} "
                     f"| {100 * r['limit']:.0f} % | {'yes' if r['meets_limit'] else 'NO'} "
                     f"| {'yes' if r['prediction_close'] else 'NO'} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line (also what ``docs/render.py --check`` parses a saved result's command with)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", default="1024,8192,32768", help="process counts, comma-separated")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="workloads, comma-separated: " + ", ".join(WORKLOADS))
    p.add_argument("--tasks-per-proc", type=int, default=100, help="tasks per process (default 100)")
    p.add_argument("--engine", default="auto", choices=("auto", "compiled", "python"), help="simulator engine")
    p.add_argument("--json", metavar="FILE", help="write the rows and their provenance as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    o = p.parse_args(argv)
    rows = []
    for workload in [w.strip() for w in o.workloads.split(",") if w.strip()]:
        if workload not in WORKLOADS:
            p.error(f"--workloads: unknown workload {workload!r}; expected one of {', '.join(WORKLOADS)}")
        for procs in [int(x) for x in o.procs.split(",") if x.strip()]:
            row = cell(procs, workload, o.tasks_per_proc, o.engine)
            rows.append(row)
            print(f"{procs} x {workload}: {row['plan']}: simulated {row['overhead']:.4f}, predicted "
                  f"{row['predicted_overhead']}, {row['sim_seconds']:.0f} s", file=sys.stderr, flush=True)
    print(table(rows))
    if o.json:
        prov = record()  # (before the file is opened: truncating a tracked result makes the tree "dirty")
        with open(o.json, "w") as f:
            json.dump({"provenance": prov, "rows": rows}, f, indent=2, default=str)
            f.write("\n")
    return 0 if all(r["meets_limit"] and r["prediction_close"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
