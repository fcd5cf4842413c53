"""How long the real roles take to handle one report: the CPU part of a server's service time.

A classic farm of ``size`` ranks runs in this process under the simulator's engine (the
same Station and Loop a job runs); the master's handling of each report is timed with
the wall clock. ``python -m nlevel.sim.service`` prints the median in seconds (what
``python -m nlevel.plan --calibrate`` adds to the measured receive time). Pure Python.
"""

from __future__ import annotations

import statistics
import sys
import time

from ..config import Config
from ..model.hierarchy import build
from ..model.plan import Plan
from ..roles.events import Event, Received
from ..roles.messages import Report
from .engine import SimCosts, Engine

__all__ = ["handling_time", "main"]


def handling_time(reports: int = 2000, size: int = 64) -> float:
    """Median seconds the master spends on one report, over about ``reports`` of them."""
    if reports < 1 or size < 2:
        raise ValueError(f"reports and size must be >= 1 and >= 2, got {reports} and {size}")
    plan = Plan(chunk=1)
    config = Config(levels=2, chunk=1, lease=1e9, report_age=1e-4)  # (one report per task)
    durations = [1e-3] * (reports + size)
    engine = Engine(build(size, plan), config, durations, SimCosts(msg_time=1e-6, service_time=1e-6))
    loop = engine.loops[0]
    inner = loop.handle
    times: list[float] = []
    clock = time.perf_counter

    def timed(event: Event) -> None:
        if isinstance(event, Received) and isinstance(event.msg, Report):
            t0 = clock()
            inner(event)
            times.append(clock() - t0)
        else:
            inner(event)

    loop.handle = timed  # type: ignore[method-assign]
    engine.run()
    if not times:
        raise RuntimeError("the master handled no report (an nlevel bug)")
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Print the median handling time of one report, in seconds."""
    args = sys.argv[1:] if argv is None else argv
    print(f"{handling_time(int(args[0]) if args else 2000):.9g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
