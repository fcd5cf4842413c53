"""The farm's transport: the only module doing MPI point-to-point and collective calls.

Everything goes over a private ``Dup()`` of the user's communicator, so the farm's
messages never match the user's own receives. Sends are nonblocking (a grant and a
report crossing each other can never deadlock on rendezvous); receives use matched
probes (thread-safe: the server thread and the main thread may both receive).
"""

from __future__ import annotations

import socket
from typing import Any

from mpi4py import MPI

from .backoff import Backoff
from .protocol import Message, Tag, decode, encode

__all__ = ["Transport", "world", "comm_key", "abort", "host"]


def world() -> MPI.Comm:
    """Return ``MPI.COMM_WORLD`` (the default communicator of a farm)."""
    return MPI.COMM_WORLD


def comm_key(comm: Any) -> int:
    """Return a key identifying ``comm`` (to find the farm running on it)."""
    return int(MPI._handleof(comm))


def abort(code: int = 1) -> None:
    """Abort the whole job (no rank may hang on an error)."""
    MPI.COMM_WORLD.Abort(code)


def host() -> str:
    """Return this process's host name, for reports and error messages."""
    return MPI.Get_processor_name() or socket.gethostname()


class Transport:
    """Typed messages over a private duplicate of ``comm``.

    Args:
        comm: The user's communicator (``Dup`` is collective over it).
        poll_max: Backoff ceiling in seconds for blocking waits.
    """

    def __init__(self, comm: Any, poll_max: float = 1e-4) -> None:
        if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
            raise TypeError(f"comm must be an mpi4py communicator, got {comm!r}")
        self.comm = comm.Dup()
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()
        self.poll_max = poll_max
        self._sends: list[MPI.Request] = []
        self._status = MPI.Status()

    # -- point to point ---------------------------------------------------------------
    def send(self, dest: int, msg: Message) -> None:
        """Send ``msg`` to ``dest`` without blocking."""
        tag, payload = encode(msg)
        self._sends.append(self.comm.isend(payload, dest, tag))
        if len(self._sends) >= 32:
            self._reap()

    def poll(self) -> tuple[int, Message] | None:
        """Return ``(source, message)`` if one is waiting, else None."""
        status = self._status
        m = self.comm.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
        if m is None:
            return None
        src, tag = status.Get_source(), status.Get_tag()
        return src, decode(tag, m.recv())

    def wait_grant(self, parent: int) -> Message:
        """Block (with backoff, never spinning) until ``parent``'s next grant arrives."""
        backoff = Backoff(self.poll_max)
        status = MPI.Status()
        while True:
            m = self.comm.improbe(parent, Tag.GRANT, status)
            if m is not None:
                return decode(Tag.GRANT, m.recv())
            backoff.wait()

    @property
    def thread_multiple(self) -> bool:
        """Whether MPI allows calls from several threads at once (a computing server needs it)."""
        return bool(MPI.Query_thread() == MPI.THREAD_MULTIPLE)

    def _reap(self) -> None:
        self._sends = [r for r in self._sends if not r.Test()]

    def flush(self) -> None:
        """Wait until every send has completed."""
        backoff = Backoff(self.poll_max)
        while self._sends:
            self._reap()
            if self._sends:
                backoff.wait()

    # -- collectives (setup and teardown only) ------------------------------------------
    def bcast(self, obj: Any, root: int = 0) -> Any:
        """Broadcast a picklable object from ``root``."""
        return self.comm.bcast(obj, root)

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        """Gather picklable objects to ``root`` (None elsewhere)."""
        return self.comm.gather(obj, root)

    def reduce(self, obj: Any, op: Any, root: int = 0) -> Any:
        """Combine picklable objects with ``op(a, b)`` up a tree to ``root`` (None elsewhere)."""
        return self.comm.reduce(obj, op=op, root=root)

    def allreduce_minmax(self, value: int) -> tuple[int, int]:
        """Return (min, max) of an int over all ranks."""
        lo = self.comm.allreduce(value, op=MPI.MIN)
        hi = self.comm.allreduce(value, op=MPI.MAX)
        return lo, hi

    def any(self, flag: bool) -> bool:
        """Return whether ``flag`` is true on any rank."""
        return bool(self.comm.allreduce(bool(flag), op=MPI.LOR))

    def close(self) -> None:
        """Complete pending sends and free the private communicator."""
        self.flush()
        self.comm.Free()
