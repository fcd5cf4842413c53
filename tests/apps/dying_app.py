"""A test app whose task ``--die-task`` ends its process in one of several ways, the first time it runs.

Like logging_app, it logs every execution per rank in ``$NLEVEL_TEST_LOG_DIR``. The
"first time" is remembered in a marker file there, so a rerun of the task elsewhere
succeeds (a crash caused by a node, not by the task). ``--poison`` makes it die every time.
"""

import ctypes
import os
import sys
import time

_opts = None
LOG_DIR = os.environ.get("NLEVEL_TEST_LOG_DIR")


def add_arguments(parser):
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--sleep-ms", type=float, default=2.0)
    parser.add_argument("--die-task", type=int, default=50)
    parser.add_argument("--how", choices=["exit", "os_exit", "raise", "segfault", "memory", "hang", "forever", "gil"], default="exit")
    parser.add_argument("--poison", action="store_true")
    parser.add_argument("--long", default="", help="ID:SECONDS,...: tasks far longer than the rest (a heavy tail)")
    parser.add_argument("--mixed", action="store_true",
                        help="task lengths spread log-normally around --sleep-ms (sigma 1), fixed per id")
    parser.add_argument("--die-rank", type=int, default=-1, help="instead: rank R dies at its --die-after-th task")
    parser.add_argument("--die-after", type=int, default=10)
    parser.add_argument("--die-in-setup", choices=["options", "dup", "window", "places", "roles"], default=None,
                        help="instead: rank --die-rank is SIGKILLed when the farm's set-up reaches this call")
    parser.add_argument("--master-after-release", choices=["KILL", "STOP", "KILL-MID", "KILL-REPORT"], default=None,
                        help="instead: the master gets this signal right after it has released the job "
                             "(KILL-MID: SIGKILL once it has released its deputy and one other rank only; "
                             "KILL-REPORT: SIGKILL as it is about to write the report file)")


_count = 0


def setup(options):
    global _opts
    _opts = options
    if options.die_in_setup:
        _die_in_setup(options.die_in_setup, options.die_rank)
    if options.master_after_release:
        _master_after_release(options.master_after_release)


def _master_after_release(how):
    """The master (rank 0) gets SIG``how`` as soon as it has released every rank (its deputy's release deferred)."""
    import signal

    from nlevel.roles.loop import Loop
    from nlevel.runtime import farm

    if os.environ.get("OMPI_COMM_WORLD_RANK", "0") != "0":
        return
    release = Loop.release
    if how == "KILL-REPORT":  # (the end done, the report built: only nlevel.run's writing of the file is left)
        end = farm.FarmRuntime.end

        def end_then_die(self):
            end(self)
            if self.report is not None:
                open(os.path.join(LOG_DIR, "master-released"), "a").close()
                os.kill(os.getpid(), signal.SIGKILL)

        farm.FarmRuntime.end = end_then_die
        return
    if how == "KILL-MID":  # (the Releases go to the deputy, then the others from the highest rank down)
        from nlevel.roles import ending

        whole = ending.Closing.release
        ending.Closing.release = lambda self, *args: whole(self, *args)[:2]
        how = "KILL"

    def release_then_die(self):
        if not release(self):
            return False
        open(os.path.join(LOG_DIR, "master-released"), "a").close()
        os.kill(os.getpid(), getattr(signal, "SIG" + how))
        return True

    Loop.release = release_then_die


def _die_in_setup(step, rank):
    """SIGKILL rank ``rank`` as it enters ``step`` of the farm's set-up (the others are in or near it)."""
    import signal

    from nlevel.runtime import farm, transport, window

    if int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")) != rank:
        return

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if step == "options":  # (setup runs while the options are checked, before any collective)
        die()
    elif step == "dup":
        farm.Transport = die
    elif step == "window":
        window.allocate = die
    elif step == "roles":  # (under ULFM its roles are built while the set-up's agreement goes round)
        farm.FarmRuntime._build = die
    else:
        transport.Transport.share = die


def total(options):
    return options.n


def do_job(task_id):
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    with open(os.path.join(LOG_DIR, f"exec-{rank}.log"), "a") as f:
        f.write(f"{task_id}\n")
    global _count
    _count += 1
    if _opts.die_rank >= 0:
        chosen = int(rank) == _opts.die_rank and _count == _opts.die_after
    else:
        chosen = task_id == _opts.die_task
    if chosen:
        marker = os.path.join(LOG_DIR, f"died-{task_id}")
        if _opts.poison or _opts.die_rank >= 0 or not os.path.exists(marker):
            open(marker, "a").close()
            if _opts.how == "exit":
                sys.exit(3)
            if _opts.how == "os_exit":
                os._exit(3)  # as a C library might: no Python clean-up, no MPI_Finalize
            if _opts.how == "forever":
                while True:  # a task that never returns (but the process answers signals)
                    time.sleep(1)
            if _opts.how == "raise":
                raise ValueError(f"task {task_id} is broken")
            if _opts.how == "segfault":
                ctypes.string_at(0)
            if _opts.how == "memory":
                raise MemoryError(f"task {task_id} ran out of memory")
            if _opts.how == "hang":
                os.kill(os.getpid(), 19)  # SIGSTOP: a C call that never returns, as far as anyone can tell
            if _opts.how == "gil":
                import re  # catastrophic backtracking: C code that holds the GIL for hours

                re.match(r"(a+)+$", "a" * 48 + "b")
    time.sleep(_length(task_id))
    return float(task_id)


def _length(task_id):
    """Seconds task ``task_id`` sleeps: --sleep-ms, a --long one's, or (--mixed) a log-normal draw fixed per id."""
    global _long
    if _long is None:
        _long = {int(a): float(b) for a, b in (x.split(":") for x in _opts.long.split(",") if x)}
    if task_id in _long:
        return _long[task_id]
    if _opts.mixed:
        import math
        import random

        return _opts.sleep_ms / 1e3 * math.exp(random.Random(task_id).gauss(0.0, 1.0))
    return _opts.sleep_ms / 1e3


_long = None
