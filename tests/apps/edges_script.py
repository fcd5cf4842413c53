"""A new user's script for issue 38's table: one Farm, results of one or two fields, calls to complete() right or wrong.

    python edges_script.py FIELDS MODE WHO [with|bare]

FIELDS: ``none`` (no result_fields), ``x`` (one field) or ``ab`` (two fields). MODE, what a
misbehaving rank does on its first task: ``scalar`` (``complete(1.0)``), ``tuple1``
(``complete((1.0,))``), ``three`` (``complete((1.0, 2.0, 3.0))``), ``twice``
(``complete(1.0)`` then ``complete(2.0)``), ``before`` (``complete(1.0)`` before the loop's
first id). WHO: the rank that misbehaves, or ``all``. ``bare``: the loop runs without a ``with``
block (the default is ``with``). The other ranks, and every later task,
complete a right result (the task id, in each field). Each rank says on stderr
``RAISED rank R: <error>`` when an error leaves the ``with`` block, else ``ENDED rank R``; the
master (rank 0) also ``RESULTS n=<count> ok=<values match>``.
"""

import sys
import time

from mpi4py import MPI

from nlevel import Farm

fields = {"none": None, "x": ("x",), "ab": ("a", "b")}[sys.argv[1]]
mode, who = sys.argv[2], sys.argv[3]
bare = len(sys.argv) > 4 and sys.argv[4] == "bare"
total = 120
rank = MPI.COMM_WORLD.Get_rank()
bad = who == "all" or int(who) == rank
width = len(fields) if fields else 1


def right(tid):
    return float(tid) if width == 1 else (float(tid),) * width


def wrong(farm, tid):
    if mode == "scalar":
        farm.complete(float(tid))
    elif mode == "tuple1":
        farm.complete((float(tid),))
    elif mode == "three":
        farm.complete((1.0, 2.0, 3.0))
    elif mode == "twice":
        farm.complete(right(tid))
        farm.complete(right(tid))
    else:
        farm.complete(right(tid))


def loop(farm):
    if bad and mode == "before":
        farm.complete(1.0)
    first = True
    for tid in farm:
        time.sleep(0.002)  # (every rank gets some of the ids)
        if bad and first:
            wrong(farm, tid)
        else:
            farm.complete(right(tid))
        first = False


try:
    if bare:
        farm = Farm(total, None, result_fields=fields)
        loop(farm)
    else:
        with Farm(total, None, result_fields=fields) as farm:
            loop(farm)
except BaseException as exc:
    print(f"RAISED rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    raise
print(f"ENDED rank {rank}", file=sys.stderr, flush=True)
got = farm.results()
if got is not None:
    ids, values = got
    ok = all((v == tid) if width == 1 else tuple(v) == right(tid) for tid, v in zip(ids.tolist(), values.tolist()))
    print(f"RESULTS n={len(ids)} ok={ok}", file=sys.stderr, flush=True)
