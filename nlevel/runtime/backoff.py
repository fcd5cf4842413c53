"""The one waiting policy: how a thread of nlevel waits for what it must poll for.

MPI gives no blocking wait with a timeout, and Open MPI's blocking calls spin (with
``mpi_yield_when_idle``, a ``sched_yield`` per turn: on an oversubscribed node every waiting
rank takes a core's share from the ranks that compute). So every loop that waits on MPI (a
server between looks, a rank waiting for ids or for its release, pending sends, a barrier)
polls, and sleeps between two polls that found nothing: :class:`Backoff`. The sleep is a wait
on an :class:`threading.Event` when the loop has one, so that another thread of the process can
cut it short (:meth:`Backoff.wake`: the job's end, a stop); inside a process nothing is polled.

The sleeps double from ``floor`` to ``ceiling`` after each empty poll, and start again at
``floor`` after a poll that found something: a loop in a conversation answers within about
``floor``, an idle one costs one poll per ``ceiling``. No spinning: a sleep of 0 on Linux is a
timer with the default slack (50 us), a spin that only looks free. ``ceiling`` is a setting
(``--poll-max`` for the waits on the critical path, ``--server-period`` for an idle server).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

__all__ = ["Backoff", "FLOOR", "poll_until"]

#: The shortest sleep between two polls (s). Below the kernel's timer slack (50 us) nothing is
#: gained: a sleep is never shorter.
FLOOR = 5e-5


class Backoff:
    """Sleep between empty polls: ``floor`` doubling to ``ceiling``; :meth:`reset` after a poll that found something.

    Args:
        ceiling: Longest sleep in seconds (``Config.poll_max`` or ``Config.server_period``, > 0).
        floor: First sleep after something happened (at most ``ceiling``).
        event: Sleep on it (:meth:`wake` cuts a sleep short); None: a plain sleep.
    """

    __slots__ = ("ceiling", "floor", "event", "delay")

    def __init__(self, ceiling: float = 1e-4, floor: float = FLOOR, event: threading.Event | None = None) -> None:
        self.ceiling = ceiling
        self.floor = min(floor, ceiling)
        self.event = event
        self.delay = self.floor

    def reset(self) -> None:
        """Call after a poll found something: the next wait starts short again."""
        self.delay = self.floor

    def wait(self, ceiling: float | None = None) -> bool:
        """Call after an empty poll: sleep the next delay (at most ``ceiling`` this time, if given).

        Returns whether :meth:`wake` cut the sleep short (the event was set; it is cleared).
        """
        d = self.delay
        if ceiling is not None and d > ceiling:
            d = ceiling
        self.delay = min(2 * self.delay, self.ceiling)
        ev = self.event
        if ev is None:
            time.sleep(d)
            return False
        if ev.wait(d):
            ev.clear()
            self.delay = self.floor
            return True
        return False

    def wake(self) -> None:
        """From another thread: end the current sleep now (the loop looks at once)."""
        if self.event is not None:
            self.event.set()


def poll_until(done: Callable[[], bool], ceiling: float, step: Callable[[], bool] | None = None,
               timeout: float | None = None) -> bool:
    """Poll ``done()`` with :class:`Backoff` (up to ``ceiling``) until it is true; return whether it became true.

    ``step()`` is called between two polls (it returns whether it found something: the sleeps
    start short again); ``timeout``: give up after that many seconds (False).
    """
    backoff = Backoff(ceiling)
    end = None if timeout is None else time.monotonic() + timeout
    while not done():
        if step is not None and step():
            backoff.reset()
            continue
        if end is not None and time.monotonic() > end:
            return False
        backoff.wait()
    return True
