"""A get_task_id loop whose master takes a second over its report (tests/e2e/test_end.py).

    slow_report_script.py CHECKPOINT|-

Every rank prints ``RETURNED rank R at T`` when its loop ends (T: unix seconds); the master
prints ``REPORTED at T`` once its report is built (without a checkpoint: when the script reads
it, after its loop).
"""

import sys
import time

from mpi4py import MPI

import nlevel
from nlevel.runtime import farm

rank = MPI.COMM_WORLD.Get_rank()
checkpoint = None if sys.argv[1] == "-" else sys.argv[1]
if rank == 0:
    build = farm.FarmRuntime._report

    def slow(self, *args, **kwargs):
        time.sleep(1.5)
        try:
            return build(self, *args, **kwargs)
        finally:
            print(f"REPORTED at {time.time():.6f}", file=sys.stderr, flush=True)

    farm.FarmRuntime._report = slow

while (tid := nlevel.get_task_id(40, checkpoint)) >= 0:
    time.sleep(0.001)
print(f"RETURNED rank {rank} at {time.time():.6f}", file=sys.stderr, flush=True)
if rank == 0:  # (without a checkpoint the report is built when first read: here)
    assert nlevel.api.last_report is not None
