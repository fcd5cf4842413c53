"""Polling without spinning: a few immediate retries, then sleeps that double up to a ceiling."""

from __future__ import annotations

import time

__all__ = ["Backoff"]


class Backoff:
    """Sleep between empty polls: ``spins`` tries with no sleep, then 1 µs doubling to ``ceiling``.

    Args:
        ceiling: Longest sleep in seconds (``Config.poll_max``, > 0).
        spins: Empty polls answered with a plain GIL yield before sleeping starts.
    """

    __slots__ = ("ceiling", "spins", "_n", "_delay")

    def __init__(self, ceiling: float = 1e-4, spins: int = 16) -> None:
        self.ceiling = ceiling
        self.spins = spins
        self._n = 0
        self._delay = 1e-6

    def reset(self) -> None:
        """Call after a poll found something: the next wait starts short again."""
        self._n = 0
        self._delay = 1e-6

    def wait(self) -> None:
        """Call after an empty poll."""
        self._n += 1
        if self._n <= self.spins or self.ceiling <= 0:
            time.sleep(0)
            return
        time.sleep(min(self._delay, self.ceiling))
        self._delay *= 2
