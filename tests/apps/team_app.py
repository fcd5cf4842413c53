"""A test app for teams (``--ranks-per-task``): each task is a collective on the team's communicator.

Every execution is logged per world rank in ``$NLEVEL_TEST_LOG_DIR/exec-<rank>.log`` as
``<task id> <team size> <team rank> <devices>``. Faults, each the first time only (a marker file
in the log directory), on the team's member of rank 1 (the leader with ``--who leader``):
``--die-task T`` SIGKILLs it before the team's collective, ``--hang-task T`` sleeps for ever,
``--raise-task T`` raises. ``--say`` prints to stdout and stderr from Python and from the C level.
"""

import os
import signal
import time

_opts = None
LOG_DIR = os.environ.get("NLEVEL_TEST_LOG_DIR", ".")


def add_arguments(parser):
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--sleep-ms", type=float, default=3.0)
    parser.add_argument("--die-task", type=int, default=-1)
    parser.add_argument("--hang-task", type=int, default=-1)
    parser.add_argument("--raise-task", type=int, default=-1)
    parser.add_argument("--who", choices=["member", "leader"], default="member")
    parser.add_argument("--always", action="store_true", help="the fault every time, not only the first")
    parser.add_argument("--say", action="store_true")


def setup(options):
    global _opts
    _opts = options


def total(options):
    return options.n


def _first(what, task_id):
    marker = os.path.join(LOG_DIR, f"{what}-{task_id}")
    if _opts.always or not os.path.exists(marker):
        open(marker, "a").close()
        return True
    return False


def do_job(task_id, comm):
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    me = comm.Get_rank()
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "-")
    with open(os.path.join(LOG_DIR, f"exec-{rank}.log"), "a") as f:
        f.write(f"{task_id} {comm.Get_size()} {me} {devices}\n")
    if _opts.say:
        print(f"task {task_id} says hello from team rank {me}", flush=True)
        os.write(1, f"task {task_id} C-level stdout {me}\n".encode())
        os.write(2, f"task {task_id} C-level stderr {me}\n".encode())
    victim = (me == 0) if _opts.who == "leader" else (me == 1)
    if victim and task_id == _opts.die_task and _first("died", task_id):
        os.kill(os.getpid(), signal.SIGKILL)
    if victim and task_id == _opts.hang_task and _first("hung", task_id):
        while True:
            time.sleep(1)
    if victim and task_id == _opts.raise_task and _first("raised", task_id):
        raise ValueError(f"task {task_id} is broken on team rank {me}")
    time.sleep(_opts.sleep_ms / 1e3)
    import numpy as np

    got = np.zeros(1, np.int64)
    comm.Allreduce(np.array([task_id], np.int64), got)  # (MPI's own collective: a revoke interrupts it)
    assert got[0] == task_id * comm.Get_size()
    return float(task_id)
