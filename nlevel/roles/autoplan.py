"""The master's planner for ``--levels auto``: the paper's procedure, run inside the job. Pure Python.

1. **Start.** The paper starts classic (2 levels). That is right only where one master
   absorbs the first burst of requests; at tens of thousands of processes with short tasks
   the first burst alone outlasts the job. So the job starts classic up to
   :data:`~nlevel.model.planner.CLASSIC_UP_TO` processes, else on a tree sized from the
   process count, or, when the user gives a task-time hint, on the plan the model chooses
   for it (:func:`nlevel.model.planner.first_plan`). The report says which start and why.
2. **Sample.** Once the first tasks' run times are known (from the first reports), the
   sampling interval and the number of samples M come from them
   (:func:`nlevel.model.queueing.sampling_rule`). During the window the master counts
   what arrives at each of its two queues: messages at its CPU (reports, flushes) and
   claims at its boards; and it times its own handling of each message (μ, measured while
   serving).
3. **Fit.** λ̂ and σ̂² of each count (maximum likelihood), and the dispersion test: counts
   burstier than Poisson queue longer (Kingman), and the plan keeps more headroom.
4. **Decide.** The measured workload (task mean, variance, longest) and costs (the
   measured service time; where the measured ρ is above the model's, the service time is
   scaled up to match) go through the model (:mod:`nlevel.model.cost`); a plan predicted
   above C, or with a server above the headroom, or a measured ρ ≥ 1, is replaced by the
   planner's choice (:mod:`nlevel.model.planner`) when that choice is predicted better.
   A plan with fewer servers that the measurements accept (under C, every server under the
   headroom, predicted no worse than the current one plus half a point) replaces the current
   one too, when the switch itself (bounded by one service time per process) costs under half
   a point of what remains: the start tree sized from the process count was a guess, and the
   paper's rule is the shallowest plan that meets C.
   Every decision, with its inputs and reason, goes into the run report; then the master
   samples again every ``replan_interval`` seconds (two task-times at least), so a job whose tasks
   change is re-planned.
"""

from __future__ import annotations

import math
from typing import Any

from ..config import Config
from ..model.cost import Costs, Workload, predict
from ..model.plan import Plan, parse_force
from ..model.planner import choose_plan, servers
from ..model.queueing import fit_poisson, sampling_rule
from ..stats import Summary

__all__ = ["AutoPlanner", "costs_of"]

#: Decisions the planner keeps besides the start and its switches (the oldest others are dropped, counted).
KEPT = 128


def costs_of(config: Config, service_time: float | None = None) -> Costs:
    """The model's costs from the settings (and a measured service time, when there is one)."""
    return Costs(service_time if service_time else config.service_time, config.msg_time, config.atomic_time,
                 config.atomic_service, config.report_age, config.batch_age, config.batch, config.chunk_target,
                 config.max_chunk, headroom=config.headroom)


class AutoPlanner:
    """Decides the plan of a running job from what the master measures.

    Args:
        size: Processes in the job.
        config: Settings (threshold, headroom, replan interval, costs, force_replan).
        plan: The plan the job starts on.
        total: Tasks in the job.
    """

    def __init__(self, size: int, config: Config, plan: Plan, total: int = 0, nodes: int = 1) -> None:
        self.size = size
        self.nodes = nodes  # machine nodes: a region of the first split is whole nodes
        self.config = config
        self.plan = plan
        self.total = total
        self.state = "warmup"
        self.first_task_times: list[float] = []
        self.task = Summary(quantiles=False)
        self.task_sq = 0.0  # sum of squared task times (reports carry it): the variance
        self.task_max = 0.0
        self.service = Summary(quantiles=False)
        self.messages: list[float] = []
        self.claims: list[float] = []
        self.window_start = 0.0
        self.interval = 0.0
        self.samples = 0
        self.next_window = 0.0
        self.decisions: list[dict[str, Any]] = [{"time": 0.0, "start": plan.to_dict(), "reason": plan.reason}]
        self.made = 1  # decisions made, kept or not (see _record)
        self.dropped = 0  # decisions not kept
        self.force = parse_force(config.force_replan)
        self.committed = 0.0  # fraction of the tasks committed, as of the last tick

    @property
    def workers(self) -> int:
        """Ranks that run tasks under the current plan."""
        return self.size - (1 if self.plan.serve_only == "master" else 0)

    # -- measurements ----------------------------------------------------------------
    def on_tasks(self, tasks: int, busy: float, busy_sq: float, longest: float, now: float) -> None:
        """A report reached the master: ``tasks`` finished below, taking ``busy`` seconds."""
        mean = busy / tasks
        self.task.add_many(mean, tasks, longest)
        self.task_sq += busy_sq if busy_sq > 0 else tasks * mean * mean
        self.task_max = max(self.task_max, longest)
        if self.state == "warmup":
            self.first_task_times.append(mean)

    def on_message(self, now: float) -> None:
        """A message reached the master's CPU."""
        if self.state == "sampling":
            self.messages.append(now)

    def on_service(self, seconds: float) -> None:
        """The master spent ``seconds`` handling one message (its μ, measured while it serves)."""
        if seconds > 0:
            self.service.add(seconds)

    # -- decisions ----------------------------------------------------------------------
    def tick(self, now: float, committed_fraction: float, master: Any = None) -> Plan | None:
        """Advance; return a plan to switch to, or None.

        ``master`` (the master's server) logs the time of every claim on its boards while a
        sampling window is open: those are the claims' arrivals.
        """
        self.committed = committed_fraction
        if master is not None:
            if self.state == "sampling" and master.claim_log is None:
                master.claim_log = []
            elif self.state != "sampling" and master.claim_log is not None:
                master.claim_log = None
            if master.claim_log:
                self.claims.extend(master.claim_log)
                master.claim_log.clear()
        if self.force is not None and committed_fraction >= self.force[0]:
            plan = self.force[1]
            self.force = None
            self._record({"time": now, "reason": plan.reason, "switch_to": plan.to_dict(), "switch": True})
            return self._switch(plan, now)
        if self.size < 4:
            return None  # no hierarchy fits: classic it is
        if self.state == "warmup":
            if len(self.first_task_times) >= min(self.workers - 1, 8) and self.first_task_times:
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
            return now if len(self.first_task_times) >= min(self.workers - 1, 8) else math.inf
        if self.state == "sampling":
            return self.window_start + self.samples * self.interval
        if self.state == "idle":
            return self.next_window
        return math.inf

    def _start_window(self, now: float, task_times: list[float]) -> None:
        self.interval, self.samples = sampling_rule(task_times, self.workers)
        self.window_start = now
        self.messages = []
        self.claims = []
        self.state = "sampling"

    def _counts(self, times: list[float]) -> list[int]:
        counts = [0] * self.samples
        for t in times:
            k = int((t - self.window_start) / self.interval)
            if 0 <= k < self.samples:
                counts[k] += 1
        return counts

    def _decide(self, now: float) -> Plan | None:
        msgs = fit_poisson(self._counts(self.messages), self.interval)
        claims = fit_poisson(self._counts(self.claims), self.interval)
        self.state = "idle"
        c = self.config
        mean = self.task.mean
        # (at least two task-times apart: with 60-180 s tasks a decision every 5 s sees the same
        # load, and 32,768 ranks' simulation spent a quarter of its time in 760 of them)
        self.next_window = now + max(c.replan_interval, 2 * mean)
        var = max(0.0, self.task_sq / self.task.n - mean * mean) if self.task.n else 0.0
        work = Workload(self.size, mean, var, self.task_max, self.total, self.nodes)
        measured_s = self.service.mean if self.service.n else 0.0
        costs = costs_of(c, measured_s)
        dispersion = max(msgs.dispersion, claims.dispersion) if msgs.verdict == "over-dispersed" or \
            claims.verdict == "over-dispersed" else 1.0
        current = predict(self.plan, work, costs, dispersion)
        rho_cpu = msgs.rate * costs.service_time
        rho_mem = claims.rate * 3 * costs.atomic_service
        model_cpu = current.levels[0].rho_cpu
        if model_cpu > 0 and rho_cpu > model_cpu:
            # The master is busier than the model says: trust the measurement (its reports cost more).
            costs = costs_of(c, costs.service_time * rho_cpu / model_cpu)
            current = predict(self.plan, work, costs, dispersion)
        if dispersion > 1:
            # Bursts queue longer: keep more headroom (Kingman: waits grow with (1 + dispersion) / 2).
            costs = Costs(costs.service_time, costs.msg_time, costs.atomic_time, costs.atomic_service,
                          costs.report_age, costs.batch_age, costs.batch, costs.chunk_target, costs.max_chunk,
                          costs.detect, max(0.35, costs.headroom * 2 / (1 + dispersion)))
        decision = choose_plan(work, costs, c.threshold, self.plan.serve_only, dispersion)
        chosen = decision.chosen
        same = (decision.plan.levels, decision.plan.regions) == (self.plan.levels, self.plan.regions)
        trouble = current.overhead > c.threshold or not current.feasible or max(rho_cpu, rho_mem) >= 1
        better = chosen.overhead < current.overhead - 0.005 or (not current.feasible and chosen.feasible)
        # A start tree sized from the process count was a guess made before anything was measured;
        # once the measurements accept a plan with fewer servers (the paper's rule: the shallowest
        # plan under C), go to it, even if the guess is also under C. The model does not see what
        # a deeper tree costs at the end of a job (stock left in regions while other regions idle),
        # so "predicted no worse" is judged with that margin in the shallower plan's favour.
        # A switch is not free: every rank regroups, and its acknowledgement and first report pass a
        # server (at most one service time per process). Only worth it when that is under half a
        # point of what remains of the job (not for a 32,768-rank job of milliseconds or seconds).
        remaining = (1.0 - self.committed) * self.total * mean / max(1, self.workers)
        regroup = self.size * costs.service_time
        shallower = (servers(chosen) < servers(current) and chosen.feasible and chosen.overhead <= c.threshold
                     and chosen.overhead <= current.overhead + 0.005 and regroup <= 0.005 * remaining)
        # The last few tasks per worker: the end's bursts (every region flushing as its ranks run
        # out) are not the job's load, and a switch would cost more than what is left to gain.
        ending = self.total > 0 and remaining < 4 * max(self.task_max, mean)
        switch = not same and not ending and ((trouble and better) or shallower)
        if same:
            why = f"keep: {decision.reason}"
        elif ending:
            why = (f"keep the current plan: the job is ending (about {remaining:.3g} s of tasks left per worker, "
                   f"under 4 times the longest task): its bursts of reports are not its load "
                   f"(the model would choose {decision.plan.describe()})")
        elif shallower and not (trouble and better):
            why = (f"switch to fewer servers: the measurements accept {decision.plan.describe()} (predicted "
                   f"{chosen.overhead:.2%} <= C, against {current.overhead:.2%} for the current plan); "
                   f"{decision.reason}")
        elif not trouble:
            why = (f"keep the current plan (predicted {current.overhead:.2%} <= C, busiest rho {current.busiest:.2f}); "
                   f"the model would also accept {decision.plan.describe()}")
        elif not better:
            why = f"keep the current plan: nothing predicted better ({decision.reason})"
        else:
            why = f"switch: the current plan is predicted {current.overhead:.2%}; {decision.reason}"
        record = {
            "time": now,
            "samples": self.samples,
            "interval_s": self.interval,
            "lambda_hat": msgs.rate,
            "sigma2_hat": msgs.var / self.interval ** 2 if self.interval else 0.0,
            "messages": msgs.to_dict(),
            "claims": claims.to_dict(),
            "dispersion": dispersion,
            "mu": 1.0 / costs.service_time,
            "service_s_measured": measured_s or None,
            "service_s_used": costs.service_time,
            "rho_measured": {"cpu": rho_cpu, "memory": rho_mem},
            "rho": [{"level": lv.level, "cpu": lv.rho_cpu, "memory": lv.rho_memory} for lv in current.levels],
            "task_mean_s": mean,
            "task_std_s": math.sqrt(var),
            "task_max_s": self.task_max,
            "current_plan": self.plan.to_dict(),
            "current_predicted": current.to_dict(),
            "predicted_overhead": chosen.overhead if switch else current.overhead,
            "chosen": decision.to_dict(),
            "switch": switch,
            "reason": why,
        }
        if msgs.verdict != "poisson" or claims.verdict != "poisson":
            record["model_note"] = (
                f"arrivals are not Poisson (messages {msgs.verdict}, dispersion {msgs.dispersion:.2f}; claims "
                f"{claims.verdict}, dispersion {claims.dispersion:.2f}): "
                + ("more headroom kept" if dispersion > 1 else "the M/M/1 prediction is an approximation here"))
        self._record(record)
        if not switch:
            return None
        return self._switch(Plan(decision.plan.levels, decision.plan.regions, self.plan.prefetch,
                                 decision.plan.chunk, self.plan.serve_only, why), now)

    def _record(self, decision: dict[str, Any]) -> None:
        """Keep ``decision``: the start and every switch always, and the last :data:`KEPT` others
        (one every few seconds for a week's job would be a memory of its own)."""
        self.made += 1
        self.decisions.append(decision)
        if len(self.decisions) > KEPT:
            drop = next((i for i, d in enumerate(self.decisions) if i > 0 and not d.get("switch")), None)
            if drop is not None:
                del self.decisions[drop]
                self.dropped += 1

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
