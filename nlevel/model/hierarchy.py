"""Lay a :class:`~nlevel.model.plan.Plan` out over ranks: role, parent and children of each rank.

Pure arithmetic, no MPI. Ranks are split into contiguous blocks (ranks of one node
are usually contiguous, so a region tends to stay on a node): the world is split
into ``regions[0]`` blocks, each of those into ``regions[1]``, and so on. The first
rank of a block leads it. The leader of the first block of a split is the leader of
the enclosing block too, so the master is also the region-master of its own region
(as in the paper). A server's children are the leaders of the other blocks of each
split it leads, plus, at the last level, every other rank of its block.

Example, 7 ranks, ``levels=3, regions=(2,)``: blocks [0..3] and [4..6]; rank 0 is
master with children 4 (a region-master) and 1, 2, 3 (its own slaves); rank 4
serves 5 and 6.

Ranks an operator drained before a plan switch are left *out* of the new layout: they
lead no block and compute nothing; each is a child of the master (role ``DRAINED``,
weight 0), which counts it as gone, so that what it still reports and its end reach a
live parent.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .plan import Plan

__all__ = ["Role", "Node", "Hierarchy", "build"]


class Role(str, Enum):
    """What a rank does."""

    MASTER = "master"
    REGION = "region-master"
    SLAVE = "slave"
    DRAINED = "drained"  # taken out of the job by an operator before this plan (see build's ``out``)
    DEAD = "dead"


@dataclass(frozen=True)
class Node:
    """One rank's place in the hierarchy.

    Attributes:
        rank: The rank in the farm's communicator.
        role: Master, region-master or slave; drained (left out of this plan) or dead.
        level: 0 for the master, 1.. for region-masters, ``levels - 1`` for slaves (and drained ranks).
        parent: The rank this one asks for ids (None for the master).
        children: The ranks that ask this one for ids.
        computes: Whether this rank runs tasks (servers may be serve-only).
        weight: Ranks that run tasks in this rank's subtree, itself included.
    """

    rank: int
    role: Role
    level: int
    parent: int | None
    children: tuple[int, ...]
    computes: bool
    weight: int


class Hierarchy:
    """The whole tree for ``size`` ranks under ``plan``; ``nodes[r]`` describes rank ``r``.

    ``failed``: the dead ranks it was built without; ``out``: the drained ranks it left out (see :func:`build`).
    """

    def __init__(self, size: int, plan: Plan, nodes: list[Node], failed: frozenset[int] = frozenset(),
                 out: frozenset[int] = frozenset()) -> None:
        self.size = size
        self.plan = plan
        self.nodes = nodes
        self.failed = failed
        self.out = out
        #: The master's rank: the lowest surviving rank.
        self.master = next((n.rank for n in nodes if n.role is Role.MASTER), 0)

    def __getitem__(self, rank: int) -> Node:
        return self.nodes[rank]

    def servers(self) -> list[Node]:
        """Return the master and region-masters, master first."""
        return [n for n in self.nodes if n.role in (Role.MASTER, Role.REGION)]

    def workers(self) -> int:
        """Return how many ranks run tasks."""
        return sum(1 for n in self.nodes if n.computes)

    def summary(self) -> dict[str, object]:
        """Return counts per role and level, for the report and the progress line."""
        per_level: dict[int, int] = {}
        for n in self.nodes:
            if n.role is not Role.DEAD and n.role is not Role.DRAINED:
                per_level[n.level] = per_level.get(n.level, 0) + 1
        return {
            "size": self.size,
            "levels": self.plan.levels,
            "region_masters": sum(1 for n in self.nodes if n.role is Role.REGION),
            "workers": self.workers(),
            "ranks_per_level": [per_level.get(k, 0) for k in range(self.plan.levels)],
            "master_children": sum(1 for c in self.nodes[self.master].children
                                   if self.nodes[c].role is not Role.DRAINED),
        }


def _split(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """Split ``[lo, hi)`` into ``parts`` contiguous blocks whose sizes differ by at most one."""
    n = hi - lo
    base, extra = divmod(n, parts)
    out = []
    start = lo
    for k in range(parts):
        stop = start + base + (1 if k < extra else 0)
        out.append((start, stop))
        start = stop
    return out


#: The last few hierarchies built, by (size, the plan object, failed, out): after a death every
#: survivor rebuilds the same one (16,384 stations of a simulation each took 0.1 s).
_RECENT: dict[tuple[int, int, frozenset[int], frozenset[int]], tuple[Plan, Hierarchy]] = {}


def build(size: int, plan: Plan, failed: frozenset[int] = frozenset(), out: frozenset[int] = frozenset()) -> Hierarchy:
    """Return the hierarchy of ``plan`` over ranks ``0 .. size - 1``, without the ``failed`` ranks.

    The same ``size``, plan object, ``failed`` and ``out`` give the same :class:`Hierarchy`
    object (it is never modified after it is built).

    Blocks are the same whoever died; each block is led by its lowest surviving rank
    (the region's deterministic election: no vote, every rank computes the same answer).
    A failed rank gets role ``DEAD``, no parent and no children.

    ``out``: ranks an operator drained (a plan switch lays its plan out without them; see
    :class:`~nlevel.roles.replan.Replanning`). Each gets role ``DRAINED``: it leads no block,
    computes nothing (weight 0) and is a child of the master, with no children. The master
    is still the lowest surviving rank, drained or not (then it serves only).

    Raises:
        PlanError: when the plan does not fit ``size`` ranks.
    """
    key = (size, id(plan), frozenset(failed), frozenset(out))
    hit = _RECENT.get(key)
    if hit is not None and hit[0] is plan:
        return hit[1]
    h = _build(size, plan, key[2], key[3] - key[2])
    if len(_RECENT) >= 8:
        _RECENT.clear()
    _RECENT[key] = (plan, h)
    return h


def _build(size: int, plan: Plan, failed: frozenset[int], out: frozenset[int]) -> Hierarchy:
    plan.check_fits(size)
    last = plan.levels - 1
    parent: list[int | None] = [None] * size
    level = [last] * size
    children: list[list[int]] = [[] for _ in range(size)]
    skip = failed | out if out else failed  # (ranks that lead nothing and serve under no region)

    def leader(lo: int, hi: int) -> int | None:
        return next((r for r in range(lo, hi) if r not in skip), None)

    def lay(lo: int, hi: int, depth: int, lead: int | None) -> None:
        # `lead` leads [lo, hi) from `depth` down.
        if lead is None:
            return
        if depth == last - 1:
            for r in range(lead + 1, hi):
                if r not in skip:
                    parent[r] = lead
                    children[lead].append(r)
            return
        blocks = _split(lo, hi, plan.regions[depth])
        leads = [leader(sub_lo, sub_hi) for sub_lo, sub_hi in blocks]
        for sub in leads:
            if sub is not None and sub != lead:
                parent[sub] = lead
                level[sub] = depth + 1
                children[lead].append(sub)
        for (sub_lo, sub_hi), sub in zip(blocks, leads):
            lay(sub_lo, sub_hi, depth + 1, sub)

    # The master: the lowest survivor, even when drained (it serves only; a drained master's
    # first block is led by its next rank, a region-master under it).
    top = next((r for r in range(size) if r not in failed), None)
    lay(0, size, 0, top)
    if top is not None:
        level[top] = 0
        for r in sorted(out):
            if r != top:
                parent[r] = top
                children[top].append(r)

    def serves_only(r: int) -> bool:
        if not children[r]:
            return False
        if plan.serve_only == "all":
            return True
        return plan.serve_only == "master" and r == 0

    computes = [not serves_only(r) and r not in skip for r in range(size)]
    weight = [1 if c else 0 for c in computes]
    # Children always have larger ranks than their parent: sum weights bottom-up.
    for r in range(size - 1, -1, -1):
        p = parent[r]
        if p is not None:
            weight[p] += weight[r]

    def role(r: int) -> Role:
        if r in failed:
            return Role.DEAD
        if r == top:
            return Role.MASTER
        if r in out:
            return Role.DRAINED
        return Role.REGION if children[r] else Role.SLAVE

    nodes = [
        Node(
            rank=r,
            role=role(r),
            level=level[r],
            parent=parent[r],
            children=tuple(children[r]),
            computes=computes[r],
            weight=weight[r],
        )
        for r in range(size)
    ]
    return Hierarchy(size, plan, nodes, frozenset(failed), out)
