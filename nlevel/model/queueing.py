"""The paper's model: Poisson arrivals, M/M/1 servers, and the plan it chooses. Pure Python.

He Wangquan et al. (2016), §2.2: task requests arriving at a server in a unit of time are
Poisson with rate λ (independent tasks, no memory, at most one arrival in a short enough
interval). A server answers μ requests per unit time; ρ = λ/μ.

* ρ > 1: no steady state, the server cannot keep up: add a level.
* ρ ≤ 1: mean wait (M/M/1) ``T_wait = ρ / (μ − λ)``; request cost
  ``T_req ≈ 2·T_msg + T_wait + T_dispose``; overhead ``T_req / (T_req + T_exe)``.
  Above the threshold C: split recursively.

:func:`predict` applies this to every server of a plan (a region-master's upward
requests are batched by its prefetch, so they add little to its parent's λ);
:func:`choose_plan` returns the smallest hierarchy whose predicted overhead is at
most C. :func:`fit_poisson` turns the master's per-interval request counts into λ̂ and
σ̂² (maximum likelihood) and says whether the counts look Poisson at all (dispersion
index test): the model is a model, and the report says when it does not fit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from ..errors import ConfigError
from .plan import Plan

__all__ = [
    "PoissonFit",
    "fit_poisson",
    "chi2_cdf",
    "mm1_wait",
    "LevelLoad",
    "Prediction",
    "Decision",
    "predict",
    "choose_plan",
    "sampling_rule",
]


@dataclass(frozen=True)
class PoissonFit:
    """Maximum-likelihood fit of per-interval arrival counts, with a dispersion test.

    Attributes:
        lam: λ̂, mean arrivals per interval (the Poisson MLE).
        var: σ̂², sample variance of the counts (equals λ for a Poisson process).
        samples: M, the number of intervals.
        interval: Length of one interval in seconds (so λ̂ / interval is per second).
        dispersion: σ̂² / λ̂ (1 for Poisson).
        p_value: Two-sided p-value of the dispersion test ((M−1)·σ̂²/λ̂ ~ χ²(M−1)).
        verdict: "poisson", "over-dispersed" (bursty) or "under-dispersed" (too regular).
    """

    lam: float
    var: float
    samples: int
    interval: float
    dispersion: float
    p_value: float
    verdict: str

    @property
    def rate(self) -> float:
        """λ̂ in arrivals per second."""
        return self.lam / self.interval

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, with the rate per second."""
        return {**asdict(self), "rate_per_s": self.rate}



def chi2_cdf(x: float, k: int) -> float:
    """P(X <= x) for X ~ chi-square with ``k`` degrees of freedom (the regularized lower gamma P(k/2, x/2)).

    Hand-written (series below a + 1, Lentz's continued fraction above, as in Numerical
    Recipes §6.2) instead of ``scipy.stats.chi2``: importing scipy.stats costs the planner
    0.5-1.7 s at set-up on this machine, which every ``--levels auto`` job would pay. The
    unit tests compare it with scipy to 1e-12.
    """
    if x <= 0:
        return 0.0
    a, z = k / 2.0, x / 2.0
    log_front = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1:
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1
            term *= z / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return min(1.0, total * math.exp(log_front))
    tiny = 1e-300
    b = z + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return max(0.0, 1.0 - math.exp(log_front) * h)


def fit_poisson(counts: Sequence[int], interval: float, alpha: float = 0.01) -> PoissonFit:
    """Fit λ̂ = mean and σ̂² = variance of ``counts`` and test the Poisson hypothesis.

    Raises:
        ConfigError: with fewer than 2 samples or a non-positive interval.
    """
    m = len(counts)
    if m < 2:
        raise ConfigError(f"a Poisson fit needs at least 2 samples, got {m}")
    if not interval > 0:
        raise ConfigError(f"sampling interval must be > 0 s, got {interval}")
    lam = sum(counts) / m
    var = sum((c - lam) ** 2 for c in counts) / (m - 1)
    if lam == 0:
        return PoissonFit(0.0, var, m, interval, 1.0, 1.0, "poisson" if var == 0 else "over-dispersed")
    dispersion = var / lam
    chi = (m - 1) * dispersion
    lower = chi2_cdf(chi, m - 1)
    p = 2 * min(lower, 1 - lower)
    if p >= alpha:
        verdict = "poisson"
    else:
        verdict = "over-dispersed" if dispersion > 1 else "under-dispersed"
    return PoissonFit(lam, var, m, interval, dispersion, min(1.0, p), verdict)


def mm1_wait(lam: float, mu: float) -> float:
    """Mean time in queue of an M/M/1 server, ``ρ / (μ − λ)``; ``inf`` when ρ ≥ 1."""
    if lam >= mu:
        return math.inf
    return (lam / mu) / (mu - lam)


@dataclass(frozen=True)
class LevelLoad:
    """The load of one kind of server in a plan (the busiest one of its level)."""

    level: int
    servers: int
    children: int
    arrival_rate: float  # λ, requests per second
    rho: float
    t_wait: float  # seconds (inf when rho >= 1)
    t_req: float  # seconds a child's request takes
    overhead: float  # T_req / (T_req + T_exe) for its slaves; > 1 means no steady state (then it is ρ)


@dataclass(frozen=True)
class Prediction:
    """What the model predicts for a plan."""

    plan: Plan
    levels: tuple[LevelLoad, ...]
    overhead: float  # weighted over workers; > 1 means some server has no steady state
    steady: bool
    prefetch: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "plan": self.plan.to_dict(),
            "overhead": self.overhead,
            "steady": self.steady,
            "prefetch": self.prefetch,
            "levels": [asdict(lv) for lv in self.levels],
        }


@dataclass(frozen=True)
class Decision:
    """The chosen plan, what it and the classic 2-level plan are predicted to cost, and why."""

    plan: Plan
    chosen: Prediction
    classic: Prediction
    threshold: float
    reason: str
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def predicted_overhead(self) -> float:
        """Predicted overhead fraction of the chosen plan."""
        return self.chosen.overhead

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; the keys ``levels``, ``regions_per_level``, ``predicted_overhead`` and
        ``classic_overhead`` are the stable interface of ``python -m nlevel.plan --json``."""
        return {
            "levels": self.plan.levels,
            "regions_per_level": list(self.plan.regions),
            "prefetch": self.plan.prefetch,
            "predicted_overhead": self.chosen.overhead,
            "classic_overhead": self.classic.overhead,
            "classic_steady_state": self.classic.steady,
            "threshold": self.threshold,
            "reason": self.reason,
            "inputs": self.inputs,
            "chosen": self.chosen.to_dict(),
            "classic": self.classic.to_dict(),
        }


def _check_inputs(procs: int, task_time: float, service_time: float, msg_time: float, threshold: float) -> None:
    if isinstance(procs, bool) or not isinstance(procs, int) or procs < 1:
        raise ConfigError(f"process count must be an integer >= 1, got {procs!r}")
    if not task_time > 0:
        raise ConfigError(f"task time must be > 0 s, got {task_time!r}")
    if not service_time > 0:
        raise ConfigError(f"service time must be > 0 s, got {service_time!r}")
    if not msg_time >= 0:
        raise ConfigError(f"message time must be >= 0 s, got {msg_time!r}")
    if not 0 < threshold < 1:
        raise ConfigError(f"threshold must be in (0, 1), got {threshold!r}")


def predict(
    plan: Plan,
    procs: int,
    task_time: float,
    service_time: float,
    msg_time: float,
    batch_age: float = 0.05,
) -> Prediction:
    """Predict the request overhead of ``plan`` on ``procs`` processes.

    Every server of one level has the same shape, so one per level is evaluated: the
    leaf servers (leaders of the last blocks) serve ``block - 1`` slaves one id per
    request; a server above also serves its sub-regions' region-masters, whose
    upward requests come once per half prefetch queue plus one completion flush per
    ``batch_age``. A computing server's own loop costs it service time too. λ is the
    demand ``1 / (T_exe + 2 T_msg + S)`` per slave, as in the paper.

    Raises:
        ConfigError / PlanError: on bad input or a plan that does not fit ``procs``.
    """
    _check_inputs(procs, task_time, service_time, msg_time, 0.5)
    plan.check_fits(procs)
    mu = 1.0 / service_time
    splits = list(plan.regions)
    depth_max = len(splits)
    # blocks[k]: ranks led by a server that first appears at depth k (k = 0: the master).
    blocks = [float(procs)]
    for r in splits:
        blocks.append(blocks[-1] / r)
    leaf = blocks[-1]
    computes = plan.serve_only == "none"

    def children(k: int) -> float:
        # Its leaf block's slaves, plus one region-master per other block of each split it leads.
        return (leaf - 1) + sum(splits[j] - 1 for j in range(k, depth_max))

    leaders = [1]
    for r in splits:
        leaders.append(leaders[-1] * r)
    new_servers = [1] + [leaders[k] - leaders[k - 1] for k in range(1, depth_max + 1)]

    # Demand: every slave asks once per task plus the unloaded request cost (the paper's
    # λ; a real run's rate self-regulates below μ only by making slaves wait).
    w = 1.0 / (task_time + 2 * msg_time + service_time)

    def up_rate(k: int) -> float:
        # A region-master refills half its queue (prefetch x its children) per request, and
        # flushes completions at least every batch_age.
        consumption = blocks[k] * w
        half_queue = max(1.0, plan.prefetch * (children(k) + 1) / 2)
        return consumption / half_queue + min(1.0 / batch_age, consumption)  # no more flushes than completions

    loads: list[LevelLoad] = []
    for k in range(depth_max + 1):
        lam = (leaf - 1) * w + (w if computes else 0.0)
        lam += sum((splits[j] - 1) * up_rate(j + 1) for j in range(k, depth_max))
        rho = lam / mu
        wait = mm1_wait(lam, mu)
        tr = 2 * msg_time + wait + service_time
        loads.append(
            LevelLoad(
                level=k,
                servers=new_servers[k],
                children=int(round(children(k))),
                arrival_rate=lam,
                rho=rho,
                t_wait=wait,
                t_req=tr,
                overhead=tr / (tr + task_time) if math.isfinite(tr) else rho,
            )
        )
    steady = all(lv.rho < 1 for lv in loads)
    overhead = max(lv.overhead for lv in loads) if steady else max(lv.rho for lv in loads)
    # Prefetch must cover a region-master's own upward request (so T_top_req stays hidden).
    up_req = max((lv.t_req for lv in loads[:-1]), default=0.0) if depth_max else 0.0
    need = max(2.0, float(math.ceil(4 * up_req / task_time))) if math.isfinite(up_req) else plan.prefetch
    return Prediction(plan, tuple(loads), overhead, steady, min(need, 64.0))


#: Splitting further must lower the predicted overhead by at least this much (absolute).
SPLIT_GAIN = 0.01


def _region_tuples(procs: int, splits: int) -> list[tuple[int, ...]]:
    """Region counts per split to try: every combination that fits when there are few,
    else equal splits (every block split the same way)."""
    limit = max(2, int((procs / 2) ** (1 / splits)) if splits > 1 else procs // 2)
    cands = _candidate_regions(procs // 2 if splits == 1 else max(2, procs // 2 ** splits))
    if splits == 1:
        return [(r,) for r in cands if 2 * r <= procs]
    combos = [()]  # type: list[tuple[int, ...]]
    for _ in range(splits):
        combos = [c + (r,) for c in combos for r in cands if 2 * math.prod(c + (r,)) <= procs]
        if len(combos) > 4000:
            return [(r,) * splits for r in _candidate_regions(limit) if 2 * r**splits <= procs]
    return combos


def _candidate_regions(limit: int) -> list[int]:
    """Region counts worth trying: all up to 64, then roughly 12 per doubling."""
    out = list(range(2, min(limit, 64) + 1))
    r = 64.0
    while r < limit:
        r *= 2 ** (1 / 12)
        out.append(min(limit, int(round(r))))
    return sorted(set(out))


def choose_plan(
    procs: int,
    task_time: float,
    service_time: float,
    msg_time: float,
    threshold: float = 0.10,
    task_time_spread: float = 0.0,
    max_levels: int = 5,
    serve_only: str = "none",
) -> Decision:
    """Return the smallest hierarchy whose predicted overhead is at most ``threshold``.

    "Smallest" means fewest levels, then fewest region-masters. When no plan reaches
    the threshold, the plan with the lowest predicted overhead is chosen and the
    reason says so. A classic plan with ρ > 1 is never chosen (no steady state).

    Raises:
        ConfigError: for a non-positive process count or task time, or a threshold outside (0, 1).
    """
    _check_inputs(procs, task_time, service_time, msg_time, threshold)
    inputs = {
        "procs": procs,
        "task_time_s": task_time,
        "task_time_spread_s": task_time_spread,
        "service_time_s": service_time,
        "msg_time_s": msg_time,
        "mu_per_s": 1.0 / service_time,
    }

    def make(levels: int, regions: tuple[int, ...]) -> Prediction:
        p = predict(Plan(levels, regions, serve_only=serve_only, chunk=1), procs, task_time, service_time, msg_time)
        plan = Plan(levels, regions, p.prefetch, 0, serve_only, "")
        return Prediction(plan, p.levels, p.overhead, p.steady, p.prefetch)

    classic = make(2, ()) if Plan(serve_only=serve_only).min_size() <= procs else None
    best: Prediction | None = None
    chosen: Prediction | None = classic if classic is not None and classic.overhead <= threshold else None
    if classic is not None:
        best = classic
    best_at: dict[int, Prediction] = {2: classic} if classic is not None else {}
    for levels in range(3, max_levels + 1):
        if chosen is not None:
            break
        splits = levels - 2
        if procs < 2 ** (splits + 1):
            break
        achieving: list[tuple[int, Prediction]] = []
        best_here: Prediction | None = None
        for regions in _region_tuples(procs, splits):
            pred = make(levels, regions)
            if best is None or pred.overhead < best.overhead - 1e-12:
                best = pred
            if best_here is None or pred.overhead < best_here.overhead - 1e-12:
                best_here = pred
            if pred.overhead <= threshold:
                achieving.append((math.prod(regions), pred))
        if achieving:
            chosen = min(achieving, key=lambda t: (t[0], t[1].overhead))[1]
        if best_here is not None:
            best_at[levels] = best_here
    assert best is not None
    if chosen is not None:
        n_rm = sum(n.servers for n in chosen.levels[1:]) if chosen.plan.levels > 2 else 0
        why = (
            f"smallest plan with predicted overhead {chosen.overhead:.2%} <= C={threshold:.0%}: "
            f"{chosen.plan.levels} levels, {n_rm} region-masters"
        )
        if classic is not None and chosen is not classic:
            why += (
                f"; classic 2-level predicted {classic.overhead:.2%}"
                + ("" if classic.steady else f" (rho={classic.levels[0].rho:.2f} > 1: no steady state)")
            )
    else:
        # The paper: above C, split recursively. With no plan under C, split while splitting
        # still helps: go one level deeper only if that lowers the prediction by more than
        # SPLIT_GAIN. (When the overhead is message time, not waiting, a hierarchy cannot help.)
        levels_tried = sorted(best_at)
        if not any(p.steady for p in best_at.values()):
            pick = best_at[levels_tried[-1]]  # no plan keeps up at all: split as deep as the world allows
        else:
            pick = best_at[levels_tried[0]]
            for lv in levels_tried[1:]:
                if best_at[lv].overhead < pick.overhead - SPLIT_GAIN:
                    pick = best_at[lv]
                else:
                    break
            if pick.plan.levels == 2 and not pick.steady and 3 in best_at:
                pick = best_at[3]  # rho > 1: the master cannot keep up, so a level is added regardless
        chosen = pick
        why = (
            f"no plan reaches C={threshold:.0%}: split while it helps by more than {SPLIT_GAIN:.0%} -> "
            f"{pick.plan.levels} levels, predicted {pick.overhead:.2%} (lowest of any plan {best.overhead:.2%}; "
            f"the rest is message and dispose time, which levels do not remove)"
        )
    plan = Plan(chosen.plan.levels, chosen.plan.regions, chosen.plan.prefetch, 0, serve_only, why)
    return Decision(plan, chosen, classic if classic is not None else chosen, threshold, why, inputs)


def sampling_rule(first_task_times: Sequence[float], workers: int) -> tuple[float, int]:
    """Return (sampling interval s, number of samples M) from the first tasks' run times.

    The interval is chosen so that about 10 requests arrive per interval at the
    expected rate ``workers / mean``, so each count says something (never shorter than
    1 ms nor longer than a mean task); M covers about 3 mean task times, at least 30
    and at most 300 samples so the fit is stable and the decision comes early.
    """
    if not first_task_times:
        raise ConfigError("the sampling rule needs at least one measured task time, got none")
    mean = max(sum(first_task_times) / len(first_task_times), 1e-6)
    rate = max(workers, 1) / mean
    interval = min(max(10.0 / rate, 1e-3), mean)
    m = int(min(300, max(30, math.ceil(3 * mean / interval))))
    return interval, m
