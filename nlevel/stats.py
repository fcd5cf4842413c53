"""Streaming statistics that merge across ranks: task times and request-time parts.

Pure Python. Every rank keeps a :class:`Summary` per quantity; at the end of a run the
summaries are gathered to rank 0 and merged for the report.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import random

__all__ = ["Summary", "RequestTimes"]

_SAMPLE: Final = 512  # values kept per summary for percentiles (reservoir sampling)


class Summary:
    """Count, sum, mean, standard deviation, min, max and approximate percentiles of a stream.

    Welford's update keeps the variance stable; a fixed-size reservoir sample gives
    percentiles without keeping every value. Once the reservoir is full, the values that
    enter it are chosen by Li's Algorithm L (ACM TOMS 20(4), 1994): one random draw per value
    that enters, none for the values skipped (a worker records five values per claim, on
    the path between two tasks).
    """

    __slots__ = ("n", "total", "_mean", "_m2", "lo", "hi", "sample", "cap", "_seed", "_rng_", "_next", "_w")

    def __init__(self, seed: int = 0, cap: int = _SAMPLE) -> None:
        """``cap``: values kept for percentiles (0: none, for huge simulated runs)."""
        self.n = 0
        self.total = 0.0
        self._mean = 0.0
        self._m2 = 0.0
        self.lo = math.inf
        self.hi = -math.inf
        self.sample: list[float] = []
        self.cap = cap
        self._seed = seed
        self._rng_: random.Random | None = None  # made when first needed: most summaries never are
        self._next = 0  # the count at which the next value enters the full reservoir (0: not drawn yet)
        self._w = 1.0  # Algorithm L's running weight

    @property
    def _rng(self) -> random.Random:
        if self._rng_ is None:
            import random  # (here: a farm's first call need not pay for it, and most summaries never draw)

            self._rng_ = random.Random(self._seed)
        return self._rng_

    def add(self, x: float) -> None:
        """Add one value."""
        # Locals instead of repeated attribute updates: every simulated task adds five values.
        n = self.n + 1
        self.n = n
        self.total += x
        mean = self._mean
        d = x - mean
        mean += d / n
        self._mean = mean
        self._m2 += d * (x - mean)
        if x < self.lo:
            self.lo = x
        if x > self.hi:
            self.hi = x
        cap = self.cap
        if cap:
            sample = self.sample
            if len(sample) < cap:
                sample.append(x)
            elif n >= self._next:
                if not self._next:  # (the reservoir has just filled, or was merged: draw afresh)
                    self._w = 1.0
                    self._skip(n - 1)
                    if n < self._next:
                        return
                sample[int(self._rng.random() * cap)] = x
                self._skip(n)

    def _skip(self, n: int) -> None:
        """Algorithm L: after ``n`` values, draw the count at which the next one enters the reservoir."""
        rng = self._rng
        self._w *= math.exp(math.log(rng.random() or 1e-300) / self.cap)
        w = self._w
        self._next = n + 1 + (int(math.log(rng.random() or 1e-300) / math.log1p(-w)) if w < 1.0 else 0)

    def add_many(self, mean: float, n: int, hi: float | None = None) -> None:
        """Add ``n`` values known only by their ``mean`` (and largest, ``hi``): a batch of tasks timed together.

        The variance counts them as ``n`` equal values; the percentile sample gets the mean once.
        """
        if n <= 0:
            return
        top = mean if hi is None or hi < mean else hi
        n0 = self.n
        if n0 == 0:
            self.n, self.total, self._mean, self._m2, self.lo, self.hi = n, mean * n, mean, 0.0, mean, top
        else:
            # (merge() with a summary of n equal values, without building one: every range a
            # worker finishes comes here, on the path between two tasks)
            both = n0 + n
            d = mean - self._mean
            self._m2 += d * d * n0 * n / both
            self._mean += d * n / both
            self.n = both
            self.total += mean * n
            if mean < self.lo:
                self.lo = mean
            if top > self.hi:
                self.hi = top
        if self.cap and len(self.sample) < self.cap:
            self.sample.append(mean)

    def merge(self, other: Summary) -> None:
        """Fold ``other`` into this summary (Chan et al. parallel variance)."""
        if other.n == 0:
            return
        self._next = 0  # (the reservoir's draw starts afresh at the next value)
        if self.n == 0:
            self.n, self.total, self._mean, self._m2 = other.n, other.total, other._mean, other._m2
            self.lo, self.hi, self.sample = other.lo, other.hi, list(other.sample)[: self.cap]
            return
        n = self.n + other.n
        d = other._mean - self._mean
        self._m2 += other._m2 + d * d * self.n * other.n / n
        self._mean += d * other.n / n
        if other.sample:
            mine, theirs = self.sample, other.sample
            if len(mine) + len(theirs) <= self.cap:
                self.sample = mine + theirs  # (both fit: nothing to choose)
            else:
                # Keep the merged sample proportional to the two streams' sizes; a side that
                # fits whole is taken whole (drawing all of a list only shuffles it, at a
                # random draw per value: the end of a job, which every rank waits for, merges
                # every rank's statistics on the master).
                k_other = round(self.cap * other.n / n)
                k_mine = min(len(mine), self.cap - k_other)
                k_other = min(len(theirs), k_other)
                self.sample = (mine if k_mine >= len(mine) else self._rng.sample(mine, k_mine)) + \
                    (list(theirs) if k_other >= len(theirs) else self._rng.sample(theirs, k_other))
        # (else: nothing to add to the sample, and resampling it on every merge would cost
        # O(cap) per report: the simulator merges millions)
        self.n = n
        self.total += other.total
        self.lo = min(self.lo, other.lo)
        self.hi = max(self.hi, other.hi)

    @property
    def mean(self) -> float:
        """Mean of the values (0 when empty)."""
        return self._mean if self.n else 0.0

    @property
    def std(self) -> float:
        """Sample standard deviation (0 for fewer than two values)."""
        return math.sqrt(self._m2 / (self.n - 1)) if self.n > 1 else 0.0

    def quantile(self, q: float) -> float:
        """Approximate ``q``-quantile from the reservoir (0 when empty)."""
        if not self.sample:
            return 0.0
        s = sorted(self.sample)
        return s[min(len(s) - 1, int(q * len(s)))]

    def to_dict(self, scale: float = 1.0) -> dict[str, Any]:
        """Return a JSON-ready dict; values multiplied by ``scale`` (e.g. 1e3 for ms)."""
        if self.n == 0:
            return {"count": 0}
        return {
            "count": self.n,
            "sum": self.total * scale,
            "mean": self.mean * scale,
            "std": self.std * scale,
            "min": self.lo * scale,
            "p50": self.quantile(0.5) * scale,
            "p99": self.quantile(0.99) * scale,
            "max": self.hi * scale,
        }


#: The parts of a request time, as :class:`RequestTimes` names them.
PARTS: Final = ("total", "message", "wait", "dispose")


class RequestTimes:
    """The parts of a child's request time as the paper splits them.

    ``total`` is measured by the child from sending a request to receiving the grant.
    ``dispose`` is the parent's own handling, ``wait`` the time the request sat at the
    parent waiting for ids (residence minus dispose), and ``message`` half of what is
    left: transport both ways plus the time until the parent noticed the request.
    """

    __slots__ = PARTS

    def __init__(self) -> None:
        self.total = Summary(1)
        self.message = Summary(2)
        self.wait = Summary(3)
        self.dispose = Summary(4)

    def add(self, total: float, residence: float, dispose: float) -> None:
        """Record one request from its measured total and the parent's residence and dispose times."""
        self.total.add(total)
        self.message.add(max(0.0, (total - residence) / 2))
        self.wait.add(max(0.0, residence - dispose))
        self.dispose.add(dispose)

    def add_parts(self, total: float, message: float, dispose: float = 0.0) -> None:
        """Record one request measured by its parts: ``message`` (the operations on the wire),
        ``dispose`` (the server's own handling); the rest of ``total`` is waiting."""
        self.total.add(total)
        self.message.add(message)
        self.wait.add(max(0.0, total - message - dispose))
        self.dispose.add(dispose)

    def merge(self, other: RequestTimes) -> None:
        """Fold ``other`` into this one."""
        for name in PARTS:
            getattr(self, name).merge(getattr(other, name))

    def to_dict(self) -> dict[str, Any]:
        """Return the parts in milliseconds."""
        return {name: getattr(self, name).to_dict(1e3) for name in PARTS}
