"""The paper's tables (He Wangquan et al., 2016), reproduced by simulation, each cell beside the paper's figure.

Table 1: λ̂, σ̂², classic and N-level overhead for 2-5 s and 60-180 s tasks at 32,768
processes, with the paper's slow master (a server spends S = 0.5 ms per message, a message
takes 50 µs one way: issue 13's figures for the paper's Sunway BlueLight, whose paper gives
neither). Each cell is one ``python -m nlevel.sim`` run, ``--plan classic`` or ``--plan auto``
(the job starts as a real ``--levels auto`` job, samples, fits and decides in simulated time).

Tables 3 and 4 (failures by role against roll-back; 4,096 of 16,384 processes taken away
mid-job) need the simulator's ``--kill`` and ``--drain``; their cells are listed only when
``nlevel.sim`` has those options.

Every cell is saved to the JSON as soon as it is done, with its command; a cell already in
the file with the same command is not run again (``--fresh`` runs everything). The simulator
is deterministic: the same command and commit give the same numbers.

    python bench/paper_tables.py [--tables 1,3,4] [--tasks-per-proc 10] [--json bench/results/paper_tables.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from provenance import record  # noqa: E402

#: The paper's slow master (issue 13): seconds per message served, one-way message seconds.
SERVICE, MSG = 0.5e-3, 50e-6

#: The paper's Table 1 as its text gives it (the table body is an image, not in the text we have):
#: section 4.1 of He et al. 2016. None: not stated in the text.
PAPER_T1 = {
    "2-5 s": {"classic": "> 50 %", "nlevel": "6.88 % (3 levels, 128 R-Ms)", "ratio": "7.2 % of classic",
              "lambda_hat": None, "sigma2_hat": None},
    "60-180 s": {"classic": "2.81 %", "nlevel": "0.32 %", "ratio": None, "lambda_hat": None, "sigma2_hat": None},
}
WORKLOADS = {"2-5 s": "2:5", "60-180 s": "60:180"}


def sim(args: list[str]) -> tuple[dict[str, Any], str]:
    """Run ``python -m nlevel.sim ARGS --json``; return its JSON and the command as typed."""
    cmd = [sys.executable, "-m", "nlevel.sim", *args, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout), " ".join(["python", *cmd[1:]])


def first_fit(decisions: list[dict[str, Any]]) -> dict[str, Any]:
    """The first decision made from samples (λ̂, σ̂², M, μ, ρ per level), or {}."""
    for d in decisions:
        if "lambda_hat" in d:
            return d
    return {}


def table1_cells(procs: int, per_proc: int, engine: str) -> list[tuple[str, list[str]]]:
    """(cell id, nlevel.sim arguments) of Table 1."""
    out = []
    for name, tt in WORKLOADS.items():
        for plan in ("classic", "auto"):
            out.append((f"t1 {name} {plan}", ["--procs", str(procs), "--task-time", tt, "--tasks-per-proc",
                                              str(per_proc), "--plan", plan, "--service-time", str(SERVICE),
                                              "--msg-time", str(MSG), "--engine", engine]))
    return out


def table1_row(cell: str, r: dict[str, Any]) -> dict[str, Any]:
    """The summary of one Table 1 run."""
    fit = first_fit(r.get("decisions") or [])
    return {
        "overhead": r["overhead"], "makespan_s": r["makespan"], "predicted_overhead": r.get("predicted_overhead"),
        "plan": r["plan"], "plan_history": r.get("plan_history"), "servers": r.get("servers"),
        "requests": r.get("requests"), "committed": r.get("committed"), "tasks": r.get("tasks"),
        "recomputed": r.get("recomputed"),
        "fit": {k: fit.get(k) for k in ("time", "samples", "interval_s", "lambda_hat", "sigma2_hat", "mu", "rho",
                                         "dispersion")} if fit else None,
        "sim_seconds": r.get("sim_seconds"), "engine": r.get("engine"),
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def _plan(p: dict[str, Any]) -> str:
    regions = "x".join(str(x) for x in p.get("regions") or [])
    return f"{p['levels']} levels" + (f" ({regions} R-Ms)" if regions else "")


def markdown_t1(cells: dict[str, dict[str, Any]]) -> str:
    """Table 1 beside the paper, as Markdown."""
    lines = ["| tasks | | λ̂ (requests/s at the master) | σ̂² | classic overhead | N-level overhead | N-level / classic |",
             "|---|---|---|---|---|---|---|"]
    for name in WORKLOADS:
        p = PAPER_T1[name]
        lines.append(f"| {name} | paper | not in the text | not in the text | {p['classic']} | {p['nlevel']} "
                     f"| {p['ratio'] or '-'} |")
        c, a = cells.get(f"t1 {name} classic"), cells.get(f"t1 {name} auto")
        if c is None or a is None:
            lines.append(f"| {name} | nlevel | (not run) | | | | |")
            continue
        fit = a["row"].get("fit") or {}
        lam = fit.get("lambda_hat")
        s2 = fit.get("sigma2_hat")
        ratio = a["row"]["overhead"] / c["row"]["overhead"] if c["row"]["overhead"] > 0 else None
        lines.append(
            f"| {name} | nlevel | {'-' if lam is None else f'{lam:,.0f}'} (M = {fit.get('samples', '-')}) "
            f"| {'-' if s2 is None else f'{s2:,.0f}'} | {_pct(c['row']['overhead'])} "
            f"| {_pct(a['row']['overhead'])}, {_plan(a['row']['plan'])} | {_pct(ratio)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", default="1", help="tables to reproduce, comma-separated (1, 3, 4)")
    p.add_argument("--procs", type=int, default=32768, help="Table 1's processes (default 32768)")
    p.add_argument("--tasks-per-proc", type=int, default=10, help="Table 1's tasks per process (default 10)")
    p.add_argument("--engine", default="compiled", choices=("auto", "compiled", "python"))
    p.add_argument("--json", default=os.path.join(HERE, "results", "paper_tables.json"), help="result file")
    p.add_argument("--fresh", action="store_true", help="run every cell again")
    p.add_argument("--only", help="run only the cells whose id contains this text")
    o = p.parse_args(argv)
    tables = {t.strip() for t in o.tables.split(",") if t.strip()}
    data: dict[str, Any] = {"cells": {}}
    if os.path.exists(o.json) and not o.fresh:
        with open(o.json) as f:
            data = json.load(f)
    cells: dict[str, dict[str, Any]] = data.setdefault("cells", {})
    todo: list[tuple[str, list[str], str]] = []
    if "1" in tables:
        todo += [(cid, args, "1") for cid, args in table1_cells(o.procs, o.tasks_per_proc, o.engine)]
    try:
        from faults_cells import fault_cells  # (Tables 3 and 4: present once the simulator takes --kill/--drain)
    except ImportError:
        fault_cells = None
    if fault_cells is not None:
        todo += [(cid, args, t) for cid, args, t in fault_cells(o.engine) if t in tables]
    for cid, args, table in todo:
        if o.only and o.only not in cid:
            continue
        cmd = " ".join(["python", "-m", "nlevel.sim", *args, "--json"])
        if cid in cells and cells[cid]["command"] == cmd:
            continue
        started = time.time()
        r, cmd = sim(args)
        row = table1_row(cid, r) if table == "1" else r
        cells[cid] = {"command": cmd, "table": table, "row": row, "provenance": record()}
        print(f"{cid}: overhead {r['overhead']:.4f}, makespan {r['makespan']:.1f} s ({time.time() - started:.0f} s)",
              file=sys.stderr, flush=True)
        data["provenance"] = record()
        with open(o.json + ".tmp", "w") as f:
            json.dump(data, f, indent=1, default=str)
            f.write("\n")
        os.replace(o.json + ".tmp", o.json)
    data["markdown"] = {"table1": markdown_t1(cells)}
    with open(o.json, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")
    print(data["markdown"]["table1"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
