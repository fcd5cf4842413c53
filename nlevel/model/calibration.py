"""Measured service and message times of this machine and MPI, stored where plans find them. Pure Python.

``python -m nlevel.plan --calibrate`` measures them (see :mod:`nlevel.runtime.calibrate`) and
saves a JSON file; later plans and simulations read it. A file measured on another
machine, MPI library or nlevel version is still used, with a warning that says which.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict, dataclass
from typing import Any

from .._version import __version__
from ..errors import ConfigError

__all__ = ["Calibration", "default_path", "load_calibration", "save_calibration", "machine_identity"]


@dataclass(frozen=True)
class Calibration:
    """Times measured on one machine with one MPI.

    Attributes:
        service_time: Seconds a server spends on one request (receive, handle, answer): 1/μ.
        msg_time: One-way message time in seconds (half a request/reply round trip).
        identity: Where it was measured (host, CPU, MPI library, nlevel version).
        measured: ISO time of the measurement.
        details: Raw figures (samples, medians) for the record.
        atomic_time: One one-sided operation as its origin sees it (0: not measured; older files).
        atomic_service: The time one such operation occupies the target (0: not measured).
    """

    service_time: float
    msg_time: float
    identity: dict[str, str]
    measured: str
    details: dict[str, Any]
    atomic_time: float = 0.0
    atomic_service: float = 0.0


def default_path() -> str:
    """``$NLEVEL_CALIBRATION``, else ``~/.cache/nlevel/calibration.json``."""
    env = os.environ.get("NLEVEL_CALIBRATION")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nlevel", "calibration.json")


def machine_identity(mpi_library: str = "") -> dict[str, str]:
    """What a calibration depends on."""
    import platform  # (here, not at import: read only when a calibration is, under --levels auto)

    return {
        "host": platform.node(),  # (= socket.gethostname(), without importing socket)
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpus": str(os.cpu_count()),
        "mpi": mpi_library.splitlines()[0][:120] if mpi_library else "",
        "nlevel": __version__,
    }


def save_calibration(cal: Calibration, path: str | None = None) -> str:
    """Write ``cal`` atomically; return the path."""
    import tempfile

    path = path or default_path()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(cal), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return path


def load_calibration(path: str | None = None, mpi_library: str | None = None) -> Calibration | None:
    """Read the calibration; None when there is none.

    Warns (naming what differs) when it was measured on another host, CPU, MPI
    library or nlevel version. ``mpi_library`` is compared only when given.

    Raises:
        ConfigError: when the file exists but is not a calibration.
    """
    path = path or default_path()
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            d = json.load(f)
        cal = Calibration(
            float(d["service_time"]), float(d["msg_time"]), dict(d["identity"]), str(d["measured"]), dict(d["details"]),
            float(d.get("atomic_time", 0.0)), float(d.get("atomic_service", 0.0)),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"calibration file {path} cannot be read ({type(exc).__name__}: {exc}); "
            f"expected the JSON written by `python -m nlevel.plan --calibrate` (delete it or calibrate again)"
        ) from None
    here = machine_identity(mpi_library or "")
    keys = ["host", "machine", "processor", "cpus", "nlevel"] + (["mpi"] if mpi_library else [])
    differ = [f"{k}: {cal.identity.get(k)!r} there, {here[k]!r} here" for k in keys if cal.identity.get(k) != here[k]]
    if differ:
        warnings.warn(
            f"calibration {path} was measured elsewhere ({'; '.join(differ)}); "
            f"using it anyway — run `python -m nlevel.plan --calibrate` to measure this machine",
            stacklevel=2,
        )
    return cal
