"""team_pi: each task is a small MPI program, a Monte Carlo estimate of pi computed by a team of ranks.

```bash
nlevel-mpiexec -n 8 python -m nlevel.run apps.team_pi --ranks-per-task 4 --tasks 64 --samples 2000000
```

Task ``i`` throws ``--samples`` points into the unit square and counts those inside the quarter
circle. The points come in ``--blocks`` blocks, block ``b`` drawn from its own random stream
(seeded by ``--seed``, ``i`` and ``b``); the team's ranks share the blocks out (rank ``r`` of a
team of ``k`` draws blocks ``r``, ``r + k``, ...) and add their counts with an ``Allreduce`` on
the team's communicator. The count is an integer sum over the same blocks whoever draws them, so
a team of any size, or one process alone (:func:`serial`), gives exactly the same result: the
tests check the farm's results against :func:`serial`.

Each task's result is two numbers, ``pi`` (the estimate) and ``hits``; ``finish`` prints the
mean estimate over the tasks and, with ``--out FILE.json``, writes every task's.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

result_fields = ("pi", "hits")

_opts: Any = None


def add_arguments(parser: Any) -> None:
    parser.add_argument("--tasks", type=int, default=32, help="number of tasks (default 32)")
    parser.add_argument("--samples", type=int, default=400_000, help="points per task (default 400000)")
    parser.add_argument("--blocks", type=int, default=12, help="random streams per task, shared out over the team "
                        "(default 12; at least the team's size keeps every rank busy)")
    parser.add_argument("--seed", type=int, default=2024, help="seed of every stream (default 2024)")
    parser.add_argument("--out", default=None, help="write every task's estimate to this JSON file (rank 0)")


def setup(options: Any) -> None:
    global _opts
    for name in ("tasks", "samples", "blocks"):
        if getattr(options, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(options, name)}")
    if options.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {options.seed}")
    _opts = options


def total(options: Any) -> int:
    return int(options.tasks)


def fingerprint(options: Any) -> dict[str, Any]:
    return {"samples": options.samples, "blocks": options.blocks, "seed": options.seed}


def block_hits(task_id: int, block: int, samples: int, blocks: int, seed: int) -> int:
    """Points of block ``block`` of task ``task_id`` inside the quarter circle."""
    n = samples // blocks + (1 if block < samples % blocks else 0)
    rng = np.random.default_rng(np.random.SeedSequence([seed, task_id, block]))
    hits = 0
    for start in range(0, n, 1 << 16):  # (in slices: memory stays small for large blocks)
        m = min(1 << 16, n - start)
        x, y = rng.random(m), rng.random(m)
        hits += int(np.count_nonzero(x * x + y * y <= 1.0))
    return hits


def estimate(task_id: int, comm: Any, samples: int, blocks: int, seed: int) -> tuple[float, float]:
    """Task ``task_id`` on the team ``comm``: (pi estimate, hits), the same on every rank of the team."""
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    mine = np.array([sum(block_hits(task_id, b, samples, blocks, seed) for b in range(rank, blocks, size))], np.int64)
    hits = np.zeros(1, np.int64)
    comm.Allreduce(mine, hits, op=MPI.SUM)  # (a buffer collective: exact integers, and interruptible under ULFM)
    return 4.0 * int(hits[0]) / samples, float(hits[0])


def serial(task_id: int, samples: int, blocks: int, seed: int) -> tuple[float, float]:
    """The same task on one process (the answer a team must give)."""
    hits = sum(block_hits(task_id, b, samples, blocks, seed) for b in range(blocks))
    return 4.0 * hits / samples, float(hits)


def do_job(task_id: int, comm: Any) -> tuple[float, float]:
    o = _opts
    return estimate(task_id, comm, o.samples, o.blocks, o.seed)


def finish(ids: Any, values: Any, options: Any) -> None:
    order = np.argsort(ids)
    pis = values[order, 0]
    mean = float(np.mean(pis)) if len(pis) else float("nan")
    print(f"team_pi: {len(pis)} tasks of {options.samples} points: pi ~ {mean:.6f} "
          f"(error {abs(mean - math.pi):.2e})", flush=True)
    if options.out:
        with open(options.out, "w") as f:
            json.dump({"ids": [int(i) for i in ids[order]], "pi": [float(p) for p in pis],
                       "hits": [float(h) for h in values[order, 1]]}, f)
