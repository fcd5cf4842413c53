"""Request latency of a server thread that shares its rank with a computing main thread.

What it measures
----------------
Rank 0 runs a *server thread* that answers requests on a ``comm.Dup()``: a pickle
``comm.improbe`` + ``msg.recv()`` loop that backs off when idle (16 empty probes with no
sleep, then ``time.sleep`` doubling from 1 us up to a *ceiling*, reset on any message;
ceiling 0 means ``time.sleep(0)``, meant as a pure yield) and replies with ``comm.isend``.
Meanwhile rank 0's *main thread* runs a task. Rank 1 is a client: it sends a request,
waits for the reply, records the round-trip time, sleeps ``--gap`` (default 0.5 ms, a
slave arriving) and repeats.

The grid varies
  * the main thread's task: ``python`` (pure-Python loop, holds the GIL), ``numpy``
    (matmul + ufunc, mostly releases the GIL), ``sleep`` (``time.sleep``, releases it),
    ``none`` (the rank only serves);
  * ``sys.setswitchinterval`` in {5e-3 (Python's default), 1e-3, 1e-4, 1e-5} s;
  * the idle backoff ceiling in {0, 1e-5, 1e-4, 1e-3} s;
  * the server thread's Linux timer slack (``--slack-ns``, default ``os,1``): ``os`` keeps
    the kernel default (50 us for normal threads), ``1`` sets 1 ns with
    ``prctl(PR_SET_TIMERSLACK)`` on the server thread only. With the default slack every
    ``time.sleep`` -- even ``time.sleep(0)`` -- and every timed wait for the GIL lasts at
    least ~55 us, so ceilings and switch intervals below that are illusions.

For each cell it prints the median / p90 / p99 round trip in us, the main thread's
throughput loss (a fixed chunk of work, ~2 ms, run alone for 0.1 s just before the cell
and then under the server thread: ``loss = 1 - rate_with_server / rate_alone``; the alone
rate of CPU-bound chunks is taken on the thread's CPU clock, so other processes cannot
fake a slow baseline, while the rate under the server is wall-clock: on a busy machine
the loss can read high, never falsely low) and rank 0's CPU use in cores (process CPU
time / wall time; ~1.0 means the server thread spins or the task keeps the core busy).
Two reference rows come first: the raw round trip with no threads (rank 0 serves in its
main thread with a blocking ``recv``), with the same gap and back to back. That is the
physical limit for a pickle request/reply.

How to run (exactly 2 ranks; the default grid of 128 cells takes ~2 min)::

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \\
        timeout 300 mpiexec -n 2 python bench/gil_latency.py [--requests N] [--json FILE]

Each cell ends after ``--requests`` round trips or ``--seconds`` s, whichever comes first
(with a 5 ms switch interval and a pure-Python main thread a round trip takes several ms,
so the time cap decides). On an oversubscribed node add ``--oversubscribe --mca
mpi_yield_when_idle 1``, or the timings are meaningless. Open MPI binds each rank to one
core by default (np <= 2), so the server thread and the main thread share a core: that
is what a computing master gets unless it is given more cores (``--map-by slot:PE=2``);
the header line prints rank 0's CPU affinity.
"""

from __future__ import annotations

import argparse
import ctypes
import enum
import json
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# One BLAS thread: the numpy task must not steal the client's core.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

KINDS = ("python", "numpy", "sleep", "none")
SWITCH_INTERVALS = (5e-3, 1e-3, 1e-4, 1e-5)
CEILINGS = (0.0, 1e-5, 1e-4, 1e-3)
CHUNK_SECONDS = 2e-3  # one unit of main-thread work
WARMUP = 10  # round trips discarded at the start of each cell
BASELINE_SECONDS = 0.1  # main thread alone, just before each cell
PR_SET_TIMERSLACK, PR_GET_TIMERSLACK = 29, 30  # linux/prctl.h


class Tag(enum.IntEnum):
    REQUEST = 1
    REPLY = 2
    STOP = 3
    CELL = 4  # rank 0 -> client: start a cell (keeps both ranks in step)
    RESULT = 5  # client -> rank 0: the latencies of a cell


class Backoff:
    """Idle backoff: ``spins`` free polls, then sleeps doubling from ``start`` to ``ceiling``."""

    def __init__(self, ceiling: float, spins: int = 16, start: float = 1e-6) -> None:
        self.ceiling, self.spins, self.start = ceiling, spins, start
        self.reset()

    def reset(self) -> None:
        self.misses, self.delay = 0, self.start

    def wait(self) -> None:
        self.misses += 1
        if self.misses <= self.spins:
            return
        if self.ceiling <= 0.0:
            time.sleep(0)
            return
        time.sleep(min(self.delay, self.ceiling))
        self.delay = min(self.delay * 2.0, self.ceiling)


def _prctl(option: int, arg: int) -> int:
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0))
    except (OSError, AttributeError):  # not Linux
        return -1


def set_timer_slack(ns: int | None) -> None:
    """Set the calling thread's timer slack in ns (Linux only); None keeps the OS default."""
    if ns is not None:
        _prctl(PR_SET_TIMERSLACK, ns)


def serve(comm: MPI.Comm, ceiling: float, slack_ns: int | None,
          stop: threading.Event) -> None:
    """Answer REQUEST messages with a REPLY carrying the same object until STOP arrives."""
    set_timer_slack(slack_ns)
    backoff, status, pending = Backoff(ceiling), MPI.Status(), []
    while True:
        msg = comm.improbe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
        if msg is None:
            backoff.wait()
            continue
        backoff.reset()
        data = msg.recv()
        if status.Get_tag() == Tag.STOP:
            break
        pending.append(comm.isend(data, dest=status.Get_source(), tag=Tag.REPLY))
        if len(pending) >= 64:
            MPI.Request.waitall(pending)
            pending.clear()
    MPI.Request.waitall(pending)
    stop.set()


# ---------------------------------------------------------------- main-thread tasks


def _py_unit(n: int = 2000) -> int:
    s = 0
    for i in range(n):
        s += i * i
    return s


_A = np.random.default_rng(0).random((128, 128))
_B, _C = _A.copy(), np.empty_like(_A)
_X = np.random.default_rng(1).random(50_000)
_Y = np.empty_like(_X)


def _np_unit() -> None:
    np.matmul(_A, _B, out=_C)
    np.exp(_X, out=_Y)


def _sleep_unit() -> None:
    time.sleep(CHUNK_SECONDS)


def make_chunk(kind: str) -> Callable[[], None]:
    """Return a function doing a fixed amount of work of ~CHUNK_SECONDS for ``kind``."""
    if kind == "sleep":
        return _sleep_unit
    unit: Callable[[], Any] = _py_unit if kind == "python" else _np_unit
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.05:
        unit()
        n += 1
    reps = max(1, round(CHUNK_SECONDS * n / (time.perf_counter() - t0)))

    def chunk() -> None:
        for _ in range(reps):
            unit()

    return chunk


def work_until(chunk: Callable[[], None], stop: threading.Event) -> tuple[int, float]:
    """Run chunks until ``stop`` is set; return (chunks done, seconds)."""
    t0, n = time.perf_counter(), 0
    while not stop.is_set():
        chunk()
        n += 1
    return n, time.perf_counter() - t0


def alone_rate(chunk: Callable[[], None], cpu_bound: bool) -> float:
    """Chunks per second with the main thread alone.

    For a CPU-bound chunk the rate is taken on the thread's CPU clock: on a shared machine
    another process preempting rank 0 during this short window would otherwise pass for a
    slow baseline (and a negative loss)."""
    clock = time.thread_time if cpu_bound else time.perf_counter
    w0, c0, n = time.perf_counter(), clock(), 0
    while time.perf_counter() - w0 < BASELINE_SECONDS:
        chunk()
        n += 1
    return n / (clock() - c0)


# ---------------------------------------------------------------- the two roles


def client(comm: MPI.Comm, requests: int, seconds: float, gap: float) -> list[float]:
    """Send round trips to rank 0; return latencies in us (warm-up removed)."""
    lat: list[float] = []
    time.sleep(0.02)  # let rank 0's task get going
    t_end = time.perf_counter() + seconds
    for i in range(requests + WARMUP):
        t0 = time.perf_counter()
        comm.send(i, dest=0, tag=Tag.REQUEST)
        comm.recv(source=0, tag=Tag.REPLY)
        lat.append((time.perf_counter() - t0) * 1e6)
        if time.perf_counter() > t_end:
            break
        if gap > 0:
            time.sleep(gap)
    comm.send(None, dest=0, tag=Tag.STOP)
    return lat[WARMUP:]


def client_main(comm: MPI.Comm, requests: int, seconds: float) -> None:
    """Rank 1: for each CELL order from rank 0, run the client and send back the latencies."""
    while True:
        # Sleep-poll rather than block: a blocking recv spins a core while rank 0 times
        # its task alone.
        while not comm.iprobe(source=0, tag=Tag.CELL):
            time.sleep(1e-3)
        gap = comm.recv(source=0, tag=Tag.CELL)
        if gap is None:
            return
        comm.send(client(comm, requests, seconds, gap), dest=0, tag=Tag.RESULT)


def raw_server(comm: MPI.Comm) -> None:
    """Rank 0 serving in its main thread with a blocking recv: the no-thread limit."""
    status = MPI.Status()
    while True:
        data = comm.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
        if status.Get_tag() == Tag.STOP:
            return
        comm.send(data, dest=status.Get_source(), tag=Tag.REPLY)


def summary(lat: list[float]) -> dict[str, Any]:
    """Percentiles of round-trip latencies in us."""
    a = np.asarray(lat) if lat else np.asarray([np.nan])
    q = [float(v) for v in np.percentile(a, [50, 90, 99, 100])]
    return {"n": len(lat), "p50_us": q[0], "p90_us": q[1], "p99_us": q[2],
            "max_us": q[3], "mean_us": float(a.mean())}


def threaded_cell(comm: MPI.Comm, gap: float, si: float, ceiling: float, slack_ns: int | None,
                  chunk: Callable[[], None] | None, cpu_bound: bool) -> dict[str, Any]:
    """Rank 0 side of one cell: server thread plus main-thread task."""
    alone = alone_rate(chunk, cpu_bound) if chunk is not None else None
    comm.send(gap, dest=1, tag=Tag.CELL)
    sys.setswitchinterval(si)
    stop = threading.Event()
    server = threading.Thread(target=serve, args=(comm, ceiling, slack_ns, stop), daemon=True)
    cpu0, t0 = time.process_time(), time.perf_counter()
    server.start()
    if chunk is None:
        stop.wait()
        chunks, busy = 0, 0.0
    else:
        chunks, busy = work_until(chunk, stop)
    server.join()
    wall = time.perf_counter() - t0
    cpu = (time.process_time() - cpu0) / wall
    sys.setswitchinterval(5e-3)
    res: dict[str, Any] = summary(comm.recv(source=1, tag=Tag.RESULT))
    res.update(chunks=chunks, busy_s=busy, wall_s=wall, cpu_cores=cpu, alone_per_s=alone)
    # Throughput loss of the main thread against the same chunks run alone just before.
    res["loss"] = None if alone is None or chunks == 0 else 1.0 - chunks / busy / alone
    return res


def parse_slack(text: str) -> list[int | None]:
    out: list[int | None] = []
    for item in text.split(","):
        if item == "os":
            out.append(None)
        elif item.isdigit() and int(item) > 0:
            out.append(int(item))
        else:
            raise SystemExit(f"--slack-ns items must be 'os' or a positive integer, got {item!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=1200, help="round trips per cell (max)")
    p.add_argument("--seconds", type=float, default=0.8, help="time cap per cell, s")
    p.add_argument("--gap", type=float, default=5e-4, help="client sleep between requests, s")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma list of task kinds")
    p.add_argument("--slack-ns", default="os,1",
                   help="server-thread timer slacks: comma list of 'os' or ns")
    p.add_argument("--json", metavar="FILE", help="write all cells to FILE")
    args = p.parse_args(argv)
    world = MPI.COMM_WORLD
    if world.Get_size() != 2:
        raise SystemExit(f"gil_latency needs exactly 2 ranks, got {world.Get_size()}")
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            raise SystemExit(f"unknown task kind {k!r}; expected one of {KINDS}")
    slacks = parse_slack(args.slack_ns)
    comm, rank = world.Dup(), world.Get_rank()
    if rank == 1:
        client_main(comm, args.requests, args.seconds)
        comm.Free()
        return 0

    if any(ns is not None for ns in slacks) and _prctl(PR_GET_TIMERSLACK, 0) < 0:
        raise SystemExit("--slack-ns needs Linux prctl(PR_SET_TIMERSLACK); use --slack-ns os")
    meta: dict[str, Any] = {
        "mpi": MPI.Get_library_version().split("\n")[0].strip("\0 "),
        "thread_level": MPI.Query_thread(), "python": sys.version.split()[0],
        "host": platform.node(), "cpus": os.cpu_count(), "args": vars(args),
        "chunk_s": CHUNK_SECONDS, "rank0_cpus": sorted(os.sched_getaffinity(0))}
    print(f"# {meta['mpi'].split(',')[0]}; Python {meta['python']}; {meta['cpus']} cpus, "
          f"rank 0 may run on {meta['rank0_cpus']}; thread level {meta['thread_level']} "
          f"(3 = MULTIPLE); gap {args.gap * 1e6:.0f} us", flush=True)
    raw = {}
    for name, gap in (("raw_gap", args.gap), ("raw_back_to_back", 0.0)):
        comm.send(gap, dest=1, tag=Tag.CELL)
        raw_server(comm)
        raw[name] = r = summary(comm.recv(source=1, tag=Tag.RESULT))
        print(f"# {name:17s} no threads, blocking recv: p50 {r['p50_us']:.1f}  "
              f"p90 {r['p90_us']:.1f}  p99 {r['p99_us']:.1f} us  (n={r['n']})", flush=True)

    chunks = {k: make_chunk(k) for k in kinds if k != "none"}
    print(f"{'task':7s} {'slack':>5s} {'switch_s':>8s} {'ceil_s':>7s} {'n':>5s} {'p50_us':>8s} "
          f"{'p90_us':>8s} {'p99_us':>8s} {'loss_%':>7s} {'cpu':>5s}", flush=True)
    cells = []
    for kind in kinds:
        for slack in slacks:
            for si in SWITCH_INTERVALS:
                for ceiling in CEILINGS:
                    res = threaded_cell(comm, args.gap, si, ceiling, slack, chunks.get(kind),
                                        cpu_bound=kind in ("python", "numpy"))
                    res.update(task=kind, timer_slack_ns=slack, switch_interval_s=si,
                               ceiling_s=ceiling)
                    cells.append(res)
                    loss = "-" if res["loss"] is None else f"{100 * res['loss']:.1f}"
                    print(f"{kind:7s} {slack or 'os':>5} {si:8.0e} {ceiling:7.0e} "
                          f"{res['n']:5d} {res['p50_us']:8.1f} {res['p90_us']:8.1f} "
                          f"{res['p99_us']:8.1f} {loss:>7s} {res['cpu_cores']:5.2f}", flush=True)
    comm.send(None, dest=1, tag=Tag.CELL)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "raw": raw, "cells": cells}, f, indent=1)
        print(f"# wrote {args.json}")
    comm.Free()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
