"""The queueing pieces of the paper's model: Poisson arrivals, their fit, and queue waits. Pure Python.

He Wangquan et al. (2016), §2.2: task requests arriving at a server in a unit of time are
Poisson with rate λ (independent tasks, no memory, at most one arrival in a short enough
interval). A server answers μ requests per unit time; ρ = λ/μ; ρ > 1 means no steady state,
and below it an M/M/1 server makes a request wait ``ρ / (μ − λ)``.

:func:`fit_poisson` turns per-interval arrival counts into λ̂ and σ̂² (maximum likelihood)
and says whether they look Poisson at all (the dispersion index test); :func:`kingman_wait`
is the wait when they do not (bursts queue longer); :func:`sampling_rule` chooses how long
and how often the master counts. What a whole plan costs is :mod:`nlevel.model.cost`; the
choice of a plan, :mod:`nlevel.model.planner`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from ..errors import ConfigError

__all__ = [
    "PoissonFit",
    "fit_poisson",
    "chi2_cdf",
    "mm1_wait",
    "kingman_wait",
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


def kingman_wait(lam: float, mu: float, dispersion: float = 1.0) -> float:
    """Mean time in queue when arrivals are burstier (or more regular) than Poisson.

    Kingman's G/G/1 approximation ``ρ/(1−ρ) · (c_a² + c_s²)/2 · 1/μ`` with the arrivals'
    squared coefficient of variation taken as the counts' ``dispersion`` (variance over
    mean; 1 for Poisson) and exponential service: at dispersion 1 it is exactly the
    M/M/1 wait :func:`mm1_wait`. ``inf`` when ρ ≥ 1.
    """
    if lam <= 0:
        return 0.0
    if lam >= mu:
        return math.inf
    rho = lam / mu
    return rho / (1 - rho) * (max(dispersion, 0.0) + 1.0) / 2 / mu


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
