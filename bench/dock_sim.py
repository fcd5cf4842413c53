"""The paper's DOCK experiment (its Table 2) simulated from measured Vina times: classic against the automatic plan.

``python bench/dock_sim.py [--times bench/results/dock_times_abl1.txt] [--tasks 240000] [--procs 1024,16384]
[--service-sweep 1e-3,5e-3,1e-2,2e-2,5e-2] [--out bench/results/dock_sim.json]``

1. Reads the per-ligand CPU seconds measured by ``bench/dock_times.py`` (one a line).
2. Scales them onto DOCK's range with one monotone map, ``t' = a + c * t**b``, whose
   three constants make the sample's minimum 14 s, its maximum 801 s and its mean 204 s
   (the paper's DOCK task times): ``b`` by root finding on the mean, then ``c`` and ``a``
   from the minimum and maximum. The order of the ligands (which one is slow) is kept.
   Writes the scaled sample beside the measured one (``..._dock_scaled.txt``).
3. Runs ``python -m nlevel.sim --task-times-file SCALED --tasks 240000 --plan P --json``
   (the simulator of this checkout, which drives nlevel's own role state machines) for
   ``P`` = ``classic`` (2 levels: one master, as DOCK's own scheduler) and ``auto`` (the
   queueing model's plan) at each process count, every server spending ``--service-time``
   per message (0.03 ms) and every message ``--msg-time`` one way (0.25 ms), given to each
   run so that neither the simulator's defaults nor a calibration file change them; then
   again with every server's service time (the master's and the region-masters') forced
   to each value of ``--service-sweep``, to find how slow a server must be before the
   classic plan loses.
   At the largest count the paper's own plan (``--paper-plan``, 3 levels with 128
   region-masters) runs too.
4. Writes every run (its command, makespan, overhead, plan), the scaling constants, the
   comparison with the paper and this script's command and commit to ``--out``, and
   prints the comparison as a Markdown table.

The paper's Table 2 numbers compare nlevel with DOCK's own scheduler: 4.9 % faster at
1,024 processes (2 levels), 34.3 % faster at 16,384 (3 levels, 128 region-masters);
speed-up from 1,024 to 16,384 processes of 15.84 against DOCK's 12.37. Here "faster"
is ``makespan(classic) / makespan(auto) - 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCK_MIN, DOCK_MAX, DOCK_MEAN = 14.0, 801.0, 204.0  # the paper's DOCK task times (s)
#: Every run's service time per message and one-way message time (s) unless the sweep forces the service
#: time: given to each run, so that neither the simulator's defaults nor a calibration file change them.
BASE_SERVICE, BASE_MSG = 3e-5, 2.5e-4
PAPER = {"gain_1024": 0.049, "gain_16384": 0.343, "speedup_nlevel": 15.84, "speedup_dock": 12.37,
         "levels_1024": 2, "levels_16384": 3, "regions_16384": 128}


def scale_to_dock(t: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """Map ``t`` monotonically onto DOCK's min, max and mean with ``a + c * t**b``.

    Returns:
        The scaled times and the constants (with the statistics before and after).

    Raises:
        ValueError: for fewer than 2 distinct positive times, or when no exponent in
            [0.02, 50] gives the mean (naming the sample's mean).
    """
    t = np.asarray(t, dtype=float)
    if t.size < 2 or not np.all(np.isfinite(t)) or t.min() <= 0 or t.min() == t.max():
        raise ValueError(f"need at least 2 distinct positive finite times to scale, got {t.size} "
                         f"(min {t.min() if t.size else 'none'}, max {t.max() if t.size else 'none'})")
    lo, hi = float(t.min()), float(t.max())

    def mapped(b: float) -> np.ndarray:
        c = (DOCK_MAX - DOCK_MIN) / (hi ** b - lo ** b)
        return DOCK_MIN + c * (t ** b - lo ** b)

    try:
        from scipy.optimize import brentq  # (here: a parse of the command line needs no scipy)

        b = brentq(lambda b: float(mapped(b).mean()) - DOCK_MEAN, 0.02, 50.0, xtol=1e-12)
    except ValueError as exc:
        raise ValueError(f"no exponent maps the sample (mean {t.mean():.3g} s, min {lo:.3g}, max {hi:.3g}) onto "
                         f"DOCK's mean {DOCK_MEAN} s") from exc
    c = (DOCK_MAX - DOCK_MIN) / (hi ** b - lo ** b)
    out = mapped(b)
    return out, {"a": DOCK_MIN - c * lo ** b, "b": b, "c": c,
                 "measured": _stats(t), "scaled": _stats(out)}


def _stats(t: np.ndarray) -> dict[str, float]:
    return {"n": int(t.size), "min": float(t.min()), "median": float(np.median(t)), "mean": float(t.mean()),
            "max": float(t.max()), "std": float(t.std()), "max_over_min": float(t.max() / t.min())}


def simulate(procs: int, plan: str, times_file: str, tasks: int, seed: int, engine: str,
             service: float | None = None, base: tuple[float, float] = (BASE_SERVICE, BASE_MSG)) -> dict[str, Any]:
    """One ``python -m nlevel.sim`` run; its JSON result with the command and the CPU seconds it took.

    Raises:
        RuntimeError: when the simulator fails (with its stderr).
    """
    cmd = ["python", "-m", "nlevel.sim", "--procs", str(procs), "--task-times-file", os.path.relpath(times_file, ROOT),
           "--tasks", str(tasks), "--plan", plan, "--seed", str(seed), "--engine", engine, "--json"]
    cmd += ["--service-time", repr(service if service is not None else base[0]), "--msg-time", repr(base[1])]
    before = os.times()
    proc = subprocess.run([sys.executable, *cmd[1:]], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT, OPENBLAS_NUM_THREADS="1"))
    after = os.times()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    r = json.loads(proc.stdout)
    ideal = r["work"] / procs
    return {"command": " ".join(cmd), "procs": procs, "plan_asked": plan, "service_forced": service,
            "levels": r["plan"]["levels"], "regions": r["plan"]["regions"], "plan_reason": r["plan"].get("reason", ""),
            "service_time": r["service_time"], "msg_time": r["msg_time"], "times_source": r["times_source"],
            "makespan": r["makespan"], "work": r["work"], "ideal": ideal, "over_ideal": r["makespan"] / ideal - 1,
            "overhead": r["overhead"], "predicted_overhead": r["predicted_overhead"], "requests": r["requests"],
            "servers": r["servers"], "committed": r["committed"], "events": r["events"], "engine": r["engine"],
            "sim_cpu_seconds": round((after.children_user + after.children_system)
                                     - (before.children_user + before.children_system), 1)}


def _commit() -> str:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "nlevel", "bench/dock_sim.py"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return head + ("+dirty" if dirty else "")


def compare(runs: list[dict[str, Any]], small: int, large: int) -> list[dict[str, Any]]:
    """The paper's Table 2 quantities at ``small`` and ``large`` processes, one entry per service time.

    ``gain_N`` is ``makespan(classic) / makespan(auto) - 1`` at N processes (the paper's
    "faster than DOCK's own scheduler"); ``speedup_P`` is ``makespan(small) / makespan(large)``.
    """
    out = []
    for service in dict.fromkeys(r["service_forced"] for r in runs):
        m = {(r["procs"], r["plan_asked"]): r for r in runs if r["service_forced"] == service}
        auto = m[(large, "auto")]
        paper = next((r for (n, plan), r in m.items() if n == large and plan not in ("classic", "auto")), None)
        out.append({"service_forced": service, "service_time": auto["service_time"],
                    "gain_large_paper_plan": (m[(large, "classic")]["makespan"] / paper["makespan"] - 1
                                              if paper else None),
                    "gain_small": m[(small, "classic")]["makespan"] / m[(small, "auto")]["makespan"] - 1,
                    "gain_large": m[(large, "classic")]["makespan"] / auto["makespan"] - 1,
                    "speedup_classic": m[(small, "classic")]["makespan"] / m[(large, "classic")]["makespan"],
                    "speedup_auto": m[(small, "auto")]["makespan"] / auto["makespan"],
                    "auto_plan_large": {"levels": auto["levels"], "regions": auto["regions"]}})
    return out


def table(result: dict[str, Any]) -> str:
    """The runs, then the comparison with the paper, as Markdown."""
    lines = ["| processes | plan | levels (regions) | service per message | makespan s | over ideal | overhead |",
             "|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        regions = f" ({'x'.join(map(str, r['regions']))})" if r["regions"] else ""
        lines.append(f"| {r['procs']:,} | {r['plan_asked']} | {r['levels']}{regions} | "
                     f"{1e3 * r['service_time']:.3g} ms | {r['makespan']:,.0f} | {100 * r['over_ideal']:+.1f} % | "
                     f"{100 * r['overhead']:.1f} % |")
    small, large = result["procs"][0], result["procs"][-1]
    lines += ["", f"| service per message | auto faster than classic at {small:,} | at {large:,} | speed-up {small:,} → "
                  f"{large:,}, classic | auto | auto's plan at {large:,} | the paper's plan faster than classic at "
                  f"{large:,} |", "|---|---|---|---|---|---|---|"]
    p = PAPER
    lines.append(f"| paper (DOCK, measured) | {100 * p['gain_1024']:+.1f} % | {100 * p['gain_16384']:+.1f} % | "
                 f"{p['speedup_dock']} (DOCK's own) | {p['speedup_nlevel']} (N-level) | "
                 f"{p['levels_16384']} levels, {p['regions_16384']} region-masters | {100 * p['gain_16384']:+.1f} % |")
    for c in result["comparison"]:
        plan = c["auto_plan_large"]
        regions = f", {'x'.join(map(str, plan['regions']))} region-masters" if plan["regions"] else ""
        lines.append(f"| {1e3 * c['service_time']:.3g} ms{'' if c['service_forced'] else ' (--service-time)'} | "
                     f"{100 * c['gain_small']:+.1f} % | {100 * c['gain_large']:+.1f} % | {c['speedup_classic']:.2f} | "
                     f"{c['speedup_auto']:.2f} | {plan['levels']} levels{regions} | "
                     + (f"{100 * c['gain_large_paper_plan']:+.1f} % |" if c["gain_large_paper_plan"] is not None
                        else "— |"))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line (also what ``docs/render.py --check`` parses a saved result's command with)."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--times", default=os.path.join(ROOT, "bench", "results", "dock_times_abl1.txt"),
                   help="measured per-ligand seconds, one a line")
    p.add_argument("--tasks", type=int, default=240_000, help="ligands (default 240,000, the paper's)")
    p.add_argument("--procs", default="1024,16384", help="process counts, smallest first (default 1024,16384)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draw of task times (default 0)")
    p.add_argument("--service-sweep", default="1e-3,5e-3,1e-2,2e-2,5e-2",
                   help="service times per message (s) to force on every server, at every process count "
                        "('' for none)")
    p.add_argument("--paper-plan", default="levels=3,regions=128",
                   help="the paper's plan at 16,384 processes, also run at the largest count ('' for none)")
    p.add_argument("--service-time", type=float, default=BASE_SERVICE,
                   help=f"a server's seconds per message, where the sweep does not force it (default {BASE_SERVICE})")
    p.add_argument("--msg-time", type=float, default=BASE_MSG, help=f"one message, one way, s (default {BASE_MSG})")
    p.add_argument("--engine", default="auto", choices=("auto", "compiled", "python"), help="nlevel.sim's --engine")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "dock_sim.json"))
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the comparison, write the result file, print the table; 2 on bad input."""
    p = build_parser()
    a = p.parse_args(argv)
    try:
        procs = [int(x) for x in a.procs.split(",")]
        sweep = [float(x) for x in a.service_sweep.split(",") if x.strip()]
        if len(procs) < 2 or procs != sorted(procs) or procs[0] < 2:
            raise ValueError(f"--procs must be two or more counts >= 2, smallest first, got {a.procs!r}")
        measured = np.loadtxt(a.times, ndmin=1)
        scaled, scaling = scale_to_dock(measured)
    except (ValueError, OSError) as exc:
        print(f"dock_sim: error: {exc}", file=sys.stderr)
        return 2
    commit = _commit()
    scaled_path = os.path.splitext(a.times)[0] + "_dock_scaled.txt"
    np.savetxt(scaled_path, scaled, fmt="%.3f")
    started = time.time()
    runs = []
    for service in [None, *sweep]:
        for n in procs:
            for plan in ("classic", "auto", a.paper_plan) if n == procs[-1] and a.paper_plan else ("classic", "auto"):
                r = simulate(n, plan, scaled_path, a.tasks, a.seed, a.engine, service, (a.service_time, a.msg_time))
                runs.append(r)
                print(f"{r['command']}: makespan {r['makespan']:,.0f} s, {r['levels']} levels, "
                      f"{100 * r['over_ideal']:+.1f} % over ideal ({r['sim_cpu_seconds']} CPU s)", flush=True)
    result = {
        "what": "python -m nlevel.sim of the paper's DOCK run (Table 2) from measured Vina times scaled to DOCK's range",
        "command": "python bench/dock_sim.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "wall_seconds": round(time.time() - started),
        "times": os.path.relpath(a.times, ROOT), "scaled_times": os.path.relpath(scaled_path, ROOT),
        "scaling_rule": "t' = a + c * t**b; a, b, c such that min = 14 s, max = 801 s, mean = 204 s",
        "scaling": scaling, "tasks": a.tasks, "procs": procs, "seed": a.seed,
        "runs": runs, "comparison": compare(runs, procs[0], procs[-1]),
    }
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(table(result))
    print(f"-> {os.path.relpath(a.out, ROOT)}, {os.path.relpath(scaled_path, ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
