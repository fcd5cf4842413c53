"""What a task's result may be, checked where results enter: the user's ``complete()`` and a report a server receives. Pure Python.

A result is ``width`` numbers: for one number (no result fields, or one) a bare number or a
sequence of one; for ``width`` fields a sequence of exactly ``width``. A number is a real
number that is not a bool (``int``, ``float``, numpy's integer and floating scalars...) and
fits a float64; NaN and ±inf are stored as they are. Everything is stored as Python floats:
a ``float`` for width 1, a ``tuple`` of ``width`` floats otherwise (the ledger's flat float64
array takes exactly that, see :class:`~nlevel.roles.ledger.Ledger`).

:func:`as_result` is that rule (``complete()`` raises its reason to the caller);
:func:`vet` applies it to a report a server received, before anything is committed: a
result that breaks it cannot reach the ledger (a wrong width would shift every later
result in its flat array; a string or a tuple would raise in the master's thread). Its
task is recorded failed instead (kind ``"bad result"``, with the reason), and a
:class:`~nlevel.roles.events.Log` says so once per report.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..ranges import RangeSet
from .events import Effect, Log
from .messages import Report, Result, TaskFailure

__all__ = ["BAD_RESULT", "as_number", "as_result", "describe", "shown", "vet"]

#: The failure kind of a task whose result could not be stored.
BAD_RESULT = "bad result"


def as_number(v: Any) -> float:
    """``v`` as a float, or ValueError saying why it is not a number nlevel stores."""
    if type(v) is float:
        return v
    flag = isinstance(v, bool) or type(v).__name__ in ("bool", "bool_")  # (numpy's bool is no int)
    if flag or not isinstance(v, numbers.Real):
        raise ValueError(f"{shown(v)} ({type(v).__name__}) is not a real number" +
                         (" (a bool: pass float(flag) to store it)" if flag else ""))
    try:
        return float(v)
    except (OverflowError, ValueError, TypeError) as exc:
        raise ValueError(f"{shown(v)} does not fit a float64 ({exc})") from None


def _items(v: Any) -> list[Any] | None:
    """The items of a sequence of numbers (a tuple, a list, a 1-d array); None for anything else."""
    if isinstance(v, (str, bytes, bytearray)):
        return None
    if isinstance(v, Sequence):
        return list(v)
    if getattr(v, "ndim", None) == 1 and hasattr(v, "tolist"):  # numpy (or an array like it)
        return list(v)
    return None


def as_result(value: Any, width: int) -> Result:
    """``value`` as a stored result of ``width`` numbers (a float, or a tuple of floats).

    Raises:
        ValueError: saying what is wrong (the caller names the task and what was expected).
    """
    items = _items(value)
    if items is None:
        if width == 1:
            return as_number(value)
        raise ValueError(f"{shown(value)} ({type(value).__name__}) is not a sequence of numbers")
    if len(items) != width:
        raise ValueError(f"{len(items)} number{'s' if len(items) != 1 else ''}, expected {width}")
    if width == 1:
        return as_number(items[0])
    return tuple(as_number(x) for x in items)


def describe(width: int, fields: tuple[str, ...] | None = None) -> str:
    """What a result must be, for messages: "a number", "a number (x)", "3 numbers (x, y, z)"."""
    names = f" ({', '.join(fields)})" if fields else ""
    return f"a number{names}" if width == 1 else f"{width} numbers{names}"


def _well_formed(results: tuple[tuple[int, Any], ...], width: int) -> bool:
    """The common case, quickly: every result already as :func:`as_result` makes it."""
    if width == 1:
        return all(type(i) is int and type(v) is float for i, v in results)
    return all(type(i) is int and type(v) is tuple and len(v) == width and all(type(x) is float for x in v)
               for i, v in results)


def vet(src: int, report: Report, width: int) -> tuple[Report, list[Effect]]:
    """``report`` (from rank ``src``) with every result as the ledger stores it, and what was refused.

    A result that is not ``width`` numbers makes its task failed (kind :data:`BAD_RESULT`): the
    id leaves ``done`` for ``failed``. A result for an id the report does not say done (or not
    an id at all) is dropped. Either way one :class:`Log` names the first few and how many.
    """
    results: Any = report.results
    if isinstance(results, list):
        results = tuple(results)
    if not isinstance(results, tuple) or not all(isinstance(r, tuple) and len(r) == 2 for r in results):
        # Which result is whose cannot be read: none of the report's tasks has a result to keep.
        why = f"the report's results {shown(results)} are not (id, result) pairs"
        lost = tuple(TaskFailure(i, BAD_RESULT, why, src) for a, b in report.done for i in range(a, b))
        fixed = replace(report, done=(), results=(), failed=report.failed + lost)
        return fixed, [Log(f"a report from rank {src} holds results nlevel cannot store: {why} (tasks recorded "
                           f"failed: {_ids(lost)})")]
    if not results or _well_formed(results, width):
        return (report if results is report.results else replace(report, results=results)), []
    done = RangeSet(report.done)
    kept: list[tuple[int, Result]] = []
    good: set[int] = set()
    bad: list[tuple[int, str]] = []
    notes: list[str] = []
    want = describe(width)
    for i, v in results:
        if type(i) is not int or not done.overlap(i, i + 1):
            notes.append(f"a result {shown(v)} for {shown(i)}, which the report does not say done: dropped")
            continue
        try:
            kept.append((i, as_result(v, width)))
            good.add(i)
        except ValueError as exc:
            bad.append((i, f"its result {shown(v)} is not {want}: {exc}"))
    failed: list[TaskFailure] = []
    for i, why in bad:
        if i in good:  # (an id run twice, one of its results good: that one is kept)
            notes.append(f"task {i}: {why}: dropped (another result for it is kept)")
        elif done.overlap(i, i + 1):
            failed.append(TaskFailure(i, BAD_RESULT, why, src))
            done.remove(i, i + 1)
            notes.append(f"task {i}: {why}")
    if not notes:
        return replace(report, results=tuple(kept)), []
    told = "; ".join(notes[:3]) + (f"; ... ({len(notes)} in all)" if len(notes) > 3 else "")
    if failed:
        told += f" (recorded failed: {_ids(failed)})"
    fixed = replace(report, done=done.ranges(), results=tuple(kept), failed=report.failed + tuple(failed))
    return fixed, [Log(f"a report from rank {src} holds results nlevel cannot store: {told}")]


def shown(v: Any, most: int = 80) -> str:
    """``repr(v)`` for a message, cut to ``most`` characters (never raising: an int of 5,000 digits has no repr)."""
    try:
        text = repr(v)
    except Exception:
        text = f"<a {type(v).__name__} that cannot be shown>"
    return text if len(text) <= most else text[: most - 3] + "..."


def _ids(failed: list[TaskFailure] | tuple[TaskFailure, ...]) -> str:
    return ", ".join(str(f.id) for f in failed[:10]) + (f" ... ({len(failed)} in all)" if len(failed) > 10 else "")
