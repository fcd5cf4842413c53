"""Who waits on a simulated board, and for which ticket. Pure Python (compiled with the engine)."""

from __future__ import annotations

import heapq
from typing import Any, Final

__all__ = ["Waiters"]

_heappush: Final = heapq.heappush  # (Final: the compiled build looks it up once)
_heappop: Final = heapq.heappop


class Waiters:
    """The claimers waiting on one board, each with its ticket (-1: none yet).

    A board's publishing wakes those whose ticket it reached, or those without a ticket when
    it has unclaimed slots. Tickets sit in a heap, so that look costs what it wakes, not what
    waits: at 32,768 processes every slave of a two-level job waits on the master's board.
    """

    __slots__ = ("tickets", "heap", "free", "order")

    def __init__(self) -> None:
        self.tickets: dict[int, int] = {}  # waiter -> its ticket, in the order they came
        self.heap: list[tuple[int, int, int]] = []  # (ticket, order, waiter); stale entries skipped
        self.free: dict[int, int] = {}  # waiters without a ticket -> order
        self.order = 0

    def __bool__(self) -> bool:
        return bool(self.tickets)

    def __iter__(self) -> Any:
        return iter(list(self.tickets))

    def clear(self) -> None:
        self.tickets.clear()
        self.heap.clear()
        self.free.clear()

    def add(self, w: int, ticket: int) -> None:
        """``w`` waits for ``ticket`` (or, below 0, for any unclaimed slot)."""
        if self.tickets.get(w) == ticket:
            return
        self.tickets[w] = ticket
        self.order += 1
        if ticket >= 0:
            self.free.pop(w, None)
            _heappush(self.heap, (ticket, self.order, w))
        else:
            self.free[w] = self.order

    def ready(self, tail: int, unclaimed: bool) -> list[int]:
        """Remove and return, in the order they came, the waiters whose ticket is below ``tail``
        (and, when ``unclaimed``, those without one)."""
        go: list[tuple[int, int]] = []
        heap, tickets = self.heap, self.tickets
        while heap and heap[0][0] < tail:
            tk, k, w = _heappop(heap)
            if tickets.get(w) == tk:
                del tickets[w]
                go.append((k, w))
        if unclaimed and self.free:
            for w, k in self.free.items():
                del tickets[w]
                go.append((k, w))
            self.free.clear()
        go.sort()
        return [w for _, w in go]
