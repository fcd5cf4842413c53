"""``python -m nlevel.plan --calibrate``: measure this machine's service and message times (entry point, MPI).

Run under mpiexec with 2+ processes (``--calibrate`` launches it for you):

* message time: rank 1 sends ``Report`` / receives ``Grant`` round trips to a rank 0
  that answers at once, over nlevel's own transport; T_msg = median round trip / 2.
* service time: rank 1 fires a burst of requests without waiting; rank 0 answers
  them with the real :class:`~nlevel.roles.dispatch.Master` (receive, handle, send).
  S = busy time / requests, so μ = 1/S is what a master sustains.

The result goes to :func:`nlevel.model.calibration.default_path` (or ``--out``), where
``python -m nlevel.plan`` and ``python -m nlevel.sim`` find it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import statistics
import sys
import time

from mpi4py import MPI

from ..config import Config
from ..model.calibration import Calibration, machine_identity, save_calibration
from ..model.hierarchy import build
from ..model.plan import Plan
from ..roles.ledger import Ledger
from ..roles.messages import Grant, Report
from ..roles.station import Station
from .transport import Transport

__all__ = ["main"]


def _serve(t: Transport, n: int) -> float:
    """Rank 0: answer ``n`` requests with a real Master; return the busy seconds."""
    h = build(t.size, Plan(serve_only="master"))
    st = Station(h, 0, Config(), time.perf_counter, Ledger(10**12))
    busy = 0.0
    served = 0
    while served < n:
        t0 = time.perf_counter()
        got = t.poll()
        if got is None:
            continue  # a calibration may spin: it measures the server at full speed
        for out in st.deliver(*got):
            t.send(out.dest, out.msg)
        busy += time.perf_counter() - t0
        served += 1
    return busy


def main(argv: list[str] | None = None) -> int:
    """Measure and store; returns 0 (rank 0 prints the figures)."""
    p = argparse.ArgumentParser(prog="python -m nlevel.runtime.calibrate")
    p.add_argument("--out", default=None, help="where to store the calibration")
    p.add_argument("--requests", type=int, default=4000)
    args = p.parse_args(argv)
    world = MPI.COMM_WORLD
    if world.Get_size() < 2:
        print("nlevel.runtime.calibrate: error: needs at least 2 processes, got 1", file=sys.stderr)
        return 2
    t = Transport(world)
    n = args.requests
    rtts: list[float] = []
    busy = 0.0
    # Phase 1: round trips (rank 0 answers immediately).
    if t.rank == 0:
        _serve(t, n)
    elif t.rank == 1:
        for _ in range(n):
            t0 = time.perf_counter()
            t.send(0, Report(want=1))
            t.wait_grant(0)
            rtts.append(time.perf_counter() - t0)
    t.comm.Barrier()
    # Phase 2: a burst (rank 0 busy all the time) to measure the service time.
    if t.rank == 0:
        busy = _serve(t, n)
    elif t.rank == 1:
        for _ in range(n):
            t.send(0, Report(want=1))
        got = 0
        while got < n:
            g = t.wait_grant(0)
            assert isinstance(g, Grant)
            got += 1
    t.comm.Barrier()
    rtt = t.comm.bcast(statistics.median(rtts) if t.rank == 1 else None, root=1)
    if t.rank == 0:
        service = busy / n
        cal = Calibration(
            service_time=service,
            msg_time=rtt / 2,
            identity=machine_identity(MPI.Get_library_version()),
            measured=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            details={"requests": n, "median_round_trip_s": rtt, "processes": t.size},
        )
        path = save_calibration(cal, args.out)
        print(
            f"nlevel calibration: service {service * 1e6:.1f} us per request (mu = {1 / service:,.0f}/s), "
            f"message {rtt / 2 * 1e6:.1f} us one way; stored in {path}"
        )
    t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
