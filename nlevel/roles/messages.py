"""The messages between a rank and its parent: one tag enum, one dataclass per kind.

Task ids travel in payloads as ranges (``((start, stop), ...)``), never in MPI tags.
On the wire a message is a plain tuple of its fields (cheap to pickle); the MPI tag
says which class it is. Pure Python, no MPI.

A message is never changed once built: treat it as immutable. The classes are not
``frozen`` dataclasses only because a frozen one takes two to three times as long to
build (interpreted, and compiled for the simulator, see :mod:`nlevel.sim.build`), and
the simulator builds millions; they hash by value like frozen ones.

Conversation (child C, parent P):

* C -> P ``Report(done, results, want, returned, leaving)``: "these ids are finished (with
  these results), give me up to ``want`` more" (``want == 0``: just reporting).
  ``returned`` gives back ids C was granted but will not run (it is leaving).
  A child has at most one ``want`` outstanding. ``leaving`` says C will send nothing
  more (it left the loop early); its ``returned`` ids go back to P's queue.
* P -> C ``Grant(ids, final, residence, dispose)``: answers a ``want``. ``final``
  means no id will ever come again: C finishes what it holds and leaves. A parent
  defers a want until it has ids or knows the job is finished, so a grant is never
  empty unless it is final. ``residence`` and ``dispose`` are the seconds the request
  spent at P in total and in P's own handling, so C can split its request time into
  message, wait and dispose parts.

Changing the plan while the job runs (``--levels auto``) adds an epoch to every report
and grant, and two messages:

* master -> every rank ``Regroup(epoch, plan)``: from now on, the hierarchy of ``plan``.
  Ids granted before it are "carried" at the master until they are committed or given
  back; a rank keeps its queue and its task in hand.
* C -> its old parent ``Ack(epoch)``: C has switched; nothing more will come from it
  under the old plan, so the old parent may stop listening for it.

A report that reaches a rank under an older epoch than the rank's own is forwarded to
the master as an ``orphan`` (its completions and returned ids are still good).

Failures (fault-tolerant runs, see :mod:`nlevel.roles.recovery`):

* ``Failed(ranks)`` is not sent: the transport hands it to its own rank when MPI reports
  dead processes. Every rank then lays out the same hierarchy without them.
* reconciler -> C ``Holding(ask=True)``, C -> reconciler ``Holding(held)``: a server above
  C died; these are the ids C and its subtree hold (queued, running, finished but not
  yet reported). C also sends its Holding unasked to its new parent when its parent died.
* master -> deputy ``Mirror(done, results, total, width, full)``: a copy of every commit,
  so the deputy can take over the ledger if the master dies.
* master -> a rank ``Drain()``: an operator gives this rank's core back; it finishes its
  task, returns its queue (a leaving Report) and leaves the job.
* ``Kill(rank)``: a lease expired (a hung process); the rank on the victim's host kills it,
  and MPI then reports it dead like any other failure.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum
from typing import Any, Union

from ..ranges import Ranges

__all__ = [
    "Tag", "TAG_OF", "Report", "Grant", "Regroup", "Ack", "Holding", "Mirror", "Kill", "Failed", "Drain", "Message",
    "Result",
    "encode", "decode",
]

#: A task's result: one number, or a fixed number of them (the app's result fields).
Result = Union[float, tuple[float, ...]]


class Tag(IntEnum):
    """MPI tags of the farm's private communicator (small ints: tags are only guaranteed to 32767)."""

    REPORT = 11
    GRANT = 12
    REGROUP = 13
    ACK = 14
    HOLDING = 15
    MIRROR = 16
    KILL = 17
    FAILED = 18  # local only, never on the wire
    DRAIN = 19


@dataclass(slots=True, unsafe_hash=True)
class Report:
    """Child to parent: completions, results, and a request for more ids."""

    done: Ranges = ()
    results: tuple[tuple[int, Result], ...] = ()
    want: int = 0
    returned: Ranges = ()
    leaving: bool = False
    epoch: int = 0
    orphan: bool = False  # forwarded straight to the master from an older epoch
    task_mean: float = 0.0  # the sender's mean task time (s), for the planner
    msg_time: float = 0.0  # the sender's mean one-way message time (s), for the planner
    failed: tuple[tuple[int, str], ...] = ()  # tasks that raised: (id, "error text, rank, host")
    task_max: float = 0.0  # the longest task seen below the sender (s): the leases follow it


@dataclass(slots=True, unsafe_hash=True)
class Grant:
    """Parent to child: ids to run, or the news that there will be no more."""

    ids: Ranges = ()
    final: bool = False
    residence: float = 0.0
    dispose: float = 0.0
    epoch: int = 0


@dataclass(slots=True, unsafe_hash=True)
class Regroup:
    """Master to every rank: switch to ``plan`` (a :meth:`Plan.to_dict`) as epoch ``epoch``."""

    epoch: int
    plan: dict[str, Any]


@dataclass(slots=True, unsafe_hash=True)
class Ack:
    """Child to its parent of epoch ``epoch - 1``: switched; nothing more comes under the old plan."""

    epoch: int


@dataclass(slots=True, unsafe_hash=True)
class Holding:
    """Child to its reconciler and its new parent after its parent died: the ids its subtree holds."""

    held: Ranges = ()
    failed: tuple[int, ...] = ()  # the dead ranks the sender knows of (the receiver waits until it does too)
    ask: bool = False  # a reconciler asks: "tell me what you hold" (the answer is a Holding)


@dataclass(slots=True, unsafe_hash=True)
class Mirror:
    """Master to deputy: commits to copy (``full``: the whole ledger, replacing the copy)."""

    done: Ranges = ()
    results: tuple[tuple[int, Result], ...] = ()
    total: int = 0
    width: int = 1
    full: bool = False
    failures: tuple[dict[str, Any], ...] = ()  # the master's failure records (the report survives it too)


@dataclass(slots=True, unsafe_hash=True)
class Kill:
    """A lease on ``rank`` expired: kill it (the rank on its host does), so MPI reports it dead."""

    rank: int


@dataclass(slots=True, unsafe_hash=True)
class Failed:
    """Local event: MPI reported these ranks dead (``how``: "ulfm", or why else)."""

    ranks: tuple[int, ...]
    how: str = "ulfm"


@dataclass(slots=True, unsafe_hash=True)
class Drain:
    """Master to a rank: finish the current task, give back the rest, and leave the job (an operator's drain)."""

    why: str = "drained by the operator"


Message = Union[Report, Grant, Regroup, Ack, Holding, Mirror, Kill, Failed, Drain]

_CLASSES = (Report, Grant, Regroup, Ack, Holding, Mirror, Kill, Failed, Drain)
#: The tag of each message class (a mapping, not a class attribute: the classes stay plain
#: dataclasses, which mypyc compiles for the simulator, see nlevel.sim.build).
TAG_OF: dict[type, Tag] = {
    Report: Tag.REPORT,
    Grant: Tag.GRANT,
    Regroup: Tag.REGROUP,
    Ack: Tag.ACK,
    Holding: Tag.HOLDING,
    Mirror: Tag.MIRROR,
    Kill: Tag.KILL,
    Failed: Tag.FAILED,
    Drain: Tag.DRAIN,
}
_BY_TAG: dict[int, Any] = {int(t): c for c, t in TAG_OF.items()}
_FIELDS: dict[type, tuple[str, ...]] = {cls: tuple(f.name for f in fields(cls)) for cls in _CLASSES}


def encode(msg: Message) -> tuple[int, tuple[Any, ...]]:
    """Return ``(tag, payload)`` for sending ``msg``."""
    return int(TAG_OF[type(msg)]), tuple(getattr(msg, name) for name in _FIELDS[type(msg)])


def decode(tag: int, payload: tuple[Any, ...]) -> Message:
    """Rebuild a message from its tag and payload.

    Raises:
        ValueError: for an unknown tag or a payload of the wrong shape.
    """
    try:
        cls = _BY_TAG[tag]
    except KeyError:
        raise ValueError(f"unknown nlevel message tag {tag}; expected one of {sorted(_BY_TAG)}") from None
    if not isinstance(payload, tuple) or len(payload) != len(_FIELDS[cls]):
        raise ValueError(f"malformed {cls.__name__} payload: {payload!r}")
    msg: Message = cls(*payload)
    return msg
