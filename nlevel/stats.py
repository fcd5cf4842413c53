"""Streaming statistics that merge across ranks: task times and request-time parts.

Pure Python. Every rank keeps a :class:`Summary` per quantity; at the end of a run the
summaries are gathered to rank 0 and merged for the report. Quantiles come from a
DDSketch (Masson et al., VLDB 2019; Datadog's ``ddsketch`` package): every quantile within
:data:`ACCURACY` of the true value, relative, whatever the distribution's tail, and
two sketches merge into exactly the sketch of both streams.
"""

from __future__ import annotations

import math
from typing import Any, Final

from ddsketch import DDSketch
from ddsketch.mapping import LogarithmicMapping

__all__ = ["Summary", "RequestTimes", "Timeline", "ACCURACY", "TIMELINE_BIN", "TIMELINE_MAX"]

#: Relative accuracy of every quantile (a p99 of 40 s is reported within 0.4 s).
ACCURACY: Final = 0.01
#: Seconds per bin of a server's timeline in the run report.
TIMELINE_BIN: Final = 0.1
#: Bins a server keeps at most: past it, its bins double in width (a week's job keeps 2,048, not six million).
TIMELINE_MAX: Final = 2048


#: The sketches' mapping from values to keys (DDSketch's default for ACCURACY).
_MAPPING: Final = LogarithmicMapping(ACCURACY)


class Summary:
    """Count, sum, mean, standard deviation, min, max and quantiles of a stream of values >= 0.

    Welford's update keeps the variance stable; a DDSketch (made at the first value) holds the
    quantiles in buckets of relative width :data:`ACCURACY`, a few hundred for times that span
    six orders of magnitude.
    """

    __slots__ = ("n", "total", "_mean", "_m2", "lo", "hi", "sketch", "quantiles")

    def __init__(self, quantiles: bool = True) -> None:
        """``quantiles``: keep a sketch (False: moments only, for huge simulated runs)."""
        self.n = 0
        self.total = 0.0
        self._mean = 0.0
        self._m2 = 0.0
        self.lo = math.inf
        self.hi = -math.inf
        self.sketch: Any = None
        self.quantiles = quantiles

    def __getstate__(self) -> tuple[Any, ...]:
        # Pickled small: every Ending carries a few summaries up the tree, and a message under MPI's
        # eager limit (4 KB here) needs no rendezvous with a receiver that may not be running. A
        # DDSketch pickles its whole store (128 bins a chunk, mostly empty) and its mapping: 1.8 KB
        # for 300 task times against ~0.3 KB as its first key and the counts of its span of keys.
        sk = self.sketch
        packed: tuple[Any, ...] | None = None
        if sk is not None:
            store = sk._store  # (ddsketch's own serialiser, ddsketch.pb, reads it the same way)
            counts: tuple[float, ...] = ()
            if store.count:
                lo, hi = store.min_key - store.offset, store.max_key - store.offset
                counts = tuple(int(c) if float(c).is_integer() else c for c in store.bins[lo:hi + 1])
            packed = (store.min_key, counts, sk._zero_count)
        return (self.n, self.total, self._mean, self._m2, self.lo, self.hi, self.quantiles, packed)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.n, self.total, self._mean, self._m2, self.lo, self.hi, self.quantiles, packed = state
        self.sketch = None
        if packed is not None:
            first, counts, zeros = packed
            sk = self._sketch()
            key_value = _MAPPING.value
            for i, c in enumerate(counts):
                if c:
                    sk.add(key_value(first + i), c)
            if zeros:
                sk.add(0.0, zeros)

    def _sketch(self) -> Any:
        sk = self.sketch
        if sk is None:
            sk = self.sketch = DDSketch(ACCURACY)
        return sk

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
        if self.quantiles:
            self._sketch().add(x if x > 0.0 else 0.0)

    def add_many(self, mean: float, n: int, hi: float | None = None) -> None:
        """Add ``n`` values known only by their ``mean`` (and largest, ``hi``): a batch of tasks timed together.

        The variance and the quantiles count them as ``n`` equal values.
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
        if self.quantiles:
            self._sketch().add(mean if mean > 0.0 else 0.0, float(n))

    def merge(self, other: Summary) -> None:
        """Fold ``other`` into this summary (Chan et al. parallel variance; the sketches merge exactly)."""
        if other.n == 0:
            return
        if other.sketch is not None and self.quantiles:
            self._sketch().merge(other.sketch)
        if self.n == 0:
            self.n, self.total, self._mean, self._m2 = other.n, other.total, other._mean, other._m2
            self.lo, self.hi = other.lo, other.hi
            return
        n = self.n + other.n
        d = other._mean - self._mean
        self._m2 += other._m2 + d * d * self.n * other.n / n
        self._mean += d * other.n / n
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
        """The ``q``-quantile, within :data:`ACCURACY` (relative), clipped to [min, max]; 0 when empty."""
        if self.sketch is None or not self.n:
            return 0.0
        v = self.sketch.get_quantile_value(q)
        if v is None:
            return 0.0
        return float(min(max(v, self.lo), self.hi))

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

    def __init__(self, quantiles: bool = True) -> None:
        """``quantiles``: keep a sketch of each part (False: moments only, for huge simulated runs)."""
        self.total = Summary(quantiles)
        self.message = Summary(quantiles)
        self.wait = Summary(quantiles)
        self.dispose = Summary(quantiles)

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


class Timeline:
    """How many ranges a server handed out, per bin of wall-clock time (the run report's timeline).

    Bounded: past :data:`TIMELINE_MAX` bins, every two bins merge into one of twice the width.
    """

    __slots__ = ("bins", "width", "_seen")

    def __init__(self) -> None:
        self.bins: dict[int, int] = {}  # wall time // width -> ranges handed out then
        self.width = TIMELINE_BIN  # seconds per bin (doubles as the job goes on)
        self._seen = 0  # the server's count of ranges handed out, as last seen

    def note(self, served: int, wall: float) -> None:
        """The server has handed out ``served`` ranges in all (at wall-clock time ``wall``)."""
        if served > self._seen:
            b = int(wall / self.width)
            self.bins[b] = self.bins.get(b, 0) + served - self._seen
            if len(self.bins) > TIMELINE_MAX:
                coarse: dict[int, int] = {}
                for k, n in self.bins.items():
                    coarse[k // 2] = coarse.get(k // 2, 0) + n
                self.bins, self.width = coarse, 2 * self.width
        self._seen = served

    def restart(self) -> None:
        """A new server on this rank: its count starts from zero."""
        self._seen = 0
