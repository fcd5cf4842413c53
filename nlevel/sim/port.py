"""The loop's port in the simulator (:class:`SimPort`): one rank's effects, in simulated time. Pure Python."""

from __future__ import annotations

from ..errors import SimStalled
from ..roles.events import Died, DrainRequest, ReleaseJob
from ..roles.ledger import Ledger
from ..roles.messages import Message

__all__ = ["SimPort"]


class SimPort:
    """One rank's port in the simulation: effects performed in simulated time.

    Sends go to the engine's shared outbox (it delivers them ``msg_time`` later, and books the
    receiver's CPU); what arrives waits in :attr:`inbox` until the engine runs a step of the
    rank's loop. A checkpoint write is a no-op that succeeds (not modelled); nothing is ever
    read back. No process dies or hangs of itself in a simulation: a kill or a rank giving
    itself up is a bug, raised. An operator's requests are put in :attr:`asks` by the engine.
    """

    __slots__ = ("outbox", "inbox", "asks")

    def __init__(self, outbox: list[tuple[int, Message]]) -> None:
        self.outbox = outbox
        self.inbox: list[tuple[int, Message] | Died] = []
        self.asks: list[DrainRequest] = []

    def send(self, dest: int, msg: Message) -> None:
        self.outbox.append((dest, msg))

    def poll(self) -> tuple[int, Message] | Died | None:
        inbox = self.inbox
        return inbox.pop(0) if inbox else None

    def kill(self, rank: int, why: str) -> bool:
        raise SimStalled(f"the simulated farm asked to kill rank {rank} ({why}): no process dies in a simulation")

    def gone(self, ranks: list[int]) -> list[int]:
        return []

    def declare_dead(self, ranks: tuple[int, ...]) -> None:
        pass

    def retire(self, why: str, last: Ledger | None = None) -> None:
        raise SimStalled(f"a simulated rank gave itself up ({why}): no task hangs in a simulation")

    def heartbeat(self) -> str:
        return ""

    def checkpoint_failed(self) -> str:
        return ""

    def write_checkpoint(self, ledger: Ledger, final: bool) -> str:
        return ""

    def load_checkpoint(self) -> tuple[Ledger | None, str]:
        return None, ""

    def answer(self, token: str, outcome: dict[str, object]) -> None:
        pass

    def log(self, text: str) -> None:
        pass

    def requests(self) -> list[DrainRequest]:
        asks = self.asks
        if not asks:
            return asks
        self.asks = []
        return asks

    def stop_requested(self) -> bool:
        return False

    def release_job(self, ledger: Ledger, stopped: bool, erred: bool) -> ReleaseJob:
        return ReleaseJob(0 if ledger.complete() and not erred else 1)

    def given_up_end(self, code: int, given_up: tuple[int, ...]) -> None:
        pass
