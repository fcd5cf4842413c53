"""A user's zero-work loop that records its rank's memory: after the first call, and the peak at the end.

Besides the resident set (``VmRSS``) and its peak (``VmHWM``), the parts of the resident set
at both moments (``/proc/self/status``): ``RssAnon`` (the heap: what grows if state grows with
the job), ``RssFile`` (pages of files mapped: the code of libraries, HDF5's on the first
checkpoint write) and ``RssShmem`` (shared memory: the peers' segments of MPI's shared-memory
transport and of the window, touched as they are used).

``python bounded_loop.py TOTAL CHECKPOINT OUTDIR`` (under mpiexec): writes ``OUTDIR/mem-<rank>.json``, and
rank 0 the report to ``OUTDIR/report.json``.
"""

import json
import os
import sys

from mpi4py import MPI

from nlevel import api, get_task_id


PARTS = ("RssAnon", "RssFile", "RssShmem")


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # (kB -> MB)
    return float("nan")


def parts():
    return {name: round(status(name), 1) for name in PARTS}


total, checkpoint, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
rank = MPI.COMM_WORLD.Get_rank()
start = None
start_parts = None
n = 0
while (task_id := get_task_id(total, checkpoint)) >= 0:
    if start is None:
        start, start_parts = status("VmRSS"), parts()
    n += 1
peak = status("VmHWM")
with open(os.path.join(out, f"mem-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "start_mb": round(start or peak, 1), "peak_mb": round(peak, 1), "tasks": n,
               "start_parts_mb": start_parts, "end_parts_mb": parts()}, f)
if api.last_report is not None:
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(api.last_report, f, default=str)
