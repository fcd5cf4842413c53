"""A user's zero-work loop that records its rank's memory: after the first call, and the peak at the end.

``python bounded_loop.py TOTAL CHECKPOINT OUTDIR`` (under mpiexec): writes ``OUTDIR/mem-<rank>.json``, and
rank 0 the report to ``OUTDIR/report.json``.
"""

import json
import os
import sys

from mpi4py import MPI

from nlevel import api, get_task_id


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # (kB -> MB)
    return float("nan")


total, checkpoint, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
rank = MPI.COMM_WORLD.Get_rank()
start = None
n = 0
while (task_id := get_task_id(total, checkpoint)) >= 0:
    if start is None:
        start = status("VmRSS")
    n += 1
peak = status("VmHWM")
with open(os.path.join(out, f"mem-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "start_mb": round(start or peak, 1), "peak_mb": round(peak, 1), "tasks": n}, f)
if api.last_report is not None:
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(api.last_report, f, default=str)
