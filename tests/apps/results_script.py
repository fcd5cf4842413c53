"""A user's script with a result per task; a checkpoint error reaches it as one CheckpointError (issue 34).

``python results_script.py CHECKPOINT TOTAL``: each rank prints one line, ``rank R: done`` or
``rank R: CheckpointError errno=E path=P cause=C: MESSAGE`` (C: whether an exception is chained
behind it), and exits 1 on the error.
"""

import sys

from nlevel import CheckpointError, Farm

rank = -1
try:
    with Farm(int(sys.argv[2]), sys.argv[1]) as farm:
        rank = farm.rank
        for task_id in farm:
            farm.complete(task_id * 0.5)
except CheckpointError as exc:
    chained = exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__)
    print(f"rank {rank}: CheckpointError errno={exc.errno} path={exc.path} cause={chained}: {exc}", flush=True)
    sys.exit(1)
print(f"rank {rank}: done", flush=True)
