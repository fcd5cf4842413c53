"""A test app whose master runs one long task in C (the GIL released, no Python bytecode for seconds).

Rank 0's first task is ``hashlib.pbkdf2_hmac`` sized to ``--c-seconds``: a busy C loop that
releases the GIL and never looks at signals (a docking library's call, a BLAS routine). Before
it starts it writes ``c-task-started`` in the log directory. Every other task sleeps
``--sleep-ms`` and appends "<id> <unix time it started>" to ``starts-<rank>.log``.
"""

import hashlib
import os
import time

_opts = None
_first = True
LOG_DIR = os.environ.get("NLEVEL_TEST_LOG_DIR", ".")
RANK = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))


def add_arguments(parser):
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--sleep-ms", type=float, default=20.0)
    parser.add_argument("--c-seconds", type=float, default=10.0)


def setup(options):
    global _opts
    _opts = options


def total(options):
    return options.n


def _c_task(seconds):
    t0 = time.perf_counter()
    hashlib.pbkdf2_hmac("sha256", b"x", b"salt", 20_000)
    per = max((time.perf_counter() - t0) / 20_000, 1e-8)
    with open(os.path.join(LOG_DIR, "c-task-started"), "w") as f:
        f.write(f"{time.time()}\n")
    hashlib.pbkdf2_hmac("sha256", b"x", b"salt", int(seconds / per))  # (one call: seconds in C)
    with open(os.path.join(LOG_DIR, "c-task-ended"), "w") as f:
        f.write(f"{time.time()}\n")


def do_job(task_id):
    global _first
    if RANK == "0" and _first:
        _first = False
        _c_task(_opts.c_seconds)
        return None
    with open(os.path.join(LOG_DIR, f"starts-{RANK}.log"), "a") as f:
        f.write(f"{task_id} {time.time()}\n")
    time.sleep(_opts.sleep_ms / 1e3)
    return None
