"""Choose a plan: the shape of the hierarchy that meets the overhead threshold C, with room to spare. Pure Python.

The paper adds a level whenever a server's ρ exceeds 1 or the overhead exceeds C. With
the cost model of :mod:`nlevel.model.cost` the planner searches rather than splits one
level at a time: the depth (2 to 6 levels), the regions of each split, and the ids per
range for short tasks (packing them, as the paper lets the user do by hand). A plan is
*acceptable* when no server is above ``headroom`` (0.7 by default: a near-saturated server
is a bad bet when the arrivals are only measured, not known) and its predicted overhead is
at most C. Among acceptable plans the one with the lowest predicted overhead is chosen,
except that a plan with fewer region-masters wins when it is within a tenth of it (or 0.1
points): every extra server is a rank that stops computing under ``serve_only`` and
another message on every path. When no plan is acceptable, the lowest predicted overhead
wins and the reason names the physical quantity that stops the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

from ..errors import ConfigError
from .cost import Costs, Prediction, Workload, auto_ids, predict
from .plan import Plan

__all__ = ["Decision", "choose_plan", "candidates", "first_plan", "servers", "BINDING", "CLASSIC_UP_TO"]

#: Up to this many processes a ``--levels auto`` job starts classic (one master keeps up with the first burst).
CLASSIC_UP_TO = 128

#: What each binding quantity means, for the reason of a decision.
BINDING = {
    "service_time": "a server's CPU cannot handle its children's reports (service time per message)",
    "atomic_service": "a board's memory cannot serve its children's claims (time per one-sided operation)",
    "atomic_time": "the claims themselves (one-sided operation latency) against such short tasks",
    "msg_time": "the last completions' way up (message time) against such a short job",
    "tail": "the last tasks: the ranks end at different times, which no plan changes",
    "start": "the start: the first claims all arrive at once and the hierarchy fills from the top",
}


@dataclass(frozen=True)
class Decision:
    """The chosen plan, its prediction, the classic plan's for comparison, and why.

    Attributes:
        plan: The chosen plan (its ``reason`` says why).
        chosen: Its prediction.
        classic: The classic 2-level plan's prediction (None when it does not fit).
        threshold: C.
        reason: One line.
        tried: How many plans were evaluated.
    """

    plan: Plan
    chosen: Prediction
    classic: Prediction | None
    threshold: float
    reason: str
    tried: int = 0
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def predicted_overhead(self) -> float:
        """Predicted overhead fraction of the chosen plan."""
        return self.chosen.overhead

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``levels``, ``regions_per_level``, ``predicted_overhead`` and
        ``classic_overhead`` are the stable interface of ``python -m nlevel.plan --json``."""
        classic = self.classic.overhead if self.classic is not None else None
        return {
            "levels": self.plan.levels,
            "regions_per_level": list(self.plan.regions),
            "chunk": self.chosen.chunk,
            "prefetch": self.plan.prefetch,
            "predicted_overhead": _finite(self.chosen.overhead),
            "classic_overhead": _finite(classic) if classic is not None else None,
            "feasible": self.chosen.feasible,
            "binding": self.chosen.binding,
            "busiest_rho": _finite(self.chosen.busiest),
            "threshold": self.threshold,
            "reason": self.reason,
            "tried": self.tried,
            "inputs": self.inputs,
            "chosen": self.chosen.to_dict(),
            "classic": self.classic.to_dict() if self.classic is not None else None,
        }


def _finite(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None


def _region_counts(limit: int) -> list[int]:
    """Region counts worth trying up to ``limit``: every one up to 16, then about 6 per doubling."""
    out = list(range(2, min(limit, 16) + 1))
    r = 16.0
    while r < limit:
        r *= 2 ** (1 / 6)
        out.append(min(limit, int(round(r))))
    return sorted(set(out))


def candidates(procs: int, task_mean: float, costs: Costs, serve_only: str = "none",
               max_levels: int = 6, nodes: int = 1) -> Iterator[Plan]:
    """Every plan worth evaluating on ``procs`` processes: depths, region counts, and for short
    tasks ids per range (1 to 64 tasks of work per claim). On several ``nodes`` the first split
    makes at most one region per node (a region never splits a node)."""
    for plan in _candidates(procs, task_mean, costs, serve_only, max_levels):
        if nodes <= 1 or not plan.regions or plan.regions[0] <= nodes:
            yield plan


def _candidates(procs: int, task_mean: float, costs: Costs, serve_only: str,
                max_levels: int) -> Iterator[Plan]:
    auto = auto_ids(task_mean, costs.chunk_target, costs.max_chunk)
    chunks = [0]
    if task_mean * auto < 0.05:  # short ranges: packing more per claim may pay
        chunks += [c for c in (2, 4, 8, 16, 32, 64) if c > auto]
    for chunk in chunks:
        if Plan(serve_only=serve_only).min_size() <= procs:
            yield Plan(2, (), chunk=chunk, serve_only=serve_only)
        for levels in range(3, max_levels + 1):
            splits = levels - 2
            if procs < 2 ** (splits + 1):
                break
            if splits == 1:
                for r in _region_counts(procs // 2):
                    yield Plan(3, (r,), chunk=chunk, serve_only=serve_only)
            elif splits == 2:
                for r1 in _region_counts(procs // 4):
                    for r2 in _region_counts(procs // (2 * r1)):
                        yield Plan(4, (r1, r2), chunk=chunk, serve_only=serve_only)
            else:
                for r in _region_counts(int((procs / 2) ** (1 / splits))):
                    if 2 * r ** splits <= procs:
                        yield Plan(levels, (r,) * splits, chunk=chunk, serve_only=serve_only)


def servers(p: Prediction) -> int:
    """Servers (the master and region-masters) the predicted plan runs."""
    return sum(lv.servers for lv in p.levels)


def choose_plan(work: Workload, costs: Costs, threshold: float = 0.10, serve_only: str = "none",
                dispersion: float = 1.0, max_levels: int = 6) -> Decision:
    """Return the plan for ``work`` (see the module's rules).

    Raises:
        ConfigError: for a threshold outside (0, 1), or bad costs or workload.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
        raise ConfigError(f"threshold must be in (0, 1), got {threshold!r}")
    preds = [predict(plan, work, costs, dispersion) for plan in candidates(work.procs, work.task_mean, costs,
                                                                            serve_only, max_levels, work.nodes)]
    if not preds:
        raise ConfigError(f"no plan fits {work.procs} processes with serve_only={serve_only!r}")
    classic = next((p for p in preds if p.plan.levels == 2 and not p.plan.chunk), None)
    ok = [p for p in preds if p.feasible and p.overhead <= threshold]
    if ok:
        best = min(p.overhead for p in ok)
        near = [p for p in ok if p.overhead <= best + max(0.1 * best, 0.001)]
        pick = min(near, key=lambda p: (servers(p), p.overhead))
        why = (f"predicted {pick.overhead:.2%} <= C={threshold:.0%} with every server at rho <= "
               f"{costs.headroom:.2f} (busiest {pick.busiest:.2f}); {pick.plan.levels} levels, "
               f"{servers(pick) - 1} region-masters, {pick.chunk} id(s) per range")
    else:
        pick = min(preds, key=lambda p: p.overhead)
        feasible = [p for p in preds if p.feasible]
        why = (f"no plan meets C={threshold:.0%} with rho <= {costs.headroom:.2f}: lowest predicted "
               f"{pick.overhead:.2%} ({pick.plan.levels} levels, {servers(pick) - 1} region-masters); "
               f"what stops it: {BINDING.get(pick.binding, pick.binding)}")
        if not feasible:
            why += "; every plan has a server above the headroom"
    if classic is not None and pick is not classic:
        why += f"; classic predicted {classic.overhead:.2%}" if math.isfinite(classic.overhead) else \
            "; classic cannot keep up"
    plan = replace(pick.plan, reason=why)
    inputs = {"procs": work.procs, "task_mean_s": work.task_mean, "task_var_s2": work.task_var,
              "task_max_s": work.task_max, "tasks": work.tasks, "service_time_s": costs.service_time,
              "msg_time_s": costs.msg_time, "atomic_time_s": costs.atomic_time,
              "atomic_service_s": costs.atomic_service, "dispersion": dispersion, "headroom": costs.headroom}
    return Decision(plan, replace(pick, plan=plan), classic, threshold, why, len(preds), inputs)


def first_plan(size: int, costs: Costs, threshold: float = 0.10, serve_only: str = "none", prefetch: float = 2.0,
               chunk: int = 0, task_time: float = 0.0, nodes: int = 1) -> Plan:
    """The plan a ``--levels auto`` job starts on, before anything is measured.

    The paper starts classic. That is right only where one master absorbs the first burst
    of requests: at tens of thousands of processes with short tasks the first burst alone
    outlasts the job. So: with a task-time hint, the plan the model chooses for it; else
    classic up to :data:`CLASSIC_UP_TO` processes, and above, a tree sized from the process
    count (at most about that many children per server). The reason says which.
    """
    if task_time > 0:
        d = choose_plan(Workload(size, task_time, nodes=nodes), costs, threshold, serve_only)
        return Plan(d.plan.levels, d.plan.regions, prefetch, chunk, serve_only,
                    f"auto: start on the model's plan for the task-time hint {task_time:g} s ({d.reason})")
    if size <= CLASSIC_UP_TO:
        return Plan(2, (), prefetch, chunk, serve_only,
                    f"auto: start classic ({size} <= {CLASSIC_UP_TO} processes: one master absorbs the first "
                    f"requests) until the first measurements decide")
    regions: tuple[int, ...]
    if size <= CLASSIC_UP_TO ** 2:
        regions = (max(2, math.ceil(size / CLASSIC_UP_TO)),)
    else:
        per = max(2, math.ceil(math.sqrt(size / CLASSIC_UP_TO)))
        regions = (per, per)
    if nodes > 1 and regions[0] > nodes:  # (a region never splits a node: whole nodes, at most one region each)
        regions = (nodes, *regions[1:])
    why = (f"auto: start on a tree sized from {size} processes (at most about {CLASSIC_UP_TO} children per server; "
           f"classic would take the first burst of {size} requests on one master) until the first measurements decide")
    plan = Plan(len(regions) + 2, regions, prefetch, chunk, serve_only, why)
    return plan if plan.min_size() <= size else Plan(2, (), prefetch, chunk, serve_only, why)
