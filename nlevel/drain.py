"""``python -m nlevel.drain RUN --ranks 5,6 | --count Q``: take ranks out of a running job.

The chosen ranks finish the task they are running, give their queued ids back (they
run elsewhere) and leave; the job goes on with the others, and its report lists the
drained ranks. RUN is the job's checkpoint file (the request goes to its control
directory, ``RUN.control``). Under ``mpiexec --with-ft ulfm`` a drained process exits
and its core is free for another job; without ULFM it must stay until the job ends
(MPI would take its exit for a failure), so it waits there asleep, using no CPU.
``--count`` chooses the highest-numbered slaves (at least one slave stays); ``--ranks`` may
name any rank that runs tasks but the master (a region-master stops computing but keeps
serving its region). Bad input is refused before anything is written (exit 2); what only the
job knows (a rank not in it, or running no tasks) comes back as the job's refusal (exit 1).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Sequence

from .runtime.control import SUFFIX, control_dir, submit, wait_answer

__all__ = ["main"]


def _ranks(text: str) -> list[int]:
    try:
        ranks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ranks must be rank numbers like 5,6, got {text!r}") from None
    if not ranks or any(r < 0 for r in ranks):
        raise argparse.ArgumentTypeError(f"--ranks must be rank numbers >= 0 like 5,6, got {text!r}")
    twice = sorted({r for r in ranks if ranks.count(r) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"--ranks names rank {twice[0]} twice, got {text!r}")
    return ranks


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 1:
        raise argparse.ArgumentTypeError(f"--count must be an integer >= 1, got {text!r}")
    return n


def _wait(text: str) -> float:
    try:
        s = float(text)
    except ValueError:
        s = math.nan
    if not 0 < s < math.inf:
        raise argparse.ArgumentTypeError(f"--wait must be a number of seconds > 0, got {text!r}")
    return s


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns 0 when the job drained the ranks, 1 when it refused, 2 on bad input or no answer."""
    p = argparse.ArgumentParser(prog="python -m nlevel.drain", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN", help="the running job's checkpoint file (or its .control directory)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--ranks", type=_ranks, help="ranks to drain, e.g. 5,6")
    which.add_argument("--count", type=_count, help="drain this many ranks (the highest-numbered slaves)")
    p.add_argument("--wait", type=_wait, default=30.0, help="seconds to wait for the job's answer (default 30)")
    args = p.parse_args(argv)
    directory = args.run if args.run.endswith(SUFFIX) else control_dir(args.run)
    if not os.path.isdir(directory):
        print(f"nlevel.drain: error: {directory!r} does not exist; is a job with checkpoint {args.run!r} running? "
              f"(the control directory is made when a job with a checkpoint starts)", file=sys.stderr)
        return 2
    request = {"action": "drain", **({"ranks": args.ranks} if args.ranks is not None else {"count": args.count})}
    try:
        path = submit(directory, request)
    except ValueError as exc:  # (what the job would refuse; the parser's checks catch it first)
        print(f"nlevel.drain: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"nlevel.drain: error: cannot write the request into {directory!r} ({exc.strerror or exc})",
              file=sys.stderr)
        return 2
    answer = wait_answer(path, args.wait)
    if answer is None:
        print(f"nlevel.drain: no answer from the job within {args.wait:g} s; the request stays in {path!r} "
              f"and is acted on if the job reads it later", file=sys.stderr)
        return 2
    if "error" in answer:
        print(f"nlevel.drain: the job refused: {answer['error']}", file=sys.stderr)
        return 1
    result = answer.get("result")
    ranks = result.get("ranks") if isinstance(result, dict) else None
    if ranks is None:
        print(f"nlevel.drain: the job's answer is not one nlevel.drain understands: {answer!r}", file=sys.stderr)
        return 1
    print(f"nlevel.drain: ranks {ranks} are leaving the job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
