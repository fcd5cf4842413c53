"""What made a result file: the command as typed, the commit, and the machine.

Every ``bench/*.py`` that writes a JSON result stores ``"provenance": record()`` in it, so
a table rendered from it (``docs/render.py``) names its command and commit.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import subprocess
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def record(argv: list[str] | None = None) -> dict[str, Any]:
    """The provenance of a result written now by this process.

    Args:
        argv: The command line (default ``sys.argv``), shown relative to the repository.

    Returns:
        ``command``, ``commit`` (None outside a git checkout), ``dirty`` (uncommitted changes to
        tracked files), ``when`` (UTC), ``host``, ``cores``, ``python``.
    """
    args = list(sys.argv if argv is None else argv)
    if args and os.path.isabs(args[0]) and args[0].startswith(ROOT + os.sep):
        args[0] = os.path.relpath(args[0], ROOT)
    status = _git("status", "--porcelain", "--untracked-files=no")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {
        "command": shlex.join(["python", *args]) if args and args[0].endswith(".py") else shlex.join(args),
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(status) if status is not None else None,
        "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cores": cores,
        "python": platform.python_version(),
    }
