"""The farm's transport: the only module doing MPI point-to-point and collective calls.

Everything goes over a private ``Dup()`` of the user's communicator, so the farm's
messages never match the user's own receives. Sends are nonblocking (a grant and a
report crossing each other can never deadlock on rendezvous); receives use matched
probes (thread-safe: the server thread and the main thread may both receive).
"""

from __future__ import annotations

import os
import signal
from array import array
from typing import Any

from mpi4py import MPI

from ..roles.events import Died
from ..roles.messages import Message, Tag, decode, encode
from . import pids
from .backoff import poll_until
from .machine import hostname
from .startwatch import mark

mark("up")  # (MPI is initialised: for nlevel-mpiexec, this job's start is over)

# Error classes of a dead peer under ULFM (MPI_ERR_PROC_FAILED, _PENDING, MPI_ERR_REVOKED).
_FAILURE_CLASSES = {getattr(MPI, n) for n in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED") if hasattr(MPI, n)}

__all__ = ["Agreement", "Transport", "world", "comm_key", "abort", "finalize", "host", "kill_self", "allreduce_max", "MpiError",
           "setup_recovery", "revoke", "shrink", "user_ranks", "self_comm", "node_comm", "split",
           "dup", "broken", "last_words"]

#: What an MPI call raises (a dead peer among other errors).
MpiError = MPI.Exception


def setup_recovery(config: Any) -> bool:
    """Whether a death during the farm's set-up is survived: ULFM is on and ``config`` does not turn recovery off.

    Decided on each rank alone (before anything is broadcast), from the launcher's environment.
    """
    on = os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes")
    return on and getattr(config, "fault_tolerance", "auto") != "off" and hasattr(MPI.Comm, "Shrink")


def revoke(comm: Any) -> None:
    """Revoke ``comm`` (ULFM): every rank waiting in an operation on it gets an error instead of waiting on."""
    try:
        comm.Revoke()
    except MPI.Exception:
        pass  # (revoked already)


def shrink(comm: Any) -> Any:
    """The survivors of ``comm`` (ULFM ``Shrink``, collective over them, works on a revoked communicator)."""
    new = comm.Shrink()
    new.Set_errhandler(MPI.ERRORS_RETURN)
    return new


class Agreement:
    """A nonblocking ULFM agreement (``Iagree``) on ``comm``: the AND of ``flag`` over its live
    ranks, read with :meth:`result`; the caller does local work meanwhile.

    The agreement is rounds of messages among the ranks (0.3-4.5 ms at 4 ranks on 2 cores);
    a rank that posts its part and builds its roles meanwhile takes its first id sooner.
    """

    __slots__ = ("_flag", "_request")

    def __init__(self, comm: Any, flag: bool) -> None:
        self._flag = array("i", [int(flag)])
        try:
            self._request: Any = comm.Iagree(self._flag)
        except MPI.Exception:
            self._request = None  # (a revoked communicator, a death: the agreement failed)

    def progress(self) -> None:
        """Let the agreement move on (MPI moves a nonblocking operation only inside MPI calls: a rank
        that builds its roles meanwhile, the root of the agreement's rounds, would hold everyone up)."""
        request = self._request
        if request is None:
            return
        try:
            request.Test()
        except MPI.Exception:
            self._request = None  # (failed: result() says so)

    def result(self) -> bool:
        """Wait for the agreement: True if every live rank said True and none died meanwhile."""
        request, self._request = self._request, None
        if request is None:
            return False
        try:
            request.Wait()
        except MPI.Exception:
            return False
        return bool(self._flag[0])


def user_ranks(comm: Any, user: Any) -> list[int]:
    """The rank in ``user`` of each rank of ``comm`` (a communicator of some of ``user``'s processes)."""
    mine, theirs = comm.Get_group(), user.Get_group()
    try:
        return [int(r) for r in mine.Translate_ranks(list(range(mine.Get_size())), theirs)]
    finally:
        mine.Free()
        theirs.Free()


def world() -> MPI.Comm:
    """Return ``MPI.COMM_WORLD`` (the default communicator of a farm)."""
    return MPI.COMM_WORLD


def comm_key(comm: Any) -> int:
    """Return a key identifying ``comm`` (to find the farm running on it)."""
    return int(MPI._handleof(comm))


def allreduce_max(comm: Any, value: int) -> int:
    """The largest ``value`` over the ranks of ``comm`` (collective)."""
    return int(comm.allreduce(value, op=MPI.MAX))


def abort(code: int = 1) -> None:
    """Abort the whole job (no rank may hang on an error)."""
    MPI.COMM_WORLD.Abort(code)


def finalize() -> None:
    """MPI_Finalize, once (Open MPI's waits for every process of the job: what each printed before is out)."""
    if not MPI.Is_finalized():
        MPI.Finalize()


#: Called (once each, in order) just before this process SIGKILLs itself: a team's leader stops its
#: team's other members (see :mod:`nlevel.runtime.teams`). Each must be quick and must not raise.
last_words: list[Any] = []


def kill_self() -> None:
    """SIGKILL this process: under ULFM the other ranks detect it and carry on (an exit would hang them)."""
    while last_words:
        try:
            last_words.pop(0)()
        except Exception:  # noqa: BLE001 (the process dies whatever its last words did)
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def self_comm() -> Any:
    """``MPI.COMM_SELF``: the team of a task that runs on one rank."""
    return MPI.COMM_SELF


def node_comm(comm: Any) -> Any:
    """The ranks of ``comm`` that share this one's node (``Split_type(COMM_TYPE_SHARED)``; collective), or
    None when the MPI cannot tell (the caller then groups ranks by :func:`host`)."""
    try:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    except (NotImplementedError, MPI.Exception):
        return None
    return None if node == MPI.COMM_NULL else node


def split(comm: Any, color: int | None, key: int) -> Any:
    """``comm.Split(color, key)`` (collective); None for a rank whose ``color`` is None (in no part).
    The part returns errors as exceptions (a dead peer under ULFM is an error to handle, not an abort)."""
    part = comm.Split(MPI.UNDEFINED if color is None else color, key)
    if part == MPI.COMM_NULL:
        return None
    part.Set_errhandler(MPI.ERRORS_RETURN)
    return part


def dup(comm: Any) -> Any:
    """``comm.Dup()`` (collective) returning errors as exceptions."""
    new = comm.Dup()
    new.Set_errhandler(MPI.ERRORS_RETURN)
    return new


def broken(comm: Any, revoked: bool = True) -> bool:
    """Whether a process of ``comm`` is known dead here, or (``revoked``) ``comm`` was revoked (ULFM; local)."""
    try:
        if revoked and comm.Is_revoked():
            return True
        group = comm.Get_failed()
    except (NotImplementedError, AttributeError, MPI.Exception):
        return False
    try:
        return bool(group.Get_size())
    finally:
        group.Free()


def host() -> str:
    """Return this process's host name, for reports and error messages."""
    return MPI.Get_processor_name() or hostname()


class Transport:
    """Typed messages over a private duplicate of ``comm``.

    Args:
        comm: The user's communicator (``Dup`` is collective over it).
        poll_max: Backoff ceiling in seconds for blocking waits.
        overlap: Duplicate with ``Idup``, completed by :meth:`dup_done`: the set-up's other
            collectives (:attr:`setup_comm`: the user's communicator meanwhile) overlap it.
            Not under fault tolerance, whose set-up must be able to revoke the communicator
            its collectives run on (the private one, never the user's).
    """

    def __init__(self, comm: Any, poll_max: float = 1e-4, overlap: bool = False) -> None:
        if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
            raise TypeError(f"comm must be an mpi4py communicator, got {comm!r}")
        self._dup: Any = None
        if overlap:
            self.comm, self._dup = comm.Idup()
            self.setup_comm = comm
        else:
            self.comm = self.setup_comm = comm.Dup()
        self.rank: int = self.setup_comm.Get_rank()
        self.size: int = self.setup_comm.Get_size()
        self.poll_max = poll_max
        self._sends: list[MPI.Request] = []
        self._status = MPI.Status()
        self.ft = False  # set by the farm: report dead peers as Died events instead of raising
        self.failed: set[int] = set()
        #: (host, pid, start time) of every rank: a hung one is killed from its host, and only while
        #: its pid still names it (see nlevel.runtime.pids: a pid is reused once its process is gone).
        self.places: list[tuple[str, int, int | None]] = []
        #: Board questions (two-sided grants) given up unanswered, by owner: their replies, should
        #: they still come, are dropped (see nlevel.runtime.window.MessageBoards).
        self.unanswered: dict[int, int] = {}

    # -- fault tolerance ----------------------------------------------------------------
    def share(self, values: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """Every rank's ``values`` (picklable), by rank (collective); every rank's host and pid are learnt
        on the way (:attr:`places`: to kill a hung rank from its host)."""
        me = os.getpid()
        rows = self.setup_comm.allgather((values, host(), me, pids.started(me)))
        self.places = [(h, pid, born) for _, h, pid, born in rows]
        return [v for v, _, _, _ in rows]

    def dup_done(self) -> None:
        """Complete the private communicator's ``Idup`` (before its first message, or its free)."""
        if self._dup is not None:
            self._dup.Wait()
            self._dup = None
            self.setup_comm = self.comm

    def enable_ft(self) -> None:
        """Turn on failure reporting: a dead peer becomes an event, not an error."""
        self.ft = True
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)

    def _dead(self, exc: Exception) -> Died | None:
        """After an MPI error: acknowledge and return the newly dead ranks (None if there are none)."""
        if not self.ft:
            raise exc
        try:
            self.comm.Ack_failed()
            group = self.comm.Get_failed()
            ranks = group.Translate_ranks(list(range(group.Get_size())), self.comm.Get_group())
            group.Free()
        except MPI.Exception:
            raise exc from None
        new = sorted(set(ranks) - self.failed)
        if not new:
            if isinstance(exc, MPI.Exception) and exc.Get_error_class() not in _FAILURE_CLASSES:
                raise exc
            return None
        self.failed.update(new)
        return Died(tuple(new))

    def kill(self, rank: int) -> str:
        """SIGKILL ``rank`` if it runs on this host (a hung process; MPI then reports it dead).

        Returns "killed", "gone" (its process had exited already: MPI will never report it),
        or "" (it runs on another host).
        """
        if not self.places or self.places[rank][0] != self.places[self.rank][0]:
            return ""
        _, pid, born = self.places[rank]
        # (never a stranger that took the pid after the rank's process exited: that one is "gone")
        return "killed" if pids.kill(pid, born, signal.SIGKILL) else "gone"

    def gone(self, ranks: list[int]) -> list[int]:
        """Those of ``ranks`` on this host whose processes no longer run (exited; MPI never says so).

        Only under fault tolerance: without it a death ends the job anyway, and a rank that
        finished first must not be taken for a failure.
        """
        if not self.places or not self.ft:
            return []
        here = self.places[self.rank][0]
        return [r for r in ranks if r not in self.failed and self.places[r][0] == here
                and not pids.same(self.places[r][1], self.places[r][2])]

    def declare_dead(self, ranks: tuple[int, ...]) -> None:
        """Treat ``ranks`` as dead from now on (nothing more is sent to them)."""
        self.failed.update(r for r in ranks if r != self.rank)

    def relay_for(self, rank: int) -> int | None:
        """A live rank on ``rank``'s host (to kill it from there), or None."""
        if not self.places:
            return None
        where = self.places[rank][0]
        return next((r for r, (h, _, _) in enumerate(self.places) if h == where and r != rank and r not in self.failed),
                    None)

    # -- point to point ---------------------------------------------------------------
    def send(self, dest: int, msg: Message) -> None:
        """Send ``msg`` to ``dest`` without blocking (to a dead rank: dropped)."""
        if dest in self.failed:
            return
        tag, payload = encode(msg)
        try:
            self._sends.append(self.comm.isend(payload, dest, tag))
        except MPI.Exception as exc:
            self._dead(exc)  # the dead are reported by the next poll
        if len(self._sends) >= 32:
            self._reap()

    def poll(self) -> tuple[int, Message] | Died | None:
        """Return ``(source, message)`` if one is waiting, else None.

        Under fault tolerance, newly dead peers come back as :class:`~nlevel.roles.events.Died`.
        A reply of the two-sided board fallback to a question given up is dropped (:meth:`late_reply`).

        A probe that finds nothing probes once more: Open MPI's probe (ob1) matches first and
        progresses the transfers after, so a message that arrived while this rank slept is found
        only by the next probe (measured: a single probe after a 3 ms sleep found none of 200
        messages; a second found all). Without the second one a message waited one more look.
        """
        status = self._status
        comm = self.comm
        try:
            m = comm.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
            if m is None:
                m = comm.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
                if m is None:
                    return None
            src, tag = status.Get_source(), status.Get_tag()
            payload = m.recv()
        except MPI.Exception as exc:
            return self._dead(exc)
        if tag == Tag.BOARD_REPLY and self.late_reply(src):
            return None
        return src, decode(tag, payload)

    def give_up(self, owner: int) -> None:
        """A board question to ``owner`` is given up unanswered: its reply, should it come, is dropped."""
        self.unanswered[owner] = self.unanswered.get(owner, 0) + 1

    def late_reply(self, src: int) -> bool:
        """Whether a board reply from ``src`` answers a question given up (it is dropped)."""
        owed = self.unanswered.get(src, 0)
        if owed:
            self.unanswered[src] = owed - 1
        return owed > 0

    @property
    def thread_multiple(self) -> bool:
        """Whether MPI allows calls from several threads at once (a computing server needs it)."""
        return bool(MPI.Query_thread() == MPI.THREAD_MULTIPLE)

    def _reap(self) -> None:
        keep = []
        for r in self._sends:
            try:
                if not r.Test():
                    keep.append(r)
            except MPI.Exception as exc:  # its destination died
                self._dead(exc)
        self._sends = keep

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every send has completed (at most ``timeout`` seconds); return whether all did."""
        def done() -> bool:
            if self._sends:
                self._reap()
            return not self._sends

        return poll_until(done, self.poll_max, timeout=timeout)

    def shrink(self) -> Transport:
        """Return a transport over the surviving ranks (collective over them; ULFM)."""
        t = object.__new__(Transport)
        t.comm = t.setup_comm = self.comm.Shrink()
        t._dup = None
        t.comm.Set_errhandler(MPI.ERRORS_RETURN)
        t.rank, t.size, t.poll_max = t.comm.Get_rank(), t.comm.Get_size(), self.poll_max
        t._sends, t._status, t.ft, t.failed, t.places = [], MPI.Status(), True, set(), []
        return t

    def idle_barrier(self, step: Any = None) -> None:
        """A barrier that waits asleep (backing off to ``poll_max``), so early finishers leave the cores to the others.

        ``step()`` is called meanwhile (it returns whether anything arrived): a server whose
        children reach their boards by messages (the two-sided fallback) answers until the last
        child has seen the end.
        """
        req = self.comm.Ibarrier()
        poll_until(req.Test, self.poll_max, step)

    def agree(self, flag: bool = True) -> bool:
        """Fault-tolerant agreement: the AND of ``flag`` over the live ranks (ULFM)."""
        return bool(self.comm.Agree(int(flag)))

    def close(self) -> None:
        """Complete pending sends and free the private communicator (after failures: neither can be trusted)."""
        if self.ft and self.failed:
            return
        self.flush()
        self.comm.Free()
