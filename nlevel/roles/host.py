"""What a station's sub-machines may use of the station that holds them. Pure Python.

The sub-machines (:mod:`~nlevel.roles.delivery`, :mod:`~nlevel.roles.replan`,
:mod:`~nlevel.roles.failures`, :mod:`~nlevel.roles.ending`, :mod:`~nlevel.roles.watch`) each own
their state; what they share (this rank, the plan laid out, the ranks known dead, the
settings, the clocks, the server and the worker) is the station's, read through this
interface. A sub-machine gets the sub-machines below it (in that order) when it is made;
what it must ask of one above it, it asks the station (:meth:`Host.took_over`,
:meth:`Host.own_stats`), so no module imports the station, and the station alone wires
them together (:class:`~nlevel.roles.station.Station`).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from ..config import Config
from ..model.hierarchy import Hierarchy, Node
from ..model.plan import Plan
from .autoplan import AutoPlanner
from .events import Effect
from .ledger import Ledger
from .messages import Message
from .server import Boards, Server, Sizing
from .worker import Worker

__all__ = ["Host"]


class Host(Protocol):
    """The station, as its sub-machines see it (see the module docstring)."""

    rank: int
    size: int
    total: int
    width: int
    config: Config
    ft: bool
    clock: Callable[[], float]
    wall: Callable[[], float]
    boards: Boards
    ledger: Ledger | None
    hosts: tuple[str, ...]
    sizing: Sizing
    measured: bool
    epoch: int
    plans: list[Plan]
    failed: frozenset[int]
    hierarchy: Hierarchy
    info: Node
    server: Server | None
    worker: Worker | None
    planner: AutoPlanner | None
    erred: str
    loading: bool
    job_over: bool
    abandoned: bool
    drain_requested: bool
    drained: dict[int, float]
    final_asked: bool
    stop_reason: str

    @property
    def ended(self) -> bool:
        """Whether this rank's user loop is over."""

    @property
    def done_serving(self) -> bool:
        """Whether the server side owes nobody anything more."""

    def receive(self, src: int, msg: Message) -> list[Effect]:
        """A wire message from ``src``."""

    def serve(self, full: bool = False) -> list[Effect]:
        """The server's work now."""

    def stop(self, reason: str = "SIGUSR1") -> list[Effect]:
        """The master stops the job early."""

    def user_error(self, rank: int, why: str, src: int | None = None) -> list[Effect]:
        """An error in the user's program on ``rank``."""

    def lay_out(self, hierarchy: Hierarchy) -> None:
        """Build this rank's roles for ``hierarchy``."""

    def leave_out(self, server: Server) -> None:
        """The drained ranks among ``server``'s children count as gone."""

    def retire_server(self) -> None:
        """This rank stops serving: count what it served."""

    def took_over(self) -> list[Effect]:
        """This rank is the new master, its roles laid out: what its predecessor left half done."""

    def own_stats(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """This rank's (row, mergeable statistics) for the run report."""
