"""nlevel against a hand-written classic master-slave, same processes, one invocation.

Measures, at the launch's process count:

* the physical limit: the raw mpi4py request/reply round-trip rate between ranks 0 and 1
  (buffer ``Send``/``Recv`` of one int64, and pickled ``send``/``recv``; the fastest of 5 parts);
* dispatch throughput: zero-work tasks per second;
* the paper's micro benchmark scaled by 1/1000: tasks uniform in [2, 5] ms and (unless
  ``--long-tasks-per-proc 0``) [60, 180] ms, sleeping, as overhead fraction
  = 1 - sum(task times) / (processes x wall), every rank counted;
* with ``--sweep``: short nlevel runs at one id per request (``chunk=1``, ``threshold=0.99``
  so the plan stays classic unless rho > 1) over a range of task times, keeping each run's
  decisions (measured rho, mu, the model's T_wait) and its measured wait: the notebook's
  "T_wait vs rho" data (from 4 processes: below that the planner decides nothing).

Systems: nlevel with its defaults (levels auto, master computes), nlevel fixed at 2 and
at 3 levels (from 3 processes), the same with two-sided grants (``--grants two-sided``: 3
levels from 3 processes, else 2), and bench/classic.py with a serve-only master (the usual
hand-written loop, one id per request) and with a computing master (the paper's
classic). nlevel runs go through the public Farm API, as a user's do. Each cell is the
median of ``--repeat`` runs, systems interleaved so drift hits all alike. Ratios, not
absolute times, are the figures to compare: on a shared 2-core machine absolute rates
move. ``bench/suite.py`` runs this at several process counts together with
``mpi4py.futures`` (bench/futures_bench.py) and prints one table.

    nlevel-mpiexec -n 4 python bench/compare.py --json bench/results/compare-4.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from classic import classic_farm  # noqa: E402
import provenance  # noqa: E402

from nlevel import Config, Farm  # noqa: E402

comm = MPI.COMM_WORLD
COUNTER = "one-sided counter (mpi4py.util.sync.Counter)"


def sleep_task(lo_ms: float, hi_ms: float) -> Callable[[int], float]:
    def job(i: int) -> float:
        d = (lo_ms + (hi_ms - lo_ms) * random.Random(i).random()) * 1e-3
        time.sleep(d)
        return d

    return job


def zero_task(i: int) -> None:
    return None


def idle_until_all_arrive() -> None:
    """A barrier that sleeps instead of spinning, so waiting ranks leave the cores to the others."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(1e-3)


def round_trips(count: int, batches: int = 5) -> dict[str, float]:
    """Request/reply round trips per second between ranks 0 and 1 (others wait, sleeping).

    The count is timed in ``batches`` parts and the fastest part is kept: this is the
    limit, and on a shared machine a slow part measures the neighbours.
    """
    out: dict[str, float] = {}
    if comm.size < 2 or count <= 0:
        return out
    idle_until_all_arrive()
    if comm.rank in (0, 1):
        peer = 1 - comm.rank
        buf = np.zeros(1, dtype=np.int64)
        per = max(1, count // batches)
        for name in ("buffer", "pickle"):
            best = 0.0
            for _ in range(batches):
                t0 = time.perf_counter()
                for i in range(per):
                    if comm.rank == 0:
                        if name == "buffer":
                            buf[0] = i
                            comm.Send(buf, dest=peer, tag=7)
                            comm.Recv(buf, source=peer, tag=8)
                        else:
                            comm.send(i, dest=peer, tag=7)
                            comm.recv(source=peer, tag=8)
                    elif name == "buffer":
                        comm.Recv(buf, source=peer, tag=7)
                        comm.Send(buf, dest=peer, tag=8)
                    else:
                        comm.send(comm.recv(source=peer, tag=7), dest=peer, tag=8)
                best = max(best, per / (time.perf_counter() - t0))
            out[name] = best
    idle_until_all_arrive()
    result: dict[str, float] = comm.bcast(out, root=0)
    return result


def digest(report: dict[str, Any] | None) -> dict[str, Any]:
    """The few fields of an nlevel run report the suite and the notebook use."""
    if not report:
        return {}
    keep = {k: report.get(k) for k in ("plan", "hierarchy", "overhead", "requests", "plan_history", "tasks")}
    decisions = []
    for d in report.get("decisions", []):
        cur = d.get("current_predicted") or {}
        lvl0 = (cur.get("levels") or [{}])[0]
        decisions.append({
            # (one-sided farms record rho per queue: the master's CPU is the M/M/1 server of the reports)
            "rho_measured": (d.get("rho_measured") or {}).get("cpu") if isinstance(d.get("rho_measured"), dict)
            else d.get("rho_measured"), "rho_model": d.get("rho_model"), "mu_per_s": d.get("mu_per_s") or d.get("mu"),
            "service_s": d.get("service_s"), "msg_s": d.get("msg_s"), "task_mean_s": d.get("task_mean_s"),
            "lambda_per_s": lvl0.get("arrival_rate"), "t_wait_model_s": lvl0.get("t_wait"),
            "verdict": (d.get("poisson") or {}).get("verdict"), "chosen": (d.get("chosen") or {}).get("levels"),
        })
    keep["decisions"] = decisions
    return keep


def run_nlevel(total: int, job: Callable[[int], Any], config: Config) -> dict[str, Any]:
    """Return wall s, sum of task time s over all ranks, and (on rank 0) the run report's digest."""
    comm.Barrier()
    t0 = time.perf_counter()
    busy = 0.0
    farm = Farm(total, config=config)
    for tid in farm:
        s = time.perf_counter()
        job(tid)
        busy += time.perf_counter() - s
    wall = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    return {"wall_s": wall, "busy_s": comm.allreduce(busy, op=MPI.SUM), "report": digest(farm.report)}


def run_classic(total: int, job: Callable[[int], Any], master_computes: bool) -> dict[str, Any]:
    busy = [0.0]

    def timed(i: int) -> None:
        s = time.perf_counter()
        job(i)
        busy[0] += time.perf_counter() - s

    stats = classic_farm(total, timed, comm, master_computes=master_computes)
    wall = comm.allreduce(stats["wall_s"], op=MPI.MAX)
    return {"wall_s": wall, "busy_s": comm.allreduce(busy[0], op=MPI.SUM)}


def run_counter(total: int, job: Callable[[int], Any]) -> dict[str, Any]:
    """The ~20-line one-sided farm: every rank takes the next id with ``mpi4py.util.sync.Counter``
    (a ``Fetch_and_op`` on rank 0's window), no master, no checkpoint, no fault tolerance."""
    from mpi4py.util.sync import Counter

    comm.Barrier()
    t0 = time.perf_counter()
    busy = 0.0
    counter = Counter(comm=comm)
    while (i := next(counter)) < total:
        s = time.perf_counter()
        job(i)
        busy += time.perf_counter() - s
    comm.Barrier()  # (every rank done before the window goes)
    counter.free()
    wall = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    return {"wall_s": wall, "busy_s": comm.allreduce(busy, op=MPI.SUM)}


def systems_for(size: int) -> dict[str, Callable[[int, Callable[[int], Any]], dict[str, Any]]]:
    """The systems compared at ``size`` processes, by name."""
    systems: dict[str, Callable[[int, Callable[[int], Any]], dict[str, Any]]] = {
        "nlevel (defaults: auto)": lambda n, j: run_nlevel(n, j, Config()),
        "nlevel (2 levels)": lambda n, j: run_nlevel(n, j, Config(levels=2)),
    }
    if size >= 3:
        systems["nlevel (3 levels)"] = lambda n, j: run_nlevel(n, j, Config(levels=3))
        # The same hierarchy with every claim a message to the parent's server: is one-sided the
        # right choice at the upper level too? (issue 12 asks for numbers)
        systems["nlevel (3 levels, two-sided grants)"] = lambda n, j: run_nlevel(n, j, Config(levels=3,
                                                                                            grants="two-sided"))
    else:
        systems["nlevel (two-sided grants)"] = lambda n, j: run_nlevel(n, j, Config(levels=2, grants="two-sided"))
    if size >= 2:
        systems["classic, master serves"] = lambda n, j: run_classic(n, j, False)
    systems["classic, master computes"] = lambda n, j: run_classic(n, j, True)
    systems[COUNTER] = run_counter
    return systems


def sweep(size: int, tasks_per_proc: int) -> list[dict[str, Any]]:
    """nlevel at one id per request over a range of task times: measured rho and wait against the model."""
    rows = []
    for lo, hi in ((0.05, 0.15), (0.2, 0.5), (0.5, 1.5), (1.0, 3.0), (2.0, 5.0)):
        total = max(tasks_per_proc * size, 200)
        r = run_nlevel(total, sleep_task(lo, hi), Config(chunk=1, threshold=0.99))
        rows.append({"task_ms": [lo, hi], "total": total, "wall_s": r["wall_s"], "busy_s": r["busy_s"],
                     "report": r["report"]})
    return rows


def build_parser() -> argparse.ArgumentParser:
    """The command line (also what ``docs/render.py --check`` parses a saved result's command with)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zero", type=int, default=100_000, help="zero-work tasks per run (default 100000)")
    p.add_argument("--tasks-per-proc", type=int, default=100, help="2-5 ms tasks per process (default 100)")
    p.add_argument("--long-tasks-per-proc", type=int, default=0,
                   help="60-180 ms tasks per process (default 0: not run; the paper's is 100)")
    p.add_argument("--rtt", type=int, default=20_000, help="raw round trips to time (default 20000; 0: none)")
    p.add_argument("--sweep", action="store_true", help="also run the T_wait-vs-rho sweep (nlevel only)")
    p.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is reported (default 3)")
    p.add_argument("--json", help="write all measurements here")
    return p


def main() -> int:
    p = build_parser()
    args = p.parse_args()
    size = comm.size
    cores = os.cpu_count() or 1  # (not this rank's affinity: mpiexec binds each rank to one core)
    systems = systems_for(size)
    work: dict[str, tuple[int, Callable[[int], Any]]] = {
        "2 tasks": (2, zero_task),  # the fixed cost of a farm: set-up, two ids, tear-down
        "zero-work": (args.zero, zero_task),
        "2-5 ms": (args.tasks_per_proc * size, sleep_task(2.0, 5.0)),
    }
    if args.long_tasks_per_proc > 0:
        work["60-180 ms"] = (args.long_tasks_per_proc * size, sleep_task(60.0, 180.0))
    rtt: list[dict[str, float]] = []
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {w: {s: [] for s in systems} for w in work}
    # Warm-up, not measured: every system once on 2 tasks, so that no system's measured first run
    # pays the process's one-time costs (imports, MPI's first window) for the ones after it.
    # (A job pays them once; `2 tasks` below is the cost of a farm in a running process.)
    for fn in systems.values():
        fn(2, zero_task)
    for _ in range(args.repeat):
        rtt.append(round_trips(args.rtt))
        for wname, (total, job) in work.items():
            for sname, fn in systems.items():
                r = fn(total, job)
                r.update(tasks=total, tasks_per_s=total / r["wall_s"], overhead=1.0 - r["busy_s"] / (size * r["wall_s"]))
                raw[wname][sname].append(r)
    # Below 4 processes no hierarchy fits, so the planner makes no decisions: nothing to sweep.
    sweep_rows = sweep(size, max(args.tasks_per_proc, 50)) if args.sweep and size >= 4 else []

    if comm.rank == 0:
        over = size > cores
        print(f"nlevel bench/compare.py: {size} processes on {cores} cores"
              f"{' (OVERSUBSCRIBED: ranks share cores; compare ratios only)' if over else ''}, "
              f"median of {args.repeat}")
        numeric = ("wall_s", "busy_s", "tasks_per_s", "overhead")
        med = {
            w: {s: {k: statistics.median(r[k] for r in runs) for k in numeric} for s, runs in by.items()}
            for w, by in raw.items()
        }
        rtt_med = {k: statistics.median(r[k] for r in rtt) for k in (rtt[0] if rtt else {})}
        if rtt_med:
            print(f"raw round trips/s between 2 ranks: buffer {rtt_med['buffer']:,.0f}, pickle {rtt_med['pickle']:,.0f}")
        print(f"{'system':44} {'zero-work tasks/s':>18} {'x counter':>10} {'2-5 ms overhead':>16} {'x counter':>10} "
              f"{'2-task farm':>12}")
        for s in systems:
            z, m, two = med["zero-work"][s], med["2-5 ms"][s], med["2 tasks"][s]
            print(
                f"{s:44} {z['tasks_per_s']:18,.0f} {z['tasks_per_s'] / med['zero-work'][COUNTER]['tasks_per_s']:10.2f} "
                f"{100 * m['overhead']:15.2f}% {m['overhead'] / max(med['2-5 ms'][COUNTER]['overhead'], 1e-9):10.2f} "
                f"{1e3 * two['wall_s']:10.1f} ms"
            )
        print("(x counter: ratio to the one-sided counter; higher is better for tasks/s, lower for overhead)")
        if args.json:
            prov = provenance.record()  # (before the file is opened: truncating a tracked result makes the tree "dirty")
            with open(args.json, "w") as f:
                json.dump(
                    {"provenance": prov, "size": size, "cores": cores, "oversubscribed": over,
                     "repeat": args.repeat,
                     "zero_tasks": args.zero, "tasks_per_proc": args.tasks_per_proc,
                     "long_tasks_per_proc": args.long_tasks_per_proc,
                     "yield_when_idle": os.environ.get("OMPI_MCA_mpi_yield_when_idle"),
                     "round_trips_per_s": rtt_med, "round_trips_runs": rtt,
                     "median": med, "runs": raw, "sweep": sweep_rows},
                    f, indent=1,
                )
                f.write("\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:
        import traceback

        traceback.print_exc()  # an error on one rank must not leave the others waiting
        MPI.COMM_WORLD.Abort(1)
