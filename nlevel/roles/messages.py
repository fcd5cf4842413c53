"""The wire messages between ranks: one frozen, slotted dataclass per kind, and its MPI tag (:data:`TAGS`).

(The classes are made by :func:`nlevel.roles.records.dataclass`: frozen slotted dataclasses, for a
fraction of what making them costs ``import nlevel`` otherwise.)

Ids are not granted by message: a child takes them from its parent's board with
one-sided atomics (:mod:`nlevel.roles.board`). Messages carry what flows the other
way, and the rare control. Task ids travel in payloads as ranges
(``((start, stop), ...)``), never in MPI tags. On the wire a message is the tuple of
its fields (cheap to pickle); the tag says which class it is. Pure Python, no MPI.

* child -> parent :class:`Report`: finished ids (with results), ids given back, tasks
  that failed, and whether it leaves (it ran its last task early).
* master -> every rank :class:`Regroup` (``--levels auto`` switches the running job to
  another plan, epoch ``epoch``); a rank answers its old parent :class:`Ack` once
  nothing more comes from it under the old plan.
* After a failure (see :mod:`nlevel.roles.recovery`): a reconciler asks
  (:class:`Holding` with ``ask``) and survivors answer with what their subtree holds.
* master -> deputy :class:`Mirror`: a copy of every commit, and a heartbeat.
* master -> rank :class:`Drain`: an operator takes the rank out of the job.
* :class:`KillRequest`: "kill this hung rank": to a rank on the victim's host.
* :class:`BoardOp` / :class:`BoardReply`: the two-sided fallback performs a claimer's
  board operation at the board's owner (an MPI without usable one-sided operations).
* :class:`Gone`: "these ranks are dead" from the rank that found out (a process that exited
  is never reported by MPI): to every live rank.
* :class:`Heartbeat`: every rank -> its parent, and the master -> its watchers, when it has sent
  them nothing else for a beat (a fifth of ``--lease``): the proof of life leases rest on.
* :class:`TimedOut`: ids that ran past ``--task-timeout`` (to the rank that requeues them,
  or to the master without fault tolerance).
* The end (see :mod:`nlevel.roles.ending`): child -> parent :class:`Ending` (its subtree is
  over, with its statistics); master -> every rank :class:`Release`.
* rank -> master :class:`Halt`: the user's program erred on a rank (``complete()`` refused a
  call): stop the job, every rank ends with status 1.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from enum import IntEnum
from typing import Any, Union

from ..model.plan import Plan
from ..ranges import Ranges
from .records import build, dataclass

__all__ = [
    "Tag", "Result", "TaskFailure", "TEAM_DEATH", "FailureRecord",
    "Report", "Regroup", "Ack", "Holding", "Mirror", "Drain", "KillRequest", "BoardOp", "BoardReply",
    "Gone", "Heartbeat", "TimedOut", "Ending", "Release", "Halt", "Safe", "InQuestion", "Message", "MESSAGES", "TAGS", "encode", "decode",
]

#: A task's result: one number, or a fixed number of them (the app's result fields).
Result = Union[float, tuple[float, ...]]


class Tag(IntEnum):
    """MPI tags of the farm's private communicator (small ints: tags are only guaranteed to 32767)."""

    REPORT = 11
    REGROUP = 13
    ACK = 14
    HOLDING = 15
    MIRROR = 16
    KILL = 17
    DRAIN = 19
    BOARD_OP = 20
    BOARD_REPLY = 21
    GONE = 22
    HEARTBEAT = 23
    TIMED_OUT = 24
    ENDING = 25
    RELEASE = 26
    HALT = 27
    SAFE = 28
    IN_QUESTION = 29


@dataclass(frozen=True, slots=True)
class TaskFailure:
    """A task that did not complete.

    Attributes:
        id: The task id.
        kind: ``"raised"`` (the task raised), ``"died"`` (processes died holding it, until
            it was quarantined), ``"timeout"`` (it ran past ``--task-timeout``), ``"bad result"``
            (a report brought a result that cannot be stored, see :mod:`nlevel.roles.results`), or,
            in a report only, ``"team"`` (:data:`TEAM_DEATH`: a process of the reporting rank's
            team died running it; the parent counts a death and runs it again).
        error: One line: the exception, or how the process died.
        rank, host: Where it happened (-1 and "" when not known).
        traceback: The formatted traceback of a task that raised.
        attempts: How many times it was tried.
    """

    id: int
    kind: str
    error: str
    rank: int = -1
    host: str = ""
    traceback: str = ""
    attempts: int = 1

    def line(self) -> str:
        """One line for the end of a job: which task, where, how."""
        where = f" on rank {self.rank}" + (f" ({self.host})" if self.host else "") if self.rank >= 0 else ""
        tries = f" after {self.attempts} attempts" if self.attempts > 1 else ""
        return f"task {self.id} {self.kind}{where}{tries}: {self.error}"


#: The kind of a :class:`TaskFailure` whose attempt failed because a process of the rank's team died.
TEAM_DEATH = "team"


@dataclass(frozen=True, slots=True)
class FailureRecord:
    """A process that died (or was drained) and how its work was recovered, for the run report."""

    rank: int
    role: str
    level: int
    how: str
    detected_by: int
    detected_at: float
    held: int
    silent_ms: float | None = None
    ledger_from: str | None = None
    requeued: int = 0
    quarantined: tuple[int, ...] = ()
    recovered_at: float | None = None
    recovery_ms: float | None = None
    free: int = 0  # a dead master: ids above its mark, never handed out, that its successor handed out at once
    #: The recovery waited this long for another death to be found (a survivor it needed answers
    #: from died, or hung until its lease expired): ``recovery_ms`` counts from then.
    waited_ms: float | None = None

    def closed(self, requeued: int, quarantined: tuple[int, ...], wall: float, since: float = 0.0) -> FailureRecord:
        """This record with its recovery done at ``wall``: ``requeued`` ids back in a queue.

        ``since``: when the last death this recovery had to wait for was found (its answers
        were void and asked again); the recovery is counted from then, the wait apart.
        """
        from dataclasses import replace

        start = max(self.detected_at, since)
        return replace(self, requeued=self.requeued + requeued, quarantined=self.quarantined + quarantined,
                       recovered_at=wall, recovery_ms=round((wall - start) * 1e3, 3),
                       waited_ms=round((start - self.detected_at) * 1e3, 3) if start > self.detected_at else None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        d = asdict(self)
        d["quarantined"] = list(self.quarantined)
        return d


@dataclass(frozen=True, slots=True)
class Report:
    """Child to parent: completions, results, ids given back, failures; ``leaving``: nothing more comes;
    ``ending``: the sender's :class:`Ending`, when its last report and its Ending go together."""

    done: Ranges = ()
    results: tuple[tuple[int, Result], ...] = ()
    returned: Ranges = ()
    failed: tuple[TaskFailure, ...] = ()
    leaving: bool = False
    epoch: int = 0
    orphan: bool = False  # forwarded straight to the master from an older epoch
    tasks: int = 0  # tasks finished below the sender since its last report
    busy: float = 0.0  # ... and the seconds they took
    busy_sq: float = 0.0  # ... and the sum of their squares (the planner's variance)
    task_max: float = 0.0  # the longest task seen below the sender (s): the leases follow it
    ending: Ending | None = None  # a leaf's early Ending, riding on its last report (one message, not two)
    weight: int = 0  # a region's ranks still computing, when that changed since its last report (0: unchanged)
    seq: int = 0  # the sender's count of reports with completions to this parent (fault tolerance; 0: not counted)


@dataclass(frozen=True, slots=True)
class Regroup:
    """Master to every rank: switch to ``plan`` as epoch ``epoch``, laid out without the drained
    ranks ``out`` (every rank builds the same hierarchy; see :func:`~nlevel.model.hierarchy.build`)."""

    epoch: int
    plan: Plan
    out: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Ack:
    """Child to its parent of epoch ``epoch - 1``: switched; nothing more comes under the old plan."""

    epoch: int


@dataclass(frozen=True, slots=True)
class Safe:
    """Parent to child: the completions of your reports up to ``seq`` are committed where a master's
    death cannot lose them (copied to the deputy, or passed up to a parent that said so): you may
    forget them (fault tolerance; see ``StationCore.report_up``)."""

    seq: int


@dataclass(frozen=True, slots=True)
class Holding:
    """A survivor whose parent died, to its reconciler and its new parent: the ids its subtree holds."""

    held: Ranges = ()
    failed: tuple[int, ...] = ()  # the dead ranks the sender knows of (the receiver waits until it does too)
    ask: bool = False  # a reconciler asks: "tell me what you hold" (the answer is a Holding)
    token: int = -1  # an ask's number, echoed by its answer (-1: unasked, to a new parent)
    lost: tuple[tuple[int, Ranges], ...] = ()  # (dead rank, completions the sender had passed to it)
    sent: Ranges = ()  # an answer: completions the sender passed to live parents (maybe in flight)
    left: bool = False  # unasked, to a new parent: the sender claims no more (its leaving report was lost)
    epoch: int = -1  # an answer: the plan (epoch) the sender ran when it wrote it


@dataclass(frozen=True, slots=True)
class InQuestion:
    """To the master, from a rank that stopped serving (a plan switch) while it reconciled a death:
    the ids still in question, and the records of the deaths they came from (still open). The
    master asks every survivor what it holds; what nobody holds runs again, counted in those
    records when the master closes them."""

    ids: Ranges
    records: tuple[FailureRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class Mirror:
    """Master to deputy: commits to copy (``full``: the whole ledger, replacing the copy); empty: a heartbeat."""

    done: Ranges = ()
    results: tuple[tuple[int, Result], ...] = ()
    total: int = 0
    width: int = 1
    full: bool = False
    failures: tuple[FailureRecord, ...] = ()  # the master's failure records (the report survives it too)
    failed: tuple[TaskFailure, ...] = ()  # tasks recorded failed
    timeouts: tuple[tuple[int, int], ...] = ()  # (id, times it ran past --task-timeout), newly counted
    deaths: tuple[Ranges, ...] = ()  # ids held by more than k processes that died, for each k: quarantine outlives the master
    hand: Ranges | None = None  # what the master's own loop holds now (None: unchanged since the last copy)
    mark: int = -1  # no id at or above this was handed out yet (-1: not known): a successor hands them out at once


@dataclass(frozen=True, slots=True)
class Drain:
    """Master to a rank: finish the current task, give back the rest, and leave the job."""

    why: str = "drained by the operator"


@dataclass(frozen=True, slots=True)
class KillRequest:
    """To a rank on ``rank``'s host: kill it (a hung process), so MPI reports it dead."""

    rank: int
    why: str = ""


@dataclass(frozen=True, slots=True)
class BoardOp:
    """Two-sided fallback: perform ``op`` on the receiver's board ``kind`` and answer with a :class:`BoardReply`.

    ``op`` is ``"fetch_add"`` (``a``: n), ``"read"`` (``a``: count), ``"cas"`` (``a``:
    expected, ``b``: new).
    """

    kind: int
    op: str
    index: int
    a: int = 0
    b: int = 0


@dataclass(frozen=True, slots=True)
class BoardReply:
    """The result of a :class:`BoardOp`."""

    values: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Gone:
    """Ranks found dead by the sender (how: e.g. "exited"), which MPI will never report: to every live rank."""

    ranks: tuple[int, ...]
    how: str = "exited"


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Still alive: a rank to its parent, the master to a watcher (the deputy gets :class:`Mirror` copies instead).

    Sent by a thread that runs whatever the rank's task does, so a task of any length never
    silences it; a process that is stopped, or whose task holds the GIL, stops beating.
    """

    epoch: int = 0  # the sender's plan epoch (informational)
    running: float = 0.0  # seconds the sender's subtree has spent in tasks still running (the progress line's busy time)


@dataclass(frozen=True, slots=True)
class TimedOut:
    """Ids ``ids`` held by rank ``rank`` ran past ``--task-timeout`` (``seconds``): count them toward quarantine."""

    rank: int
    ids: Ranges
    seconds: float
    host: str = ""


@dataclass(frozen=True, slots=True)
class Ending:
    """Child to parent: this rank and its subtree are over; their rows and statistics for the report.

    ``rows``: one dict per rank of the subtree; ``stats``: their statistics merged
    (see :func:`nlevel.roles.ending.merge_stats`). A later Ending from the same rank replaces it.
    """

    rows: tuple[dict[str, Any], ...]
    stats: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Release:
    """Master to every rank: the job is over. ``code``: the exit status the processes end with
    after failures; ``failed``: the ranks that died or were given up; ``report``: to the deputy
    only, before anyone is released (a master dying while it releases leaves the report behind);
    ``pending``: the deputy is told, not yet released; ``error``: the checkpoint could not be
    written (its error, the same text on every rank, which raises it), with ``errno`` (0: none)."""

    code: int
    failed: tuple[int, ...] = ()
    report: dict[str, Any] | None = None
    pending: bool = False
    error: str = ""
    errno: int = 0


@dataclass(frozen=True, slots=True)
class Halt:
    """To the master: the user's program on rank ``rank`` erred where nlevel can tell (``complete()``
    refused a call: a programming error, not a task failure; ``why``: the error, one line). The
    master stops the job once (running tasks finish) and every rank ends with status 1."""

    rank: int
    why: str


Message = Union[Report, Regroup, Ack, Holding, Mirror, Drain, KillRequest, BoardOp, BoardReply, Gone, Heartbeat,
                TimedOut, Ending, Release, Halt, Safe, InQuestion]

#: Each wire message class and its MPI tag. (A table, not a class attribute: the simulator's
#: compiled build makes these classes native, and mypyc takes a class-level default for a field.)
TAGS: dict[type, Tag] = {
    Report: Tag.REPORT,
    Regroup: Tag.REGROUP,
    Ack: Tag.ACK,
    Holding: Tag.HOLDING,
    Mirror: Tag.MIRROR,
    Drain: Tag.DRAIN,
    KillRequest: Tag.KILL,
    BoardOp: Tag.BOARD_OP,
    BoardReply: Tag.BOARD_REPLY,
    Gone: Tag.GONE,
    Heartbeat: Tag.HEARTBEAT,
    TimedOut: Tag.TIMED_OUT,
    Ending: Tag.ENDING,
    Release: Tag.RELEASE,
    Halt: Tag.HALT,
    Safe: Tag.SAFE,
    InQuestion: Tag.IN_QUESTION,
}

#: Every wire message class.
MESSAGES: tuple[type, ...] = tuple(TAGS)
_BY_TAG: dict[int, Any] = {int(tag): cls for cls, tag in TAGS.items()}
_FIELDS: dict[type, tuple[str, ...]] = {cls: tuple(f.name for f in fields(cls)) for cls in MESSAGES}


def encode(msg: Message) -> tuple[int, tuple[Any, ...]]:
    """Return ``(tag, payload)`` for sending ``msg``."""
    return int(TAGS[type(msg)]), tuple(getattr(msg, name) for name in _FIELDS[type(msg)])


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


build(__name__)  # (every record's __init__ at once: see nlevel.roles.records)
