"""A server's board: the ids it offers its children, taken with one-sided atomic operations.

Pure Python (no numpy: a farm's first call need not import it): the algorithms here run
against a :class:`Memory` of int64 words, which the runtime backs with an MPI window
(:mod:`nlevel.runtime.window`), and the simulator, the tests and the two-sided fallback
with a local array (:class:`LocalMemory`).

Layout of one board (``K`` slots)::

    word 0      HEAD   tickets handed out (low 40 bits; a claimer fetch-and-adds it) and
                       the board's epoch (the bits above: the plan it serves)
    word 1      TAIL   tickets published so far, with the FINAL, CLOSED and ALL_OUT flags
    word 2..3   (reserved)
    word 4..    the ring: slot ``t % K`` holds ticket ``t``

A slot holds EMPTY, a published range of ids packed into one word, or the marker of
the rank that claimed it. The protocol:

* **Publish** (owner). The owner writes ranges into EMPTY slots at tickets
  ``tail, tail + 1, ...`` and then raises TAIL.
* **Claim** (a child, or the owner's own worker). ``t = fetch_add(HEAD, 1)`` gives the
  claimer ticket ``t``; it reads slot ``t % K`` and, if it holds a range, swaps in its
  marker with compare-and-swap. A claim is conditional on the exact range read, so no
  interleaving can give one range to two claimers or overwrite another's marker.
* **Scan** (owner). Slots below ``min(HEAD, TAIL)`` that hold a marker are attributed
  to that rank (the owner then knows exactly what each child holds, which is what it
  must take back if the child dies) and emptied for the next lap.
* **Limbo.** A ticket whose slot still holds its range although HEAD has passed it was
  fetched but not yet swapped: its claimer is between its two operations (a few µs),
  or died there. The owner may take such a range back at any time with compare-and-swap
  (:meth:`Owner.reclaim`): whichever of the two swaps comes first wins, so nothing is
  lost or doubled; a claimer that loses simply claims again.
* **Epochs.** A board serves one epoch of the plan at a time; its owner raises the
  epoch in HEAD when it starts serving a new one. A claimer compares the epoch its
  fetch-and-add returned with its own: a claimer behind (it has not switched plans
  yet) or ahead (the owner has not) gives its ticket up (``"stale"``) and looks at its
  messages; the ticket, never swapped, ends in limbo and is taken back.
* **Final / closed.** FINAL in TAIL: nothing will ever be published again (a claimer
  whose slot is EMPTY is done). CLOSED: this board is being retired (the plan changed);
  a claimer looks for its new parent.
* **All out.** ALL_OUT in TAIL (the master's boards): everything is published and the
  rest is out running; ids come back only after a failure or a leaver, FINAL comes when
  the last completion is in. A claimer that finds its slot EMPTY learns it (``"all-out"``):
  a leaf may then send its part of the end early (:mod:`nlevel.roles.ending`). Unlike
  the other two flags it goes down again (ids came back).

A range is packed as ``start << LEN_BITS | length`` (ids below 2**42, up to 2**20 - 1 ids
per slot), with the SUSPECT bit set for one id that may have killed a process (see
:mod:`nlevel.roles.suspects`); EMPTY is -1 and the marker of rank ``r`` is ``-2 - r``: every
packed range is >= 0, every other value negative.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Final, Protocol, Sequence

__all__ = [
    "HEAD", "TAIL", "HEADER", "FINAL", "CLOSED", "ALL_OUT", "EMPTY", "LEN_BITS", "MAX_ID", "MAX_LEN", "SUSPECT",
    "TICKET_BITS",
    "marker", "pack", "unpack", "words",
    "Memory", "Boards", "LocalMemory", "Claim", "Claimer", "Owner",
]

HEAD: Final = 0
TAIL: Final = 1
HEADER: Final = 4  # words before the ring
FINAL: Final = 1 << 62
CLOSED: Final = 1 << 61
ALL_OUT: Final = 1 << 60
_ENDS: Final = FINAL | CLOSED
_FLAGS: Final = FINAL | CLOSED | ALL_OUT
EMPTY: Final = -1
LEN_BITS: Final = 20
MAX_LEN: Final = (1 << LEN_BITS) - 1
MAX_ID: Final = 1 << 42
_START: Final = MAX_ID - 1
#: A packed range's flag: one suspect id. Its claimer reports it as soon as it has run: a finished
#: id waiting in a batch (up to ``--report-age``) is still held by the process, and a death then
#: would count against it although it ran (three slaves killed 0.2 s apart quarantined one so).
SUSPECT: Final = 1 << 62
TICKET_BITS: Final = 40
_TICKETS: Final = (1 << TICKET_BITS) - 1


def marker(rank: int) -> int:
    """The value a claim by ``rank`` leaves in a slot (negative, distinct from EMPTY)."""
    return -2 - rank


def pack(start: int, length: int, suspect: bool = False) -> int:
    """One slot's value for the ids ``[start, start + length)`` (``suspect``: with :data:`SUSPECT`)."""
    return (start << LEN_BITS) | length | (SUSPECT if suspect else 0)


def unpack(value: int) -> tuple[int, int]:
    """``(start, stop)`` of a packed range."""
    start = (value >> LEN_BITS) & _START
    return start, start + (value & MAX_LEN)


def words(slots: int) -> int:
    """Words one board of ``slots`` slots takes."""
    return HEADER + slots


class Memory(Protocol):
    """Atomic operations on the int64 words of one board (each atomic per word).

    An operation on a board whose owner is gone may raise ``ConnectionError`` (a board reached
    by messages: no reply will come); a claimer then waits for the news of the death.
    """

    def fetch_add(self, index: int, n: int) -> int:
        """Add ``n`` to word ``index``; return its value before."""

    def get(self, index: int) -> int:
        """Return word ``index``."""

    def read(self, index: int, count: int) -> list[int]:
        """Return a copy of ``count`` words from ``index``."""

    def write(self, index: int, values: Sequence[int]) -> None:
        """Store ``values`` at ``index``, ``index + 1``, ..."""

    def put(self, index: int, value: int) -> None:
        """Store ``value`` at ``index``."""

    def cas(self, index: int, expected: int, new: int) -> int:
        """Compare-and-swap word ``index``; return its value before."""


class Boards(Protocol):
    """Where the boards are: the memory of rank ``rank``'s board ``kind`` (an MPI window, or local)."""

    def __call__(self, rank: int, kind: int) -> Memory: ...

    def slots(self, kind: int) -> int:
        """Ring size of boards of ``kind``."""
        ...


class LocalMemory:
    """A board's words in local memory (tests, the simulator, the two-sided fallback).

    A Python list: the single-word operations a claim makes are several times cheaper on
    it than on a numpy array (the simulator makes millions); :meth:`read` returns a list too.

    Args:
        slots: Ring slots.
    """

    def __init__(self, slots: int) -> None:
        self.words = [0] * HEADER + [EMPTY] * slots

    def fetch_add(self, index: int, n: int) -> int:
        words = self.words
        old = words[index]
        words[index] = old + n
        return old

    def get(self, index: int) -> int:
        return self.words[index]

    def read(self, index: int, count: int) -> list[int]:
        return self.words[index : index + count]

    def write(self, index: int, values: Sequence[int]) -> None:
        self.words[index : index + len(values)] = [int(v) for v in values]

    def put(self, index: int, value: int) -> None:
        self.words[index] = value

    def cas(self, index: int, expected: int, new: int) -> int:
        words = self.words
        old = words[index]
        if old == expected:
            words[index] = new
        return old


@dataclass(frozen=True, slots=True)
class Claim:
    """What one claim got.

    Attributes:
        start, stop: The ids ``[start, stop)`` (empty when ``start == stop``).
        status: ``"ids"``; ``"lost"`` (the ticket yielded nothing: claim again);
            ``"wait"`` (nothing published for the ticket yet: take it again later);
            ``"all-out"`` (the same, on a board whose owner has published everything);
            ``"final"`` (nothing will ever come from this board); ``"closed"`` (this board
            is retired: the claimer's parent changed); ``"stale"`` (the board serves
            another epoch than the claimer's).
        suspect: The range is one suspect id (published with :data:`SUSPECT`).
    """

    start: int
    stop: int
    status: str
    suspect: bool = False  # (one id that may have killed a process: report it as soon as it has run)


_WAIT: Final = Claim(0, 0, "wait")
_ALL_OUT: Final = Claim(0, 0, "all-out")
_LOST: Final = Claim(0, 0, "lost")
_FINAL: Final = Claim(0, 0, "final")
_CLOSED: Final = Claim(0, 0, "closed")
_STALE: Final = Claim(0, 0, "stale")


class Claimer:
    """One rank's claims on one board: at most one ticket outstanding.

    Args:
        rank: The claiming rank (its marker goes into the slots it takes).
        slots: The board's ring size.
        epoch: The plan epoch the claimer is in.
    """

    __slots__ = ("mark", "slots", "epoch", "ticket", "claims", "lost")

    def __init__(self, rank: int, slots: int, epoch: int = 0) -> None:
        self.mark = marker(rank)
        self.slots = slots
        self.epoch = epoch
        self.ticket = -1  # the ticket held and not yet taken (-1: none)
        self.claims = 0
        self.lost = 0

    def claim(self, mem: Memory) -> Claim:
        """Take the next range: a new ticket, or the one still waiting."""
        if self.ticket < 0:
            raw = mem.fetch_add(HEAD, 1)
            self.claims += 1
            if raw >> TICKET_BITS != self.epoch:
                self.lost += 1
                return _STALE  # (the ticket is given up: the owner takes it back from limbo)
            self.ticket = raw & _TICKETS
        return self._take(mem)

    def _take(self, mem: Memory) -> Claim:
        t = self.ticket
        index = HEADER + t % self.slots
        value = mem.get(index)
        if value == EMPTY:
            tail = mem.get(TAIL)
            if tail & _ENDS and mem.get(HEAD) >> TICKET_BITS != self.epoch:
                self.ticket = -1  # the flag is a newer epoch's: this claimer has not switched yet
                self.lost += 1
                return _STALE
            if tail & CLOSED:
                return _CLOSED
            if (tail & ~_FLAGS) <= t:
                if tail & FINAL:
                    return _FINAL
                return _ALL_OUT if tail & ALL_OUT else _WAIT  # (ticket kept for the next try)
            value = mem.get(index)  # published just after the first read?
            if value == EMPTY:
                self.ticket = -1  # taken back by the owner: claim anew
                self.lost += 1
                return _FINAL if tail & FINAL else _LOST
        if value < 0:  # another's marker: a stale ticket (the ring went round)
            self.ticket = -1
            self.lost += 1
            return _LOST
        if mem.cas(index, value, self.mark) != value:
            self.ticket = -1  # the owner took it back between our read and our swap
            self.lost += 1
            return _LOST
        self.ticket = -1
        start, stop = unpack(value)
        return Claim(start, stop, "ids", value >= SUSPECT)

    def abandon(self) -> int:
        """Give up the ticket still waiting (the claimer leaves this board); return it, or -1."""
        t, self.ticket = self.ticket, -1
        return t


class Owner:
    """The owner's side of its board: publishing, attributing claims, taking ranges back.

    Everything the owner knows lives here, in local memory; the board holds only what
    claimers need. What a call learns goes to two outboxes the caller empties:
    :attr:`claimed` (``(rank, start, stop)``: that rank took those ids) and
    :attr:`returned` (ranges taken back from the board: the owner's again).

    Args:
        slots: Ring size.
    """

    def __init__(self, slots: int) -> None:
        self.epoch = 0
        self.slots = slots
        # The packed range published in each slot. A list: the owner reads and empties a few slots
        # at a time, where a numpy array's per-element cost (a scalar object each) was 5 % of a
        # 32,768-rank simulation.
        self.pub = [EMPTY] * slots
        self.tail = 0  # next ticket to publish
        self.scanned = 0  # tickets below are attributed, taken back, or in limbo
        self.limbo: dict[int, float] = {}  # ticket -> when first seen fetched but not swapped
        self.flags = 0
        self.head = 0  # HEAD as the last scan read it
        self.on_board = 0  # ids published and not yet claimed or taken back
        self.claimed: list[tuple[int, int, int]] = []
        self.returned: list[tuple[int, int]] = []
        self._dirty = False  # published for tickets already fetched: look at them on the next scan

    @property
    def waiting(self) -> int:
        """Tickets fetched beyond what is published (at the last scan): claimers waiting for ids."""
        return max(0, self.head - self.tail)

    @property
    def unclaimed_slots(self) -> int:
        """Published slots no ticket had reached at the last scan."""
        return max(0, self.tail - max(self.head, self.scanned))

    def start(self, mem: Memory, epoch: int) -> None:
        """Start serving epoch ``epoch`` on a board whose words may hold an earlier owner's state.

        Ticket numbers go on from what HEAD and TAIL hold; the epoch bits of HEAD are
        raised (compare-and-swap against claimers' fetch-and-adds) and CLOSED goes down.
        """
        self.epoch = epoch
        while True:
            raw = mem.get(HEAD)
            if mem.cas(HEAD, raw, (epoch << TICKET_BITS) | (raw & _TICKETS)) == raw:
                break
        tail = mem.get(TAIL) & ~_FLAGS
        start = max(raw & _TICKETS, tail)
        self.tail = self.scanned = self.head = start
        self._dirty = False
        self.flags = 0
        self.pub[:] = [EMPTY] * self.slots
        self.limbo.clear()
        self.on_board = 0
        mem.put(TAIL, start)

    def close(self, mem: Memory, flags: int, now: float) -> None:
        """Retire the board (CLOSED) or end it (FINAL): take every published range back, attribute the rest.

        Afterwards no slot holds a range, so no claim can succeed any more; what was
        swapped meanwhile is in :attr:`claimed`, what was taken back in :attr:`returned`.
        The last look is a full one: a waiting claimer swaps without moving HEAD, and a claim
        left unattributed when the board retires is in nobody's account.
        """
        self.set_flags(mem, flags)
        self.scan(mem, now)
        self.reclaim(mem, now)
        self.take_back_unclaimed(mem)
        self.scan(mem, now, full=True)

    # -- publishing -----------------------------------------------------------------
    def room(self) -> int:
        """Slots free for publishing now."""
        return self.slots - (self.tail - self.scanned)

    def publish(self, mem: Memory, ranges: list[tuple[int, int]], suspects: Collection[int] = ()) -> None:
        """Publish ``ranges`` (each ``0 < stop - start <= MAX_LEN``, at most :meth:`room` of them);
        a range starting at one of ``suspects`` is published with :data:`SUSPECT`.

        A slot still in limbo from the last lap is taken back first (to :attr:`returned`),
        or attributed if its claimer swapped meanwhile.
        """
        n = len(ranges)
        if not n:
            return
        if n > self.room():
            raise ValueError(f"publishing {n} ranges into a board with room for {self.room()}")
        if self.limbo:
            for k in range(n):
                t = self.tail + k - self.slots
                if t in self.limbo:
                    self._settle(mem, t, take=True)
        if self.tail < self.head:
            self._dirty = True  # waiting claimers hold these tickets: they swap without moving HEAD
        if n == 1:  # (the usual top-up: one put)
            pub, slots, tail = self.pub, self.slots, self.tail
            for k, (a, b) in enumerate(ranges):
                v = (a << LEN_BITS) | (b - a)
                if suspects and a in suspects:
                    v |= SUSPECT
                j = (tail + k) % slots
                pub[j] = v
                mem.put(HEADER + j, v)
                self.on_board += b - a
            self.tail = tail + n
            mem.put(TAIL, self.tail | self.flags)
            return
        arr = [pack(a, b - a, bool(suspects) and a in suspects) for a, b in ranges]
        first = self.tail % self.slots
        cut = min(n, self.slots - first)
        self.pub[first : first + cut] = arr[:cut]
        mem.write(HEADER + first, arr[:cut])
        if cut < n:
            self.pub[: n - cut] = arr[cut:]
            mem.write(HEADER, arr[cut:])
        self.tail += n
        self.on_board += sum(b - a for a, b in ranges)
        mem.put(TAIL, self.tail | self.flags)

    def set_flags(self, mem: Memory, flags: int) -> None:
        """Raise FINAL and/or CLOSED (they never go down)."""
        self.flags |= flags
        mem.put(TAIL, self.tail | self.flags)

    @property
    def ended(self) -> bool:
        """Whether FINAL or CLOSED is up: nothing more is published here."""
        return bool(self.flags & _ENDS)

    def set_all_out(self, mem: Memory, out: bool) -> None:
        """Raise or lower ALL_OUT (see the module docstring)."""
        flags = self.flags | ALL_OUT if out else self.flags & ~ALL_OUT
        if flags != self.flags:
            self.flags = flags
            mem.put(TAIL, self.tail | flags)

    # -- attributing ----------------------------------------------------------------
    def scan(self, mem: Memory, now: float, full: bool = False) -> None:
        """Attribute what was claimed since the last scan (to :attr:`claimed`); empty those slots.

        Usually one read of HEAD: the slots are read only when tickets were fetched since the
        last scan, or published for tickets fetched earlier (waiting claimers). A claimer whose
        ticket waited while the ring went round may take a later lap's range (it is
        conditional, so that is safe) without moving HEAD: ``full`` reads every published slot
        not yet attributed (a server does before it acts on a report it cannot explain, and on
        its periodic tick). Tickets fetched but not yet swapped go to :attr:`limbo`, with when
        they were first seen, and are looked at again on the next scan.
        """
        head = mem.get(HEAD) & _TICKETS
        moved = head != self.head or self._dirty
        self.head = head
        self._dirty = False
        if self.limbo:
            for t in list(self.limbo):
                self._settle(mem, t, take=False)
        if not (moved or full):
            return
        lo = self.scanned
        upto = self.tail if full else min(head, self.tail)
        pub = self.pub
        while lo < upto:
            first = lo % self.slots
            n = min(upto - lo, self.slots - first)
            got = mem.read(HEADER + first, n)
            if lo + n > head:
                # Slots no ticket has reached (a full scan's usual case: what is on the board)
                # hold what was published unless a lapped claimer swapped one: one comparison of
                # two lists instead of a look at each packed range.
                reached = head - lo if head > lo else 0
                if got[reached:] == pub[first + reached : first + n]:
                    if not reached:
                        lo += n
                        continue
                    got = got[:reached]  # (read whole all the same: the simulator counts the reads)
            if n <= 32:
                self._scan_few(mem, lo, first, got, head, now)
            else:
                self._scan_many(mem, lo, first, got, head, now)
            lo += n
        self.scanned = max(self.scanned, min(head, self.tail))

    def _scan_few(self, mem: Memory, lo: int, first: int, vals: list[int], head: int, now: float) -> None:
        """:meth:`scan` of a short run of slots: each emptied slot is one write."""
        pub = self.pub
        for k, v in enumerate(vals):
            if v < EMPTY:
                p = pub[first + k]
                start = (p >> LEN_BITS) & _START
                self.claimed.append((-2 - v, start, start + (p & MAX_LEN)))
                self.on_board -= p & MAX_LEN
                pub[first + k] = EMPTY
                mem.put(HEADER + first + k, EMPTY)
            elif v >= 0 and lo + k < head:
                self.limbo.setdefault(lo + k, now)

    def _scan_many(self, mem: Memory, lo: int, first: int, vals: list[int], head: int, now: float) -> None:
        """:meth:`scan` of a long run of slots: the emptied slots are written a run of adjacent ones at a time."""
        pub, claimed = self.pub, [k for k, v in enumerate(vals) if v < EMPTY]
        for k in claimed:
            p = pub[first + k]
            start = (p >> LEN_BITS) & _START
            self.claimed.append((-2 - vals[k], start, start + (p & MAX_LEN)))
            self.on_board -= p & MAX_LEN
            pub[first + k] = EMPTY
        for run_first, run_len in _runs(claimed):
            mem.write(HEADER + first + run_first, [EMPTY] * run_len)
        if lo < head:
            for k, v in enumerate(vals[: head - lo]):
                if v >= 0:
                    self.limbo.setdefault(lo + k, now)

    def _settle(self, mem: Memory, t: int, take: bool) -> None:
        """Look at limbo ticket ``t`` again: attribute it if swapped; with ``take``, else take it back."""
        j = t % self.slots
        v = self.pub[j]
        now = mem.get(HEADER + j)
        if now == v and take:
            now = mem.cas(HEADER + j, v, EMPTY)
            if now == v:
                self.returned.append(unpack(v))
                self.on_board -= v & MAX_LEN
                self.pub[j] = EMPTY
                del self.limbo[t]
                return
        if now < EMPTY:
            start, stop = unpack(v)
            self.claimed.append((-2 - now, start, stop))
            self.on_board -= stop - start
            self.pub[j] = EMPTY
            mem.put(HEADER + j, EMPTY)
            del self.limbo[t]

    def reclaim(self, mem: Memory, older_than: float) -> None:
        """Take back (to :attr:`returned`) limbo ranges first seen at or before ``older_than``.

        Safe at any moment: compare-and-swap against the claimer's; one of the two wins.
        """
        if not self.limbo:
            return  # (the usual case: a server asks on every look)
        for t, seen in list(self.limbo.items()):
            if seen <= older_than:
                self._settle(mem, t, take=True)

    def published(self) -> list[tuple[int, int]]:
        """The ranges published and not yet attributed (unclaimed, or in limbo)."""
        return [unpack(v) for v in self.pub if v >= 0]

    def take_back_unclaimed(self, mem: Memory, lower: bool = False) -> None:
        """Take back (to :attr:`returned`) every published range no ticket has reached yet.

        For closing or finishing a board: raise the flag first, so that a claimer whose
        ticket now finds EMPTY learns why. Fetched-but-unswapped tickets above the last
        scan are taken back too (safe, as in :meth:`reclaim`); swapped ones are left to
        the next scan.

        ``lower``: then bring TAIL down over the emptied slots no ticket had reached (HEAD read
        first), so that the next ranges go to those tickets again; left up, TAIL marks a hole
        of EMPTY slots that claimers fetch their way through, one lost claim per ticket. A
        claimer fetching one of them meanwhile finds it above TAIL and waits for it, or gives it
        up as lost (a range later published for it is in limbo, taken back after the grace).
        """
        head = mem.get(HEAD) & _TICKETS if lower else 0
        pub, slots = self.pub, self.slots
        for t in range(self.scanned, self.tail):
            j = t % slots
            v = pub[j]
            if v >= 0 and mem.cas(HEADER + j, v, EMPTY) == v:
                self.returned.append(unpack(v))
                self.on_board -= v & MAX_LEN
                pub[j] = EMPTY
        if lower:
            floor, tail = max(self.scanned, head), self.tail
            while tail > floor and pub[(tail - 1) % slots] == EMPTY:
                tail -= 1
            if tail < self.tail:
                self.tail = tail
                mem.put(TAIL, tail | self.flags)


def _runs(idx: list[int]) -> list[tuple[int, int]]:
    """Contiguous runs of sorted indices as (first, length)."""
    runs: list[tuple[int, int]] = []
    for i in idx:
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs
