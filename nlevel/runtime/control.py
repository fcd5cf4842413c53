"""The run's control directory: how an operator talks to a running job (``python -m nlevel.drain``).

A request is a small JSON file dropped into the directory (written to a temporary name,
then renamed, so the job never reads half a file). The master looks every
``--control-interval`` seconds, acts, and renames the request to ``<name>.done`` with
its answer added (``"result"``: what it did, or ``"error"``: why it refused), so the
operator sees the outcome. The directory is ``<checkpoint>.control`` beside the
checkpoint file. Files only, no MPI.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

__all__ = ["control_dir", "submit", "pending", "answer", "wait_answer"]

SUFFIX = ".control"


def control_dir(checkpoint: str | os.PathLike[str]) -> str:
    """Return the control directory of the run whose checkpoint is ``checkpoint``."""
    return os.fspath(checkpoint) + SUFFIX


def _write(path: str, data: dict[str, Any]) -> None:
    import tempfile  # (only an operator's request or its answer: a farm without one does not pay it)

    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def submit(directory: str, request: dict[str, Any]) -> str:
    """Drop ``request`` into ``directory``; return the request's path (its answer appears at ``path + '.done'``)."""
    name = f"request-{time.time():.6f}-{os.getpid()}.json"
    path = os.path.join(directory, name)
    _write(path, {**request, "submitted_at": time.time()})
    return path


def pending(directory: str) -> list[tuple[str, dict[str, Any] | None]]:
    """Requests waiting in ``directory``, oldest first: (path, request or None if unreadable)."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith("request-") and n.endswith(".json"))
    except FileNotFoundError:
        return []
    out: list[tuple[str, dict[str, Any] | None]] = []
    for n in names:
        path = os.path.join(directory, n)
        try:
            with open(path) as f:
                data = json.load(f)
            out.append((path, data if isinstance(data, dict) else None))
        except (OSError, ValueError):
            out.append((path, None))
    return out


def answer(path: str, request: dict[str, Any] | None, **outcome: Any) -> None:
    """Record the job's answer to the request at ``path`` (it becomes ``path + '.done'``)."""
    _write(path + ".done", {**(request or {}), **outcome, "answered_at": time.time()})
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def wait_answer(path: str, timeout: float) -> dict[str, Any] | None:
    """Wait up to ``timeout`` seconds for the answer to the request at ``path``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(path + ".done") as f:
                data: dict[str, Any] = json.load(f)
                return data
        except (OSError, ValueError):
            time.sleep(0.05)
    return None
