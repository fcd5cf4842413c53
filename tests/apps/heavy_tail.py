"""A user's own loop (the README's) with a heavy tail: tasks of 50 ms, a few far longer than a lease.

``python heavy_tail.py TOTAL CHECKPOINT REPORT ID:SECONDS...``. Rank 0 writes the farm's report
(``nlevel.api.last_report``) to ``REPORT`` after the loop. Every task's start is logged per rank
in ``$NLEVEL_TEST_LOG_DIR`` (``exec-<pid>``), so a test sees which ids ran twice.
"""

import json
import os
import sys
import time

from nlevel import api, get_task_id

total, checkpoint, report = int(sys.argv[1]), sys.argv[2], sys.argv[3]
long = {int(a): float(b) for a, b in (x.split(":") for x in sys.argv[4:])}
log = os.environ.get("NLEVEL_TEST_LOG_DIR")
out = open(os.path.join(log, f"exec-{os.getpid()}"), "a") if log else None
while (task_id := get_task_id(total, checkpoint)) >= 0:
    if out is not None:
        out.write(f"{task_id}\n")
        out.flush()
    time.sleep(long.get(task_id, 0.05))
if api.last_report is not None:
    with open(report, "w") as f:
        json.dump(api.last_report, f)
