"""What a plan costs: the paper's model, applied to the farm as it is built. Pure Python.

He Wangquan et al. (2016) treat each server as an M/M/1 queue of requests: ρ = λ/μ, a
request waits ``ρ / (μ − λ)`` when ρ < 1 and the server falls behind for good when ρ ≥ 1,
and a task's overhead is its request time over its run time. In nlevel a request has two
parts that queue at two different places, so each server is two queues:

* **its memory** (the board): a child's claim is three one-sided operations
  (fetch-and-add, read, compare-and-swap) that take ``atomic_time`` each from the claimer's
  side and occupy the owner's memory ``atomic_service`` each; claims queue there;
* **its CPU** (its thread): the reports its children send (completions, batched: a
  slave reports at most every ``report_age`` seconds while ids keep coming, a
  region-master flushes every ``batch_age``) and its own ticks, ``service_time`` each.
  When ρ_cpu ≥ 1 the server falls behind its reports for good and the job stretches to
  what that CPU can handle; below it, reports do not delay anybody's next range.

A worker's time per range is its claim (three operations plus the queue at its parent's
memory); the job also pays a start (the first claims all arrive at once, and the
hierarchy fills from the top), a tail (when the last ranges are handed out, the workers
end at different times: the equilibrium residual of a range, see :func:`tail_idle`) and
an end (the last completions travel up: one report per child, in a burst, at every
level). The prediction is the overhead the simulator and
the run report measure: ``1 - work / (procs x makespan)``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from ..errors import ConfigError
from .plan import Plan
from .queueing import kingman_wait

#: Work an automatic range holds (s). A claim between two ranges costs 100-250 µs of Python
#: on a CPU that has just woken from a task (measured on the 2-core VM with [2, 5] ms tasks:
#: 8 ms ranges lost 1.5-2 % of the work to claims; 20 ms ranges 1.4 %, 30 ms ranges 0.9 %,
#: against the one-sided counter's 0.7 %). Guided self-scheduling cuts ranges near the end
#: of the pool, so the tail does not grow with it, and a death re-runs at most this much
#: work per rank.
CHUNK_TARGET: Final = 30e-3

#: An automatic range holds at most 1/TAIL_RANGES of a process's share of the job's ids. When
#: the last ranges are handed out each worker still has about half a range to run, so ranges
#: sized from the task time alone lengthen a short job's tail: 1,024 processes x 100 tasks of
#: [2, 5] ms simulated 2.6 % with 8 ms ranges and 3.5 % with 30 ms ones; with this cap, 2 ids.
TAIL_RANGES: Final = 40


def auto_ids(task_mean: float, chunk_target: float, max_chunk: int, ids_per_proc: float | None = None) -> int:
    """Ids per automatic range: about ``chunk_target`` seconds of work, at most ``max_chunk``, and at
    most 1/:data:`TAIL_RANGES` of a process's share of the job (``ids_per_proc``, when known)."""
    n = max_chunk if task_mean <= 0 else int(chunk_target / task_mean)
    if ids_per_proc is not None:
        n = min(n, int(ids_per_proc / TAIL_RANGES))
    return max(1, min(max_chunk, n))

__all__ = ["Costs", "Workload", "LevelLoad", "Prediction", "predict", "tail_idle", "range_chunk"]

#: Operations a claim makes on its parent's board.
CLAIM_OPS: Final = 3

#: Seconds of consumption a server keeps published between two of its looks (the runtime's
#: ``Sizing.horizon``). A region-master keeps ``prefetch`` times a quarter of it in stock
#: (at least), which is what one sub-region may still run when its siblings have nothing.
HORIZON: Final = 0.01

#: The longest a region-master holds completions when tasks are long (see :func:`flush_age`).
LONG_AGE: Final = 1.0


def flush_age(batch_age: float, task_mean: float) -> float:
    """How long a region-master holds completions: ``batch_age``, or a quarter of a task when
    tasks are longer than four batch ages (at most :data:`LONG_AGE`, never under ``batch_age``)."""
    if task_mean <= 4 * batch_age:
        return batch_age
    return max(batch_age, min(task_mean / 4, LONG_AGE))


@dataclass(frozen=True)
class Costs:
    """The machine's and the protocol's costs (seconds unless said).

    Attributes:
        service_time: A server's CPU per message it handles (and per tick).
        msg_time: One message, one way.
        atomic_time: One one-sided operation as its origin sees it (a round trip).
        atomic_service: The time one operation occupies the target's memory (they queue).
        report_age: A worker reports its completions at least this often while it runs.
        batch_age: A region-master forwards completions at least this often.
        batch: ... or once this many are buffered.
        chunk_target: An automatic range holds about this much work.
        max_chunk: The largest automatic range.
        detect: An idle server notices a claimer waiting on its board within this.
        headroom: No server is planned above this ρ (on its CPU or its memory).
    """

    service_time: float
    msg_time: float
    atomic_time: float = 1e-6
    atomic_service: float = 2e-7
    report_age: float = 0.05
    batch_age: float = 0.05
    batch: int = 1024
    chunk_target: float = CHUNK_TARGET
    max_chunk: int = 256
    detect: float = 1e-3
    headroom: float = 0.7

    def __post_init__(self) -> None:
        for name in ("service_time", "msg_time", "atomic_time", "atomic_service", "report_age", "batch_age",
                     "chunk_target", "detect"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{name} must be a number of seconds >= 0, got {v!r}")
        if not self.service_time > 0:
            raise ConfigError(f"service_time must be > 0 s, got {self.service_time!r}")
        if not 0 < self.headroom <= 1:
            raise ConfigError(f"headroom must be in (0, 1], got {self.headroom!r}")


@dataclass(frozen=True)
class Workload:
    """The tasks (seconds).

    Attributes:
        procs: Processes of the farm.
        task_mean: Mean task time.
        task_var: Variance of the task times.
        task_max: The longest a task takes (the tail is the last ones).
        tasks: Number of tasks.
        nodes: Machine nodes the processes run on (regions of the first split are whole nodes:
            at most this many of them, when more than one).
    """

    procs: int
    task_mean: float
    task_var: float = 0.0
    task_max: float = 0.0
    tasks: int = 0
    nodes: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.procs, bool) or not isinstance(self.procs, int) or self.procs < 1:
            raise ConfigError(f"process count must be an integer >= 1, got {self.procs!r}")
        if not (isinstance(self.task_mean, (int, float)) and self.task_mean > 0 and math.isfinite(self.task_mean)):
            raise ConfigError(f"task time must be > 0 s, got {self.task_mean!r}")
        if self.task_var < 0 or self.tasks < 0:
            raise ConfigError(f"task time variance and task count must be >= 0, got {self.task_var!r}, {self.tasks!r}")

    @classmethod
    def uniform(cls, procs: int, lo: float, hi: float, tasks: int) -> Workload:
        """Tasks uniform in ``[lo, hi]`` seconds."""
        return cls(procs, (lo + hi) / 2, (hi - lo) ** 2 / 12, hi, tasks)

    def per_worker(self, workers: int) -> float:
        """Tasks per computing rank."""
        return self.tasks / max(1, workers) if self.tasks else 100.0


def range_chunk(plan: Plan, work: Workload, costs: Costs) -> int:
    """Ids per range: the plan's ``chunk``, else as the servers size them (``chunk_target`` of work)."""
    if plan.chunk:
        return plan.chunk
    return auto_ids(work.task_mean, costs.chunk_target, costs.max_chunk,
                    work.tasks / max(1, work.procs) if work.tasks else None)


def tail_idle(mean: float, var: float, longest: float, ranks: int) -> float:
    """Seconds a rank idles, on average, at the end of a job of ranges of the given durations.

    When the last range is handed out, every rank is busy with the rest of its current
    range: after many ranges that rest follows the equilibrium residual distribution, of
    mean ``E[X²] / (2 E[X])``. The job ends when the longest rest ends: for ``ranks``
    ranks close to ``longest``. For durations spread uniformly below ``longest`` the gap
    is about ``sqrt(π (longest - shortest) E[X] / (2 ranks))``; equal durations started
    together stay in step and leave no tail.
    """
    if var <= 0 or ranks <= 1:
        return 0.0
    residual = (var + mean * mean) / (2 * mean)
    spread = min(longest, mean + math.sqrt(3 * var)) - max(0.0, mean - math.sqrt(3 * var))
    top = max(longest, mean + math.sqrt(3 * var))
    gap = math.sqrt(math.pi * max(spread, 1e-12) * mean / (2 * ranks))
    return max(0.0, top - min(gap, top) - residual)


@dataclass(frozen=True)
class LevelLoad:
    """One kind of server of a plan: the busiest one of its depth.

    Attributes:
        level: 0 for the master, 1.. for region-masters.
        servers: How many servers of this kind.
        slaves: Computing ranks that claim from its leaf board (itself included when it computes).
        regions: Region-masters that claim blocks from its upper board.
        claims_per_s: Claims on its boards (its memory's λ).
        reports_per_s: Messages and ticks on its CPU (its CPU's λ).
        rho_cpu, rho_memory: The two queues' ρ.
        claim_s: A slave's claim here: the operations and the queue.
    """

    level: int
    servers: int
    slaves: int
    regions: int
    claims_per_s: float
    reports_per_s: float
    rho_cpu: float
    rho_memory: float
    claim_s: float


@dataclass(frozen=True)
class Prediction:
    """What the model predicts for a plan (seconds, fractions).

    Attributes:
        plan: The plan.
        chunk: Ids per range.
        levels: Per server kind.
        overhead: ``1 - work / (procs x makespan)``.
        makespan: Predicted seconds.
        parts: The makespan's parts: work per rank, claims, start, tail, end, and the
            stretch when a CPU cannot keep up.
        feasible: Every server below ``headroom`` on both queues.
        binding: What limits this plan most: ``"service_time"`` (a CPU), ``"atomic_service"``
            (a board's memory), ``"atomic_time"`` (the claims themselves), ``"tail"``,
            ``"start"`` or ``"msg_time"``.
    """

    plan: Plan
    chunk: int
    levels: tuple[LevelLoad, ...]
    overhead: float
    makespan: float
    parts: dict[str, float] = field(default_factory=dict)
    feasible: bool = True
    binding: str = ""

    @property
    def busiest(self) -> float:
        """The highest ρ of any server, CPU or memory."""
        return max((max(lv.rho_cpu, lv.rho_memory) for lv in self.levels), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (infinities as None)."""
        def clean(x: Any) -> Any:
            return None if isinstance(x, float) and not math.isfinite(x) else x

        return {
            "plan": self.plan.to_dict(),
            "chunk": self.chunk,
            "overhead": clean(self.overhead),
            "makespan_s": clean(self.makespan),
            "parts_s": {k: clean(v) for k, v in self.parts.items()},
            "feasible": self.feasible,
            "binding": self.binding,
            "busiest_rho": clean(self.busiest),
            "levels": [{k: clean(v) for k, v in asdict(lv).items()} for lv in self.levels],
        }


def _report_rate(range_s: float, report_age: float) -> float:
    """Reports per second from one worker whose ranges last ``range_s``: one per range, at most
    one per ``report_age`` (completions wait for the batch while ids keep coming)."""
    if range_s <= 0:
        return 0.0
    per = max(1, math.ceil(report_age / range_s)) if report_age > range_s else 1
    return 1.0 / (per * range_s)


def predict(plan: Plan, work: Workload, costs: Costs, dispersion: float = 1.0) -> Prediction:
    """Predict the overhead of running ``work`` under ``plan``.

    Every server of one depth has the same shape (the hierarchy splits blocks evenly), so
    one per depth is evaluated. ``dispersion`` is the measured variance-to-mean ratio of
    the arrivals (1 for Poisson): burstier arrivals queue longer (Kingman's formula).

    Raises:
        ConfigError / PlanError: on bad input, or a plan that does not fit ``work.procs``.
    """
    procs = work.procs
    plan.check_fits(procs)
    c = costs
    T = work.task_mean
    chunk = range_chunk(plan, work, costs)
    range_s = chunk * T
    splits = list(plan.regions)
    depth = len(splits)
    blocks = [float(procs)]
    for r in splits:
        blocks.append(blocks[-1] / r)
    leaf_block = blocks[-1]
    computes = plan.serve_only == "none"
    serve_only_all = plan.serve_only == "all"
    leaders = [1]
    for r in splits:
        leaders.append(leaders[-1] * r)
    new_servers = [1] + [leaders[k] - leaders[k - 1] for k in range(1, depth + 1)]
    workers = procs if computes else procs - (1 if plan.serve_only == "master" else sum(new_servers))
    workers = max(1, workers)
    per_worker = work.per_worker(workers)
    slave_reports = _report_rate(range_s, c.report_age)
    age = flush_age(c.batch_age, T)  # a region-master's batch age for these tasks
    claim_occupancy = CLAIM_OPS * c.atomic_service

    loads: list[LevelLoad] = []
    worst_stretch = 1.0
    binding_cpu = 0.0
    for k in range(depth + 1):
        own = computes or (plan.serve_only == "master" and k > 0)
        slaves = (leaf_block - 1) + (1 if own else 0)
        if serve_only_all and k < depth:
            slaves = leaf_block - 1
        regions = sum(splits[j] - 1 for j in range(k, depth))
        claims = slaves / range_s
        reports = (leaf_block - 1) * slave_reports
        ticks = 0.0
        for j in range(k, depth):
            sub_weight = blocks[j + 1]  # ranks that compute under one sub-region
            completions = sub_weight / T
            flushes = max(1.0 / age, completions / c.batch) if completions else 0.0
            refills = completions / max(1.0, chunk * sub_weight)  # a block: a range per worker of the region
            claims += (splits[j] - 1) * refills
            reports += (splits[j] - 1) * min(flushes, completions)
        if k > 0:
            ticks = 1.0 / age  # a region-master's batch age (it flushes when due)
        rho_cpu = (reports + ticks) * c.service_time
        rho_mem = claims * claim_occupancy
        wait = kingman_wait(claims, 1.0 / claim_occupancy, dispersion) if claim_occupancy else 0.0
        claim_s = CLAIM_OPS * c.atomic_time + wait
        loads.append(LevelLoad(k, new_servers[k], int(round(slaves)), int(round(regions)), claims, reports + ticks,
                               rho_cpu, rho_mem, claim_s))
        if rho_cpu > worst_stretch:
            worst_stretch = rho_cpu
        binding_cpu = max(binding_cpu, rho_cpu)
    feasible = all(max(lv.rho_cpu, lv.rho_memory) <= c.headroom for lv in loads)
    # A worker's claims go to its parent: the leaf servers for most (the deepest level).
    leaf = loads[-1]
    claim = leaf.claim_s if math.isfinite(leaf.claim_s) else math.inf
    ranges = per_worker / chunk
    work_s = per_worker * T
    claims_s = ranges * claim
    # The start: the first claims all arrive at once; the hierarchy fills from the top, one
    # notice (`detect`) and one handling per level, and each board serves its first burst.
    start = (depth + 1) * (c.detect + c.service_time) + max(
        (lv.slaves + lv.regions) * claim_occupancy for lv in loads) + CLAIM_OPS * c.atomic_time
    # The tail: guided self-scheduling cuts the last ranges to one id (fewer than two per worker
    # left), so the ranks end within one task of each other, not one range.
    tail = tail_idle(T, work.task_var, work.task_max, workers)
    # Stock stranded in regions: below the first level of regions, a sub-region's stock is cut
    # only once its own parent has run dry, so at the end one sub-region may still run its
    # stock (prefetch x a quarter horizon of work per rank) when its siblings have nothing.
    # Measured in the simulator: 8,192 and 32,768 ranks on 16 x 16 regions, 2-5 ms tasks.
    stranded = max(0, depth - 1) * plan.prefetch * HORIZON / 4
    # The end: every rank that runs out of ids reports what it has at once (its parent may be
    # waiting for exactly that), so each leaf server handles one report per child in a burst;
    # a region-master forwards once its children all wait, and its parent handles one flush
    # per region. These bursts are not spread by the batch ages; they begin as the first
    # ranks run out, so the tail hides the part of them it outlasts.
    burst = (leaf_block - 1) * c.service_time + sum((r - 1) * c.service_time for r in splits)
    end = max(0.0, burst - tail) + (depth + 1) * c.msg_time + c.detect
    makespan = work_s + claims_s + start + tail + end + stranded
    stretch = 0.0
    if worst_stretch > 1.0 and math.isfinite(makespan):
        # A CPU that cannot keep up: the job lasts as long as that CPU needs for its reports.
        stretched = worst_stretch * (work_s + claims_s)
        stretch = stretched - (work_s + claims_s)
        makespan += stretch
    if not math.isfinite(makespan):
        overhead = math.inf
    else:
        overhead = 1.0 - (workers * work_s) / (procs * makespan)
    parts = {"work": work_s, "claims": claims_s, "start": start, "tail": tail, "end": end, "stock": stranded,
             "stretch": stretch}
    over = {k: v for k, v in parts.items() if k != "work"}
    binding = max(over, key=lambda k: over[k]) if over else ""
    if binding == "stretch" or (binding_cpu > c.headroom):
        binding = "service_time"
    elif any(lv.rho_memory > c.headroom for lv in loads):
        binding = "atomic_service"
    elif binding == "claims":
        binding = "atomic_time"
    elif binding == "end":
        binding = "msg_time"
    return Prediction(plan, chunk, tuple(loads), overhead, makespan, parts, feasible, binding)
