"""The boards in an MPI window: one-sided grants (see :mod:`nlevel.roles.board`), and the two-sided fallback.

Every rank of the farm exposes its two boards (leaf and upper) in one window allocated
once at set-up over the farm's communicator (``Win.Allocate``, passive target,
``Lock_all`` for the whole job). A plan change does not need a new window: a child
simply claims from another rank's board. After a death under ULFM the window is kept:
on one node (``osc/sm``) atomics on it go on working, the dead owner's memory included
(see docs/fault-tolerance.md); an operation that fails is
reported like any failure.

Without usable one-sided operations (``--grants two-sided``, a window that cannot be
allocated, a self-test that fails at set-up, or atomics across nodes that wait for their
target's CPU, see :func:`progress_problem`) each board lives in its owner's memory
and a claimer's operations travel to the owner as messages
(:class:`~nlevel.roles.messages.BoardOp`), answered by the owner's loop.
"""

from __future__ import annotations

import time
from array import array
from typing import Any, Callable, Iterable, Sequence

from mpi4py import MPI

from ..roles.board import EMPTY, HEADER, LocalMemory, words
from ..roles.messages import BoardOp, BoardReply, Tag, decode
from .backoff import Backoff

__all__ = ["WindowBoards", "LocalBoards", "MessageBoards", "allocate", "self_test_problem", "cross_node_problem",
           "progress_problem", "SELF_TEST", "WORD", "PROBE"]

#: The reserved word of each board that the set-up self-test counts on.
SELF_TEST = 2
#: The one datatype of every operation on the window, origin and target alike. An accumulate's
#: origin and target must have the same basic datatype; mpi4py describes a numpy int64 buffer as
#: MPI_LONG, a different basic datatype from MPI_INT64_T even where both are 8-byte integers.
#: Open MPI's osc/rdma (windows across nodes) refuses the mix with MPI_ERR_TYPE for accumulates
#: larger than its fast path (the initialisation of a board), and fails SUM with MPI_ERR_ARG;
#: osc/sm (one node) lets it pass.
WORD = MPI.INT64_T


def _words(values: Sequence[int] | int) -> array[int]:
    """``values`` (or that many zeros) as int64 words for MPI: an ``array``, not numpy, which costs a
    farm's first call 40-150 ms to import."""
    return array("q", bytes(8 * values)) if isinstance(values, int) else array("q", values)


class WindowMemory:
    """Board ``base`` (a word offset) of rank ``target`` in ``win``: every operation completes before it returns."""

    __slots__ = ("win", "target", "base", "_one", "_res", "_cmp", "_one_b", "_res_b", "_cmp_b")

    def __init__(self, win: Any, target: int, base: int) -> None:
        self.win = win
        self.target = target
        self.base = base
        self._one, self._res, self._cmp = _words(1), _words(1), _words(1)
        # (as MPI buffers: the words' type named, the target's)
        self._one_b, self._res_b, self._cmp_b = [self._one, MPI.INT64_T], [self._res, MPI.INT64_T], \
            [self._cmp, MPI.INT64_T]

    def fetch_add(self, index: int, n: int) -> int:
        self._one[0] = n
        self.win.Fetch_and_op(self._one_b, self._res_b, self.target, self.base + index, MPI.SUM)
        self.win.Flush(self.target)
        return self._res[0]

    def get(self, index: int) -> int:
        self.win.Fetch_and_op(self._one_b, self._res_b, self.target, self.base + index, MPI.NO_OP)
        self.win.Flush(self.target)
        return self._res[0]

    def read(self, index: int, count: int) -> list[int]:
        out = _words(count)
        if count == 1:
            self.win.Fetch_and_op(self._one_b, [out, MPI.INT64_T], self.target, self.base + index, MPI.NO_OP)
        else:
            self.win.Get_accumulate([out, MPI.INT64_T], [out, MPI.INT64_T], self.target,
                                    (self.base + index, count, MPI.INT64_T), MPI.NO_OP)
        self.win.Flush(self.target)
        return out.tolist()

    def write(self, index: int, values: Sequence[int]) -> None:
        self.win.Accumulate([_words(values), MPI.INT64_T], self.target, (self.base + index, len(values), MPI.INT64_T),
                            MPI.REPLACE)
        self.win.Flush(self.target)

    def put(self, index: int, value: int) -> None:
        self._one[0] = value
        self.win.Accumulate(self._one_b, self.target, (self.base + index, 1, MPI.INT64_T), MPI.REPLACE)
        self.win.Flush(self.target)

    def cas(self, index: int, expected: int, new: int) -> int:
        self._cmp[0] = expected
        self._one[0] = new
        self.win.Compare_and_swap(self._one_b, self._cmp_b, self._res_b, self.target, self.base + index)
        self.win.Flush(self.target)
        return self._res[0]


class WindowBoards:
    """Every rank's boards in one MPI window (see :func:`allocate`).

    Args:
        win: The window (locked for the whole job with ``Lock_all``).
        slots: Ring sizes of the leaf and the upper board.
    """

    kind = "one-sided"

    def __init__(self, win: Any, slots: tuple[int, int]) -> None:
        self.win = win
        self._slots = slots
        self._bases = (0, words(slots[0]))
        self._mem: dict[tuple[int, int], WindowMemory] = {}
        self._local: Any = None  # this rank's own window memory as int64 words (see own_word)
        try:
            if win.Get_attr(MPI.WIN_MODEL) == MPI.WIN_UNIFIED:
                self._local = memoryview(win.tomemory()).cast("B").cast("q")
        except (MPI.Exception, AttributeError, TypeError, ValueError):
            pass  # (no local view: own_word answers None, the caller reads with an MPI operation)

    def __call__(self, rank: int, kind: int) -> WindowMemory:
        mem = self._mem.get((rank, kind))
        if mem is None:
            mem = self._mem[(rank, kind)] = WindowMemory(self.win, rank, self._bases[kind])
        return mem

    def slots(self, kind: int) -> int:
        return self._slots[kind]

    def own_word(self, kind: int, index: int) -> int | None:
        """Word ``index`` of this rank's own board ``kind``, read as local memory: no MPI call (a
        tenth of a microsecond against a flushed atomic's microseconds, tens on an oversubscribed node).

        A hint, not an operation: an atomic of another rank may land just after the read (in MPI's
        unified memory model the window is the process's memory, and an aligned 8-byte load is whole).
        None when the model is not unified (then only an MPI operation reads the window).
        """
        local = self._local
        return None if local is None else int(local[self._bases[kind] + index])

    def close(self, collective: bool) -> None:
        """End the access epoch; with ``collective`` (every rank alive) free the window too."""
        self._local = None  # (a view into the memory Free gives back)
        try:
            self.win.Unlock_all()
            if collective:
                self.win.Free()
        except MPI.Exception:
            pass  # (after failures the window cannot be trusted; the process ends with os._exit)


def allocate(comm: Any, rank: int, slots: tuple[int, int]) -> tuple[WindowBoards | None, int | None, str]:
    """Allocate the farm's window, initialise this rank's boards and take the self-test (collective over ``comm``).

    The self-test: this rank adds 1 to rank 0's :data:`SELF_TEST` word (which no rank
    initialises, so no ordering with rank 0 is needed) and keeps the value it saw. When the
    atomics work, the values the ranks saw are ``size`` consecutive integers in some order,
    from whatever the word held (:func:`self_test_problem` checks them once every rank's
    value is known). The word is not initialised, so any value, negative too, is a fine start:
    a second farm in one process, its window in the first one's memory, once found a negative
    word there and took it for a failed operation.

    Returns:
        The boards, the value seen (None when the test's operation failed), and "" or the
        reason (naming this rank and the MPI error) when the allocation or the operations
        failed here. The caller tells the other ranks and agrees.
    """
    n = words(slots[0]) + words(slots[1])
    try:
        win = MPI.Win.Allocate(8 * n, 8, MPI.INFO_NULL, comm)
    except MPI.Exception as exc:
        return None, None, f"rank {rank}: MPI_Win_allocate of {8 * n} bytes failed: {exc.Get_error_string()}"
    try:
        win.Set_errhandler(MPI.ERRORS_RETURN)
        win.Lock_all()
        init = _words([EMPTY]) * n
        for base in (0, words(slots[0])):
            init[base : base + HEADER] = _words(HEADER)
        # Everything but the leaf board's self-test word (the others may be adding to rank 0's already).
        win.Accumulate([init[:SELF_TEST], MPI.INT64_T], rank, (0, SELF_TEST, MPI.INT64_T), MPI.REPLACE)
        win.Accumulate([init[SELF_TEST + 1 :], MPI.INT64_T], rank, (SELF_TEST + 1, n - SELF_TEST - 1, MPI.INT64_T),
                       MPI.REPLACE)
        win.Flush(rank)
    except MPI.Exception as exc:
        return None, None, f"rank {rank}: one-sided operations on the window failed: {exc.Get_error_string()}"
    boards = WindowBoards(win, slots)
    try:
        seen = boards(0, 0).fetch_add(SELF_TEST, 1)
    except Exception as exc:  # noqa: BLE001 (an MPI error of any kind: the farm falls back to messages)
        return boards, None, f"rank {rank}: fetch-and-add on rank 0's window failed: {exc}"
    return boards, seen, ""


def self_test_problem(seen: list[int | None]) -> str:
    """Why the self-test failed ("" when it passed): ``seen[r]`` is what rank ``r``'s addition saw
    (None: its operation failed, and it said why)."""
    values = [v for v in seen if v is not None]
    if len(values) < len(seen):
        return "see the message above"
    lo = min(values)
    if sorted(values) != list(range(lo, lo + len(values))):
        return (f"the window's self-test saw {sorted(values)[:16]} from {len(values)} atomic additions "
                f"(expected {len(values)} consecutive values)")
    return ""


def cross_node_problem(ft: bool, hosts: Iterable[str]) -> str:
    """Why one-sided grants must not be used ("" when they may): under fault tolerance, a window
    whose ranks run on more than one host (``hosts``: every rank's processor name).

    Across nodes the window is Open MPI's osc/rdma, and an atomic on a target that has died or
    exited blocks for ever (no ULFM error): on the emulated cluster a rank still scanning its
    parent's board after that parent had ended hung the job's end, every time. On one node
    (osc/sm) the memory outlives its owner and the operation completes.
    """
    nodes = sorted(set(hosts))
    if not ft or len(nodes) <= 1:
        return ""
    return (f"the window spans {len(nodes)} nodes ({', '.join(nodes[:4])}{', ...' if len(nodes) > 4 else ''}), "
            f"where an atomic on a rank that has died or exited blocks for ever (Open MPI's osc/rdma)")


#: Seconds rank 0 stays out of MPI while the ranks on other hosts time an atomic on its window
#: (:func:`progress_problem`); they start a quarter of it in, and more than a quarter is a wait.
PROBE = 0.04


def progress_problem(boards: WindowBoards, comm: Any, rank: int, remote: bool) -> str:
    """Whether an atomic across hosts completes while its target runs no MPI call ("" when it does).

    Collective over ``comm`` (a barrier and an allreduce); ``remote``: this rank runs on another
    host than rank 0. Where the network has no atomics of its own (Open MPI's osc/rdma over TCP:
    the target's progress engine serves every operation) a claim waits for its parent's next MPI
    call: on the emulated cluster one-sided grants ran 4 times slower than messages, and a rank
    waiting for a parent busy in its own claims went silent for a lease and was killed. Rank 0
    sleeps :data:`PROBE` seconds; the remote ranks time one fetch-and-add on its self-test word.
    """
    comm.Barrier()
    took = 0.0
    if rank == 0:
        time.sleep(PROBE)
    elif remote:
        time.sleep(PROBE / 4)
        start = time.perf_counter()
        try:
            boards(0, 0).fetch_add(SELF_TEST, 1)
            took = time.perf_counter() - start
        except Exception:  # noqa: BLE001 (an MPI error of any kind: no one-sided grants)
            took = float("inf")
    worst = float(comm.allreduce(took, op=MPI.MAX))
    if worst <= PROBE / 4:
        return ""
    waited = "failed" if worst == float("inf") else f"took {worst * 1e3:.0f} ms"
    return (f"an atomic on another node's window {waited} while its owner ran no MPI call: this network serves "
            f"one-sided operations only when the target calls MPI (Open MPI's osc/rdma over TCP), so every claim "
            f"would wait for its parent's next MPI call")


class LocalBoards:
    """This rank's own boards in local memory (the owner's side of the two-sided fallback)."""

    def __init__(self, slots: tuple[int, int]) -> None:
        self._slots = slots
        self.mem = (LocalMemory(slots[0]), LocalMemory(slots[1]))

    def slots(self, kind: int) -> int:
        return self._slots[kind]


class RemoteMemory:
    """A claimer's view of another rank's board in the two-sided fallback: each operation is a round trip."""

    __slots__ = ("transport", "owner", "kind", "wait")

    def __init__(self, transport: Any, owner: int, kind: int, wait: Callable[[int], tuple[int, ...]]) -> None:
        self.transport = transport
        self.owner = owner
        self.kind = kind
        self.wait = wait

    def _op(self, op: str, index: int, a: int = 0, b: int = 0) -> tuple[int, ...]:
        self.transport.send(self.owner, BoardOp(self.kind, op, index, a, b))
        return self.wait(self.owner)

    def fetch_add(self, index: int, n: int) -> int:
        return self._op("fetch_add", index, n)[0]

    def get(self, index: int) -> int:
        return self._op("read", index, 1)[0]

    def read(self, index: int, count: int) -> list[int]:
        return list(self._op("read", index, count))

    def write(self, index: int, values: Sequence[int]) -> None:
        raise RuntimeError("only a board's owner writes it")

    def put(self, index: int, value: int) -> None:
        raise RuntimeError("only a board's owner writes it")

    def cas(self, index: int, expected: int, new: int) -> int:
        return self._op("cas", index, expected, new)[0]


class MessageBoards:
    """The two-sided fallback: this rank's boards are local; another's are reached by messages.

    Args:
        transport: The farm's transport (its ``comm`` for matched receives of replies).
        rank: This rank.
        slots: Ring sizes.
        poll_max: Backoff ceiling while waiting for a reply (s).
        dead: Returns the ranks known dead (a reply from one never comes).

    An operation on the board of a rank that is gone raises ``ConnectionError`` (the roles wait
    for the news of its death, or for the job's end, instead). So does one still waiting when
    this rank's :class:`~nlevel.roles.messages.Release` arrives: the owner, released too, may have
    left its loop without answering.
    """

    kind = "two-sided"

    def __init__(self, transport: Any, rank: int, slots: tuple[int, int], poll_max: float,
                 dead: Callable[[], Any]) -> None:
        self.transport = transport
        self.rank = rank
        self.own = LocalBoards(slots)
        self._slots = slots
        self.poll_max = poll_max
        self.dead = dead
        self._remote: dict[tuple[int, int], RemoteMemory] = {}

    def __call__(self, rank: int, kind: int) -> Any:
        if rank == self.rank:
            return self.own.mem[kind]
        mem = self._remote.get((rank, kind))
        if mem is None:
            mem = self._remote[(rank, kind)] = RemoteMemory(self.transport, rank, kind, self._wait)
        return mem

    def slots(self, kind: int) -> int:
        return self._slots[kind]

    def own_word(self, kind: int, index: int) -> int | None:
        """Word ``index`` of this rank's own board ``kind`` (local memory here)."""
        return self.own.mem[kind].get(index)

    def _wait(self, owner: int) -> tuple[int, ...]:
        comm = self.transport.comm
        status = MPI.Status()
        backoff = Backoff(self.poll_max)
        tag = int(Tag.BOARD_REPLY)
        while True:
            try:
                # (twice: a probe progresses the transfers after it matched, see Transport.poll)
                m = comm.improbe(owner, tag, status) or comm.improbe(owner, tag, status)
                # An idle leaf still looks at its parent's board after its early Ending (ids may
                # come back after a failure). The master may meanwhile release everyone: a parent
                # released first leaves its loop with the question unanswered. The Release stays
                # queued for this rank's loop, which reads it next.
                released = m is None and comm.iprobe(MPI.ANY_SOURCE, int(Tag.RELEASE))
            except MPI.Exception as exc:  # (under ULFM: the owner died, or ended the job and exited)
                raise ConnectionError(f"rank {owner} is gone (a board operation got {exc.Get_error_string()})") \
                    from None
            if m is not None:
                payload = m.recv()
                if self.transport.late_reply(owner):
                    continue
                reply = decode(tag, payload)
                assert isinstance(reply, BoardReply)
                return reply.values
            if released:  # (the deputy's Release may only be notice of one to come: the answer may still come)
                self.transport.give_up(owner)
                raise ConnectionError(f"the job was released while rank {owner} had not answered a board operation")
            if owner in self.dead():
                raise ConnectionError(f"rank {owner} died while answering a board operation")
            backoff.wait()

    def close(self, collective: bool) -> None:
        """Nothing to free (kept for symmetry with :class:`WindowBoards`)."""


def now() -> float:
    """Seconds (monotonic), the clock the runtime gives the roles."""
    return time.perf_counter()
