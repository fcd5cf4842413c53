"""The master's record of committed task ids and their results.

Committing an id twice is counted (``recomputed``) but records it once, and its second
result is dropped: the completion record and the results are exactly-once. Ids are a
:class:`~nlevel.ranges.RangeSet` and results live in flat typed arrays, so memory
grows with the number of id ranges and results, not with ``total``. Pure Python.

A ledger that :meth:`~Ledger.track`-s its changes tells the checkpoint what is new since it last
asked (:meth:`~Ledger.changes`, a :class:`Changes`), so a write appends what is new instead of
rewriting everything.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from ..ranges import Ranges, RangeSet
from .messages import TaskFailure

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Changes", "Ledger"]


def _coalesce(ranges: list[tuple[int, int]]) -> Ranges:
    """The ranges sorted, those that overlap or touch joined (``ranges`` is sorted in place)."""
    ranges.sort()
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return tuple(out)


@dataclass(frozen=True)
class Changes:
    """What a ledger recorded since the checkpoint last took its changes (see :meth:`Ledger.changes`).

    Applied in order to what the checkpoint held before, a ledger's successive changes give the
    ledger as it is: ``completed`` holds only ids committed since (none of them committed before),
    ``result_ids``/``result_values`` the results appended since, in order.
    """

    completed: Ranges                       # sorted, disjoint, non-adjacent ranges newly committed
    result_ids: array[int]                  # ids of the results appended since ('q')
    result_values: array[float]             # their values, ``width`` numbers per id ('d')
    width: int = 1                          # numbers per result
    failed: tuple[TaskFailure, ...] = ()    # failure records new or replaced
    unfailed: tuple[int, ...] = ()          # ids no longer recorded failed (committed since)
    timeouts: tuple[tuple[int, int], ...] = ()  # (id, count) new or changed
    untimed: tuple[int, ...] = ()           # ids whose timeout count is gone (run again: --retry-failed)
    n_committed: int = 0                    # ids committed in all, these changes included

    @property
    def empty(self) -> bool:
        """Whether nothing changed (``n_committed`` aside)."""
        return not (self.completed or self.result_ids or self.failed or self.unfailed or self.timeouts
                    or self.untimed)

    def then(self, later: Changes) -> Changes:
        """These changes followed by ``later`` (taken from the same ledger afterwards), as one."""
        failed = {f.id: f for f in self.failed}
        unfailed = set(self.unfailed)
        for f in later.failed:
            failed[f.id] = f
            unfailed.discard(f.id)
        for tid in later.unfailed:
            failed.pop(tid, None)
            unfailed.add(tid)
        timeouts = dict(self.timeouts)
        untimed = set(self.untimed)
        for tid, k in later.timeouts:
            timeouts[tid] = k
            untimed.discard(tid)
        for tid in later.untimed:
            timeouts.pop(tid, None)
            untimed.add(tid)
        return Changes(_coalesce(list(self.completed) + list(later.completed)), self.result_ids + later.result_ids,
                       self.result_values + later.result_values, later.width, tuple(failed.values()),
                       tuple(sorted(unfailed)), tuple(sorted(timeouts.items())), tuple(sorted(untimed)),
                       later.n_committed)


class Ledger:
    """Committed ids and results of one run.

    Args:
        total: Number of task ids.
        completed: Ranges already committed by earlier runs (from the checkpoint).
        result_ids, result_values: Results already committed by earlier runs
            (``result_values`` flat, ``width`` numbers per id).
        width: Numbers per result: 1 for a scalar, W for an app's W result fields.
    """

    def __init__(
        self,
        total: int,
        completed: Iterable[tuple[int, int]] = (),
        result_ids: Iterable[int] = (),
        result_values: Iterable[float] = (),
        width: int = 1,
    ) -> None:
        self.total = total
        self.width = width
        # (all committed ids, those committed lately): the second is kept apart from (and disjoint
        # from) the first until there are enough to merge in one pass. The master's set has a range
        # per hole left by the tasks in flight (tens of thousands at 32,768 processes), and adding to
        # it one range at a time moved its tail each time. One attribute, replaced whole by a merge:
        # the progress thread counts both without a lock.
        self._sets = (RangeSet(completed), RangeSet())
        self.resumed = len(self._sets[0])
        self.result_ids = array("q", result_ids)
        self.result_values = array("d", result_values)
        self.recomputed = 0
        self.commits = 0  # ids committed by this run
        #: Tasks that failed for good (this run, or recorded so by the runs it resumed).
        self.failed: dict[int, TaskFailure] = {}
        #: Times each id ran past ``--task-timeout`` (kept across runs: they count toward quarantine).
        self.timeouts: dict[int, int] = {}
        #: This run runs the failed ids again (``--retry-failed``), instead of leaving them out.
        self.retry = False
        #: Failures recorded by earlier runs that this run runs again (see :meth:`retry_failed`):
        #: they stay recorded (in the checkpoint) until the id is committed or fails again.
        self.retrying: dict[int, TaskFailure] = {}
        # What changed since the checkpoint last took the changes (None: not tracked, see track()):
        # ranges committed (each new when logged), ids whose failure record changed, the results'
        # length and the timeout counts then.
        self._added: list[tuple[int, int]] | None = None
        self._touched: set[int] = set()
        self._results_mark = 0
        self._timeouts_then: dict[int, int] = {}

    @property
    def committed(self) -> RangeSet:
        """Every committed id: this run's and the runs' it resumed."""
        if self._sets[1]:
            self._fold()
        return self._sets[0]

    def _fold(self) -> None:
        committed, recent = self._sets
        merged = committed.copy()
        merged.add_ranges(recent.ranges())
        self._sets = (merged, RangeSet())

    def merge(self, other: Ledger) -> int:
        """Add what ``other`` committed and this ledger lacks (results included); return how many ids.

        Not counted as recomputed: the same commits seen from two copies (the deputy's and the file).
        """
        for tid, k in other.timeouts.items():
            self.timeouts[tid] = max(k, self.timeouts.get(tid, 0))
        for tid, f in other.failed.items():  # (a new master from the file alone must not lose /failed)
            if tid not in self.committed and tid not in self.failed and tid not in self.retrying:
                self.failed[tid] = f
                if self._added is not None:
                    self._touched.add(tid)
        fresh = other.committed.copy()
        fresh.remove_ranges(self.committed.ranges())
        if not fresh:
            return 0
        if self._added is not None:
            self._added.extend(fresh.ranges())
        width = self.width
        values = other.result_values
        for k, tid in enumerate(other.result_ids):
            if tid in fresh:
                self.result_ids.append(tid)
                self.result_values.extend(values[k * width : (k + 1) * width])
        n = self.committed.add_ranges(fresh.ranges())
        self.commits += n
        return n

    def fail(self, failure: TaskFailure) -> None:
        """Record a task as failed (not committed; a resume does not run it again)."""
        if failure.id not in self.committed:
            self.failed[failure.id] = failure
            self.retrying.pop(failure.id, None)
            if self._added is not None:
                self._touched.add(failure.id)

    def retry_failed(self) -> list[int]:
        """Run the failed ids again in this run (``--retry-failed``); return them, sorted.

        Their records move to :attr:`retrying`: the checkpoint keeps them until the id is
        committed (then the record is gone) or fails again (then the new record replaces
        it). Their task-timeout counts start again, so they get the full quarantine.
        """
        ids = sorted(self.failed)
        self.retry = True
        self.retrying.update(self.failed)
        self.failed = {}
        for tid in ids:
            self.timeouts.pop(tid, None)
        return ids

    def recorded_failed(self) -> tuple[TaskFailure, ...]:
        """The failures a checkpoint records now: this run's, and the earlier ones still being retried."""
        return tuple(self.failed.values()) + tuple(f for t, f in sorted(self.retrying.items()) if t not in self.failed)

    def remaining(self) -> RangeSet:
        """Return the ids not committed yet."""
        return self.committed.complement(self.total)

    def to_hand_out(self) -> RangeSet:
        """Return the ids a master hands out: not committed, and not recorded failed (unless
        this run retries them: a retry of failed ids is asked for explicitly)."""
        out = self.remaining()
        if not self.retry:
            for tid in self.failed:
                out.remove(tid, tid + 1)
        return out

    def commit(self, done: Iterable[tuple[int, int]], results: Iterable[tuple[int, Any]] = ()) -> int:
        """Commit finished ids and their results (a float, or ``width`` floats); return how many ids were new."""
        committed, recent = self._sets
        fresh_results: list[tuple[int, Any]] = []
        if results:
            seen: set[int] = set()
            for i, v in results:
                # An id run twice (it was in flight at a rank that died) may bring two results
                # in one batch: the first is kept, as for ids committed in earlier batches.
                if i not in committed and i not in recent and i not in seen:
                    seen.add(i)
                    fresh_results.append((i, v))
        new = 0
        asked = 0
        added = self._added
        for a, b in done:
            x = a  # what [a, b) adds beyond the large set goes to the recent one
            for c, d in committed.within(a, b):
                if x < c:
                    if added is not None:
                        _log_new(added, recent, x, c)
                    new += recent.add(x, c)
                x = d
            if x < b:
                if added is not None:
                    _log_new(added, recent, x, b)
                new += recent.add(x, b)
            asked += b - a
            if self.failed:
                for tid in [t for t in self.failed if a <= t < b]:
                    del self.failed[tid]
                    if added is not None:
                        self._touched.add(tid)
            if self.retrying:
                for tid in [t for t in self.retrying if a <= t < b]:
                    del self.retrying[tid]
                    if added is not None:
                        self._touched.add(tid)
        self.recomputed += asked - new
        for i, v in fresh_results:
            self.result_ids.append(i)
            if self.width == 1:
                self.result_values.append(v)
            else:
                self.result_values.extend(v)
        if recent.n_ranges > 64 + (committed.n_ranges >> 3):
            self._fold()
        self.commits += new
        return new

    @property
    def n_committed(self) -> int:
        """Ids committed, by this run and the runs it resumed."""
        committed, recent = self._sets
        return len(committed) + len(recent)

    @property
    def undecided(self) -> int:
        """Ids neither committed nor recorded failed (what a resume would run)."""
        return self.total - self.n_committed - len(self.failed)

    def complete(self) -> bool:
        """Whether every id in ``[0, total)`` is committed."""
        return self.n_committed == self.total

    def result_rows(self) -> list[Any]:
        """The committed results, one per result id (a float, or a tuple of ``width`` floats)."""
        values = self.result_values.tolist()
        if self.width == 1:
            return values
        w = self.width
        return [tuple(values[i : i + w]) for i in range(0, len(values), w)]

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return copies (completed ranges ``(K, 2)``, result ids, result values) for a checkpoint."""
        import numpy as np  # (here: a farm without a checkpoint need not import numpy, 40-150 ms)

        ranges = self.committed.ranges()
        completed = np.array(ranges, dtype=np.int64).reshape(len(ranges), 2)
        values = np.array(self.result_values, dtype=np.float64)
        if self.width > 1:
            values = values.reshape(-1, self.width)
        return completed, np.array(self.result_ids, dtype=np.int64), values

    # -- what changed, for the checkpoint ---------------------------------------------------------
    def track(self) -> None:
        """Count changes from now on: the checkpoint holds this ledger as it is now, and
        :meth:`changes` says what is new since. Results must only ever be appended."""
        self._added = []
        self._touched = set()
        self._results_mark = len(self.result_ids)
        self._timeouts_then = dict(self.timeouts)

    def untrack(self) -> None:
        """Stop counting changes (the checkpoint's next write must hold the whole ledger)."""
        self._added = None
        self._touched = set()
        self._timeouts_then = {}

    @property
    def tracked(self) -> bool:
        """Whether :meth:`changes` can say what is new (see :meth:`track`)."""
        return self._added is not None

    def changes(self) -> Changes:
        """What was committed, recorded failed or timed out since :meth:`track` or the previous
        call, then count again from now. Costs what changed (the timeout counts aside: compared whole,
        they are few).

        Raises:
            RuntimeError: the ledger does not track its changes.
        """
        added = self._added
        if added is None:
            raise RuntimeError("the ledger does not track its changes (track() first)")
        mark, width = self._results_mark, self.width
        ids = self.result_ids[mark:]
        values = self.result_values[mark * width :]
        failed: list[TaskFailure] = []
        unfailed: list[int] = []
        for tid in sorted(self._touched):
            record = self.failed.get(tid) or self.retrying.get(tid)
            if record is not None:
                failed.append(record)
            else:
                unfailed.append(tid)
        timeouts: list[tuple[int, int]] = []
        untimed: list[int] = []
        then = self._timeouts_then
        if then != self.timeouts:
            timeouts = sorted((tid, k) for tid, k in self.timeouts.items() if then.get(tid) != k)
            untimed = sorted(tid for tid in then if tid not in self.timeouts)
            self._timeouts_then = dict(self.timeouts)
        out = Changes(_coalesce(added), ids, values, width, tuple(failed), tuple(unfailed), tuple(timeouts),
                      tuple(untimed), self.n_committed)
        self._added = []
        self._touched = set()
        self._results_mark = len(self.result_ids)
        return out


def _log_new(added: list[tuple[int, int]], recent: RangeSet, a: int, b: int) -> None:
    """Log the parts of ``[a, b)`` that ``recent`` lacks (what adding it commits anew)."""
    for c, d in recent.within(a, b):
        if a < c:
            added.append((a, c))
        a = d
    if a < b:
        added.append((a, b))
