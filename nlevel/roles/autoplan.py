"""The master's planner for ``--levels auto``: measure, fit, decide, re-decide. Pure Python.

The paper's procedure (§2.1), run inside the job:

1. start as classic 2-level;
2. once the first tasks' run times are known, fix a sampling interval and a number of
   samples M from them (:func:`nlevel.model.queueing.sampling_rule`) and count the task
   requests reaching the master in each interval;
3. fit λ̂ and σ̂² (maximum likelihood) and test the Poisson hypothesis;
4. with μ (measured: 1 / the master's time per request), T_msg and T_exe (reported by the
   slaves), predict the current plan and choose one (:func:`nlevel.model.queueing.choose_plan`).
   If the measured ρ̂ = λ̂/μ is higher than the model's, the model's service time is
   scaled up to match, so a master that is really saturated is never kept.

It switches when the chosen plan differs and the current one is predicted above C (or
the load has dropped so much that a smaller plan suffices), then samples again every
``replan_interval`` seconds, so a job whose tasks get longer or shorter is re-planned.
Every decision, with its inputs and reason, goes into the run report.
"""

from __future__ import annotations

import math
from typing import Any

from ..config import Config
from ..model.plan import Plan, parse_force
from ..model.queueing import choose_plan, fit_poisson, predict, sampling_rule
from ..stats import Summary

__all__ = ["AutoPlanner"]

DEFAULT_SERVICE = 5e-5  # s, until the master has served a request (README, Performance)


class AutoPlanner:
    """Decides the plan of a running job from what the master measures.

    Args:
        size: Processes in the job.
        config: Settings (threshold, replan interval, force_replan).
        plan: The plan the job starts with.
    """

    def __init__(self, size: int, config: Config, plan: Plan) -> None:
        self.size = size
        self.config = config
        self.plan = plan
        self.state = "warmup"
        self.first_task_times: list[float] = []
        self.task = Summary(11)
        self.msg = Summary(12)
        self.service = Summary(13)
        self.arrivals: list[float] = []
        self.window_start = 0.0
        self.interval = 0.0
        self.samples = 0
        self.next_window = 0.0
        self.decisions: list[dict[str, Any]] = []
        self.force = parse_force(config.force_replan)

    # -- measurements ----------------------------------------------------------------
    def on_tasks(self, tasks: int, busy: float, now: float) -> None:
        """A report reached the master: ``tasks`` finished below, taking ``busy`` seconds."""
        mean = busy / tasks
        self.task.add(mean)
        if self.state == "warmup":
            self.first_task_times.append(mean)

    def on_service(self, seconds: float) -> None:
        """The master spent ``seconds`` receiving, handling and answering one request."""
        self.service.add(seconds)

    # -- decisions ----------------------------------------------------------------------
    def tick(self, now: float, committed_fraction: float, master: Any = None) -> Plan | None:
        """Advance; return a plan to switch to, or None.

        ``master`` (the master's server) logs the time of every claim on its boards while
        a sampling window is open: those are the arrivals the Poisson fit counts.
        """
        if master is not None:
            if self.state == "sampling" and master.claim_log is None:
                master.claim_log = []
            elif self.state != "sampling" and master.claim_log is not None:
                master.claim_log = None
            if master.claim_log:
                self.arrivals.extend(master.claim_log)
                master.claim_log.clear()
        if self.force is not None and committed_fraction >= self.force[0]:
            plan = self.force[1]
            self.force = None
            self.decisions.append({"time": now, "reason": plan.reason, "switch_to": plan.to_dict()})
            return self._switch(plan, now)
        if self.size < 4:
            return None  # no hierarchy fits: classic it is
        if self.state == "warmup":
            if len(self.first_task_times) >= min(self.size - 1, 8):
                self._start_window(now, self.first_task_times)
            return None
        if self.state == "idle":
            if now >= self.next_window and self.task.n:
                self._start_window(now, [self.task.mean])
            return None
        if now < self.window_start + self.samples * self.interval:
            return None
        return self._decide(now)

    def next_check(self, now: float) -> float:
        """When :meth:`tick` next has something to do (a simulation ticks the master then)."""
        if self.state == "warmup":
            return now if len(self.first_task_times) >= min(self.size - 1, 8) else math.inf
        if self.state == "sampling":
            return self.window_start + self.samples * self.interval
        if self.state == "idle":
            return self.next_window
        return math.inf

    def _start_window(self, now: float, task_times: list[float]) -> None:
        workers = self.size if self.plan.serve_only == "none" else self.size - 1
        self.interval, self.samples = sampling_rule(task_times, workers)
        self.window_start = now
        self.arrivals = []
        self.state = "sampling"

    def _decide(self, now: float) -> Plan | None:
        counts = [0] * self.samples
        for t in self.arrivals:
            k = int((t - self.window_start) / self.interval)
            if 0 <= k < self.samples:
                counts[k] += 1
        fit = fit_poisson(counts, self.interval)
        self.state = "idle"
        self.next_window = now + self.config.replan_interval
        t_exe = self.task.mean
        service = self.service.mean if self.service.n else DEFAULT_SERVICE
        msg = self.msg.mean if self.msg.n else 0.0
        mu = 1.0 / service
        current = predict(self.plan, self.size, t_exe, service, msg)
        rho_measured = fit.rate / mu
        rho_model = current.levels[0].rho
        effective = service
        if rho_model > 0 and rho_measured > rho_model:
            effective = service * rho_measured / rho_model  # trust the measurement over the model
        current = predict(self.plan, self.size, t_exe, effective, msg)
        decision = choose_plan(self.size, t_exe, effective, msg, self.config.threshold, self.task.std)
        chosen = decision.plan
        same = (chosen.levels, chosen.regions) == (self.plan.levels, self.plan.regions)
        # Only a plan predicted above C is left (a smaller one that would also do is not worth
        # the move: switching back and forth between two acceptable plans costs every rank).
        switch = not same and current.overhead > self.config.threshold
        why = decision.reason
        if same:
            why = f"keep the current plan: {why}"
        elif not switch:
            why = f"keep the current plan (predicted {current.overhead:.2%} <= C); the model would also accept {chosen.describe()}"
        record = {
            "time": now,
            "poisson": fit.to_dict(),
            "mu_per_s": mu,
            "service_s": service,
            "service_s_effective": effective,
            "msg_s": msg,
            "task_mean_s": t_exe,
            "task_std_s": self.task.std,
            "rho_measured": rho_measured,
            "rho_model": rho_model,
            "current_plan": self.plan.to_dict(),
            "current_predicted": current.to_dict(),
            "chosen": decision.to_dict(),
            "switch": switch,
            "reason": why,
        }
        if fit.verdict != "poisson":
            record["model_note"] = (
                f"request counts are {fit.verdict} (dispersion {fit.dispersion:.2f}, p={fit.p_value:.3g}): "
                f"the M/M/1 prediction is an approximation here"
            )
        self.decisions.append(record)
        if not switch:
            return None
        return self._switch(Plan(chosen.levels, chosen.regions, chosen.prefetch, self.plan.chunk,
                                 self.plan.serve_only, why), now)

    def _switch(self, plan: Plan, now: float) -> Plan:
        self.plan = plan
        self.state = "idle"
        self.next_window = now + self.config.replan_interval
        return plan

    def report(self) -> list[dict[str, Any]]:
        """The decisions so far, JSON-ready (infinities as None)."""

        def clean(x: Any) -> Any:
            if isinstance(x, float) and not math.isfinite(x):
                return None
            if isinstance(x, dict):
                return {k: clean(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return [clean(v) for v in x]
            return x

        return [clean(d) for d in self.decisions]

