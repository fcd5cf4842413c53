"""A run's identity in its checkpoint: what it is, when a file may be resumed, and what to say when not.

The identity of a run is its app (the script's file name, or the APP of ``python -m nlevel.run``)
and the parameters the app says define its tasks (``fingerprint=`` of ``Farm``/``get_task_id``,
an APP's ``fingerprint(options)`` hook); the total is stored beside it. Arguments that do not
define the tasks (output paths, log paths, job ids) are not part of it, so they never block a
resume. Pure Python: no files, no MPI.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ConfigError

__all__ = ["covers", "default_app", "differences", "fingerprint", "identity", "identity_error", "start_over"]


def fingerprint(app: str, params: dict[str, Any]) -> tuple[str, str]:
    """Hash an app and its parameters.

    Args:
        app: the application name (e.g. its import path).
        params: its parameters; values JSON cannot encode are hashed as ``str(value)``.

    Returns:
        ``(sha256 hex, source)``, source being the canonical JSON (sorted keys) that was hashed.
    """
    import hashlib  # (only a farm with a checkpoint hashes its identity)

    source = json.dumps({"app": app, "params": params}, sort_keys=True, default=str)
    return hashlib.sha256(source.encode()).hexdigest(), source


def start_over(path: str | os.PathLike[str]) -> dict[str, str]:
    """How to start over keeping the old file, in each API (the remedies of a :class:`CheckpointError`)."""
    return {
        "run": f"to start over keeping the old file, add --fresh (it renames {path} to {path}.<UTC time>.bak)",
        "script": f"to start over keeping the old file, move {path} aside or pass another checkpoint path "
                  f"(Farm(..., fresh=True) renames it to {path}.<UTC time>.bak)",
    }


def _identity(source: str) -> tuple[str, dict[str, Any]] | None:
    """(app, params) of a fingerprint's source, or None if it is not one."""
    try:
        d = json.loads(source)
        return str(d["app"]), dict(d["params"])
    except (ValueError, KeyError, TypeError):
        return None


#: Parameters that must agree both ways (present in both with one value, or absent from both):
#: the results' shape is part of the file's layout, not only of what a task means.
BOTH_WAYS = ("result_fields",)


def covers(stored_source: str, run_source: str) -> bool:
    """Whether a file with identity ``stored_source`` may be resumed by a run with ``run_source``:
    the same app, each of the run's parameters stored with the same value, and the same
    :data:`BOTH_WAYS` parameters."""
    stored, run = _identity(stored_source), _identity(run_source)
    if stored is None or run is None or stored[0] != run[0]:
        return False
    a, b = stored[1], run[1]
    return all(k in a and a[k] == v for k, v in b.items()) and all(a.get(k) == b.get(k) for k in BOTH_WAYS)


def differences(stored_source: str, run_source: str, limit: int = 6) -> list[str]:
    """What differs between two identities, one phrase each (at most ``limit``, then a count)."""
    stored, run = _identity(stored_source), _identity(run_source)
    if stored is None or run is None:
        return [f"the checkpoint's identity {stored_source} against this run's {run_source}"]
    out = []
    if stored[0] != run[0]:
        out.append(f"app {stored[0]!r} in the checkpoint, {run[0]!r} in this run")
    a, b = stored[1], run[1]
    for k in sorted(set(a) | set(b)):
        if k not in b and k not in BOTH_WAYS:
            continue  # recorded by the file but not counted by this run: never blocks
        if k not in b:
            out.append(f"{k} only in the checkpoint ({_short(a[k])})")
        elif k not in a:
            out.append(f"{k} only in this run ({_short(b[k])})")
        elif a[k] != b[k]:
            out.append(f"{k}: {_short(a[k])} in the checkpoint, {_short(b[k])} in this run")
    if len(out) > limit:
        out = out[:limit] + [f"and {len(out) - limit} more"]
    return out


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def identity_error(path: Path, stored_source: str, run_source: str) -> CheckpointError:
    """The error for a checkpoint of another run: both identities, what differs, and the remedies."""
    diff = "; ".join(differences(stored_source, run_source))
    keep = ("to keep its progress, run with the checkpoint's values (a parameter that does not change what a task "
            "computes, such as an output path or a job id, does not belong in {where})")
    return CheckpointError(
        f"checkpoint {path} belongs to another run: it records {stored_source}, this run is {run_source} "
        f"(they differ in: {diff})",
        {"run": keep.format(where="the APP's fingerprint(options)") + f"; {start_over(path)['run']}",
         "script": keep.format(where="fingerprint= of Farm/get_task_id") + f"; {start_over(path)['script']}"},
    )


def default_app() -> str:
    """The main script's file name (the run's identity when the app does not give one)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.basename(path) if path else "<interactive>"


def identity(fingerprint: Any) -> tuple[str, dict[str, Any]]:
    """``(app, params)`` of a run from the ``fingerprint`` a user gave (see :class:`~nlevel.api.Farm`).

    None: the script's file name and no parameters; a string: that app name; a dict: its
    ``"app"`` (default: the script's file name) and the rest as parameters.

    Raises:
        ConfigError: for anything else, naming it.
    """
    if fingerprint is None:
        return default_app(), {}
    if isinstance(fingerprint, str):
        return fingerprint, {}
    if isinstance(fingerprint, dict):
        params = {str(k): v for k, v in fingerprint.items() if k != "app"}
        return str(fingerprint.get("app", default_app())), params
    raise ConfigError(f"fingerprint must be None, a name or a dict of the parameters that define the tasks, "
                      f"got {fingerprint!r} ({type(fingerprint).__name__})")
