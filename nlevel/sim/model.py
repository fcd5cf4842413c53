"""``python -m nlevel.sim``: a discrete-event simulation of a farm, on one core, at any scale.

The simulated farm runs nlevel's own state machines: one
:class:`~nlevel.roles.station.Station` per rank, laid out by
:func:`nlevel.model.hierarchy.build`, exactly as :mod:`nlevel.runtime.node` runs them over MPI.
Only time is simulated (:mod:`nlevel.sim.engine` decides when each Station call
happens)::

    python -m nlevel.sim --procs 32768 --task-time 2:5 --tasks-per-proc 100 --plan auto --json

Timing model
------------

* **Tasks.** A worker runs task ``i`` for ``durations[i]`` seconds. Durations are drawn
  once per task id from a seeded RNG: ``--task-time L:H`` uniform in ``[L, H]`` seconds,
  ``--task-time T`` constant, or ``--task-times-file F`` (one duration per line, sampled
  with replacement, e.g. measured docking times). The same seed gives the same run.
* **Messages.** Every message takes ``msg_time`` seconds one way; messages between two
  ranks stay in order (as MPI's do).
* **Servers.** The master and each region-master handle incoming messages (children's
  reports and requests, the parent's grants) one at a time, first come first served.
  Each costs ``service_time`` seconds of the server; the messages a handling produces
  leave when it ends. A server that computes runs its own task in parallel with this
  server thread: the GIL penalty measured in the README (a pure-Python task delays the
  server thread) is not modelled, except as ``--gil-delay``: extra seconds added to
  every handling that happens while the server's own task runs.
* **Free steps.** Work inside one rank is instantaneous: a server's own worker is served
  in-process (:meth:`Station.route <nlevel.roles.station.Station.route>`), a slave takes
  a grant as soon as it arrives, and the next task starts when the previous one ends.
* **Ticks.** A region-master forwards completions upward by count, by age
  (``batch_age``) or when its region is idle; the engine calls ``tick()`` exactly when
  the oldest buffered completion reaches its age (the runtime polls every ms), so the
  end of a job is never held back by the simulation.
* **Fixed cost.** ``--startup S`` adds S seconds, every rank idle, for the farm's set-up
  and tear-down (its collectives, the final gather of statistics); 0 by default. The
  validation (``bench/sim_validate.py``) measures it with a zero-task run.
* **Not modelled:** MPI launch, checkpoint writes, network contention and distance,
  failures.

Service and message times default to the machine's calibration
(:func:`nlevel.model.calibration.load_calibration`, written by
``python -m nlevel.plan --calibrate``), else to :data:`DEFAULT_SERVICE_TIME` and
:data:`DEFAULT_MSG_TIME`; ``--service-time`` / ``--msg-time`` override both.

Plans: ``--plan classic`` (2 levels), ``--plan auto`` (the queueing model's choice,
:func:`nlevel.model.queueing.choose_plan`) or ``--plan levels=3,regions=128`` with optional
``prefetch=``, ``chunk=`` and ``serve_only=`` (``regions=16x8`` for 4 levels). Slaves
ask for ``--chunk`` ids per request, 1 by default as in the paper (one task per
request); ``chunk=`` in a plan wins, and ``--chunk 0`` is nlevel's automatic chunking.

Engines: from 300,000 tasks on, ``--engine auto`` (the default) runs the simulation in a
child interpreter whose roles are compiled with mypyc from these same source files
(:mod:`nlevel.sim.build`, built once per source digest and cached), about three times as fast;
``--engine python`` stays interpreted. The results are identical.

Output: ``overhead = 1 - sum(task durations) / (procs x makespan)`` (every rank
counted, as in the run report) and ``makespan`` in seconds; ``--json`` prints them with
the per-level request times and server loads.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from ..config import Config
from ..errors import ConfigError
from ..model.hierarchy import build
from ..model.plan import SERVE_ONLY_CHOICES, Plan, default_regions
from .build import compiled
from .engine import Engine, EngineResult

__all__ = [
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

#: Seconds a server spends per message when no calibration exists: the ``dispose`` mean
#: of ``nlevel-mpiexec -n 2 python -m nlevel.run --tasks 4000`` on the development VM
#: (2 runs: 0.026 and 0.033 ms; 0.034 ms at -n 4).
DEFAULT_SERVICE_TIME = 3e-5
#: One-way message seconds when no calibration exists: the ``message`` mean of the same
#: runs (0.25 and 0.36 ms at -n 2, 0.21 ms at -n 4; it includes the server's polling delay).
DEFAULT_MSG_TIME = 2.5e-4

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
        service_time, msg_time, gil_delay, startup: The timing model's inputs, seconds.
        times_source: Where service and message times came from.
        predicted_overhead: The model's prediction when the plan is ``auto``, else None.
        requests: Per asking level: count and mean request time, split into parts (ms).
        servers: Per server level: servers, messages handled, mean busy fraction.
        events: Events the engine processed.
        sim_seconds: Wall seconds the simulation took (set-up included).
        committed: Ids the master committed (equals ``tasks``).
        recomputed: Ids committed more than once (0).
        tasks_run: Task executions (equals ``tasks``: none ran twice).
        task_time: How durations were drawn.
        engine: ``"compiled (mypyc)"`` or ``"python"`` (see :mod:`nlevel.sim.build`).
    """

    procs: int
    plan: Plan
    tasks: int
    work: float
    makespan: float
    overhead: float
    service_time: float
    msg_time: float
    gil_delay: float
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
            "gil_delay": self.gil_delay,
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
        }

    def summary(self) -> str:
        """Return the few lines printed without ``--json``."""
        lines = [
            f"nlevel.sim: {self.procs} processes, {self.tasks} tasks ({_describe_task_time(self.task_time)}); "
            f"plan {self.plan.describe()} ({self.plan.reason})",
            f"  service {self.service_time:.3g} s per message, message {self.msg_time:.3g} s one way"
            + (f", GIL delay {self.gil_delay:.3g} s" if self.gil_delay else "")
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
                f"  requests from {name}s: {int(r['count'])}, mean {r['mean_ms']:.4g} ms = message "
                f"{r['message_ms']:.3g} x2 + dispose {r['dispose_ms']:.3g} + wait {r['wait_ms']:.4g} ms"
            )
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


def parse_plan(
    text: str,
    procs: int,
    chunk: int = 1,
    *,
    task_time: float | None = None,
    task_time_spread: float = 0.0,
    service_time: float = DEFAULT_SERVICE_TIME,
    msg_time: float = DEFAULT_MSG_TIME,
    threshold: float = 0.10,
) -> tuple[Plan, float | None]:
    """Turn ``--plan`` into a :class:`~nlevel.model.plan.Plan` for ``procs``; return it and the predicted overhead.

    ``classic`` is 2 levels; ``auto`` asks :func:`nlevel.model.queueing.choose_plan` (which needs
    the mean ``task_time``); otherwise comma-separated ``key=value`` pairs of
    ``levels, regions, prefetch, chunk, serve_only`` (``regions=16x8`` for several
    intermediate levels; default regions from the world size). ``chunk`` applies unless
    the text sets ``chunk=``.

    Raises:
        ConfigError / PlanError: naming the bad part, or a plan that does not fit ``procs``.
    """
    spec = text.strip()
    predicted: float | None = None
    if spec == "classic":
        plan = Plan(chunk=chunk, reason="classic master-slave (--plan classic)")
    elif spec == "auto":
        if task_time is None:
            raise ConfigError("--plan auto needs the mean task time")
        from ..model.queueing import choose_plan

        decision = choose_plan(procs, task_time, service_time, msg_time, threshold, task_time_spread)
        plan = replace(decision.plan, chunk=chunk, reason=f"--plan auto: {decision.reason}")
        predicted = float(decision.predicted_overhead)
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
    return plan, predicted


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
    plan: Plan,
    durations: Sequence[float],
    service_time: float,
    msg_time: float,
    *,
    gil_delay: float = 0.0,
    startup: float = 0.0,
    config: Config | None = None,
    times_source: str = "given",
    predicted_overhead: float | None = None,
    task_time: dict[str, Any] | None = None,
) -> SimReport:
    """Simulate ``plan`` on ``procs`` processes running tasks of the given ``durations``.

    Args:
        procs: Processes (ranks) of the farm.
        plan: The hierarchy plan (chunk, prefetch and serve-only come from it).
        durations: Seconds of each task, by id.
        service_time: Seconds a server spends per incoming message.
        msg_time: Seconds a message takes one way.
        gil_delay: Extra seconds per handling while the server's own task runs.
        startup: Fixed seconds of set-up and tear-down added to the makespan (every rank idle).
        config: Other settings (batch sizes and ages, chunk sizing); default ``Config()``.
        times_source, predicted_overhead, task_time: Recorded in the report.

    Returns:
        The :class:`SimReport`.

    Raises:
        ConfigError / PlanError: on bad input (non-positive procs, negative times, a plan that does not fit).
    """
    if isinstance(procs, bool) or not isinstance(procs, int) or procs < 1:
        raise ConfigError(f"--procs must be an integer >= 1, got {procs!r}")
    for name, v in (
        ("--service-time", service_time), ("--msg-time", msg_time), ("--gil-delay", gil_delay), ("--startup", startup)
    ):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ConfigError(f"{name} must be a number of seconds >= 0, got {v!r}")
    if not service_time > 0:
        raise ConfigError(f"--service-time must be > 0 s, got {service_time!r}")
    started = time.perf_counter()
    config = config or Config()
    config = config.with_(
        levels=plan.levels, regions=plan.regions, prefetch=plan.prefetch, chunk=plan.chunk, serve_only=plan.serve_only
    )
    hierarchy = build(procs, plan)
    result = Engine(hierarchy, config, durations, service_time, msg_time, gil_delay).run()
    elapsed = time.perf_counter() - started
    work = result.busy
    makespan = result.makespan + startup
    overhead = 1.0 - work / (procs * makespan) if makespan > 0 else 0.0
    return SimReport(
        procs=procs,
        plan=plan,
        tasks=len(durations),
        work=work,
        makespan=makespan,
        overhead=overhead,
        service_time=float(service_time),
        msg_time=float(msg_time),
        gil_delay=float(gil_delay),
        startup=float(startup),
        times_source=times_source,
        predicted_overhead=predicted_overhead,
        requests=_requests(result, plan.levels, service_time, msg_time),
        servers=_servers(result, plan.levels, service_time, makespan),
        events=result.events,
        sim_seconds=elapsed,
        committed=result.ledger.n_committed,
        recomputed=result.ledger.recomputed,
        tasks_run=result.tasks_run,
        task_time=task_time or {"kind": "given", "mean": work / len(durations) if len(durations) else 0.0},
        engine="compiled (mypyc)" if compiled() else "python",
    )


def _requests(result: EngineResult, levels: int, service_time: float, msg_time: float) -> dict[str, dict[str, float]]:
    # The paper's split, T_req = 2 T_msg + T_wait + T_dispose, of the requests answered
    # with ids: message and dispose are the model's inputs, wait is the rest (queueing
    # behind other messages at the server, and waiting there for ids).
    out: dict[str, dict[str, float]] = {}
    for level, (n, total) in sorted(result.requests.items()):
        mean = total / n if n else 0.0
        out[_level_name(level, levels)] = {
            "level": level,
            "count": n,
            "mean_ms": 1e3 * mean,
            "message_ms": 1e3 * msg_time,
            "dispose_ms": 1e3 * service_time,
            "wait_ms": 1e3 * max(0.0, mean - 2 * msg_time - service_time),
        }
    return out


def _servers(result: EngineResult, levels: int, service_time: float, makespan: float) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    span = makespan if makespan > 0 else 1.0
    for level, (servers, messages) in sorted(result.handled.items()):
        out[_level_name(level, levels)] = {
            "level": level,
            "servers": servers,
            "messages": messages,
            "busy": messages * service_time / (servers * span) if servers else 0.0,
            "busiest": result.max_handled_by_level.get(level, 0) * service_time / span,
        }
    return out
