"""The messages between a rank and its parent: one tag enum, one frozen dataclass per kind.

Task ids travel in payloads as ranges (``((start, stop), ...)``), never in MPI tags.
On the wire a message is a plain tuple of its fields (cheap to pickle); the MPI tag
says which class it is. Pure Python, no MPI.

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

from dataclasses import MISSING, dataclass, fields
from enum import IntEnum
from typing import Any, ClassVar, Union

from .ranges import Ranges

__all__ = [
    "Tag", "Report", "Grant", "Regroup", "Ack", "Holding", "Mirror", "Kill", "Failed", "Drain", "Message", "Result",
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


@dataclass(frozen=True, slots=True)
class Report:
    """Child to parent: completions, results, and a request for more ids."""

    TAG: ClassVar[Tag] = Tag.REPORT
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


@dataclass(frozen=True, slots=True)
class Grant:
    """Parent to child: ids to run, or the news that there will be no more."""

    TAG: ClassVar[Tag] = Tag.GRANT
    ids: Ranges = ()
    final: bool = False
    residence: float = 0.0
    dispose: float = 0.0
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class Regroup:
    """Master to every rank: switch to ``plan`` (a :meth:`Plan.to_dict`) as epoch ``epoch``."""

    TAG: ClassVar[Tag] = Tag.REGROUP
    epoch: int
    plan: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Ack:
    """Child to its parent of epoch ``epoch - 1``: switched; nothing more comes under the old plan."""

    TAG: ClassVar[Tag] = Tag.ACK
    epoch: int


@dataclass(frozen=True, slots=True)
class Holding:
    """Child to its reconciler and its new parent after its parent died: the ids its subtree holds."""

    TAG: ClassVar[Tag] = Tag.HOLDING
    held: Ranges = ()
    failed: tuple[int, ...] = ()  # the dead ranks the sender knows of (the receiver waits until it does too)
    ask: bool = False  # a reconciler asks: "tell me what you hold" (the answer is a Holding)


@dataclass(frozen=True, slots=True)
class Mirror:
    """Master to deputy: commits to copy (``full``: the whole ledger, replacing the copy)."""

    TAG: ClassVar[Tag] = Tag.MIRROR
    done: Ranges = ()
    results: tuple[tuple[int, Result], ...] = ()
    total: int = 0
    width: int = 1
    full: bool = False
    failures: tuple[dict[str, Any], ...] = ()  # the master's failure records (the report survives it too)


@dataclass(frozen=True, slots=True)
class Kill:
    """A lease on ``rank`` expired: kill it (the rank on its host does), so MPI reports it dead."""

    TAG: ClassVar[Tag] = Tag.KILL
    rank: int


@dataclass(frozen=True, slots=True)
class Failed:
    """Local event: MPI reported these ranks dead (``how``: "ulfm", or why else)."""

    TAG: ClassVar[Tag] = Tag.FAILED
    ranks: tuple[int, ...]
    how: str = "ulfm"


@dataclass(frozen=True, slots=True)
class Drain:
    """Master to a rank: finish the current task, give back the rest, and leave the job (an operator's drain)."""

    TAG: ClassVar[Tag] = Tag.DRAIN
    why: str = "drained by the operator"


Message = Union[Report, Grant, Regroup, Ack, Holding, Mirror, Kill, Failed, Drain]

_CLASSES = (Report, Grant, Regroup, Ack, Holding, Mirror, Kill, Failed, Drain)
_BY_TAG: dict[int, Any] = {cls.TAG: cls for cls in _CLASSES}
_FIELDS: dict[type, tuple[str, ...]] = {cls: tuple(f.name for f in fields(cls)) for cls in _CLASSES}


def _fast_init(cls: type) -> None:
    """Give a frozen, slotted dataclass an ``__init__`` that sets each slot through its descriptor.

    The generated frozen ``__init__`` goes through ``object.__setattr__(self, name, value)``
    for every field; calling each slot's own setter skips the name look-up and makes a
    :class:`Report` about twice as fast to build (the simulator builds millions). Same
    parameters, defaults and order; the instances stay frozen (``__setattr__`` still
    raises). A class with a ``default_factory`` or ``__post_init__`` keeps its own.
    """
    fs = fields(cls)
    if hasattr(cls, "__post_init__") or any(f.default_factory is not MISSING or not f.init for f in fs):
        return
    ns: dict[str, Any] = {}
    params = []
    body = []
    for f in fs:
        ns[f"_set_{f.name}"] = cls.__dict__[f.name].__set__  # the slot's member descriptor
        if f.default is MISSING:
            params.append(f.name)
        else:
            ns[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        body.append(f"    _set_{f.name}(self, {f.name})")
    exec(f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body or ["    pass"]) + "\n", ns)
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init  # type: ignore[misc]


for _cls in _CLASSES:
    _fast_init(_cls)


def encode(msg: Message) -> tuple[int, tuple[Any, ...]]:
    """Return ``(tag, payload)`` for sending ``msg``."""
    return int(msg.TAG), tuple(getattr(msg, name) for name in _FIELDS[type(msg)])


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
