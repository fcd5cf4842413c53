"""One frozen configuration: argument or CLI flag, then ``NLEVEL_*`` variable, then default.

Every setting has a unit and a documented default (see :data:`SETTINGS`, also
printed by ``python -m nlevel.run --help``). Rank 0 builds the config and broadcasts
it, so every rank runs with the same values; the report stores it. Pure Python.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable, Mapping

from .errors import ConfigError
from .model.plan import SERVE_ONLY_CHOICES, Plan, default_regions, parse_force

__all__ = ["Config", "SETTINGS", "parse_setting"]


@dataclass(frozen=True)
class Config:
    """Settings of a farm. See :data:`SETTINGS` for meaning, units and defaults."""

    levels: int = 0
    regions: tuple[int, ...] = ()
    prefetch: float = 2.0
    chunk: int = 0
    serve_only: str = "none"
    switch_interval: float = 1e-4
    poll_max: float = 1e-4
    checkpoint_every: int = 10000
    checkpoint_interval: float = 2.0
    report_every: int = 256
    report_age: float = 0.05
    batch: int = 1024
    batch_age: float = 0.05
    chunk_target: float = 2e-3
    max_chunk: int = 256
    progress: bool = False
    progress_interval: float = 10.0
    threshold: float = 0.10
    replan_interval: float = 5.0
    force_replan: str = ""
    fault_tolerance: str = "auto"
    lease_min: float = 10.0
    lease_factor: float = 5.0
    on_task_error: str = "abort"
    task_retries: int = 2
    quarantine: int = 3
    task_timeout: float | None = None
    control_interval: float = 0.5
    grants: str = "one-sided"
    server_period: float = 2e-3
    board_slots: int = 4096

    @property
    def ft(self) -> bool:
        """Whether to recover from process failures (``auto``: when MPI was started with ULFM on)."""
        if self.fault_tolerance == "auto":
            return os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes")
        return self.fault_tolerance == "on"

    def __post_init__(self) -> None:
        for f in fields(self):
            check = _CHECKS.get(f.name)
            if check is not None:
                check(f.name, getattr(self, f.name))
        if self.levels == 0 and self.serve_only == "all":
            raise ConfigError(
                "levels=auto supports serve_only none or master, got 'all' (region-masters move between "
                "ranks when the plan changes; set --levels 3 or 4 to keep serve-only region-masters)"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        """Build a config: ``overrides`` (not None) win over ``NLEVEL_<NAME>`` variables, which win over defaults.

        Raises:
            ConfigError: naming the variable or setting and the expected form.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            var = "NLEVEL_" + f.name.upper()
            if overrides.get(f.name) is not None:
                values[f.name] = overrides[f.name]
            elif var in env:
                values[f.name] = parse_setting(f.name, env[var], source=var)
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        return cls(**values)

    def with_(self, **changes: Any) -> Config:
        """Return a copy with some settings changed (validated)."""
        return replace(self, **changes)

    @property
    def auto(self) -> bool:
        """Whether the plan is chosen from measurements while the job runs (``levels=auto``)."""
        return self.levels == 0

    def plan(self, size: int) -> Plan:
        """Return the hierarchy plan these settings give on ``size`` processes (the first plan under auto).

        Raises:
            PlanError: when the plan does not fit ``size``.
        """
        if self.auto:
            return Plan(
                2, (), self.prefetch, self.chunk, self.serve_only,
                "auto: classic 2-level until the first measurements decide",
            )
        regions = self.regions or default_regions(size, self.levels)
        reason = "levels and regions set by configuration"
        if not self.regions and self.levels > 2:
            reason = f"levels={self.levels} set by configuration; regions {list(regions)} from the world size"
        plan = Plan(self.levels, tuple(regions), self.prefetch, self.chunk, self.serve_only, reason)
        plan.check_fits(size)
        return plan

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        d = asdict(self)
        d["regions"] = list(self.regions)
        return d


def _int_at_least(lo: int) -> Callable[[str, Any], None]:
    def check(name: str, v: Any) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ConfigError(f"{name} must be an integer >= {lo}, got {v!r}")

    return check


def _positive_float(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ConfigError(f"{name} must be a number > 0 (seconds), got {v!r}")


def _non_negative_float(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
        raise ConfigError(f"{name} must be a number >= 0 (seconds), got {v!r}")


def _regions(name: str, v: Any) -> None:
    if not isinstance(v, tuple) or any(isinstance(r, bool) or not isinstance(r, int) or r < 2 for r in v):
        raise ConfigError(f"{name} must be region counts >= 2 (e.g. 4 or 4,2), got {v!r}")


def _fraction(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
        raise ConfigError(f"{name} must be a number in (0, 1) (e.g. 0.1 for 10%), got {v!r}")


def _force(name: str, v: Any) -> None:
    if not isinstance(v, str):
        raise ConfigError(f"{name} must be text like 0.5@3, got {v!r}")
    parse_force(v)


def _serve_only(name: str, v: Any) -> None:
    if v not in SERVE_ONLY_CHOICES:
        raise ConfigError(f"{name} must be one of {', '.join(SERVE_ONLY_CHOICES)}, got {v!r}")


def _choice(*choices: str) -> Callable[[str, Any], None]:
    def check(name: str, v: Any) -> None:
        if v not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {v!r}")

    return check


def _bool(name: str, v: Any) -> None:
    if not isinstance(v, bool):
        raise ConfigError(f"{name} must be true or false, got {v!r}")


def _timeout(name: str, v: Any) -> None:
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v != v or v == float("inf"):
        raise ConfigError(f"{name} must be a number of seconds > 0, or none, got {v!r}")


def _prefetch(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 1:
        raise ConfigError(f"{name} must be a number >= 1 (requests' worth of ids per process), got {v!r}")


_CHECKS: dict[str, Callable[[str, Any], None]] = {
    "levels": lambda name, v: None if v == 0 else _int_at_least(2)(name, v),
    "regions": _regions,
    "prefetch": _prefetch,
    "chunk": _int_at_least(0),
    "serve_only": _serve_only,
    "switch_interval": _non_negative_float,
    "poll_max": _positive_float,  # 0 would be a busy spin
    "checkpoint_every": _int_at_least(1),
    "checkpoint_interval": _positive_float,
    "report_every": _int_at_least(1),
    "report_age": _positive_float,
    "batch": _int_at_least(1),
    "batch_age": _positive_float,
    "chunk_target": _positive_float,
    "max_chunk": _int_at_least(1),
    "progress": _bool,
    "progress_interval": _positive_float,
    "threshold": lambda name, v: _fraction(name, v),
    "replan_interval": _positive_float,
    "force_replan": lambda name, v: _force(name, v),
    "fault_tolerance": _choice("auto", "on", "off"),
    "lease_min": _positive_float,
    "lease_factor": _positive_float,
    "on_task_error": _choice("retry", "skip", "abort"),
    "task_retries": _int_at_least(0),
    "quarantine": _int_at_least(1),
    "task_timeout": _timeout,
    "control_interval": _positive_float,
    "grants": _choice("one-sided", "two-sided"),
    "server_period": _positive_float,
    "board_slots": _int_at_least(16),
}

#: name -> (unit, help). The defaults are the dataclass defaults.
SETTINGS: dict[str, tuple[str, str]] = {
    "levels": ("", "levels: auto (chosen from measurements while the job runs), or 2 = master + slaves, 3 adds region-masters, 4 two tiers"),
    "regions": ("", "regions per intermediate level, e.g. 4 or 4,2 (default: about size^(1/(levels-1)))"),
    "prefetch": ("requests", "ids a region-master keeps queued, in requests' worth per process of its region"),
    "chunk": ("ids", "ids a slave asks for per request; 0 = automatic from the measured task time"),
    "serve_only": ("", "servers that do not run tasks: none, master, all"),
    "switch_interval": ("s", "sys.setswitchinterval on ranks that serve while computing; 0 = keep Python's"),
    "poll_max": ("s", "longest sleep between polls of an idle server or waiting slave (backoff ceiling)"),
    "checkpoint_every": ("completions", "write the checkpoint after this many new completions ..."),
    "checkpoint_interval": ("s", "... or after this many seconds, whichever comes first"),
    "report_every": ("completions", "a slave sends finished ids once this many are buffered ..."),
    "report_age": ("s", "... or once the oldest has waited this long"),
    "batch": ("completions", "a region-master forwards completions upward once this many are buffered ..."),
    "batch_age": ("s", "... or once the oldest has waited this long"),
    "chunk_target": ("s", "automatic chunks aim at this much work per request"),
    "max_chunk": ("ids", "largest automatic chunk"),
    "progress": ("", "rank 0 shows progress (python -m nlevel.run turns it on unless --quiet)"),
    "progress_interval": ("s", "seconds between progress lines when stdout is not a terminal"),
    "threshold": ("", "auto: overhead threshold C; a plan predicted above it is split further"),
    "replan_interval": ("s", "auto: seconds between re-decisions after the first one"),
    "force_replan": ("", "testing: switch plans at a committed fraction, e.g. 0.5@3x2"),
    "fault_tolerance": ("", "recover from dead processes: auto (when mpiexec --with-ft ulfm), on, off"),
    "lease_min": ("s", "a rank holding tasks and silent for lease-min + lease-factor x the longest task is hung: killed"),
    "lease_factor": ("", "see lease-min"),
    "on_task_error": ("", "a task that raises: retry (elsewhere, task-retries times, then failed), skip (failed), abort"),
    "task_retries": ("", "retries of a task that raised, with --on-task-error retry"),
    "quarantine": ("processes", "a task held by this many processes that died is recorded failed, not run again"),
    "task_timeout": ("s", "a task running longer than this is hung: its rank is killed (without --with-ft ulfm "
                          "the job stops, exit 75, to be resumed) and the task counts toward quarantine; "
                          "none = no limit (pick it from the report's task-time p99 and max)"),
    "control_interval": ("s", "how often the master reads the run's control directory (drain requests)"),
    "grants": ("", "how a rank takes ids from its parent: one-sided (atomics on the parent's window) or two-sided (messages)"),
    "server_period": ("s", "longest sleep of an idle server thread between looks at its boards and messages"),
    "board_slots": ("ranges", "size of each rank's board of published ranges (the upper board has 1/8 of it)"),
}


def parse_setting(name: str, text: str, source: str | None = None) -> Any:
    """Parse the text of a setting (from the environment or the command line) into its type.

    Raises:
        ConfigError: naming ``source`` (or the setting) and the expected form.
    """
    where = source or name
    default = Config.__dataclass_fields__[name].default
    text = text.strip()
    if name == "task_timeout":
        if text.lower() in ("none", "off", "0", "0.0"):
            return None
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"{where} must be a number of seconds > 0, or none, got {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise ConfigError(f"{where} must be a number of seconds > 0, or none, got {text!r}")
        return value
    try:
        if name == "regions":
            return tuple(int(x) for x in text.replace("x", ",").split(",") if x.strip())
        if name == "levels" and text.lower() == "auto":
            return 0
        if isinstance(default, bool):
            low = text.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
        return text
    except ValueError:
        unit = SETTINGS[name][0]
        if name == "regions":
            kind = "a list of integers like 4,2"
        elif isinstance(default, bool):
            kind = "true or false"
        elif isinstance(default, int):
            kind = "an integer"
        elif isinstance(default, float):
            kind = "a number"
        else:
            kind = "text"
        raise ConfigError(f"{where} must be {kind}{' (' + unit + ')' if unit else ''}, got {text!r}") from None
