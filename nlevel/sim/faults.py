"""Opt-in deaths and drains for :mod:`nlevel.sim.engine`: validation and the events' handler.

Kept apart from the engine's hot loop: a run without kills or drains never calls in here.

* a **kill** ``(time, rank)``: the rank's later events are dropped (the engine skips them),
  messages to it are lost, and every survivor gets ``Died((rank,))`` ``notice`` seconds later,
  read by its loop behind its messages; a server handles the notice on its CPU
  (``service_time``), as a message;
* a **drain** ``(time, count)``: the master's loop finds an operator's ``DrainRequest(count=...)``
  at its control step, on its CPU (it takes the ``count`` highest-ranked slaves);
  ``(time, -count)``: the same number of slaves, spread evenly over the slaves
  (``DrainRequest(ranks=...)``), so no region loses all of its own.

Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any, Callable, Sequence

from ..roles.events import Died, DrainRequest
from ..roles.loop import Loop
from ..roles.station import Station
from .port import SimPort

__all__ = ["check_faults", "fault_handler", "as_dict"]

_ENTRY = 0  # (the engine's own kind, which a fault may schedule)
_KILL, _DIED, _DRAIN = 4, 5, 6


def check_faults(n: int, ft: bool, kills: Sequence[tuple[float, int]], drains: Sequence[tuple[float, int]],
                 notice: float) -> tuple[list[tuple[float, int]], list[tuple[float, int]], float]:
    """Validate :class:`~nlevel.sim.engine.Engine`'s ``kills``, ``drains`` and ``notice``; return them sorted.

    Raises:
        ValueError: naming the value.
    """
    for t, r in kills:
        if not 0 <= r < n:
            raise ValueError(f"kill: rank {r} is not in this farm (ranks 0..{n - 1})")
        if not (math.isfinite(t) and t >= 0):
            raise ValueError(f"kill: time must be >= 0 s, got {t}")
    if kills and not ft:
        raise ValueError("kills need fault tolerance on (Config(fault_tolerance='on'))")
    for t, k in drains:
        if not 1 <= abs(k) < n:
            raise ValueError(f"drain: count must be in 1..{n - 1}, got {k}")
        if not (math.isfinite(t) and t >= 0):
            raise ValueError(f"drain: time must be >= 0 s, got {t}")
    if not (math.isfinite(notice) and notice >= 0):
        raise ValueError(f"notice must be >= 0 s, got {notice}")
    return sorted(kills), sorted(drains), notice


def as_dict(record: Any) -> dict[str, Any]:
    """A failure record as a JSON-ready dict."""
    try:
        return asdict(record)
    except TypeError:
        return {"record": repr(record)}


def fault_handler(engine: Any, ag: Any, stations: list[Station], loops: list[Loop], ports: list[SimPort],
                  dead: list[bool], ended: list[bool], hand: list[tuple[int, int] | None],
                  deaths: list[tuple[float, int]]) -> Any:
    """The handler of the opt-in fault events of ``engine``'s run (kills, failure notices, drains) on its
    agenda ``ag`` (the pending events, the servers' CPUs); ``fault(kind, rank, payload, t)``."""
    c = engine.costs
    notice = engine.notice
    n = engine.size
    push, send_all, after_server = ag.push, ag.send_all, ag.after_server
    busy_until, server_busy, over = ag.busy_until, ag.server_busy, ag.over

    def serve(r: int, t: float, act: Callable[[], Any]) -> float:
        # (a server runs a step for a notice or a request on its own CPU, as it handles a message)
        if stations[r].server is None:
            act()
            return t
        start = busy_until[r] if busy_until[r] > t else t
        busy_until[r] = start + c.service_time
        if ag.counting and not over[r]:
            server_busy[r] += c.service_time
        engine.t = start
        act()
        return start + c.service_time

    def fault(kind: int, r: int, payload: Any, t: float) -> None:
        if kind == _KILL:
            alive = [x for x in range(n) if not dead[x]]
            if len(alive) < 2:
                return  # (the last rank standing is not killed: nobody would be left to finish)
            if stations[r].worker is not None and not ended[r]:
                ag.loop_over()
            dead[r] = True
            hand[r] = None
            deaths.append((t, r))
            for x in alive:
                if x != r:
                    push(t + notice, _DIED, x, r)
        elif kind == _DIED:
            # Behind what reached it before the notice, as the runtime's loop reads its messages
            # before it learns of a death (the deputy's last copies from the master among them).
            ports[r].inbox.append(Died((payload,)))
            done = serve(r, t, loops[r].step if over[r] else loops[r].receive)
            send_all(r, done)
            if stations[r].server is not None:
                after_server(r, done)
            if stations[r].worker is not None and hand[r] is None and not ended[r]:
                push(done + c.poll, _ENTRY, r)  # (it may claim from a new parent now)
        elif kind == _DRAIN:
            k, count = payload
            m = next((x for x in range(n) if not dead[x] and stations[x].is_master), None)
            if m is None:
                return
            if count > 0:
                request = DrainRequest(f"sim-drain-{k}", count=count)
            else:
                h = stations[m].hierarchy
                drained = stations[m].drained  # (asked to leave already, perhaps still running its last range)
                slaves = [x for x in range(n) if h[x].role.value == "slave" and not dead[x] and not ended[x]
                          and x not in drained]
                if not slaves:
                    return  # (the job's slaves have all ended: nothing to drain)
                take = min(-count, len(slaves))
                step = len(slaves) / take
                request = DrainRequest(f"sim-drain-{k}", ranks=tuple(slaves[int(i * step)] for i in range(take)))
            ports[m].asks.append(request)  # (the operator's request, found by the master's control step)
            done = serve(m, t, loops[m].control)
            send_all(m, done)
            after_server(m, done)

    return fault
