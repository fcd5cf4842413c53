"""A classic hand-written master-slave farm: the fair baseline nlevel has to beat.

What a competent user writes by hand: rank 0 answers every request with exactly one task
id (buffer ``Send``/``Recv`` of a numpy int64, ``Recv(source=ANY_SOURCE)``); a request
carries the id its slave just completed (-1 on the first) and a reply of -1 ends the slave.
With ``master_computes=True`` rank 0 also runs tasks in its single main thread, as in the
classic design: after each own task it answers all pending requests (``Iprobe``) before
the next one, so requests queue behind its task. ``__main__`` runs zero-work and 2-5 ms
sleep tasks: tasks/s, overhead = 1 - sum(task times) / (size * wall) (master counted)::

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpiexec -n 4 \\
        --oversubscribe --mca mpi_yield_when_idle 1 python bench/classic.py
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

REQUEST, TASK = 1, 2  # tags
END = -1  # reply id that ends a slave; request id meaning "nothing completed yet"
IDLE_CEILING = 1e-4  # s, backoff ceiling of a computing master waiting for last requests


def classic_farm(total: int, do_job: Callable[[int], Any], comm: MPI.Comm,
                 master_computes: bool = False) -> dict[str, Any]:
    """Run ``do_job(i)`` for i in range(total) over ``comm``; collective.

    Args:
        total: number of tasks, ids 0 .. total-1; do_job: the task (result ignored).
        comm: communicator to farm over (the farm works on its own ``Dup()``).
        master_computes: rank 0 runs tasks too, between answering requests.

    Returns:
        This rank's stats: ``rank``, ``tasks`` done, ``task_s`` (sum of task times, s),
        ``wall_s`` (s, from a common barrier to this rank's end).

    Raises:
        ValueError: ``total < 0``, or a single rank without ``master_computes``.
    """
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    if comm.Get_size() < 2 and not master_computes:
        raise ValueError("classic_farm needs >= 2 ranks unless master_computes=True, got 1")
    comm = comm.Dup()
    stats: dict[str, Any] = {"rank": comm.Get_rank(), "tasks": 0, "task_s": 0.0}
    comm.Barrier()
    t0 = time.perf_counter()
    if comm.Get_rank() == 0:
        _master(comm, total, do_job, master_computes, stats)
    else:
        _slave(comm, do_job, stats)
    stats["wall_s"] = time.perf_counter() - t0
    comm.Free()
    return stats


def _run(do_job: Callable[[int], Any], tid: int, stats: dict[str, Any]) -> None:
    t = time.perf_counter()
    do_job(tid)
    stats["task_s"] += time.perf_counter() - t
    stats["tasks"] += 1


def _slave(comm: MPI.Comm, do_job: Callable[[int], Any], stats: dict[str, Any]) -> None:
    req, rep = np.array([END], dtype=np.int64), np.empty(1, dtype=np.int64)
    while True:
        comm.Send(req, dest=0, tag=REQUEST)
        comm.Recv(rep, source=0, tag=TASK)
        if rep[0] == END:
            return
        _run(do_job, int(rep[0]), stats)
        req[0] = rep[0]


def _master(comm: MPI.Comm, total: int, do_job: Callable[[int], Any],
            master_computes: bool, stats: dict[str, Any]) -> None:
    buf, out, status = np.empty(1, dtype=np.int64), np.empty(1, dtype=np.int64), MPI.Status()
    next_id, active, delay = 0, comm.Get_size() - 1, 0.0  # active: slaves not yet ended

    def answer(src: int) -> None:
        nonlocal next_id, active
        if next_id < total:
            out[0], next_id = next_id, next_id + 1
        else:
            out[0], active = END, active - 1
        comm.Send(out, dest=src, tag=TASK)

    if not master_computes:
        while active:
            comm.Recv(buf, source=MPI.ANY_SOURCE, tag=REQUEST, status=status)
            answer(status.Get_source())
        return
    while active or next_id < total:
        if comm.Iprobe(source=MPI.ANY_SOURCE, tag=REQUEST, status=status):
            comm.Recv(buf, source=status.Get_source(), tag=REQUEST)
            answer(status.Get_source())
            delay = 0.0
        elif next_id < total:
            next_id += 1
            _run(do_job, next_id - 1, stats)
        else:  # out of work, waiting for the last requests: back off, don't spin
            time.sleep(delay)
            delay = min(2.0 * delay or 1e-6, IDLE_CEILING)


def main() -> None:
    p = argparse.ArgumentParser(description="classic master-slave farm baseline")
    p.add_argument("--zero", type=int, default=50000, help="number of zero-work tasks")
    p.add_argument("--sleep", type=int, default=1000, help="number of 2-5 ms sleep tasks")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    comm, size = MPI.COMM_WORLD, MPI.COMM_WORLD.Get_size()

    def sleep_job(i: int) -> None:
        time.sleep(random.Random(args.seed * 1_000_003 + i).uniform(2e-3, 5e-3))
    jobs = [("zero-work", args.zero, lambda i: None), ("sleep 2-5ms", args.sleep, sleep_job)]
    if comm.Get_rank() == 0:
        print(f"# classic farm, {size} ranks; overhead = 1 - sum(task s) / ({size} * wall)\n"
              f"{'tasks':12s} {'master':>8s} {'n':>6s} {'wall_s':>7s} {'tasks/s':>9s} "
              "overhead  by_rank0")
    for computes in ([False, True] if size > 1 else [True]):
        for name, total, job in jobs:
            st = classic_farm(total, job, comm, master_computes=computes)
            wall = comm.allreduce(st["wall_s"], op=MPI.MAX)
            busy, done = comm.allreduce(st["task_s"]), comm.allreduce(st["tasks"])
            if comm.Get_rank() == 0:
                assert done == total, f"{done} tasks done, expected {total}"
                print(f"{name:12s} {'computes' if computes else 'serves':>8s} {total:6d} "
                      f"{wall:7.3f} {total / wall:9.0f} {1 - busy / (size * wall):8.3f} "
                      f"{st['tasks']:9d}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException:
        import traceback

        traceback.print_exc()  # stderr is line-buffered: printed before the abort
        MPI.COMM_WORLD.Abort(1)
