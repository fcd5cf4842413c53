"""A test app for the emulated cluster: logs every task with the rank and the node it ran on."""

import os
import socket
import time

_opts = None
# (passed to every rank with mpiexec -x: daemons started as ssh starts them pass no environment on)
LOG_DIR = os.environ.get("NLEVEL_TEST_LOG_DIR")


def add_arguments(parser):
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--sleep-ms", type=float, default=0.0)


def setup(options):
    global _opts
    _opts = options


def total(options):
    return options.n


def _where():
    from mpi4py import MPI  # (already initialised by the farm: this only names the node)

    return f"{MPI.COMM_WORLD.Get_rank()} {MPI.Get_processor_name()} {socket.gethostname()}"


def do_job(task_id):
    if LOG_DIR:
        rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
        with open(os.path.join(LOG_DIR, f"exec-{rank}.log"), "a") as f:
            f.write(f"{task_id} {_where()}\n")
    if _opts.sleep_ms:
        time.sleep(_opts.sleep_ms / 1e3)
    return 0.0
