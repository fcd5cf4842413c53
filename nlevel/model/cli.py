"""``python -m nlevel.plan``: the plan the model chooses, before spending an allocation.

    python -m nlevel.plan --procs 32768 --task-time 3.4 [--task-time-spread 1.5]
        [--service-time S] [--msg-time T] [--threshold 0.1] [--json]
    python -m nlevel.plan --calibrate [-n 2]

Service and message times default to the stored calibration (``--calibrate``
measures them on this machine with a short mpiexec run), else to the figures in
:data:`DEFAULT_SERVICE_TIME` / :data:`DEFAULT_MSG_TIME` (say so in the output).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import warnings
from typing import Callable, Sequence

from ..errors import NlevelError
from .calibration import default_path, load_calibration
from .queueing import Decision, choose_plan

__all__ = ["main", "DEFAULT_SERVICE_TIME", "DEFAULT_MSG_TIME"]

#: Used when nothing is calibrated: measured here (README, Performance) for a Python master.
DEFAULT_SERVICE_TIME = 5e-5
DEFAULT_MSG_TIME = 1e-4


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
    p.add_argument("--task-time", type=_positive("--task-time"), help="mean task time in seconds")
    p.add_argument("--task-time-spread", type=float, default=0.0, help="spread of task times in seconds (informational)")
    p.add_argument("--service-time", type=_positive("--service-time"), help="seconds a server spends per request (1/mu)")
    p.add_argument("--msg-time", type=_positive("--msg-time"), help="one-way message time in seconds")
    p.add_argument("--threshold", type=_threshold, default=0.10, help="overhead threshold C (default 0.1)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--calibrate", action="store_true", help="measure service and message times here and store them")
    p.add_argument("-n", type=int, default=2, help="processes for --calibrate (default 2)")
    p.add_argument("--calibration", default=None, help=f"calibration file (default {default_path()})")
    return p


def _format(d: Decision, source: str) -> str:
    lines = [
        f"plan: {d.plan.levels} levels"
        + (f", regions per level {list(d.plan.regions)}" if d.plan.regions else "")
        + f", prefetch {d.plan.prefetch:g}",
        f"predicted overhead: {d.chosen.overhead:.2%} (threshold {d.threshold:.0%})",
        "classic 2-level: "
        + (f"{d.classic.overhead:.2%}" if d.classic.steady else f"no steady state (rho = {d.classic.overhead:.2f} > 1)"),
        "per level (level: servers, children each, lambda/s, rho, T_wait ms, overhead):",
    ]
    for lv in d.chosen.levels:
        lines.append(
            f"  {lv.level}: {lv.servers}, {lv.children}, {lv.arrival_rate:,.0f}, {lv.rho:.3f}, "
            f"{lv.t_wait * 1e3 if math.isfinite(lv.t_wait) else float('inf'):.3f}, {lv.overhead:.2%}"
        )
    lines.append(f"why: {d.reason}")
    lines.append(f"times: {source}")
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
        service = args.service_time or (cal.service_time if cal else DEFAULT_SERVICE_TIME)
        msg = args.msg_time or (cal.msg_time if cal else DEFAULT_MSG_TIME)
        source = (
            "given" if args.service_time and args.msg_time
            else f"calibration {args.calibration or default_path()}" if cal
            else "built-in defaults (run --calibrate to measure this machine)"
        )
        d = choose_plan(args.procs, args.task_time, service, msg, args.threshold, args.task_time_spread)
    except NlevelError as exc:
        print(f"nlevel.plan: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = d.to_dict()
        out["times_source"] = source
        print(json.dumps(out, indent=2, default=lambda x: None if isinstance(x, float) and not math.isfinite(x) else x))
    else:
        print(_format(d, f"service {service * 1e6:.1f} us, message {msg * 1e6:.1f} us ({source})"))
    return 0

