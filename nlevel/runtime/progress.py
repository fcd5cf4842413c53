"""Rank 0's progress display: a tqdm bar on a terminal, plain periodic lines otherwise.

Beside done/total, rate and ETA it shows what the model sees (:func:`model_state`): the
plan, the ρ of the busiest server and the overhead the model predicts for the plan, and
the overhead measured so far, so a user sees the planner's view while the job runs.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable, TextIO

from tqdm import tqdm

__all__ = ["Progress", "describe_state", "model_state", "stdout_is_terminal"]


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _prediction(decision: dict[str, Any]) -> dict[str, Any]:
    """The prediction for the plan that runs after ``decision``: the chosen one if it switched, else the current one."""
    chosen = decision.get("chosen")
    if decision.get("switch") and isinstance(chosen, dict) and isinstance(chosen.get("chosen"), dict):
        return chosen["chosen"]
    current = decision.get("current_predicted")
    return current if isinstance(current, dict) else {}


def model_state(station: Any, size: int, elapsed: float) -> dict[str, Any]:
    """What the model sees now, read from the master's station (any key may be missing).

    Read from another thread without locks, and tolerant of what the planner does or does
    not record (its decisions are plain dicts): ``plan`` (one line) and ``levels`` of the
    plan running now, ``reason`` (why it runs), ``decisions`` (made so far), ``rho`` (the
    model's ρ of the busiest server), ``rho_measured`` (the master's, measured),
    ``predicted`` (overhead the model predicts for this plan), ``measured`` (1 − (task time
    heard + time of the tasks running now) / (size × elapsed)).
    """
    out: dict[str, Any] = {}
    plans = list(getattr(station, "plans", None) or [])
    if plans:
        plan = plans[-1]
        out["levels"] = getattr(plan, "levels", None)
        describe = getattr(plan, "describe", None)
        out["plan"] = describe() if callable(describe) else str(plan)
        if getattr(plan, "reason", ""):
            out["reason"] = plan.reason
    decisions = [d for d in list(getattr(getattr(station, "planner", None), "decisions", None) or [])
                 if isinstance(d, dict)]
    if decisions:
        made = getattr(getattr(station, "planner", None), "made", None)
        out["decisions"] = made if isinstance(made, int) else len(decisions)
    last = next((d for d in reversed(decisions) if "current_predicted" in d or "chosen" in d), None)
    if last is not None:
        pred = _prediction(last)
        rhos = [r for lv in pred.get("levels", []) if isinstance(lv, dict)
                for r in (_number(lv.get(k)) for k in ("rho", "rho_cpu", "rho_memory")) if r is not None]
        busiest = _number(pred.get("busiest_rho"))
        if busiest is not None or rhos:
            out["rho"] = busiest if busiest is not None else max(rhos)  # (a server's CPU or its boards' memory)
        for key, value in (("predicted", pred.get("overhead")), ("rho_measured", last.get("rho_measured"))):
            if _number(value) is not None:
                out[key] = _number(value)
        if isinstance(last.get("reason"), str):
            out["reason"] = last["reason"]
    busy = _number(getattr(getattr(station, "server", None), "busy_below", None))
    if busy is not None and size > 0 and elapsed >= 1.0:  # (before a second has passed it says little)
        running = getattr(getattr(station, "watching", None), "running_now", None)
        clock = getattr(station, "clock", None)
        if callable(running) and callable(clock):
            try:  # (tasks that run now are busy too: a docking screen is not 90 % waste while it docks)
                busy += float(running(clock()))
            except (RuntimeError, ValueError, TypeError):  # (a dict changed size under this thread: skip it)
                pass
        out["measured"] = min(1.0, max(0.0, 1.0 - busy / (size * elapsed)))
    return out


def _pct(x: float) -> str:
    return "over 100% (no steady state)" if x > 1 else f"{100 * x:.1f}%"


def describe_state(state: dict[str, Any]) -> str:
    """One line of :func:`model_state`: ``2 levels, chunk auto; rho 0.42 (busiest server); overhead predicted 3.1%, measured 5.2%``."""
    parts = [str(state["plan"])] if state.get("plan") else []
    if state.get("rho") is not None:
        parts.append(f"rho {state['rho']:.2f} (busiest server)")
    over = []
    if state.get("predicted") is not None:
        over.append(f"predicted {_pct(state['predicted'])}")
    if state.get("measured") is not None:
        over.append(f"measured {_pct(state['measured'])}")
    if over:
        parts.append("overhead " + ", ".join(over))
    return "; ".join(parts)


def stdout_is_terminal(stream: TextIO | None = None) -> bool:
    """Whether the user is watching a terminal (not a log file) on rank 0's stdout.

    Open MPI gives every rank a pseudo-terminal even when ``mpiexec``'s own output goes
    to a file, so the rank's ``isatty()`` is not the answer. ``NLEVEL_TTY=0|1`` (set by
    ``nlevel-mpiexec`` from its own stdout) decides; else, under Open MPI, the stdout of
    the launcher process that started this rank (Linux /proc); else ``isatty()``.
    """
    flag = os.environ.get("NLEVEL_TTY")
    if flag in ("0", "1"):
        return flag == "1"
    stream = stream if stream is not None else sys.stdout
    if not getattr(stream, "isatty", lambda: False)():
        return False
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        try:
            fd = os.open(f"/proc/{os.getppid()}/fd/1", os.O_WRONLY | os.O_NOCTTY)
        except OSError:
            return True
        try:
            return os.isatty(fd)
        finally:
            os.close(fd)
    return True


class Progress:
    """Shows done/total, rate, ETA and the plan, polling ``count()`` from a thread.

    Args:
        total: Tasks in the run.
        count: Returns how many are committed (read without locking: an int).
        plan: One-line plan description shown beside the bar (until ``state`` says more).
        interval: Seconds between plain lines when ``stream`` is not a terminal.
        initial: Tasks already committed by an earlier run (not counted in the rate).
        stream: Where to write (default stdout).
        state: Returns :func:`model_state` now (optional); shown in place of ``plan``.
    """

    def __init__(
        self,
        total: int,
        count: Callable[[], int],
        plan: str,
        interval: float = 10.0,
        initial: int = 0,
        stream: TextIO | None = None,
        state: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.total = total
        self.count = count
        self.plan = plan
        self.state = state
        self.interval = interval
        self.initial = initial
        self.stream = stream if stream is not None else sys.stdout
        self.tty = stdout_is_terminal(self.stream)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: tqdm | None = None

    def start(self) -> None:
        """Start showing progress (idempotent)."""
        if self._thread is not None:
            return
        self._t0 = time.monotonic()
        if self.tty:
            self._bar = tqdm(
                total=self.total, initial=self.initial, file=self.stream, unit="task", dynamic_ncols=True, smoothing=0.1
            )
            self._bar.set_postfix_str(self.plan, refresh=False)
        self._thread = threading.Thread(target=self._run, name="nlevel-progress", daemon=True)
        self._thread.start()

    def describe(self) -> str:
        """What is shown beside the numbers: the model's state, or the plan when there is no state."""
        if self.state is not None:
            try:
                text = describe_state(self.state())
            except Exception:  # noqa: BLE001 (the display must never stop the job)
                text = ""
            if text:
                return text
        return self.plan

    def line(self, done: int, elapsed: float) -> str:
        """Return one plain progress line."""
        run = done - self.initial
        rate = run / elapsed if elapsed > 0 else 0.0
        left = self.total - done
        eta = f"{left / rate:.0f} s" if rate > 0 else "?"
        pct = 100.0 * done / self.total if self.total else 100.0
        return f"nlevel: {done}/{self.total} tasks ({pct:.1f}%), {rate:.1f} tasks/s, ETA {eta} [{self.describe()}]"

    def _run(self) -> None:
        next_line = time.monotonic() + self.interval
        next_postfix = time.monotonic() + 1.0
        while not self._stop.wait(0.25):
            if self._bar is not None:
                if time.monotonic() >= next_postfix:
                    self._bar.set_postfix_str(self.describe(), refresh=False)
                    next_postfix += 1.0
                self._bar.update(self.count() - self._bar.n)
            elif time.monotonic() >= next_line:
                print(self.line(self.count(), time.monotonic() - self._t0), file=self.stream, flush=True)
                next_line += self.interval

    def close(self) -> None:
        """Show the final state and stop."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        if self._bar is not None:
            self._bar.update(self.count() - self._bar.n)
            self._bar.close()
        self._thread = None
