"""A loop script (the README's) whose rank ``EARLY_RANK`` dies or stops *before* MPI_Init, the first time only.

Run under ``nlevel-mpiexec --with-ft ulfm``: ``EARLY_HOW`` is ``KILL`` or ``STOP``; the
first time is remembered in ``$NLEVEL_TEST_LOG_DIR/early``, so the launcher's second start
runs through. Every execution is logged per rank as in logging_app (``exec-R.log``).
"""

import os
import signal
import sys
import time

import nlevel  # noqa: F401 (before MPI: this rank is an nlevel process)

LOG_DIR = os.environ["NLEVEL_TEST_LOG_DIR"]
RANK = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
marker = os.path.join(LOG_DIR, "early")
if RANK == os.environ.get("EARLY_RANK", "1") and not os.path.exists(marker):
    open(marker, "w").close()
    os.kill(os.getpid(), getattr(signal, "SIG" + os.environ.get("EARLY_HOW", "KILL")))

from nlevel import get_task_id  # noqa: E402

total, checkpoint = int(sys.argv[1]), sys.argv[2]
with open(os.path.join(LOG_DIR, f"exec-{RANK}.log"), "a") as log:
    while (task_id := get_task_id(total, checkpoint)) >= 0:
        log.write(f"{task_id}\n")
        time.sleep(0.002)
