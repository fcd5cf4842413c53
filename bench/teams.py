"""The overhead of teams of 2 against tasks of one rank, on the same processes, side by side in one run.

    nlevel-mpiexec -n 4 python bench/teams.py [--tasks-per-worker 100] [--repeat 3] [--json out.json]

Each repeat runs two farms on the same processes, one after the other:

* **1 rank per task**: ``100 x N`` tasks; task ``i`` sleeps its duration ``d_i`` (2-5 ms, drawn from
  ``i``, the same draws as bench/compare.py);
* **teams of 2** (``ranks_per_task=2``): ``100 x N/2`` tasks; every rank of the team sleeps ``d_i``
  (the team's task time is ``d_i``), then nlevel's closing collective ends the task.

Overhead is ``1 - sum(d_i) / (workers x wall)``, ``workers`` being the ranks (1 rank per task) or
the teams, every one counted (the master computes), ``wall`` from before the farm is made to
after its end (set-up, team formation and end included). The issue's target: the teams' overhead
within 1.5 x that of single-rank tasks. The median of ``--repeat`` runs is printed (and written with
``--json``). Numbers from a loaded or oversubscribed machine mean little: run on idle cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402

from nlevel import Farm  # noqa: E402

comm = MPI.COMM_WORLD


def duration(i: int, lo_ms: float = 2.0, hi_ms: float = 5.0) -> float:
    """Task ``i``'s seconds (the draws of bench/compare.py)."""
    return (lo_ms + (hi_ms - lo_ms) * random.Random(i).random()) * 1e-3


def one_run(total: int, k: int) -> dict[str, float]:
    """A farm of ``total`` sleeping tasks on teams of ``k``: wall and busy seconds (rank 0's view)."""
    comm.Barrier()
    t0 = time.perf_counter()
    busy = 0.0
    with Farm(total, None, comm, ranks_per_task=k) as farm:
        for tid in farm:
            d = duration(tid)
            time.sleep(d)
            busy += d if farm.team.Get_rank() == 0 else 0.0
    wall = time.perf_counter() - t0
    busy = comm.allreduce(busy)
    wall = comm.allreduce(wall, op=MPI.MAX)
    workers = comm.Get_size() // k
    return {"wall_s": wall, "busy_s": busy, "tasks": total, "workers": workers,
            "overhead": 1.0 - busy / (workers * wall)}


def build_parser() -> argparse.ArgumentParser:
    """The command line (also what ``docs/render.py --check`` parses a saved result's command with)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks-per-worker", type=int, default=100, help="2-5 ms tasks per worker (default 100)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json")
    return p


def main() -> int:
    p = build_parser()
    args = p.parse_args()
    size = comm.Get_size()
    if size < 2 or size % 2:
        if comm.rank == 0:
            print(f"bench/teams.py needs an even number of processes >= 2, got {size}", file=sys.stderr)
        return 2
    cases = {"1 rank per task": 1, "teams of 2": 2}
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in cases}
    for k in cases.values():  # (a first farm of each kind, not counted: imports, first communicators)
        one_run(2 * (size // k), k)
    for _ in range(args.repeat):
        for name, k in cases.items():  # (side by side: the machine's state is the same for both)
            runs[name].append(one_run(args.tasks_per_worker * (size // k), k))
    if comm.rank != 0:
        return 0
    med = {c: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for c, rs in runs.items()}
    for c, m in med.items():
        print(f"{c:16} {m['workers']:4.0f} workers  {m['tasks']:6.0f} tasks  wall {m['wall_s']:7.3f} s  "
              f"overhead {100 * m['overhead']:5.1f} %")
    single, teams = med["1 rank per task"]["overhead"], med["teams of 2"]["overhead"]
    ratio = teams / single if single > 0 else float("inf")
    print(f"teams of 2 / 1 rank per task: {ratio:.2f} x the overhead (target <= 1.5)")
    if args.json:
        prov = provenance.record()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        with open(args.json, "w") as f:
            json.dump({"provenance": prov, "size": size, "cores": cores, "oversubscribed": size > cores,
                       "repeat": args.repeat, "median": med, "ratio": ratio, "runs": runs}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.exit(rc)
