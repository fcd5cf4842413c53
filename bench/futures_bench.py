"""``mpi4py.futures.MPIPoolExecutor`` on the same workloads as bench/compare.py.

Run under ``-m mpi4py.futures`` so the pool uses the launched processes (no spawning):
rank 0 runs this script and the other ranks are the pool's workers, as a user of
``MPIPoolExecutor`` would launch it::

    nlevel-mpiexec -n 4 python -m mpi4py.futures bench/futures_bench.py --json out.json

Measures ``executor.map`` throughput on zero-work tasks with ``chunksize=1`` (one task
per message, like the classic loop) and with a tuned chunksize (``--chunksize``,
default ``total / (4 x workers)``: four chunks per worker), and the overhead of 2-5 ms
(and, with ``--long-tasks-per-proc``, 60-180 ms) sleeping tasks at ``chunksize=1``:
``1 - sum(task times) / (processes x wall)`` with every process counted, rank 0
included although it only hands out tasks, exactly as bench/compare.py counts. The
median of ``--repeat`` runs is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from typing import Any

from mpi4py import MPI
from mpi4py.futures import MPIPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402


def zero_task(i: int) -> float:
    return 0.0


def sleep_task(args: tuple[int, float, float]) -> float:
    """Sleep task ``i`` of [lo, hi] ms (the same durations as bench/compare.py); return the time taken."""
    i, lo_ms, hi_ms = args
    t = time.perf_counter()
    time.sleep((lo_ms + (hi_ms - lo_ms) * random.Random(i).random()) * 1e-3)
    return time.perf_counter() - t


def timed_map(executor: MPIPoolExecutor, fn: Any, items: list[Any], chunksize: int) -> tuple[float, float]:
    """Return (wall s, sum of the task times the tasks returned)."""
    t0 = time.perf_counter()
    busy = sum(executor.map(fn, items, chunksize=chunksize))
    return time.perf_counter() - t0, busy


def build_parser() -> argparse.ArgumentParser:
    """The command line (also what ``docs/render.py --check`` parses a saved result's command with)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zero", type=int, default=20_000, help="zero-work tasks per run at chunksize 1 (default 20000)")
    p.add_argument("--zero-tuned", type=int, default=100_000, help="zero-work tasks per run at the tuned chunksize")
    p.add_argument("--chunksize", type=int, default=0, help="the tuned chunksize (default 0: total / (4 x workers))")
    p.add_argument("--tasks-per-proc", type=int, default=100, help="2-5 ms tasks per process (default 100)")
    p.add_argument("--long-tasks-per-proc", type=int, default=0, help="60-180 ms tasks per process (default 0: none)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json")
    return p


def main() -> int:
    p = build_parser()
    args = p.parse_args()
    size = MPI.COMM_WORLD.Get_size()
    workers = max(size - 1, 1)
    tuned = args.chunksize or max(1, args.zero_tuned // (4 * workers))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cases: dict[str, tuple[Any, list[Any], int]] = {
        "zero-work, chunksize 1": (zero_task, list(range(args.zero)), 1),
        f"zero-work, chunksize {tuned}": (zero_task, list(range(args.zero_tuned)), tuned),
        "2-5 ms, chunksize 1": (sleep_task, [(i, 2.0, 5.0) for i in range(args.tasks_per_proc * size)], 1),
    }
    if args.long_tasks_per_proc > 0:
        cases["60-180 ms, chunksize 1"] = (
            sleep_task, [(i, 60.0, 180.0) for i in range(args.long_tasks_per_proc * size)], 1)
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in cases}
    with MPIPoolExecutor() as executor:
        executor.bootup()
        for _ in range(args.repeat):
            for name, (fn, items, chunk) in cases.items():
                wall, busy = timed_map(executor, fn, items, chunk)
                runs[name].append({"wall_s": wall, "busy_s": busy, "tasks": len(items),
                                   "tasks_per_s": len(items) / wall, "overhead": 1.0 - busy / (size * wall)})
    med = {c: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for c, rs in runs.items()}
    for c, m in med.items():
        print(f"MPIPoolExecutor {c:28} {m['tasks_per_s']:12,.0f} tasks/s  overhead {100 * m['overhead']:5.1f} %")
    if args.json:
        prov = provenance.record()  # (before the file is opened: truncating a tracked result makes the tree "dirty")
        with open(args.json, "w") as f:
            json.dump({"provenance": prov, "size": size, "workers": workers, "cores": cores, "oversubscribed": size > cores,
                       "tuned_chunksize": tuned, "repeat": args.repeat, "median": med, "runs": runs}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
