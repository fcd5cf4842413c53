"""The scale experiment of the app's README: classic 2-level against nlevel's automatic plan.

``python -m apps.dock_like.measure [--procs 1,2,4] [--repeat 3] [--results DIR] [APP OPTIONS...]``

Runs the same library with ``nlevel-mpiexec -n N python -m nlevel.run apps.dock_like``
under two plans for every N: *classic* (``--levels 2 --serve-only master``: one master
that only hands out ligands, as DOCK's own scheduler) and *nlevel* (the defaults: the
automatic plan, masters compute too). It keeps each run's JSON report, takes the median
wall time over ``--repeat`` runs, and prints the speed-up table against one process.
The 1-process run's per-ligand times (from its hit list, not disturbed by
oversubscription) are saved as ``task_times.json`` and ``task_times.txt`` (one duration
in seconds per line): the app's measured task-time distribution, for the simulator. Run it from the repository root, on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

import numpy as np

from .hitlist import read_hits

__all__ = ["PLANS", "run_once", "main"]

PLANS = {"classic": ["--levels", "2", "--serve-only", "master"], "nlevel": []}
_BIN = os.path.dirname(sys.executable)


def run_once(n: int, plan: str, app_args: Sequence[str], workdir: str, report: str) -> dict[str, Any]:
    """Run the app once on ``n`` processes under ``plan``; return wall times and the report."""
    out = os.path.join(workdir, f"hits-{plan}-{n}.h5")
    cmd = [os.path.join(_BIN, "nlevel-mpiexec"), "-n", str(n), sys.executable, "-m", "nlevel.run", "apps.dock_like",
           *PLANS[plan], "--quiet", "--checkpoint", os.path.join(workdir, f"run-{plan}-{n}-{time.time_ns()}.h5"),
           "--report", report, "--out", out, *app_args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    with open(report) as f:
        rep = json.load(f)
    return {"n": n, "plan": plan, "end_to_end_s": elapsed, "farm_wall_s": rep["wall_s"], "report": rep, "hits": out}


def _distribution(seconds: np.ndarray) -> dict[str, float]:
    q = np.percentile(seconds, [50, 90, 99])
    return {"count": int(seconds.size), "min": float(seconds.min()), "p50": float(q[0]), "mean": float(seconds.mean()),
            "p90": float(q[1]), "p99": float(q[2]), "max": float(seconds.max()), "std": float(seconds.std()),
            "max_over_min": float(seconds.max() / seconds.min())}


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: run the experiment, save reports, print the table."""
    p = argparse.ArgumentParser(prog="python -m apps.dock_like.measure", description=__doc__.split("\n")[0])
    p.add_argument("--procs", default="1,2,4", help="process counts (default 1,2,4)")
    p.add_argument("--repeat", type=int, default=3, help="runs per configuration; the median is kept (default 3)")
    p.add_argument("--results", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"),
                   help="directory for reports and task_times.json")
    a, app_args = p.parse_known_args(argv)
    procs = [int(x) for x in a.procs.split(",")]
    os.makedirs(a.results, exist_ok=True)
    work = tempfile.mkdtemp(prefix="dock_like_measure.")
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
    try:
        for r in range(a.repeat):
            for n in procs:
                for plan in PLANS:
                    if plan == "classic" and n < 2:
                        continue  # a master that only serves needs a worker
                    report = os.path.join(a.results, f"report-{plan}-{n}-run{r + 1}.json")
                    res = run_once(n, plan, app_args, work, report)
                    rows.setdefault((plan, n), []).append(res)
                    print(f"run {r + 1}: {plan:7s} n={n}: farm {res['farm_wall_s']:.2f} s, "
                          f"end to end {res['end_to_end_s']:.2f} s", flush=True)
                    if n == 1 and plan == "nlevel" and r == 0:
                        hits = read_hits(res["hits"])
                        ok = hits["status"] == 0
                        times = {"app": "apps.dock_like", "options": app_args, "unit": "s",
                                 "source": "per-ligand 'seconds' of a 1-process run's hit list",
                                 "seconds": hits["seconds"][ok].tolist(),
                                 "names": [nm for nm, keep in zip(hits["name"], ok) if keep],
                                 "n_heavy": hits["n_heavy"][ok].tolist(), "n_rotatable": hits["n_rotatable"][ok].tolist(),
                                 "distribution": _distribution(hits["seconds"][ok])}
                        with open(os.path.join(a.results, "task_times.json"), "w") as f:
                            json.dump(times, f, indent=1)
                        with open(os.path.join(a.results, "task_times.txt"), "w") as f:  # one per line, s
                            f.write("".join(f"{t:.6f}\n" for t in times["seconds"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = float(np.median([x["farm_wall_s"] for x in rows[("nlevel", min(procs))]])) * min(procs)
    base_e2e = float(np.median([x["end_to_end_s"] for x in rows[("nlevel", min(procs))]])) * min(procs)
    print("\n| processes | plan | farm wall s (median) | speed-up | end-to-end s | speed-up | overhead | task p50 / max ms |")
    print("|---|---|---|---|---|---|---|---|")
    summary = []
    for n in procs:
        for plan in PLANS:
            if (plan, n) not in rows:
                continue
            runs = rows[(plan, n)]
            wall = float(np.median([x["farm_wall_s"] for x in runs]))
            e2e = float(np.median([x["end_to_end_s"] for x in runs]))
            rep = runs[0]["report"]
            summary.append({"n": n, "plan": plan, "farm_wall_s": [x["farm_wall_s"] for x in runs],
                            "end_to_end_s": [x["end_to_end_s"] for x in runs], "plan_chosen": rep["plan"]})
            print(f"| {n} | {plan} ({rep['plan']['levels']} levels, serve-only {rep['plan']['serve_only']}) | "
                  f"{wall:.2f} | {base / wall:.2f} | {e2e:.2f} | {base_e2e / e2e:.2f} | "
                  f"{100 * rep['overhead']:.1f} % | {rep['tasks']['p50']:.0f} / {rep['tasks']['max']:.0f} |")
    with open(os.path.join(a.results, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
