"""``python -m nlevel.plan``: the plan the model chooses, before spending an allocation.

    python -m nlevel.plan --procs 32768 --task-time 2:5 [--tasks-per-proc 100]
        [--service-time S] [--msg-time T] [--atomic-time A] [--atomic-service B] [--network NAME]
        [--threshold 0.1] [--json]
    python -m nlevel.plan --calibrate [-n 2]

Costs default to the stored calibration (``--calibrate`` measures them on this machine
with a short mpiexec run), else to nlevel's settings' defaults (the output says which).
``--network NAME`` (shm, ib-hdr, slingshot-11: :mod:`nlevel.model.profiles`) takes the
message and one-sided times from a named network instead; the service time stays the
CPU's, and an explicit ``--msg-time`` etc. overrides the profile.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import warnings
from dataclasses import replace
from typing import Callable, Sequence

from ..config import Config
from ..errors import NlevelError
from ..model.calibration import default_path, load_calibration
from ..model.cost import Workload
from ..model.planner import Decision, choose_plan
from ..model.profiles import get_profile, profile_names
from ..roles.autoplan import costs_of

__all__ = ["main", "parse_task_time"]


def _positive(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not v > 0 or not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{name} must be > 0, got {text!r}")
        return v

    return parse


def _procs(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--procs must be an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"--procs must be >= 1, got {v}")
    return v


def parse_task_time(text: str) -> tuple[float, float]:
    """``L:H`` (uniform, seconds) or ``T`` (constant): return ``(L, H)``.

    Raises:
        argparse.ArgumentTypeError: naming the value, unless ``0 < L <= H``.
    """
    parts = text.strip().split(":")
    try:
        lo = float(parts[0])
        hi = float(parts[-1])
    except ValueError:
        raise argparse.ArgumentTypeError(f"--task-time must be L:H or T in seconds, got {text!r}") from None
    if len(parts) > 2 or not (0 < lo <= hi) or not math.isfinite(hi):
        raise argparse.ArgumentTypeError(f"--task-time must be L:H with 0 < L <= H (or one T > 0), got {text!r}")
    return lo, hi


def _threshold(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--threshold must be a number in (0, 1), got {text!r}") from None
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"--threshold must be in (0, 1) (e.g. 0.1 for 10%), got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m nlevel.plan`` parser."""
    p = argparse.ArgumentParser(prog="python -m nlevel.plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=_procs, help="number of MPI processes")
    p.add_argument("--task-time", type=parse_task_time, help="task times: L:H uniform, or T, in seconds")
    p.add_argument("--tasks-per-proc", type=_procs, default=100, help="tasks per process (default 100)")
    p.add_argument("--service-time", type=_positive("--service-time"), help="seconds a server spends per message (1/mu)")
    p.add_argument("--msg-time", type=_positive("--msg-time"), help="one-way message time in seconds")
    p.add_argument("--atomic-time", type=_positive("--atomic-time"), help="seconds of one one-sided operation")
    p.add_argument("--atomic-service", type=_positive("--atomic-service"),
                   help="seconds one one-sided operation occupies the target's memory")
    p.add_argument("--network", metavar="NAME", help="message and one-sided times of a named network ("
                   + ", ".join(profile_names()) + "); explicit --msg-time etc. override it")
    p.add_argument("--threshold", type=_threshold, default=0.10, help="overhead threshold C (default 0.1)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--calibrate", action="store_true", help="measure service and message times here and store them")
    p.add_argument("-n", type=int, default=2, help="processes for --calibrate (default 2)")
    p.add_argument("--calibration", default=None, help=f"calibration file (default {default_path()})")
    return p


def _format(d: Decision, source: str) -> str:
    c = d.chosen
    classic = d.classic
    lines = [
        f"plan: {d.plan.levels} levels" + (f", regions per level {list(d.plan.regions)}" if d.plan.regions else "")
        + f", {c.chunk} id(s) per range",
        f"predicted overhead: {c.overhead:.2%} (threshold {d.threshold:.0%}); busiest server rho {c.busiest:.2f}",
        "classic 2-level: " + (f"{classic.overhead:.2%}" if classic is not None and math.isfinite(classic.overhead)
                               else "does not fit" if classic is None else "cannot keep up"),
        "per level (level: servers, slaves, region-masters below, claims/s, messages/s, rho cpu, rho memory, claim us):",
    ]
    for lv in c.levels:
        lines.append(f"  {lv.level}: {lv.servers}, {lv.slaves}, {lv.regions}, {lv.claims_per_s:,.0f}, "
                     f"{lv.reports_per_s:,.0f}, {lv.rho_cpu:.3f}, {lv.rho_memory:.3f}, {lv.claim_s * 1e6:.2f}")
    lines.append("makespan parts (s): " + ", ".join(f"{k} {v:.4g}" for k, v in c.parts.items()))
    lines.append(f"why: {d.reason}")
    lines.append(f"costs: {source}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for bad input)."""
    args = build_parser().parse_args(argv)
    if args.calibrate:
        # The measurement runs under MPI in a child process: this module itself stays MPI-free.
        cmd = [sys.executable, "-m", "nlevel.runtime.launch", "-n", str(args.n),
               sys.executable, "-m", "nlevel.runtime.calibrate"]
        if args.calibration:
            cmd += ["--out", args.calibration]
        return subprocess.call(cmd)
    if args.procs is None or args.task_time is None:
        print("nlevel.plan: error: --procs and --task-time are required (or --calibrate)", file=sys.stderr)
        return 2
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cal = load_calibration(args.calibration)
        for w in caught:
            print(f"nlevel.plan: warning: {w.message}", file=sys.stderr)
        base = Config()
        given = {k: getattr(args, k) for k in ("service_time", "msg_time", "atomic_time", "atomic_service")}
        measured = {k: getattr(cal, k, None) for k in given} if cal else {}
        net: dict[str, float | None] = {}
        if args.network is not None:
            prof = get_profile(args.network)
            net = {"msg_time": prof.msg_time, "atomic_time": prof.atomic_time, "atomic_service": prof.atomic_service}
        values = {k: given[k] or net.get(k) or measured.get(k) or getattr(base, k) for k in given}
        source = ", ".join(f"{k.replace('_', ' ')} {v * 1e6:.3g} us ("
                           + ("given" if given[k] else f"network {args.network}" if net.get(k)
                              else "calibration" if measured.get(k) else "default") + ")"
                           for k, v in values.items())
        costs = costs_of(replace(base, service_time=values["service_time"], msg_time=values["msg_time"],
                                 atomic_time=values["atomic_time"], atomic_service=values["atomic_service"]))
        lo, hi = args.task_time
        work = Workload.uniform(args.procs, lo, hi, args.procs * args.tasks_per_proc)
        d = choose_plan(work, costs, args.threshold)
    except NlevelError as exc:
        print(f"nlevel.plan: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = d.to_dict()
        out["times_source"] = source
        print(json.dumps(out, indent=2, default=lambda x: None if isinstance(x, float) and not math.isfinite(x) else x))
    else:
        print(_format(d, source))
    return 0

