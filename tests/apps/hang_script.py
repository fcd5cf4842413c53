"""A loop script (the README's) whose task ``HANG_ID`` never returns, every time it runs.

``python hang_script.py TOTAL CHECKPOINT HANG_ID``; run with ``NLEVEL_TASK_TIMEOUT`` set. The
loop's end prints ``loop over``: a process that ends the job from inside the hung task never
gets there.
"""

import sys
import time

from nlevel import get_task_id

total, checkpoint, hang = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
while (task_id := get_task_id(total, checkpoint)) >= 0:
    while task_id == hang:  # (the process still answers signals)
        time.sleep(1)
    time.sleep(0.002)
print("loop over")
