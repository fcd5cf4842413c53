"""What happens to a rank (events) and what it asks the runtime to do (effects).

:meth:`Station.handle <nlevel.roles.station.Station.handle>` takes one event and returns
a list of effects; the loop (:mod:`nlevel.roles.loop`) performs them through a port:
the MPI runtime's, the simulator's or a test's. Wire messages (:mod:`nlevel.roles.messages`)
travel inside :class:`Received` and :class:`Send`; nothing here goes on the wire.
Pure Python.
"""

from __future__ import annotations

from typing import Any, Union

from ..ranges import Ranges
from .ledger import Ledger
from .messages import Message, Result, TaskFailure
from .records import build, dataclass

__all__ = [
    "Received", "Tick", "Died", "Ran", "NeedIds", "Prefetch", "Leave", "Stop", "DrainRequest", "Overran", "Served", "ReleaseJob", "ReportDone",
    "CheckpointLoaded",
    "CheckpointWritten", "UserError", "TeamLost", "Event",
    "Send", "Kill", "Abandon", "GiveUp", "Watch", "WriteCheckpoint", "LoadCheckpoint", "Answer", "Log", "Effect",
]


# -- events --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Received:
    """A wire message from rank ``src``."""

    src: int
    msg: Message


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: look at the boards, batches, leases, the planner.

    ``running``: seconds this rank's user loop has spent in the task it runs now (0: none), as
    the runtime sees it; it travels up with the heartbeats, so the progress line counts a task
    that runs as busy, not only a task that has finished.
    """

    running: float = 0.0


@dataclass(frozen=True, slots=True)
class Died:
    """The runtime learnt that ``ranks`` are dead (``how``: "ulfm", or why else).

    ``tell``: this rank found out by itself (a process that exited, which MPI never reports,
    or one given up): it tells every other rank (:class:`~nlevel.roles.messages.Gone`).
    """

    ranks: tuple[int, ...]
    how: str = "ulfm"
    tell: bool = False


@dataclass(frozen=True, slots=True)
class Ran:
    """The user's loop on this rank finished these tasks since the last :class:`Ran`.

    Attributes:
        done: Ids finished.
        results: ``(id, result)`` of those with a result.
        failed: Tasks that raised.
        tasks: How many tasks ran (``done`` plus ``failed``).
        busy: Seconds they took together.
        longest: The longest of them (s).
        busy_sq: The sum of their squared times (s²; tasks timed together count as equal).
        times: Each task's seconds, in order, when the loop timed them one by one (the runtime's
            loop does: one clock read per task); empty when only the total is known.
    """

    done: Ranges = ()
    results: tuple[tuple[int, Result], ...] = ()
    failed: tuple[TaskFailure, ...] = ()
    tasks: int = 0
    busy: float = 0.0
    longest: float = 0.0
    busy_sq: float = 0.0
    times: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class NeedIds:
    """The user's loop has no id in hand: give it the next range (see ``Station.hand``).

    Attributes:
        ran: What the loop finished since the last event, when it says so together (one
            event instead of two between two tasks: the path a short task waits on).
    """

    ran: Ran | None = None


@dataclass(frozen=True, slots=True)
class Prefetch:
    """The user's loop runs its hand: claim the next range now if that is due (the loop's next
    :class:`NeedIds` then finds it queued, without a claim on its path)."""


@dataclass(frozen=True, slots=True)
class Leave:
    """The user's loop left early; ``unstarted``: ids in hand it did not run (they go back)."""

    unstarted: Ranges = ()


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop the job early and cleanly (SIGUSR1 on the master, or ``reason``): running tasks finish, nothing new starts."""

    reason: str = "SIGUSR1"


@dataclass(frozen=True, slots=True)
class DrainRequest:
    """An operator asks the master to take ``ranks`` (or the ``count`` highest slaves) out of the job."""

    token: str
    ranks: tuple[int, ...] | None = None
    count: int | None = None


@dataclass(frozen=True, slots=True)
class Overran:
    """This rank's own task ``task`` has run ``seconds``, past ``--task-timeout`` (told by the runtime,
    which watches the task from another thread)."""

    task: int
    seconds: float


@dataclass(frozen=True, slots=True)
class ReleaseJob:
    """The master ends the job for everyone (every live rank has ended: see ``Station.all_ended``):
    ``code`` is the status every process ends with, ``report`` the facts its deputy needs should the
    master die now, ``error`` the checkpoint's write error (its text and ``errno``) for every rank to
    raise alike. ``last_work``: some of the master's last work outlives it (a checkpoint's lock and
    status file, a report file): under fault tolerance its deputy watches it until :class:`ReportDone`."""

    code: int
    report: dict[str, Any] | None = None
    error: str = ""
    errno: int = 0
    last_work: bool = True


@dataclass(frozen=True, slots=True)
class ReportDone:
    """The master's last work (its report written, its lock given back) is done: the releases it held
    back go out (its deputy's under fault tolerance)."""


@dataclass(frozen=True, slots=True)
class Served:
    """Handling one message took ``seconds`` of this rank's CPU (the master's planner measures its μ)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class CheckpointLoaded:
    """The ledger a :class:`LoadCheckpoint` read (None: no usable checkpoint; ``error`` says why)."""

    ledger: Ledger | None
    error: str = ""


@dataclass(frozen=True, slots=True)
class CheckpointWritten:
    """A :class:`WriteCheckpoint` with ``final`` is on disk (or failed: ``error``)."""

    final: bool
    error: str = ""


@dataclass(frozen=True, slots=True)
class UserError:
    """The user's program erred on this rank where nlevel can tell: ``complete()`` refused a call
    (a programming error, not a task failure; ``why``: the error, one line). The job stops once,
    through the master (:class:`~nlevel.roles.messages.Halt`), and every rank ends with status 1."""

    why: str


@dataclass(frozen=True, slots=True)
class TeamLost:
    """This rank leads a team (``--ranks-per-task``) that lost a process: ``team`` (its index, its
    ``members``' ranks) cannot run tasks any more; ``held``: 1 if a task was in hand (it goes back,
    counted as a death), else 0. The rank itself lives on and serves; the report records the loss."""

    team: int
    members: tuple[int, ...]
    why: str
    held: int


Event = Union[Received, Tick, Died, Ran, NeedIds, Prefetch, Leave, Stop, DrainRequest, Overran, Served, ReleaseJob, ReportDone,
              CheckpointLoaded, CheckpointWritten, UserError, TeamLost]


# -- effects ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Send:
    """Send ``msg`` to rank ``dest``."""

    dest: int
    msg: Message


@dataclass(frozen=True, slots=True)
class Kill:
    """Kill process ``rank`` (hung, or past its task's time limit); MPI then reports it dead."""

    rank: int
    why: str


@dataclass(frozen=True, slots=True)
class Abandon:
    """This rank (``rank``) gives itself up: its task ran past its time limit and it cannot be killed
    (without fault tolerance MPI would end the whole job; or it is the last rank). It has stopped
    taking part (the station did that, and the Gone notices follow this effect); the runtime writes
    the master's ledger first and retires the process."""

    rank: int
    why: str


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Rank ``rank``, which this rank had killed, was still there a lease later: nobody on its host
    carried the kill out (the node is stopped, cut off or gone). The runtime treats it as dead
    from now on (tells every rank, repairs around it) although its process may live on."""

    rank: int
    why: str


@dataclass(frozen=True, slots=True)
class WriteCheckpoint:
    """Write the master's ledger to the checkpoint; ``final``: synchronously, then answer :class:`CheckpointWritten`."""

    final: bool = False


@dataclass(frozen=True, slots=True)
class LoadCheckpoint:
    """Read the ledger from the checkpoint file and answer :class:`CheckpointLoaded` (a new master without a copy)."""


@dataclass(frozen=True, slots=True)
class Watch:
    """Look whether the processes of ``ranks`` still exist (a process that exited is never reported by
    MPI): those gone are told back as a death (:class:`Died` with ``tell``)."""

    ranks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer the operator's request ``token`` (see :class:`DrainRequest`)."""

    token: str
    outcome: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Log:
    """A line for the job's stderr, prefixed with the rank."""

    text: str


Effect = Union[Send, Kill, Abandon, GiveUp, Watch, WriteCheckpoint, LoadCheckpoint, Answer, Log]


build(__name__)  # (every record's __init__ at once: see nlevel.roles.records)
