"""Compact sets of task ids as sorted half-open ranges.

Ids are handed out and completed mostly in order, so the set of completed ids of a
run of 10^9 tasks is a handful of ranges, not 10^9 Python ints. Every id
collection in nlevel (the master's pool, what a child holds, the completion record)
is a :class:`RangeSet`; messages carry ranges as tuples of ``(start, stop)`` pairs.
"""

from __future__ import annotations

import bisect
import types
from typing import Final, Iterable, Iterator

__all__ = ["Ranges", "RangeSet", "Tally"]

# (Final: the compiled simulator calls them without looking them up in this module each time)
bisect_left: Final = bisect.bisect_left
bisect_right: Final = bisect.bisect_right

#: Lists this short are searched one item at a time: most sets hold a range or two (what a
#: child holds), and in the compiled simulator a call to :mod:`bisect` cost more than that.
_SHORT: Final = 16

def _after(xs: list[int], x: int, lo: int = 0) -> int:
    """``bisect_right(xs, x, lo)``."""
    n = len(xs)
    if n - lo > _SHORT:
        if not _NATIVE:
            return bisect_right(xs, x, lo)
        hi = n
        while lo < hi:
            mid = (lo + hi) >> 1
            if x < xs[mid]:
                hi = mid
            else:
                lo = mid + 1
        return lo
    while lo < n and xs[lo] <= x:
        lo += 1
    return lo


def _before(xs: list[int], x: int) -> int:
    """``bisect_left(xs, x)``."""
    n = len(xs)
    lo = 0
    if n > _SHORT:
        if not _NATIVE:
            return bisect_left(xs, x)
        hi = n
        while lo < hi:
            mid = (lo + hi) >> 1
            if xs[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        return lo
    while lo < n and xs[lo] < x:
        lo += 1
    return lo


#: Whether this module runs compiled (the simulator's build, :mod:`nlevel.sim.build`: its
#: functions are then not Python functions): a binary search written here is then a loop over
#: native ints, three to ten times as fast as a call to :mod:`bisect` (which compares Python
#: objects); interpreted, :mod:`bisect` is the fast one.
_NATIVE: Final = not isinstance(_after, types.FunctionType)

#: Wire form of an id collection: sorted, disjoint ``(start, stop)`` pairs.
Ranges = tuple[tuple[int, int], ...]


def _bulk(m: int, n: int) -> bool:
    """Whether adding or removing ``m`` ranges to a set of ``n`` is cheaper as one merge.

    One range at a time costs a search, and, when it fills a hole or opens one, a move of
    the tail of both lists (about ``n`` bytes); a merge costs a step per range of both sets.
    """
    return m >= 8 and (m >= 64 or m * 16 >= n)


class RangeSet:
    """A set of non-negative ints kept as sorted, disjoint, non-adjacent ``[start, stop)`` ranges.

    Two parallel lists (starts, stops) keep bisection cheap. Adding a range that
    touches or overlaps existing ones merges them, so the number of ranges stays
    small when ids arrive roughly in order.
    """

    __slots__ = ("_starts", "_stops", "_count")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._stops: list[int] = []
        self._count = 0
        for start, stop in ranges:
            self.add(start, stop)

    @classmethod
    def span(cls, start: int, stop: int) -> RangeSet:
        """Return the set ``[start, stop)``."""
        out = cls()
        out.add(start, stop)
        return out

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __contains__(self, i: int) -> bool:
        k = _after(self._starts, i) - 1
        return k >= 0 and i < self._stops[k]

    def __iter__(self) -> Iterator[int]:
        for start, stop in zip(self._starts, self._stops):
            yield from range(start, stop)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RangeSet):
            return NotImplemented
        return self._starts == other._starts and self._stops == other._stops

    def __repr__(self) -> str:
        shown = ", ".join(f"[{a}, {b})" for a, b in list(self.ranges())[:6])
        more = " ..." if len(self._starts) > 6 else ""
        return f"RangeSet({shown}{more}; {self._count} ids)"

    @property
    def n_ranges(self) -> int:
        """Number of disjoint ranges (the memory footprint is proportional to it)."""
        return len(self._starts)

    def ranges(self) -> Ranges:
        """Return the wire form: a tuple of ``(start, stop)`` pairs."""
        return tuple(zip(self._starts, self._stops))

    def first(self) -> int:
        """Return the smallest id. Raises IndexError when empty."""
        return self._starts[0]

    def add(self, start: int, stop: int) -> int:
        """Add ``[start, stop)``; return how many of its ids were not already present."""
        if stop <= start:
            return 0
        starts, stops = self._starts, self._stops
        # Fast paths: ids arrive mostly in order, at or after the last range.
        if not starts or start > stops[-1]:
            starts.append(start)
            stops.append(stop)
            self._count += stop - start
            return stop - start
        if start >= starts[-1]:
            last = stops[-1]
            if stop <= last:
                return 0
            stops[-1] = stop
            self._count += stop - last
            return stop - last
        # Ranges [lo, hi) touch or overlap [start, stop): lo is the first whose stop >= start,
        # hi the first whose start > stop. One search on a large set (the master's ledger has a
        # range per hole left by tasks still running), then the neighbours.
        n = len(starts)
        k = _after(starts, start)  # ranges [0, k) start at or before `start`
        if k and stops[k - 1] >= start:
            if stops[k - 1] >= stop:
                return 0  # already there
            lo = k - 1
        else:
            lo = k
        if k < n and starts[k] <= stop:
            hi = k + 1 if k + 1 == n or starts[k + 1] > stop else _after(starts, stop, k)
        else:
            hi = k
        if lo == hi:
            starts.insert(lo, start)
            stops.insert(lo, stop)
            self._count += stop - start
            return stop - start
        # Usually one or two ranges (a gap filled between neighbours): plain loops, no generators.
        covered = 0
        removed = 0
        for k in range(lo, hi):
            a = starts[k]
            b = stops[k]
            covered += (b if b < stop else stop) - (a if a > start else start)
            removed += b - a
        if covered < 0:
            covered = 0
        a = starts[lo]
        new_start = start if start < a else a
        b = stops[hi - 1]
        new_stop = stop if stop > b else b
        if hi - lo == 1:
            starts[lo] = new_start
            stops[lo] = new_stop
        else:
            starts[lo:hi] = [new_start]
            stops[lo:hi] = [new_stop]
        self._count += (new_stop - new_start) - removed
        return (stop - start) - covered

    def add_ranges(self, ranges: Iterable[tuple[int, int]]) -> int:
        """Add every range; return the number of ids that were new."""
        if isinstance(ranges, (tuple, list)) and _bulk(len(ranges), len(self._starts)):
            return self._merge_add(sorted(ranges))
        new = 0
        for a, b in ranges:
            new += self.add(a, b)  # (a method, not a local alias: compiled, that is a direct call)
        return new

    def remove(self, start: int, stop: int) -> int:
        """Remove ``[start, stop)``; return how many ids were actually removed."""
        if stop <= start or not self._starts:
            return 0
        starts, stops = self._starts, self._stops
        lo = _after(stops, start)  # first range with stop > start
        hi = _before(starts, stop)  # ranges [lo, hi) overlap [start, stop)
        if lo >= hi:
            return 0
        if hi - lo == 1:
            # One range touched (a child's finished id, mostly): edit it in place.
            a, b = starts[lo], stops[lo]
            if a >= start:
                if b <= stop:
                    del starts[lo], stops[lo]
                    removed = b - a
                else:
                    starts[lo] = stop
                    removed = stop - a
            elif b <= stop:
                stops[lo] = start
                removed = b - start
            else:
                stops[lo] = start
                starts.insert(lo + 1, stop)
                stops.insert(lo + 1, b)
                removed = stop - start
            self._count -= removed
            return removed
        new_starts: list[int] = []
        new_stops: list[int] = []
        removed = 0
        for k in range(lo, hi):
            a, b = starts[k], stops[k]
            removed += min(b, stop) - max(a, start)
            if a < start:
                new_starts.append(a)
                new_stops.append(start)
            if b > stop:
                new_starts.append(stop)
                new_stops.append(b)
        starts[lo:hi] = new_starts
        stops[lo:hi] = new_stops
        self._count -= removed
        return removed

    def remove_ranges(self, ranges: Iterable[tuple[int, int]]) -> int:
        """Remove every range; return the number of ids removed."""
        if isinstance(ranges, (tuple, list)) and _bulk(len(ranges), len(self._starts)):
            return self._merge_remove(sorted(r for r in ranges if r[1] > r[0]))
        removed = 0
        for a, b in ranges:
            removed += self.remove(a, b)
        return removed

    # -- many ranges at once: one pass over both lists instead of a search and a list
    # insertion (a move of the whole tail) per range. A region-master's batch of 1,024
    # completions reaches a ledger with thousands of holes as hundreds of ranges.
    def _merge_add(self, ranges: list[tuple[int, int]]) -> int:
        starts, stops = self._starts, self._stops
        ns: list[int] = []
        ne: list[int] = []
        n, m = len(starts), len(ranges)
        i = j = 0
        while i < n or j < m:
            if j >= m or (i < n and starts[i] <= ranges[j][0]):
                a, b = starts[i], stops[i]
                i += 1
            else:
                a, b = ranges[j]
                j += 1
                if b <= a:
                    continue
            if ns and a <= ne[-1]:  # touches or overlaps the last range: merge
                if b > ne[-1]:
                    ne[-1] = b
            else:
                ns.append(a)
                ne.append(b)
        before = self._count
        count = 0
        for a, b in zip(ns, ne):
            count += b - a
        self._starts, self._stops, self._count = ns, ne, count
        return count - before

    def _merge_remove(self, ranges: list[tuple[int, int]]) -> int:
        ns: list[int] = []
        ne: list[int] = []
        m = len(ranges)
        j = 0
        count = 0
        for a, b in zip(self._starts, self._stops):
            while j < m and ranges[j][1] <= a:
                j += 1  # removals wholly before this range
            cur = a  # ids of [a, b) from here on are not removed yet
            k = j
            while k < m and ranges[k][0] < b:
                ra, rb = ranges[k]
                if ra > cur:
                    ns.append(cur)
                    ne.append(ra)
                    count += ra - cur
                if rb > cur:
                    cur = rb
                if rb >= b:
                    break  # it may reach into the next range too
                k += 1
            j = k
            if cur < b:
                ns.append(cur)
                ne.append(b)
                count += b - cur
        removed = self._count - count
        self._starts, self._stops, self._count = ns, ne, count
        return removed

    def take(self, n: int) -> Ranges:
        """Remove and return up to ``n`` of the smallest ids, as ranges."""
        out: list[tuple[int, int]] = []
        starts, stops = self._starts, self._stops
        while n > 0 and starts:
            a, b = starts[0], stops[0]
            if b - a <= n:
                out.append((a, b))
                del starts[0], stops[0]
                n -= b - a
                self._count -= b - a
            else:
                out.append((a, a + n))
                starts[0] = a + n
                self._count -= n
                n = 0
        return tuple(out)

    def pop_range(self) -> tuple[int, int]:
        """Remove and return the first range whole. Raises IndexError when empty."""
        a, b = self._starts.pop(0), self._stops.pop(0)
        self._count -= b - a
        return a, b

    def take_pieces(self, size: int, n: int) -> Ranges:
        """Remove and return up to ``n`` pieces of at most ``size`` ids each, from the smallest ids.

        A piece never spans a gap: each is one contiguous range.
        """
        out: list[tuple[int, int]] = []
        starts, stops = self._starts, self._stops
        while len(out) < n and starts:
            a, b = starts[0], stops[0]
            if b - a <= size:
                out.append((a, b))
                del starts[0], stops[0]
                self._count -= b - a
            else:
                k = min(n - len(out), (b - a) // size)
                out.extend((a + i * size, a + (i + 1) * size) for i in range(k))
                self._count -= k * size
                if a + k * size == b:
                    del starts[0], stops[0]
                else:
                    starts[0] = a + k * size
        return tuple(out)

    def pop(self) -> int:
        """Remove and return the smallest id. Raises IndexError when empty."""
        starts = self._starts
        a = starts[0]
        if self._stops[0] == a + 1:
            del starts[0], self._stops[0]
        else:
            starts[0] = a + 1
        self._count -= 1
        return a

    def overlap(self, start: int, stop: int) -> int:
        """Return how many ids of ``[start, stop)`` are in the set."""
        starts, stops = self._starts, self._stops
        lo = _after(stops, start)
        hi = _before(starts, stop)
        n = 0
        for k in range(lo, hi):  # (a loop, not sum() of a generator: a server asks this per report)
            a, b = starts[k], stops[k]
            n += (b if b < stop else stop) - (a if a > start else start)
        return n

    def within(self, start: int, stop: int) -> Ranges:
        """Return the set's ranges that meet ``[start, stop)``, clipped to it."""
        starts, stops = self._starts, self._stops
        lo = _after(stops, start)
        hi = _before(starts, stop)
        return tuple((max(starts[k], start), min(stops[k], stop)) for k in range(lo, hi))

    def complement(self, total: int) -> RangeSet:
        """Return ``[0, total)`` minus this set."""
        out = RangeSet()
        prev = 0
        for a, b in zip(self._starts, self._stops):
            if a >= total:
                break
            out.add(prev, a)
            prev = b
        out.add(prev, total)
        return out

    def copy(self) -> RangeSet:
        """Return an independent copy."""
        out = RangeSet()
        out._starts = list(self._starts)
        out._stops = list(self._stops)
        out._count = self._count
        return out


class Tally:
    """How many times each id was counted (e.g. deaths of processes that held it), as ranges.

    ``levels[k]`` holds the ids counted more than ``k`` times, so adding a count to a million
    ids held as one range costs a few range operations, and memory grows with the ranges of
    ids ever counted, never with the ids themselves (a dead region-master held 10^8).
    """

    __slots__ = ("levels",)

    def __init__(self, levels: Iterable[Ranges] = ()) -> None:
        self.levels: list[RangeSet] = [RangeSet(r) for r in levels]

    def __bool__(self) -> bool:
        return bool(self.levels) and bool(self.levels[0])

    def add(self, ids: Ranges, times: int = 1) -> None:
        """Count each id of ``ids`` ``times`` more."""
        for _ in range(times):
            levels = self.levels
            levels.append(RangeSet())
            for k in range(len(levels) - 1, 0, -1):  # (top down: each id moves up one level)
                below = levels[k - 1]
                for a, b in ids:
                    levels[k].add_ranges(below.within(a, b))
            levels[0].add_ranges(ids)
            if not levels[-1]:
                levels.pop()

    def count(self, tid: int) -> int:
        """How many times ``tid`` was counted."""
        n = 0
        for level in self.levels:
            if tid not in level:
                break
            n += 1
        return n

    def at_least(self, n: int, ids: Ranges | None = None) -> RangeSet:
        """The ids counted at least ``n`` times (among ``ids``, when given)."""
        if n <= 0 or n > len(self.levels):
            return RangeSet()
        level = self.levels[n - 1]
        if ids is None:
            return level.copy()
        out = RangeSet()
        for a, b in ids:
            out.add_ranges(level.within(a, b))
        return out

    def raise_to(self, other: Tally) -> None:
        """Each id's count becomes the larger of its two counts (a copy made elsewhere)."""
        for k, level in enumerate(other.levels):
            if k == len(self.levels):
                self.levels.append(RangeSet())
            self.levels[k].add_ranges(level.ranges())

    def set_at_least(self, tid: int, n: int) -> None:
        """Count ``tid`` at least ``n`` times."""
        while len(self.levels) < n:
            self.levels.append(RangeSet())
        for k in range(n):
            self.levels[k].add(tid, tid + 1)

    def forget(self, ids: Ranges) -> None:
        """Drop the counts of ``ids`` (they succeeded)."""
        for level in self.levels:
            level.remove_ranges(ids)
        while self.levels and not self.levels[-1]:
            self.levels.pop()

    def ranges(self) -> tuple[Ranges, ...]:
        """The levels as ranges (for a message or a copy)."""
        return tuple(level.ranges() for level in self.levels)

    def copy(self) -> Tally:
        """An independent copy."""
        return Tally(self.ranges())
