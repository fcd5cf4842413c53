"""``python -m nlevel.sim``: a discrete-event simulation of a farm, on one core, at any scale.

The simulated farm runs nlevel's own state machines: one
:class:`~nlevel.roles.station.Station` per rank, laid out by
:func:`nlevel.model.hierarchy.build`, exactly as :mod:`nlevel.runtime.rank` runs them over MPI.
Only time is simulated (:mod:`nlevel.sim.engine` decides when each step of every rank's
:class:`~nlevel.roles.loop.Loop` happens)::

    python -m nlevel.sim --procs 32768 --task-time 2:5 --tasks-per-proc 100 --plan auto --json

Timing model
------------

* **Tasks.** A worker runs task ``i`` for ``durations[i]`` seconds. Durations are drawn
  once per task id from a seeded RNG: ``--task-time L:H`` uniform in ``[L, H]`` seconds,
  ``--task-time T`` constant, or ``--task-times-file F`` (one duration per line, sampled
  with replacement, e.g. measured docking times). The same seed gives the same run.
* **Grants.** A worker takes its next range from its parent's board with one-sided
  operations (:mod:`nlevel.roles.board`): ``atomic_time`` each, plus queueing at the
  board owner's memory, ``atomic_service`` per operation from every claimer.
* **Messages.** Completions, plan changes and the rest take ``msg_time`` one way; a
  server handles them in arrival order, ``service_time`` each, on its own CPU (its
  thread), beside its own tasks.
* **Ticks.** A server ticks when there is something to do: a claimer waits on its board
  (noticed ``detect`` seconds later), a batch of completions reached its age, the
  planner's sampling window ended.
* **Fixed cost.** ``--startup S`` adds S seconds, every rank idle, for the farm's set-up
  and tear-down; 0 by default.
* **Failures and drains** (opt-in): ``--kill ROLE@WHEN`` kills a process (``slave``, ``region``,
  ``master`` or a rank number) at ``WHEN``: seconds (``1500s``) or a fraction of the ideal
  makespan, work / procs (``0.5``). Its events are dropped, messages to it are lost, and the
  survivors hear of it ``--failure-notice`` seconds later (default 0.05); the roles then recover
  as in a ULFM job (fault tolerance is on whenever a kill is asked). ``--drain N@WHEN`` asks the
  master to take the N highest-ranked slaves out of the job, as an operator's drain request
  does (``N/spread@WHEN``: N slaves spread evenly over the regions); each finishes the range it
  runs, then leaves.
* **Not modelled:** MPI launch, checkpoint writes (asked and answered, at no cost), network
  distance beyond the given latencies, the cost of relaunching a job (roll-back: see
  ``bench/paper_tables.py``).

The plan: ``--plan classic`` (2 levels), ``--plan levels=3,regions=128`` (with optional
``prefetch=``, ``chunk=`` and ``serve_only=``; ``regions=16x8`` for 4 levels) or ``--plan
auto``: the job starts as a real one does and the in-job planner (the same
:class:`~nlevel.roles.autoplan.AutoPlanner`) samples, fits, decides and switches in
simulated time; its decisions are in the report.

Output: ``overhead = 1 - sum(task durations) / (procs x makespan)`` (every rank
counted, as in the run report) and ``makespan`` in seconds; ``--json`` prints them with
the per-level request times, server loads and the planner's decisions.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..config import Config
from ..errors import ConfigError
from ..model.hierarchy import build
from ..model.plan import SERVE_ONLY_CHOICES, Plan, default_regions
from .build import compiled
from .engine import SimCosts, Engine, EngineResult

__all__ = [
    "VICTIMS",
    "victim_rank",
    "DEFAULT_SERVICE_TIME",
    "DEFAULT_MSG_TIME",
    "SimReport",
    "default_times",
    "parse_task_time",
    "parse_plan",
    "read_task_times",
    "make_durations",
    "simulate",
]

#: Seconds a server spends per message, and one-way message seconds, when no calibration
#: exists: the settings' defaults (:class:`~nlevel.config.Config`), so that ``nlevel.sim``,
#: ``nlevel.plan`` and a job's planner start from the same costs.
DEFAULT_SERVICE_TIME = Config().service_time
DEFAULT_MSG_TIME = Config().msg_time

_PLAN_KEYS = ("levels", "regions", "prefetch", "chunk", "serve_only")


@dataclass
class SimReport:
    """One simulated run: inputs and what came out.

    Attributes:
        procs: Processes simulated.
        plan: The plan run (its ``reason`` says where it came from).
        tasks: Number of tasks.
        work: Sum of task durations, seconds.
        makespan: Simulated seconds until every rank ended.
        overhead: ``1 - work / (procs * makespan)``.
        service_time, msg_time, atomic_time, atomic_service, startup: The timing model's inputs, seconds.
        times_source: Where service and message times came from.
        predicted_overhead: What the in-job planner predicted for the plan it chose (``auto``), else None.
        decisions: The in-job planner's decisions (``auto``).
        plans: The plans the job ran, in order.
        requests: Per asking level: count and mean request time, split into parts (ms).
        servers: Per server level: servers, messages handled, mean busy fraction.
        events: Events the engine processed.
        sim_seconds: Wall seconds the simulation took (set-up included).
        committed: Ids the master committed (equals ``tasks``).
        recomputed: Ids committed more than once (0).
        tasks_run: Task executions (equals ``tasks``: none ran twice).
        task_time: How durations were drawn.
        engine: ``"compiled (mypyc)"`` or ``"python"`` (see :mod:`nlevel.sim.build`).
        deaths: ``(time, rank)`` of every kill (``--kill``).
        drained: ``(time it left, rank)`` of every drained rank (``--drain``).
        failures: The survivors' records of each death (role, ids held, who recovered them).
        fault_tolerance: Whether the roles ran with fault tolerance on.
        last_tasks: When the ranks' last tasks ended (seconds; ``first``, ``p10``, ``p50``,
            ``p90``, ``last``): the job's tail. A wide spread with ids left in few places is
            stock stranded in some regions while others idle.
    """

    procs: int
    plan: Plan
    tasks: int
    work: float
    makespan: float
    overhead: float
    service_time: float
    msg_time: float
    atomic_time: float
    atomic_service: float
    startup: float
    times_source: str
    predicted_overhead: float | None
    requests: dict[str, dict[str, float]]
    servers: dict[str, dict[str, float]]
    events: int
    sim_seconds: float
    committed: int = 0
    recomputed: int = 0
    tasks_run: int = 0
    task_time: dict[str, Any] = field(default_factory=dict)
    engine: str = "python"
    decisions: list[dict[str, Any]] = field(default_factory=list)
    plans: list[dict[str, Any]] = field(default_factory=list)
    deaths: list[tuple[float, int]] = field(default_factory=list)
    drained: list[tuple[float, int]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    fault_tolerance: bool = False
    last_tasks: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (the ``--json`` output)."""
        return {
            "procs": self.procs,
            "tasks": self.tasks,
            "task_time": self.task_time,
            "plan": self.plan.to_dict(),
            "predicted_overhead": self.predicted_overhead,
            "service_time": self.service_time,
            "msg_time": self.msg_time,
            "atomic_time": self.atomic_time,
            "atomic_service": self.atomic_service,
            "startup": self.startup,
            "times_source": self.times_source,
            "makespan": self.makespan,
            "overhead": self.overhead,
            "work": self.work,
            "requests": self.requests,
            "servers": self.servers,
            "committed": self.committed,
            "recomputed": self.recomputed,
            "tasks_run": self.tasks_run,
            "events": self.events,
            "sim_seconds": self.sim_seconds,
            "engine": self.engine,
            "decisions": self.decisions,
            "plan_history": self.plans,
            "fault_tolerance": self.fault_tolerance,
            "deaths": self.deaths,
            "drained": self.drained,
            "failures": self.failures,
            "last_tasks": self.last_tasks,
        }

    def summary(self) -> str:
        """Return the few lines printed without ``--json``."""
        lines = [
            f"nlevel.sim: {self.procs} processes, {self.tasks} tasks ({_describe_task_time(self.task_time)}); "
            f"plan {self.plan.describe()} ({self.plan.reason})",
            f"  service {self.service_time:.3g} s per message, message {self.msg_time:.3g} s one way, "
            f"one-sided operation {self.atomic_time:.3g} s ({self.atomic_service:.3g} s at the target)"
            + (f", fixed cost {self.startup:.3g} s" if self.startup else "")
            + f" ({self.times_source})",
            f"  makespan {self.makespan:.6g} s, overhead {100 * self.overhead:.2f}% (1 - work / (procs x makespan))"
            + (
                f"; the model predicted {100 * self.predicted_overhead:.2f}%"
                if self.predicted_overhead is not None
                else ""
            ),
        ]
        for name, r in self.requests.items():
            lines.append(
                f"  requests from {name}s: {int(r['count'])}, mean {r['mean_ms']:.4g} ms = claim "
                f"{r['message_ms']:.3g} + wait {r['wait_ms']:.4g} ms"
            )
        if len(self.plans) > 1 or self.decisions:
            lines.append(f"  planner: {len(self.decisions)} decision(s), {len(self.plans) - 1} switch(es); ended on "
                         f"{Plan.from_dict(self.plans[-1]).describe() if self.plans else '?'}")
            if self.decisions and "chosen" not in self.decisions[-1]:
                lines.append("  planner: the job ended before the sampling finished; it kept the plan it started on")
            elif self.decisions:
                lines.append(f"  planner's last reason: {self.decisions[-1].get('reason', '')}")
        for name, s in self.servers.items():
            lines.append(
                f"  {name}: {int(s['servers'])} server(s), {int(s['messages'])} messages handled, "
                f"busy {100 * s['busy']:.1f}% of the makespan (busiest {100 * s['busiest']:.1f}%)"
            )
        lines.append(f"  simulated in {self.sim_seconds:.1f} s ({self.events} events, {self.engine} engine)")
        return "\n".join(lines)


# -- inputs ----------------------------------------------------------------------------------
def default_times() -> tuple[float, float, str]:
    """Return ``(service_time, msg_time, source)``: the calibration's, else the built-in defaults.

    Raises:
        ConfigError: when a calibration file exists but cannot be read.
    """
    from ..model.calibration import default_path, load_calibration

    cal = load_calibration()
    if cal is None:
        return DEFAULT_SERVICE_TIME, DEFAULT_MSG_TIME, "built-in defaults; no calibration file"
    return float(cal.service_time), float(cal.msg_time), f"calibration {default_path()}"


def _number(text: str, what: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise ConfigError(f"{what} must be a number of seconds, got {text!r}") from None
    if not math.isfinite(x):
        raise ConfigError(f"{what} must be a finite number of seconds, got {text!r}")
    return x


def parse_task_time(text: str) -> tuple[float, float]:
    """Parse ``--task-time``: ``L:H`` (uniform, seconds) or ``T`` (constant); return ``(L, H)``.

    Raises:
        ConfigError: naming the value, unless ``0 < L <= H``.
    """
    parts = text.strip().split(":")
    if len(parts) not in (1, 2) or not all(p.strip() for p in parts):
        raise ConfigError(f"--task-time must be L:H (uniform, seconds) or one duration T, got {text!r}")
    lo = _number(parts[0], f"--task-time {text!r}: L")
    hi = _number(parts[-1], f"--task-time {text!r}: H") if len(parts) == 2 else lo
    if not lo > 0:
        raise ConfigError(f"--task-time must be > 0 s, got {text!r}")
    if hi < lo:
        raise ConfigError(f"--task-time L:H needs L <= H, got {text!r}")
    return lo, hi


def read_task_times(path: str) -> list[float]:
    """Read durations (seconds, one per line; blank lines and ``#`` comments skipped).

    Raises:
        ConfigError: naming the file and line of a bad value, or an empty or missing file.
    """
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as exc:
        raise ConfigError(f"--task-times-file {path!r} cannot be read: {exc.strerror or exc}") from None
    out: list[float] = []
    for k, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        x = _number(text, f"--task-times-file {path!r} line {k}")
        if not x > 0:
            raise ConfigError(f"--task-times-file {path!r} line {k}: durations must be > 0 s, got {text!r}")
        out.append(x)
    if not out:
        raise ConfigError(f"--task-times-file {path!r} holds no durations; expected one number of seconds per line")
    return out


def make_durations(
    tasks: int, task_time: tuple[float, float] | None = None, samples: Sequence[float] | None = None, seed: int = 0
) -> list[float]:
    """Return the duration of every task id: uniform in ``task_time``, or drawn from ``samples``.

    Raises:
        ConfigError: for a negative count or neither/both sources.
    """
    if tasks < 0:
        raise ConfigError(f"number of tasks must be >= 0, got {tasks}")
    if (task_time is None) == (samples is None):
        raise ConfigError("give exactly one of task_time (L, H) or samples")
    rng = np.random.default_rng(seed)
    if samples is not None:
        return [float(x) for x in rng.choice(np.asarray(samples, dtype=float), size=tasks, replace=True)]
    assert task_time is not None
    lo, hi = task_time
    if lo == hi:
        return [float(lo)] * tasks
    return [float(x) for x in rng.uniform(lo, hi, size=tasks)]


def parse_plan(text: str, procs: int, chunk: int = 1) -> Plan:
    """Turn ``--plan`` (not ``auto``: that is the in-job planner's) into a :class:`~nlevel.model.plan.Plan` for ``procs``.

    ``classic`` is 2 levels; otherwise comma-separated ``key=value`` pairs of
    ``levels, regions, prefetch, chunk, serve_only`` (``regions=16x8`` for several
    intermediate levels; default regions from the world size). ``chunk`` applies unless
    the text sets ``chunk=``.

    Raises:
        ConfigError / PlanError: naming the bad part, or a plan that does not fit ``procs``.
    """
    spec = text.strip()
    if spec == "classic":
        plan = Plan(chunk=chunk, reason="classic master-slave (--plan classic)")
    else:
        values: dict[str, Any] = {}
        for item in spec.split(","):
            key, eq, value = item.partition("=")
            key, value = key.strip().replace("-", "_"), value.strip()
            if not eq or key not in _PLAN_KEYS or not value:
                raise ConfigError(
                    f"--plan must be classic, auto, or key=value pairs of {', '.join(_PLAN_KEYS)} "
                    f"(e.g. levels=3,regions=128); got {text!r} (bad part {item.strip()!r})"
                )
            try:
                if key == "regions":
                    values[key] = tuple(int(x) for x in value.replace(":", "x").split("x"))
                elif key == "prefetch":
                    values[key] = float(value)
                elif key == "serve_only":
                    if value not in SERVE_ONLY_CHOICES:
                        raise ValueError
                    values[key] = value
                else:
                    values[key] = int(value)
            except ValueError:
                kind = {"regions": "integers like 128 or 16x8", "prefetch": "a number", "serve_only": "none, master or all"}
                raise ConfigError(
                    f"--plan {text!r}: {key} must be {kind.get(key, 'an integer')}, got {value!r}"
                ) from None
        values.setdefault("chunk", chunk)
        levels = values.setdefault("levels", 2)
        if "regions" not in values:
            values["regions"] = default_regions(procs, levels) if isinstance(levels, int) and levels > 2 else ()
        plan = Plan(**values, reason=f"--plan {spec}")
    plan.check_fits(procs)
    return plan


# -- the run ---------------------------------------------------------------------------------
def _level_name(level: int, levels: int) -> str:
    if level == 0:
        return "master"
    return "slave" if level == levels - 1 else f"region-master L{level}"


def _describe_task_time(tt: dict[str, Any]) -> str:
    if tt.get("kind") == "uniform":
        return f"uniform {tt['lo']:g}-{tt['hi']:g} s, mean {tt['mean']:.4g} s"
    if tt.get("kind") == "constant":
        return f"{tt['lo']:g} s each"
    if tt.get("kind") == "file":
        return f"sampled from {tt['path']} ({tt['samples']} values), mean {tt['mean']:.4g} s"
    return f"mean {tt.get('mean', 0):.4g} s"


def simulate(
    procs: int,
    plan: Plan | None,
    durations: Sequence[float],
    service_time: float,
    msg_time: float,
    *,
    atomic_time: float = 1e-6,
    atomic_service: float = 2e-7,
    startup: float = 0.0,
    config: Config | None = None,
    times_source: str = "given",
    task_time: dict[str, Any] | None = None,
    kills: Sequence[tuple[float, int | str]] = (),
    drains: Sequence[tuple[float, int]] = (),
    notice: float = 0.05,
    fault_tolerance: bool | None = None,
) -> SimReport:
    """Simulate a farm of ``procs`` processes running tasks of the given ``durations``.

    Args:
        procs: Processes (ranks) of the farm.
        plan: The hierarchy plan (chunk, prefetch and serve-only come from it), or None: the
            job starts as a real ``--levels auto`` job and the in-job planner decides.
        durations: Seconds of each task, by id.
        service_time: Seconds a server spends per message it handles.
        msg_time: Seconds a message takes one way.
        atomic_time: Seconds of one one-sided operation, as its origin sees it.
        atomic_service: Seconds each one-sided operation occupies its target.
        startup: Fixed seconds of set-up and tear-down added to the makespan (every rank idle).
        config: Other settings (batch sizes and ages, chunk sizing, the planner's); default ``Config()``.
        times_source, task_time: Recorded in the report.
        kills: ``(seconds, victim)``: the victim (a rank, or ``"slave"``, ``"region"``, ``"master"``:
            see :func:`victim_rank`) dies then.
        drains: ``(seconds, count)``: the master is asked to drain ``count`` slaves then (the highest
            ranked; a negative count: as many, spread evenly).
        notice: Seconds between a death and the survivors hearing of it.
        fault_tolerance: Run the roles with fault tolerance on (default: when there are kills).

    Returns:
        The :class:`SimReport`.

    Raises:
        ConfigError / PlanError: on bad input (non-positive procs, negative times, a plan that does not fit).
    """
    if isinstance(procs, bool) or not isinstance(procs, int) or procs < 1:
        raise ConfigError(f"--procs must be an integer >= 1, got {procs!r}")
    for name, v in (("--service-time", service_time), ("--msg-time", msg_time), ("--atomic-time", atomic_time),
                    ("--atomic-service", atomic_service), ("--startup", startup)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ConfigError(f"{name} must be a number of seconds >= 0, got {v!r}")
    if not service_time > 0:
        raise ConfigError(f"--service-time must be > 0 s, got {service_time!r}")
    started = time.perf_counter()
    # No process hangs in a simulation; a lease that expired because a simulated server is
    # overloaded (its backlog delays the reports) must not kill anyone.
    # The costs are the machine's: a real job's planner reads them from the calibration.
    config = (config or Config()).with_(lease=1e9, service_time=service_time, msg_time=msg_time,
                                        atomic_time=atomic_time, atomic_service=atomic_service)
    ft = bool(kills) if fault_tolerance is None else fault_tolerance
    if kills and not ft:
        raise ConfigError("--kill needs fault tolerance on")
    config = config.with_(fault_tolerance="on" if ft else "off")
    if plan is None:
        config = config.with_(levels=0)
        first = config.plan(procs)
    else:
        config = config.with_(levels=plan.levels, regions=plan.regions, prefetch=plan.prefetch, chunk=plan.chunk,
                              serve_only=plan.serve_only)
        first = plan
    hierarchy = build(procs, first)
    costs = SimCosts(msg_time=msg_time, service_time=service_time, atomic_time=atomic_time,
                     atomic_service=atomic_service)
    victims = [(float(t), victim_rank(hierarchy, who)) for t, who in kills]

    def make() -> Engine:
        try:
            return Engine(hierarchy, config, durations, costs, kills=victims, drains=list(drains), notice=notice)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    result = _run_without_gc_pauses(make)
    elapsed = time.perf_counter() - started
    work = result.busy
    makespan = result.makespan + startup
    overhead = 1.0 - work / (procs * makespan) if makespan > 0 else 0.0
    final = result.plans[-1] if result.plans else first
    predicted = None
    chosen = [d for d in result.decisions if "chosen" in d]
    if chosen:
        predicted = chosen[-1]["chosen"].get("predicted_overhead")
    return SimReport(
        procs=procs,
        plan=final,
        tasks=len(durations),
        work=work,
        makespan=makespan,
        overhead=overhead,
        service_time=float(service_time),
        msg_time=float(msg_time),
        atomic_time=float(atomic_time),
        atomic_service=float(atomic_service),
        startup=float(startup),
        times_source=times_source,
        predicted_overhead=predicted,
        requests=_requests(result, final.levels),
        servers=_servers(result, final.levels, makespan),
        events=result.events,
        sim_seconds=elapsed,
        committed=result.ledger.n_committed,
        recomputed=result.ledger.recomputed,
        tasks_run=result.tasks_run,
        task_time=task_time or {"kind": "given", "mean": work / len(durations) if len(durations) else 0.0},
        engine="compiled (mypyc)" if compiled() else "python",
        decisions=result.decisions,
        plans=[p.to_dict() for p in result.plans],
        deaths=result.deaths,
        drained=result.drained,
        failures=result.failures,
        fault_tolerance=ft,
        last_tasks=_spread([t for t in result.last_done if t > 0]),
    )


def _run_without_gc_pauses(make: Callable[[], Engine]) -> EngineResult:
    """``make().run()`` without the cyclic collector's passes: fewer while ``make()`` builds the
    roles (then frozen out of it), none while the engine runs.

    A simulation allocates millions of short-lived messages and events over a few hundred
    thousand long-lived roles; Python's default collector re-scans the long-lived ones again
    and again (measured: 12-14 % of a 32,768-process run, and 3 % more while the roles are
    made), and even its young passes, rare, were 2 % of the run's instructions. Reference
    counting frees everything acyclic at once, and the run makes no cycles to speak of (the
    same peak memory, 915 MB at 32,768 x 25, with and without the collector); any it makes are
    collected when the collector is back on.
    """
    threshold = gc.get_threshold()
    enabled = gc.isenabled()
    gc.set_threshold(100_000, 50, 1000)
    try:
        engine = make()
        gc.freeze()
        gc.disable()
        return engine.run()
    finally:
        if enabled:
            gc.enable()
        gc.set_threshold(*threshold)
        gc.unfreeze()


def _spread(times: list[float]) -> dict[str, float]:
    """First, 10th, 50th and 90th percentiles and last of ``times`` (empty when there are none)."""
    if not times:
        return {}
    q = np.quantile(np.asarray(times), [0.0, 0.1, 0.5, 0.9, 1.0])
    return dict(zip(("first", "p10", "p50", "p90", "last"), (float(x) for x in q)))


#: The victims ``--kill`` takes by role.
VICTIMS = ("slave", "region", "master")


def victim_rank(hierarchy: Any, who: int | str) -> int:
    """The rank ``--kill`` means: a rank number, or by role on the first plan's layout.

    ``master``: the master; ``region``: the region-master of the last region (the highest
    rank that leads one); ``slave``: the highest-ranked slave (in the last region).

    Raises:
        ConfigError: naming the value, for a rank out of range or a role the plan lacks.
    """
    n = hierarchy.size
    if isinstance(who, int) or (isinstance(who, str) and who.isdigit()):
        r = int(who)
        if not 0 <= r < n:
            raise ConfigError(f"--kill: rank must be in 0..{n - 1}, got {r}")
        return r
    roles = {"master": "master", "region": "region-master", "slave": "slave"}
    if who not in roles:
        raise ConfigError(f"--kill: the victim must be one of {', '.join(VICTIMS)} or a rank, got {who!r}")
    found = [node.rank for node in hierarchy.nodes if node.role.value == roles[who]]
    if not found:
        raise ConfigError(f"--kill {who}: the plan {hierarchy.plan.describe()} has no {who}")
    return min(found) if who == "master" else max(found)


def _requests(result: EngineResult, levels: int) -> dict[str, dict[str, float]]:
    # The paper's split, T_req = 2 T_msg + T_wait + T_dispose, for one-sided claims: the
    # claim's own operations ("message": both ways), and waiting for something to be published.
    out: dict[str, dict[str, float]] = {}
    for level, rt in sorted(result.requests.items()):
        out[_level_name(level, levels)] = {
            "level": level,
            "count": rt.total.n,
            "mean_ms": 1e3 * rt.total.mean,
            "message_ms": 1e3 * rt.message.mean,
            "dispose_ms": 1e3 * rt.dispose.mean,
            "wait_ms": 1e3 * rt.wait.mean,
        }
    return out


def _servers(result: EngineResult, levels: int, makespan: float) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    span = makespan if makespan > 0 else 1.0
    for level, (servers, messages, ticks) in sorted(result.handled.items()):
        total, busiest = result.server_busy.get(level, [0.0, 0.0])
        out[_level_name(level, levels)] = {
            "level": level,
            "servers": servers,
            "messages": messages,
            "ticks": ticks,
            "busy": total / (servers * span) if servers else 0.0,
            "busiest": busiest / span,
        }
    return out
