"""Suspect ids: held by a computing rank that died, or past ``--task-timeout`` in an earlier run.

One of them may be what killed (or hung) its process. Handed out with the ids beside it, it
would take them along each time: counted as deaths (or timeouts) with it, they would be
quarantined with it although they never ran. So a suspect goes out alone, one per range
(:func:`isolate`), and only on a board whose claimers are this server's own (:func:`among`
finds the suspects a block for a sub-region must leave out). Pure functions over
:class:`~nlevel.ranges.RangeSet`.
"""

from __future__ import annotations

from ..ranges import RangeSet, Ranges

__all__ = ["among", "isolate"]


def among(ids: RangeSet, suspects: RangeSet) -> Ranges:
    """The suspect ids among ``ids``, as ranges."""
    out: list[tuple[int, int]] = []
    for a, b in suspects.ranges():
        out.extend(ids.within(a, b))
    return tuple(out)


def isolate(ranges: Ranges, suspects: RangeSet, most: int, back: RangeSet) -> Ranges:
    """``ranges`` with every suspect id in a range of its own; at most ``most`` ranges, the
    rest added to ``back`` (the queue they came from), whole."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        start = a
        for lo, hi in suspects.within(a, b):
            if start < lo and len(out) < most:
                out.append((start, lo))
                start = lo
            while start < hi and len(out) < most:
                out.append((start, start + 1))
                start += 1
            if len(out) >= most:
                break
        if start < b and len(out) < most:
            out.append((start, b))
            start = b
        if start < b:
            back.add(start, b)  # (no room left on the board: back to the queue, whole)
    return tuple(out)
