"""Two farms one after the other in one script; a SIGUSR1 stops the first (issue 34).

``python two_farms.py DIR``: in the first farm (checkpoint DIR/one.h5, 400 tasks of 5 ms) rank 0
sends SIGUSR1 to its own process after its fifth task; the farm stops early. The second farm
(DIR/two.h5, 100 tasks) must run whole: the first one's stop is not the second's. Rank 0
prints one line per farm: "farm N: committed C of T, stopped S".
"""

import os
import signal
import sys
import time

from nlevel import Farm

d = sys.argv[1]
ran = 0
with Farm(400, os.path.join(d, "one.h5")) as farm:
    for tid in farm:
        ran += 1
        if farm.rank == 0 and ran == 5:
            os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.005)
if farm.report is not None:
    print(f"farm 1: committed {farm.report['committed']} of 400, stopped {farm.report.get('stopped')}", flush=True)
with Farm(100, os.path.join(d, "two.h5")) as farm:
    for tid in farm:
        time.sleep(0.001)
if farm.report is not None:
    print(f"farm 2: committed {farm.report['committed']} of 100, stopped {farm.report.get('stopped')}", flush=True)
