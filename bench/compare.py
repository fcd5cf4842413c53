"""nlevel against a hand-written classic master-slave, same processes, one invocation.

Measures, at the launch's process count:

* dispatch throughput: zero-work tasks per second;
* the paper's micro benchmark scaled by 1/1000: tasks uniform in [2, 5] ms (sleeping),
  as overhead fraction = 1 - sum(task times) / (processes x wall), every rank counted.

Systems: nlevel with its defaults (levels auto, master computes), nlevel fixed at 2 and
at 3 levels (from 4 processes), and bench/classic.py with a serve-only master (the usual hand-written
loop) and with a computing master (the paper's classic). Each cell is the median of
``--repeat`` runs, systems interleaved so drift hits all alike. Ratios, not absolute
times, are the figures to compare: on a shared 2-core machine absolute rates move.

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

from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from classic import classic_farm  # noqa: E402

from nlevel import Config, Farm  # noqa: E402

comm = MPI.COMM_WORLD


def sleep_task(lo_ms: float, hi_ms: float) -> Callable[[int], float]:
    def job(i: int) -> float:
        d = (lo_ms + (hi_ms - lo_ms) * random.Random(i).random()) * 1e-3
        time.sleep(d)
        return d

    return job


def zero_task(i: int) -> None:
    return None


def run_nlevel(total: int, job: Callable[[int], Any], config: Config) -> tuple[float, float]:
    """Return (wall s, sum of task time s over all ranks)."""
    comm.Barrier()
    t0 = time.perf_counter()
    busy = 0.0
    farm = Farm(total, config=config)
    for tid in farm:
        s = time.perf_counter()
        job(tid)
        busy += time.perf_counter() - s
    wall = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    return wall, comm.allreduce(busy, op=MPI.SUM)


def run_classic(total: int, job: Callable[[int], Any], master_computes: bool) -> tuple[float, float]:
    busy = [0.0]

    def timed(i: int) -> None:
        s = time.perf_counter()
        job(i)
        busy[0] += time.perf_counter() - s

    stats = classic_farm(total, timed, comm, master_computes=master_computes)
    wall = comm.allreduce(stats["wall_s"], op=MPI.MAX)
    return wall, comm.allreduce(busy[0], op=MPI.SUM)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zero", type=int, default=100_000, help="zero-work tasks per run (default 100000)")
    p.add_argument("--tasks-per-proc", type=int, default=100, help="2-5 ms tasks per process (default 100)")
    p.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is reported (default 3)")
    p.add_argument("--json", help="write all measurements here")
    args = p.parse_args()
    size = comm.size
    cores = os.cpu_count() or 1  # not the affinity: Open MPI binds each rank to one core
    systems: dict[str, Callable[[int, Callable[[int], Any]], tuple[float, float]]] = {
        "nlevel (defaults: auto)": lambda n, j: run_nlevel(n, j, Config()),
        "nlevel (2 levels)": lambda n, j: run_nlevel(n, j, Config(levels=2)),
    }
    if size >= 4:
        systems["nlevel (3 levels)"] = lambda n, j: run_nlevel(n, j, Config(levels=3))
    if size >= 2:
        systems["classic, master serves"] = lambda n, j: run_classic(n, j, False)
    systems["classic, master computes"] = lambda n, j: run_classic(n, j, True)

    work = {
        "zero-work": (args.zero, zero_task),
        "2-5 ms": (args.tasks_per_proc * size, sleep_task(2.0, 5.0)),
    }
    raw: dict[str, dict[str, list[dict[str, float]]]] = {w: {s: [] for s in systems} for w in work}
    for _ in range(args.repeat):
        for wname, (total, job) in work.items():
            for sname, fn in systems.items():
                wall, busy = fn(total, job)
                raw[wname][sname].append(
                    {"wall_s": wall, "tasks_per_s": total / wall, "overhead": 1.0 - busy / (size * wall)}
                )

    if comm.rank == 0:
        over = size > cores
        print(f"nlevel bench/compare.py: {size} processes on {cores} cores"
              f"{' (OVERSUBSCRIBED: ranks share cores; compare ratios only)' if over else ''}, "
              f"median of {args.repeat}")
        base = "classic, master serves" if size >= 2 else "classic, master computes"
        med = {
            w: {s: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for s, runs in by.items()}
            for w, by in raw.items()
        }
        print(f"{'system':28} {'zero-work tasks/s':>18} {'x classic':>10} {'2-5 ms overhead':>16} {'x classic':>10}")
        for s in systems:
            z, m = med["zero-work"][s], med["2-5 ms"][s]
            print(
                f"{s:28} {z['tasks_per_s']:18,.0f} {z['tasks_per_s'] / med['zero-work'][base]['tasks_per_s']:10.2f} "
                f"{100 * m['overhead']:15.1f}% {m['overhead'] / med['2-5 ms'][base]['overhead']:10.2f}"
            )
        print(f"(x classic: ratio to '{base}'; higher is better for tasks/s, lower for overhead)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {"size": size, "cores": cores, "oversubscribed": over, "repeat": args.repeat,
                     "zero_tasks": args.zero, "tasks_per_proc": args.tasks_per_proc,
                     "median": med, "runs": raw},
                    f, indent=2,
                )
                f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
