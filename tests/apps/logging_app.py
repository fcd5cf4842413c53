"""A test app: records every execution of a task in a per-rank log (to prove exactly-once)."""

import os
import time

_opts = None


def add_arguments(parser):
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--sleep-ms", type=float, default=0.0)


# The log directory comes from the environment, which the tests set for every rank. (As an option it
# would not block a resume either: this app has no fingerprint hook, so its identity is name + total.)
LOG_DIR = os.environ.get("NLEVEL_TEST_LOG_DIR")


def setup(options):
    global _opts
    _opts = options


def total(options):
    return options.n


def do_job(task_id):
    if LOG_DIR:
        rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))
        with open(os.path.join(LOG_DIR, f"exec-{rank}.log"), "a") as f:
            f.write(f"{task_id}\n")
    if _opts.sleep_ms:
        time.sleep(_opts.sleep_ms / 1e3)
    return task_id * 0.5
