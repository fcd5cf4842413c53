"""A loop script (the README's) whose rank ``RAISE_RANK`` meets an exception *inside* ``get_task_id``.

The exception is injected into the call that asks the farm for ids (``Farm.next``), at that
rank's ``RAISE_AT``-th such call: the README promises that any exception raised in there (a bug,
an MPI error, an interrupt) ends the job, or under ULFM that process alone, instead of leaving the
other ranks waiting. Every execution is logged per rank in ``$NLEVEL_TEST_LOG_DIR/exec-R.log``.
"""

import os
import sys
import time

from mpi4py import MPI

import nlevel
from nlevel import api

RANK = MPI.COMM_WORLD.Get_rank()
LOG_DIR = os.environ["NLEVEL_TEST_LOG_DIR"]

if RANK == int(os.environ.get("RAISE_RANK", "1")):
    inner = api.Farm.next
    calls = 0

    def next_or_raise(self):
        global calls
        calls += 1
        if calls == int(os.environ.get("RAISE_AT", "3")):
            raise RuntimeError("injected inside get_task_id")
        return inner(self)

    api.Farm.next = next_or_raise

total, checkpoint = int(sys.argv[1]), sys.argv[2]
with open(os.path.join(LOG_DIR, f"exec-{RANK}.log"), "a") as log:
    while (task_id := nlevel.get_task_id(total, checkpoint)) >= 0:
        log.write(f"{task_id}\n")
        log.flush()
        time.sleep(0.002)
