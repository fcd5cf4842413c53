"""The command line of ``python -m nlevel.sim``: parse the options, run :func:`nlevel.sim.simulate`, print.

Kept apart from :mod:`nlevel.sim.model` (the timing model and the run) so each stays a
readable size; ``python -m nlevel.sim`` and :func:`nlevel.sim.main` are :func:`main` here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from typing import Any, Sequence

import numpy as np

from ..config import Config
from ..model.plan import Plan
from ..model.profiles import get_profile, profile_names
from ..errors import ConfigError, NlevelError
from .build import BuildUnavailable, build, compiled
from .model import SimReport, default_times, make_durations, parse_plan, parse_task_time, read_task_times, simulate

__all__ = ["build_parser", "run", "main", "AUTO_COMPILE_TASKS", "DEFAULT_ATOMIC_TIME", "DEFAULT_ATOMIC_SERVICE"]

#: One one-sided operation as its origin sees it, when neither --atomic-time nor --network says.
DEFAULT_ATOMIC_TIME = 1e-6
#: What one one-sided operation occupies at its target, when neither --atomic-service nor --network says.
DEFAULT_ATOMIC_SERVICE = 2e-7

#: ``--engine auto`` compiles (or reuses the compiled build) from this many tasks on:
#: below it the interpreted engine finishes in well under a minute.
AUTO_COMPILE_TASKS = 300_000
_CHILD = "NLEVEL_SIM_COMPILED_CHILD"


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of ``python -m nlevel.sim``."""
    p = argparse.ArgumentParser(
        prog="python -m nlevel.sim",
        description="Discrete-event simulation of an nlevel farm: the same master / region-master / "
        "slave state machines, with service and message times from calibration. Prints the overhead "
        "(1 - work / (procs x makespan)) and the makespan.",
    )
    p.add_argument("--procs", type=int, required=True, metavar="N", help="processes to simulate")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--task-time", metavar="L:H", help="task durations uniform in [L, H] seconds, or one constant T")
    src.add_argument(
        "--task-times-file", metavar="F", help="task durations sampled (with replacement) from F, one per line, seconds"
    )
    p.add_argument("--tasks-per-proc", type=int, default=100, metavar="K", help="tasks per process (default 100)")
    p.add_argument("--tasks", type=int, metavar="T", help="total tasks (overrides --tasks-per-proc)")
    p.add_argument(
        "--plan",
        default="classic",
        help="classic (default), auto (the job starts as a real --levels auto job and the in-job planner "
        "samples, decides and switches in simulated time), or e.g. levels=3,regions=128[,prefetch=2,"
        "chunk=1,serve_only=none]",
    )
    p.add_argument(
        "--chunk", type=int, default=None, help="ids per slave request unless the plan sets chunk= (default: 1 for a "
        "given plan, as in the paper; under --plan auto the planner's choice; 0 = nlevel's automatic chunks)"
    )
    p.add_argument("--threshold", type=float, default=0.10, metavar="C", help="--plan auto: overhead threshold (default 0.10)")
    p.add_argument("--service-time", type=float, metavar="S", help="seconds a server spends per message (default: calibration)")
    p.add_argument("--msg-time", type=float, metavar="S", help="one-way message seconds (default: calibration)")
    p.add_argument("--atomic-time", type=float, default=None, metavar="S",
                   help=f"seconds of one one-sided operation as its origin sees it (default: the network's, else "
                   f"{DEFAULT_ATOMIC_TIME:g})")
    p.add_argument("--atomic-service", type=float, default=None, metavar="S",
                   help=f"seconds each one-sided operation occupies the board owner's memory (default: the "
                   f"network's, else {DEFAULT_ATOMIC_SERVICE:g})")
    p.add_argument("--network", metavar="NAME", help="message and one-sided times of a named network: "
                   + ", ".join(profile_names()) + " (see nlevel/model/profiles.py for the sources); the service "
                   "time stays the CPU's; --msg-time, --atomic-time and --atomic-service override it")
    p.add_argument(
        "--startup", type=float, default=0.0, metavar="S", help="fixed seconds of set-up and tear-down (default 0)"
    )
    p.add_argument("--kill", action="append", default=[], metavar="WHO@WHEN",
                   help="kill a process mid-run: WHO is slave, region, master (on the first plan's layout) or a "
                   "rank; WHEN is seconds (1500s) or a fraction of the ideal makespan, work / procs (0.5); "
                   "repeatable; turns fault tolerance on")
    p.add_argument("--drain", action="append", default=[], metavar="N@WHEN",
                   help="ask the master to take N slaves out of the job at WHEN (as --kill): the N highest-ranked "
                   "(whole regions, as freeing whole nodes does), or with N written N/spread, N spread evenly "
                   "over the slaves; repeatable")
    p.add_argument("--failure-notice", type=float, default=0.05, metavar="S",
                   help="seconds between a death and the survivors hearing of it (default 0.05)")
    p.add_argument("--fault-tolerance", choices=("on", "off"), default=None,
                   help="run the roles with fault tolerance on or off (default: on with --kill, else off)")
    p.add_argument("--batch-age", type=float, metavar="S", help="region-masters' completion batch age (default: Config's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the task durations (default 0)")
    p.add_argument(
        "--engine", choices=("auto", "compiled", "python"), default="auto",
        help="compiled: the roles compiled with mypyc (built once and cached, about 3x faster; needs mypy and a "
        f"C compiler); python: interpreted; auto (default): compiled from {AUTO_COMPILE_TASKS:,} tasks on when it "
        "can be built, else interpreted with a note. Results are identical.",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def run(options: argparse.Namespace) -> SimReport:
    """Run the simulation ``options`` describe (parsed by :func:`build_parser`).

    Raises:
        NlevelError: on bad input, naming the value.
    """
    if options.procs < 1:
        raise ConfigError(f"--procs must be an integer >= 1, got {options.procs}")
    if options.tasks is not None and options.tasks < 1:
        raise ConfigError(f"--tasks must be an integer >= 1, got {options.tasks}")
    if options.tasks is None and options.tasks_per_proc < 1:
        raise ConfigError(f"--tasks-per-proc must be an integer >= 1, got {options.tasks_per_proc}")
    if options.chunk is not None and options.chunk < 0:
        raise ConfigError(f"--chunk must be an integer >= 0 (0 = automatic), got {options.chunk}")
    tasks = options.tasks if options.tasks is not None else options.procs * options.tasks_per_proc
    if options.task_times_file is not None:
        samples = read_task_times(options.task_times_file)
        durations = make_durations(tasks, samples=samples, seed=options.seed)
        arr = np.asarray(samples)
        tt: dict[str, Any] = {
            "kind": "file", "path": options.task_times_file, "samples": len(samples), "mean": float(arr.mean())
        }
    else:
        lo, hi = parse_task_time(options.task_time)
        durations = make_durations(tasks, task_time=(lo, hi), seed=options.seed)
        mean = (lo + hi) / 2
        tt = {"kind": "constant" if lo == hi else "uniform", "lo": lo, "hi": hi, "mean": mean}
    tt["seed"] = options.seed
    service, msg, source = default_times()
    if options.service_time is not None or options.msg_time is not None:
        source = "given" if options.service_time is not None and options.msg_time is not None else source + ", partly given"
    atomic_time, atomic_service = DEFAULT_ATOMIC_TIME, DEFAULT_ATOMIC_SERVICE
    network = getattr(options, "network", None)
    if network is not None:
        prof = get_profile(network)
        msg = prof.msg_time
        atomic_time = prof.atomic_time if prof.atomic_time is not None else atomic_time
        atomic_service = prof.atomic_service if prof.atomic_service is not None else atomic_service
        taken = [name for name, mine, given in (("message", prof.msg_time, options.msg_time),
                                                ("one-sided", prof.atomic_time, options.atomic_time),
                                                ("at-target", prof.atomic_service, options.atomic_service))
                 if mine is not None and given is None]
        source += f"; network {prof.name} ({', '.join(taken) or 'nothing: all given'})"
    service = options.service_time if options.service_time is not None else service
    msg = options.msg_time if options.msg_time is not None else msg
    atomic_time = options.atomic_time if options.atomic_time is not None else atomic_time
    atomic_service = options.atomic_service if options.atomic_service is not None else atomic_service
    if not (math.isfinite(service) and service > 0):
        raise ConfigError(f"--service-time must be > 0 s, got {service}")
    if not (math.isfinite(msg) and msg >= 0):
        raise ConfigError(f"--msg-time must be >= 0 s, got {msg}")
    for flag, v in (("--atomic-time", atomic_time), ("--atomic-service", atomic_service),
                    ("--startup", options.startup)):
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(f"{flag} must be >= 0 s, got {v}")
    config = Config(threshold=options.threshold)
    if options.batch_age is not None:
        config = config.with_(batch_age=options.batch_age)
    plan: Plan | None = None
    if options.plan.strip() == "auto":
        if options.chunk is not None:
            config = config.with_(chunk=options.chunk)
    else:
        plan = parse_plan(options.plan, options.procs, 1 if options.chunk is None else options.chunk)
    ideal = float(sum(durations)) / options.procs
    kills = [_at(text, "--kill", ideal) for text in options.kill]
    drains = []
    for text in options.drain:
        when, count = _at(text, "--drain", ideal)
        spread = count.endswith("/spread")
        count = count[: -len("/spread")] if spread else count
        if not count.isdigit() or int(count) < 1:
            raise ConfigError(f"--drain must be N@WHEN or N/spread@WHEN with N an integer >= 1, got {text!r}")
        drains.append((when, -int(count) if spread else int(count)))
    ft = None if options.fault_tolerance is None else options.fault_tolerance == "on"
    report = simulate(
        options.procs,
        plan,
        durations,
        service,
        msg,
        atomic_time=atomic_time,
        atomic_service=atomic_service,
        startup=options.startup,
        config=config,
        times_source=source,
        task_time=tt,
        kills=kills,
        drains=drains,
        notice=options.failure_notice,
        fault_tolerance=ft,
    )
    timed = [("--kill", text, when) for text, (when, _) in zip(options.kill, kills)]
    timed += [("--drain", text, when) for text, (when, _) in zip(options.drain, drains)]
    for flag, text, when in timed:
        if when > report.makespan:  # (valid, but never silent: "1500" for "1500s" drains nothing)
            hint = "" if text.rstrip().endswith("s") else \
                f" (WHEN without 's' is a fraction of the ideal makespan, {ideal:.6g} s)"
            sys.stderr.write(f"nlevel.sim: note: {flag} {text} comes at {when:.6g} s, after the job ended "
                             f"({report.makespan:.6g} s): it did nothing{hint}\n")
    return report


def _at(text: str, flag: str, ideal: float) -> tuple[float, str]:
    """``WHO@WHEN`` -> ``(seconds, WHO)``: WHEN is ``1500s`` or a fraction of ``ideal`` seconds.

    Raises:
        ConfigError: naming the flag and the value.
    """
    who, at, when = text.partition("@")
    try:
        if not at or not who.strip():
            raise ValueError
        w = when.strip()
        seconds = float(w[:-1]) if w.endswith("s") else float(w) * ideal
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError
    except ValueError:
        raise ConfigError(f"{flag} must be WHO@WHEN, WHEN in seconds (1500s) or a fraction of the ideal makespan "
                          f"(0.5), got {text!r}") from None
    return seconds, who.strip()


def _in_compiled(where: str, argv: Sequence[str]) -> int:
    """Run this command again in a child whose ``nlevel`` is the compiled build in ``where``."""
    code = f"import sys; sys.path.insert(0, {where!r}); import runpy; runpy.run_module('nlevel.sim', run_name='__main__')"
    # One BLAS thread: the simulation uses none, and idle OpenBLAS threads spin on a busy machine.
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    env[_CHILD] = "1"
    return subprocess.run([sys.executable, "-c", code, *argv], env=env).returncode


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``python -m nlevel.sim``; return the exit status (2 for bad input)."""
    options = build_parser().parse_args(argv)
    if options.engine != "python" and not os.environ.get(_CHILD) and not compiled():
        tasks = options.tasks if options.tasks is not None else options.procs * options.tasks_per_proc
        if options.engine == "compiled" or tasks >= AUTO_COMPILE_TASKS:
            try:
                where = build()
            except BuildUnavailable as exc:
                if options.engine == "compiled":
                    print(f"nlevel.sim: error: --engine compiled: {exc}", file=sys.stderr)
                    return 2
                print(f"nlevel.sim: note: simulating with the interpreted engine, about 3x slower ({exc})",
                      file=sys.stderr)
            else:
                return _in_compiled(str(where), list(sys.argv[1:] if argv is None else argv))
    try:
        report = run(options)
    except NlevelError as exc:
        print(f"nlevel.sim: error: {exc}", file=sys.stderr)
        return 2
    if options.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.summary())
    return 0
