"""The paper's tables (He Wangquan et al., 2016), reproduced by simulation, each cell beside the paper's figure.

Table 1: λ̂, σ̂², classic and N-level overhead for 2-5 s and 60-180 s tasks at 32,768
processes, with the paper's slow master (a server spends S = 0.5 ms per message, a message
takes 50 µs one way: issue 13's figures for the paper's Sunway BlueLight, whose paper gives
neither). Each cell is one ``python -m nlevel.sim`` run, ``--plan classic`` or ``--plan auto``
(the job starts as a real ``--levels auto`` job, samples, fits and decides in simulated time).

Tables 3 and 4 (failures by role against roll-back; 4,096 of 16,384 processes taken away
mid-job): the paper's DOCK job, 240,000 tasks of 14-801 s (mean 204 s: the measured Vina
times of ``bench/results/dock_times_abl1.txt`` mapped onto that range by ``bench/dock_sim.py``)
on 16,384 processes, 3 levels with 128 region-masters (the paper's plan), the same slow
master, one fault at 1,500 s (``--kill slave|region|master@1500s``) or 4,096 slaves drained
then (``--drain 4096@1500s``). Roll-back (kill the job, resubmit, redo what was in flight)
is simulated as a second job: 1,500 s, plus the paper's own 75 s for stopping, resubmitting
and initialising, plus the makespan of a job of the tasks not completed at 1,500 s (on 16,384
processes for Table 3, on the 12,288 left for Table 4). That count is 240,000 minus the tasks
completed by then, 16,384 x (1,500 - a) / E[T], where a = E[T²] / (2 E[T]) is the mean age of
the task each process runs at a random instant (renewal theory: what the restart redoes); the
second job's durations are drawn from the same sample with another seed.

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


#: Table 1's cells run at the paper's 100 tasks per process, except the classic 2-5 s one: its
#: master is saturated (the simulation handles every queued report: 13.5 minutes of one core
#: for 10 tasks per process here, hours for 100). A saturated master's overhead depends little on
#: the job's length; the 10-per-process runs of both plans are kept beside to show how much.
SHORT = 10


def table1_cells(procs: int, per_proc: int, engine: str) -> list[tuple[str, list[str]]]:
    """(cell id, nlevel.sim arguments) of Table 1."""
    out = []
    for name, tt in WORKLOADS.items():
        for plan in ("classic", "auto"):
            for k in sorted({per_proc, SHORT}):
                if k != SHORT and name == "2-5 s" and plan == "classic":
                    continue
                if k == SHORT and name != "2-5 s":
                    continue
                out.append((f"t1 {name} {plan} k={k}",
                            ["--procs", str(procs), "--task-time", tt, "--tasks-per-proc", str(k), "--plan", plan,
                             "--service-time", str(SERVICE), "--msg-time", str(MSG), "--engine", engine]))
    return out


def t1_cell(cells: dict[str, dict[str, Any]], name: str, plan: str) -> dict[str, Any] | None:
    """The Table 1 cell with the most tasks per process run for ``name`` and ``plan``."""
    found = [(int(cid.rsplit("k=", 1)[1]), c) for cid, c in cells.items() if cid.startswith(f"t1 {name} {plan} k=")]
    return max(found, key=lambda kc: kc[0])[1] if found else None


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


def fault_row(r: dict[str, Any]) -> dict[str, Any]:
    """The summary of one Table 3 or 4 run."""
    keep = ("makespan", "overhead", "work", "tasks", "tasks_run", "committed", "recomputed", "deaths", "drained",
            "failures", "fault_tolerance", "plan", "servers", "sim_seconds", "engine")
    out = {k: r.get(k) for k in keep}
    if out["drained"]:
        out["drained"] = [[t, rank] for t, rank in out["drained"]]
    return out


def _k(cell: dict[str, Any]) -> str:
    return f"{cell['row']['tasks'] // 32768} tasks/process" if cell["row"].get("tasks") else "?"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def _plan(p: dict[str, Any]) -> str:
    regions = "x".join(str(x) for x in p.get("regions") or [])
    return f"{p['levels']} levels" + (f", regions per level {regions}" if regions else "")


def markdown_t1(cells: dict[str, dict[str, Any]]) -> str:
    """Table 1 beside the paper, as Markdown.

    λ̂ and σ̂² are the paper's: the mean and variance of the number of arrivals per sampling
    interval (M intervals), here of messages at the top server of the tree the job started on.
    """
    lines = ["| tasks | | λ̂ per interval (interval, M) | σ̂² | σ̂²/λ̂ | classic overhead | N-level overhead "
             "| N-level / classic |",
             "|---|---|---|---|---|---|---|---|"]
    for name in WORKLOADS:
        p = PAPER_T1[name]
        lines.append(f"| {name} | paper | not in our text | not in our text | | {p['classic']} | {p['nlevel']} "
                     f"| {p['ratio'] or '-'} |")
        pairs = [(t1_cell(cells, name, "classic"), t1_cell(cells, name, "auto"))]
        short = (cells.get(f"t1 {name} classic k={SHORT}"), cells.get(f"t1 {name} auto k={SHORT}"))
        if all(short) and short != pairs[0]:
            pairs.append(short)
        for c, a in pairs:
            if c is None or a is None:
                lines.append(f"| {name} | nlevel | (not run) | | | | | |")
                continue
            fit = a["row"].get("fit") or {}
            dt = fit.get("interval_s")
            lam = fit["lambda_hat"] * dt if fit.get("lambda_hat") is not None and dt else None
            s2 = fit["sigma2_hat"] * dt * dt if fit.get("sigma2_hat") is not None and dt else None
            ratio = a["row"]["overhead"] / c["row"]["overhead"] if c["row"]["overhead"] > 0 else None
            lines.append(
                f"| {name} | nlevel | {'-' if lam is None else f'{lam:.3f}'} ({'-' if dt is None else f'{dt * 1e3:.3g} ms'}, "
                f"M = {fit.get('samples', '-')}) | {'-' if s2 is None else f'{s2:.3f}'} "
                f"| {'-' if not lam or s2 is None else f'{s2 / lam:.2f}'} "
                f"| {_pct(c['row']['overhead'])} ({_k(c)}) "
                f"| {_pct(a['row']['overhead'])}, {_plan(a['row']['plan'])} ({_k(a)}; predicted "
                f"{_pct(a['row'].get('predicted_overhead'))}) | {_pct(ratio)} |")
    return "\n".join(lines)


#: Tables 3 and 4: the paper's DOCK job (see the module docstring).
DOCK_TIMES = os.path.join("bench", "results", "dock_times_abl1_dock_scaled.txt")
DOCK = ["--procs", "16384", "--task-times-file", DOCK_TIMES, "--tasks", "240000", "--plan", "levels=3,regions=128",
        "--service-time", str(SERVICE), "--msg-time", str(MSG)]
#: The paper's figures (section 4.2, Table 3): seconds, fault at 1,500 s, 16,384 processes.
PAPER_T3 = {"none": 3020.0, "slave": 3031.8, "region": 3039.6, "master": 3075.5, "rollback": 3195.6}
#: Table 3's last column as the paper prints it: the degradation's time saved against roll-back, %.
PAPER_T3_SAVED = {"slave": 5.13, "region": 4.88, "master": 3.75}
PAPER_T3_HANDLING = {"slave": "5.2 ms, 127 processes told", "region": "61.1 ms, 127 processes told",
                     "master": "6.5 s, 127 processes told"}
#: The paper's restart cost: stopping, resubmitting and initialising the job (section 4.2: "about 75 s").
RESTART_S = 75.0


def fault_cells(engine: str) -> list[tuple[str, list[str], str]]:
    """(cell id, nlevel.sim arguments, table) of Tables 3 and 4."""
    out = [("t3 none", [*DOCK, "--fault-tolerance", "on", "--engine", engine], "3")]
    for role in ("slave", "region", "master"):
        out.append((f"t3 {role}", [*DOCK, "--kill", f"{role}@1500s", "--engine", engine], "3"))
    out.append(("t4 none", [*DOCK, "--engine", engine], "4"))
    out.append(("t4 drain", [*DOCK, "--drain", "4096@1500s", "--engine", engine], "4"))
    out.append(("t4 drain spread", [*DOCK, "--drain", "4096/spread@1500s", "--engine", engine], "4"))
    left = str(rollback_model()["tasks_left"])
    rerun = ["--task-times-file", DOCK_TIMES, "--tasks", left, "--plan", "levels=3,regions=128", "--service-time",
             str(SERVICE), "--msg-time", str(MSG), "--seed", "1", "--engine", engine]
    out.append(("t3 rerun", ["--procs", "16384", *rerun], "3"))
    out.append(("t4 rerun", ["--procs", "12288", *rerun], "4"))
    return out


def rollback_model() -> dict[str, float]:
    """The roll-back's extra seconds beyond a failure-free run: in-flight work redone, and the restart."""
    with open(os.path.join(os.path.dirname(HERE), DOCK_TIMES)) as f:
        v = [float(x) for x in f.read().split() if x.strip() and not x.startswith("#")]
    mean = sum(v) / len(v)
    age = sum(x * x for x in v) / len(v) / (2 * mean)
    done = 16384 * (1500.0 - age) / mean
    return {"task_mean_s": mean, "inflight_age_s": age, "restart_s": RESTART_S, "extra_s": age + RESTART_S,
            "tasks_done_at_1500": done, "tasks_left": int(round(240000 - done))}


def markdown_t3(cells: dict[str, dict[str, Any]]) -> str:
    """Table 3 beside the paper, as Markdown."""
    base = cells.get("t3 none")
    rb = rollback_model()
    lines = ["| fault at 1,500 s | paper: degradation (s) | paper: vs roll-back | nlevel: makespan (s) | nlevel: + s "
             "| nlevel: tasks run again (commits seen twice) | nlevel: recovery (s) | nlevel: vs roll-back |",
             "|---|---|---|---|---|---|---|---|"]
    b = base["row"]["makespan"] if base else None
    rerun = cells.get("t3 rerun")
    rollback = 1500.0 + RESTART_S + rerun["row"]["makespan"] if rerun else None
    lines.append(f"| none | {PAPER_T3['none']:.1f} | | {'-' if b is None else f'{b:.1f}'} | | | | |")
    for role in ("slave", "region", "master"):
        c = cells.get(f"t3 {role}")
        paper = PAPER_T3[role]
        pv = PAPER_T3_SAVED[role]
        if c is None or b is None or rollback is None:
            lines.append(f"| {role} | {paper:.1f} (+{paper - PAPER_T3['none']:.1f}) | -{pv:.2f} % | (not run) | | | | |")
            continue
        r = c["row"]
        # (a commit seen twice is a re-run, or a completion reported again after its first report
        # was lost with the dead: only the first costs work)
        again = r["tasks_run"] - r["tasks"] if r.get("tasks_run") is not None else "-"
        recovery = max((f.get("recovery_ms") or 0.0 for f in r.get("failures") or []), default=None)
        lines.append(f"| {role} | {paper:.1f} (+{paper - PAPER_T3['none']:.1f}) | -{pv:.2f} % | {r['makespan']:.1f} "
                     f"| {r['makespan'] - b:+.1f} | {again} ({r.get('recomputed') or 0:,}) "
                     f"| {'-' if recovery is None else f'{recovery / 1e3:.3g}'} "
                     f"| {100 * (r['makespan'] / rollback - 1):+.2f} % |")
    lines.append(f"| roll-back | {PAPER_T3['rollback']:.1f} (+{PAPER_T3['rollback'] - PAPER_T3['none']:.1f}) | | "
                 + ("-" if rollback is None or b is None else
                    f"{rollback:.1f} (1,500 + {RESTART_S:.0f} restart + {rerun['row']['makespan']:.1f} rerun of "
                    f"{rb['tasks_left']:,} tasks) | {rollback - b:+.1f}") + " | | | |")
    return "\n".join(lines)


def markdown_t4(cells: dict[str, dict[str, Any]]) -> str:
    """Table 4 (4,096 of 16,384 taken away at 1,500 s), nlevel's side; the paper's table body is not in our text."""
    base = cells.get("t4 none")
    if base is None:
        return "(not run)"
    b = base["row"]
    rb = rollback_model()
    rerun = cells.get("t4 rerun")
    lines = ["| | makespan (s) | + s over no change | drained ranks left (s after 1,500) |",
             "|---|---|---|---|",
             f"| no change (16,384 all along) | {b['makespan']:.1f} | | |"]
    for cid, what in (("t4 drain", "nlevel: drain the 4,096 highest-ranked slaves (32 whole regions) at 1,500 s"),
                      ("t4 drain spread", "nlevel: drain 4,096 slaves spread over all regions at 1,500 s")):
        c = cells.get(cid)
        if c is None:
            lines.append(f"| {what} | (not run) | | |")
            continue
        d = c["row"]
        left = [t for t, _ in d.get("drained") or []]
        lines.append(f"| {what} | {d['makespan']:.1f} | {d['makespan'] - b['makespan']:+.1f} "
                     f"| {len(left)}: first {min(left) - 1500 if left else 0:.1f}, last "
                     f"{max(left) - 1500 if left else 0:.1f} |")
    if rerun is not None:
        resubmit = 1500.0 + RESTART_S + rerun["row"]["makespan"]
        lines.append(f"| stop, resubmit on 12,288 (1,500 + {RESTART_S:.0f} restart + {rerun['row']['makespan']:.1f} "
                     f"rerun of {rb['tasks_left']:,} tasks) | {resubmit:.1f} | {resubmit - b['makespan']:+.1f} "
                     "| all at once |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line (also what ``docs/render.py --check`` parses a saved result's command with)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", default="1", help="tables to reproduce, comma-separated (1, 3, 4)")
    p.add_argument("--procs", type=int, default=32768, help="Table 1's processes (default 32768)")
    p.add_argument("--tasks-per-proc", type=int, default=100, help="Table 1's tasks per process (default 100, "
                   f"the paper's; {SHORT} for the classic 2-5 s cell, and both plans of 2-5 s at {SHORT} beside)")
    p.add_argument("--engine", default="compiled", choices=("auto", "compiled", "python"))
    p.add_argument("--json", default=os.path.join(HERE, "results", "paper_tables.json"), help="result file")
    p.add_argument("--fresh", action="store_true", help="run every cell again")
    p.add_argument("--only", help="run only the cells whose id contains this text")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
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
    todo += [(cid, args, t) for cid, args, t in fault_cells(o.engine) if t in tables]
    for cid, args, table in todo:
        if o.only and o.only not in cid:
            continue
        cmd = " ".join(["python", "-m", "nlevel.sim", *args, "--json"])
        if cid in cells and cells[cid]["command"] == cmd:
            continue
        started = time.time()
        r, cmd = sim(args)
        row = table1_row(cid, r) if table == "1" else fault_row(r)
        cells[cid] = {"command": cmd, "table": table, "row": row, "provenance": record()}
        print(f"{cid}: overhead {r['overhead']:.4f}, makespan {r['makespan']:.1f} s ({time.time() - started:.0f} s)",
              file=sys.stderr, flush=True)
        data["provenance"] = record()
        with open(o.json + ".tmp", "w") as f:
            json.dump(data, f, indent=1, default=str)
            f.write("\n")
        os.replace(o.json + ".tmp", o.json)
    data["markdown"] = {"table1": markdown_t1(cells), "table3": markdown_t3(cells), "table4": markdown_t4(cells)}
    data["rollback_model"] = rollback_model()
    with open(o.json, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")
    for name, table in data["markdown"].items():
        print(f"\n{name}\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
