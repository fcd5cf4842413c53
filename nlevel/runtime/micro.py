"""The built-in workload: the paper's micro benchmark, scaled from seconds to milliseconds.

Task ``i`` lasts ``L + S * u_i`` where ``u_i`` is uniform in [0, 1) and fixed by
``(seed, i)``, so every run (any process count, any restart) gives task ``i`` the
same duration. The paper used [2, 5] s and [60, 180] s on 32,768 cores; the defaults
here, [2, 5] ms, make a laptop run take seconds. ``--busy`` spins in pure Python
(holding the GIL, like a Python-heavy task) instead of sleeping. The task's result is
its nominal duration in seconds.

This module is also the reference example of the app contract (see README).
"""

from __future__ import annotations

import argparse
import random
import time

__all__ = ["add_arguments", "setup", "total", "fingerprint", "do_job", "duration"]

_opts = argparse.Namespace(tasks=2000, task_min=2.0, task_spread=3.0, busy=False, seed=0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the workload's options."""
    parser.add_argument("--tasks", type=int, default=2000, help="number of tasks (default 2000)")
    parser.add_argument("--task-min", type=float, default=2.0, metavar="L", help="shortest task in ms (default 2)")
    parser.add_argument(
        "--task-spread", type=float, default=3.0, metavar="S", help="task times are uniform in [L, L+S] ms (default 3)"
    )
    parser.add_argument("--busy", action="store_true", help="spin in pure Python instead of sleeping")
    parser.add_argument("--seed", type=int, default=0, help="seed of the task durations (default 0)")


def setup(options: argparse.Namespace) -> None:
    """Take the parsed options (called on every rank before the first task).

    Raises:
        ValueError: for a negative count or duration.
    """
    if options.tasks < 0:
        raise ValueError(f"--tasks must be >= 0, got {options.tasks}")
    if options.task_min < 0 or options.task_spread < 0:
        raise ValueError(f"--task-min and --task-spread must be >= 0 ms, got {options.task_min} and {options.task_spread}")
    global _opts
    _opts = options


def total(options: argparse.Namespace) -> int:
    """Return the number of tasks."""
    return int(options.tasks)


def fingerprint(options: argparse.Namespace) -> dict[str, object]:
    """What defines the tasks beside their number: their durations (``--busy`` only changes how they wait)."""
    return {"task_min": options.task_min, "task_spread": options.task_spread, "seed": options.seed}


def duration(task_id: int) -> float:
    """Return task ``task_id``'s duration in seconds (deterministic in seed and id)."""
    u = random.Random(_opts.seed * 1_000_003 + task_id).random()
    return (_opts.task_min + _opts.task_spread * u) * 1e-3


def do_job(task_id: int) -> float:
    """Run task ``task_id``: sleep (or spin) for its duration; return the duration."""
    d = duration(task_id)
    if _opts.busy:
        end = time.perf_counter() + d
        while time.perf_counter() < end:
            pass
    elif d > 0:
        time.sleep(d)
    return d
