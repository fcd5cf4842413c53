"""``python -m nlevel.plan --calibrate``: measure the four costs the model needs, here (entry point, MPI).

Run under mpiexec with 2+ processes (``--calibrate`` launches it for you). Medians of
``--samples`` repetitions each:

* **message time**: rank 1 sends a :class:`~nlevel.roles.messages.Report` to rank 0 over
  nlevel's own transport, rank 0 answers at once; T_msg = round trip / 2.
* **service time**: what a server spends on one report: its receive and decode (timed
  on rank 0 while rank 1 sends a burst) plus the real roles' handling of a report
  (:mod:`nlevel.sim.service`: a farm of 64 ranks in one process, the master's handling of
  each report timed). μ = 1 / S is what one server sustains.
* **one-sided operation**: rank 1's ``Fetch_and_op`` + ``Flush`` on rank 0's word of a
  window allocated and locked as the farm's boards are: the origin's round trip.
* **its cost at the target**: the same operation on a word of the caller's own window
  memory: how long one operation occupies the target (operations on one board queue).

The result goes to :func:`nlevel.model.calibration.default_path` (or ``--out``), where
``python -m nlevel.plan``, ``python -m nlevel.sim`` and a ``--levels auto`` job find it (the job
takes the costs it was not given from it, :mod:`nlevel.runtime.costs`, then measures its own
service time).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import statistics
import subprocess
import sys
import time

import numpy as np
from mpi4py import MPI

from ..model.calibration import Calibration, machine_identity, save_calibration
from ..roles.messages import Ack, Report
from .transport import Transport

__all__ = ["main"]


def handling_time(reports: int) -> float:
    """The roles' handling of one report, timed in a child process (:mod:`nlevel.sim.service`: MPI-free)."""
    out = subprocess.run([sys.executable, "-m", "nlevel.sim.service", str(reports)], capture_output=True, text=True,
                         timeout=600, check=True)
    return float(out.stdout.strip())


def _wait(t: Transport) -> tuple[int, object]:
    while True:
        got = t.poll()
        if got is not None and isinstance(got, tuple):
            return got


def main(argv: list[str] | None = None) -> int:
    """Measure and store; returns 0 (rank 0 prints the figures)."""
    p = argparse.ArgumentParser(prog="python -m nlevel.runtime.calibrate")
    p.add_argument("--out", default=None, help="where to store the calibration")
    p.add_argument("--samples", type=int, default=2000, help="repetitions of each measurement (default 2000)")
    args = p.parse_args(argv)
    world = MPI.COMM_WORLD
    if world.Get_size() < 2:
        print("nlevel.runtime.calibrate: error: needs at least 2 processes, got 1", file=sys.stderr)
        return 2
    if args.samples < 10:
        print(f"nlevel.runtime.calibrate: error: --samples must be >= 10, got {args.samples}", file=sys.stderr)
        return 2
    t = Transport(world)
    n = args.samples
    clock = time.perf_counter
    report = Report(done=((0, 8),), tasks=8, busy=0.02, busy_sq=5e-5, task_max=3e-3)
    # 1. Round trips (rank 0 answers at once; it may spin: this measures the wire, not a back-off).
    rtts: list[float] = []
    if t.rank == 0:
        for _ in range(n):
            src, _msg = _wait(t)
            t.send(src, Ack(0))
    elif t.rank == 1:
        for _ in range(n):
            t0 = clock()
            t.send(0, report)
            _wait(t)
            rtts.append(clock() - t0)
    t.comm.Barrier()
    # 2. Receive + decode under a burst, on rank 0.
    receive: list[float] = []
    if t.rank == 0:
        got = 0
        while got < n:
            t0 = clock()
            msg = t.poll()
            if msg is None:
                continue
            receive.append(clock() - t0)
            got += 1
    elif t.rank == 1:
        for _ in range(n):
            t.send(0, report)
        t.flush()
    t.comm.Barrier()
    # 3. One-sided operations on a window like the boards'.
    win = MPI.Win.Allocate(8 * 16, 8, MPI.INFO_NULL, world)
    win.Lock_all()
    one, res = np.ones(1, np.int64), np.zeros(1, np.int64)
    # Rank 1 on rank 0's word: the origin's round trip; rank 0 on its own word: the target's share.
    times: list[float] = []
    if t.rank in (0, 1):
        word = 1 - t.rank
        for _ in range(n):
            t0 = clock()
            win.Fetch_and_op(one, res, 0, word, MPI.SUM)
            win.Flush(0)
            times.append(clock() - t0)
    remote, local = (times, []) if t.rank == 1 else ([], times)
    win.Unlock_all()
    win.Free()
    t.comm.Barrier()
    rtt = t.comm.bcast(statistics.median(rtts) if t.rank == 1 else None, root=1)
    atomic = t.comm.bcast(statistics.median(remote) if t.rank == 1 else None, root=1)
    if t.rank == 0:
        handle = handling_time(n)
        recv = statistics.median(receive)
        service = recv + handle
        at_target = statistics.median(local)
        cal = Calibration(
            service_time=service,
            msg_time=rtt / 2,
            identity=machine_identity(MPI.Get_library_version()),
            measured=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            details={"samples": n, "median_round_trip_s": rtt, "receive_s": recv, "handle_s": handle,
                     "processes": t.size},
            atomic_time=atomic,
            atomic_service=at_target,
        )
        path = save_calibration(cal, args.out)
        print(
            f"nlevel calibration: service {service * 1e6:.1f} us per report (receive {recv * 1e6:.1f} + handle "
            f"{handle * 1e6:.1f}; mu = {1 / service:,.0f}/s), message {rtt / 2 * 1e6:.1f} us one way, one-sided "
            f"operation {atomic * 1e6:.2f} us ({at_target * 1e6:.2f} us at the target); stored in {path}"
        )
    t.close()
    return 0


if __name__ == "__main__":
    from .launch import record_exit

    _code = main()
    record_exit(_code)  # (under nlevel-mpiexec --with-ft: it ended, it did not die)
    sys.exit(_code)
