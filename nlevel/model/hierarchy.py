"""Lay a :class:`~nlevel.model.plan.Plan` out over ranks: role, parent and children of each rank.

Pure arithmetic, no MPI. Ranks are split into contiguous blocks: the world is split
into ``regions[0]`` blocks, each of those into ``regions[1]``, and so on. When the ranks
run on several nodes (``node_sizes``: the ranks of each node, contiguous), a split of ranks
that span several nodes cuts only between nodes, so a region is one node or whole nodes and a
slave's claims stay on its node; a split inside one node divides its ranks as usual. The first
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

from ..errors import PlanError
from .plan import Plan

__all__ = ["Role", "Node", "Hierarchy", "build", "node_splits", "check_nodes", "nodes_of", "fit_nodes"]


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
                 out: frozenset[int] = frozenset(), node_sizes: tuple[int, ...] = ()) -> None:
        self.size = size
        self.plan = plan
        self.nodes = nodes
        self.failed = failed
        self.out = out
        #: Ranks per machine node, in rank order (empty: one node, or not known).
        self.node_sizes = node_sizes
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


def _split(lo: int, hi: int, parts: int, bounds: tuple[int, ...] = ()) -> list[tuple[int, int]]:
    """Split ``[lo, hi)`` into ``parts`` contiguous blocks whose sizes differ by at most one; when
    node boundaries (``bounds``) fall inside it, into ``parts`` groups of whole nodes instead
    (as even as whole nodes allow), or, with fewer nodes than parts, one block per node."""
    inner = [b for b in bounds if lo < b < hi]
    if inner:
        return _group_nodes([lo, *inner, hi], parts)
    n = hi - lo
    base, extra = divmod(n, parts)
    out = []
    start = lo
    for k in range(parts):
        stop = start + base + (1 if k < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def _group_nodes(edges: list[int], parts: int) -> list[tuple[int, int]]:
    """The nodes between consecutive ``edges`` in ``parts`` contiguous groups of about equal ranks."""
    k = len(edges) - 1
    if parts >= k:
        return [(edges[i], edges[i + 1]) for i in range(k)]
    lo, hi = edges[0], edges[-1]
    cuts = [0]
    for j in range(1, parts):
        target = lo + (hi - lo) * j / parts
        # the node edge nearest the even cut, leaving at least one node to each group on both sides
        first, last = cuts[-1] + 1, k - (parts - j)
        best = min(range(first, last + 1), key=lambda i: (abs(edges[i] - target), i))
        cuts.append(best)
    cuts.append(k)
    return [(edges[cuts[i]], edges[cuts[i + 1]]) for i in range(parts)]


def node_splits(size: int, plan: Plan, node_sizes: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """The splits of ``plan`` that would have to cut a node: ``(level, regions asked, nodes there)``.

    A split of ranks spanning ``k`` nodes into more than ``k`` regions cannot keep every node
    whole; :func:`build` then makes one region per node (fewer than asked).
    """
    bounds = _bounds(node_sizes)
    out: list[tuple[int, int, int]] = []

    def walk(lo: int, hi: int, depth: int) -> None:
        if depth >= plan.levels - 2:
            return
        inner = [b for b in bounds if lo < b < hi]
        parts = plan.regions[depth]
        if inner and parts > len(inner) + 1:
            out.append((depth + 1, parts, len(inner) + 1))
        for sub_lo, sub_hi in _split(lo, hi, parts, bounds):
            walk(sub_lo, sub_hi, depth + 1)

    if len(bounds) > 0:
        walk(0, size, 0)
    return out


def check_nodes(size: int, plan: Plan, node_sizes: tuple[int, ...]) -> None:
    """Raise PlanError when ``plan`` asks for more regions than there are nodes to keep whole.

    Raises:
        PlanError: naming the level, the regions asked and the nodes there.
    """
    bad = node_splits(size, plan, node_sizes)
    if bad:
        level, parts, nodes = bad[0]
        raise PlanError(
            f"regions {parts} at level {level} would split a node: those ranks run on {nodes} nodes "
            f"({', '.join(map(str, node_sizes))} ranks per node); ask for at most {nodes} regions there, "
            f"or allow it with --split-nodes")


def nodes_of(hosts: list[str] | tuple[str, ...]) -> tuple[int, ...] | None:
    """Ranks per node from every rank's host name, in rank order; None when the ranks of a node are
    not contiguous (``mpiexec --map-by node``: the layout then follows ranks, not nodes)."""
    sizes: list[int] = []
    seen: set[str] = set()
    prev = None
    for h in hosts:
        if h != prev:
            if h in seen:
                return None
            seen.add(h)
            sizes.append(0)
            prev = h
        sizes[-1] += 1
    return tuple(sizes) if len(sizes) > 1 else ()


def fit_nodes(size: int, plan: Plan, node_sizes: tuple[int, ...]) -> Plan:
    """``plan`` with no more regions at each split than the nodes there keep whole (the planner's and
    a plan sized from the process count alone; a user's ``--regions`` is checked by :func:`check_nodes`)."""
    from dataclasses import replace

    for _ in range(plan.levels):
        bad = node_splits(size, plan, node_sizes)
        if not bad:
            return plan
        level, _, nodes = bad[0]
        regions = list(plan.regions)
        regions[level - 1] = nodes
        plan = replace(plan, regions=tuple(regions))
    return plan


def _bounds(node_sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The first rank of every node but the first."""
    out, at = [], 0
    for n in node_sizes[:-1]:
        at += n
        out.append(at)
    return tuple(out)


#: The last few hierarchies built, by (size, the plan object, failed, out): after a death every
#: survivor rebuilds the same one (16,384 stations of a simulation each took 0.1 s).
_RECENT: dict[tuple[int, int, frozenset[int], frozenset[int], tuple[int, ...]], tuple[Plan, Hierarchy]] = {}


def build(size: int, plan: Plan, failed: frozenset[int] = frozenset(), out: frozenset[int] = frozenset(),
          node_sizes: tuple[int, ...] = ()) -> Hierarchy:
    """Return the hierarchy of ``plan`` over ranks ``0 .. size - 1``, without the ``failed`` ranks.

    The same ``size``, plan object, ``failed`` and ``out`` give the same :class:`Hierarchy`
    object (it is never modified after it is built).

    Blocks are the same whoever died; each block is led by its lowest surviving rank
    (the region's deterministic election: no vote, every rank computes the same answer).
    A failed rank gets role ``DEAD``, no parent and no children.

    ``node_sizes``: ranks per node in rank order (the ranks of a node contiguous); a split of
    ranks spanning several nodes cuts only between nodes (see :func:`_split`); empty: one node.

    ``out``: ranks an operator drained (a plan switch lays its plan out without them; see
    :class:`~nlevel.roles.replan.Replanning`). Each gets role ``DRAINED``: it leads no block,
    computes nothing (weight 0) and is a child of the master, with no children. The master
    is still the lowest surviving rank, drained or not (then it serves only).

    Raises:
        PlanError: when the plan does not fit ``size`` ranks.
    """
    if node_sizes and (sum(node_sizes) != size or min(node_sizes) < 1):
        raise PlanError(f"node sizes {list(node_sizes)} do not add up to {size} ranks")
    if len(node_sizes) == 1:
        node_sizes = ()
    key = (size, id(plan), frozenset(failed), frozenset(out), node_sizes)
    hit = _RECENT.get(key)
    if hit is not None and hit[0] is plan:
        return hit[1]
    h = _build(size, plan, key[2], key[3] - key[2], node_sizes)
    if len(_RECENT) >= 8:
        _RECENT.clear()
    _RECENT[key] = (plan, h)
    return h


def _build(size: int, plan: Plan, failed: frozenset[int], out: frozenset[int],
           node_sizes: tuple[int, ...] = ()) -> Hierarchy:
    plan.check_fits(size)
    bounds = _bounds(node_sizes)
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
        blocks = _split(lo, hi, plan.regions[depth], bounds)
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
    return Hierarchy(size, plan, nodes, frozenset(failed), out, node_sizes)
