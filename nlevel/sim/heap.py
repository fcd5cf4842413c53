"""The simulator's pending events: a binary heap ordered by time, then by scheduling order.

Compiled with the engine (:mod:`nlevel.sim.build`), its comparisons are of two native floats,
where :mod:`heapq` on tuples compared each pair through Python's protocol (a tenth of a
32,768-process simulation). Events are unique by ``(t, seq)``, so any correct heap pops them
in the same order. Interpreted (``--engine python``, the tests) it is the same code, slower
than heapq's C per operation but not measurably in a run (512 processes x 10 tasks: 0.8 s
either way), where the roles' own work dominates. Pure Python.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Event", "push", "pop"]


class Event:
    """One pending event: at ``t``, ``kind`` for rank ``r``; ``seq`` orders events of one instant
    as they were scheduled."""

    __slots__ = ("t", "seq", "kind", "r", "payload")

    def __init__(self, t: float, seq: int, kind: int, r: int, payload: Any) -> None:
        self.t = t
        self.seq = seq
        self.kind = kind
        self.r = r
        self.payload = payload


def push(heap: list[Event], e: Event) -> None:
    """Add ``e`` to the binary heap ``heap`` (ordered by ``(t, seq)``)."""
    heap.append(e)
    pos = len(heap) - 1
    t, seq = e.t, e.seq
    while pos > 0:
        up = (pos - 1) >> 1
        p = heap[up]
        if t < p.t or (t == p.t and seq < p.seq):
            heap[pos] = p
            pos = up
        else:
            break
    heap[pos] = e


def pop(heap: list[Event]) -> Event:
    """Remove and return the earliest event of the non-empty heap ``heap``."""
    last = heap.pop()
    if not heap:
        return last
    top = heap[0]
    n = len(heap)
    t, seq = last.t, last.seq
    pos = 0
    child = 1
    while child < n:
        c = heap[child]
        right = child + 1
        if right < n:
            rc = heap[right]
            if rc.t < c.t or (rc.t == c.t and rc.seq < c.seq):
                child = right
                c = rc
        if c.t < t or (c.t == t and c.seq < seq):
            heap[pos] = c
            pos = child
            child = 2 * pos + 1
        else:
            break
    heap[pos] = last
    return top
