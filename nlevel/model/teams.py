"""Where teams go: the ranks of a job, grouped by node, cut into teams of ``k`` (pure arithmetic).

A task that needs ``k`` processes runs on a *team* of ``k`` ranks. The runtime groups the
job's ranks by node (``nlevel.runtime.teams``) and asks :func:`layout` for the teams:

* a node that holds ``k`` ranks or more is cut into teams of ``k`` consecutive ranks (in rank
  order within the node); what is left of it (its size modulo ``k``) is in no team: a team
  never spans two nodes when one node can hold it;
* nodes smaller than ``k`` are taken whole, in node order, until they hold ``k`` ranks: a team
  of 8 on nodes of 4 ranks is two whole nodes. When ``k`` is not a multiple of their sizes the
  team uses the first ``k`` ranks of the nodes it took, and the rest of its last node is left
  over (it never starts another team: no node is shared by two teams that span nodes); nodes
  at the end that cannot make ``k`` ranks are left over.

Ranks left over run no task; the runtime names them in one warning line (:func:`left_over_line`).

:func:`assign_devices` then gives each team its own GPUs from its node's list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["TeamLayout", "layout", "left_over_line", "assign_devices", "DeviceShortage"]


@dataclass(frozen=True)
class TeamLayout:
    """The teams of one job.

    Attributes:
        k: Ranks per team.
        teams: Each team's ranks (of the user's communicator), in rank order: the first is its leader.
            Teams are in the order of their leaders' ranks.
        left: Ranks in no team.
        nodes: The ranks of each node, as given (sorted), nodes in the order of their lowest rank.
    """

    k: int
    teams: tuple[tuple[int, ...], ...]
    left: tuple[int, ...]
    nodes: tuple[tuple[int, ...], ...]

    def team_of(self, rank: int) -> int | None:
        """The index of ``rank``'s team (None: left over)."""
        for i, team in enumerate(self.teams):
            if rank in team:
                return i
        return None

    @property
    def leaders(self) -> tuple[int, ...]:
        """Each team's first rank, which takes part in the farm for the team."""
        return tuple(t[0] for t in self.teams)

    def node_of(self, rank: int) -> int:
        """The index of ``rank``'s node."""
        for i, node in enumerate(self.nodes):
            if rank in node:
                return i
        raise ValueError(f"rank {rank} is on no node of this layout")


def layout(nodes: Sequence[Sequence[int]], k: int) -> TeamLayout:
    """Cut the ranks of ``nodes`` (each node's ranks) into teams of ``k`` (see the module's docstring).

    Raises:
        ValueError: ``k`` is not an integer >= 1, or a rank appears twice.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"ranks per task must be an integer >= 1, got {k!r}")
    ordered = sorted((tuple(sorted(n)) for n in nodes if len(n)), key=lambda n: n[0])
    seen = [r for n in ordered for r in n]
    if len(seen) != len(set(seen)):
        raise ValueError(f"a rank is on two nodes: {ordered}")
    teams: list[tuple[int, ...]] = []
    left: list[int] = []
    pending: list[tuple[int, ...]] = []  # small nodes taken whole, not yet k ranks
    for node in ordered:
        if len(node) >= k:
            full = len(node) - len(node) % k
            teams += [node[i:i + k] for i in range(0, full, k)]
            left += node[full:]
            continue
        pending.append(node)
        ranks = [r for n in pending for r in n]
        if len(ranks) >= k:
            teams.append(tuple(ranks[:k]))
            left += ranks[k:]
            pending = []
    left += [r for n in pending for r in n]
    teams.sort(key=lambda t: t[0])
    return TeamLayout(k, tuple(teams), tuple(sorted(left)), tuple(ordered))


def left_over_line(lay: TeamLayout, names: Sequence[str] | None = None) -> str:
    """The one warning line naming the ranks in no team ("" when every rank is in one).

    Args:
        lay: The layout.
        names: Each node's name (by node index), for the message.
    """
    if not lay.left:
        return ""
    sizes = sorted({len(n) for n in lay.nodes})
    where = ""
    if names is not None:
        hosts = sorted({names[lay.node_of(r)] for r in lay.left})
        where = f" (on {', '.join(hosts)})"
    shown = ", ".join(map(str, lay.left))
    size_text = "/".join(map(str, sizes))
    return (f"rank{'s' if len(lay.left) > 1 else ''} {shown}{where} in no team of {lay.k}: "
            f"{len(lay.teams)} team(s) fit nodes of {size_text} rank(s); "
            f"{'they run no task and wait' if len(lay.left) > 1 else 'it runs no task and waits'} for the job's end")


class DeviceShortage(ValueError):
    """A node has fewer devices than its teams need (the message names the numbers)."""


def assign_devices(lay: TeamLayout, devices: Sequence[Sequence[str]], per_task: int,
                   names: Sequence[str] | None = None, variable: str = "") -> dict[int, tuple[str, ...]]:
    """Give each team ``per_task`` devices of its own from each of its nodes' lists.

    The teams present on a node are numbered in rank order; the ``j``-th gets the node's
    devices ``[j * per_task, (j + 1) * per_task)``. Every rank of a team gets its node's share
    (a team spanning nodes has a share on each; it holds those nodes alone). Ranks in no team
    get no device.

    Args:
        lay: The layout.
        devices: Each node's device list (by node index), as the allocation names them.
        per_task: Devices per team (0: every rank gets an empty tuple: the caller leaves them alone).
        names: Node names, for the message.
        variable: Where the list came from (e.g. ``CUDA_VISIBLE_DEVICES``), for the message.

    Returns:
        rank -> its devices.

    Raises:
        DeviceShortage: a node has fewer than (its teams) x ``per_task`` devices.
    """
    out: dict[int, tuple[str, ...]] = {r: () for n in lay.nodes for r in n}
    if per_task <= 0:
        return out
    for i, node in enumerate(lay.nodes):
        here = [t for t in lay.teams if any(r in node for r in t)]
        need = len(here) * per_task
        have = list(devices[i]) if i < len(devices) else []
        if need > len(have):
            name = names[i] if names is not None else f"node {i}"
            listed = f" ({variable}={','.join(have)})" if variable and have else ""
            raise DeviceShortage(
                f"gpus_per_task {per_task}: node {name} has {len(have)} GPU(s){listed} for {len(here)} team(s) "
                f"there: {need} needed; expected at most {len(have) // max(1, len(here))} per task "
                f"(or fewer ranks per node)")
        for j, team in enumerate(here):
            share = tuple(have[j * per_task:(j + 1) * per_task])
            for r in team:
                if r in node:
                    out[r] = share
    return out
