"""What a server knows of one of its children: the ids it holds, its weight, when it was last heard. Pure Python."""

from __future__ import annotations

from ..ranges import RangeSet

__all__ = ["Child"]


class Child:
    """What a server knows of one child (a rank, or its own worker)."""

    __slots__ = ("rank", "weight", "kind", "held", "left", "heard", "leased", "gone_weight", "running", "running_at")

    def __init__(self, rank: int, weight: int, kind: int) -> None:
        self.rank = rank
        self.weight = weight
        self.kind = kind
        self.held = RangeSet()  # ids it took and has not reported finished or given back
        self.left = False  # it said it leaves (nothing more comes from it)
        self.heard = 0.0  # when it last took ids or reported (its lease runs from here)
        self.leased = ""  # why it is being killed: its lease expired, or its task ran past the time limit
        self.gone_weight = 0  # a sub-region: ranks of its weight that left or died, as it last said
        self.running = 0.0  # seconds its subtree had spent in tasks still running, at its last heartbeat ...
        self.running_at = 0.0  # ... heard then
